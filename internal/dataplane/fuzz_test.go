package dataplane

// FuzzRuleProcessor throws random rule sets and random packets at the loaded
// rule processor through BPF_PROG_RUN and checks every verdict against an
// oracle written here, independently of the data plane's own matcher code:
//
//   - a packet is answered (XDP_TX) only if it is well formed, meant for a
//     socket that has rules (the socket the kernel would deliver it to), has
//     a valid, partial or (IPv4) absent UDP checksum, and some rule of that
//     socket holds; the reply must then be exactly the winning rule's reply
//     (lowest priority, then insertion order), byte for byte, headers and
//     checksums included (the expected frame is rebuilt with gopacket);
//   - every other packet is passed (XDP_PASS) with the frame unchanged;
//     conversely such a request that some rule holds for must be answered
//     (one exception, accepted either way: the subnet's network address as
//     the source);
//   - rules the API documents as invalid are refused with ErrInvalidRule,
//     valid ones are accepted;
//   - per-rule hit and byte counters agree with the answers sent.
//
// The data plane and a testbed (server namespace with real bound UDP
// sockets) are set up once per fuzzing process; rules are reset with
// ReplaceRules between inputs. With SANTA_FUZZ_STATS=<file>, every fuzzing
// process appends what its inputs exercised (answers, pass reasons) to file.
//
// Run: go test -run '^$' -fuzz '^FuzzRuleProcessor$' -fuzztime 60s ./internal/dataplane/

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

// requireRoot fails (never skips) a test that needs root.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("%s needs root (BPF, XDP, network namespaces): run it as root, e.g. via `make test`", t.Name())
	}
}

// Ports of the fuzz fixture's sockets in the server namespace.
const (
	fzPortA = 7100 // A: [::]:7100, dual stack, has rules
	fzPortB = 7101 // B: [::]:7101, dual stack, has rules
	fzPortC = 7102 // [::]:7102, a socket without a rule set
	fzPortD = 7103 // no socket at all
	fzPortE = 7104 // E: <server IPv4>:7104 and F: [::]:7104, both SO_REUSEADDR, both have rules
)

// The rule sets of the fixture: owners of fuzzed rules.
const (
	fzSetA = iota
	fzSetB
	fzSetE
	fzSetF
	fzSets
)

var fzSetNames = [fzSets]string{"A", "B", "E", "F"}

// fzFixture is the per-process data plane and testbed of the fuzz target.
type fzFixture struct {
	once sync.Once
	err  error

	tb        *testbed.Testbed
	d         *Dataplane
	fds       []int
	cookies   [fzSets]uint64
	used      [fzSets]bool // the rule set may hold rules from an earlier input
	ip4       netip.Addr   // server addresses
	ip6       netip.Addr
	cip4      netip.Addr // client addresses
	cip6      netip.Addr
	ll6       netip.Addr // the server's IPv6 link-local address
	stopWatch func()
	kinds     []fzAddrKind
	stats     fzStats
}

// fzAddrKind is a route of the server namespace's local table, as the
// kernel sees it (`ip route show table local`): local, broadcast, ...
type fzAddrKind struct {
	kind   string
	prefix netip.Prefix
}

// addrKind is what the kernel's local table says of a: "local", "broadcast",
// "anycast", "multicast", or "" for an address of no local route.
func (fx *fzFixture) addrKind(a netip.Addr) string {
	best, kind := -1, ""
	for _, k := range fx.kinds {
		if k.prefix.Contains(a) && k.prefix.Bits() > best {
			best, kind = k.prefix.Bits(), k.kind
		}
	}
	return kind
}

func (fx *fzFixture) readLocalTable() error {
	for _, fam := range []string{"-4", "-6"} {
		out, err := fx.tb.Server.Run("ip", fam, "route", "show", "table", "local")
		if err != nil {
			return fmt.Errorf("ip route show table local: %v: %s", err, out)
		}
		for _, line := range strings.Split(out, "\n") {
			f := strings.Fields(line)
			if len(f) < 2 {
				continue
			}
			pfx, err := netip.ParsePrefix(f[1])
			if err != nil {
				a, err := netip.ParseAddr(f[1])
				if err != nil {
					continue
				}
				pfx = netip.PrefixFrom(a, a.BitLen())
			}
			fx.kinds = append(fx.kinds, fzAddrKind{f[0], pfx})
			if a := pfx.Addr(); f[0] == "local" && a.Is6() && a.IsLinkLocalUnicast() && pfx.IsSingleIP() {
				fx.ll6 = a
			}
		}
	}
	if !fx.ll6.IsValid() {
		return fmt.Errorf("server has no IPv6 link-local address: %v", fx.kinds)
	}
	return nil
}

// fzStats counts what the inputs exercised; with SANTA_FUZZ_STATS=<file> set,
// each fuzzing process appends its counts to that file when it ends.
type fzStats struct {
	inputs, refused, installed, packets, answered, passed, tolerated, slow int
	why                                                                    map[string]int
	slowest                                                                time.Duration
}

func (s *fzStats) write() {
	path := os.Getenv("SANTA_FUZZ_STATS")
	if path == "" || s.inputs == 0 {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "pid %d: inputs %d refused %d installed %d packets %d answered %d passed %d tolerated %d slow(>50ms) %d slowest %v\n",
		os.Getpid(), s.inputs, s.refused, s.installed, s.packets, s.answered, s.passed, s.tolerated, s.slow, s.slowest)
	for k, v := range s.why {
		fmt.Fprintf(f, "  pass %-45q %d\n", k, v)
	}
}

// fzConfig is small on hash bits (so truncated hashes collide all the time)
// and large on slots and rule sets: ReplaceRules between inputs parks freed
// slots and rule set ids in their one-second quarantine.
var fzConfig = Config{HashBits: 8, MaxRules: 1 << 18, MaxRulesets: 1 << 16, DataMiB: 64}

func (fx *fzFixture) get(t *testing.T) *fzFixture {
	t.Helper()
	fx.once.Do(func() { fx.err = fx.setup() })
	if fx.err != nil {
		t.Fatalf("fuzz fixture: %v", fx.err)
	}
	return fx
}

func (fx *fzFixture) setup() error {
	tb, err := testbed.Create(testbed.Options{})
	if err != nil {
		return err
	}
	fx.tb = tb
	fx.ip4, fx.ip6 = tb.Server.IP4, tb.Server.IP6
	fx.cip4, fx.cip6 = tb.Client.IP4, tb.Client.IP6
	d, err := Load(fzConfig)
	if err != nil {
		return err
	}
	fx.d = d
	// BPF_PROG_RUN delivers on the namespace's loopback (ifindex 1): tell the
	// data plane the namespace's addresses for it, as Attach does for an interface
	err = tb.Server.Do(func() error {
		stop, err := d.WatchLocalAddresses(1)
		fx.stopWatch = stop
		return err
	})
	if err != nil {
		return err
	}
	if err := fx.readLocalTable(); err != nil {
		return err
	}
	any6 := netip.IPv6Unspecified()
	socks := []struct {
		addr      netip.AddrPort
		reuseaddr bool
		set       int // -1: no rule set
	}{
		{netip.AddrPortFrom(any6, fzPortA), false, fzSetA},
		{netip.AddrPortFrom(any6, fzPortB), false, fzSetB},
		{netip.AddrPortFrom(any6, fzPortC), false, -1},
		{netip.AddrPortFrom(fx.ip4, fzPortE), true, fzSetE},
		{netip.AddrPortFrom(any6, fzPortE), true, fzSetF},
	}
	for _, s := range socks {
		var fd int
		var cookie uint64
		err := tb.Server.Do(func() error {
			var err error
			var opts []int
			if s.reuseaddr {
				opts = append(opts, unix.SO_REUSEADDR)
			}
			fd, cookie, err = bindUDP(s.addr, opts...)
			return err
		})
		if err != nil {
			return fmt.Errorf("bind %v: %w", s.addr, err)
		}
		fx.fds = append(fx.fds, fd)
		if s.set < 0 {
			continue
		}
		fx.cookies[s.set] = cookie
		sample := SampleOptions{}
		if s.set == fzSetA { // exercise the miss-sample path too (nobody reads the ring)
			sample = SampleOptions{Bytes: 64, PerSecond: 1 << 30}
		}
		if err := d.Bind(udpSock(cookie, s.addr), sample); err != nil {
			return err
		}
	}
	return nil
}

func (fx *fzFixture) close() {
	fx.stats.write()
	for _, fd := range fx.fds {
		unix.Close(fd)
	}
	if fx.stopWatch != nil {
		fx.stopWatch()
	}
	if fx.d != nil {
		fx.d.Close()
	}
	if fx.tb != nil {
		fx.tb.Close()
	}
}

// run passes frame through the rule processor in the server namespace.
func (fx *fzFixture) run(frame []byte) (uint32, []byte, error) {
	var ret uint32
	var out []byte
	err := fx.tb.Server.Do(func() error {
		opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+2048), Repeat: 1}
		var err error
		ret, err = fx.d.Program().Run(&opts)
		out = opts.DataOut
		return err
	})
	return ret, out, err
}

// ---------------------------------------------------------------------------
// Decoding the fuzz input.

// fzReader hands out the input's bytes; past the end it returns zeros, so
// short inputs decode to the common case (choice 0 everywhere).
//
// An input is read by two readers: the main one front to back, and one back
// to front for the choices added later (masks, request length bounds). So an
// input that ext answers "no" to (as the stored corpus mostly is) still
// decodes to the rules and packets it was found with.
type fzReader struct {
	b []byte
	i int
}

func (r *fzReader) byte() byte {
	if r.i >= len(r.b) {
		return 0
	}
	r.i++
	return r.b[r.i-1]
}

// intn is in [0, n).
func (r *fzReader) intn(n int) int {
	if n <= 1 {
		return 0
	}
	v := int(r.byte())
	if n > 256 {
		v = v<<8 | int(r.byte())
	}
	return v % n
}

// chance is true with about pct percent probability (false on exhausted input).
func (r *fzReader) chance(pct int) bool {
	v := r.byte()
	return v != 0 && int(v)*100 < pct*256
}

// fzAlphabet makes random patterns and payloads collide often.
const fzAlphabet = "abcd"

// fzCollisions are pairs of 16-byte strings that leave the region hash in
// the same 64-bit state (so any common suffix keeps them colliding): their
// first words differ, and the second word of the second string cancels the
// difference the first words made.
var fzCollisions = func() [][2]string {
	var out [][2]string
	word := func(s string) uint64 { return binary.LittleEndian.Uint64([]byte(s)) }
	for _, w := range [][3]string{{"abcdabcd", "dcbadcba", "aabbccdd"}, {"bbbbbbbb", "bbbbbbbc", "cadbcadb"}, {"ddddabcd", "ccccaaaa", "abababab"}} {
		ha, hb := regionHashStep(regionHashBasis, word(w[0])), regionHashStep(regionHashBasis, word(w[1]))
		second := binary.LittleEndian.AppendUint64(nil, ha^hb^word(w[2]))
		out = append(out, [2]string{w[0] + w[2], w[1] + string(second)})
	}
	return out
}()

func (r *fzReader) alpha(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		v := r.byte()
		if v >= 0xf8 { // now and then a byte outside the alphabet
			b[i] = r.byte()
		} else {
			b[i] = fzAlphabet[int(v)%len(fzAlphabet)]
		}
	}
	return b
}

// fzRule is a generated rule and what happens to it.
type fzRule struct {
	set       int  // owner rule set
	rule      Rule // as given to the data plane
	valid     bool // by the API's documented rules (fzValid)
	late      bool // added with AddRules after the initial ReplaceRules
	installed bool // accepted by the data plane
	del       bool // deleted again before the packets
	id        RuleID
	order     int // insertion order within its rule set
}

// fzCase is a decoded input.
type fzCase struct {
	rules   []*fzRule
	packets []fzPacket
	broken  *fzRule // an invalid rule to offer (with shadow) after installing rules, or nil
	shadow  Rule
}

// fzPacket describes a request frame before and after mutation.
type fzPacket struct {
	frame []byte
	desc  string
}

func (fx *fzFixture) decode(data []byte) *fzCase {
	r := &fzReader{b: data}
	ext := &fzReader{b: slices.Clone(data)}
	slices.Reverse(ext.b)
	c := &fzCase{}
	nrules := 1 + r.intn(6)
	for i := 0; i < nrules; i++ {
		c.rules = append(c.rules, fzGenRule(r, ext, c.rules))
	}
	for _, fr := range c.rules {
		fr.valid = fzValid(&fr.rule)
	}
	if r.chance(8) {
		// now and then a broken copy of a rule, offered after the others in
		// one AddRules with a valid rule: both must be refused
		orig := c.rules[r.intn(nrules)]
		b := orig.rule
		b.Conditions = append([]Condition(nil), b.Conditions...)
		b.Processors = append([]Processor(nil), b.Processors...)
		fzBreak(r, ext, &b)
		c.broken = &fzRule{set: orig.set, rule: b, valid: fzValid(&b)}
		// the valid companion: the original with a reply of its own, so that
		// packets tell if it was installed after all
		c.shadow = orig.rule
		c.shadow.Priority = 0
		c.shadow.Processors = []Processor{{Kind: Put, Template: bytes.Repeat([]byte{'Z'}, orig.rule.ReplyLen)}}
	}
	npk := 1 + r.intn(3)
	for i := 0; i < npk; i++ {
		c.packets = append(c.packets, fx.genPacket(r, ext, c.rules))
	}
	return c
}

func fzGenRule(r, ext *fzReader, prev []*fzRule) *fzRule {
	fr := &fzRule{}
	switch v := r.intn(16); {
	case v < 9:
		fr.set = fzSetA
	case v < 12:
		fr.set = fzSetB
	case v < 14:
		fr.set = fzSetE
	default:
		fr.set = fzSetF
	}
	fr.late = r.chance(25)
	fr.del = r.chance(10)
	ru := &fr.rule
	ru.Priority = uint32(r.intn(4))
	if r.chance(50) {
		ru.Priority = 0
	}

	ncond := 1
	for ncond < MaxConds && r.chance(35) {
		ncond++
	}
	var pool []Condition // conditions of earlier rules, to share regions and prefixes
	for _, p := range prev {
		pool = append(pool, p.rule.Conditions...)
	}
	for k := 0; k < ncond; k++ {
		var cd Condition
		switch r.intn(10) {
		case 0, 1, 2, 3: // fresh short pattern at a small offset
			cd = Condition{Offset: fzOffset(r), Pattern: r.alpha(1 + r.intn(8))}
		case 4, 5: // a prefix of an earlier pattern, extended: shared regions, COM/COMSYS
			if len(pool) == 0 {
				cd = Condition{Offset: 0, Pattern: r.alpha(1 + r.intn(6))}
				break
			}
			o := pool[r.intn(len(pool))]
			n := min(1+r.intn(len(o.Pattern)), len(o.Pattern))
			cd = Condition{Offset: o.Offset, Pattern: append(append([]byte(nil), o.Pattern[:n]...), r.alpha(r.intn(6))...)}
		case 6: // exactly an earlier condition: duplicate rules
			if len(pool) == 0 {
				cd = Condition{Offset: fzOffset(r), Pattern: r.alpha(3)}
				break
			}
			o := pool[r.intn(len(pool))]
			cd = Condition{Offset: o.Offset, Pattern: append([]byte(nil), o.Pattern...), Mask: o.Mask}
		case 7: // one half of an FNV-1a collision, maybe with a suffix
			pair := fzCollisions[r.intn(len(fzCollisions))]
			cd = Condition{Offset: fzOffset(r) % 4, Pattern: append([]byte(pair[r.intn(2)]), r.alpha(r.intn(4))...)}
			// mostly the partner of an earlier half, with its suffix and offset:
			// same region, same 32-bit hash, different bytes
			for _, o := range pool {
				for _, pr := range fzCollisions {
					for h := 0; h < 2; h++ {
						if bytes.HasPrefix(o.Pattern, []byte(pr[h])) && r.intn(4) != 0 {
							cd = Condition{Offset: o.Offset, Pattern: append([]byte(pr[1-h]), o.Pattern[len(pr[h]):]...)}
						}
					}
				}
			}
		case 8: // longer than a region can be (64)
			cd = Condition{Offset: fzOffset(r), Pattern: r.alpha(56 + r.intn(24))}
		case 9: // bytes from the input, long or short
			cd = Condition{Offset: fzOffset(r), Pattern: r.alpha(1 + r.intn(12))}
			if r.chance(10) {
				cd.Pattern = r.alpha(200 + r.intn(100))
			}
		}
		if ext.chance(20) { // compare only some bits, mostly with a full first byte
			cd.Mask = fzMask(ext, len(cd.Pattern))
			if ext.chance(75) {
				cd.Mask[0] = 0xff
			}
			for j := range cd.Pattern {
				cd.Pattern[j] &= cd.Mask[j]
			}
		}
		ru.Conditions = append(ru.Conditions, cd)
		pool = append(pool, cd)
	}

	ru.ReplyLen = 1 + r.intn(40)
	if r.chance(30) {
		ru.ReplyLen = 1 + r.intn(300)
	}
	nproc := 1
	for nproc < 6 && r.chance(40) {
		nproc++
	}
	rl := max(ru.ReplyLen, 1)
	for k := 0; k < nproc; k++ {
		var p Processor
		if r.intn(3) < 2 {
			off := r.intn(rl)
			n := 1 + r.intn(rl-off)
			if r.chance(50) {
				n = min(n, 1+r.intn(16))
			}
			p = Processor{Kind: Put, ReplyOffset: off, Template: r.alpha(n)}
		} else {
			dst := r.intn(rl)
			n := 1 + r.intn(min(rl-dst, 24))
			src := r.intn(24)
			if r.chance(10) {
				src = 100 + r.intn(300)
			}
			p = Processor{Kind: Copy, ReplyOffset: dst, SrcOffset: src, Length: n}
			if n <= MaxCopyMask && ext.chance(25) {
				p.Mask = fzMask(ext, n)
			}
		}
		ru.Processors = append(ru.Processors, p)
	}
	// request length bounds near what the rule reads (now and then invalid)
	if ext.chance(15) {
		ru.MinLen = max(0, fzNeed(ru)+ext.intn(12)-4)
	}
	if ext.chance(15) {
		ru.MaxLen = fzNeed(ru) + ext.intn(12)
	}
	return fr
}

// fzMask is n mask bytes: all ones, zero or any bits.
func fzMask(ext *fzReader, n int) []byte {
	m := make([]byte, n)
	for i := range m {
		switch ext.intn(4) {
		case 0, 1:
			m[i] = 0xff
		case 2:
			m[i] = 0
		default:
			m[i] = ext.byte()
		}
	}
	return m
}

// fzNeed is how many request bytes the rule's conditions and copies read.
func fzNeed(r *Rule) int {
	need := 0
	for _, c := range r.Conditions {
		need = max(need, c.Offset+len(c.Pattern))
	}
	for _, p := range r.Processors {
		if p.Kind == Copy {
			need = max(need, p.SrcOffset+p.Length)
		}
	}
	return need
}

// fzBreak makes a rule invalid in one of the ways the API documents.
func fzBreak(r, ext *fzReader, ru *Rule) {
	c := &ru.Conditions[r.intn(len(ru.Conditions))]
	p := &ru.Processors[r.intn(len(ru.Processors))]
	switch r.intn(18) {
	case 0:
		c.Pattern = nil
	case 1:
		c.Pattern = bytes.Repeat([]byte("a"), MaxPattern+1)
	case 2:
		c.Offset = ReqWindow - len(c.Pattern) + 1
	case 3:
		c.Offset = -1
	case 4:
		for len(ru.Conditions) <= MaxConds {
			ru.Conditions = append(ru.Conditions, Condition{Offset: 0, Pattern: []byte("a")})
		}
	case 5:
		ru.Conditions = nil
	case 6:
		ru.ReplyLen = 0
	case 7:
		ru.ReplyLen = MaxTCPReply + 1
	case 8:
		ru.Processors = nil
	case 9:
		*p = Processor{Kind: Put, ReplyOffset: ru.ReplyLen - 1, Template: []byte("xy")}
	case 10:
		*p = Processor{Kind: Put, ReplyOffset: 0}
	case 11:
		*p = Processor{Kind: Copy, ReplyOffset: 0, SrcOffset: 0, Length: 0}
	case 12:
		*p = Processor{Kind: Copy, ReplyOffset: ru.ReplyLen - 1, SrcOffset: 0, Length: 2}
	case 13:
		*p = Processor{Kind: Copy, ReplyOffset: 0, SrcOffset: ReqWindow, Length: 1}
	case 14:
		p.Kind = ProcessorKind(3 + r.intn(3))
	case 15: // nine separate copy segments
		ru.ReplyLen = max(ru.ReplyLen, 18)
		for k := 0; k < 9; k++ {
			ru.Processors = append(ru.Processors, Processor{Kind: Copy, ReplyOffset: 2 * k, SrcOffset: 2 * k, Length: 1})
		}
	case 16:
		*p = Processor{Kind: Put, ReplyOffset: -1, Template: []byte("x")}
	case 17:
		ru.ReplyLen = -1
	}
	if ext.chance(25) {
		fzBreakMasks(ext, ru)
	}
}

// fzBreakMasks makes a rule invalid in one of the ways the API documents
// for masks and request length bounds.
func fzBreakMasks(ext *fzReader, ru *Rule) {
	need := fzNeed(ru)
	switch ext.intn(10) {
	case 0, 1, 2:
		if len(ru.Conditions) == 0 {
			return
		}
		c := &ru.Conditions[ext.intn(len(ru.Conditions))]
		if len(c.Pattern) == 0 {
			return
		}
		c.Pattern = bytes.Clone(c.Pattern)
		switch ext.intn(3) {
		case 0: // a mask longer than the pattern
			c.Mask = bytes.Repeat([]byte{0xff}, len(c.Pattern)+1)
		case 1: // a pattern bit outside the mask
			c.Mask = bytes.Repeat([]byte{0xff}, len(c.Pattern))
			c.Mask[len(c.Mask)-1] = 0x7f
			c.Pattern[len(c.Pattern)-1] |= 0x80
		default: // no condition compares its first byte in full
			for i := range ru.Conditions {
				c := &ru.Conditions[i]
				if len(c.Pattern) == 0 {
					continue
				}
				c.Pattern = bytes.Clone(c.Pattern)
				c.Pattern[0] &= 0x7f
				c.Mask = append([]byte{0x7f}, bytes.Repeat([]byte{0xff}, len(c.Pattern)-1)...)
			}
		}
	case 3:
		ru.ReplyLen = max(ru.ReplyLen, MaxCopyMask+1)
		ru.Processors = append(ru.Processors, Processor{Kind: Copy, Length: MaxCopyMask + 1,
			Mask: bytes.Repeat([]byte{0x0f}, MaxCopyMask+1)})
	case 4:
		ru.ReplyLen = max(ru.ReplyLen, 2)
		ru.Processors = append(ru.Processors, Processor{Kind: Copy, Length: 2, Mask: []byte{0x0f}})
	case 5:
		ru.Processors = append(ru.Processors, Processor{Kind: Put, Template: []byte("x"), Mask: []byte{0xff}})
	case 6: // a masked copy mixing its bits into a copied byte
		ru.Processors = append(ru.Processors, Processor{Kind: Copy, Length: 1},
			Processor{Kind: Copy, SrcOffset: 1, Length: 1, Mask: []byte{0x0f}})
	case 7:
		ru.MaxLen = need - 1
	case 8:
		ru.MaxLen, ru.MinLen = need+2, need+3
	case 9:
		ru.MaxLen = ReqWindow + 1
	}
}

func fzOffset(r *fzReader) int {
	switch v := r.intn(16); {
	case v < 6:
		return 0
	case v < 14:
		return v - 5 // 1..8
	case v == 14:
		return 12 + r.intn(20)
	default:
		return 100 + r.intn(400)
	}
}

// fzValid says whether the API documentation (rule.go, limits.go) allows the rule.
func fzValid(r *Rule) bool {
	if len(r.Conditions) < 1 || len(r.Conditions) > 4 {
		return false
	}
	anchorable := false
	for _, c := range r.Conditions {
		if len(c.Pattern) < 1 || len(c.Pattern) > 1024 || c.Offset < 0 || c.Offset+len(c.Pattern) > 1472 {
			return false
		}
		if len(c.Mask) > 0 && len(c.Mask) != len(c.Pattern) {
			return false
		}
		for i := range c.Mask {
			if c.Pattern[i]&^c.Mask[i] != 0 {
				return false
			}
		}
		// the matcher hashes bytes compared in full
		anchorable = anchorable || len(c.Mask) == 0 || c.Mask[0] == 0xff
	}
	if !anchorable {
		return false
	}
	if r.ReplyLen < 1 || r.ReplyLen > 1472 || len(r.Processors) == 0 {
		return false
	}
	// which request byte each reply byte comes from at the end, -1 for
	// none, and which masked copy takes bits of it (-1: a plain copy)
	from := make([]int, r.ReplyLen)
	by := make([]int, r.ReplyLen)
	for i := range from {
		from[i] = -1
	}
	for k, p := range r.Processors {
		switch p.Kind {
		case Put:
			if len(p.Template) == 0 || len(p.Mask) > 0 || p.ReplyOffset < 0 || p.ReplyOffset+len(p.Template) > r.ReplyLen {
				return false
			}
			for i := range p.Template {
				from[p.ReplyOffset+i] = -1
			}
		case Copy:
			if p.Length < 1 || p.ReplyOffset < 0 || p.ReplyOffset+p.Length > r.ReplyLen ||
				p.SrcOffset < 0 || p.SrcOffset+p.Length > 1472 {
				return false
			}
			if len(p.Mask) > 0 && (p.Length > 8 || len(p.Mask) != p.Length) {
				return false
			}
			plain := !slices.ContainsFunc(p.Mask, func(b byte) bool { return b != 0xff }) // all ones: a plain copy
			for i := 0; i < p.Length; i++ {
				d := p.ReplyOffset + i
				switch {
				case plain:
					by[d] = -1
				case p.Mask[i] != 0xff && from[d] >= 0:
					return false // would mix its bits into an earlier copy's byte
				default:
					by[d] = k
				}
				from[d] = p.SrcOffset + i
			}
		default:
			return false
		}
	}
	// at most 8 runs of reply bytes copied from consecutive request bytes
	// (by one masked copy, or by plain copies)
	segs := 0
	for i := range from {
		if from[i] >= 0 && (i == 0 || from[i-1] < 0 || from[i-1]+1 != from[i] || by[i-1] != by[i]) {
			segs++
		}
	}
	if segs > 8 {
		return false
	}
	need := fzNeed(r)
	return r.MinLen >= 0 && r.MinLen <= 1472 && r.MaxLen >= 0 && r.MaxLen <= 1472 &&
		(r.MaxLen == 0 || r.MaxLen >= need && r.MaxLen >= r.MinLen)
}

// fzHolds: the payload's length is within the rule's bounds, every
// condition holds on it (in the bits of its mask), and every byte a copy
// reads lies in it (a rule whose copy would read past the request does not match).
func fzHolds(r *Rule, payload []byte) bool {
	if len(payload) < r.MinLen || r.MaxLen > 0 && len(payload) > r.MaxLen {
		return false
	}
	for _, c := range r.Conditions {
		if c.Offset+len(c.Pattern) > len(payload) {
			return false
		}
		for i, b := range c.Pattern {
			m := byte(0xff)
			if len(c.Mask) > 0 {
				m = c.Mask[i]
			}
			if payload[c.Offset+i]&m != b {
				return false
			}
		}
	}
	for _, p := range r.Processors {
		if p.Kind == Copy && p.SrcOffset+p.Length > len(payload) {
			return false
		}
	}
	return true
}

// fzReply is the rule's reply to payload: processors in order over zeros, a
// masked copy replacing the bits of its mask only.
func fzReply(r *Rule, payload []byte) []byte {
	out := make([]byte, r.ReplyLen)
	for _, p := range r.Processors {
		switch {
		case p.Kind == Put:
			copy(out[p.ReplyOffset:], p.Template)
		case len(p.Mask) > 0:
			for i, m := range p.Mask {
				d := p.ReplyOffset + i
				out[d] = out[d]&^m | payload[p.SrcOffset+i]&m
			}
		default:
			copy(out[p.ReplyOffset:p.ReplyOffset+p.Length], payload[p.SrcOffset:p.SrcOffset+p.Length])
		}
	}
	return out
}

// ---------------------------------------------------------------------------
// Packets.

// Header mutations (fzPacket generation).
const (
	mutNone = iota
	mutTruncate
	mutPad
	mutUDPLen
	mutIPLen
	mutShrinkBoth // shorter IP and UDP lengths, consistent: the rest is Ethernet padding
	mutFragment
	mutIPv4Options
	mutIPv6Ext
	mutProto
	mutVersion
	mutMulticastMAC
	mutFlipHeader
	mutBadIPCsum
	mutCount
)

func (fx *fzFixture) genPacket(r, ext *fzReader, rules []*fzRule) fzPacket {
	// the rule the packet is built to satisfy (or none)
	target := rules[r.intn(len(rules))]
	if r.chance(8) {
		target = nil
	}
	v6 := r.chance(40)
	var vlan uint16
	var prio uint8
	tagged := r.chance(25)
	if tagged {
		if r.chance(50) {
			vlan = uint16(1 + r.intn(4094))
		}
		prio = uint8(r.intn(8))
	}
	// destination port: the target's socket mostly
	set := fzSetA
	if target != nil {
		set = target.set
	}
	port := [fzSets]uint16{fzPortA, fzPortB, fzPortE, fzPortE}[set]
	if set == fzSetF && !v6 && r.chance(70) {
		v6 = true // F gets IPv4 only for addresses E is not bound to
	}
	if set == fzSetE {
		v6 = false
	}
	if r.chance(10) {
		port = []uint16{fzPortA, fzPortB, fzPortC, fzPortD, fzPortE, 53}[r.intn(6)]
	}
	srcPort := uint16(40000 + r.intn(100))
	if r.chance(2) {
		srcPort = uint16(r.intn(65536))
	}
	dst, src := fx.ip4, fx.cip4
	if v6 {
		dst, src = fx.ip6, fx.cip6
	}
	dstKind, srcKind := "local", "client"
	if r.chance(4) {
		dstKind = []string{"other", "bcast", "subnet-bcast", "mcast", "loopback", "unspec", "linklocal", "subnet-zero", "self"}[r.intn(9)]
		dst = fx.oddAddr(dstKind, v6)
	}
	if r.chance(4) {
		srcKind = []string{"other", "bcast", "subnet-bcast", "mcast", "loopback", "unspec", "linklocal", "subnet-zero", "self"}[r.intn(9)]
		src = fx.oddAddr(srcKind, v6)
	}

	// payload: alphabet bytes with the target's conditions written in, maybe
	// a second rule's too, then mutated
	n := r.intn(24)
	if r.chance(10) {
		n = r.intn(600)
	}
	if r.chance(2) {
		n = 1400 + r.intn(150)
	}
	satisfy := func(fr *fzRule) {
		if fr == nil {
			return
		}
		need := max(fzNeed(&fr.rule), fr.rule.MinLen)
		if need > 1600 || need < 0 {
			return
		}
		n = max(n, need)
	}
	satisfy(target)
	var second *fzRule
	if r.chance(30) {
		second = rules[r.intn(len(rules))]
		satisfy(second)
	}
	if target != nil && ext.chance(25) { // at or just past a length bound of the target
		var at []int
		if b := target.rule.MinLen; b > 0 {
			at = append(at, b-1, b)
		}
		if b := target.rule.MaxLen; b > 0 {
			at = append(at, b, b+1)
		}
		if len(at) > 0 {
			n = max(0, at[ext.intn(len(at))])
		}
	}
	payload := r.alpha(n)
	write := func(fr *fzRule) {
		if fr == nil {
			return
		}
		for _, c := range fr.rule.Conditions {
			if c.Offset < 0 || c.Offset+len(c.Pattern) > len(payload) {
				continue
			}
			if len(c.Mask) != len(c.Pattern) {
				copy(payload[c.Offset:], c.Pattern)
				continue
			}
			for i, m := range c.Mask { // the bits outside the mask stay random
				q := &payload[c.Offset+i]
				*q = *q&^m | c.Pattern[i]&m
			}
		}
	}
	if r.chance(50) {
		write(second)
		write(target)
	} else {
		write(target)
		write(second)
	}
	if len(payload) > 0 && r.chance(20) {
		for k := 1 + r.intn(3); k > 0; k-- {
			payload[r.intn(len(payload))] = fzAlphabet[r.intn(len(fzAlphabet))]
		}
	}
	if r.chance(8) {
		payload = payload[:r.intn(len(payload)+1)]
	}

	frame := fzBuildFrame(fzFrameSpec{
		srcMAC: fx.tb.Client.MAC, dstMAC: fx.tb.Server.MAC, tagged: tagged, vlan: vlan, prio: prio,
		src: netip.AddrPortFrom(src, srcPort), dst: netip.AddrPortFrom(dst, port), payload: payload,
	})
	l3 := 14
	if tagged {
		l3 = 18
	}
	l4 := l3 + 20
	if v6 {
		l4 = l3 + 40
	}
	mut := mutNone
	if r.chance(30) {
		mut = 1 + r.intn(mutCount-1)
	}
	arg := r.intn(256)
	frame = fzMutate(frame, mut, arg, l3, l4, v6)
	// the UDP checksum last: valid, partial, absent or wrong
	csum := r.intn(16)
	frame = fzSetChecksum(frame, csum, arg)
	desc := fmt.Sprintf("v6=%v tagged=%v vlan=%d dst=%s(%s):%d src=%s(%s):%d mut=%d csum=%d payload=%q", v6, tagged, vlan, dst, dstKind, port,
		src, srcKind, srcPort, mut, csum, payload)
	return fzPacket{frame: frame, desc: desc}
}

func (fx *fzFixture) oddAddr(kind string, v6 bool) netip.Addr {
	if !v6 {
		a := fx.ip4.As4()
		switch kind {
		case "other":
			a[3] = 77
			return netip.AddrFrom4(a)
		case "bcast":
			return netip.MustParseAddr("255.255.255.255")
		case "subnet-bcast":
			a[3] = 255
			return netip.AddrFrom4(a)
		case "subnet-zero":
			a[3] = 0
			return netip.AddrFrom4(a)
		case "mcast":
			return netip.MustParseAddr("224.0.0.251")
		case "loopback":
			return netip.MustParseAddr("127.0.0.1")
		case "linklocal":
			return netip.MustParseAddr("169.254.1.1")
		case "self":
			return fx.ip4
		default:
			return netip.MustParseAddr("0.0.0.0")
		}
	}
	a := fx.ip6.As16()
	switch kind {
	case "other":
		a[15] = 77
		return netip.AddrFrom16(a)
	case "bcast", "mcast":
		return netip.MustParseAddr("ff02::1")
	case "subnet-bcast":
		return netip.MustParseAddr("ff02::fb")
	case "subnet-zero": // the subnet-router anycast address
		return fx.tb.Server.Prefix6.Masked().Addr()
	case "loopback":
		return netip.IPv6Loopback()
	case "linklocal":
		return fx.ll6
	case "self":
		return fx.ip6
	default:
		return netip.IPv6Unspecified()
	}
}

type fzFrameSpec struct {
	srcMAC, dstMAC net.HardwareAddr
	tagged         bool // an 802.1Q tag of VLAN vlan (0: a priority tag)
	vlan           uint16
	prio           uint8
	src, dst       netip.AddrPort
	payload        []byte
	reply          bool // header fields as the rule processor writes them
}

// fzBuildFrame serializes a UDP frame with gopacket, correct lengths and checksums,
// and without the padding gopacket adds to reach 60 bytes.
func fzBuildFrame(s fzFrameSpec) []byte {
	eth := &layers.Ethernet{SrcMAC: s.srcMAC, DstMAC: s.dstMAC}
	stack := []gopacket.SerializableLayer{eth}
	etherType := layers.EthernetTypeIPv4
	hdr := 14 + 20 + 8
	if s.src.Addr().Is6() {
		etherType = layers.EthernetTypeIPv6
		hdr += 20
	}
	if s.tagged {
		eth.EthernetType = layers.EthernetTypeDot1Q
		stack = append(stack, &layers.Dot1Q{Priority: s.prio, VLANIdentifier: s.vlan, Type: etherType})
		hdr += 4
	} else {
		eth.EthernetType = etherType
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(s.src.Port()), DstPort: layers.UDPPort(s.dst.Port())}
	if s.src.Addr().Is4() {
		ip := &layers.IPv4{Version: 4, IHL: 5, TTL: 64, Protocol: layers.IPProtocolUDP,
			SrcIP: s.src.Addr().AsSlice(), DstIP: s.dst.Addr().AsSlice()}
		if s.reply {
			ip.Flags = layers.IPv4DontFragment
		} else {
			ip.Id, ip.TOS, ip.TTL = 0x4321, 0x28, 57
		}
		stack = append(stack, ip)
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			panic(err)
		}
	} else {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
			SrcIP: s.src.Addr().AsSlice(), DstIP: s.dst.Addr().AsSlice()}
		if !s.reply {
			ip.TrafficClass, ip.FlowLabel, ip.HopLimit = 0x28, 0xabcde, 57
		}
		stack = append(stack, ip)
		if err := udp.SetNetworkLayerForChecksum(ip); err != nil {
			panic(err)
		}
	}
	stack = append(stack, udp, gopacket.Payload(s.payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, stack...); err != nil {
		panic(err)
	}
	return append([]byte(nil), buf.Bytes()[:hdr+len(s.payload)]...)
}

func fzIPv4HeaderCsum(h []byte) uint16 {
	var sum uint32
	for i := 0; i+1 < len(h); i += 2 {
		if i == 10 {
			continue
		}
		sum += uint32(h[i])<<8 | uint32(h[i+1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func fzFixIPv4Csum(frame []byte, l3 int) {
	if len(frame) >= l3+20 && frame[l3]>>4 == 4 {
		ihl := int(frame[l3]&15) * 4
		if ihl >= 20 && len(frame) >= l3+ihl {
			binary.BigEndian.PutUint16(frame[l3+10:], fzIPv4HeaderCsum(frame[l3:l3+ihl]))
		}
	}
}

// fzMutate damages or alters the request's headers. IPv4 header checksums are
// kept right except where the mutation is about them.
func fzMutate(f []byte, mut, arg, l3, l4 int, v6 bool) []byte {
	addLen := func(off, delta int) {
		v := int(binary.BigEndian.Uint16(f[off:])) + delta
		binary.BigEndian.PutUint16(f[off:], uint16(v))
	}
	delta := arg%7 - 3
	if delta == 0 {
		delta = 1
	}
	switch mut {
	case mutTruncate:
		f = f[:max(14, arg*len(f)/256)] // BPF_PROG_RUN refuses frames shorter than Ethernet's header
	case mutPad:
		f = append(f, bytes.Repeat([]byte{byte(arg)}, 1+arg%40)...)
	case mutUDPLen:
		addLen(l4+4, delta)
	case mutIPLen:
		if v6 {
			addLen(l3+4, delta)
		} else {
			addLen(l3+2, delta)
		}
	case mutShrinkBoth:
		k := min(1+arg%8, len(f)-l4-8)
		if v6 {
			addLen(l3+4, -k)
		} else {
			addLen(l3+2, -k)
		}
		addLen(l4+4, -k)
	case mutFragment:
		if v6 {
			f[l3+6] = 44 // fragment header
		} else if arg&1 == 0 {
			f[l3+6] |= 0x20 // MF
		} else {
			binary.BigEndian.PutUint16(f[l3+6:], uint16(1+arg)) // an offset
		}
	case mutIPv4Options:
		if !v6 {
			// insert 4 bytes of options (NOPs, EOL) and fix the lengths
			opt := []byte{1, 1, 1, 0}
			f = append(f[:l4:l4], append(opt, f[l4:]...)...)
			f[l3] = 0x46
			addLen(l3+2, 4)
		}
	case mutIPv6Ext:
		if v6 {
			f[l3+6] = []byte{0, 43, 60, 50, 51, 135}[arg%6]
		}
	case mutProto:
		if v6 {
			f[l3+6] = 6
		} else {
			f[l3+9] = []byte{6, 1, 136}[arg%3]
		}
	case mutVersion:
		f[l3] = f[l3]&0x0f | byte(arg%16)<<4
		if arg%16 == 4 || arg%16 == 6 {
			f[l3] ^= 0x10
		}
	case mutMulticastMAC:
		f[0] |= 1
	case mutFlipHeader:
		// one byte anywhere in the headers; the IPv4 header checksum stays stale
		i := arg % l4
		if i < len(f) {
			f[i] ^= byte(1 << (arg % 8))
		}
		return f
	case mutBadIPCsum:
		if !v6 {
			f[l3+10] ^= byte(1 + arg%255)
			return f
		}
	}
	fzFixIPv4Csum(f, l3)
	return f
}

// fzSetChecksum sets the UDP checksum of a (still parseable) frame: 0-9 valid,
// 10-11 partial (a local sender's), 12 absent, 13 wrong, 14-15 as built.
func fzSetChecksum(f []byte, mode, arg int) []byte {
	p, _ := fzParse(f)
	if p == nil || mode >= 14 {
		return f
	}
	off := p.l4 + 6
	switch {
	case mode < 10:
		binary.BigEndian.PutUint16(f[off:], 0)
		s := ^fzFold(fzPseudo(p) + fzSumBytes(f[p.l4:p.l4+8+len(p.payload)]))
		if s == 0 {
			s = 0xffff
		}
		binary.BigEndian.PutUint16(f[off:], s)
	case mode < 12:
		binary.BigEndian.PutUint16(f[off:], fzFold(fzPseudo(p)))
	case mode == 12:
		binary.BigEndian.PutUint16(f[off:], 0)
	default:
		f[off+arg%2] ^= byte(1 + arg%255)
	}
	return f
}

// ---------------------------------------------------------------------------
// The oracle's own parser.

type fzParsed struct {
	v6               bool
	vlan             bool
	tci              uint16
	l3, l4           int
	srcMAC, dstMAC   net.HardwareAddr
	src, dst         netip.Addr
	sport, dport     uint16
	check            uint16
	payload          []byte
	ipv4CsumOK       bool
	unicastMAC       bool
	answerableLength bool
}

// fzParse parses a frame the way the documentation says the rule processor
// must: nil and a reason for anything it has to pass untouched.
func fzParse(f []byte) (*fzParsed, string) {
	if len(f) < 14 {
		return nil, "short ethernet"
	}
	p := &fzParsed{dstMAC: net.HardwareAddr(f[0:6]), srcMAC: net.HardwareAddr(f[6:12])}
	p.unicastMAC = f[0]&1 == 0
	et := binary.BigEndian.Uint16(f[12:])
	p.l3 = 14
	if et == 0x8100 {
		if len(f) < 18 {
			return nil, "short vlan"
		}
		p.vlan = true
		p.tci = binary.BigEndian.Uint16(f[14:])
		if p.tci&0x0fff != 0 {
			return nil, "a VLAN's frame (not VLAN 0)"
		}
		et = binary.BigEndian.Uint16(f[16:])
		p.l3 = 18
	}
	var l4len int
	switch et {
	case 0x0800:
		h := f[p.l3:]
		if len(h) < 20 {
			return nil, "short ipv4"
		}
		if h[0]>>4 != 4 || h[0]&15 < 5 {
			return nil, "bad ipv4 version/ihl"
		}
		if h[0]&15 != 5 {
			return nil, "ipv4 options"
		}
		if binary.BigEndian.Uint16(h[6:])&0x3fff != 0 {
			return nil, "fragment"
		}
		if h[9] != 17 {
			return nil, "not udp"
		}
		tot := int(binary.BigEndian.Uint16(h[2:]))
		if tot < 28 || tot > len(h) {
			return nil, "ipv4 length"
		}
		p.ipv4CsumOK = fzIPv4HeaderCsum(h[:20]) == binary.BigEndian.Uint16(h[10:])
		p.src, p.dst = netip.AddrFrom4([4]byte(h[12:16])), netip.AddrFrom4([4]byte(h[16:20]))
		p.l4 = p.l3 + 20
		l4len = tot - 20
	case 0x86dd:
		h := f[p.l3:]
		if len(h) < 40 {
			return nil, "short ipv6"
		}
		if h[0]>>4 != 6 {
			return nil, "bad ipv6 version"
		}
		if h[6] != 17 {
			return nil, "ipv6 next header not udp"
		}
		plen := int(binary.BigEndian.Uint16(h[4:]))
		if plen < 8 || 40+plen > len(h) {
			return nil, "ipv6 length"
		}
		p.v6 = true
		p.ipv4CsumOK = true
		p.src, p.dst = netip.AddrFrom16([16]byte(h[8:24])), netip.AddrFrom16([16]byte(h[24:40]))
		p.l4 = p.l3 + 40
		l4len = plen
	default:
		return nil, "not ip"
	}
	u := f[p.l4:]
	if len(u) < 8 {
		return nil, "short udp"
	}
	if int(binary.BigEndian.Uint16(u[4:])) != l4len {
		return nil, "udp length"
	}
	p.sport, p.dport = binary.BigEndian.Uint16(u[0:]), binary.BigEndian.Uint16(u[2:])
	p.check = binary.BigEndian.Uint16(u[6:])
	p.payload = u[8:l4len]
	return p, ""
}

func fzSumBytes(b []byte) uint32 {
	var s uint32
	for i := 0; i+1 < len(b); i += 2 {
		s += uint32(b[i])<<8 | uint32(b[i+1])
	}
	if len(b)%2 == 1 {
		s += uint32(b[len(b)-1]) << 8
	}
	return s
}

func fzFold(s uint32) uint16 {
	for s>>16 != 0 {
		s = s&0xffff + s>>16
	}
	return uint16(s)
}

func fzPseudo(p *fzParsed) uint32 {
	return fzSumBytes(p.src.AsSlice()) + fzSumBytes(p.dst.AsSlice()) + 17 + uint32(8+len(p.payload))
}

// checksumOK: the UDP checksum is valid, in a local sender's partial form, or absent (IPv4).
func (p *fzParsed) checksumOK(f []byte) bool {
	if p.check == 0 {
		return !p.v6
	}
	if p.check == fzFold(fzPseudo(p)) {
		return true
	}
	return fzFold(fzPseudo(p)+fzSumBytes(f[p.l4:p.l4+8+len(p.payload)])) == 0xffff
}

// ---------------------------------------------------------------------------
// The verdict oracle.

// fzTolerate lists known data-plane bugs, by the oracle's class name
// ("bad-address", "local-src", "nonlocal-dst", "ipv4-header-csum"), that the
// fuzz target tolerates so that it keeps looking for new ones: for such
// packets it accepts XDP_PASS untouched or the expected reply. Each entry
// needs a failing test of its own (as delivery_test.go was for these four
// classes, which the data plane now handles). Empty: everything is strict.
var fzTolerate = map[string]bool{}

// fzExpect is what the oracle expects for one packet.
type fzExpect struct {
	answer  bool   // must be answered (else must be passed untouched)
	maybe   string // non-empty: a tolerated known bug; either outcome is accepted
	winner  *fzRule
	reply   []byte // the expected reply frame when answered
	why     string // why the packet is passed
	matched []*fzRule
}

func (fx *fzFixture) expect(frame []byte, live []*fzRule) fzExpect {
	p, why := fzParse(frame)
	if p == nil {
		return fzExpect{why: why}
	}
	if !p.unicastMAC {
		return fzExpect{why: "ethernet group address"}
	}
	// the socket the packet is for
	set := -1
	switch p.dport {
	case fzPortA:
		set = fzSetA
	case fzPortB:
		set = fzSetB
	case fzPortE:
		set = fzSetF
		if !p.v6 && p.dst == fx.ip4 {
			set = fzSetE
		}
	}
	if set < 0 {
		return fzExpect{why: "no socket with rules"}
	}
	if len(p.payload) > ReqWindow {
		return fzExpect{why: "payload longer than the window"}
	}
	var e fzExpect
	for _, fr := range live {
		if fr.set == set && fzHolds(&fr.rule, p.payload) {
			e.matched = append(e.matched, fr)
			if e.winner == nil || fr.rule.Priority < e.winner.rule.Priority ||
				(fr.rule.Priority == e.winner.rule.Priority && fr.order < e.winner.order) {
				e.winner = fr
			}
		}
	}
	if e.winner == nil {
		e.why = "no rule holds"
		return e
	}
	if !p.checksumOK(frame) {
		e.why = "bad udp checksum"
		return e
	}
	// packets the kernel would not deliver to the socket, or whose reply
	// would come from or go to an address no unicast host has
	var bug string
	switch {
	case fzBadAddr(p.src) || fzBadAddr(p.dst):
		bug = "bad-address"
	case fx.addrKind(p.src) != "":
		bug = "local-src" // martian: an address or broadcast address of this host
	case fx.addrKind(p.dst) != "local":
		bug = "nonlocal-dst" // another host, a broadcast or anycast address
	case !p.ipv4CsumOK:
		bug = "ipv4-header-csum"
	}
	e.reply = fzReplyFrame(p, fzReply(&e.winner.rule, p.payload))
	if bug != "" {
		e.why = "kernel would not deliver: " + bug
		if fzTolerate[bug] {
			e.maybe = bug
		}
		return e
	}
	// The subnet's network address as a source: this kernel has no broadcast
	// route for it (table local) and delivers the request, but passing it is
	// fine too (the data plane treats it as a broadcast address, as older
	// kernels did): the application answers instead.
	if p.src.Is4() && p.src == fx.tb.Server.Prefix4.Masked().Addr() {
		e.why, e.maybe = "network address as source", "network-address-src"
		return e
	}
	e.answer = true
	return e
}

// fzBadAddr: an address no unicast host has (the kernel drops such sources
// as martians, and delivers such destinations to no unicast socket, or would
// have the reply come from them).
func fzBadAddr(a netip.Addr) bool {
	if a.Is4() {
		b := a.As4()[0]
		return b == 0 || b == 127 || b >= 224
	}
	return a.IsMulticast() || a.IsLoopback() || a.IsUnspecified()
}

// fzReplyFrame is the reply the rule processor must send for request p.
func fzReplyFrame(p *fzParsed, payload []byte) []byte {
	s := fzFrameSpec{srcMAC: p.dstMAC, dstMAC: p.srcMAC, src: netip.AddrPortFrom(p.dst, p.dport),
		dst: netip.AddrPortFrom(p.src, p.sport), payload: payload, reply: true}
	s.tagged = p.vlan // the request's tag (PCP, DEI) is kept as is
	f := fzBuildFrame(s)
	if p.vlan {
		binary.BigEndian.PutUint16(f[14:], p.tci)
	}
	return f
}

// ---------------------------------------------------------------------------

func fzSeeds() [][]byte {
	return [][]byte{
		{},                 // one rule at offset 0, a request that satisfies it
		{5, 0, 0, 0, 0, 2}, // six rules
		bytes.Repeat([]byte{0x41}, 64),
		bytes.Repeat([]byte{0xa5, 0x13, 0x77}, 60),
		bytes.Repeat([]byte{0xff, 0x01}, 100),
		[]byte("COM COMSYS SYS: shared prefixes and regions"),
		bytes.Repeat([]byte{0x30, 0x70, 0xb0, 0xf0, 0x07}, 80),
		bytes.Repeat([]byte{0x99}, 300),
	}
}

func FuzzRuleProcessor(f *testing.F) {
	requireRoot(f)
	fx := &fzFixture{}
	f.Cleanup(fx.close)
	for _, s := range fzSeeds() {
		f.Add(s)
	}
	// seeds that target each header mutation and checksum form
	for m := 0; m < 64; m++ {
		f.Add([]byte{byte(m), byte(m * 37), byte(m * 91), byte(m * 13), byte(m * 29), byte(m * 53), byte(m * 71)})
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		start := time.Now()
		fx.get(t).check(t, data)
		el := time.Since(start)
		fx.stats.inputs++
		if el > 50*time.Millisecond {
			fx.stats.slow++
		}
		fx.stats.slowest = max(fx.stats.slowest, el)
	})
}

// check runs one fuzz input.
func (fx *fzFixture) check(t *testing.T, data []byte) {
	c := fx.decode(data)
	d := fx.d

	// install: ReplaceRules with the early rules of each set, AddRules with
	// the late ones, then delete some
	var bySet [fzSets][]*fzRule
	for _, fr := range c.rules {
		bySet[fr.set] = append(bySet[fr.set], fr)
	}
	dump := func() string {
		var b strings.Builder
		for i, fr := range c.rules {
			fmt.Fprintf(&b, "  rule %d set %s late=%v del=%v valid=%v id=%d order=%d: %s\n", i, fzSetNames[fr.set],
				fr.late, fr.del, fr.valid, fr.id, fr.order, fzRuleString(&fr.rule))
		}
		return b.String()
	}
	for s := 0; s < fzSets; s++ {
		var early, late []*fzRule
		for _, fr := range bySet[s] {
			if fr.late {
				late = append(late, fr)
			} else {
				early = append(early, fr)
			}
		}
		if len(early) == 0 && len(late) == 0 && !fx.used[s] {
			continue
		}
		if len(bySet[s]) > 0 {
			fx.used[s] = true
		}
		order := 0
		for step, batch := range [][]*fzRule{early, late} {
			if step == 1 && len(batch) == 0 {
				break
			}
			rules := make([]Rule, len(batch))
			valid := true
			for i, fr := range batch {
				rules[i] = fr.rule
				valid = valid && fr.valid
			}
			var ids []RuleID
			var err error
			if step == 0 {
				ids, err = d.ReplaceRules(fx.cookies[s], rules)
			} else {
				ids, err = d.AddRules(fx.cookies[s], rules)
			}
			if err != nil {
				if valid {
					t.Fatalf("set %s: valid rules refused: %v\n%s", fzSetNames[s], err, dump())
				}
				if !errors.Is(err, ErrInvalidRule) {
					t.Fatalf("set %s: invalid rules refused without ErrInvalidRule: %v\n%s", fzSetNames[s], err, dump())
				}
				fx.stats.refused++
				// all or nothing: a refused AddRules leaves the rules as they
				// were (the packets below check it); a refused ReplaceRules
				// leaves the previous input's rules, so clear them
				if step == 0 {
					if _, err := d.ReplaceRules(fx.cookies[s], nil); err != nil {
						t.Fatalf("set %s: clear: %v", fzSetNames[s], err)
					}
				}
				continue
			}
			if !valid {
				t.Fatalf("set %s: invalid rules accepted\n%s", fzSetNames[s], dump())
			}
			if len(ids) != len(batch) {
				t.Fatalf("set %s: %d ids for %d rules", fzSetNames[s], len(ids), len(batch))
			}
			for i, fr := range batch {
				fr.id, fr.order, fr.installed = ids[i], order, true
				order++
			}
		}
		if len(bySet[s]) == 0 {
			fx.used[s] = false
		}
		var del []RuleID
		for _, fr := range bySet[s] {
			if fr.del && fr.installed {
				del = append(del, fr.id)
			}
		}
		if len(del) > 0 {
			if err := d.DeleteRules(fx.cookies[s], del); err != nil {
				t.Fatalf("set %s: delete %v: %v\n%s", fzSetNames[s], del, err, dump())
			}
		}
	}
	if c.broken != nil && !c.broken.valid {
		_, err := d.AddRules(fx.cookies[c.broken.set], []Rule{c.shadow, c.broken.rule})
		if err == nil {
			t.Fatalf("set %s: invalid rule accepted: %s\n%s", fzSetNames[c.broken.set], fzRuleString(&c.broken.rule), dump())
		}
		if !errors.Is(err, ErrInvalidRule) {
			t.Fatalf("set %s: invalid rule refused without ErrInvalidRule: %v: %s", fzSetNames[c.broken.set], err, fzRuleString(&c.broken.rule))
		}
		fx.stats.refused++
	}
	var live []*fzRule
	for _, fr := range c.rules {
		if fr.installed && !fr.del {
			live = append(live, fr)
		}
	}

	fx.stats.installed++
	hits := map[*fzRule]RuleStats{}
	for i, pk := range c.packets {
		e := fx.expect(pk.frame, live)
		verdict, out, err := fx.run(pk.frame)
		if err != nil {
			t.Fatalf("packet %d: BPF_PROG_RUN: %v", i, err)
		}
		fail := func(format string, args ...any) {
			t.Helper()
			t.Fatalf("packet %d (%s): %s\noracle: answer=%v why=%q winner=%v matched=%d\nframe: %s\nout:   %s\nrules:\n%s",
				i, pk.desc, fmt.Sprintf(format, args...), e.answer, e.why, e.winner != nil && e.winner.id != 0,
				len(e.matched), hex.EncodeToString(pk.frame), hex.EncodeToString(out), dump())
		}
		fx.stats.packets++
		if fx.stats.why == nil {
			fx.stats.why = map[string]int{}
		}
		switch {
		case verdict == xdpTx:
			fx.stats.answered++
			if !e.answer {
				fx.stats.tolerated++
			}
		default:
			fx.stats.passed++
			fx.stats.why[e.why]++
		}
		switch {
		case verdict == xdpTx && (e.answer || e.maybe != ""):
			if !bytes.Equal(out, e.reply) {
				fail("wrong reply from rule id %d:\n got  %s\n want %s", e.winner.id, hex.EncodeToString(out), hex.EncodeToString(e.reply))
			}
			st := hits[e.winner]
			hits[e.winner] = RuleStats{st.Hits + 1, st.Bytes + uint64(len(out))}
		case verdict == xdpTx:
			fail("answered a packet that must be passed (%s)", e.why)
		case verdict == xdpPass && !e.answer:
			if !bytes.Equal(out, pk.frame) {
				fail("passed frame was modified")
			}
		case verdict == xdpPass:
			fail("passed a packet rule id %d must answer", e.winner.id)
		default:
			fail("verdict %d", verdict)
		}
	}
	// per-rule counters agree with the answers
	for s := 0; s < fzSets; s++ {
		if len(bySet[s]) == 0 {
			continue
		}
		stats, err := d.RuleStats(fx.cookies[s])
		if err != nil {
			t.Fatal(err)
		}
		for _, fr := range bySet[s] {
			if fr.del {
				if _, ok := stats[fr.id]; ok {
					t.Fatalf("deleted rule %d still has stats", fr.id)
				}
				continue
			}
			if got := stats[fr.id]; got != hits[fr] {
				t.Fatalf("rule %d (set %s) stats %+v, want %+v\n%s", fr.id, fzSetNames[s], got, hits[fr], dump())
			}
		}
	}
}

func fzRuleString(r *Rule) string {
	var b strings.Builder
	for _, c := range r.Conditions {
		fmt.Fprintf(&b, "cond(%d,%q", c.Offset, c.Pattern)
		if c.Mask != nil {
			fmt.Fprintf(&b, " mask %x", c.Mask)
		}
		b.WriteString(") ")
	}
	for _, p := range r.Processors {
		switch p.Kind {
		case Put:
			fmt.Fprintf(&b, "put(%d,%q) ", p.ReplyOffset, p.Template)
		case Copy:
			fmt.Fprintf(&b, "copy(dst %d,src %d,len %d", p.ReplyOffset, p.SrcOffset, p.Length)
			if p.Mask != nil {
				fmt.Fprintf(&b, " mask %x", p.Mask)
			}
			b.WriteString(") ")
		default:
			fmt.Fprintf(&b, "kind%d ", p.Kind)
		}
	}
	fmt.Fprintf(&b, "len %d prio %d min %d max %d", r.ReplyLen, r.Priority, r.MinLen, r.MaxLen)
	return b.String()
}
