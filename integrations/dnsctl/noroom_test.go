package dnsctl_test

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestNoRoomInSantad: with more questions than santad has room for, the
// controller fills santad, the IPv4 and the IPv6 socket each with the first
// questions, leaves the rest to the server without trying them one by one,
// says so once, and the kernel answers the ones that fit.
func TestNoRoomInSantad(t *testing.T) {
	const maxRules, generated = 1500, 1500 // one batch (1024) on each socket does not fit
	config := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, "dataplane:\n  max_rules: %d\n", maxRules), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newRigWith(t, testbed.KindNSD, rigOptions{generated: generated, santadFlags: []string{"--config", config}})
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
