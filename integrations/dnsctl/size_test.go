package dnsctl_test

import (
	"bytes"
	"fmt"
	"testing"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestCutReplyKeepsItsSize: to fit a small EDNS UDP size a server leaves
// additional records out of its reply, without setting TC. The rule made of
// such a cut reply must not answer a query that advertises more room,
// which the server answers in full; a reply that is the server's whole
// answer still answers every size. BIND is left out: it varies the order
// of the MX set, so such answers stay with it anyway.
func TestCutReplyKeepsItsSize(t *testing.T) {
	// ten mail exchangers with an A and an AAAA record each: over 512 bytes
	// with the additional records, less without
	var extra []string
	for i := range 10 {
		extra = append(extra, fmt.Sprintf("mx IN MX %d host%d", i, i),
			fmt.Sprintf("host%d IN A 198.18.254.%d", i, i), fmt.Sprintf("host%d IN AAAA 2001:2:0:fe::%d", i, i))
	}
	for _, kind := range []string{testbed.KindNSD, testbed.KindKnot} {
		t.Run(kind, func(t *testing.T) {
			r := newRig(t, kind, 0, extra...)
			mx, www := "mx."+r.zone.Origin, "www."+r.zone.Origin
			v4, _ := r.srv.Addrs()
			s := r.sender(v4, 1)
			id := uint16(0)
			query := func(name string, qtype, size uint16) []byte {
				m := new(dns.Msg)
				m.SetQuestion(name, qtype)
				m.RecursionDesired = false
				m.SetEdns0(size, false)
				id++
				m.Id = id
				b, err := m.Pack()
				if err != nil {
					t.Fatal(err)
				}
				return b
			}
			small := query(mx, dns.TypeMX, 512)
			larger := [][]byte{query(mx, dns.TypeMX, 1232), query(mx, dns.TypeMX, 4096)}
			whole := s.sendAll(larger)
			cut := s.sendAll([][]byte{small})[0]
			for i := range larger {
				if whole[i] == nil || cut == nil || len(cut) >= len(whole[i]) || len(cut) > 512 {
					t.Fatalf("the server's reply to the size 512 is not cut down: %d bytes, %d to a larger size", len(cut), len(whole[i]))
				}
			}
			r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{www, mx}, []uint16{dns.TypeA, dns.TypeMX}),
				"--shape", "edns=512", "--learn-shapes=false")
			// a rule matched if the rule processor answered (from XDP, or from
			// TC when the frame had no room), or could not make room at all
			// (pass_no_room)
			ask := func(q []byte) (reply []byte, matched bool) {
				before := r.counters()
				reply = s.sendAll([][]byte{q})[0]
				after := r.counters()
				return reply, after["answered"]+after["pass_no_room"] > before["answered"]+before["pass_no_room"]
			}
			for i, q := range larger {
				reply, matched := ask(q)
				if matched || reply == nil || !bytes.Equal(reply[2:], whole[i][2:]) {
					t.Errorf("a query of size %d: matched a rule %v, reply of %d bytes, the server's has %d",
						[]int{1232, 4096}[i], matched, len(reply), len(whole[i]))
				}
			}
			if _, matched := ask(small); !matched {
				t.Errorf("the cut reply's own query (size 512) matched no rule")
			}
			if _, matched := ask(query(www, dns.TypeA, 4096)); !matched {
				t.Errorf("a query of size 4096 for www A, whose whole answer has fewer than 512 bytes, matched no rule")
			}
		})
	}
}
