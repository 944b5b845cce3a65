package testbed

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
)

// Santad is santad as an administrator runs it, but inside a namespace of
// a testbed and with its own control socket, pins and state, so that it
// leaves a santad of the host alone. The tests and the demo use it.
type Santad struct {
	Bin    string   // the santad binary
	NS     string   // the network namespace it runs in
	Args   []string // its flags, which `santad cleanup` gets too
	Socket string   // its control socket
	Out    io.Writer
	log    LockedBuffer
	cmd    *exec.Cmd
	exited chan error
}

// NewSantad configures (does not start) santad in namespace ns with its
// socket and state under dir, its pins in bpffs, and more flags (e.g.
// --interface). --config /dev/null keeps a host's /etc/santa/santad.yaml
// out; a later --config in flags replaces it.
func NewSantad(bin, ns, dir, bpffs string, flags ...string) *Santad {
	s := &Santad{Bin: bin, NS: ns, Socket: filepath.Join(dir, "santa.sock")}
	s.Args = append([]string{
		"--config", "/dev/null",
		"--socket", s.Socket,
		"--bpffs", bpffs,
		"--state-dir", filepath.Join(dir, "state"),
		"--metrics", "off",
		"--log-format", "text",
	}, flags...)
	return s
}

// Start runs santad and waits until it answers health. nsenter joins only
// the network namespace, so santad sees the host's bpffs as in production
// (`ip netns exec` would mount a fresh /sys over it).
func (s *Santad) Start(ctx context.Context) error {
	s.cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + s.NS, s.Bin}, s.Args...)...)
	var w io.Writer = &s.log
	if s.Out != nil {
		w = io.MultiWriter(&s.log, s.Out)
	}
	s.cmd.Stdout, s.cmd.Stderr = w, w
	// Own process group: Ctrl-C reaches the caller, which stops santad in
	// order. Pdeathsig: santad does not outlive a killed caller.
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
			return fmt.Errorf("santad exited during start (%v):\n%s", err, s.Log())
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if c, err := santa.Dial(s.Socket); err == nil {
			_, _, err := c.Health()
			c.Close()
			if err == nil {
				return nil
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("santad did not answer health within 20 s:\n%s", s.Log())
		}
	}
}

// PID is the running santad's pid.
func (s *Santad) PID() int { return s.cmd.Process.Pid }

// Log is what santad wrote so far.
func (s *Santad) Log() string { return s.log.String() }

// Stop sends sig to santad and waits for it to exit (SIGKILL after 10 s).
// Unless sig is SIGKILL, a santad that exits with a failure (a crash while
// stopping) is an error. A stopped santad leaves its program attached and
// its pins and journal in place, for the next one to take over; Cleanup
// removes them.
func (s *Santad) Stop(sig syscall.Signal) error {
	if s.cmd == nil {
		return nil
	}
	defer func() { s.cmd = nil }()
	_ = s.cmd.Process.Signal(sig)
	select {
	case err := <-s.exited:
		if err != nil && sig != syscall.SIGKILL {
			return fmt.Errorf("santad exited with %v after %v:\n%s", err, sig, s.Log())
		}
		return nil
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-s.exited
		return fmt.Errorf("santad ignored %v for 10 s; killed", sig)
	}
}

// Cleanup runs `santad cleanup` with santad's flags in santad's network
// namespace (the caller's if it has none or it is gone), as an
// operator would: it detaches XDP and removes the pins and the journal.
func (s *Santad) Cleanup() error {
	cmd := exec.Command(s.Bin, append([]string{"cleanup"}, s.Args...)...)
	if _, err := os.Stat("/run/netns/" + s.NS); s.NS != "" && err == nil {
		cmd = exec.Command("nsenter", append([]string{"--net=/run/netns/" + s.NS}, cmd.Args...)...)
	}
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("santad cleanup: %w: %s", err, bytes.TrimSpace(out))
	}
	return nil
}

// rulesBySocket is how many rules each socket with a rule set holds.
func (s *Santad) rulesBySocket() (map[string]uint64, error) {
	c, err := santa.Dial(s.Socket)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	socks, err := c.ListSockets()
	if err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	for _, si := range socks {
		out[si.AddrPort().String()] = si.Rules
	}
	return out, nil
}

// ExpectPredecessorTakenOver fails t unless controller ctl, started
// again after santad went away or the controller was killed, said it took
// over the rules its predecessor left, and every socket of s holds one
// rule, its own (for the tests' controllers that offload one request per
// socket).
func (s *Santad) ExpectPredecessorTakenOver(t testing.TB, ctl *Controller) {
	t.Helper()
	if !strings.Contains(ctl.Output(), "taking over the rules a predecessor left") {
		t.Errorf("the controller did not take over the rules its predecessor left:\n%s", ctl.Output())
	}
	rules, err := s.rulesBySocket()
	if err != nil {
		t.Fatal(err)
	}
	for sock, n := range rules {
		if n != 1 {
			t.Errorf("socket %s has %d rules, want the one of the running controller", sock, n)
		}
	}
}

// Bind binds the socket of sc (a server's UDP socket or TCP listener)
// through santad with c, without miss samples, and returns santad's answer;
// a failure fails the test.
func Bind(t testing.TB, c *santa.Client, sc syscall.Conn) api.SocketInfo {
	t.Helper()
	target, err := santa.Socket(sc)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Bind(target, santa.SampleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return info
}
