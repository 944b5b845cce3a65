package main

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

const (
	// python is Debian's interpreter, which has python3-cbor2; a python3
	// earlier on PATH (pyenv) may not.
	python = "/usr/bin/python3"
	// nobody is the uid (and gid) the application runs as.
	nobody = 65534
	// appPort is the UDP port the application serves.
	appPort = 4242
)

// app is the paper's Listing 1 (clients/python/examples/listing1.py): an
// unprivileged UDP server that adds its own rule through the Python client.
type app struct {
	argv   []string
	cmd    *exec.Cmd
	addr   netip.AddrPort
	cookie uint64
	rule   uint64
	out    *testbed.LockedBuffer
	exited chan error
}

// asNobody is the command line that runs argv as uid and gid nobody inside
// the network namespace ns. --pdeathsig: a uid change clears the parent
// death signal, so setpriv sets it again after dropping privileges.
func asNobody(ns string, argv ...string) []string {
	pre := []string{"nsenter", "--net=/run/netns/" + ns,
		"setpriv", "--reuid=" + strconv.Itoa(nobody), "--regid=" + strconv.Itoa(nobody), "--clear-groups",
		"--pdeathsig=TERM", "--"}
	return append(pre, argv...)
}

// startApp runs Listing 1 from the copy of the Python client in pyDir as
// nobody in the server namespace, on addr, and waits for its
// "ready cookie=N rule=ID" line.
func (m *demo) startApp(pyDir string, addr netip.AddrPort) (*app, error) {
	a := &app{addr: addr, out: &testbed.LockedBuffer{}, exited: make(chan error, 1)}
	a.argv = asNobody(m.tb.Server.NS, python, filepath.Join(pyDir, "examples", "listing1.py"),
		addr.Addr().String(), strconv.Itoa(int(addr.Port())))
	a.cmd = exec.Command(a.argv[0], a.argv[1:]...)
	a.cmd.Env = []string{
		"PATH=/usr/sbin:/usr/bin:/sbin:/bin",
		"SANTA_SOCKET=" + m.santad.Socket,
		"PYTHONPATH=" + pyDir,
		"PYTHONDONTWRITEBYTECODE=1",
	}
	a.cmd.Stderr = a.out
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	stdout, err := a.cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := a.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start listing1.py: %w", err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ready ") {
				select {
				case ready <- sc.Text():
				default:
				}
			}
			a.out.Write(append(sc.Bytes(), '\n'))
		}
		a.exited <- a.cmd.Wait()
	}()
	fail := func(err error) (*app, error) {
		a.stop()
		return nil, err
	}
	select {
	case line := <-ready:
		if _, err := fmt.Sscanf(line, "ready cookie=%d rule=%d", &a.cookie, &a.rule); err != nil {
			return fail(fmt.Errorf("listing1.py: bad ready line %q: %v", line, err))
		}
		return a, nil
	case err := <-a.exited:
		a.exited <- err
		return fail(fmt.Errorf("listing1.py exited before it was ready (%v):\n%s", err, tail(a.out.String(), 10)))
	case <-m.ctx.Done():
		return fail(m.ctx.Err())
	case <-time.After(30 * time.Second):
		return fail(fmt.Errorf("listing1.py not ready within 30 s:\n%s", tail(a.out.String(), 10)))
	}
}

func (a *app) PID() int { return a.cmd.Process.Pid }

// signal sends sig to the application (nsenter and setpriv exec it: the
// pid is python's).
func (a *app) signal(sig syscall.Signal) error { return a.cmd.Process.Signal(sig) }

// stop ends the application: SIGCONT in case it is paused, SIGTERM (it
// exits 0), SIGKILL after 5 s. Its socket closes, and santad's release
// hook removes the rule with it.
func (a *app) stop() error {
	_ = a.signal(syscall.SIGCONT)
	_ = a.signal(syscall.SIGTERM)
	select {
	case <-a.exited:
		return nil
	case <-time.After(5 * time.Second):
		_ = a.cmd.Process.Kill()
		<-a.exited
		return fmt.Errorf("listing1.py ignored SIGTERM for 5 s; killed")
	}
}

// send sends payload from the client namespace to the application's
// address and returns the reply (one try: a lost reply is a finding).
func (m *demo) send(to netip.AddrPort, payload string) (string, error) {
	if err := m.ctx.Err(); err != nil {
		return "", err
	}
	c, err := m.tb.DialUDP(to)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(2 * time.Second)); err != nil {
		return "", err
	}
	if _, err := c.Write([]byte(payload)); err != nil {
		return "", err
	}
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("no reply to %q from %v: %w", payload, to, err)
	}
	return string(buf[:n]), nil
}

// cli runs the santa CLI against the demo's santad, as root or (uid
// nobody) as the application's user, and returns its output indented.
func (m *demo) cli(asUser bool, args ...string) (string, error) {
	argv := append([]string{m.santaBin, "--socket-path", m.santad.Socket}, args...)
	if asUser {
		argv = asNobody(m.tb.Server.NS, argv...)
	}
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("%s: %w: %s", strings.Join(argv, " "), err, out)
	}
	return "  " + strings.ReplaceAll(strings.TrimRight(string(out), "\n"), "\n", "\n  "), nil
}

// listing1 is the demo's second part: the application adds its own rule,
// the kernel answers it while the application is stopped, and the
// application reads its rule's hits itself.
func (m *demo) listing1(pyDir string) error {
	addr := netip.AddrPortFrom(m.tb.Server.IP4, appPort)
	fmt.Fprintln(m.out)
	fmt.Fprintln(m.out, "An unprivileged application adds its own rule (the paper's Listing 1, Python client):")
	fmt.Fprintf(m.out, "  $ SANTA_SOCKET=%s \\\n      setpriv --reuid=%d --regid=%d --clear-groups -- %s listing1.py %s %d\n",
		m.santad.Socket, nobody, nobody, python, addr.Addr(), addr.Port())
	a, err := m.startApp(pyDir, addr)
	if err != nil {
		return err
	}
	m.app = a
	m.cookies = append(m.cookies, a.cookie)
	m.names[a.rule] = fmt.Sprintf("%-27s", `"Hello" → "COMSYS"  (app)`)
	fmt.Fprintf(m.out, "  ready cookie=%d rule=%d\n", a.cookie, a.rule)
	fmt.Fprintf(m.out, "  As uid %d (pid %d, server namespace) it bound %v/udp, passed that socket to santad,\n", nobody, a.PID(), addr)
	fmt.Fprintln(m.out, `  which checked it is the app's own, and added a rule: "Hello" at offset 0 → reply "COMSYS".`)

	fmt.Fprintln(m.out)
	fmt.Fprintf(m.out, "Datagrams from the client namespace to %v:\n", addr)
	step := func(payload, explain string) error {
		before, err := m.snapshot()
		if err != nil {
			return err
		}
		reply, serr := m.send(addr, payload)
		if m.ctx.Err() != nil {
			return m.ctx.Err()
		}
		after, err := m.snapshot()
		if err != nil {
			return err
		}
		if serr != nil {
			reply = "no answer: timed out"
		} else {
			reply = strconv.Quote(reply)
		}
		var rule uint64
		if payload == "Hello" {
			rule = a.rule
		}
		by, evidence := attribute(before, after, rule, "the app")
		fmt.Fprintf(m.out, "  %-8s → %-13s %s, %s\n", strconv.Quote(payload), reply, by, evidence)
		fmt.Fprintf(m.out, "             %s\n", explain)
		return nil
	}
	if err := a.signal(syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP listing1.py: %w", err)
	}
	fmt.Fprintf(m.out, "  (app paused: SIGSTOP to pid %d)\n", a.PID())
	err = step("Hello", "The app is stopped, yet the answer comes: XDP replied from the app's rule.")
	if cerr := a.signal(syscall.SIGCONT); err == nil && cerr != nil {
		err = fmt.Errorf("SIGCONT listing1.py: %w", cerr)
	}
	if err != nil {
		return err
	}
	fmt.Fprintln(m.out, "  (app resumed: SIGCONT)")
	if err := step("other", "No rule matches: XDP passes it on, the app answers it itself."); err != nil {
		return err
	}
	if err := step("stats", "The app asked santad for its rule's counter over its own connection, as uid 65534."); err != nil {
		return err
	}

	fmt.Fprintln(m.out)
	fmt.Fprintln(m.out, "$ santa rules ls      (as root: every rule set; NSD's belong to root, who took them over)")
	out, err := m.cli(false, "rules", "ls")
	if err != nil {
		return err
	}
	fmt.Fprintln(m.out, out)
	fmt.Fprintf(m.out, "$ santa rules ls --socket %d      (as uid %d: the app's own rule set)\n", a.cookie, nobody)
	if out, err = m.cli(true, "rules", "ls", "--socket", strconv.FormatUint(a.cookie, 10)); err != nil {
		return err
	}
	fmt.Fprintln(m.out, out)
	return nil
}
