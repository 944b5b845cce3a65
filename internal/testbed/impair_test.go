//go:build linux

package testbed

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math/rand"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/bench/reflector"
	"golang.org/x/sys/unix"
)

// udpEchoServer answers every datagram on addr in the server namespace
// with the same bytes until the test ends.
func udpEchoServer(t *testing.T, tb *Testbed, addr netip.AddrPort) {
	t.Helper()
	ln, err := tb.Server.ListenUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := ln.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			ln.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
}

// udpRoundTrips sends n datagrams to addr from the client namespace, one at
// a time, and returns how many came back (each waits up to wait).
func udpRoundTrips(t *testing.T, tb *Testbed, addr netip.AddrPort, n int, wait time.Duration) int {
	t.Helper()
	c, err := tb.DialUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := 0
	buf := make([]byte, 2048)
	for i := 0; i < n; i++ {
		msg := []byte(fmt.Sprintf("round trip %d via %v", i, addr))
		if _, err := c.Write(msg); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(wait))
		for {
			m, err := c.Read(buf)
			if err != nil {
				break
			}
			if bytes.Equal(buf[:m], msg) {
				got++
				break
			}
			// an earlier round trip's late or duplicated answer
		}
	}
	return got
}

// icmpEcho sends one ICMP (v6) echo request from the client namespace to
// dst and waits for the reply.
func icmpEcho(tb *Testbed, dst netip.Addr, id, seq uint16) error {
	return tb.Client.Do(func() error {
		network, req, rep := "ip4:icmp", byte(8), byte(0)
		if dst.Is6() {
			network, req, rep = "ip6:ipv6-icmp", 128, 129
		}
		c, err := net.ListenPacket(network, "")
		if err != nil {
			return err
		}
		defer c.Close()
		m := []byte{req, 0, 0, 0, byte(id >> 8), byte(id), byte(seq >> 8), byte(seq), 's', 'a', 'n', 't', 'a'}
		if dst.Is4() { // the kernel computes the ICMPv6 checksum
			binary.BigEndian.PutUint16(m[2:], inetChecksum(m))
		}
		if _, err := c.WriteTo(m, &net.IPAddr{IP: dst.AsSlice()}); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 1500)
		for {
			n, _, err := c.ReadFrom(buf)
			if err != nil {
				return fmt.Errorf("echo reply from %v: %w", dst, err)
			}
			if n >= 8 && buf[0] == rep && binary.BigEndian.Uint16(buf[4:]) == id && binary.BigEndian.Uint16(buf[6:]) == seq {
				return nil
			}
		}
	})
}

func inetChecksum(b []byte) uint16 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	for s > 0xffff {
		s = s>>16 + s&0xffff
	}
	return ^uint16(s)
}

// TestImpairClean: without impairment the middle forwards everything both
// ways, adds nothing of its own, and the setup is as documented.
func TestImpairClean(t *testing.T) {
	tb, l := NewImpaired(t, Options{}, ImpairOptions{})

	for _, a := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
		addr := netip.AddrPortFrom(a, 7007)
		udpEchoServer(t, tb, addr)
		if got := udpRoundTrips(t, tb, addr, 20, 2*time.Second); got != 20 {
			t.Errorf("UDP via %v: %d of 20 round trips", a, got)
		}
		for seq := uint16(1); seq <= 3; seq++ {
			if err := icmpEcho(tb, a, 0x5a17, seq); err != nil {
				t.Errorf("ICMP echo: %v", err)
			}
		}
	}
	for _, d := range []Direction{ToServer, ToClient} {
		c := l.Counters(d)
		t.Logf("%v: %+v", d, c)
		if c.Received < 46 || c.Forwarded != c.Received || c.Dropped+c.Reordered+c.Duplicated+c.Overflow+c.SocketDrops+c.SendErrors+c.CsumNotReady != 0 {
			t.Errorf("%v: counters %+v: want every frame forwarded, nothing else", d, c)
		}
	}
	// The middle kernel sends nothing of its own: what leaves a middle
	// interface is exactly what the forwarder wrote.
	for _, x := range []struct {
		dev string
		d   Direction
	}{{l.ClientDev, ToClient}, {l.ServerDev, ToServer}} {
		st, err := Side{NS: l.NS, Dev: x.dev}.Stats()
		if err != nil {
			t.Fatal(err)
		}
		if c := l.Counters(x.d); st.TxPackets != c.Forwarded+c.Multicast {
			t.Errorf("%s sent %d frames, the forwarder wrote %d", x.dev, st.TxPackets, c.Forwarded+c.Multicast)
		}
	}
	out, err := l.Run("ip", "addr", "show")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out, "inet") {
		t.Errorf("middle namespace has addresses:\n%s", out)
	}
	for _, x := range []struct{ ns, dev string }{
		{tb.Server.NS, tb.Server.Dev}, {tb.Client.NS, tb.Client.Dev}, {l.NS, l.ServerDev}, {l.NS, l.ClientDev},
	} {
		out, err := Run(x.ns, "ethtool", "-k", x.dev)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []string{"tcp-segmentation-offload: off", "generic-segmentation-offload: off", "generic-receive-offload: off", "tx-checksumming: off"} {
			if !strings.Contains(out, f) {
				t.Errorf("%s: no %q", x.dev, f)
			}
		}
	}
	for _, x := range []struct {
		ns  string
		idx int
	}{{tb.Client.NS, tb.Client.Ifindex}, {l.NS, l.ServerIfindex}, {l.NS, l.ClientIfindex}} {
		if xi, err := QueryXDP(x.ns, x.idx); err != nil || xi.DrvID == 0 {
			t.Errorf("ifindex %d in %s: no native XDP program (%+v, %v)", x.idx, x.ns, xi, err)
		}
	}
	if si, err := tb.ServerXDP(); err != nil || si.ID() != 0 {
		t.Errorf("server veth should have no XDP program: %+v %v", si, err)
	}
}

// TestImpairLossTCP: with 20% of the frames lost each way, TCP transfers
// of 1 MB from nginx over IPv4 and IPv6 complete intact.
func TestImpairLossTCP(t *testing.T) {
	tb, l := NewImpaired(t, Options{}, ImpairOptions{Seed: 42})
	big := make([]byte, 1<<20)
	rand.New(rand.NewSource(2)).Read(big)
	n, err := tb.StartNginx(NginxOptions{Files: map[string][]byte{"big.bin": big}, IPv6: true, Sendfile: true})
	if err != nil {
		t.Fatal(err)
	}
	// Keep the transfers short and their duration bounded: retransmission
	// timeouts from 10 ms, at most 1 s after backing off (SYNs too), in
	// both namespaces (the defaults, 200 ms and 120 s, are for real
	// networks; with 20% loss a few unlucky back-offs would take minutes).
	for _, s := range []Side{tb.Client, tb.Server} {
		if _, err := s.Run("sysctl", "-q", "-w", "net.ipv4.tcp_rto_min_us=10000", "net.ipv4.tcp_rto_max_ms=1000",
			"net.ipv4.tcp_syn_linear_timeouts=20"); err != nil {
			t.Fatal(err)
		}
	}
	if err := l.SetLoss(0.2); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { // what the forwarder saw, should a transfer stall (it did once, over IPv6, in CI)
		if t.Failed() {
			for _, d := range []Direction{ToServer, ToClient} {
				t.Logf("%v: %+v", d, l.Counters(d))
			}
		}
	})
	for _, url := range []string{n.URL4("/big.bin"), n.URL6("/big.bin")} {
		start := time.Now()
		got := curlGetWithin(t, tb, url, 60*time.Second)
		if !bytes.Equal(got, big) {
			t.Errorf("%s: %d bytes, not the file", url, len(got))
		}
		t.Logf("%s: %d bytes in %v", url, len(got), time.Since(start).Round(time.Millisecond))
	}
	for _, d := range []Direction{ToServer, ToClient} {
		c := l.Counters(d)
		t.Logf("%v: %+v", d, c)
		if c.Forwarded+c.Dropped != c.Received {
			t.Errorf("%v: forwarded %d + dropped %d != received %d", d, c.Forwarded, c.Dropped, c.Received)
		}
		if r := float64(c.Dropped) / float64(c.Received); c.Received < 200 || r < 0.15 || r > 0.25 {
			t.Errorf("%v: %d of %d frames dropped (%.3f), want about 0.2", d, c.Dropped, c.Received, r)
		}
		if c.MaxFrame > 1514 {
			t.Errorf("%v: a frame of %d bytes (offloads on?)", d, c.MaxFrame)
		}
	}
	if c := l.Counters(ToClient); c.MaxFrame != 1514 {
		t.Errorf("largest frame to the client %d bytes, want full 1514-byte frames", c.MaxFrame)
	}

	// Everything at once.
	all := Impairment{Loss: 0.05, Reorder: 0.1, Duplicate: 0.05, Delay: time.Millisecond, Jitter: 500 * time.Microsecond}
	if err := l.SetBoth(all); err != nil {
		t.Fatal(err)
	}
	before := l.Counters(ToClient)
	start := time.Now()
	if got := curlGetWithin(t, tb, n.URL4("/big.bin"), 60*time.Second); !bytes.Equal(got, big) {
		t.Errorf("with %+v: %d bytes, not the file", all, len(got))
	}
	c := l.Counters(ToClient)
	t.Logf("with %+v: %v; to-client %+v", all, time.Since(start).Round(time.Millisecond), c)
	if c.Dropped == before.Dropped || c.Reordered == before.Reordered || c.Duplicated == before.Duplicated {
		t.Errorf("counters did not move: %+v -> %+v", before, c)
	}
}

// seqFlood sends count numbered datagrams from the client to an address
// in the server namespace, a few at a time, and returns the sequence
// numbers in the order the server received them.
func seqFlood(t *testing.T, tb *Testbed, addr netip.AddrPort, count int) []uint32 {
	t.Helper()
	ln, err := tb.Server.ListenUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// Room for all of them even if the reader is slow (2 CPUs, other
	// tests running).
	if rc, err := ln.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20) })
	}
	c, err := tb.DialUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got := make(chan []uint32)
	go func() {
		var seqs []uint32
		buf := make([]byte, 64)
		for {
			ln.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			n, err := ln.Read(buf)
			if err != nil {
				got <- seqs
				return
			}
			if n == 4 {
				seqs = append(seqs, binary.BigEndian.Uint32(buf))
			}
		}
	}()
	for i := 0; i < count; i++ {
		c.Write(binary.BigEndian.AppendUint32(nil, uint32(i)))
		if i%20 == 19 {
			time.Sleep(200 * time.Microsecond)
		}
	}
	return <-got
}

// TestImpairCounters: loss, duplication, reordering and delay happen at
// about the configured rates, the counters say so, the same seed gives
// the same decisions, and changes at run time apply at once.
func TestImpairCounters(t *testing.T) {
	const count = 2000
	// A held frame waits for the next one (ReorderWait is far longer than
	// the gaps between frames even on a busy machine), so the order the
	// server sees depends only on the random decisions.
	io := ImpairOptions{Seed: 7, ToServer: Impairment{Loss: 0.1, Duplicate: 0.05, Reorder: 0.05, ReorderWait: 200 * time.Millisecond}}
	var first []uint32
	for run := 0; run < 2; run++ {
		tb, l := NewImpaired(t, Options{}, io)
		seqs := seqFlood(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7100), count)
		c := l.Counters(ToServer)
		t.Logf("run %d: %d datagrams received; %+v", run, len(seqs), c)
		if c.Received != count || c.Forwarded != c.Received-c.Dropped+c.Duplicated {
			t.Errorf("counters %+v: want %d received, forwarded = received - dropped + duplicated", c, count)
		}
		if uint64(len(seqs)) != c.Forwarded {
			t.Errorf("server got %d datagrams, forwarder sent %d", len(seqs), c.Forwarded)
		}
		near := func(what string, v uint64, p float64) {
			if want := p * count; float64(v) < want*0.6 || float64(v) > want*1.4 {
				t.Errorf("%s %d, want about %.0f", what, v, want)
			}
		}
		near("dropped", c.Dropped, 0.1)
		near("duplicated", c.Duplicated, 0.05*0.9)
		near("reordered", c.Reordered, 0.05*0.9)
		// What the server saw: duplicates and frames behind a later one.
		seen := map[uint32]bool{}
		var dups, late uint64
		var highest uint32
		for i, s := range seqs {
			if seen[s] {
				dups++
				continue
			}
			seen[s] = true
			if i > 0 && s < highest {
				late++
			}
			highest = max(highest, s)
		}
		if dups != c.Duplicated {
			t.Errorf("server saw %d duplicates, forwarder counted %d", dups, c.Duplicated)
		}
		// A held frame goes out right after the next forwarded one (lost
		// frames never reach the queue): all show up late, but perhaps
		// the last.
		if late+1 < c.Reordered || late > c.Reordered {
			t.Errorf("server saw %d frames out of order, forwarder held %d", late, c.Reordered)
		}
		if l.Counters(ToClient).Received != 0 {
			t.Errorf("frames towards the client: %+v", l.Counters(ToClient))
		}
		if run == 0 {
			first = seqs
		} else if fmt.Sprint(seqs) != fmt.Sprint(first) {
			t.Errorf("the same seed gave different results")
		}

		if run == 1 {
			// Run-time changes: everything lost, then delay.
			addr := netip.AddrPortFrom(tb.Server.IP6, 7101)
			udpEchoServer(t, tb, addr)
			if err := l.Set(ToServer, Impairment{}); err != nil {
				t.Fatal(err)
			}
			if got := udpRoundTrips(t, tb, addr, 5, time.Second); got != 5 {
				t.Errorf("%d of 5 round trips without impairment", got)
			}
			if err := l.SetLoss(1); err != nil {
				t.Fatal(err)
			}
			before := l.Counters(ToServer).Dropped
			if got := udpRoundTrips(t, tb, addr, 3, 200*time.Millisecond); got != 0 {
				t.Errorf("%d of 3 round trips with loss 1", got)
			}
			if d := l.Counters(ToServer).Dropped - before; d != 3 {
				t.Errorf("%d frames dropped with loss 1, want 3", d)
			}
			if err := l.SetBoth(Impairment{Delay: 20 * time.Millisecond, Jitter: 2 * time.Millisecond}); err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			if got := udpRoundTrips(t, tb, addr, 5, time.Second); got != 5 {
				t.Errorf("%d of 5 round trips with delay", got)
			}
			if rtt := time.Since(start) / 5; rtt < 36*time.Millisecond || rtt > 100*time.Millisecond {
				t.Errorf("round trip %v with 20±2 ms each way", rtt)
			}
			if err := l.Set(ToClient, Impairment{Loss: 2}); err == nil {
				t.Error("loss 2 accepted")
			}
		}
	}
}

// TestImpairXDPTX: frames an XDP program on the server veth sends back
// with XDP_TX reach the client through the middle, only because the
// middle's veth has xdp_pass, and they are impaired like all others.
func TestImpairXDPTX(t *testing.T) {
	tb, l := NewImpaired(t, Options{}, ImpairOptions{})
	const port = 7200
	r, err := reflector.Load(port)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := tb.Server.Do(func() error { return r.Attach(tb.Server.Ifindex) }); err != nil {
		t.Fatal(err)
	}
	defer r.Detach()
	// No socket listens on the port in the server namespace: every answer
	// is the reflector's.
	for _, a := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
		if got := udpRoundTrips(t, tb, netip.AddrPortFrom(a, port), 10, time.Second); got != 10 {
			t.Errorf("via %v: %d of 10 reflected", a, got)
		}
	}
	refl, _ := r.Reflected()
	c := l.Counters(ToClient)
	if refl != 20 || c.Forwarded != 20 {
		t.Errorf("reflected %d, forwarded to the client %+v; want 20", refl, c)
	}

	// Without an XDP program on the middle's veth the XDP_TX frames are
	// lost before the forwarder sees them.
	if err := DetachXDPNetlink(l.NS, l.ServerIfindex, XDPModeDriver); err != nil {
		t.Fatal(err)
	}
	if got := udpRoundTrips(t, tb, netip.AddrPortFrom(tb.Server.IP4, port), 3, 300*time.Millisecond); got != 0 {
		t.Errorf("%d of 3 reflected without xdp_pass on %s", got, l.ServerDev)
	}
	refl2, _ := r.Reflected()
	if refl2 != refl+3 || l.Counters(ToClient).Received != c.Received {
		t.Errorf("reflected %d more, middle received %d more; want 3 and 0", refl2-refl, l.Counters(ToClient).Received-c.Received)
	}
	if err := l.AttachPass(); err != nil {
		t.Fatal(err)
	}

	// XDP_TX frames are impaired too.
	if err := l.Set(ToClient, Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	if got := udpRoundTrips(t, tb, netip.AddrPortFrom(tb.Server.IP4, port), 3, 300*time.Millisecond); got != 0 {
		t.Errorf("%d of 3 reflected with loss 1 towards the client", got)
	}
	if d := l.Counters(ToClient).Dropped; d != 3 {
		t.Errorf("dropped towards the client %d, want 3", d)
	}
	if err := l.Set(ToClient, Impairment{}); err != nil {
		t.Fatal(err)
	}
	if got := udpRoundTrips(t, tb, netip.AddrPortFrom(tb.Server.IP6, port), 3, time.Second); got != 3 {
		t.Errorf("%d of 3 reflected after the loss is gone", got)
	}
}

// TestImpairClose: closing the testbed stops the forwarder and removes all
// three namespaces.
func TestImpairClose(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: run the tests as root")
	}
	tb, l, err := CreateImpaired(Options{Logf: t.Logf}, ImpairOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := l.Close(); err != nil {
		t.Errorf("second Close of the link: %v", err)
	}
	for _, ns := range []string{tb.Server.NS, tb.Client.NS, l.NS} {
		if nsExists(ns) {
			t.Errorf("namespace %s still exists", ns)
		}
	}
	_ = l.Counters(ToServer) // no panic after Close
}
