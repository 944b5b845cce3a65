package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	santa "github.com/santa-offload/santa/clients/go/santa"
)

// findBinary finds a program of the build: next to this executable first
// (make build puts santad, santa and santa-demo in bin/), then on PATH.
func findBinary(name string) (string, error) {
	where := "this program's directory"
	if exe, err := os.Executable(); err == nil {
		dir := filepath.Dir(exe)
		where = dir
		if p := filepath.Join(dir, name); isExecutable(p) {
			return p, nil
		}
	}
	if p, err := exec.LookPath(name); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("%s is neither in %s nor on PATH: run make build (it builds bin/%s next to bin/santa-demo)", name, where, name)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// findPythonClient finds clients/python of the source tree: above this
// executable's directory (bin/..), else in the working directory or one of
// its parents (go test runs in cmd/santa-demo).
func findPythonClient() (string, error) {
	var roots []string
	if exe, err := os.Executable(); err == nil {
		roots = append(roots, filepath.Dir(filepath.Dir(exe)))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			roots = append(roots, d)
			if d == filepath.Dir(d) {
				break
			}
		}
	}
	for _, r := range roots {
		dir := filepath.Join(r, "clients", "python")
		if isFile(filepath.Join(dir, "santa", "__init__.py")) && isFile(filepath.Join(dir, "examples", "listing1.py")) {
			return dir, nil
		}
	}
	return "", errors.New("clients/python (with examples/listing1.py) not found above this program nor the working directory: run santa-demo from the source tree")
}

func isFile(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular()
}

// copyPythonClient copies the Python client's package and Listing 1 to dst,
// readable by every user (the clone may sit where uid nobody cannot look).
func copyPythonClient(src, dst string) error {
	for _, sub := range []string{"santa", "examples"} {
		err := filepath.WalkDir(filepath.Join(src, sub), func(p string, e fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return err
			}
			to := filepath.Join(dst, rel)
			switch {
			case e.IsDir() && e.Name() == "__pycache__":
				return filepath.SkipDir
			case e.IsDir():
				return os.MkdirAll(to, 0o755)
			case !e.Type().IsRegular():
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			return os.WriteFile(to, b, 0o644)
		})
		if err != nil {
			return fmt.Errorf("copy the Python client: %w", err)
		}
	}
	return nil
}

// syncBuffer collects a child's output while it runs.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// tail returns the last n lines of s, indented.
func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return "    " + strings.Join(lines, "\n    ")
}

// bpffsPrefix and runPrefix name what a demo's santad pins and keeps:
// /sys/fs/bpf/santa-demo-<pid> and /run/santa-demo-<pid>-<random>.
const (
	bpffsPrefix = "/sys/fs/bpf/santa-demo-"
	runPrefix   = "/run/santa-demo-"
)

// santad is the daemon as an administrator runs it, but inside the
// testbed's server namespace and with its own socket, pins and state, so
// that it leaves a santad of the host alone.
type santad struct {
	bin    string
	args   []string // the flags, shared by santad and santad cleanup
	Socket string
	BPFFS  string
	cmd    *exec.Cmd
	exited chan error
	log    *syncBuffer
}

// newSantad configures (does not start) a santad for the interface dev of
// the namespace ns, with its socket and state in dir.
func newSantad(bin, dir, ns, dev string) *santad {
	s := &santad{bin: bin, Socket: filepath.Join(dir, "santa.sock"),
		BPFFS: bpffsPrefix + strconv.Itoa(os.Getpid()), log: &syncBuffer{}}
	s.args = santadFlags(s.Socket, s.BPFFS, filepath.Join(dir, "state"))
	s.args = append(s.args, "--interface", dev)
	s.cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + ns, bin}, s.args...)...)
	return s
}

// santadFlags are the flags for a demo's santad. --config /dev/null keeps
// a host's /etc/santa/santad.yaml out (an empty file means the defaults).
func santadFlags(socket, bpffs, state string) []string {
	return []string{
		"--config", "/dev/null",
		"--socket", socket,
		"--bpffs", bpffs,
		"--state-dir", state,
		"--metrics", "off",
		"--log-format", "text",
	}
}

// start runs santad and waits until it answers health. nsenter joins only
// the network namespace, so santad sees the host's bpffs as in production
// (`ip netns exec` would mount a fresh /sys over it).
func (s *santad) start(ctx context.Context, verbose bool) error {
	var w io.Writer = s.log
	if verbose {
		w = io.MultiWriter(s.log, os.Stderr)
		fmt.Fprintf(os.Stderr, "  [santad] %s\n", strings.Join(s.cmd.Args, " "))
	}
	s.cmd.Stdout, s.cmd.Stderr = w, w
	// Own process group: Ctrl-C reaches the demo, which stops santad in
	// order. Pdeathsig: santad does not outlive a killed demo.
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := s.cmd.Start(); err != nil {
		return fmt.Errorf("start santad: %w", err)
	}
	s.exited = make(chan error, 1)
	go func(c *exec.Cmd, ch chan error) { ch <- c.Wait() }(s.cmd, s.exited)
	deadline := time.Now().Add(20 * time.Second)
	for {
		select {
		case err := <-s.exited:
			s.cmd = nil
			return fmt.Errorf("santad exited during start (%v):\n%s", err, tail(s.log.String(), 20))
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		if c, err := santa.Dial(s.Socket); err == nil {
			_, _, err := c.Health()
			c.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("santad did not answer health within 20 s:\n%s", tail(s.log.String(), 20))
		}
	}
}

func (s *santad) PID() int { return s.cmd.Process.Pid }

// stop ends santad (SIGTERM, SIGKILL after 10 s) and then runs
// `santad cleanup` with the same flags: that detaches XDP and removes the
// pins and the journal, which a stopped santad keeps on purpose (the next
// one would take over from them).
func (s *santad) stop() error {
	var errs []error
	if s.cmd != nil && s.exited != nil {
		_ = s.cmd.Process.Signal(syscall.SIGTERM) // our child, by pid
		select {
		case <-s.exited:
		case <-time.After(10 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
			errs = append(errs, errors.New("santad ignored SIGTERM for 10 s; killed"))
		}
		s.cmd = nil
	}
	if out, err := exec.Command(s.bin, append([]string{"cleanup"}, s.args...)...).CombinedOutput(); err != nil {
		errs = append(errs, fmt.Errorf("santad cleanup: %w: %s", err, bytes.TrimSpace(out)))
	}
	return errors.Join(errs...)
}

// removeStaleSantad cleans up after demos that were killed before they
// could (SIGKILL): their santad stopped with them (Pdeathsig) but left its
// pins and state, by design. It runs `santad cleanup` for every
// /sys/fs/bpf/santa-demo-<pid> and removes /run/santa-demo-<pid>-* whose
// pid is gone, and returns what it removed.
func removeStaleSantad(bin string) ([]string, error) {
	dead := func(path, prefix string) (int, bool) {
		f := strings.SplitN(strings.TrimPrefix(path, prefix), "-", 2)
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid <= 0 || pid == os.Getpid() {
			return 0, false
		}
		err = syscall.Kill(pid, 0)
		return pid, errors.Is(err, syscall.ESRCH)
	}
	runDirs := map[int][]string{}
	dirs, _ := filepath.Glob(runPrefix + "*")
	for _, d := range dirs {
		if pid, ok := dead(d, runPrefix); ok {
			runDirs[pid] = append(runDirs[pid], d)
		}
	}
	var removed []string
	var errs []error
	pins, _ := filepath.Glob(bpffsPrefix + "*")
	for _, p := range pins {
		pid, ok := dead(p, bpffsPrefix)
		if !ok {
			continue
		}
		state := filepath.Join(os.TempDir(), "santa-demo-no-state")
		if d := runDirs[pid]; len(d) > 0 {
			state = filepath.Join(d[0], "state")
		}
		args := append([]string{"cleanup"}, santadFlags(filepath.Join(filepath.Dir(state), "santa.sock"), p, state)...)
		if out, err := exec.Command(bin, args...).CombinedOutput(); err != nil {
			errs = append(errs, fmt.Errorf("santad cleanup --bpffs %s: %w: %s", p, err, bytes.TrimSpace(out)))
			continue
		}
		removed = append(removed, p)
	}
	for _, ds := range runDirs {
		for _, d := range ds {
			if err := os.RemoveAll(d); err != nil {
				errs = append(errs, err)
				continue
			}
			removed = append(removed, d)
		}
	}
	return removed, errors.Join(errs...)
}
