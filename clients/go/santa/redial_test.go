package santa

import (
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
)

// fakeSantad listens at a path and hands each connection it accepts to the
// dialFake starts a stand-in santad and a Client dialed to it.
func dialFake(t *testing.T) (*fakeSantad, *Client) {
	t.Helper()
	f := newFake(t, filepath.Join(t.TempDir(), "santa.sock"))
	c, err := Dial(f.path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return f, c
}

// test, which plays santad's part on it.
type fakeSantad struct {
	path  string
	ln    *net.UnixListener
	conns chan *api.Conn
}

func newFake(t *testing.T, path string) *fakeSantad {
	t.Helper()
	ln, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeSantad{path: path, ln: ln, conns: make(chan *api.Conn, 8)}
	go func() {
		for {
			c, err := ln.AcceptUnix()
			if err != nil {
				close(f.conns)
				return
			}
			f.conns <- api.NewConn(c)
		}
	}()
	t.Cleanup(f.stop)
	return f
}

// stop closes the listener (which removes its path).
func (f *fakeSantad) stop() { f.ln.Close() }

// accept is the next connection a client made.
func (f *fakeSantad) accept(t *testing.T) *api.Conn {
	t.Helper()
	select {
	case c, ok := <-f.conns:
		if !ok {
			t.Fatal("the fake santad stopped listening")
		}
		t.Cleanup(func() { c.Close() })
		return c
	case <-time.After(10 * time.Second):
		t.Fatal("no connection to the fake santad in 10 s")
		return nil
	}
}

// noConnection fails if a client made another connection.
func (f *fakeSantad) noConnection(t *testing.T) {
	t.Helper()
	select {
	case c, ok := <-f.conns:
		if ok {
			c.Close()
			t.Fatal("the client dialed again")
		}
	default:
	}
}

// read is the next request on c.
func read(t *testing.T, c *api.Conn) *api.Message {
	t.Helper()
	m, files, err := c.Recv()
	for _, f := range files {
		f.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// answer reads a request on c and answers it ok (health: with daemon info).
func answer(t *testing.T, c *api.Conn) *api.Message {
	t.Helper()
	req := read(t, c)
	resp := &api.Message{V: api.Version, Op: req.Op, Seq: req.Seq}
	if req.Op == api.OpHealth {
		resp.Daemon = &api.DaemonInfo{Version: "fake", Protocol: api.Version}
	}
	if err := c.Send(resp, -1); err != nil {
		t.Fatal(err)
	}
	return req
}

func health(c *Client) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, _, err := c.Health()
		done <- err
	}()
	return done
}

func wait(t *testing.T, done <-chan error) error {
	t.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the call did not return in 10 s")
		return nil
	}
}

// TestRedialUnread: santad closed the connection before the request was
// sent (it restarted): the client dials again and sends the same request
// there, once.
func TestRedialUnread(t *testing.T) {
	f, c := dialFake(t)
	first := f.accept(t)
	done := health(c)
	answer(t, first)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	first.Close() // santad stops; the client has sent nothing since

	done = health(c)
	second := f.accept(t)
	if req := answer(t, second); req.Seq != 2 || req.Op != api.OpHealth {
		t.Errorf("request on the new connection: seq %d op %s, want seq 2 health", req.Seq, req.Op)
	}
	if err := wait(t, done); err != nil {
		t.Fatalf("health after santad closed the connection: %v", err)
	}
	done = health(c) // and the new connection stays
	if req := answer(t, second); req.Seq != 3 {
		t.Errorf("next request: seq %d, want 3", req.Seq)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	f.noConnection(t)
}

// TestRefusalNotRedialed: santad refused the connection (quota.connections:
// an answer with seq 0, then close) before the request was sent: the
// refusal is the call's error, and the request is not sent again.
func TestRefusalNotRedialed(t *testing.T) {
	f, c := dialFake(t)
	first := f.accept(t)
	if err := first.Send(&api.Message{V: api.Version, Status: api.StatusQuota, Error: "uid 65534 holds 64 connections"}, -1); err != nil {
		t.Fatal(err)
	}
	first.Close()
	// a redial would send the request again on a connection nobody
	// answers: the call would not return
	err := wait(t, health(c))
	if !errors.Is(err, ErrQuota) || !strings.Contains(err.Error(), "64 connections") {
		t.Fatalf("health on a refused connection: %v, want the quota refusal", err)
	}
	done := health(c) // the next call dials anew
	if req := answer(t, f.accept(t)); req.Seq != 2 {
		t.Errorf("the call after the refusal sent seq %d, want 2 (the refused request was sent again)", req.Seq)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}

// TestRedialFails: santad is gone: the call names the lost connection and
// the failed dial, and a later call dials again.
func TestRedialFails(t *testing.T) {
	path := filepath.Join(t.TempDir(), "santa.sock")
	f := newFake(t, path)
	c, err := Dial(path)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	f.accept(t).Close()
	f.stop() // removes path
	for i := 0; i < 2; i++ {
		_, _, err = c.Health()
		if err == nil {
			t.Fatal("health without santad succeeded")
		}
		if !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "lost") ||
			!strings.Contains(err.Error(), "dialing it again failed") || !strings.Contains(err.Error(), path) {
			t.Errorf("call %d without santad: %v", i, err)
		}
		if i == 0 && !errors.Is(err, syscall.EPIPE) {
			t.Errorf("the first call's error does not name the lost connection's EPIPE: %v", err)
		}
	}
	f = newFake(t, path)
	done := health(c)
	if req := answer(t, f.accept(t)); req.Seq != 3 {
		t.Errorf("the call after santad came back sent seq %d, want 3", req.Seq)
	}
	if err := wait(t, done); err != nil {
		t.Fatalf("health after santad came back: %v", err)
	}
}

// TestOutcomeUnknown: santad read the request and closed the connection
// without answering: the call says the outcome is unknown, nothing is sent
// again, and the next call dials anew.
func TestOutcomeUnknown(t *testing.T) {
	f, c := dialFake(t)
	first := f.accept(t)
	done := health(c)
	if req := read(t, first); req.Seq != 1 || req.Op != api.OpHealth {
		t.Fatalf("first request: seq %d op %s", req.Seq, req.Op)
	}
	first.Close()
	err := wait(t, done)
	if !errors.Is(err, ErrOutcomeUnknown) {
		t.Fatalf("health with the connection closed after the request: %v, want ErrOutcomeUnknown", err)
	}
	if !strings.Contains(err.Error(), "may or may not have been carried out") {
		t.Errorf("error %q does not say the outcome is unknown", err)
	}
	f.noConnection(t) // nothing resent

	done = health(c)
	second := f.accept(t)
	if req := answer(t, second); req.Seq != 2 {
		t.Errorf("the call after the lost one sent seq %d, want 2", req.Seq)
	}
	if err := wait(t, done); err != nil {
		t.Fatalf("the call after the lost one: %v", err)
	}
}

// TestBindPIDRange: a pid or fd the protocol's unsigned fields cannot
// carry is refused before it is sent, not wrapped (-1 to 4294967295).
func TestBindPIDRange(t *testing.T) {
	f, c := dialFake(t)
	for _, pf := range [][2]int{{-1, 3}, {0, 3}, {1, -1}, {1 << 32, 3}, {1, 1 << 32}} {
		done := make(chan error, 1)
		go func() {
			_, err := c.BindPID(pf[0], pf[1], SampleOptions{})
			done <- err
		}()
		if err := wait(t, done); err == nil || !strings.Contains(err.Error(), "want a process id from 1") {
			t.Errorf("BindPID(%d, %d): %v", pf[0], pf[1], err)
		}
	}
	// nothing was sent: the next request on the connection is the first
	conn := f.accept(t)
	done := health(c)
	if req := answer(t, conn); req.Op != api.OpHealth {
		t.Errorf("santad got %s first, want health", req.Op)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}

func TestClosedTargetFD(t *testing.T) {
	f, c := dialFake(t)
	conn := f.accept(t)
	done := health(c) // the fake has accepted: no goroutine takes the closed fd's number meanwhile
	answer(t, conn)
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
	closed, err := syscall.Dup(1)
	if err != nil {
		t.Fatal(err)
	}
	syscall.Close(closed)
	_, err = c.Add(FD(closed), []api.Rule{{ReplyLen: 1}})
	if !errors.Is(err, syscall.EBADF) || !strings.Contains(err.Error(), fmt.Sprintf("santad add: the target fd %d is not open", closed)) {
		t.Errorf("Add with a closed fd: %v", err)
	}
	// nothing was sent: the next request on the connection is a health
	done = health(c)
	if req := answer(t, conn); req.Op != api.OpHealth {
		t.Errorf("santad got %s after the closed fd, want health", req.Op)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}

// TestTargetsThatNameNoSocket: a target that names no socket is refused
// before anything is sent, in the C and Python clients' words (docs/api.md
// "Targets"). The zero Target passed fd 0, FD(-1) and Cookie(0) went to
// santad, and so did a bind by cookie.
func TestTargetsThatNameNoSocket(t *testing.T) {
	f, c := dialFake(t)
	const (
		bind = "santad bind: no target socket: bind needs the socket's fd (a cookie names a rule set that exists)"
		add  = "santad add: no target socket: pass the socket's fd or name its cookie"
	)
	for _, tc := range []struct {
		name string
		call func() error
		want string
	}{
		{"Bind(Target{})", func() error { _, err := c.Bind(Target{}, SampleOptions{}); return err }, bind},
		{"Bind(FD(-1))", func() error { _, err := c.Bind(FD(-1), SampleOptions{}); return err }, bind},
		{"Bind(Cookie(5))", func() error { _, err := c.Bind(Cookie(5), SampleOptions{}); return err }, bind},
		{"Add(Target{})", func() error { _, err := c.Add(Target{}, []api.Rule{{ReplyLen: 1}}); return err }, add},
		{"Add(FD(-1))", func() error { _, err := c.Add(FD(-1), []api.Rule{{ReplyLen: 1}}); return err }, add},
		{"Unbind(Cookie(0))", func() error { return c.Unbind(Cookie(0)) },
			"santad unbind: no target socket: pass the socket's fd or name its cookie"},
	} {
		done := make(chan error, 1)
		go func() { done <- tc.call() }()
		if err := wait(t, done); err == nil || err.Error() != tc.want {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// nothing was sent: the first request on the connection is a health
	conn := f.accept(t)
	done := health(c)
	if req := answer(t, conn); req.Op != api.OpHealth || req.Seq != 1 {
		t.Errorf("santad got %s seq %d first, want health seq 1", req.Op, req.Seq)
	}
	if err := wait(t, done); err != nil {
		t.Fatal(err)
	}
}
