package dnsctl_test

import (
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestHeaderOnlyQuery: a datagram that is only a DNS header announcing a
// question (QDCOUNT 1), which anyone can send to the server's port, reaches
// the controller as a miss sample in static mode (it learns shapes) and in
// adaptive mode. The controller goes on running and offloading.
func TestHeaderOnlyQuery(t *testing.T) {
	headerOnly := []byte{0x12, 0x34, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	for _, mode := range []string{"static", "adaptive"} {
		t.Run(mode, func(t *testing.T) {
			r := newRig(t, testbed.KindNSD, 0)
			www := "www." + r.zone.Origin
			args := []string{mode, "--port", "53/udp", "--shape", "rd,ad,edns"}
			if mode == "static" {
				args = append(args, "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}))
			} else {
				args = append(args, "--min-samples", "1", "--interval", "200ms")
			}
			ctl := r.startController(args...)
			v4, _ := r.srv.Addrs()
			s := r.sender(v4, 1)
			// the controller subscribes to miss samples after its ready line:
			// send until santad has sampled one
			deadline := time.Now().Add(10 * time.Second)
			for sent := 1; ; sent++ {
				s.sendAll([][]byte{headerOnly})
				if r.counters()["miss_sampled"] > 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("none of %d header-only queries in 10 s was sampled", sent)
				}
				time.Sleep(200 * time.Millisecond)
			}
			if exited, err := ctl.Wait(2 * time.Second); exited {
				t.Fatalf("the controller exited after a header-only query: %v\n%s", err, ctl.Output())
			}
			deadline = time.Now().Add(10 * time.Second)
			for {
				got, kernel := r.dig(www, "A")
				if got == testbed.ExampleWWW4.String() && kernel {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("after a header-only query: %q, from the rule processor %v", got, kernel)
				}
				time.Sleep(200 * time.Millisecond)
			}
		})
	}
}
