package dnsctl_test

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// txtOf is TXT data of n strings of 240 bytes: about 250 bytes of reply
// each.
func txtOf(n int) string {
	return strings.TrimSpace(strings.Repeat(`"`+strings.Repeat("y", 240)+`" `, n))
}

// digBufsize has dig ask the rig's server (IPv4) for name TXT with EDNS
// size size, and says whether the rule processor answered.
func (r *rig) digBufsize(name string, size int) bool {
	r.t.Helper()
	v4, _ := r.srv.Addrs()
	before := r.answered()
	r.tb.Client.Run("dig", "+nocookie", "+tries=1", "+time=1", "+ignore", fmt.Sprintf("+bufsize=%d", size),
		"@"+v4.Addr().String(), name, "TXT", "+short")
	return r.answered() > before
}

// TestUnoffloadableShapesDoNotUseMaxRules: --max-rules bounds the rules
// of shapes learned from misses, not the shapes tried. Two shapes whose
// answer the server truncates (EDNS sizes below the answer's ~790 bytes)
// are tried and not offloaded; a third, which fits, is still learned with
// --max-rules 2.
func TestUnoffloadableShapesDoNotUseMaxRules(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "mid IN TXT "+txtOf(3))
	mid := "mid." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{mid}, []uint16{dns.TypeTXT}),
		"--shape", "edns=4096", "--max-rules", "2", "--poll", "0")
	// the miss samples reach the controller in the order of the queries:
	// it tries both truncated shapes before the one that fits
	for _, size := range []int{600, 601} {
		if r.digBufsize(mid, size) {
			t.Fatalf("a query with EDNS size %d, which the server truncates, was answered by the rule processor", size)
		}
	}
	r.digBufsize(mid, 1400) // the first teaches the shape
	r.untilLearned("dig +bufsize=1400 after two truncated shapes", func() bool { return r.digBufsize(mid, 1400) }, ctl)
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	// the truncated shapes are asked again, as any question not offloaded
	if want := "2 questions not offloaded yet, asked again"; !strings.Contains(ctl.Output(), want) {
		t.Errorf("the done line does not say %q:\n%s", want, ctl.Output())
	}
}

// TestRemovedLearnedRuleFreesItsPlace: --max-rules bounds the live rules of
// learned shapes. With --max-rules 1, a learned shape's rule that goes
// (its answer grows past the shape's EDNS size: NSD truncates it) makes
// room for another shape.
func TestRemovedLearnedRuleFreesItsPlace(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "mid IN TXT "+txtOf(2))
	mid := "mid." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{mid}, []uint16{dns.TypeTXT}),
		"--shape", "edns=4096", "--max-rules", "1", "--poll", "200ms")
	r.digBufsize(mid, 600) // ~540 bytes: fits
	r.untilLearned("dig +bufsize=600", func() bool { return r.digBufsize(mid, 600) }, ctl)
	if n := r.rules(); n != 3 { // edns=4096 on the IPv4 and the IPv6 socket, the learned shape on the IPv4 one
		t.Fatalf("%d rules once the shape is learned, want 3", n)
	}

	// ~790 bytes: the server truncates its answer at size 600, and the
	// learned shape's rule goes
	r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, txtOf(2), txtOf(3), 1) })
	deadline := time.Now().Add(10 * time.Second)
	for r.rules() != 2 {
		if time.Now().After(deadline) {
			t.Fatalf("%d rules 10 s after the answer grew past the learned shape's size, want 2; controller output:\n%s",
				r.rules(), ctl.Output())
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.digBufsize(mid, 1000) // fits: learned in the place the other one left
	r.untilLearned("dig +bufsize=1000 after the first learned rule went", func() bool { return r.digBufsize(mid, 1000) }, ctl)
	if r.digBufsize(mid, 600) {
		t.Errorf("a query with EDNS size 600, which the server now truncates, was answered by the rule processor")
	}
}
