package mcctl_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestSecondControllerWithTagRefused: a `santa memcached` started while a
// controller with its tag runs on the port refuses to start, naming the tag
// and the running one's pid, before it touches the running one's write
// tracker or rules; the running one goes on retiring and rebuilding its
// rule. (The second used to replace its tracker's pins and take its rules
// over.)
func TestSecondControllerWithTagRefused(t *testing.T) {
	r := newRig(t)
	const key = "claim:key"
	conns, first, get := r.offloadOld(key)
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{key})
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "memcached",
		"--guards", filepath.Join(r.bpffs, "guards"), "static", "--keys", file, "--duration", "3s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	want := fmt.Sprintf(`another controller (pid %d) runs with tag "santa-memcached" on UDP port %d`,
		first.PID(), r.mc.Addr4.Port())
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("a second santa memcached with the running one's tag: %v, want it refused saying %q:\n%s", err, want, out)
	}

	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if v := get(); v != "new" {
		t.Errorf("GET after a set: %q, want new", v)
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"]) // the rule rebuilt
	if v := get(); v != "new" {
		t.Errorf("GET of the rebuilt rule: %q, want new", v)
	}
	if exited, err := first.Wait(100 * time.Millisecond); exited {
		t.Fatalf("the running controller ended: %v\n%s", err, first.Output())
	}
}

// TestPredecessorsRuleSetsUnbound: a controller killed with SIGKILL leaves
// the rule sets its attach made (all of memcached's UDP sockets but one,
// which another program bound first). The next controller with its tag on
// the port takes them over and unbinds them on exit, once empty, and leaves
// the other program's alone. (It left them bound for good: santad told only
// the first controller's bind that it made them.)
func TestPredecessorsRuleSetsUnbound(t *testing.T) {
	r := newRig(t)
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := r.mc.Addr4.Port()
	socks, err := c.BindPort(port)
	if err != nil || len(socks) < 2 {
		t.Fatalf("the other program's bind: %+v (%v), want 2 sockets or more", socks, err)
	}
	otherCookie := socks[0].Cookie
	for _, s := range socks[1:] { // unbound again, for the controller's attach to make
		if err := c.Unbind(santa.Cookie(s.Cookie)); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{"claim:key"})
	first := r.startController("static", "--keys", file)
	if err := syscall.Kill(first.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(5 * time.Second); err == nil {
		t.Fatal("the controller survived SIGKILL")
	}
	if left, err := c.ListSockets(); err != nil || len(left) != len(socks) {
		t.Fatalf("rule sets after the controller was killed: %+v (%v), want memcached's %d", left, err, len(socks))
	}
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "memcached",
		"--guards", filepath.Join(r.bpffs, "guards"), "static", "--keys", file, "--duration", "2s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	want := fmt.Sprintf(`"taking over the rule sets a predecessor made" tag=santa-memcached rule_sets=%d`, len(socks)-1)
	if err != nil || !strings.Contains(string(out), want) {
		t.Errorf("the next controller: %v, want it to say %s:\n%s", err, want, out)
	}
	left, err := c.ListSockets()
	if err != nil || len(left) != 1 || left[0].Cookie != otherCookie {
		t.Errorf("rule sets after the next controller stopped: %+v (%v), want the other program's only (socket %d)", left, err, otherCookie)
	}
}
