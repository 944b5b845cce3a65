package dnsctl_test

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestSecondControllerWithTagRefused: a `santa dns` started while a
// controller with its tag runs on the port refuses to start, naming the tag
// and the running one's pid; the running one's rules stay and answer. (The
// second used to take them over and delete them on its exit.)
func TestSecondControllerWithTagRefused(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www, mail := "www."+r.zone.Origin, "mail."+r.zone.Origin
	first := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns")
	rules := r.rules()
	out, err := r.runUntilExit("static", "--port", "53/udp", "--names", r.namesFile([]string{mail}, []uint16{dns.TypeA}),
		"--duration", "3s")
	want := fmt.Sprintf(`another controller (pid %d) runs with tag "santa-dns" on UDP port 53`, first.PID())
	if err == nil || !strings.Contains(out, want) {
		t.Errorf("a second santa dns with the running one's tag: %v, want it refused saying %q:\n%s", err, want, out)
	}
	if strings.Contains(out, "done:") {
		t.Errorf("the refused santa dns printed a done line: it never started, and prints only its error:\n%s", out)
	}
	if now := r.rules(); now != rules {
		t.Errorf("santad holds %d rules, want the running controller's %d", now, rules)
	}
	r.waitKernelAnswer(www, "A", testbed.ExampleWWW4.String(), 5*time.Second, first)
}

// TestPredecessorsRuleSetsUnbound: a controller killed with SIGKILL leaves
// the rule set its attach made (NSD's IPv4 socket's; another program bound
// the IPv6 socket first). The next controller with its tag on the port
// takes it over and unbinds it on exit, once empty, and leaves the other
// program's alone. (It left it bound for good: santad told only the first
// controller's bind that it made it.)
func TestPredecessorsRuleSetsUnbound(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	_, v6 := r.srv.Addrs()
	other, err := c.BindPort(v6.Port()) // both of NSD's sockets; the IPv4 one is unbound again
	if err != nil || len(other) != 2 {
		t.Fatalf("the other program's bind: %+v (%v), want NSD's 2 sockets", other, err)
	}
	otherCookie := uint64(0)
	for _, s := range other {
		if s.AddrPort() == v6 {
			otherCookie = s.Cookie
		} else if err := c.Unbind(santa.Cookie(s.Cookie)); err != nil {
			t.Fatal(err)
		}
	}
	static := []string{"static", "--port", "53/udp", "--names", r.namesFile([]string{"www." + r.zone.Origin}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--learn-shapes=false"}
	first := r.startController(static...)
	if err := syscall.Kill(first.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(5 * time.Second); err == nil {
		t.Fatal("the controller survived SIGKILL")
	}
	if socks, err := c.ListSockets(); err != nil || len(socks) != 2 {
		t.Fatalf("rule sets after the controller was killed: %+v (%v), want NSD's 2", socks, err)
	}
	out, err := r.runUntilExit(append(static, "--duration", "2s")...)
	if err != nil || !strings.Contains(out, `"taking over the rule sets a predecessor made" tag=santa-dns rule_sets=1`) {
		t.Errorf("the next controller: %v, want it to take over 1 rule set:\n%s", err, out)
	}
	socks, err := c.ListSockets()
	if err != nil || len(socks) != 1 || socks[0].Cookie != otherCookie {
		t.Errorf("rule sets after the next controller stopped: %+v (%v), want the other program's only (socket %d)", socks, err, otherCookie)
	}
}
