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
// 1000 bytes longer fits nowhere: XDP passes it to TC, which sends it, with
// its copies and valid checksums, also with the server veth's checksum
// offload off (checksumOffloadOff); with no TC program to send it (a version
// before it, moments of an upgrade) the request reaches the socket intact.
func TestReplyGrowsAtBothEnds(t *testing.T) {
	tb := testbed.New(t)
	d, att := loadAttachment(t, tb, Config{})
	var capture *os.File // the frames arriving at the client
	if err := tb.Client.Do(func() (err error) {
		capture, err = testbed.OpenPacket(tb.Client.Ifindex)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { capture.Close() })
	for _, fc := range familiesWithChecksumOffloadOff(tb) {
		ip := fc.ip
		if fc.offloadOff {
			checksumOffloadOff(t, tb)
		}
		t.Run(fc.name, func(t *testing.T) {
			addr := netip.AddrPortFrom(ip, 5353)
			_, cookie := serverConn(t, tb, addr)

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
			tooBig := "t0123" + strings.Repeat("t", payload-5)
			fitsReply := strings.Repeat("F", payload+250)
			tooBigReply := strings.Repeat("B", payload+1000)
			rule := func(req, rep string, copies ...Processor) Rule {
				return Rule{Conditions: []Condition{cond(0, req[:1])}, Processors: append([]Processor{put(0, rep)}, copies...),
					ReplyLen: len(rep), MinLen: len(req), MaxLen: len(req)}
			}
			// the request's bytes 1-3 at reply offset 10, the low bits of
			// byte 4 (with the template's high bits) at 700
			tooBigRule := rule(tooBig, tooBigReply, Processor{Kind: Copy, ReplyOffset: 10, SrcOffset: 1, Length: 3},
				copyMasked(700, 4, "\x0f"))
			want := []byte(tooBigReply)
			copy(want[10:], tooBig[1:4])
			want[700] = 'B'&0xf0 | tooBig[4]&0x0f
			if err := d.Bind(udpSock(cookie, addr), SampleOptions{}); err != nil {
				t.Fatal(err)
			}
			ids, err := d.AddRules(cookie, []Rule{rule(fits, fitsReply), tooBigRule})
			if err != nil {
				t.Fatal(err)
			}
			c, err := tb.DialUDP(addr)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { c.Close() })
			buf := make([]byte, 2048)
			ask := func(req string) []byte {
				t.Helper()
				if _, err := c.Write([]byte(req)); err != nil {
					t.Fatal(err)
				}
				c.SetReadDeadline(time.Now().Add(2 * time.Second))
				k, err := c.Read(buf)
				if err != nil {
					t.Fatalf("%.5q...: no reply: %v", req, err)
				}
				return buf[:k]
			}

			const n = 20 // one frame in five is a page's last fragment, with more tailroom
			before := counterNames(t, d)
			for i := 0; i < n; i++ {
				if reply := ask(fits); string(reply) != fitsReply {
					t.Fatalf("request %d: reply of %d bytes %.20q..., want the rule's %d bytes", i, len(reply), reply, len(fitsReply))
				}
			}
			after := counterNames(t, d)
			if got := after["answered"] - before["answered"]; got != n {
				t.Errorf("answered +%d, want +%d (pass_no_room +%d, udp_xdp_no_room +%d)", got, n,
					after["pass_no_room"]-before["pass_no_room"], after["udp_xdp_no_room"]-before["udp_xdp_no_room"])
			}

			before = after
			for i := 0; i < n; i++ {
				if reply := ask(tooBig); !bytes.Equal(reply, want) {
					t.Fatalf("request %d: the reply TC sent is %d bytes %.20q..., want the rule's %d bytes %.20q...",
						i, len(reply), reply, len(want), want)
				}
				checkCapturedReply(t, capture, want, fc.offloadOff)
			}
			after = counterNames(t, d)
			for name, wantN := range map[string]uint64{"answered": n, "udp_xdp_no_room": n, "pass_no_room": 0, "udp_emit_passed": 0, "udp_emit_failed": 0} {
				if got := after[name] - before[name]; got != wantN {
					t.Errorf("%s +%d, want +%d", name, got, wantN)
				}
			}
			if st, err := d.RuleStats(cookie); err != nil {
				t.Fatal(err)
			} else if got := st[ids[1]]; got.Hits != n || got.Bytes != n*uint64(headers+len(want)) {
				t.Errorf("the rule TC answered for counts %+v, want %d hits of %d bytes", got, n, headers+len(want))
			}
		})
	}

	// without the TC program, XDP's metadata does not disturb the request
	if err := att.handover.Close(); err != nil {
		t.Fatal(err)
	}
	addr := netip.AddrPortFrom(tb.Server.IP4, 5353)
	server, cookie := serverConn(t, tb, addr)
	tooBig := strings.Repeat("t", 23)
	if err := d.Bind(udpSock(cookie, addr), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddRules(cookie, []Rule{{Conditions: []Condition{cond(0, tooBig)},
		Processors: []Processor{put(0, strings.Repeat("B", 1200))}, ReplyLen: 1200}}); err != nil {
		t.Fatal(err)
	}
	c, err := tb.DialUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	before := counterNames(t, d)
	if _, err := c.Write([]byte(tooBig)); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 2048)
	server.SetReadDeadline(time.Now().Add(2 * time.Second))
	k, from, err := server.ReadFrom(buf)
	if err != nil {
		t.Fatalf("the request XDP passed to no TC program: not delivered to the socket: %v", err)
	}
	if !bytes.Equal(buf[:k], []byte(tooBig)) {
		t.Errorf("the request reached the socket as %q, want %q", buf[:k], tooBig)
	}
	if from.(*net.UDPAddr).AddrPort().Port() != c.LocalAddr().(*net.UDPAddr).AddrPort().Port() {
		t.Errorf("delivered from %v, want the client's %v", from, c.LocalAddr())
	}
	if got := counterNames(t, d)["udp_xdp_no_room"] - before["udp_xdp_no_room"]; got != 1 {
		t.Errorf("udp_xdp_no_room +%d, want +1", got)
	}
}

// checkCapturedReply reads the frames arriving at the client until the UDP
// reply with payload want, and checks its IPv4 header checksum and its UDP
// checksum: complete once the server's kernel has completed it (checksum
// offload off), else complete or in a local sender's partial form (the
// reply is CHECKSUM_PARTIAL, as its request was: checksumOffloadOff).
func checkCapturedReply(t *testing.T, capture *os.File, want []byte, complete bool) {
	t.Helper()
	frame := make([]byte, 4096)
	capture.SetReadDeadline(time.Now().Add(2 * time.Second))
	for {
		k, err := capture.Read(frame)
		if err != nil {
			t.Fatalf("the reply's frame was not captured at the client: %v", err)
		}
		p, _ := fzParse(frame[:k])
		if p == nil || !bytes.Equal(p.payload, want) {
			continue
		}
		if !p.ipv4CsumOK {
			t.Errorf("the reply's IPv4 header checksum is wrong")
		}
		partial := !complete && p.check == fzFold(fzPseudo(p))
		if !partial && fzFold(fzPseudo(p)+fzSumBytes(frame[p.l4:p.l4+8+len(p.payload)])) != 0xffff {
			t.Errorf("the reply's UDP checksum %#04x is wrong", p.check)
		}
		return
	}
}
