package dnsctl_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

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
