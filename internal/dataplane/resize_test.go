package dataplane

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestReplyGrowsAtBothEnds sends real datagrams over the testbed's veth,
// whose XDP frames are copies with 216 bytes of headroom and only their
// rounding to 64 bytes as tailroom. A request whose frame is one byte past a
// multiple of 64 has 63 bytes of tailroom: a reply 250 bytes longer fits
// only by growing at both ends, and must come from XDP every time. A reply
// 1000 bytes longer fits nowhere: the request must reach the socket intact.
func TestReplyGrowsAtBothEnds(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces, XDP")
	}
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	for _, ip := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
		t.Run(map[bool]string{true: "IPv4", false: "IPv6"}[ip.Is4()], func(t *testing.T) {
			addr := netip.AddrPortFrom(ip, 5353)
			server, cookie := serverConn(t, tb, addr)

			// Ethernet, IP and UDP headers: 42 bytes over IPv4, 62 over IPv6
			headers := 42
			if ip.Is6() {
				headers = 62
			}
			payload := 65 - headers
			if ip.Is6() {
				payload += 64
			}
			fits := strings.Repeat("f", payload)
			tooBig := strings.Repeat("t", payload)
			fitsReply := strings.Repeat("F", payload+250)
			tooBigReply := strings.Repeat("B", payload+1000)
			rule := func(req, rep string) Rule {
				return Rule{Conditions: []Condition{cond(0, req)}, Processors: []Processor{put(0, rep)},
					ReplyLen: len(rep), MinLen: len(req), MaxLen: len(req)}
			}
			if err := d.Bind(udpSock(cookie, addr), SampleOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.AddRules(cookie, []Rule{rule(fits, fitsReply), rule(tooBig, tooBigReply)}); err != nil {
				t.Fatal(err)
			}
			c, err := tb.DialUDP(addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			buf := make([]byte, 2048)

			const n = 20 // one frame in five is a page's last fragment, with more tailroom
			before := counterNames(t, d)
			for i := 0; i < n; i++ {
				if _, err := c.Write([]byte(fits)); err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				k, err := c.Read(buf)
				if err != nil {
					t.Fatalf("request %d: no reply: %v", i, err)
				}
				if string(buf[:k]) != fitsReply {
					t.Fatalf("request %d: reply of %d bytes %.20q..., want the rule's %d bytes", i, k, buf[:k], len(fitsReply))
				}
			}
			after := counterNames(t, d)
			if got := after["answered"] - before["answered"]; got != n {
				t.Errorf("answered +%d, want +%d (pass_no_room +%d)", got, n, after["pass_no_room"]-before["pass_no_room"])
			}

			if _, err := c.Write([]byte(tooBig)); err != nil {
				t.Fatal(err)
			}
			server.SetReadDeadline(time.Now().Add(2 * time.Second))
			k, from, err := server.ReadFrom(buf)
			if err != nil {
				t.Fatalf("the request without room: not delivered to the socket: %v", err)
			}
			if !bytes.Equal(buf[:k], []byte(tooBig)) {
				t.Errorf("the request without room reached the socket as %q, want %q", buf[:k], tooBig)
			}
			if from.(*net.UDPAddr).AddrPort().Port() != c.LocalAddr().(*net.UDPAddr).AddrPort().Port() {
				t.Errorf("delivered from %v, want the client's %v", from, c.LocalAddr())
			}
			if got := counterNames(t, d)["pass_no_room"] - after["pass_no_room"]; got != 1 {
				t.Errorf("pass_no_room +%d, want +1", got)
			}
		})
	}
}
