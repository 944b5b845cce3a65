//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// santadRig is santad in the server namespace of a testbed, attached to
// the server veth, sized for maxRules rules.
type santadRig struct {
	tb     *testbed.Testbed
	bin    string
	sd     *testbed.Santad
	bpffs  string // its pins (the guard map: bpffs/guards)
	client *santa.Client
	logf   func(string, ...any)
}

// startSantad starts santad with a data plane big enough for rules rules
// (over all sockets) plus room for rules of learned query shapes.
func startSantad(tb *testbed.Testbed, bin, tmp string, rules int, logf func(string, ...any)) (*santadRig, error) {
	dir, err := os.MkdirTemp(tmp, "santad-")
	if err != nil {
		return nil, err
	}
	maxRules := rules + 65536
	hashBits := 20 // santad's default; at least two buckets per rule
	for hashBits < 24 && 1<<hashBits < 2*maxRules {
		hashBits++
	}
	// 155 bytes of patterns and templates per rule measured for these
	// names; room for twice that, at least santad's default.
	dataMiB := max(16, (maxRules*320)>>20)
	conf := filepath.Join(dir, "santad.yaml")
	y := fmt.Sprintf("# Written by the benchmark harness (bench/).\ndataplane:\n  hash_bits: %d\n  max_rules: %d\n  data_mib: %d\n", hashBits, maxRules, dataMiB)
	if err := os.WriteFile(conf, []byte(y), 0o644); err != nil {
		return nil, err
	}
	bpffs := santadPinPrefix + tb.ID
	sd := testbed.NewSantad(filepath.Join(bin, "santad"), tb.Server.NS, dir, bpffs, "--interface", tb.Server.Dev, "--config", conf)
	r := &santadRig{tb: tb, bin: bin, sd: sd, bpffs: bpffs, logf: logf}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if err := sd.Start(ctx); err != nil {
		sd.Cleanup()
		return nil, err
	}
	if r.client, err = santa.Dial(sd.Socket); err != nil {
		r.stop()
		return nil, err
	}
	logf("santad running (pid %d): hash_bits %d, max_rules %d, data_mib %d", sd.PID(), hashBits, maxRules, dataMiB)
	return r, nil
}

// stop stops santad and removes its program, pins and journal.
func (r *santadRig) stop() error {
	if r.client != nil {
		r.client.Close()
	}
	return errors.Join(r.sd.Stop(syscall.SIGTERM), r.sd.Cleanup())
}

// answered is the rule processor's count of answered requests.
func (r *santadRig) answered() (uint64, error) {
	_, counters, err := r.client.Health()
	if err != nil {
		return 0, err
	}
	return counters["answered"], nil
}

// cli runs `santa --socket-path S ARGS` in the server namespace (bounded).
func (r *santadRig) cli(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	argv := append([]string{"--net=/run/netns/" + r.tb.Server.NS, filepath.Join(r.bin, "santa"), "--socket-path", r.sd.Socket}, args...)
	out, err := exec.CommandContext(ctx, "nsenter", argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("santa %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// santadPinPrefix starts the bpffs directory of the benchmarks' santad;
// the testbed's id (santa-<pid>-<n>) follows.
const santadPinPrefix = "/sys/fs/bpf/santa-bench-"

// controllerProc is a running `santa dns`, `santa memcached` or `santa
// http` offloading n names or keys.
type controllerProc struct {
	*testbed.Controller
	n int
}

// startController runs `santa KIND MODE ARGS` (kind dns, memcached or
// http; http has no mode: "") in the server namespace and waits for its
// "ready:" line, logging its install progress. It waits at most 2 minutes
// plus 1 ms per offloaded name and socket (a million names on two sockets
// took 7 minutes when this was written).
func (r *santadRig) startController(ctx context.Context, kind, mode string, args ...string) (*controllerProc, error) {
	c := &controllerProc{}
	for i, a := range args {
		if a == "--count" && i+1 < len(args) {
			fmt.Sscan(args[i+1], &c.n)
		}
	}
	// Progress: the controllers log "installing … done=N of=M" now and then.
	last := time.Time{}
	progress := func(l string) {
		if strings.Contains(l, "level=WARN") || strings.Contains(l, "level=ERROR") || strings.HasPrefix(l, "ready:") ||
			strings.Contains(l, "msg=installed") || (strings.Contains(l, "msg=installing") && time.Since(last) > 10*time.Second) {
			last = time.Now()
			if i := strings.Index(l, "level="); i >= 0 {
				l = l[i:]
			}
			r.logf("  santa %s: %s", kind, l)
		}
	}
	if mode != "" { // `santa http` has no mode
		args = append([]string{mode}, args...)
	}
	argv := testbed.ControllerArgv(filepath.Join(r.bin, "santa"), r.tb.Server.NS, r.sd.Socket, kind, args...)
	ctl, err := testbed.StartController(ctx, argv, 2*time.Minute+time.Duration(2*c.n)*time.Millisecond, progress)
	if err != nil {
		return nil, err
	}
	c.Controller = ctl
	return c, nil
}

// stop ends the controller with SIGTERM (it deletes its rules) and waits,
// at most a minute plus 0.2 ms per name (SIGKILL after that).
func (c *controllerProc) stop() error {
	return c.Stop(time.Minute + time.Duration(c.n)*200*time.Microsecond)
}

// pinSanta pins santad and the controller (either may be nil) to cpu (-1:
// every CPU).
func pinSanta(santad *santadRig, ctl *controllerProc, cpu int) error {
	var errs []error
	if santad != nil {
		errs = append(errs, setAffinity(santad.sd.PID(), cpu))
	}
	if ctl != nil {
		errs = append(errs, setAffinity(ctl.PID(), cpu))
	}
	return errors.Join(errs...)
}

// setAffinity pins every thread of pid to cpu, or lets them run on every
// CPU (cpu < 0). Threads created later inherit it.
func setAffinity(pid, cpu int) error {
	var set unix.CPUSet
	if cpu >= 0 {
		set.Set(cpu)
	} else {
		for i := 0; i < runtime.NumCPU(); i++ {
			set.Set(i)
		}
	}
	tids, err := testbed.Threads(pid)
	if err != nil {
		return err
	}
	var errs []error
	for _, tid := range tids {
		if err := unix.SchedSetaffinity(tid, &set); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// socketFD finds the file descriptor number, in one of pids, of the
// unconnected UDP socket bound to addr (IPv4): what `santa dns --pid PID
// --fd FD` and `santa attach --pid PID --fd FD` take.
func socketFD(pids []int, addr netip.AddrPort) (pid, fd int, err error) {
	if !addr.Addr().Is4() {
		return 0, 0, fmt.Errorf("socketFD: %v is not IPv4", addr)
	}
	a := addr.Addr().As4()
	// /proc/net/udp prints the address as a host-order (little-endian) word
	want := fmt.Sprintf("%02X%02X%02X%02X:%04X", a[3], a[2], a[1], a[0], addr.Port())
	for _, p := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/net/udp", p)) // the process's network namespace
		if err != nil {
			continue
		}
		inode := ""
		for _, l := range strings.Split(string(b), "\n") {
			f := strings.Fields(l)
			if len(f) >= 10 && f[1] == want && f[2] == "00000000:0000" {
				inode = f[9]
				break
			}
		}
		if inode == "" {
			continue
		}
		ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p))
		if err != nil {
			continue
		}
		for _, e := range ents {
			link, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p, e.Name()))
			if err == nil && link == "socket:["+inode+"]" {
				n, _ := strconv.Atoi(e.Name())
				return p, n, nil
			}
		}
	}
	return 0, 0, fmt.Errorf("no process of %v holds a UDP socket bound to %v", pids, addr)
}

// BuildSanta builds santad and santa from the working tree (the module
// above the working directory) into a new temporary directory, which the
// caller removes.
func BuildSanta(logf func(string, ...any)) (string, error) {
	root, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(root, "go.mod")); err == nil {
			break
		}
		if filepath.Dir(root) == root {
			return "", errors.New("no go.mod above the working directory: run from the repository")
		}
		root = filepath.Dir(root)
	}
	bin, err := os.MkdirTemp("", "santa-bench-bin-")
	if err != nil {
		return "", err
	}
	t0 := time.Now()
	if err := testbed.GoBuild(bin, root, "./cmd/santad", "./cmd/santa"); err != nil {
		os.RemoveAll(bin)
		return "", err
	}
	logf("built santad and santa from %s in %v", root, time.Since(t0).Round(100*time.Millisecond))
	return bin, nil
}

// WithSanta builds santad and santa from the working tree, calls run with
// their directory and a context that ends on SIGINT or SIGTERM, logs why a
// run stopped early, and removes them afterwards.
func WithSanta[R any](logf func(string, ...any), run func(ctx context.Context, bin string) (R, error)) (R, error) {
	bin, err := BuildSanta(logf)
	if err != nil {
		var none R
		return none, err
	}
	defer os.RemoveAll(bin)
	return UntilSignal(logf, func(ctx context.Context) (R, error) { return run(ctx, bin) })
}

// UntilSignal calls run with a context that ends on SIGINT or SIGTERM and
// logs why a run stopped early.
func UntilSignal[R any](logf func(string, ...any), run func(ctx context.Context) (R, error)) (R, error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep, err := run(ctx)
	if err != nil {
		logf("interrupted: %v (writing what was measured)", err)
	}
	return rep, err
}

// SelectCases keeps the cases of plan named in the comma-separated list
// names, in plan order; an unknown name is an error that lists the known.
func SelectCases[C any](plan []C, names string, name func(C) string) ([]C, error) {
	want := map[string]bool{}
	for _, n := range strings.Split(names, ",") {
		want[strings.TrimSpace(n)] = true
	}
	var sel []C
	var have []string
	for _, c := range plan {
		have = append(have, name(c))
		if want[name(c)] {
			sel = append(sel, c)
			delete(want, name(c))
		}
	}
	if len(want) > 0 {
		unknown := slices.Sorted(maps.Keys(want))
		return nil, fmt.Errorf("unknown cases %s (have %s)", strings.Join(unknown, ", "), strings.Join(have, ", "))
	}
	return sel, nil
}
