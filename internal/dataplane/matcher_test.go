package dataplane

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"testing"

	"golang.org/x/sys/unix"
)

func put(off int, b string) Processor {
	return Processor{Kind: Put, ReplyOffset: off, Template: []byte(b)}
}
func copyP(dst, src, n int) Processor {
	return Processor{Kind: Copy, ReplyOffset: dst, SrcOffset: src, Length: n}
}
func cond(off int, b string) Condition { return Condition{Offset: off, Pattern: []byte(b)} }

// reply is a rule answering pattern at offset 0 with text.
func reply(pattern, text string) Rule {
	return Rule{Conditions: []Condition{cond(0, pattern)}, Processors: []Processor{put(0, text)}, ReplyLen: len(text)}
}

// fixtureAddrs are the client and server ends of the fixtures.
func fixtureAddrs(e *env, v6 bool, port uint16) (client, server netip.AddrPort) {
	if v6 {
		return netip.AddrPortFrom(e.tb.Client.IP6, 40000), netip.AddrPortFrom(e.tb.Server.IP6, port)
	}
	return netip.AddrPortFrom(e.tb.Client.IP4, 40000), netip.AddrPortFrom(e.tb.Server.IP4, port)
}

// request and answer build a request and the exact reply frame expected for it.
func request(c, s netip.AddrPort, payload string) udpPacket {
	return udpPacket{src: c, dst: s, payload: []byte(payload)}
}

func (p udpPacket) answer(payload []byte) udpPacket {
	return udpPacket{src: p.dst, dst: p.src, tagged: p.tagged, vlan: p.vlan, payload: payload, reply: true}
}

func TestPaperExampleOverFamiliesAndTags(t *testing.T) {
	e := newEnv(t, Config{})
	for _, v6 := range []bool{false, true} {
		c, s := fixtureAddrs(e, v6, 7000)
		e.bindRules(e.socket(s, false), reply("Hello", "COMSYS"))
		// untagged, and with a priority tag (VLAN 0: the kernel delivers it
		// as untagged; the reply keeps the tag)
		for _, tagged := range []bool{false, true} {
			name := fmt.Sprintf("v6=%v tagged=%v", v6, tagged)
			req := request(c, s, "Hello")
			req.tagged = tagged
			e.expect(name+" match", req.build(t), xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
			miss := request(c, s, "Hellx")
			miss.tagged = tagged
			e.expect(name+" miss", miss.build(t), xdpPass, nil, "pass_no_match")
			// a longer request still matches: conditions look at their bytes only
			long := request(c, s, "Hello, world")
			long.tagged = tagged
			e.expect(name+" longer", long.build(t), xdpTx, long.answer([]byte("COMSYS")).build(t), "answered")
		}
		// a VLAN's frame is the kernel's: its device for that VLAN, if any,
		// may have other sockets or sit in another namespace
		for _, vlan := range []uint16{1, 42, 4095} {
			req := request(c, s, "Hello")
			req.tagged, req.vlan = true, vlan
			e.expect(fmt.Sprintf("v6=%v vlan=%d", v6, vlan), req.build(t), xdpPass, nil, "pass_vlan")
		}
	}
}

func TestProcessors(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7001)
	big := bytes.Repeat([]byte("0123456789abcdef"), 80)[:1200]
	rules := []Rule{
		// a DNS-like reply: copy the 2-byte id, put the rest
		{Conditions: []Condition{cond(2, "QUERY-A")}, ReplyLen: 10,
			Processors: []Processor{put(2, "ANSWER-A"), copyP(0, 0, 2)}},
		// copies to odd offsets, overlapping: later processors win
		{Conditions: []Condition{cond(0, "ODD")}, ReplyLen: 11,
			Processors: []Processor{put(0, "xxxxxxxxxxx"), copyP(1, 3, 5), put(3, "P"), copyP(9, 0, 1)}},
		// gaps no processor writes are zero
		{Conditions: []Condition{cond(0, "GAP")}, ReplyLen: 8, Processors: []Processor{put(6, "zz")}},
		// a reply much larger than the request: the frame grows
		{Conditions: []Condition{cond(0, "BIG")}, ReplyLen: len(big), Processors: []Processor{{Kind: Put, Template: big}}},
		// a reply smaller than the request: the frame shrinks
		{Conditions: []Condition{cond(0, "SMALL")}, ReplyLen: 1, Processors: []Processor{put(0, "s")}},
	}
	e.bindRules(e.socket(s, false), rules...)
	cases := []struct{ req, want string }{
		{"\xab\xcdQUERY-A", "\xab\xcdANSWER-A"},
		{"ODD12345", "x12P45xxxOx"},
		{"GAP", "\x00\x00\x00\x00\x00\x00zz"},
		{"BIG", string(big)},
		{"SMALL" + string(bytes.Repeat([]byte{'.'}, 400)), "s"},
	}
	for _, tc := range cases {
		req := request(c, s, tc.req)
		e.expect(tc.req[:3], req.build(t), xdpTx, req.answer([]byte(tc.want)).build(t), "answered")
	}
}

func TestConditions(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, true, 7002)
	deep := bytes.Repeat([]byte("deep-pattern-"), 20)[:255]
	payload := make([]byte, 1300)
	copy(payload[1000:], deep)
	copy(payload, "MULTI")
	payload[600] = 'X'
	rules := []Rule{
		{Conditions: []Condition{{Offset: 1000, Pattern: deep}}, Processors: []Processor{put(0, "deep")}, ReplyLen: 4},
		{Conditions: []Condition{cond(0, "MULTI"), cond(600, "X"), {Offset: 1000, Pattern: deep[:10]}},
			Processors: []Processor{put(0, "multi")}, ReplyLen: 5, Priority: 0},
	}
	rules[0].Priority = 1 // both match the payload; the lower priority wins
	e.bindRules(e.socket(s, false), rules...)
	req := request(c, s, string(payload))
	e.expect("all conditions", req.build(t), xdpTx, req.answer([]byte("multi")).build(t), "answered")
	payload[600] = 'Y' // one condition of the multi rule fails: only the deep rule is left
	req = request(c, s, string(payload))
	e.expect("deep only", req.build(t), xdpTx, req.answer([]byte("deep")).build(t), "answered")
	payload[1254] ^= 1 // last byte of the 255-byte pattern
	e.expect("deep last byte", request(c, s, string(payload)).build(t), xdpPass, nil, "pass_no_match")
	e.expect("too short", request(c, s, string(payload[:1100])).build(t), xdpPass, nil, "pass_no_match")
}

// The paper's Figure 3: COM and COMSYS share a region at offset 0, SYS at 3
// has its own; hash candidates are checked by region and full compare.
func TestSharedRegionsCOMSYS(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7003)
	com, comsys, sys := reply("COM", "1"), reply("COMSYS", "2"), Rule{Conditions: []Condition{cond(3, "SYS")},
		Processors: []Processor{put(0, "3")}, ReplyLen: 1}
	comsys.Priority, com.Priority, sys.Priority = 0, 1, 2
	e.bindRules(e.socket(s, false), com, comsys, sys)
	for _, tc := range []struct{ req, want string }{
		{"COMSYS", "2"}, // all three match: lowest priority
		{"COMSYT", "1"},
		{"COM", "1"},
		{"XXXSYS", "3"},
		{"SYSSYS", "3"}, // SYS at offset 0 is not the SYS rule's region
		{"COXSYS", "3"},
	} {
		req := request(c, s, tc.req)
		e.expect(tc.req, req.build(t), xdpTx, req.answer([]byte(tc.want)).build(t), "answered")
	}
	for _, miss := range []string{"SYS", "CO", "XOMSYS"[:5]} {
		e.expect(miss, request(c, s, miss).build(t), xdpPass, nil, "pass_no_match")
	}
}

// TestRegionHashSpreads hashes families of near-identical keys, as rule sets
// have them, and wants about as few equal hashes and as short bucket chains
// as random 32-bit values would give: counters, padded counters, and DNS
// questions cut at region lengths on both sides of word boundaries.
func TestRegionHashSpreads(t *testing.T) {
	const n = 100_000
	families := map[string]func(i int) string{
		"r%05d":  func(i int) string { return fmt.Sprintf("r%05d", i) },
		"%016d":  func(i int) string { return fmt.Sprintf("%016d", i) },
		"%-24d.": func(i int) string { return fmt.Sprintf("%-24d.", i) },
	}
	for _, cut := range []int{7, 8, 9, 16, 31, 64} {
		families[fmt.Sprintf("DNS query, first %d bytes", cut)] = func(i int) string {
			q := scaleQuery(scaleName(i), 1)
			return string(q[:min(cut, len(q))])
		}
	}
	const bits = 18 // n rules in a part of 2^18 buckets, as bucketRangeFor gives them
	for name, key := range families {
		hashes := map[uint32]bool{}
		chains := make([]int, 1<<bits)
		distinct := map[string]bool{}
		longest := 0
		for i := range n {
			k := key(i)
			if distinct[k] {
				continue
			}
			distinct[k] = true
			h := regionHash([]byte(k))
			hashes[h] = true
			b := bucketOf(0x5eed, bucketRange{0, 1<<bits - 1}, 1, region{0, len(k)}, h)
			chains[b]++
			longest = max(longest, chains[b])
		}
		// random values: about n²/2³³ ≈ 1.2 equal pairs, longest chain about 7
		if equal := len(distinct) - len(hashes); equal > 8 || longest > 12 {
			t.Errorf("%s: %d keys, %d equal hashes, longest chain %d", name, len(distinct), equal, longest)
		}
	}
}

// hashCollision finds two different 7-letter strings with equal region
// hashes among random ones (counters collide less than random strings do).
func hashCollision(t *testing.T) (string, string) {
	rng := rand.New(rand.NewPCG(7, 7))
	seen := map[uint32]string{}
	for range 1 << 21 {
		b := make([]byte, 7)
		for j := range b {
			b[j] = byte('a' + rng.IntN(26))
		}
		h := regionHash(b)
		if o, ok := seen[h]; ok && o != string(b) {
			return o, string(b)
		}
		seen[h] = string(b)
	}
	t.Fatal("no region hash collision found")
	return "", ""
}

func TestRealHashCollisions(t *testing.T) {
	a, b := hashCollision(t)
	if regionHash([]byte(a)) != regionHash([]byte(b)) || a == b {
		t.Fatalf("%q and %q do not collide", a, b)
	}
	for _, pair := range fzCollisions { // the fuzz test's, which must collide with any suffix
		if a, b := pair[0]+"suffix", pair[1]+"suffix"; regionHash([]byte(a)) != regionHash([]byte(b)) {
			t.Fatalf("%q and %q do not collide", a, b)
		}
	}
	// 8 hash bits: the truncated hash collides all the time too
	e := newEnv(t, Config{HashBits: 8})
	c, s := fixtureAddrs(e, false, 7004)
	rules := []Rule{reply(a, "A"), reply(b, "B")}
	for i := 0; i < 300; i++ {
		rules = append(rules, reply(fmt.Sprintf("r%05d", i), fmt.Sprintf("%d", i)))
	}
	e.bindRules(e.socket(s, false), rules...)
	for _, tc := range []struct{ req, want string }{{a, "A"}, {b, "B"}, {"r00007", "7"}, {"r00299", "299"}} {
		req := request(c, s, tc.req)
		e.expect(tc.req, req.build(t), xdpTx, req.answer([]byte(tc.want)).build(t), "answered")
	}
	e.expect("miss", request(c, s, "r00300").build(t), xdpPass, nil, "pass_no_match")
}

func TestPassedUntouched(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7005)
	c6, s6 := fixtureAddrs(e, true, 7005)
	e.bindRules(e.socket(s, false), reply("Hello", "COMSYS"))
	e.bindRules(e.socket(s6, false), reply("Hello", "COMSYS"))
	mk := func(f func(*udpPacket), v6 bool) []byte {
		p := request(c, s, "Hello")
		if v6 {
			p = request(c6, s6, "Hello")
		}
		f(&p)
		return p.build(t)
	}
	full := mk(func(*udpPacket) {}, false)
	cases := []struct {
		name    string
		frame   []byte
		counter string
	}{
		{"ipv4 options", mk(func(p *udpPacket) { p.ipv4Opts = true }, false), "pass_ip_options"},
		{"fragment", mk(func(p *udpPacket) { p.moreFrags = true }, false), "pass_fragment"},
		{"ipv6 extension header", mk(func(p *udpPacket) { p.hopByHop = true }, true), "pass_ipv6_ext"},
		{"udp length too long", mk(func(p *udpPacket) { p.udpLenFix = 1 }, false), "pass_malformed"},
		{"udp length too short", mk(func(p *udpPacket) { p.udpLenFix = -1 }, false), "pass_malformed"},
		{"truncated in udp header", full[:14+20+4], "pass_malformed"},
		{"truncated payload", full[:len(full)-2], "pass_malformed"},
		{"ethernet header only", full[:14], "pass_malformed"},
		{"bad checksum", mk(func(p *udpPacket) { p.badSum = true }, false), "pass_bad_checksum"},
		{"bad checksum v6", mk(func(p *udpPacket) { p.badSum = true }, true), "pass_bad_checksum"},
		{"multicast mac", mk(func(p *udpPacket) { p.srcMAC, p.dstMAC = clientMAC, []byte{1, 0, 0x5e, 0, 0, 1} }, false), "pass_not_unicast"},
		{"no rule set on the port", mk(func(p *udpPacket) { p.dst = netip.AddrPortFrom(s.Addr(), 7999) }, false), "pass_port_unbound"},
	}
	for _, tc := range cases {
		e.expect(tc.name, tc.frame, xdpPass, nil, tc.counter)
	}
	// Ethernet padding after the IP packet is not payload: still answered, without the padding
	req := request(c, s, "Hello")
	padded := append(req.build(t), 0, 0, 0, 0, 0, 0, 0, 0)
	e.expect("ethernet padding", padded, xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
	// a local sender's partial checksum is recognised
	req.partialSum = true
	e.expect("partial checksum", req.build(t), xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
}

// A rule of socket A never answers for socket B: another port, another
// address, another network namespace.
func TestBindingIsolation(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7006)
	owner := e.socket(s, false)
	e.bindRules(owner, reply("Hello", "COMSYS"))
	other := netip.AddrPortFrom(s.Addr(), 7007)
	e.socket(other, false)
	e.expect("other port", request(c, other, "Hello").build(t), xdpPass, nil, "pass_port_unbound")
	// another address on the same port: no socket, then one without rules
	c6, s6 := fixtureAddrs(e, true, 7006)
	e.expect("other address, no socket", request(c6, s6, "Hello").build(t), xdpPass, nil, "pass_no_socket")
	e.socket(s6, false)
	e.expect("other address", request(c6, s6, "Hello").build(t), xdpPass, nil, "pass_no_ruleset")
	// the same packet in the client namespace, where a socket holds the same address and port
	if out, err := e.tb.Client.Run("ip", "addr", "add", s.Addr().String()+"/32", "dev", "lo"); err != nil {
		t.Fatal(out, err)
	}
	var ret uint32
	frame := request(c, s, "Hello").build(t)
	err := e.tb.Client.Do(func() error {
		fd, _, err := bindUDP(s)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		ret, _, err = e.d.Program().Test(frame)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if ret != xdpPass {
		t.Errorf("other namespace: verdict %d, want pass", ret)
	}
	// and the owner still gets its answers
	req := request(c, s, "Hello")
	e.expect("owner", req.build(t), xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
}
