package dnsctl_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestNoRoomInSantad: with more questions than santad has room for, the
// controller fills santad, the IPv4 and the IPv6 socket each with the first
// questions, leaves the rest to the server without trying them one by one,
// says so once, and the kernel answers the ones that fit.
func TestNoRoomInSantad(t *testing.T) {
	const maxRules, generated = 1500, 1500 // one batch (1024) on each socket does not fit
	r := newRigWith(t, testbed.KindNSD, rigOptions{generated: generated, santadFlags: maxRulesFlags(t, maxRules)})
	var names []string
	for i := range generated {
		names = append(names, testbed.GenName(r.zone.Origin, i))
	}
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile(names, []uint16{dns.TypeA}),
		"--shape", "rd,edns", "--learn-shapes=false")
	// one shape, on the IPv4 and the IPv6 socket
	if n := r.rules(); n != maxRules {
		t.Errorf("santad holds %d rules, want %d (full)", n, maxRules)
	}
	if want := fmt.Sprintf("(%d questions not offloaded)", 2*generated-maxRules); !strings.Contains(ctl.Ready(), want) {
		t.Errorf("ready line %q, want %q", ctl.Ready(), want)
	}
	// the refused batch is halved down to the rule that does not fit
	// (follow.AddFitting), and no question after it is tried: at most two
	// refusals per halving of a 1024-question batch
	if n := strings.Count(r.santad.Log(), `msg="request refused" op=add`); n > 2*10+2 {
		t.Errorf("santad refused %d adds, want at most %d", n, 2*10+2)
	}
	if n := strings.Count(ctl.Output(), "santad has no room for more rules"); n != 1 {
		t.Errorf("the controller said %d times that santad has no room, want once:\n%s", n, ctl.Output())
	}
	if !strings.Contains(ctl.Output(), "raise santad's dataplane.max_rules") {
		t.Errorf("the log does not pass on santad's reason:\n%s", ctl.Output())
	}
	v4, v6 := r.srv.Addrs()
	for _, server := range []netip.AddrPort{v4, v6} {
		if _, kernel := r.digAt(server, names[0], "A"); !kernel {
			t.Errorf("%s A, offloaded first, was not answered by the rule processor at %v", names[0], server)
		}
	}
}

// TestNoRoomAskedAgainWhenRulesGo: the questions santad has no room for
// wait, not asked again while santad stays full, and are offloaded once
// rules go from santad (here another program's).
func TestNoRoomAskedAgainWhenRulesGo(t *testing.T) {
	// 15 names on the IPv4 and the IPv6 socket want 30 rules; the other
	// program's 20 leave room for 20: the IPv4 socket's 15 and 5 of the
	// IPv6 socket's
	const maxRules, others, generated = 40, 20, 15
	r := newRigWith(t, testbed.KindNSD, rigOptions{generated: generated, santadFlags: maxRulesFlags(t, maxRules)})
	deleteOthers := r.otherProgramRules(others)
	var names []string
	for i := range generated {
		names = append(names, testbed.GenName(r.zone.Origin, i))
	}
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile(names, []uint16{dns.TypeA}),
		"--shape", "rd,edns", "--learn-shapes=false")
	left := 2*generated - (maxRules - others)
	if want := fmt.Sprintf("(%d questions not offloaded)", left); !strings.Contains(ctl.Ready(), want) {
		t.Fatalf("ready line %q, want %q", ctl.Ready(), want)
	}
	_, v6 := r.srv.Addrs()
	last := names[generated-1]
	if _, kernel := r.digAt(v6, last, "A"); kernel {
		t.Fatalf("%s A at %v was answered by the rule processor before santad had room for its rule", last, v6)
	}
	// while santad stays full, nothing is tried again
	refusedAdds := func() int { return strings.Count(r.santad.Log(), `msg="request refused" op=add`) }
	before := refusedAdds()
	time.Sleep(3500 * time.Millisecond) // past two asks again of a question that waits its second, then 2 s
	if n := refusedAdds(); n != before {
		t.Errorf("santad refused %d more adds while it had no room", n-before)
	}

	// the other program's rules go: the questions that waited take their room
	deleteOthers()
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, kernel := r.digAt(v6, last, "A"); kernel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s A at %v is not answered by the rule processor 5 s after rules went (%d rules); controller output:\n%s",
				last, v6, r.rules(), ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := r.rules(); n != 2*generated {
		t.Errorf("santad holds %d rules, want %d: every question on both sockets", n, 2*generated)
	}
	if err := ctl.WaitOutput("santad had room for questions that waited for it", time.Second); err != nil {
		t.Error(err)
	}
}

// otherProgramRules has another program add n rules to a socket of its own
// in santad, and returns what deletes them.
func (r *rig) otherProgramRules(n int) (deleteThem func()) {
	t := r.t
	t.Helper()
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	other, err := r.tb.Server.ListenUDP(netip.AddrPortFrom(r.tb.Server.IP4, 7999))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Close() })
	target, err := santa.Socket(other)
	if err != nil {
		t.Fatal(err)
	}
	rules := make([]api.Rule, n)
	for i := range rules {
		rules[i] = api.Rule{Conditions: []api.Condition{santa.Match(0, fmt.Appendf(nil, "other %d", i))},
			Processors: []api.Processor{santa.Put(0, []byte("x"))}, ReplyLen: 1}
	}
	ids, err := c.Add(target, rules)
	if err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if err := c.Delete(target, ids); err != nil {
			t.Fatal(err)
		}
	}
}

// TestNoRoomNotLostToUnoffloadable: room that appears in santad goes to
// the questions that waited for it, first come first; one of them whose
// answer cannot be offloaded (NSD truncates it) does not use up that room:
// the next one takes it.
func TestNoRoomNotLostToUnoffloadable(t *testing.T) {
	// long (truncated) and txt2 on the IPv4 and the IPv6 socket; the other
	// program's 2 rules fill santad: the IPv4 socket's txt2 has no room,
	// and the IPv6 socket's questions are left to wait for room unasked
	const maxRules, others = 2, 2
	r := newRigWith(t, testbed.KindNSD, rigOptions{extra: []string{"long IN TXT " + longTXT, `txt2 IN TXT "second"`},
		santadFlags: maxRulesFlags(t, maxRules)})
	deleteOthers := r.otherProgramRules(others)
	long, txt2 := "long."+r.zone.Origin, "txt2."+r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{long, txt2}, []uint16{dns.TypeTXT}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--poll", "0")
	if want := "(4 questions not offloaded)"; !strings.Contains(ctl.Ready(), want) {
		t.Fatalf("ready line %q, want %q", ctl.Ready(), want)
	}
	// room for 2: the IPv4 socket's txt2 takes one; the IPv6 socket's long,
	// the first of its questions to wait, cannot be offloaded, and its
	// txt2 takes the other
	deleteOthers()
	_, v6 := r.srv.Addrs()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, kernel := r.digAt(v6, txt2, "TXT"); kernel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s TXT at %v is not answered by the rule processor 10 s after rules went (%d rules); controller output:\n%s",
				txt2, v6, r.rules(), ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := r.rules(); n != maxRules {
		t.Errorf("santad holds %d rules, want %d: txt2 on both sockets", n, maxRules)
	}
	if err := ctl.WaitOutput("not_offloadable=1 still_waiting=0", time.Second); err != nil {
		t.Error(err)
	}
}

// TestFullSantadUpdatesRules: santad needs room for a rule's new version
// to modify it in place. When it has none, an answer that changes still
// gets its new rule (the old one deleted, then the new one added), rather
// than losing it to a question that waited for room.
func TestFullSantadUpdatesRules(t *testing.T) {
	r, ctl, txt, txt2 := halfRoomForTwoTXT(t)
	r.waitKernelAnswer(txt, "TXT", "hello from the testbed", 0, ctl)
	r.serveChangedZone("2024010102", func(rec string) string {
		return strings.Replace(rec, `"hello from the testbed"`, `"hello, changed"`, 1)
	})
	// at the IPv4 address, which had the rules first
	r.waitKernelAnswer(txt, "TXT", "hello, changed", 10*time.Second, ctl)
	if got, kernel := r.dig(txt2, "TXT"); got != `"second"` || !kernel {
		t.Errorf("txt2 TXT after the zone change: %q, from the rule processor %v", got, kernel)
	}
	if strings.Contains(ctl.Output(), "removing them") {
		t.Errorf("the controller removed rules it could not modify:\n%s", ctl.Output())
	}
}

// TestNoRoomOwnRuleGoes: when a rule of the controller's own goes (its
// answer grew past the shape's EDNS size: NSD truncates it), the room goes
// to the questions that waited for it.
func TestNoRoomOwnRuleGoes(t *testing.T) {
	r, ctl, _, txt2 := halfRoomForTwoTXT(t)
	// txt's IPv4 rule goes; the IPv6 socket's txt, the first to wait for
	// room, is truncated too, and its txt2 takes the room
	r.serveChangedZone("2024010102", func(rec string) string {
		return strings.Replace(rec, `"hello from the testbed"`, longTXT, 1)
	})
	v4, v6 := r.srv.Addrs()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, kernel := r.digAt(v6, txt2, "TXT"); kernel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s TXT at %v is not answered by the rule processor 10 s after the controller's rule went (%d rules); controller output:\n%s",
				txt2, v6, r.rules(), ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if _, kernel := r.digAt(v4, txt2, "TXT"); !kernel {
		t.Errorf("%s TXT at %v, offloaded first, is no longer answered by the rule processor", txt2, v4)
	}
	if n := r.rules(); n != 2 {
		t.Errorf("santad holds %d rules, want 2: txt2 on both sockets", n)
	}
}

// maxRulesFlags are santad's flags for a data plane of maxRules rules.
func maxRulesFlags(t *testing.T, maxRules int) []string {
	t.Helper()
	config := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, "dataplane:\n  max_rules: %d\n", maxRules), 0o644); err != nil {
		t.Fatal(err)
	}
	return []string{"--config", config}
}

// halfRoomForTwoTXT starts NSD, santad with room for 2 rules, and a static
// controller for txt and txt2 on the IPv4 and the IPv6 socket (4 rules):
// the IPv4 socket's 2 are installed, the IPv6 socket's wait for room.
func halfRoomForTwoTXT(t *testing.T) (r *rig, ctl *testbed.Controller, txt, txt2 string) {
	t.Helper()
	r = newRigWith(t, testbed.KindNSD, rigOptions{extra: []string{`txt2 IN TXT "second"`}, santadFlags: maxRulesFlags(t, 2)})
	txt, txt2 = "txt."+r.zone.Origin, "txt2."+r.zone.Origin
	ctl = r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{txt, txt2}, []uint16{dns.TypeTXT}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--poll", "200ms")
	if want := "(2 questions not offloaded)"; !strings.Contains(ctl.Ready(), want) {
		t.Fatalf("ready line %q, want %q", ctl.Ready(), want)
	}
	return r, ctl, txt, txt2
}
