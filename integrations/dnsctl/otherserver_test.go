package dnsctl_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// stubResolverAddr is where systemd-resolved's stub listens on many hosts:
// `santa dns --port 53/udp` attaches to its socket too.
const stubResolverAddr = "127.0.0.53:53"

// startOtherServer runs, beside the rig's server, a Knot that serves no
// zone on stubResolverAddr (it answers REFUSED, as a resolver without
// upstream answers SERVFAIL), and waits until it answers.
func (r *rig) startOtherServer() {
	r.t.Helper()
	dir := r.t.TempDir()
	conf := filepath.Join(dir, "knot.conf")
	host, port, _ := strings.Cut(stubResolverAddr, ":")
	text := fmt.Sprintf("server:\n    rundir: %q\n    listen: %q\n    udp-workers: 1\n    tcp-workers: 1\n    background-workers: 1\ndatabase:\n    storage: %q\n",
		dir, host+"@"+port, dir)
	if err := os.WriteFile(conf, []byte(text), 0o644); err != nil {
		r.t.Fatal(err)
	}
	cmd := testbed.Command(context.Background(), r.tb.Server.NS, testbed.KnotPath, "-c", conf)
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	m := new(dns.Msg)
	m.SetQuestion(r.zone.Origin, dns.TypeSOA)
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := r.tb.Server.Do(func() error { _, err := dns.Exchange(m, stubResolverAddr); return err })
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the other server on %s does not answer: %v", stubResolverAddr, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestZoneChangeWithAnotherServerOnPort: another DNS server listens on the
// port at another address (here on 127.0.0.53, where systemd-resolved's
// stub listens), so `--port 53/udp` attaches to its socket too, and its
// address sorts first. It does not serve the zone. The zone is still
// checked at start (--zone) and polled at the server that serves it, and
// a change reaches the rule processor within a few poll intervals, while
// the other server's REFUSED is not taken for one at each poll.
func TestZoneChangeWithAnotherServerOnPort(t *testing.T) {
	for _, zoneFlag := range [][]string{nil, {"--zone", "example.test"}} {
		t.Run(fmt.Sprintf("zone=%v", zoneFlag != nil), func(t *testing.T) {
			r := newRig(t, testbed.KindNSD, 0)
			r.startOtherServer()
			www := "www." + r.zone.Origin
			ctl := r.startController(append([]string{"static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
				"--shape", "rd,ad,edns", "--poll", "200ms"}, zoneFlag...)...)
			for _, want := range []string{testbed.ExampleWWW4.String(), "198.18.255.99"} {
				if want != testbed.ExampleWWW4.String() {
					r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, testbed.ExampleWWW4.String(), want, 1) })
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					got, kernel := r.dig(www, "A")
					if got == want && kernel {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("10 s after the zone with www %s was loaded: %q, from the rule processor %v", want, got, kernel)
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
			// polls that get the zone's SOA from one server and REFUSED
			// from the other are no changes: the rule was asked again once
			// at each of the two addresses of the server, for the change
			time.Sleep(2 * time.Second)
			if err := ctl.Stop(20 * time.Second); err != nil {
				t.Fatal(err)
			}
			var installed, refreshed int
			done := ctl.Output()[strings.LastIndex(ctl.Output(), "done:"):]
			if _, err := fmt.Sscanf(done, "done: installed %d, refreshed %d,", &installed, &refreshed); err != nil || refreshed > 2 {
				t.Errorf("%q: want at most 2 answers refreshed (%v)", done, err)
			}
		})
	}
}
