package testbed

import (
	"bufio"
	"fmt"
	"io"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// serverProcess is a server the testbed runs in its server namespace, in a
// process group of its own that goes when the test's process does.
type serverProcess struct {
	cmd  *exec.Cmd
	out  *LockedBuffer // its stdout and stderr
	done chan struct{} // closed once it has exited
	werr error         // how it exited, once done

	stopOnce sync.Once
	stopErr  error
}

// start runs argv in tb's server namespace (in dir if not empty), pinned to
// cpu if pin. `ip netns exec` and taskset exec the server, so the child's
// pid is the server's.
func (p *serverProcess) start(tb *Testbed, dir string, pin bool, cpu int, argv []string) error {
	p.out, p.done = &LockedBuffer{}, make(chan struct{})
	args := []string{"netns", "exec", tb.Server.NS}
	if pin {
		args = append(args, "taskset", "-c", strconv.Itoa(cpu))
	}
	p.cmd = exec.Command("ip", append(args, argv...)...)
	p.cmd.Dir = dir
	p.cmd.Stdout = p.out
	p.cmd.Stderr = p.out
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start: %w", err)
	}
	go func() {
		p.werr = p.cmd.Wait()
		close(p.done)
	}()
	return nil
}

// PID is the server's (main) process.
func (p *serverProcess) PID() int { return p.cmd.Process.Pid }

// Running reports whether the server's (main) process has not exited yet.
func (p *serverProcess) Running() bool {
	if p.cmd == nil || p.cmd.Process == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// killStragglers kills, by pid, those of procs still in the server's
// process group (and not zombies) once they have had 2 s to exit by
// themselves.
func (p *serverProcess) killStragglers(procs []int) {
	pgid := p.PID() // Setpgid: the group is the server's own
	left := func() []int {
		var l []int
		for _, q := range procs {
			if g, err := syscall.Getpgid(q); err == nil && g == pgid && !isZombie(q) {
				l = append(l, q)
			}
		}
		return l
	}
	waitFor(2*time.Second, 20*time.Millisecond, func() bool { return len(left()) == 0 })
	for _, q := range left() {
		_ = syscall.Kill(q, syscall.SIGKILL)
	}
}

// StartPiped starts cmd with pipes to its stdin and from its stdout, for a
// test that drives a client program line by line. The test's cleanup
// closes its stdin, waits up to 10 s for it to exit, then kills it.
func StartPiped(t testing.TB, cmd *exec.Cmd) (stdin io.WriteCloser, stdout *bufio.Scanner) {
	t.Helper()
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		in.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return in, bufio.NewScanner(out)
}
