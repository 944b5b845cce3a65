package testbed

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strings"
	"syscall"
	"time"
)

// Controller is a controller of the santa CLI (`santa dns`, `santa
// memcached`) as root runs it: in the server's network namespace, against a
// santad. The tests, the benchmarks and the demo start them through this.
type Controller struct {
	cmd   *exec.Cmd
	out   LockedBuffer // stdout (ready:, done:) and the log, in the order written
	ready string
	done  chan struct{} // closed once it has exited
	err   error         // its exit, once done is closed
	told  bool          // Wait or Stop has reported its exit once
	name  string        // "santa dns", "santa memcached": for messages
}

// ControllerArgv is the command line that runs `santa KIND ARGS` (kind
// "dns" or "memcached") with the CLI santaBin in network namespace ns
// against santad's socket.
func ControllerArgv(santaBin, ns, socket, kind string, args ...string) []string {
	return append([]string{"nsenter", "--net=/run/netns/" + ns, santaBin, "--socket-path", socket, kind}, args...)
}

// StartController runs the command line of ControllerArgv and waits
// for its "ready:" line (its first rules are installed by then), at most
// timeout. onLine, if not nil, gets every line it prints as it comes.
func StartController(ctx context.Context, argv []string, timeout time.Duration, onLine func(string)) (*Controller, error) {
	c := &Controller{cmd: exec.Command(argv[0], argv[1:]...), done: make(chan struct{}), name: "santa controller"}
	for i, a := range argv[:len(argv)-1] {
		if a == "--socket-path" && i+2 < len(argv) {
			c.name = "santa " + argv[i+2]
		}
	}
	// Own process group: Ctrl-C reaches the caller, which stops it in
	// order. Pdeathsig: it does not outlive a killed caller.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := c.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	c.cmd.Stderr = c.cmd.Stdout // one pipe: by "ready:", the log before it is read
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start controller: %w", err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			c.out.Write(append(sc.Bytes(), '\n'))
			if onLine != nil {
				onLine(sc.Text())
			}
			if strings.HasPrefix(sc.Text(), "ready:") {
				select {
				case ready <- sc.Text():
				default:
				}
			}
		}
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	fail := func(err error) (*Controller, error) {
		if serr := c.Stop(20 * time.Second); serr != nil {
			err = fmt.Errorf("%w (and stopping it: %v)", err, serr)
		}
		return nil, err
	}
	select {
	case c.ready = <-ready:
		return c, nil
	case <-c.done:
		return nil, fmt.Errorf("%s exited before it was ready (%v):\n%s", c.name, c.err, c.tail())
	case <-ctx.Done():
		return fail(ctx.Err())
	case <-time.After(timeout):
		return fail(fmt.Errorf("%s not ready within %v:\n%s", c.name, timeout, c.tail()))
	}
}

// PID is the controller's process (nsenter execs it).
func (c *Controller) PID() int { return c.cmd.Process.Pid }

// Ready is its "ready:" line.
func (c *Controller) Ready() string { return c.ready }

// Output is everything it printed so far.
func (c *Controller) Output() string { return c.out.String() }

// tail is the end of its output, for error messages.
func (c *Controller) tail() string {
	lines := strings.Split(strings.TrimSuffix(c.out.String(), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-20):], "\n")
}

// Wait waits at most timeout for the controller to exit by itself. If it
// did, exited is true and err is how it ended (then Stop reports nothing).
func (c *Controller) Wait(timeout time.Duration) (exited bool, err error) {
	select {
	case <-c.done:
		c.told = true
		return true, c.err
	case <-time.After(timeout):
		return false, nil
	}
}

// WaitOutput waits at most timeout for the controller to print text; it
// fails if the controller exits first.
func (c *Controller) WaitOutput(text string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for !strings.Contains(c.Output(), text) {
		if exited, err := c.Wait(100 * time.Millisecond); exited {
			return fmt.Errorf("%s exited (%v) before it printed %q:\n%s", c.name, err, text, c.tail())
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not print %q within %v:\n%s", c.name, text, timeout, c.tail())
		}
	}
	return nil
}

// Stop sends SIGTERM (the controller deletes its rules and prints its
// "done:" line) and waits, SIGKILL after timeout. It may be called again:
// only the first call reports how the controller ended.
func (c *Controller) Stop(timeout time.Duration) error {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM) // its own process, by pid
		select {
		case <-c.done:
		case <-time.After(timeout):
			_ = c.cmd.Process.Kill()
			<-c.done
			c.told = true
			return fmt.Errorf("%s ignored SIGTERM for %v; killed, its rules left behind:\n%s", c.name, timeout, c.tail())
		}
	}
	if c.err == nil || c.told {
		return nil
	}
	c.told = true
	return fmt.Errorf("%s: %w:\n%s", c.name, c.err, c.tail())
}
