package dataplane

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// tcpFrame builds an Ethernet/IP/TCP frame from the client to the server.
func tcpFrame(t testing.TB, c, s netip.AddrPort, tcp *layers.TCP, payload string) []byte {
	t.Helper()
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0, 0, 0, 0, 2}, DstMAC: net.HardwareAddr{2, 0, 0, 0, 0, 1},
		EthernetType: layers.EthernetTypeIPv4}
	var ip gopacket.SerializableLayer = &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP,
		SrcIP: c.Addr().AsSlice(), DstIP: s.Addr().AsSlice(), Flags: layers.IPv4DontFragment}
	if c.Addr().Is6() {
		eth.EthernetType = layers.EthernetTypeIPv6
		ip = &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolTCP,
			SrcIP: c.Addr().AsSlice(), DstIP: s.Addr().AsSlice()}
	}
	tcp.SrcPort, tcp.DstPort = layers.TCPPort(c.Port()), layers.TCPPort(s.Port())
	tcp.SetNetworkLayerForChecksum(ip.(gopacket.NetworkLayer))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		eth, ip, tcp, gopacket.Payload(payload)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// parseTCP decodes a reply frame's TCP layer and payload.
func parseTCP(t testing.TB, frame []byte) (*layers.TCP, string) {
	t.Helper()
	p := gopacket.NewPacket(frame, layers.LayerTypeEthernet, gopacket.Default)
	tcp, ok := p.Layer(layers.LayerTypeTCP).(*layers.TCP)
	if !ok {
		t.Fatalf("not a TCP frame: %x", frame)
	}
	if err := p.ErrorLayer(); err != nil {
		t.Fatalf("reply frame: %v", err.Error())
	}
	return tcp, string(tcp.Payload)
}

func tsOption(tsval, tsecr uint32) layers.TCPOption {
	d := make([]byte, 8)
	binary.BigEndian.PutUint32(d, tsval)
	binary.BigEndian.PutUint32(d[4:], tsecr)
	return layers.TCPOption{OptionType: layers.TCPOptionKindTimestamps, OptionLength: 10, OptionData: d}
}

func timestamps(t testing.TB, tcp *layers.TCP) (tsval, tsecr uint32) {
	t.Helper()
	for _, o := range tcp.Options {
		if o.OptionType == layers.TCPOptionKindTimestamps {
			return binary.BigEndian.Uint32(o.OptionData), binary.BigEndian.Uint32(o.OptionData[4:])
		}
	}
	t.Fatalf("no timestamps in %v", tcp.Options)
	return 0, 0
}

// TestSipHashVector checks the Go SipHash against the reference vector of
// the empty message under key 00..0f (SipHash paper, vectors.h).
func TestSipHashVector(t *testing.T) {
	var key [16]byte
	for i := range key {
		key[i] = byte(i)
	}
	got := siphash24(binary.LittleEndian.Uint64(key[:8]), binary.LittleEndian.Uint64(key[8:]), nil)
	if want := uint64(0x726fdb47dd0e0e31); got != want {
		t.Fatalf("siphash24 = %#x, want %#x", got, want)
	}
}

// stampValid checks a stamp the way bpf/tcp.h does, with the key user
// space wrote for its epoch, for an IPv4 connection c -> s to a listener
// of owner uid.
func stampValid(t *testing.T, d *Dataplane, c, s netip.AddrPort, stamp uint32, unit uint64, uid uint32) bool {
	t.Helper()
	field := uint64(stamp >> 26)
	age := (unit - field) & 63
	u := unit - age
	epoch := u >> stampEpochShift
	var k StampKey
	if err := d.objs.SantaTcpKeys.Lookup(uint32(epoch%stampKeySlots), &k); err != nil || k.EpochPlus1 != epoch+1 {
		t.Fatalf("no key for epoch %d: %v", epoch, err)
	}
	finOpts := uint64(stamp>>25&1) | uint64(stamp>>18&127)<<1
	ca, sa := c.Addr().As4(), s.Addr().As4()
	var tuple [36]byte
	copy(tuple[0:], ca[:])
	copy(tuple[4:], sa[:])
	binary.BigEndian.PutUint16(tuple[8:], c.Port())
	binary.BigEndian.PutUint16(tuple[10:], s.Port())
	m := make([]uint64, 6)
	for i := 0; i < 4; i++ {
		m[i] = binary.LittleEndian.Uint64(tuple[8*i:])
	}
	m[4] = uint64(binary.LittleEndian.Uint32(tuple[32:])) | (finOpts|4<<8)<<32
	m[5] = u | uint64(uid)<<32
	return uint32(siphash24(k.K0, k.K1, m))&(1<<18-1) == stamp&(1<<18-1)
}

// tcpEnv is an env whose TCP listener at 8081 has one rule: reply answers
// exactly request.
func tcpEnv(t *testing.T, request, reply string) (*env, netip.AddrPort) {
	e := newEnv(t, Config{})
	addr := netip.AddrPortFrom(e.tb.Server.IP4, 8081)
	srv := startTCPServer(t, e.tb, addr)
	e.bindRules(e.known(srv.sock()), exactRule(request, reply, false))
	return e, addr
}

// TestTCPFixtures runs single segments through the XDP program: the
// SYN-ACK and its stamp, a forged stamp, a request answered in place.
func TestTCPFixtures(t *testing.T) {
	request := "GET / HTTP/1.1\r\n\r\n"
	reply := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi"
	e, addr := tcpEnv(t, request, reply)
	client := netip.AddrPortFrom(e.tb.Client.IP4, 40001)

	syn := &layers.TCP{SYN: true, Seq: 1000, Window: 64240, Options: []layers.TCPOption{
		{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}},
		{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2},
		tsOption(777, 0),
		{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}},
	}}
	before := e.counters()
	verdict, out := e.run(tcpFrame(t, client, addr, syn, ""))
	if verdict != xdpTx || e.counters()["tcp_syn_answered"] != before["tcp_syn_answered"]+1 {
		t.Fatalf("SYN: verdict %d, counters %v", verdict, e.counters())
	}
	synack, _ := parseTCP(t, out)
	if !synack.SYN || !synack.ACK || synack.Ack != 1001 || synack.SrcPort != 8081 || synack.DstPort != 40001 {
		t.Fatalf("SYN-ACK: %+v", synack)
	}
	stamp, echo := timestamps(t, synack)
	if echo != 777 {
		t.Fatalf("SYN-ACK echoes %d, want the SYN's TSval 777", echo)
	}
	if !stampValid(t, e.d, client, addr, stamp, nowUnit(t), 0) {
		t.Fatalf("the SYN-ACK's TSval %#x is not a valid stamp", stamp)
	}
	if opts := stamp >> 18 & 127; opts != 3<<5|7<<1|1 {
		t.Fatalf("stamp options %#b, want MSS 1460, window scale 7, SACK", opts)
	}

	ack := func(tsecr uint32, payload string) []byte {
		return tcpFrame(t, client, addr, &layers.TCP{ACK: true, PSH: payload != "", Seq: 1001, Ack: synack.Seq + 1,
			Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindNop}, tsOption(778, tsecr)}}, payload)
	}
	e.expect("forged stamp", ack(stamp^1, request), xdpPass, nil, "tcp_pass_bad_stamp")
	e.expect("options changed", ack(stamp^1<<20, request), xdpPass, nil, "tcp_pass_bad_stamp")
	e.expect("handshake ACK", ack(stamp, ""), xdpDrop, nil, "tcp_ack_consumed")
	e.expect("other request", ack(stamp, "GET /x HTTP/1.1\r\n\r\n"), xdpPass, nil, "pass_no_match")

	before = e.counters()
	verdict, out = e.run(ack(stamp, request))
	if verdict != xdpTx || e.counters()["answered"] != before["answered"]+1 {
		t.Fatalf("request: verdict %d", verdict)
	}
	r, payload := parseTCP(t, out)
	if payload != reply || r.Seq != synack.Seq+1 || r.Ack != 1001+uint32(len(request)) || !r.PSH || r.FIN {
		t.Fatalf("reply: seq %d ack %d flags PSH %v FIN %v payload %q", r.Seq, r.Ack, r.PSH, r.FIN, payload)
	}
	tsval, tsecr := timestamps(t, r)
	if tsecr != 778 || !stampValid(t, e.d, client, addr, tsval, nowUnit(t), 0) {
		t.Fatalf("reply timestamps %#x %d", tsval, tsecr)
	}
	// a SYN on the 4-tuple of a flow gets a challenge ACK (RFC 5961 4.2);
	// a client that opened a new connection answers it with a RST at its
	// ack, which drops the old flow, and its next SYN is answered
	if n := flowCount(t, e.d); n != 1 {
		t.Fatalf("%d flows after the answer, want 1", n)
	}
	before = e.counters()
	verdict, out = e.run(tcpFrame(t, client, addr, syn, ""))
	if after := e.counters(); verdict != xdpTx || after["tcp_syn_challenged"] != before["tcp_syn_challenged"]+1 {
		t.Fatalf("SYN again: verdict %d, counters %v", verdict, after)
	}
	challenge, _ := parseTCP(t, out)
	if challenge.SYN || !challenge.ACK || challenge.Seq != synack.Seq+1+uint32(len(reply)) ||
		challenge.Ack != 1001+uint32(len(request)) {
		t.Fatalf("SYN again: %+v, want an ACK at eBPF's next byte acking the client's", challenge)
	}
	if n := flowCount(t, e.d); n != 1 {
		t.Fatalf("%d flows after a SYN on the same 4-tuple, want 1", n)
	}
	e.expect("RST at the challenge's ack", tcpFrame(t, client, addr, &layers.TCP{RST: true, Seq: challenge.Ack}, ""),
		xdpDrop, nil, "tcp_rst_consumed")
	e.expect("SYN after the RST", tcpFrame(t, client, addr, syn, ""), xdpTx, nil, "tcp_syn_answered")
}

// nowUnit is the current stamp unit.
func nowUnit(t *testing.T) uint64 {
	t.Helper()
	u, err := stampUnit()
	if err != nil {
		t.Fatal(err)
	}
	return u
}

// TestInterfaceMTU: on an interface with a 1400-byte MTU (the namespace's
// loopback, where BPF_PROG_RUN delivers) the SYN-ACK announces the MSS that
// MTU allows, and the stamp carries 1220, the largest segment size not above
// it; a UDP reply longer than the MTU goes to the socket (it would need
// fragments), one that just fits is answered.
func TestInterfaceMTU(t *testing.T) {
	e := newEnv(t, Config{})
	if out, err := e.tb.Server.Run("ip", "link", "set", "lo", "mtu", "1400"); err != nil {
		t.Fatalf("lower the MTU: %v: %s", err, out)
	}
	for _, v6 := range []bool{false, true} {
		client, addr := fixtureAddrs(e, v6, 8081)
		srv := startTCPServer(t, e.tb, addr)
		e.bindRules(e.known(srv.sock()))
		syn := &layers.TCP{SYN: true, Seq: 1000, Window: 64240, Options: []layers.TCPOption{
			{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}}, // 1460
			tsOption(777, 0),
		}}
		verdict, out := e.run(tcpFrame(t, client, addr, syn, ""))
		if verdict != xdpTx {
			t.Fatalf("SYN: verdict %d, counters %v", verdict, e.counters())
		}
		synack, _ := parseTCP(t, out)
		wantMSS := map[bool]uint16{false: 1400 - 40, true: 1400 - 60}[v6]
		var mss uint16
		for _, o := range synack.Options {
			if o.OptionType == layers.TCPOptionKindMSS {
				mss = binary.BigEndian.Uint16(o.OptionData)
			}
		}
		stamp, _ := timestamps(t, synack)
		if idx := stamp >> 18 & 127 >> 5; mss != wantMSS || idx != 1 {
			t.Errorf("IPv6 %v: SYN-ACK announces MSS %d, stamp MSS index %d; want %d and 1 (1220)", v6, mss, idx, wantMSS)
		}

		c, s := fixtureAddrs(e, v6, 7600)
		sock := e.socket(s, false)
		ipUDP := map[bool]int{false: 28, true: 48}[v6]
		fits, tooBig := strings.Repeat("a", 1400-ipUDP), strings.Repeat("b", 1400-ipUDP+1)
		e.bindRules(sock, reply("fits", fits), reply("long", tooBig))
		req := request(c, s, "fits")
		e.expect("reply of the MTU", req.build(t), xdpTx, req.answer([]byte(fits)).build(t), "answered")
		e.expect("reply over the MTU", request(c, s, "long").build(t), xdpPass, nil, "pass_reply_too_big")
	}
	// an IPv4 link's MTU may be below IPv6's minimum of 1280
	if out, err := e.tb.Server.Run("ip", "link", "set", "lo", "mtu", "600"); err != nil {
		t.Fatalf("lower the MTU to 600: %v: %s", err, out)
	}
	c, s := fixtureAddrs(e, false, 7601)
	fits, tooBig := strings.Repeat("c", 600-28), strings.Repeat("d", 600-28+1)
	e.bindRules(e.socket(s, false), reply("fits", fits), reply("long", tooBig))
	req := request(c, s, "fits")
	e.expect("reply of a 600-byte MTU", req.build(t), xdpTx, req.answer([]byte(fits)).build(t), "answered")
	e.expect("reply over a 600-byte MTU", request(c, s, "long").build(t), xdpPass, nil, "pass_reply_too_big")
}

// santaTCPEmitMagic starts the metadata XDP leaves TC to send segments
// (SANTA_TCP_EMIT_MAGIC, bpf/santa.h).
const santaTCPEmitMagic = 0x53545348

// Where that metadata holds from and resend (its layout: emitLayouts).
const emitFromOff, emitResendOff = 28, 34

// fixtureConn is a client connection of BPF_PROG_RUN fixtures: eBPF has
// answered its SYN with serverSeq and stamp.
type fixtureConn struct {
	e              *env
	client, server netip.AddrPort
	serverSeq      uint32 // the SYN-ACK's sequence number
	stamp          uint32 // the SYN-ACK's TSval, echoed by every segment
}

// connect sends a SYN with timestamps, window scaling, SACK and the given
// MSS option (0: none) and returns the connection eBPF answered.
func connect(e *env, client, server netip.AddrPort, mss uint16) *fixtureConn {
	e.t.Helper()
	opts := []layers.TCPOption{{OptionType: layers.TCPOptionKindSACKPermitted, OptionLength: 2}, tsOption(777, 0),
		{OptionType: layers.TCPOptionKindWindowScale, OptionLength: 3, OptionData: []byte{7}}}
	if mss != 0 {
		opts = append([]layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4,
			OptionData: binary.BigEndian.AppendUint16(nil, mss)}}, opts...)
	}
	verdict, out := e.run(tcpFrame(e.t, client, server, &layers.TCP{SYN: true, Seq: 1000, Window: 64240, Options: opts}, ""))
	if verdict != xdpTx {
		e.t.Fatalf("SYN from %v: verdict %d, counters %v", client, verdict, e.counters())
	}
	synack, _ := parseTCP(e.t, out)
	stamp, _ := timestamps(e.t, synack)
	return &fixtureConn{e: e, client: client, server: server, serverSeq: synack.Seq, stamp: stamp}
}

// segment is the client's segment at its first byte after the SYN plus
// off, acking the server's first byte plus acked.
func (c *fixtureConn) segment(off, acked uint32, payload string) []byte {
	return tcpFrame(c.e.t, c.client, c.server, &layers.TCP{ACK: true, PSH: payload != "", Seq: 1001 + off,
		Ack: c.serverSeq + 1 + acked, Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop},
			{OptionType: layers.TCPOptionKindNop}, tsOption(778, c.stamp)}}, payload)
}

// TestTCPReplyOfAGoneRule: a reply in flight is sent again only from the
// rule that made it. Once that rule went (here a new version, as santa
// http's Date makes every second) its slot may hold another rule; a client
// that has none of the reply is answered anew, one that has part of a long
// reply is reset. Repeated acks that make no progress get at most
// SANTA_TCP_RESENDS resends.
func TestTCPReplyOfAGoneRule(t *testing.T) {
	e := newEnv(t, Config{})
	addr := netip.AddrPortFrom(e.tb.Server.IP4, 8081)
	srv := startTCPServer(t, e.tb, addr)
	// passed to TC, with what TC is to send before the frame
	emitted := func(name string, frame []byte, counter string) {
		t.Helper()
		before := e.counters()
		verdict, out := e.run(frame)
		if after := e.counters(); verdict != xdpPass || after[counter] != before[counter]+1 ||
			binary.LittleEndian.Uint32(out) != santaTCPEmitMagic {
			t.Errorf("%s: verdict %d, counters %v, frame %x", name, verdict, after, out)
		}
	}
	short, long := httpGet("/short", ""), httpGet("/long", "")
	cookie := e.known(srv.sock())
	ids := e.bindRules(cookie, exactRule(short, httpReply("old short", ""), false), exactRule(long, httpReply(strings.Repeat("o", 3000), ""), false))
	oldSlots := map[uint32]bool{e.d.byID[ids[0]].slot: true, e.d.byID[ids[1]].slot: true}

	shortConn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	if verdict, out := e.run(shortConn.segment(0, 0, short)); verdict != xdpTx {
		t.Fatalf("short request: verdict %d", verdict)
	} else if _, payload := parseTCP(t, out); payload != httpReply("old short", "") {
		t.Fatalf("short reply %q", payload)
	}
	longConn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40002), addr, 1460)
	emitted("long request", longConn.segment(0, 0, long), "tcp_long_reply")

	// a segment lost for good (a hop with a smaller MTU): repeated acks
	// make SANTA_TCP_RESENDS resends, then none until the ack moves
	limitConn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40003), addr, 1460)
	emitted("long request", limitConn.segment(0, 0, long), "tcp_long_reply")
	ack := func(acked uint32) []byte { return limitConn.segment(uint32(len(long)), acked, "") }
	e.expect("first segment acked", ack(1448), xdpDrop, nil, "tcp_ack_consumed")
	for i := 0; i < 8; i++ {
		emitted(fmt.Sprintf("repeated ack %d", i+1), ack(1448), "tcp_resend")
	}
	e.expect("repeated ack 9", ack(1448), xdpDrop, nil, "tcp_resend_limit")
	e.expect("second segment acked", ack(2*1448), xdpDrop, nil, "tcp_ack_consumed")
	emitted("repeated ack after progress", ack(2*1448), "tcp_resend")

	// new versions, then (a quarantine later) other rules in the old slots
	newShort := httpReply("new short", "")
	if err := e.d.ModifyRules(cookie, []RuleUpdate{{ID: ids[0], Rule: exactRule(short, newShort, false)},
		{ID: ids[1], Rule: exactRule(long, httpReply(strings.Repeat("n", 3000), ""), false)}}); err != nil {
		t.Fatal(err)
	}
	// the old versions are unlinked a grace period after the modify (a
	// timer, late on a busy machine), their slots then quarantined: wait
	// until both are over (at most 5 s), so AddRules can reuse the slots
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		e.d.mu.Lock()
		ready := len(e.d.retiring) == 0 && !slices.ContainsFunc(e.d.slots.cooling.cohorts,
			func(c cohort[uint32]) bool { return time.Since(c.last) < quarantine })
		e.d.mu.Unlock()
		if ready {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the old versions' slots are not free 5 s after the modify")
		}
	}
	_, err := e.d.AddRules(cookie, []Rule{exactRule(httpGet("/x", ""), httpReply("other x", ""), false),
		exactRule(httpGet("/y", ""), httpReply(strings.Repeat("y", 3000), ""), false)})
	if err != nil {
		t.Fatal(err)
	}
	held := map[uint32]bool{}
	for _, r := range e.d.byID {
		held[r.slot] = true
	}
	for slot := range oldSlots {
		if !held[slot] {
			t.Fatalf("no rule took slot %d of an old version: the test proves nothing", slot)
		}
	}

	// none of the short reply arrived: the request comes again
	e.expect("short request again", shortConn.segment(0, 0, short), xdpDrop, nil, "tcp_drop_rule_gone")
	if verdict, out := e.run(shortConn.segment(0, 0, short)); verdict != xdpTx {
		t.Fatalf("short request a third time: verdict %d, counters %v", verdict, e.counters())
	} else if _, payload := parseTCP(t, out); payload != newShort {
		t.Fatalf("short request a third time: %q, want the new version's %q", payload, newShort)
	}

	// the first segment of the long reply arrived, the rest did not
	e.expect("long reply's first segment acked", longConn.segment(uint32(len(long)), 1448, ""), xdpDrop, nil, "tcp_ack_consumed")
	before := e.counters()
	verdict, out := e.run(longConn.segment(uint32(len(long)), 1448, ""))
	if after := e.counters(); verdict != xdpTx || after["tcp_reset_rule_gone"] != before["tcp_reset_rule_gone"]+1 {
		t.Fatalf("repeated ack: verdict %d, counters %v", verdict, after)
	}
	if rst, _ := parseTCP(t, out); !rst.RST || rst.Seq != longConn.serverSeq+1+1448 {
		t.Fatalf("repeated ack: %+v, want a RST at the client's ack", rst)
	}
	if n := flowCount(t, e.d); n != 2 { // the short connection's new answer, limitConn's
		t.Fatalf("%d flows, want 2 (the reset one's gone)", n)
	}
}

// TestTCPStampOfAnotherOwner: a stamp proves a connection only to a
// listener of the owner (sk_uid) whose listener answered its SYN. Root's
// listener answered a connection and closed; uid nobody listens on the port
// since, with a rule for the same request and its samples on: the
// connection's requests were answered by nobody's rule or sampled for it
// (XDP), or handed over to nobody's listener (TC). Now XDP refuses them
// (tcp_pass_bad_stamp) and TC leaves them to the kernel, which resets the
// connection; nobody's own connections carry stamps of owner nobody.
func TestTCPStampOfAnotherOwner(t *testing.T) {
	request, other := httpGet("/", ""), httpGet("/other", "")
	nobodyReply := httpReply("nobody's", "")
	e := newEnv(t, Config{})
	addr := netip.AddrPortFrom(e.tb.Server.IP4, 8081)
	root := startTCPServer(t, e.tb, addr)
	e.bindRules(e.known(root.sock()), exactRule(request, httpReply("root's", ""), false))
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	sampled := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40002), addr, 1460)
	if !stampValid(t, e.d, conn.client, addr, conn.stamp, nowUnit(t), 0) {
		t.Fatalf("root's SYN-ACK's TSval %#x is no stamp of owner 0", conn.stamp)
	}
	if err := e.d.Unbind(root.cookie); err != nil {
		t.Fatal(err)
	}
	root.ln.Close()
	srv := startTCPServerOf(t, e.tb, addr, nobody)
	if err := e.d.Bind(srv.sock(), SampleOptions{Bytes: 64, PerSecond: 1000}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.d.AddRules(srv.cookie, []Rule{exactRule(request, nobodyReply, false)}); err != nil {
		t.Fatal(err)
	}

	e.expect("root's connection: request of nobody's rule", conn.segment(0, 0, request), xdpPass, nil, "tcp_pass_bad_stamp")
	before := e.counters()
	e.expect("root's connection: request of no rule", sampled.segment(0, 0, other), xdpPass, nil, "tcp_pass_bad_stamp")
	if after := e.counters(); after["miss_sampled"] != before["miss_sampled"] {
		t.Error("root's connection's request was sampled for nobody's rule set")
	}
	before = e.counters()
	var verdict uint32
	if err := e.tb.Server.Do(func() (err error) {
		verdict, err = e.d.objs.SantaHandover.Run(&ebpf.RunOptions{Data: conn.segment(0, 0, other), Repeat: 1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	after := e.counters()
	if moved := after["tcp_handed_over"] + after["tcp_handover_failed"] - before["tcp_handed_over"] - before["tcp_handover_failed"]; verdict != 0 || moved != 0 {
		t.Errorf("TC: root's connection to nobody's listener: verdict %d, %d handovers tried; want it left to the kernel", verdict, moved)
	}

	own := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40003), addr, 1460)
	if !stampValid(t, e.d, own.client, addr, own.stamp, nowUnit(t), nobody) {
		t.Fatalf("nobody's SYN-ACK's TSval %#x is no stamp of owner nobody", own.stamp)
	}
	if verdict, out := e.run(own.segment(0, 0, request)); verdict != xdpTx {
		t.Fatalf("nobody's connection: verdict %d, counters %v", verdict, e.counters())
	} else if _, payload := parseTCP(t, out); payload != nobodyReply {
		t.Fatalf("nobody's connection: reply %q, want %q", payload, nobodyReply)
	}
}

// TestTCPSynMSS: the kernel takes no MSS below 536 (IPv4) or 1220 (IPv6)
// at a handover, so such SYNs are the kernel's from the start; a SYN
// without the option gets its family's default (RFC 9293) in the stamp.
func TestTCPSynMSS(t *testing.T) {
	e := newEnv(t, Config{})
	for _, tc := range []struct {
		family  string
		mss     uint16
		pass    bool
		stamped uint16 // the MSS the stamp carries
	}{
		{"IPv4", 535, true, 0}, {"IPv4", 536, false, 536}, {"IPv4", 0, false, 536},
		{"IPv6", 1219, true, 0}, {"IPv6", 536, true, 0}, {"IPv6", 1220, false, 1220}, {"IPv6", 0, false, 1220},
	} {
		server, client := e.tb.Server.IP4, e.tb.Client.IP4
		if tc.family == "IPv6" {
			server, client = e.tb.Server.IP6, e.tb.Client.IP6
		}
		addr := netip.AddrPortFrom(server, 8082)
		srv := startTCPServer(t, e.tb, addr)
		e.bindRules(e.known(srv.sock()))
		name := fmt.Sprintf("%s SYN with MSS %d", tc.family, tc.mss)
		var opts []layers.TCPOption
		if tc.mss != 0 {
			opts = append(opts, layers.TCPOption{OptionType: layers.TCPOptionKindMSS, OptionLength: 4,
				OptionData: binary.BigEndian.AppendUint16(nil, tc.mss)})
		}
		syn := tcpFrame(t, netip.AddrPortFrom(client, 40010), addr, &layers.TCP{SYN: true, Seq: 1, Window: 64240,
			Options: append(opts, tsOption(777, 0))}, "")
		if tc.pass {
			e.expect(name, syn, xdpPass, nil, "tcp_pass_syn_other")
		} else if verdict, out := e.run(syn); verdict != xdpTx {
			t.Errorf("%s: verdict %d, want an answer", name, verdict)
		} else if stamp, _ := timestamps(t, mustTCP(t, out)); stampMSS(stamp) != tc.stamped {
			t.Errorf("%s: the stamp carries MSS %d, want %d", name, stampMSS(stamp), tc.stamped)
		}
		if err := e.d.Unbind(srv.cookie); err != nil {
			t.Fatal(err)
		}
		srv.ln.Close()
	}
}

func mustTCP(t *testing.T, frame []byte) *layers.TCP {
	tcp, _ := parseTCP(t, frame)
	return tcp
}

// stampMSS is the MSS a stamp's option bits carry (bpf/tcp.h stamp_mss).
func stampMSS(stamp uint32) uint16 { return [...]uint16{536, 1220, 1440, 1460}[stamp>>23&3] }

// TestTCPResetSequence: only a RST at the client's next byte resets a
// socket-less connection (RFC 5961 3.2), and a SYN does not (4.2). One at another sequence number
// (blind, stale or spoofed) must leave the flow of a reply in flight: else
// the client's retransmitted request, acking part of that reply, would be
// taken for a new one and the reply sent again from byte 0 at the client's
// ack, into the middle of the byte stream.
func TestTCPResetSequence(t *testing.T) {
	long, reply := httpGet("/long", ""), httpReply(strings.Repeat("o", 3000), "")
	e, addr := tcpEnv(t, long, reply)
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	reqLen := uint32(len(long))
	if verdict, _ := e.run(conn.segment(0, 0, long)); verdict != xdpPass {
		t.Fatalf("long request: verdict %d", verdict)
	}
	e.expect("first segment acked", conn.segment(reqLen, 1448, ""), xdpDrop, nil, "tcp_ack_consumed")

	rst := func(off uint32) []byte {
		return tcpFrame(t, conn.client, conn.server, &layers.TCP{RST: true, Seq: 1001 + off, Window: 0}, "")
	}
	for _, off := range []uint32{0, reqLen + 1000, reqLen - 1, reqLen + 2} {
		e.expect(fmt.Sprintf("RST at client byte %d", off), rst(off), xdpDrop, nil, "tcp_drop_rst_seq")
	}
	// the request again, acking the reply's first segment: the rest of it
	resumed := func(name string) {
		t.Helper()
		if n := flowCount(t, e.d); n != 1 {
			t.Fatalf("%s: %d flows, want the flow of the reply in flight", name, n)
		}
		before := e.counters()
		verdict, out := e.run(conn.segment(0, 1448, long))
		if after := e.counters(); verdict != xdpPass || after["tcp_request_repeated"] != before["tcp_request_repeated"]+1 {
			t.Fatalf("%s: request again: verdict %d, counters %v", name, verdict, after)
		}
		if from := binary.LittleEndian.Uint16(out[emitFromOff:]); from != 1448 {
			t.Fatalf("%s: TC is to send the reply from byte %d, want 1448 (what the client acks)", name, from)
		}
	}
	resumed("RSTs at other sequence numbers")

	// so must a SYN on the 4-tuple (a duplicate of the first, or blind)
	e.expect("SYN on the flow", tcpFrame(t, conn.client, conn.server, &layers.TCP{SYN: true, Seq: 1000, Window: 64240,
		Options: []layers.TCPOption{tsOption(777, 0)}}, ""), xdpTx, nil, "tcp_syn_challenged")
	resumed("SYN on the flow")

	e.expect("RST at the client's next byte", rst(reqLen), xdpDrop, nil, "tcp_rst_consumed")
	if n := flowCount(t, e.d); n != 0 {
		t.Fatalf("%d flows after the RST at the client's next byte, want 0", n)
	}
	e.expect("RST without a flow", rst(reqLen+5), xdpDrop, nil, "tcp_rst_consumed")
}

// TestTCPAfterMissingBytes: a FIN or a request is answered only at the
// client's next byte. One after bytes eBPF has not taken (a request it
// dropped as pipelined, or one lost on the way) must not be acked, nor
// handed over: the ACK would ack those bytes too, and the client would never
// send them again (and take the reply to the next request for theirs).
func TestTCPAfterMissingBytes(t *testing.T) {
	request, reply := httpGet("/", ""), httpReply("hi", "")
	e, addr := tcpEnv(t, request, reply)
	reqLen, replyLen := uint32(len(request)), uint32(len(reply))
	fin := func(c *fixtureConn, off, acked uint32) []byte {
		return tcpFrame(t, c.client, c.server, &layers.TCP{ACK: true, FIN: true, Seq: 1001 + off,
			Ack: c.serverSeq + 1 + acked, Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindNop}, tsOption(778, c.stamp)}}, "")
	}
	answer := func(name string, c *fixtureConn, payload string) {
		t.Helper()
		if verdict, _ := e.run(c.segment(0, 0, payload)); verdict != xdpTx {
			t.Fatalf("%s: verdict %d, counters %v", name, verdict, e.counters())
		}
	}

	// the second request, sent before the first reply arrived, is dropped
	pipelined := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	answer("first request", pipelined, request)
	e.expect("pipelined request", pipelined.segment(reqLen, 0, request), xdpDrop, nil, "tcp_drop_pipelined")
	e.expect("FIN after the pipelined request", fin(pipelined, 2*reqLen, replyLen), xdpDrop, nil, "tcp_drop_gap")

	// the second request is lost on the way
	lost := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40002), addr, 1460)
	answer("first request", lost, request)
	e.expect("FIN after a lost request", fin(lost, 2*reqLen, replyLen), xdpDrop, nil, "tcp_drop_gap")
	before := e.counters()
	verdict, out := e.run(fin(lost, reqLen, replyLen))
	if after := e.counters(); verdict != xdpTx || after["tcp_fin_answered"] != before["tcp_fin_answered"]+1 {
		t.Fatalf("FIN at the client's next byte: verdict %d, counters %v", verdict, after)
	}
	if r, _ := parseTCP(t, out); !r.FIN || r.Ack != 1001+reqLen+1 {
		t.Fatalf("FIN at the client's next byte: %+v, want a FIN-ACK acking the FIN", r)
	}

	// the second request is lost, the third arrives after the first reply
	// was acked: neither answered nor handed over
	gap := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40003), addr, 1460)
	answer("first request", gap, request)
	e.expect("first reply acked", gap.segment(reqLen, replyLen, ""), xdpDrop, nil, "tcp_ack_consumed")
	e.expect("request after a lost one", gap.segment(2*reqLen, replyLen, request), xdpDrop, nil, "tcp_drop_gap")
	e.expect("other request after a lost one", gap.segment(2*reqLen, replyLen, httpGet("/x", "")), xdpDrop, nil, "tcp_drop_gap")
	finWithData := tcpFrame(t, gap.client, gap.server, &layers.TCP{ACK: true, FIN: true, Seq: 1001 + 2*reqLen,
		Ack: gap.serverSeq + 1 + replyLen, Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop},
			{OptionType: layers.TCPOptionKindNop}, tsOption(778, gap.stamp)}}, request)
	e.expect("request and FIN after a lost one", finWithData, xdpDrop, nil, "tcp_drop_gap")
	before = e.counters()
	verdict, out = e.run(gap.segment(reqLen, replyLen, request))
	if after := e.counters(); verdict != xdpTx || after["answered"] != before["answered"]+1 {
		t.Fatalf("the lost request again: verdict %d, counters %v", verdict, after)
	}
	if r, _ := parseTCP(t, out); r.Ack != 1001+2*reqLen {
		t.Fatalf("the lost request again: ack %d, want %d", r.Ack, 1001+2*reqLen)
	}
}

// TestTCPFinWithDataOverAReply: a FIN with data that is not just the
// request answered (a client's retransmission that took in a new request
// and its FIN) goes to the kernel only at the client's next byte and with
// eBPF's reply all acked: the kernel's socket, made from that segment,
// would give the application the answered request again and answer it at
// the client's ack, in the middle of eBPF's reply, or not know eBPF's
// bytes in flight. The answered request's reply (or its ACK) comes first;
// the client then sends the rest alone.
func TestTCPFinWithDataOverAReply(t *testing.T) {
	long, reply := httpGet("/long", ""), httpReply(strings.Repeat("o", 3000), "")
	e, addr := tcpEnv(t, long, reply)
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	reqLen, next := uint32(len(long)), httpGet("/next", "")
	finWithData := func(off, acked uint32, payload string) []byte {
		return tcpFrame(t, conn.client, conn.server, &layers.TCP{ACK: true, FIN: true, PSH: true, Seq: 1001 + off,
			Ack: conn.serverSeq + 1 + acked, Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindNop}, tsOption(778, conn.stamp)}}, payload)
	}
	if verdict, _ := e.run(conn.segment(0, 0, long)); verdict != xdpPass {
		t.Fatalf("long request: verdict %d", verdict)
	}
	e.expect("first segment acked", conn.segment(reqLen, 1448, ""), xdpDrop, nil, "tcp_ack_consumed")

	e.expect("new request and FIN during the reply", finWithData(reqLen, 1448, next), xdpDrop, nil, "tcp_drop_pipelined")
	before := e.counters()
	verdict, out := e.run(finWithData(0, 1448, long+next))
	if after := e.counters(); verdict != xdpPass || after["tcp_request_repeated"] != before["tcp_request_repeated"]+1 {
		t.Fatalf("both requests and FIN during the reply: verdict %d, counters %v", verdict, after)
	}
	if from := binary.LittleEndian.Uint16(out[emitFromOff:]); binary.LittleEndian.Uint32(out) != santaTCPEmitMagic || from != 1448 {
		t.Fatalf("both requests and FIN during the reply: TC is to send the reply from byte %d, want 1448", from)
	}

	replyLen := uint32(len(reply))
	e.expect("reply acked", conn.segment(reqLen, replyLen, ""), xdpTx, nil, "tcp_request_acked")
	before = e.counters()
	verdict, out = e.run(finWithData(0, replyLen, long+next))
	if after := e.counters(); verdict != xdpTx || after["tcp_request_repeated"] != before["tcp_request_repeated"]+1 {
		t.Fatalf("both requests and FIN after the reply: verdict %d, counters %v", verdict, after)
	}
	if r, payload := parseTCP(t, out); r.Ack != 1001+reqLen || r.FIN || payload != "" {
		t.Fatalf("both requests and FIN after the reply: %+v, want an ACK of the answered request", r)
	}
	e.expect("new request and FIN alone", finWithData(reqLen, replyLen, next), xdpPass, nil, "tcp_handover_flags")
}

// TestTCPWhileCarrying: from the swap until santad has carried the
// predecessor's flows over (Load marks them as being carried when there is
// a predecessor's table, PublishFlows ends it), a segment of a socket-less
// connection is dropped, not answered from a flow table that may lack its
// flow or hold an old state of it (a retransmitted request would be answered
// anew, at the client's ack); a SYN needs no flow and is answered. (CI's
// soak of restarts under loss: a few replies in 50 000 were other bytes.)
func TestTCPWhileCarrying(t *testing.T) {
	request, reply := httpGet("/x", ""), httpReply("x", "")
	e, addr := tcpEnv(t, request, reply)
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40002), addr, 1460)
	if err := e.d.objs.SantaTcpCarrying.Put(uint32(0), uint32(1)); err != nil {
		t.Fatal(err)
	}
	reqLen := uint32(len(request))
	e.expect("request while carrying", conn.segment(0, 0, request), xdpDrop, nil, "tcp_drop_carrying")
	e.expect("ACK while carrying", conn.segment(reqLen, 0, ""), xdpDrop, nil, "tcp_drop_carrying")
	e.expect("RST while carrying", tcpFrame(t, conn.client, conn.server, &layers.TCP{RST: true, Seq: 1001}, ""), xdpDrop, nil, "tcp_drop_carrying")
	e.expect("SYN while carrying", tcpFrame(t, conn.client, conn.server, &layers.TCP{SYN: true, Seq: 5000, Window: 64240,
		Options: []layers.TCPOption{tsOption(777, 0)}}, ""), xdpTx, nil, "tcp_syn_answered")
	if err := e.d.objs.SantaTcpCarrying.Put(uint32(0), uint32(0)); err != nil {
		t.Fatal(err)
	}
	e.expect("request once carried", conn.segment(0, 0, request), xdpTx, nil, "answered")
}

// TestTCPFinDuringAReply: a client that closes right after its request
// (nc -N, shutdown(SHUT_WR)) sends its FIN before eBPF's reply arrives. A
// FIN-ACK then would sit at the client's ack, inside eBPF's reply: taken
// in order (the reply lost, or overtaken by the FIN-ACK), it ends the
// client's stream before the reply, whose bytes the client then discards
// (a long reply's, already queued out of order, too), and it acks the
// request, which the client then never sends again. The FIN is dropped
// until the client has all of the reply; the client sends it again. Such a
// FIN has a counter of its own, tcp_drop_fin_in_reply (it was counted as a
// pipelined request, tcp_drop_pipelined).
func TestTCPFinDuringAReply(t *testing.T) {
	request, reply := httpGet("/", ""), httpReply("hi", "")
	long, longReply := httpGet("/long", ""), httpReply(strings.Repeat("o", 3000), "")
	e := newEnv(t, Config{})
	addr := netip.AddrPortFrom(e.tb.Server.IP4, 8081)
	srv := startTCPServer(t, e.tb, addr)
	e.bindRules(e.known(srv.sock()), exactRule(request, reply, false), exactRule(long, longReply, false))
	fin := func(c *fixtureConn, off, acked uint32) []byte {
		return tcpFrame(t, c.client, c.server, &layers.TCP{ACK: true, FIN: true, Seq: 1001 + off,
			Ack: c.serverSeq + 1 + acked, Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindNop}, tsOption(778, c.stamp)}}, "")
	}
	for i, tc := range []struct {
		name, request string
		replyLen      uint32
		verdict       uint32
	}{
		{"one-segment reply", request, uint32(len(reply)), xdpTx},
		{"long reply", long, uint32(len(longReply)), xdpPass},
	} {
		conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, uint16(40001+i)), addr, 1460)
		flows := flowCount(t, e.d)
		reqLen := uint32(len(tc.request))
		if verdict, _ := e.run(conn.segment(0, 0, tc.request)); verdict != tc.verdict {
			t.Fatalf("%s: request: verdict %d, counters %v", tc.name, verdict, e.counters())
		}
		e.expect(tc.name+": FIN before the reply", fin(conn, reqLen, 0), xdpDrop, nil, "tcp_drop_fin_in_reply")
		if tc.replyLen > 1448 {
			e.expect(tc.name+": FIN with part of it", fin(conn, reqLen, 1448), xdpDrop, nil, "tcp_drop_fin_in_reply")
		}
		if n := flowCount(t, e.d); n != flows+1 {
			t.Fatalf("%s: %d flows, want the reply's in flight", tc.name, n)
		}
		before := e.counters()
		verdict, out := e.run(fin(conn, reqLen, tc.replyLen))
		if after := e.counters(); verdict != xdpTx || after["tcp_fin_answered"] != before["tcp_fin_answered"]+1 {
			t.Fatalf("%s: FIN again, with the reply: verdict %d, counters %v", tc.name, verdict, after)
		}
		if r, _ := parseTCP(t, out); !r.FIN || r.Seq != conn.serverSeq+1+tc.replyLen || r.Ack != 1001+reqLen+1 {
			t.Fatalf("%s: FIN again: %+v, want a FIN-ACK after the reply", tc.name, r)
		}
	}
}

// TestTCPChallengeKeepsOptions: the challenge ACK a SYN on a flow's
// 4-tuple gets carries a stamp of the connection's options, not the
// SYN's. The client takes that stamp for its next echo (the ACK sits at its
// next byte, and a stamp of options with higher bits passes its PAWS
// check), so a blind SYN without window scaling would have the connection
// handed over, and long replies sized, without it.
func TestTCPChallengeKeepsOptions(t *testing.T) {
	request, reply := httpGet("/", ""), httpReply("hi", "")
	e, addr := tcpEnv(t, request, reply)
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	if verdict, _ := e.run(conn.segment(0, 0, request)); verdict != xdpTx {
		t.Fatalf("request: verdict %d, counters %v", verdict, e.counters())
	}
	// MSS 1460, no window scale, no SACK
	before := e.counters()
	verdict, out := e.run(tcpFrame(t, conn.client, conn.server, &layers.TCP{SYN: true, Seq: 99999, Window: 64240,
		Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindMSS, OptionLength: 4, OptionData: []byte{0x05, 0xb4}},
			tsOption(1, 0)}}, ""))
	if after := e.counters(); verdict != xdpTx || after["tcp_syn_challenged"] != before["tcp_syn_challenged"]+1 {
		t.Fatalf("SYN on the flow: verdict %d, counters %v", verdict, after)
	}
	challenge := mustTCP(t, out)
	stamp, _ := timestamps(t, challenge)
	if stamp>>18&127 != conn.stamp>>18&127 || !stampValid(t, e.d, conn.client, conn.server, stamp, nowUnit(t), 0) {
		t.Fatalf("challenge ACK's stamp %#x: options %#b, want the connection's %#b in a valid stamp",
			stamp, stamp>>18&127, conn.stamp>>18&127)
	}
}

// TestTCPHandoverWithAReplyInFlight: once a connection's rule set went, XDP
// passes its segments before it looks at flows, and the TC hook hands the
// connection over. Not while a reply of eBPF's is in flight: the kernel's
// socket, made at the client's ack, would send its own bytes where the
// client holds (or, for a long reply, may hold out of order) eBPF's, and
// know nothing of the rest. A client that may have part of the reply is
// reset (the hook leaves the segment to the listener, which resets it); one
// that has none of a one-segment reply has its request handed over when it
// sends it again.
func TestTCPHandoverWithAReplyInFlight(t *testing.T) {
	request, reply := httpGet("/", ""), httpReply("hi", "")
	long, longReply := httpGet("/long", ""), httpReply(strings.Repeat("o", 3000), "")
	e := newEnv(t, Config{})
	addr := netip.AddrPortFrom(e.tb.Server.IP4, 8081)
	srv := startTCPServer(t, e.tb, addr)
	e.bindRules(e.known(srv.sock()), exactRule(request, reply, false), exactRule(long, longReply, false))
	short := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	if verdict, _ := e.run(short.segment(0, 0, request)); verdict != xdpTx {
		t.Fatalf("request: verdict %d", verdict)
	}
	partial := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40002), addr, 1460)
	if verdict, _ := e.run(partial.segment(0, 0, long)); verdict != xdpPass {
		t.Fatalf("long request: verdict %d", verdict)
	}
	if err := e.d.Unbind(srv.cookie); err != nil {
		t.Fatal(err)
	}
	const tcOK, tcShot = 0, 2
	tc := func(name string, frame []byte, verdict uint32, counters ...string) {
		t.Helper()
		if v, _ := e.run(frame); v != xdpPass {
			t.Fatalf("%s: XDP verdict %d, want it passed (the rule set went)", name, v)
		}
		before := e.counters()
		var got uint32
		if err := e.tb.Server.Do(func() (err error) {
			got, err = e.d.objs.SantaHandover.Run(&ebpf.RunOptions{Data: frame, Repeat: 1})
			return err
		}); err != nil {
			t.Fatal(err)
		}
		after := e.counters()
		moved := 0
		for _, c := range counters {
			moved += int(after[c] - before[c])
		}
		if got != verdict || moved != 1 {
			t.Errorf("%s: TC verdict %d, want %d; counters %v, want one of %v to move", name, got, verdict, after, counters)
		}
	}
	tc("long reply's request again, part of it acked", partial.segment(0, 1448, long), tcOK, "tcp_reset_rule_gone")
	if n := flowCount(t, e.d); n != 1 {
		t.Fatalf("%d flows after the reset, want the other connection's", n)
	}
	reqLen := uint32(len(request))
	tc("ACK before the one-segment reply", short.segment(reqLen, 0, ""), tcShot, "tcp_drop_rule_gone")
	// (bpf_sk_assign_tcp_reqsk refuses BPF_PROG_RUN's skb here)
	tc("one-segment reply's request again", short.segment(0, 0, request), tcOK, "tcp_handed_over", "tcp_handover_failed")
}

// TestTCPResendOnSACK: the first ack of a long reply that carries SACK
// blocks above it (the client holds later segments: one before them went
// missing) has eBPF resend at once, as a repeated ack does; without it
// the client's retransmission timer brought the rest. A D-SACK (a block
// below the ack: a duplicate arrived) asks for nothing.
func TestTCPResendOnSACK(t *testing.T) {
	long, reply := httpGet("/long", ""), httpReply(strings.Repeat("o", 3000), "")
	e, addr := tcpEnv(t, long, reply)
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	if verdict, _ := e.run(conn.segment(0, 0, long)); verdict != xdpPass {
		t.Fatalf("long request: verdict %d", verdict)
	}
	reqLen, replyLen := uint32(len(long)), uint32(len(reply))
	sack := func(acked, left, right uint32) []byte {
		block := binary.BigEndian.AppendUint32(binary.BigEndian.AppendUint32(nil, conn.serverSeq+1+left), conn.serverSeq+1+right)
		return tcpFrame(t, conn.client, conn.server, &layers.TCP{ACK: true, Seq: 1001 + reqLen, Ack: conn.serverSeq + 1 + acked,
			Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop},
				tsOption(778, conn.stamp), {OptionType: layers.TCPOptionKindNop}, {OptionType: layers.TCPOptionKindNop},
				{OptionType: layers.TCPOptionKindSACK, OptionLength: 10, OptionData: block}}}, "")
	}
	before := e.counters()
	verdict, out := e.run(sack(1448, 2*1448, replyLen))
	if after := e.counters(); verdict != xdpPass || after["tcp_resend"] != before["tcp_resend"]+1 {
		t.Fatalf("first ack with a SACK block above it: verdict %d, counters %v", verdict, after)
	}
	if from := binary.LittleEndian.Uint16(out[emitFromOff:]); binary.LittleEndian.Uint32(out) != santaTCPEmitMagic || from != 1448 || out[emitResendOff] != 1 {
		t.Fatalf("TC is to send from byte %d (resend %d), want a resend from 1448", from, out[emitResendOff])
	}
	e.expect("D-SACK", sack(2*1448, 1448, 2*1448), xdpDrop, nil, "tcp_ack_consumed")
}

// TestTCPOneByteRequestAgain: a 1-byte request sent again (its reply was
// lost) lies where a keepalive probe with a byte does, at the client's next
// byte - 1. It was answered as a probe, with an ACK of the request and no
// reply, which the client then never asked for again. A client probes only
// once it has all of eBPF's reply; before that, the byte is the request.
func TestTCPOneByteRequestAgain(t *testing.T) {
	e, addr := tcpEnv(t, "x", "yy")
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	if verdict, _ := e.run(conn.segment(0, 0, "x")); verdict != xdpTx {
		t.Fatalf("request: verdict %d, counters %v", verdict, e.counters())
	}
	before := e.counters()
	verdict, out := e.run(conn.segment(0, 0, "x"))
	if after := e.counters(); verdict != xdpTx || after["tcp_request_repeated"] != before["tcp_request_repeated"]+1 {
		t.Fatalf("the request again: verdict %d, counters %v", verdict, after)
	}
	if r, payload := parseTCP(t, out); payload != "yy" || r.Ack != 1002 {
		t.Fatalf("the request again: %q, ack %d; want its reply", payload, r.Ack)
	}
	e.expect("probe with a byte, the reply acked", conn.segment(0, 2, "x"), xdpTx, nil, "tcp_keepalive_answered")
	e.expect("probe without", conn.segment(0, 2, ""), xdpTx, nil, "tcp_keepalive_answered")
}

// TestTCPAckOfUnsentBytes: a segment that acks bytes eBPF never sent is
// dropped and answered with an ACK of where eBPF stands (seq = the end of
// its last reply, ack = the end of the last request answered), as the
// kernel does (RFC 5961 5.2). Before, a request there was answered at that
// sequence number, a FIN answered there, a pure ACK consumed.
func TestTCPAckOfUnsentBytes(t *testing.T) {
	request, reply := httpGet("/", ""), httpReply("hi", "")
	e, addr := tcpEnv(t, request, reply)
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	if verdict, _ := e.run(conn.segment(0, 0, request)); verdict != xdpTx {
		t.Fatalf("request: verdict %d", verdict)
	}
	reqLen, replyLen := uint32(len(request)), uint32(len(reply))
	beyond := replyLen + 1000
	fin := tcpFrame(t, conn.client, conn.server, &layers.TCP{ACK: true, FIN: true, Seq: 1001 + reqLen,
		Ack: conn.serverSeq + 1 + beyond, Window: 502, Options: []layers.TCPOption{{OptionType: layers.TCPOptionKindNop},
			{OptionType: layers.TCPOptionKindNop}, tsOption(778, conn.stamp)}}, "")
	for _, tc := range []struct {
		name  string
		frame []byte
	}{
		{"pure ACK", conn.segment(reqLen, beyond, "")},
		{"request", conn.segment(reqLen, beyond, request)},
		{"FIN", fin},
	} {
		before := e.counters()
		verdict, out := e.run(tc.frame)
		after := e.counters()
		if verdict != xdpTx || after["tcp_ack_unsent_challenged"] != before["tcp_ack_unsent_challenged"]+1 ||
			after["answered"] != before["answered"] || after["tcp_fin_answered"] != before["tcp_fin_answered"] {
			t.Errorf("%s acking unsent bytes: verdict %d, counters %v; want a challenge ACK", tc.name, verdict, after)
			continue
		}
		ack, payload := parseTCP(t, out)
		if !ack.ACK || ack.FIN || ack.RST || ack.PSH || payload != "" || ack.Seq != conn.serverSeq+1+replyLen || ack.Ack != 1001+reqLen {
			t.Errorf("%s acking unsent bytes: %+v %q, want an ACK at the reply's end acking the request", tc.name, ack, payload)
		}
	}
	e.expect("ACK of the reply", conn.segment(reqLen, replyLen, ""), xdpDrop, nil, "tcp_ack_consumed")
}
