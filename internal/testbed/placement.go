//go:build linux

package testbed

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Placement says which CPU does what during a measurement
// (kernel-findings "Measuring honestly"): the load generator and the
// client-side NAPI on ClientCPU, every bit of server work on ServerCPU.
type Placement struct {
	ServerCPU int
	ClientCPU int
}

// DefaultPlacement is server work on CPU1, client work on CPU0.
var DefaultPlacement = Placement{ServerCPU: 1, ClientCPU: 0}

// Place prepares the testbed for measurements:
//   - GRO on at both veth ends (so veth keeps its NAPI instances and the
//     NAPI kthreads are not recreated when XDP programs come and go),
//   - threaded NAPI on both ends,
//   - TSO off on the client veth (otherwise veth hands the client's skbs to
//     netif_rx() and the server's receive path runs in softirq on the
//     client's CPU),
//   - the server-side napi/<dev>-* kthread pinned to p.ServerCPU, the
//     client-side one to p.ClientCPU.
//
// Call PinNAPI again before each measurement if programs were attached or
// detached in between (it is cheap and re-finds the threads).
func (tb *Testbed) Place(p Placement) error {
	for _, s := range []Side{tb.Server, tb.Client} {
		feats := []string{"-K", s.Dev, "gro", "on"}
		if s.Role == "client" {
			feats = append(feats, "tso", "off")
		}
		if _, err := s.Run("ethtool", feats...); err != nil {
			return err
		}
		if _, err := s.Run("sh", "-c", fmt.Sprintf("echo 1 > /sys/class/net/%s/threaded", s.Dev)); err != nil {
			return err
		}
	}
	return tb.PinNAPI(p)
}

// PinNAPI pins the NAPI kthreads of the server veth to p.ServerCPU and
// those of the client veth to p.ClientCPU. It fails if threaded NAPI is not
// on (no kthreads found).
func (tb *Testbed) PinNAPI(p Placement) error {
	for _, x := range []struct {
		s   Side
		cpu int
	}{{tb.Server, p.ServerCPU}, {tb.Client, p.ClientCPU}} {
		var pids []int
		// The kthreads appear shortly after threaded mode is switched on.
		waitFor(2*time.Second, 20*time.Millisecond, func() bool {
			pids, _ = NAPIThreads(x.s.Dev)
			return len(pids) > 0
		})
		if len(pids) == 0 {
			return fmt.Errorf("no napi/%s-* kthread (threaded NAPI off, or no NAPI on the veth: enable GRO or attach XDP)", x.s.Dev)
		}
		for _, pid := range pids {
			if err := PinThread(pid, x.cpu); err != nil {
				return fmt.Errorf("pin napi thread %d of %s: %w", pid, x.s.Dev, err)
			}
		}
	}
	return nil
}

// ServerNAPIThreads returns the pids of the server veth's NAPI kthreads.
func (tb *Testbed) ServerNAPIThreads() ([]int, error) { return NAPIThreads(tb.Server.Dev) }

// ClientNAPIThreads returns the pids of the client veth's NAPI kthreads.
func (tb *Testbed) ClientNAPIThreads() ([]int, error) { return NAPIThreads(tb.Client.Dev) }

// NAPIThreads finds the threaded-NAPI kthreads of interface dev, named
// "napi/<dev>-<napi id>". Kthread names are global, so dev should be unique
// across namespaces (testbed names are).
func NAPIThreads(dev string) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	prefix := "napi/" + dev + "-"
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		name, err := taskName(pid)
		if err != nil {
			continue
		}
		if strings.HasPrefix(name, prefix) {
			rest := name[len(prefix):]
			if _, err := strconv.Atoi(rest); err == nil {
				pids = append(pids, pid)
			}
		}
	}
	return pids, nil
}

// taskName returns the full name of a task: /proc/PID/status "Name:"
// shows kthread names beyond the 15 characters of comm.
func taskName(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return "", err
	}
	line, _, _ := bytes.Cut(b, []byte("\n"))
	name, ok := bytes.CutPrefix(line, []byte("Name:"))
	if !ok {
		return "", errors.New("no Name line")
	}
	return string(bytes.TrimSpace(name)), nil
}

// PinThread sets the CPU affinity of one thread (or process main thread)
// to a single CPU.
func PinThread(tid, cpu int) error {
	var set unix.CPUSet
	set.Set(cpu)
	return unix.SchedSetaffinity(tid, &set)
}

// PinProcess pins every thread of process pid to cpu.
func PinProcess(pid, cpu int) error {
	tids, err := Threads(pid)
	if err != nil {
		return err
	}
	var errs []error
	for _, tid := range tids {
		if err := PinThread(tid, cpu); err != nil && !errors.Is(err, unix.ESRCH) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Threads lists the thread ids of process pid.
func Threads(pid int) ([]int, error) {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return nil, err
	}
	var tids []int
	for _, e := range ents {
		if tid, err := strconv.Atoi(e.Name()); err == nil {
			tids = append(tids, tid)
		}
	}
	return tids, nil
}

// ThreadRunTime is the exact CPU time a thread has run so far
// (/proc/PID/task/TID/schedstat, first field, in ns). Unlike utime/stime it
// is not tick-sampled.
func ThreadRunTime(pid, tid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/schedstat", pid, tid))
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) < 1 {
		return 0, fmt.Errorf("schedstat of %d/%d: empty", pid, tid)
	}
	ns, err := strconv.ParseUint(f[0], 10, 64)
	if err != nil {
		return 0, fmt.Errorf("schedstat of %d/%d: %w", pid, tid, err)
	}
	return time.Duration(ns), nil
}

// ProcessRunTime sums ThreadRunTime over the live threads of pid. Threads
// that have exited are not counted; for a kthread pid it is that thread.
func ProcessRunTime(pid int) (time.Duration, error) {
	tids, err := Threads(pid)
	if err != nil {
		return 0, err
	}
	var sum time.Duration
	for _, tid := range tids {
		d, err := ThreadRunTime(pid, tid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return 0, err
		}
		sum += d
	}
	return sum, nil
}

// RunTimes sums ProcessRunTime over several pids (e.g. a server's
// processes plus the server-side NAPI kthread).
func RunTimes(pids ...int) (time.Duration, error) {
	var sum time.Duration
	for _, p := range pids {
		d, err := ProcessRunTime(p)
		if err != nil {
			return 0, fmt.Errorf("run time of %d: %w", p, err)
		}
		sum += d
	}
	return sum, nil
}

// clockTick is USER_HZ, the unit of /proc/stat. It is 100 on every Linux
// architecture Go supports.
const clockTick = 100

// CPUTimes are one CPU's /proc/stat counters, converted to durations.
type CPUTimes struct {
	User, Nice, System, Idle, IOWait, IRQ, SoftIRQ, Steal time.Duration
}

// CPUSample is a reading of /proc/stat with the time it was taken.
type CPUSample struct {
	At   time.Time // monotonic
	CPUs map[int]CPUTimes
}

// ReadCPUStat reads the per-CPU lines of /proc/stat.
func ReadCPUStat() (CPUSample, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return CPUSample{}, err
	}
	defer f.Close()
	s := CPUSample{At: time.Now(), CPUs: map[int]CPUTimes{}}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fl := strings.Fields(sc.Text())
		if len(fl) < 9 || !strings.HasPrefix(fl[0], "cpu") || fl[0] == "cpu" {
			continue
		}
		cpu, err := strconv.Atoi(fl[0][3:])
		if err != nil {
			continue
		}
		var v [8]time.Duration
		for i := range v {
			n, err := strconv.ParseUint(fl[1+i], 10, 64)
			if err != nil {
				return CPUSample{}, fmt.Errorf("/proc/stat %s: %w", fl[0], err)
			}
			v[i] = time.Duration(n) * time.Second / clockTick
		}
		s.CPUs[cpu] = CPUTimes{v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]}
	}
	return s, sc.Err()
}

// CPUUsage is what one CPU did between two samples.
type CPUUsage struct {
	Wall  time.Duration // real time between the samples
	Busy  time.Duration // Wall − idle − iowait − steal
	Idle  time.Duration // idle + iowait
	Steal time.Duration // time the hypervisor ran something else
	// Tick-sampled fields, for information only (they undercount bursty
	// NAPI work; threaded NAPI shows up as System).
	User, System, SoftIRQ time.Duration
}

// MaxSteal is the share of a measurement's wall time the hypervisor may
// take from a CPU (steal) before the measurement counts as disturbed: busy
// time leaves stolen time out, but threads' run time keeps part of it, and
// load and batching change with it (on a host that throttled this VM, 16 %
// stolen, a per-reply figure came out lower than on a quiet host). Quiet
// measurements here lose 1-2 %.
const MaxSteal = 0.03

// StealShare is Steal/Wall.
func (u CPUUsage) StealShare() float64 {
	if u.Wall <= 0 {
		return 0
	}
	return float64(u.Steal) / float64(u.Wall)
}

// Util is Busy/Wall.
func (u CPUUsage) Util() float64 {
	if u.Wall <= 0 {
		return 0
	}
	return float64(u.Busy) / float64(u.Wall)
}

// Usage returns what cpu did from prev to s. Busy is measured as wall time
// minus idle, iowait and steal time (idle time is accounted exactly on
// tickless kernels; the busy fields of /proc/stat are tick-sampled and
// undercount bursty NAPI work).
func (s CPUSample) Usage(prev CPUSample, cpu int) (CPUUsage, error) {
	a, ok1 := prev.CPUs[cpu]
	b, ok2 := s.CPUs[cpu]
	if !ok1 || !ok2 {
		return CPUUsage{}, fmt.Errorf("cpu%d not in /proc/stat", cpu)
	}
	u := CPUUsage{
		Wall:    s.At.Sub(prev.At),
		Idle:    (b.Idle - a.Idle) + (b.IOWait - a.IOWait),
		Steal:   b.Steal - a.Steal,
		User:    (b.User - a.User) + (b.Nice - a.Nice),
		System:  b.System - a.System,
		SoftIRQ: (b.SoftIRQ - a.SoftIRQ) + (b.IRQ - a.IRQ),
	}
	u.Busy = u.Wall - u.Idle - u.Steal
	if u.Busy < 0 {
		u.Busy = 0
	}
	return u, nil
}

// IfaceStats are the kernel's counters of an interface.
type IfaceStats struct {
	RxPackets, TxPackets, RxDropped, TxDropped uint64
}

// Stats reads the interface counters of this side's veth.
func (s Side) Stats() (IfaceStats, error) {
	var st IfaceStats
	err := s.Do(func() error {
		// /proc/net/dev is per network namespace of the reading thread.
		b, err := os.ReadFile(filepath.Join("/proc/thread-self/net/dev"))
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			name, rest, ok := strings.Cut(line, ":")
			if !ok || strings.TrimSpace(name) != s.Dev {
				continue
			}
			f := strings.Fields(rest)
			if len(f) < 12 {
				return fmt.Errorf("/proc/net/dev: short line for %s", s.Dev)
			}
			p := func(i int) uint64 { v, _ := strconv.ParseUint(f[i], 10, 64); return v }
			st = IfaceStats{RxPackets: p(1), RxDropped: p(3), TxPackets: p(9), TxDropped: p(11)}
			return nil
		}
		return fmt.Errorf("/proc/net/dev: no %s", s.Dev)
	})
	return st, err
}
