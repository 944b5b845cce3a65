package dnsctl_test

// End-to-end tests of `santa dns` against real NSD, Knot and BIND in a
// testbed: santad attaches the rule processor to the server veth, the santa
// CLI runs the controller in the server namespace, and real clients (raw
// queries built with miekg/dns, dig, kdig, dnspython) ask from the client
// namespace. The differential test sends one large query set with offload
// on and off and requires identical replies except for the ID.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/dnsctl"
	"github.com/santa-offload/santa/internal/testbed"
)

// bin holds santad and santa, built once for the package.
var bin string

func TestMain(m *testing.M) {
	os.Exit(testbed.MainWithSanta(m, "../..", "XDP, namespaces, real DNS servers", &bin))
}

// rig is a DNS server with santad attached to the server veth.
type rig struct {
	t      *testing.T
	tb     *testbed.Testbed
	srv    testbed.DNSServer
	santad *testbed.Santad
	zone   testbed.Zone
	dir    string
}

// newRig serves tb.ExampleZone(generated) with the extra records.
func newRig(t *testing.T, kind string, generated int, extra ...string) *rig {
	return newRigWith(t, kind, rigOptions{generated: generated, extra: extra})
}

// rigOptions shape the zone and santad of newRigWith.
type rigOptions struct {
	generated   int            // generated names, as for tb.ExampleZone
	extra       []string       // more zone records
	signed      bool           // serve the zone signed with DNSSEC
	nsec3       bool           // signed with NSEC3
	wildcard    bool           // NSD bound to the wildcard addresses
	santadFlags []string       // more flags for santad (e.g. --config)
	moreZones   []testbed.Zone // served besides the example zone
}

func newRigWith(t *testing.T, kind string, o rigOptions) *rig {
	tb := testbed.New(t)
	zone := tb.ExampleZone(o.generated)
	zone.Records = append(zone.Records, o.extra...)
	zone.Signed, zone.NSEC3 = o.signed, o.nsec3
	srv, err := tb.StartDNSServer(kind, testbed.DNSServerOptions{Zone: &zone, MoreZones: o.moreZones, Wildcard: o.wildcard})
	if err != nil {
		t.Fatal(err)
	}
	sd := tb.StartSantad(t, bin, "/sys/fs/bpf/santa-dnsctl-"+tb.ID, map[string]func() string{kind + " log": srv.Log}, o.santadFlags...)
	dir := t.TempDir()
	return &rig{t: t, tb: tb, srv: srv, santad: sd, zone: zone, dir: dir}
}

// startController runs `santa dns ARGS` in the server namespace and waits
// for its "ready:" line; the test's cleanup stops it.
func (r *rig) startController(args ...string) *testbed.Controller {
	r.t.Helper()
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "dns", args...)
	c, err := testbed.StartController(context.Background(), argv, 60*time.Second, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		if err := c.Stop(20 * time.Second); err != nil {
			r.t.Error(err)
		}
		if r.t.Failed() {
			r.t.Logf("santa dns output:\n%s", c.Output())
		}
	})
	r.t.Log(c.Ready())
	return c
}

// answered is santad's count of requests the rule processor answered.
func (r *rig) answered() uint64 { _, c := r.health(); return c["answered"] }

// counters are the rule processor's counters (answered, pass reasons).
func (r *rig) counters() map[string]uint64 { _, c := r.health(); return c }

// rules is how many rules santad holds.
func (r *rig) rules() uint64 { info, _ := r.health(); return info.Rules }

// health is santad's answer to health.
func (r *rig) health() (*api.DaemonInfo, map[string]uint64) {
	r.t.Helper()
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		r.t.Fatal(err)
	}
	defer c.Close()
	info, counters, err := c.Health()
	if err != nil {
		r.t.Fatal(err)
	}
	return info, counters
}

// zoneFile writes the rig's zone for `santa dns static --zone-file`.
func (r *rig) zoneFile() string {
	r.t.Helper()
	path := filepath.Join(r.dir, "zone")
	f, err := os.Create(path)
	if err != nil {
		r.t.Fatal(err)
	}
	defer f.Close()
	if _, err := r.zone.WriteTo(f); err != nil {
		r.t.Fatal(err)
	}
	return path
}

// namesFile writes every name with types for `santa dns static --names`.
func (r *rig) namesFile(names []string, types []uint16) string {
	r.t.Helper()
	var b strings.Builder
	for _, n := range names {
		b.WriteString(n)
		for _, t := range types {
			b.WriteString(" " + dns.TypeToString[t])
		}
		b.WriteString("\n")
	}
	path := filepath.Join(r.dir, "names")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		r.t.Fatal(err)
	}
	return path
}

// sender asks from the client namespace with parallel UDP sockets.
type sender struct {
	conns []*net.UDPConn
	// silent holds the queries that got no reply in 3 tries: later rounds
	// try them once (a server that never answers some malformed queries,
	// Knot, otherwise costs 3 s each round)
	silent sync.Map
}

func (r *rig) sender(server netip.AddrPort, parallel int) *sender {
	r.t.Helper()
	s := &sender{}
	err := r.tb.Client.Do(func() error {
		for i := 0; i < parallel; i++ {
			c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(server))
			if err != nil {
				return err
			}
			s.conns = append(s.conns, c)
		}
		return nil
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		for _, c := range s.conns {
			c.Close()
		}
	})
	return s
}

// sendAll sends every query (their IDs as given) and returns the replies
// (nil where none came within 3 tries of 1 s, or 1 try for a query that
// got none before).
func (s *sender) sendAll(queries [][]byte) [][]byte {
	replies := make([][]byte, len(queries))
	var wg sync.WaitGroup
	for w, c := range s.conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, 65535)
			for i := w; i < len(queries); i += len(s.conns) {
				q := queries[i]
				tries := 3
				if _, ok := s.silent.Load(string(q)); ok {
					tries = 1
				}
				for try := 0; try < tries && replies[i] == nil; try++ {
					c.SetDeadline(time.Now().Add(time.Second))
					if _, err := c.Write(q); err != nil {
						break
					}
					for {
						n, err := c.Read(buf)
						if err != nil {
							break
						}
						if n >= 2 && buf[0] == q[0] && buf[1] == q[1] {
							replies[i] = append([]byte(nil), buf[:n]...)
							break
						}
					}
				}
				if replies[i] == nil {
					s.silent.Store(string(q), true)
				}
			}
		}()
	}
	wg.Wait()
	return replies
}

// variant is one way of asking a question.
type variant struct {
	name  string
	apply func(m *dns.Msg)
}

func ednsVariant(name string, size uint16, do bool, opts ...dns.EDNS0) variant {
	return variant{name, func(m *dns.Msg) {
		m.SetEdns0(size, do)
		m.IsEdns0().Option = append(m.IsEdns0().Option, opts...)
	}}
}

var (
	flagVariants = []variant{
		{"norec", func(m *dns.Msg) { m.RecursionDesired = false }},
		{"rd", func(m *dns.Msg) { m.RecursionDesired = true }},
		{"rd+ad", func(m *dns.Msg) { m.RecursionDesired, m.AuthenticatedData = true, true }},
		{"cd", func(m *dns.Msg) { m.RecursionDesired, m.CheckingDisabled = false, true }},
		{"rd+cd", func(m *dns.Msg) { m.RecursionDesired, m.CheckingDisabled = true, true }},
	}
	ednsVariants = []variant{
		{"no-edns", func(*dns.Msg) {}},
		ednsVariant("edns512", 512, false),
		ednsVariant("edns1232", 1232, false),
		ednsVariant("edns4096", 4096, false),
		ednsVariant("edns1232+do", 1232, true),
		ednsVariant("edns512+do", 512, true), // signed answers the server truncates
		ednsVariant("edns1232+cookie", 1232, false, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"}),
		ednsVariant("edns1232+cookie2", 1232, false, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "fedcba9876543210"}),
		ednsVariant("edns1232+ecs", 1232, false, &dns.EDNS0_SUBNET{Code: dns.EDNS0SUBNET, Family: 1, SourceNetmask: 24, Address: net.IPv4(198, 18, 7, 0).To4()}),
		ednsVariant("edns1232+padding", 1232, false, &dns.EDNS0_PADDING{Padding: make([]byte, 24)}),
		ednsVariant("edns1232+nsid", 1232, false, &dns.EDNS0_NSID{Code: dns.EDNS0NSID}),
		ednsVariant("edns0-size", 0, false),
	}
	caseVariants = []variant{
		{"lower", func(*dns.Msg) {}},
		{"upper", func(m *dns.Msg) { m.Question[0].Name = strings.ToUpper(m.Question[0].Name) }},
		{"0x20", func(m *dns.Msg) {
			b := []byte(m.Question[0].Name)
			for i := range b {
				if i%2 == 0 {
					b[i] = strings.ToUpper(string(b[i]))[0]
				}
			}
			m.Question[0].Name = string(b)
		}},
	}
)

// queryTypes are the types the differential test asks for every name.
var queryTypes = []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeTXT, dns.TypeMX, dns.TypeNS, dns.TypeSOA, dns.TypeCNAME}

// querySet is the differential test's queries: every name in each of types
// (names and types the zone has and lacks), each in a deterministic sample of
// flag, EDNS and letter-case variants, plus queries that must go to the
// server (other opcodes, two questions, malformed, trailing bytes, EDNS
// version 1, unknown EDNS flags and options, QR, TC or an RCODE set in the
// query, a record in its answer section).
func querySet(t *testing.T, origin string, names []string, types []uint16, perQuestion int) [][]byte {
	rng := rand.New(rand.NewPCG(4, 2))
	var out [][]byte
	id := uint16(0)
	pack := func(m *dns.Msg) []byte {
		id++
		m.Id = id
		b, err := m.Pack()
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	for _, name := range names {
		for _, qt := range types {
			// the plain forms clients use most, always; then a random sample
			combos := [][3]int{{0, 0, 0}, {1, 2, 0}, {1, 5, 0}}
			for len(combos) < perQuestion {
				combos = append(combos, [3]int{rng.IntN(len(flagVariants)), rng.IntN(len(ednsVariants)), rng.IntN(len(caseVariants))})
			}
			for _, c := range combos {
				m := new(dns.Msg)
				m.SetQuestion(name, qt)
				flagVariants[c[0]].apply(m)
				ednsVariants[c[1]].apply(m)
				caseVariants[c[2]].apply(m)
				out = append(out, pack(m))
			}
		}
	}
	www := "www." + origin
	notify := new(dns.Msg)
	notify.SetNotify(origin)
	out = append(out, pack(notify))
	status := new(dns.Msg)
	status.SetQuestion(www, dns.TypeA)
	status.Opcode = dns.OpcodeStatus
	out = append(out, pack(status))
	two := new(dns.Msg)
	two.SetQuestion(www, dns.TypeA)
	two.Question = append(two.Question, dns.Question{Name: "mail." + origin, Qtype: dns.TypeA, Qclass: dns.ClassINET})
	out = append(out, pack(two))
	plain := new(dns.Msg)
	plain.SetQuestion(www, dns.TypeA)
	p := pack(plain)
	out = append(out, append(p, 0, 0, 0))             // trailing bytes
	out = append(out, append([]byte(nil), p[:20]...)) // truncated question
	edns := func(m *dns.Msg) *dns.OPT { m.SetEdns0(1232, false); return m.IsEdns0() }
	for _, set := range []func(m *dns.Msg){
		func(m *dns.Msg) { edns(m).SetVersion(1) }, // BADVERS from the server
		func(m *dns.Msg) { edns(m).SetZ(0x4000) },  // an EDNS flag other than DO
		func(m *dns.Msg) { // an EDNS option no server knows
			o := edns(m)
			o.Option = append(o.Option, &dns.EDNS0_LOCAL{Code: 65001, Data: []byte{1, 2, 3}})
		},
		func(m *dns.Msg) { m.Response = true },  // a reply sent as a query
		func(m *dns.Msg) { m.Truncated = true }, // TC in a query
		func(m *dns.Msg) { m.Rcode = dns.RcodeNameError },
		func(m *dns.Msg) { // a record in the answer section
			m.Answer = append(m.Answer, &dns.A{Hdr: dns.RR_Header{Name: www, Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 60},
				A: net.IPv4(198, 18, 0, 1)})
		},
	} {
		m := new(dns.Msg)
		m.SetQuestion(www, dns.TypeA)
		set(m)
		out = append(out, pack(m))
	}
	chaos := new(dns.Msg)
	chaos.SetQuestion("version.bind.", dns.TypeTXT)
	chaos.Question[0].Qclass = dns.ClassCHAOS
	out = append(out, pack(chaos))
	for i := range out { // unique IDs for the last ones too
		binary.BigEndian.PutUint16(out[i], uint16(i+1))
	}
	return out
}

// zoneNames are the names the differential test asks for.
func zoneNames(z testbed.Zone, generated int) []string {
	o := z.Origin
	names := []string{o, "www." + o, "mail." + o, "txt." + o, "alias." + o, "ns1." + o,
		"nonexistent." + o, "deep.nonexistent." + o, "www.mail." + o, "rr." + o,
		"sub." + o, "www.sub." + o, "x.wild." + o, "y.z.wild." + o, "big." + o}
	for i := 0; i < generated; i++ {
		names = append(names, testbed.GenName(o, i))
	}
	return names
}

// TestDifferential: with `santa dns static` offloading the whole zone, every
// reply of a large query set equals the server's own reply to it (sent
// again with offload off) byte for byte except the ID, for NSD, Knot and
// BIND, and for NSD bound to the wildcard addresses (the controller asks
// it over loopback); and the rule processor answered a large share of them.
func TestDifferential(t *testing.T) {
	for _, kind := range testbed.DNSServerKinds {
		t.Run(kind, func(t *testing.T) {
			differential(t, kind, rigOptions{}, queryTypes)
		})
	}
	t.Run("nsd-wildcard", func(t *testing.T) {
		differential(t, testbed.KindNSD, rigOptions{wildcard: true}, queryTypes)
	})
}

// TestDifferentialSigned is TestDifferential on the zone signed with
// DNSSEC: queries with the DO bit get the signatures (and NSEC proofs for
// names and types the zone lacks), queries without it the plain answers,
// and answers the server truncates for a small EDNS size stay with it. NSD
// also serves it signed with NSEC3.
func TestDifferentialSigned(t *testing.T) {
	types := append([]uint16{dns.TypeDNSKEY, dns.TypeNSEC, dns.TypeNSEC3PARAM}, queryTypes...)
	for _, kind := range testbed.DNSServerKinds {
		t.Run(kind, func(t *testing.T) {
			differential(t, kind, rigOptions{signed: true}, types)
		})
	}
	t.Run("nsd-nsec3", func(t *testing.T) {
		differential(t, testbed.KindNSD, rigOptions{signed: true, nsec3: true}, types)
	})
}

// differential offloads every name and type of the example zone (20
// generated names, signed as o says) from a server of kind, and compares
// the replies of querySet with offload on and off over IPv4 and IPv6.
func differential(t *testing.T, kind string, o rigOptions, types []uint16) {
	const generated = 20
	o.generated = generated
	r := newRigWith(t, kind, o)
	names := zoneNames(r.zone, generated)
	queries := querySet(t, r.zone.Origin, names, types, 12)
	v4, v6 := r.srv.Addrs()
	senders := []*sender{r.sender(v4, 8), r.sender(v6, 8)}
	families := []string{"IPv4", "IPv6"}
	// the server's own replies, twice, a second apart: time-stamped server
	// cookies and shuffled record sets make some differ each time
	off := make([][][]byte, 2)
	off2 := make([][][]byte, 2)
	for i, s := range senders {
		off[i] = s.sendAll(queries)
		time.Sleep(1100 * time.Millisecond)
		off2[i] = s.sendAll(queries)
	}
	// every question asked, positive or not, in three shapes up front;
	// the other shapes are learned from misses
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile(names, types),
		"--shape", "plain", "--shape", "edns", "--shape", "edns,do", "--zone", r.zone.Origin)
	if o.wildcard { // the sockets are bound to the wildcard addresses: it asks over loopback
		for _, want := range []string{"server=127.0.0.1:53", "server=[::1]:53"} {
			if !strings.Contains(ctl.Output(), want) {
				t.Errorf("the controller does not say %s:\n%s", want, ctl.Output())
			}
		}
	}
	for i, s := range senders {
		s.sendAll(queries) // the controller learns the shapes it lacks
		time.Sleep(time.Second)
		before := r.counters()
		on := s.sendAll(queries)
		after := r.counters()
		stay := compare(t, families[i], queries, on, off[i], off2[i],
			after["answered"]-before["answered"], after["pass_no_room"]-before["pass_no_room"])
		if len(stay) > 0 {
			answered := r.answered()
			s.sendAll(stay)
			if n := r.answered() - answered; n != 0 {
				t.Errorf("%s: rules answered %d of the %d queries whose replies the server varies", families[i], n, len(stay))
			}
		}
	}
	counters := r.counters()
	t.Logf("rule processor counters: %v", counters)
	// signed answers are long: on the veth most cannot be sent from XDP's
	// frame, and TC must have sent them, every one it was asked to
	if o.signed && counters["udp_xdp_no_room"] == 0 {
		t.Errorf("no signed answer was too long for XDP's frame: TC's UDP replies went untested")
	}
	if n := counters["udp_emit_passed"] + counters["udp_emit_failed"]; n != 0 {
		t.Errorf("TC could not send %d replies XDP passed to it (udp_emit_passed %d, udp_emit_failed %d)",
			n, counters["udp_emit_passed"], counters["udp_emit_failed"])
	}
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if n := r.rules(); n != 0 {
		t.Fatalf("%d rules left after the controller stopped", n)
	}
}

// compare checks the replies with offload (on) against the server's own
// (off, and off2 a second later) reply by reply, and returns the queries
// no rule may answer: those the server answers differently each time
// (BIND's time-stamped server cookies, RFC 9018) and, from a server seen
// to reorder record sets, every query whose reply has a set of several
// records. Such a reply with offload must still be one the server could
// send: the same records, in any order within their sets. answered and
// noRoom are the rule processor's counts over the round: a rule that
// matches a request whose frame cannot make room for the reply at all
// passes it on (TC sends those XDP's frame has no room for: answered).
func compare(t *testing.T, family string, queries, on, off, off2 [][]byte, answered, noRoom uint64) (stay [][]byte) {
	t.Helper()
	var same, reordered, diffs, nondet int
	reorders := false
	for i, q := range queries {
		if off[i] == nil || off2[i] == nil || on[i] == nil {
			if (off[i] == nil) != (on[i] == nil) {
				t.Errorf("%s: query %d (%s): reply with offload %v, without %v", family, i, describe(q), on[i] != nil, off[i] != nil)
			}
			continue
		}
		if on[i][0] != q[0] || on[i][1] != q[1] {
			t.Errorf("%s: query %d: reply ID %x, want %x", family, i, on[i][:2], q[:2])
		}
		varies := string(off[i][2:]) != string(off2[i][2:])
		if varies && unordered(off[i]) == unordered(off2[i]) {
			reorders = true
		}
		switch {
		case varies:
			nondet++
			stay = append(stay, q)
		case string(on[i][2:]) == string(off[i][2:]):
			same++
		case unordered(on[i]) == unordered(off[i]):
			reordered++
			reorders = true
		default:
			if diffs++; diffs <= 5 {
				t.Errorf("%s: query %d (%s) differs:\nwith offload:    %x\nwithout offload: %x", family, i, describe(q), on[i], off[i])
			}
		}
	}
	if reorders {
		for i, q := range queries {
			var m dns.Msg
			if off[i] != nil && string(off[i][2:]) == string(off2[i][2:]) && m.Unpack(off[i]) == nil && dnsctl.HasSetOfSeveral(&m) {
				stay = append(stay, q)
			}
		}
	}
	t.Logf("%s: %d queries, %d identical, %d with record sets in another order, %d different, %d answered differently by the server each time; %d answered by the rule processor, %d matched a rule but had no room for the reply",
		family, len(queries), same, reordered, diffs, nondet, answered, noRoom)
	// BIND's cookie queries (and the upper-case and 0x20 ones everywhere)
	// go to the server by design; of the others most must match a rule
	if deterministic := same + reordered + diffs; answered+noRoom < uint64(deterministic)*2/5 {
		t.Errorf("%s: only %d of %d queries matched a rule", family, answered+noRoom, deterministic)
	}
	if same < len(queries)*3/4 {
		t.Errorf("%s: only %d of %d replies could be compared", family, same, len(queries))
	}
	return stay
}

// unordered is reply without its ID and with the records of each section
// sorted: equal for two replies that differ only in the order of records.
func unordered(reply []byte) string {
	var m dns.Msg
	if err := m.Unpack(reply); err != nil {
		return string(reply[2:])
	}
	m.Id = 0
	out := m.MsgHdr.String() + fmt.Sprint(m.Question)
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		rrs := make([]string, len(section))
		for i, rr := range section {
			rrs[i] = rr.String()
		}
		slices.Sort(rrs)
		out += "\n" + strings.Join(rrs, "\n")
	}
	return out
}

func describe(q []byte) string {
	var m dns.Msg
	if err := m.Unpack(q); err != nil {
		return fmt.Sprintf("malformed %d bytes", len(q))
	}
	s := strings.Join(strings.Fields(m.String()), " ")
	if len(s) > 300 {
		s = s[:300]
	}
	return s
}

// TestRealClients: dig, kdig and dnspython get correct answers through a
// server with `santa dns` attached, and the rule processor answers them (the
// first query of a shape the controller has not seen teaches it the shape).
// With BIND, dig's default client cookie makes BIND send a server cookie,
// which no rule may repeat: those queries stay with BIND, as the controller
// says in its log.
func TestRealClients(t *testing.T) {
	script := `import sys, dns.message, dns.query, dns.rdatatype
q = dns.message.make_query(sys.argv[2], "A", use_edns=(0 if sys.argv[3] == "edns" else None))
r = dns.query.udp(q, sys.argv[1], timeout=2)
assert r.id == q.id
print(r.answer[0][0].address)`
	for _, kind := range testbed.DNSServerKinds {
		t.Run(kind, func(t *testing.T) {
			r := newRig(t, kind, 0)
			ctl := r.startController("static", "--port", "53/udp", "--zone-file", r.zoneFile(), "--zone", r.zone.Origin)
			if says := strings.Contains(ctl.Output(), "the server answers DNS cookies"); says != (kind == testbed.KindBIND) {
				t.Errorf("the controller says the server answers DNS cookies: %v, want %v (only BIND does):\n%s",
					says, kind == testbed.KindBIND, ctl.Output())
			}
			v4, v6 := r.srv.Addrs()
			www := "www." + r.zone.Origin
			clients := []struct {
				name      string
				argv      []string
				offloaded bool // the rule processor must answer all but the first
			}{
				{"dig", []string{"dig", "+tries=1", "+time=2", "@" + v4.Addr().String(), www, "A", "+short"}, kind != testbed.KindBIND},
				{"dig +nocookie", []string{"dig", "+nocookie", "+tries=1", "+time=2", "@" + v4.Addr().String(), www, "A", "+short"}, true},
				{"dig over IPv6", []string{"dig", "+nocookie", "+tries=1", "+time=2", "@" + v6.Addr().String(), www, "A", "+short"}, true},
				{"kdig", []string{"kdig", "+retry=0", "+timeout=2", "@" + v4.Addr().String(), www, "A", "+short"}, true},
				{"dnspython", []string{"/usr/bin/python3", "-c", script, v4.Addr().String(), www, "plain"}, true},
				{"dnspython edns", []string{"/usr/bin/python3", "-c", script, v6.Addr().String(), www, "edns"}, true},
			}
			for _, c := range clients {
				// run asks once, checks the answer and says whether the rule processor gave it
				run := func(what string) bool {
					before := r.answered()
					out, err := r.tb.Client.Run(c.argv[0], c.argv[1:]...)
					if err != nil || strings.TrimSpace(out) != testbed.ExampleWWW4.String() {
						t.Errorf("%s: %s: %.300q, %.300v (want %v)", c.name, what, out, err, testbed.ExampleWWW4)
					}
					return r.answered() > before
				}
				const runs = 4
				if !c.offloaded {
					got := 0
					for i := 0; i < runs; i++ {
						if run(fmt.Sprintf("run %d", i)) {
							got++
						}
					}
					t.Logf("%s: %d of %d answered by the rule processor", c.name, got, runs)
					continue
				}
				run("run 0") // a shape the controller has not seen: it learns it from the miss
				r.untilLearned(c.name, func() bool { return run("until learned") }, ctl)
				got := 0
				for i := 1; i < runs; i++ {
					if run(fmt.Sprintf("run %d", i)) {
						got++
					}
				}
				t.Logf("%s: %d of %d runs after the shape was learned answered by the rule processor", c.name, got, runs-1)
				if got != runs-1 {
					t.Errorf("%s: once the shape was learned, the rule processor answered %d of %d queries, want all", c.name, got, runs-1)
				}
			}
		})
	}
}

// TestEscapedNameLearned: a name written with a decimal escape in the names
// file (a\046b, a label holding a dot) is the name clients' queries parse
// to (a\.b): its shapes are learned from misses as any other name's.
func TestEscapedNameLearned(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, `a\046b IN A 198.18.255.77`)
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{`a\046b.` + r.zone.Origin}, []uint16{dns.TypeA}),
		"--shape", "plain")
	ask := func() bool {
		got, kernel := r.dig(`a\.b.`+r.zone.Origin, "A") // a shape not installed up front: learned
		if got != "198.18.255.77" {
			t.Fatalf("dig a\\.b: %q", got)
		}
		return kernel
	}
	ask() // the first teaches the shape
	r.untilLearned(`a\.b`, ask, ctl)
	answered := 0
	for range 3 {
		if ask() {
			answered++
		}
	}
	if answered != 3 {
		t.Errorf("once the shape was learned, the rule processor answered %d of 3 queries, want all:\n%s", answered, ctl.Output())
	}
}

// TestCookieQueriesNotLearned: BIND answers a query with a client cookie
// with a server cookie, which no rule may send, so such queries stay with
// it. dig sends a new client cookie each run: each is a query shape of its
// own. The controller does not try to learn them: they would each be
// asked again for ever and count towards --max-rules, after which no shape
// TestZoneFileNamesInLowerCase: a zone file's owner names are offloaded
// in lower case, as clients ask for them, whatever the case the file
// writes them in. (Offloaded in the file's case, "UPPER" and a zone whose
// $ORIGIN has capitals were never answered by a rule, while the ready
// line counted every question offloaded.)
func TestZoneFileNamesInLowerCase(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "UPPER IN A 198.18.255.80")
	r.startController("static", "--port", "53/udp", "--zone-file", r.zoneFile(), "--shape", "rd,ad,edns")
	if got, kernel := r.dig("upper."+r.zone.Origin, "A"); got != "198.18.255.80" || !kernel {
		t.Errorf("upper A: %q, from the rule processor %v", got, kernel)
	}
}

// a rule can answer would be learned any more.
func TestCookieQueriesNotLearned(t *testing.T) {
	r := newRig(t, testbed.KindBIND, 0)
	withCookies := make([][]string, 10) // dig's default: a new client cookie each run
	r.learnAfterUnoffloadable("www."+r.zone.Origin, withCookies, []string{"+nocookie", "+bufsize=1400"})
}

// TestOtherClassNotLearned: the questions of a names file are of class IN.
// A query for one of them in another class (CHAOS, HESIOD: NSD refuses
// them) is no shape to learn: it would count towards --max-rules and be
// asked again for ever.
func TestOtherClassNotLearned(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	r.learnAfterUnoffloadable("www."+r.zone.Origin, [][]string{{"+nocookie", "-c", "CH"}, {"+nocookie", "-c", "HS"}}, []string{"+nocookie", "+dnssec"})
}

// learnAfterUnoffloadable offloads name A with --max-rules 2 (rules for
// shapes learned from misses), has dig ask for it with each of the options
// of unoffloadable (queries no rule can answer), and checks that the shape
// of dig with newShape, which a rule can answer, is learned after them and
// that none of them is left to ask again.
func (r *rig) learnAfterUnoffloadable(name string, unoffloadable [][]string, newShape []string) {
	t := r.t
	t.Helper()
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{name}, []uint16{dns.TypeA}), "--max-rules", "2")
	v4, _ := r.srv.Addrs()
	// dig asks with opts and says whether the rule processor answered
	dig := func(opts []string) bool {
		before := r.answered()
		r.tb.Client.Run("dig", append([]string{"+tries=1", "+time=1", "@" + v4.Addr().String(), name, "A", "+short"}, opts...)...)
		return r.answered() > before
	}
	// The miss samples reach the controller in the order of the queries
	// (one ring in santad, one stream per socket): it sees the
	// unoffloadable ones before the new shape. Had it learned them, they
	// would have used up --max-rules and the new shape would never be.
	for _, opts := range unoffloadable {
		dig(opts)
	}
	dig(newShape) // the first teaches the shape
	r.untilLearned(fmt.Sprintf("dig %v after the others", newShape), func() bool { return dig(newShape) }, ctl)
	answered := 0
	for range 3 {
		if dig(newShape) {
			answered++
		}
	}
	if answered != 3 {
		t.Errorf("once the new shape (dig %v) was learned, the rule processor answered %d of 3 of its queries, want all", newShape, answered)
	}
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if want := "0 questions not offloaded yet, asked again"; !strings.Contains(ctl.Output(), want) {
		t.Errorf("the done line does not say %q:\n%s", want, ctl.Output())
	}
}

// untilLearned asks (ask says whether the rule processor answered) every
// 200 ms until the rule processor answers: the controller has learned the
// shape from a miss (santad drains its sample ring every 100 ms and streams
// the sample, the controller asks the server and adds the rule). It fails
// the test if that takes more than 10 s.
func (r *rig) untilLearned(what string, ask func() bool, ctl *testbed.Controller) {
	r.t.Helper()
	start := time.Now()
	for !ask() {
		if time.Since(start) > 10*time.Second {
			r.t.Fatalf("%s: the rule processor answered none of the queries of a new shape in 10 s; controller output:\n%s", what, ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.t.Logf("%s: learned %v after the first query", what, time.Since(start).Round(time.Millisecond))
}

// dig asks the rig's server (IPv4) for name/type from the client namespace
// and returns the short answer and whether the rule processor answered it.
func (r *rig) dig(name, qtype string) (string, bool) {
	v4, _ := r.srv.Addrs()
	return r.digAt(v4, name, qtype)
}

// digAt is dig asking the server at one of its addresses.
func (r *rig) digAt(server netip.AddrPort, name, qtype string) (string, bool) {
	r.t.Helper()
	before := r.answered()
	out, err := r.tb.Client.Run("dig", "+nocookie", "+tries=1", "+time=1", "@"+server.Addr().String(), name, qtype, "+short")
	if err != nil {
		return "", false
	}
	return strings.TrimSpace(out), r.answered() > before
}

// TestZoneChange: after the zone changes on the server (a new serial, NSD
// reloads on SIGHUP), the controller's SOA poll updates the rule, and the
// kernel gives the new answer within a few poll intervals.
func TestZoneChange(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www := "www." + r.zone.Origin
	r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--poll", "200ms")
	if got, kernel := r.dig(www, "A"); got != testbed.ExampleWWW4.String() || !kernel {
		t.Fatalf("before the change: %q, from the rule processor %v", got, kernel)
	}
	r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, "198.18.255.10", "198.18.255.99", 1) })
	deadline := time.Now().Add(10 * time.Second)
	for {
		got, kernel := r.dig(www, "A")
		if got == "198.18.255.99" && kernel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s after the zone change: %q, from the rule processor %v", got, kernel)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// TestZoneRemoved: when the server stops serving a zone (Knot, the zone
// taken out of its configuration and knotc reload), it answers REFUSED;
// the controller's SOA poll sees that and asks again for the answers in
// the zone, so their rules go within a few poll intervals instead of
// answering from the removed zone until the refresh at half the TTL. When
// the zone is back, so are the rules.
func TestZoneRemoved(t *testing.T) {
	r := newRig(t, testbed.KindKnot, 0)
	www := "www." + r.zone.Origin
	r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--poll", "200ms")
	proc := r.srv.Proc()
	withZone, err := os.ReadFile(proc.Conf)
	if err != nil {
		t.Fatal(err)
	}
	zoneAt := strings.Index(string(withZone), "\nzone:")
	if zoneAt < 0 {
		t.Fatalf("no zone section in %s", proc.Conf)
	}
	for _, step := range []struct {
		conf   []byte
		want   string // dig +short: nothing for REFUSED
		kernel bool
	}{
		{withZone, testbed.ExampleWWW4.String(), true},
		{withZone[:zoneAt+1], "", false},
		{withZone, testbed.ExampleWWW4.String(), true},
	} {
		if err := os.WriteFile(proc.Conf, step.conf, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(testbed.KnotcPath, "-c", proc.Conf, "reload").CombinedOutput(); err != nil {
			t.Fatalf("knotc reload: %v: %s", err, out)
		}
		deadline := time.Now().Add(10 * time.Second)
		for {
			got, kernel := r.dig(www, "A")
			if got == step.want && kernel == step.kernel {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("10 s after knotc reload: %q, from the rule processor %v; want %q, from it %v", got, kernel, step.want, step.kernel)
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
}

// TestDelegationChange: a referral (the answer for a name below a
// delegation) comes from the zone that holds the delegation, though the
// server answers the name's SOA query with a referral too. The controller
// polls that zone, so when the delegation's glue changes, the rule
// processor sends the new referral within a few poll intervals, not only
// after the refresh at half the TTL.
func TestDelegationChange(t *testing.T) {
	for _, kind := range []string{testbed.KindNSD, testbed.KindKnot} {
		t.Run(kind, func(t *testing.T) {
			r := newRig(t, kind, 0)
			below := "www.sub." + r.zone.Origin
			r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{below}, []uint16{dns.TypeA}),
				"--shape", "rd,ad,edns", "--poll", "200ms")
			v4, _ := r.srv.Addrs()
			// the address of the glue record ns1.sub in the referral, and
			// whether the rule processor sent it
			glue := func() (string, bool) {
				before := r.answered()
				out, err := r.tb.Client.Run("dig", "+nocookie", "+tries=1", "+time=1", "@"+v4.Addr().String(), below, "A", "+noall", "+additional")
				if err != nil {
					return "", false
				}
				for _, line := range strings.Split(out, "\n") {
					if f := strings.Fields(line); len(f) == 5 && f[0] == "ns1.sub."+r.zone.Origin {
						return f[4], r.answered() > before
					}
				}
				return "", false
			}
			for _, want := range []string{"198.18.255.53", "198.18.255.99"} {
				if want == "198.18.255.99" {
					r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, "198.18.255.53", want, 1) })
				}
				deadline := time.Now().Add(10 * time.Second)
				for {
					got, kernel := glue()
					if got == want && kernel {
						break
					}
					if time.Now().After(deadline) {
						t.Fatalf("10 s after the zone with glue %s was loaded: glue %q, from the rule processor %v", want, got, kernel)
					}
					time.Sleep(200 * time.Millisecond)
				}
			}
		})
	}
}

// TestCNAMEIntoAnotherZone: NSD's answer for a CNAME that leads into
// another zone it serves holds that zone's records too, or its NXDOMAIN
// and SOA for a target it lacks (Knot's and BIND's hold only the CNAME),
// and so does its answer to the SOA query for the CNAME's name, with the
// other zone's SOA. The answer comes from both zones: the controller polls
// both, so when the CNAME's target changes or appears in the other zone,
// and then the CNAME itself changes, the rule processor sends the new
// answer within a few poll intervals, not only after the refresh at half
// the TTL.
func TestCNAMEIntoAnotherZone(t *testing.T) {
	other := testbed.Zone{Origin: "other.test.", Records: []string{
		"@   IN SOA ns1.example.test. hostmaster 2024010101 3600 900 604800 300",
		"@   IN NS  ns1.example.test.",
		"www IN A   198.18.253.1",
	}}
	r := newRigWith(t, testbed.KindNSD, rigOptions{moreZones: []testbed.Zone{other},
		extra: []string{"far IN CNAME www.other.test.", "soon IN CNAME new.other.test."}})
	far, soon := "far."+r.zone.Origin, "soon."+r.zone.Origin
	r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{far, soon}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--poll", "200ms")
	for _, step := range []struct {
		change func()
		want   map[string]string // name -> dig +short
	}{
		{func() {}, map[string]string{far: "www.other.test.\n198.18.253.1", soon: "new.other.test."}},
		{func() {
			r.serveChanged(other, "2024010102", func(rec string) string {
				return strings.Replace(rec, "198.18.253.1", "198.18.253.9\nnew IN A 198.18.253.7", 1)
			})
		}, map[string]string{far: "www.other.test.\n198.18.253.9", soon: "new.other.test.\n198.18.253.7"}},
		{func() {
			r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, "www.other.test.", "www", 1) })
		}, map[string]string{far: "www.example.test.\n" + testbed.ExampleWWW4.String()}},
	} {
		step.change()
		for name, want := range step.want {
			deadline := time.Now().Add(10 * time.Second)
			for {
				got, kernel := r.dig(name, "A")
				if got == want && kernel {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s 10 s after the change: %q, from the rule processor %v; want %q from it", name, got, kernel, want)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
	}
}

// TestTTLBound: a rule never outlives its answer's TTL. With a 3-second TTL
// and the server stopped (SIGSTOP), the controller cannot refresh the
// answer, so the rule goes and queries stay unanswered once the TTL is over.
func TestTTLBound(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "short 3 IN A 198.18.255.77")
	short := "short." + r.zone.Origin
	r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{short}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--poll", "0")
	if got, kernel := r.dig(short, "A"); got != "198.18.255.77" || !kernel {
		t.Fatalf("%q, from the rule processor %v", got, kernel)
	}
	r.hangServer()
	// every answer the controller has (it may have refreshed it before the
	// server stopped) was sent before now
	r.waitRulesExpired(time.Now().Add(3 * time.Second))
	if got, kernel := r.dig(short, "A"); got != "" || kernel {
		t.Errorf("after the TTL with the server stopped: %q, from the rule processor %v (want no answer)", got, kernel)
	}
	if n := r.rules(); n != 0 {
		t.Errorf("%d rules after the TTL ran out", n)
	}
}

// TestOneSecondTTLNotOffloaded: a rule ends at the whole second at or
// before its answer's TTL runs out, so that of an answer with a TTL of 1
// s goes before any refresh (a second after the fetch at the earliest).
// Such an answer stays with the server, as one of TTL 0 does. (Its rule
// answered for a fraction of a second, then went, was installed again a
// second later, and so on, four log lines every 3 s per address.)
func TestOneSecondTTLNotOffloaded(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "one 1 IN A 198.18.255.79")
	ctl := r.startController("static", "--port", "53/udp", "--names",
		r.namesFile([]string{"one." + r.zone.Origin, "www." + r.zone.Origin}, []uint16{dns.TypeA}), "--shape", "plain")
	if !strings.Contains(ctl.Ready(), "(2 questions not offloaded)") || !strings.Contains(ctl.Output(), "TTL of one second") {
		t.Errorf("ready line %q, want the TTL-1 answer not offloaded at both addresses, with its reason", ctl.Ready())
	}
	time.Sleep(4 * time.Second)
	for _, churn := range []string{"not refreshed in time", "rules are installed"} {
		if strings.Contains(ctl.Output(), churn) {
			t.Errorf("the TTL-1 answer's rule came and went (%q)", churn)
		}
	}
	if n := r.rules(); n != 2 {
		t.Errorf("%d rules, want www's at both addresses", n)
	}
}

// TestTwoSecondTTLRefreshedInTime: an answer with a TTL of 2 s is
// refreshed every second, just after the second turns, before the
// controller's expiry (300 ms before the TTL runs out, now that it runs
// while the loop waits) would remove it: the kernel answers it all along,
// and its rule never goes.
func TestTwoSecondTTLRefreshedInTime(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "two 2 IN A 198.18.255.80")
	two := "two." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{two}, []uint16{dns.TypeA}), "--shape", "plain")
	r.waitKernelAnswer(two, "A", "198.18.255.80", 5*time.Second, ctl) // dig's query shape learned
	missed := 0
	for end := time.Now().Add(8 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if got, kernel := r.dig(two, "A"); got != "198.18.255.80" || !kernel {
			missed++
		}
	}
	if missed > 0 || strings.Contains(ctl.Output(), "not refreshed in time") || strings.Contains(ctl.Output(), "rules are installed") {
		t.Errorf("%d queries not answered by the kernel; the rule of a 2-s TTL went:\n%s", missed, ctl.Output())
	}
}

// TestStopWithServerHung: with the server stopped (SIGSTOP) while the
// controller asks it for a refresh, each question waits for its tries of
// --timeout (3 × 10 s here); a stop (SIGTERM) ends those questions at once,
// and the controller deletes its rules and exits within 5 s. (It waited
// for the tries: 30 s.)
func TestStopWithServerHung(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "short 2 IN A 198.18.255.78")
	short := "short." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{short}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--poll", "0", "--timeout", "10s")
	r.hangServer()
	// the refresh at half the 2-s TTL: its question waits in the server's queue
	deadline := time.Now().Add(10 * time.Second)
	for !serverQueueHolds(t, r.tb, 53) {
		if time.Now().After(deadline) {
			t.Fatal("no question in the stopped server's queue within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopped := time.Now()
	if err := ctl.Stop(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped %v after SIGTERM", time.Since(stopped).Round(time.Millisecond))
	if n := r.rules(); n != 0 {
		t.Errorf("%d rules left after the stop", n)
	}
}

// serverQueueHolds reports whether a UDP socket bound to port in tb's
// server namespace has datagrams queued (rx_queue in /proc/net/udp, udp6).
func serverQueueHolds(t *testing.T, tb *testbed.Testbed, port uint16) bool {
	t.Helper()
	for _, file := range []string{"/proc/net/udp", "/proc/net/udp6"} {
		out, err := tb.Server.Run("cat", file)
		if err != nil {
			t.Fatalf("%s: %v: %s", file, err, out)
		}
		for _, line := range strings.Split(string(out), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 5 || !strings.HasSuffix(f[1], fmt.Sprintf(":%04X", port)) {
				continue
			}
			if _, rx, _ := strings.Cut(f[4], ":"); strings.Trim(rx, "0") != "" {
				return true
			}
		}
	}
	return false
}

// hangServer stops the server's processes (SIGSTOP) until resume or the
// end of the test: its sockets stay, nothing answers.
func (r *rig) hangServer() (resume func()) {
	r.t.Helper()
	pids, err := r.srv.PIDs()
	if err != nil {
		r.t.Fatal(err)
	}
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGSTOP)
	}
	resume = func() {
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGCONT)
		}
	}
	r.t.Cleanup(resume) // before the server's own stop
	waitStopped(r.t, pids)
	return resume
}

// waitStopped waits until every process of pids is stopped (SIGSTOP
// delivered: state T), at most 5 s.
func waitStopped(t *testing.T, pids []int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for _, p := range pids {
		for {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
			if err != nil {
				t.Fatal(err)
			}
			// pid (comm) state ...: comm may hold spaces and parentheses
			f := strings.Fields(string(stat[strings.LastIndexByte(string(stat), ')')+1:]))
			if len(f) > 0 && f[0] == "T" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("process %d not stopped 5 s after SIGSTOP: %s", p, stat)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
}

// waitRulesExpired waits for santad's rules to go at their Expires time,
// read again each round (a refresh sent before the server stopped may
// still move it), and fails the test if one stays 500 ms past it or if one
// expires after ttlEnd, when the TTL of the last answer the controller can
// have runs out.
func (r *rig) waitRulesExpired(ttlEnd time.Time) {
	r.t.Helper()
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		r.t.Fatal(err)
	}
	defer c.Close()
	var seen uint64 // the latest Expires time listed
	for {
		socks, err := c.ListSockets()
		if err != nil {
			r.t.Fatal(err)
		}
		var n int
		var latest uint64
		for _, s := range socks {
			rules, err := c.ListRules(santa.Cookie(s.Cookie))
			if err != nil {
				r.t.Fatal(err)
			}
			for _, rule := range rules {
				if rule.Expires == 0 || rule.Expires > uint64(ttlEnd.Unix()) {
					r.t.Fatalf("rule %d on socket %d expires at %d, after the answer's TTL runs out (%d)",
						rule.ID, s.Cookie, rule.Expires, ttlEnd.Unix())
				}
				n, latest = n+1, max(latest, rule.Expires)
			}
		}
		if n == 0 {
			if seen == 0 {
				r.t.Fatalf("no rule listed: nothing to expire")
			}
			r.t.Logf("the rules expiring at %d (the TTL ends by %d) went %v after it", seen, ttlEnd.Unix(),
				time.Since(time.Unix(int64(seen), 0)).Round(time.Millisecond))
			return
		}
		seen = max(seen, latest)
		if late := time.Since(time.Unix(int64(latest), 0)); late > 500*time.Millisecond {
			r.t.Fatalf("%d rules %v after they expired (at %d)", n, late.Round(time.Millisecond), latest)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestTTLBoundControllerKilled: the rule carries its answer's expiry, so
// santad removes it when the TTL runs out even after the controller was
// killed (SIGKILL: no chance to delete it); the server answers again.
func TestTTLBoundControllerKilled(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "short 3 IN A 198.18.255.77")
	short := "short." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{short}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--poll", "0")
	if got, kernel := r.dig(short, "A"); got != "198.18.255.77" || !kernel {
		t.Fatalf("%q, from the rule processor %v", got, kernel)
	}
	if err := syscall.Kill(ctl.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := ctl.Stop(5 * time.Second); err == nil {
		t.Fatal("the controller survived SIGKILL")
	}
	died := time.Now()          // every answer the controller had was fetched before
	if n := r.rules(); n != 2 { // one per socket (IPv4, IPv6)
		t.Fatalf("%d rules right after the controller died, want its 2", n)
	}
	r.waitRulesExpired(died.Add(3 * time.Second))
	if got, kernel := r.dig(short, "A"); got != "198.18.255.77" || kernel {
		t.Errorf("after the TTL: %q, from the rule processor %v (want the server's answer)", got, kernel)
	}
	if n := r.rules(); n != 0 {
		t.Errorf("%d rules after the TTL ran out", n)
	}
}

// TestControllerStartedAnew: a controller killed with SIGKILL leaves its
// rules, tagged santa-dns. The one started next as a new process (by a
// supervisor, say) takes over the rule it installs again, deletes the one
// it does not, and leaves another program's rule alone: each socket then
// holds one rule of each, the old run's other name goes to the server, and
// the rule processor answers the new run's name.
func TestControllerStartedAnew(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www, mail := "www."+r.zone.Origin, "mail."+r.zone.Origin
	static := func(names ...string) []string {
		return []string{"static", "--port", "53/udp", "--names", r.namesFile(names, []uint16{dns.TypeA}),
			"--shape", "rd,ad,edns", "--learn-shapes=false"}
	}
	first := r.startController(static(www, mail)...)
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	socks, err := c.ListSockets()
	if err != nil || len(socks) != 2 {
		t.Fatalf("sockets %+v (%v), want NSD's two", socks, err)
	}
	other := api.Rule{Conditions: []api.Condition{santa.Match(0, []byte("other program"))},
		Processors: []api.Processor{santa.Put(0, []byte("x"))}, ReplyLen: 1, Tag: "other-program"}
	for _, s := range socks {
		if _, err := c.Add(santa.Cookie(s.Cookie), []api.Rule{other}); err != nil {
			t.Fatal(err)
		}
	}
	if err := syscall.Kill(first.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(5 * time.Second); err == nil {
		t.Fatal("the controller survived SIGKILL")
	}

	second := r.startController(static(www)...)
	for _, want := range []string{`"taking over the rules a predecessor left" tag=santa-dns rules=4`,
		`"deleted the rules a predecessor left that this run did not install again" tag=santa-dns rules=2`} {
		if !strings.Contains(second.Output(), want) {
			t.Errorf("the second controller did not log %q:\n%s", want, second.Output())
		}
	}
	for _, s := range socks {
		rules, err := c.ListRules(santa.Cookie(s.Cookie))
		if err != nil {
			t.Fatal(err)
		}
		tags := map[string]int{}
		for _, r := range rules {
			tags[r.Tag]++
		}
		if want := map[string]int{"santa-dns": 1, "other-program": 1}; !reflect.DeepEqual(tags, want) {
			t.Errorf("socket %v holds rules tagged %v, want %v", s.AddrPort(), tags, want)
		}
	}
	if got, kernel := r.dig(www, "A"); got != testbed.ExampleWWW4.String() || !kernel {
		t.Errorf("%s: %q, from the rule processor %v", www, got, kernel)
	}
	if got, kernel := r.dig(mail, "A"); got == "" || kernel {
		t.Errorf("%s (offloaded by the killed controller only): %q, from the rule processor %v", mail, got, kernel)
	}
	// a clean stop deletes every rule with its tag, by tag, and no other
	if err := second.Stop(10 * time.Second); err != nil {
		t.Fatalf("stopping the second controller: %v\n%s", err, second.Output())
	}
	for _, s := range socks {
		rules, err := c.ListRules(santa.Cookie(s.Cookie))
		if err != nil {
			t.Fatal(err)
		}
		if len(rules) != 1 || rules[0].Tag != "other-program" {
			t.Errorf("socket %v holds %d rules after the controller stopped (%v); want the other program's only", s.AddrPort(), len(rules), rules)
		}
	}
}

// TestAdaptive: the adaptive controller offloads the question that misses
// often and leaves one-off questions to the server.
func TestAdaptive(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 50)
	adaptive := []string{"adaptive", "--port", "53/udp", "--min-samples", "20", "--interval", "500ms", "--zone", r.zone.Origin}
	first := r.startController(adaptive...)
	v4, _ := r.srv.Addrs()
	s := r.sender(v4, 4)
	hot := new(dns.Msg)
	hot.SetQuestion("www."+r.zone.Origin, dns.TypeA)
	var queries, hots [][]byte
	for i := 0; i < 300; i++ {
		hot.Id = uint16(i + 1)
		b, _ := hot.Pack()
		queries = append(queries, b)
		hots = append(hots, b)
		if i%6 == 0 { // 50 questions asked once each
			cold := new(dns.Msg)
			cold.SetQuestion(testbed.GenName(r.zone.Origin, i/6), dns.TypeA)
			cold.Id = uint16(1000 + i)
			b, _ := cold.Pack()
			queries = append(queries, b)
		}
	}
	s.sendAll(queries)
	deadline := time.Now().Add(10 * time.Second)
	for {
		before := r.answered()
		s.sendAll(hots[:10])
		if r.answered()-before == 10 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the hot question was not offloaded within 10 s (%d rules)", r.rules())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := r.rules(); n != 1 {
		t.Errorf("%d rules, want 1 (the hot question on the IPv4 socket)", n)
	}

	// killed and started anew, the controller installs the question of the
	// rule it left again at once, with no miss to learn from
	if err := syscall.Kill(first.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := first.Stop(5 * time.Second); err == nil {
		t.Fatal("the controller survived SIGKILL")
	}
	second := r.startController(adaptive...)
	if want := "queries=1 rules=1"; !strings.Contains(second.Output(), "installed again the questions of the rules a predecessor left") ||
		!strings.Contains(second.Output(), want) {
		t.Errorf("the second controller did not install the predecessor's question again:\n%s", second.Output())
	}
	before := r.answered()
	s.sendAll(hots[:10])
	if got := r.answered() - before; got != 10 {
		t.Errorf("right after the restart the rule processor answered %d of 10 hot queries", got)
	}
	if n := r.rules(); n != 1 {
		t.Errorf("%d rules after the restart, want 1", n)
	}
}

// TestTop: `santa dns top` offloads the n most popular questions of a
// TestAdaptiveProbesAgainAfterJunk: in adaptive mode the first miss
// decides what the probe asks; when the server refuses it (a name of no
// zone it serves, as authoritative servers get all day), the controller
// probes again with the questions it offloads, and their rules echo RD
// and ignore AD as the server does. (The failed probe stood for the whole
// run: every rule compared every byte, and a query differing from the hot
// one only in RD went to the server.)
func TestAdaptiveProbesAgainAfterJunk(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	ctl := r.startController("adaptive", "--port", "53/udp", "--min-samples", "2")
	v4, _ := r.srv.Addrs()
	dig := func(name string, flags ...string) {
		t.Helper()
		args := append([]string{"+short", "+noedns", "+tries=1", "+time=1", "@" + v4.Addr().String(), name, "A"}, flags...)
		if _, err := r.tb.Client.Run("dig", args...); err != nil {
			t.Fatal(err)
		}
	}
	dig("www.nosuch.test.")
	if err := ctl.WaitOutput("probing the server failed", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	www := "www." + r.zone.Origin
	r.untilLearned("www without RD", func() bool {
		before := r.answered()
		dig(www, "+norec")
		return r.answered() > before
	}, ctl)
	before := r.answered()
	dig(www) // RD set
	if r.answered() == before {
		t.Errorf("a query for www with RD went to the server: the probe did not run again:\n%s", ctl.Output())
	}
}

// query list with counts.
func TestTop(t *testing.T) {
	r := newRig(t, testbed.KindKnot, 0)
	o := r.zone.Origin
	list := filepath.Join(r.dir, "queries")
	if err := os.WriteFile(list, []byte("mail."+o+" A 5\nwww."+o+" A 50\ntxt."+o+" TXT 20\nwww."+o+" AAAA 1\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r.startController("top", "--port", "53/udp", "--queries", list, "--count", "2", "--shape", "rd,edns", "--learn-shapes=false")
	// 2 questions, one shape, on the IPv4 and the IPv6 socket
	if n := r.rules(); n != 4 {
		t.Errorf("%d rules, want 4", n)
	}
	if got, kernel := r.dig("txt."+o, "TXT"); !kernel || !strings.Contains(got, "hello") {
		t.Errorf("txt TXT (2nd most popular): %q, from the rule processor %v", got, kernel)
	}
	if _, kernel := r.dig("mail."+o, "A"); kernel {
		t.Errorf("mail A (3rd) was answered by the rule processor")
	}
}

// TestFollowServerRestart: when the server closes its sockets (a restart),
// santa dns notices at once, even in static mode with no learning: without
// --follow it exits and says why, its done line counting its rules as
// gone with their sockets (it said it removed them); with --follow it
// waits and offloads again once the new server process has its sockets.
func TestFollowServerRestart(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www := "www." + r.zone.Origin
	args := []string{"static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--learn-shapes=false"}
	once := r.startController(args...)
	following := r.startController(append(args, "--follow", "--tag", "santa-dns-follow")...) // one tag per controller on a port
	if got, kernel := r.dig(www, "A"); got != testbed.ExampleWWW4.String() || !kernel {
		t.Fatalf("before the restart: %q, from the rule processor %v", got, kernel)
	}

	zone := r.srv.Proc().Zone
	if err := r.srv.Stop(); err != nil {
		t.Fatal(err)
	}
	exited, err := once.Wait(5 * time.Second)
	if !exited || err == nil || !strings.Contains(once.Output(), "the server closed a socket") ||
		!strings.Contains(once.Output(), "--follow") {
		t.Errorf("without --follow, 5 s after the server stopped: exited %v (%v), output:\n%s", exited, err, once.Output())
	}
	// its 2 rules (IPv4, IPv6) went with the sockets, at least the one
	// whose close it noticed; it may have deleted the other's first
	var removed, gone int
	m := regexp.MustCompile(`done: .* removed (\d+) rules, (\d+) gone with their sockets;`).FindStringSubmatch(once.Output())
	if m != nil {
		removed, _ = strconv.Atoi(m[1])
		gone, _ = strconv.Atoi(m[2])
	}
	if m == nil || gone < 1 || removed+gone != 2 {
		t.Errorf("the done line of the controller without --follow: want its 2 rules counted as removed or gone with their sockets, at least 1 gone:\n%s", once.Output())
	}
	if exited, _ := following.Wait(time.Second); exited {
		t.Fatalf("with --follow the controller exited when the server stopped:\n%s", following.Output())
	}

	srv, err := r.tb.StartDNSServer(testbed.KindNSD, testbed.DNSServerOptions{Zone: &zone})
	if err != nil {
		t.Fatal(err)
	}
	r.srv = srv
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, kernel := r.dig(www, "A")
		if got == testbed.ExampleWWW4.String() && kernel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after the restart: %q, from the rule processor %v; controller output:\n%s", got, kernel, following.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := strings.Count(following.Output(), "ready:"); n != 2 {
		t.Errorf("the following controller was ready %d times, want 2:\n%s", n, following.Output())
	}
}

// TestFollowSantadRestart: santa dns --follow outlives santad. Killed,
// the controller waits; once santad is back, with the rules restored, it
// takes over the rules its first run could not delete (by their tag): each
// socket holds one rule again (no duplicate, which would also cost the
// rule set its disjointness), and the rule processor answers.
func TestFollowSantadRestart(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www := "www." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--follow")
	if got, kernel := r.dig(www, "A"); got != testbed.ExampleWWW4.String() || !kernel {
		t.Fatalf("before santad was killed: %q, from the rule processor %v", got, kernel)
	}
	if err := r.santad.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := ctl.WaitOutput("santad went away", 10*time.Second); err != nil {
		t.Fatalf("with --follow, santad killed: %v", err)
	}
	if err := r.santad.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		got, kernel := r.dig(www, "A")
		if got == testbed.ExampleWWW4.String() && kernel && strings.Count(ctl.Output(), "ready:") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after santad came back: %q, from the rule processor %v; controller output:\n%s", got, kernel, ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	r.santad.ExpectPredecessorTakenOver(t, ctl)
}

// TestSamplingQuietsDown: with --learn-shapes, once the misses showed no
// new shape for --quiet-after, santad samples them at --quiet-sample-rate;
// a new shape is still learned, and it raises the sampling back to
// --sample-rate.
func TestSamplingQuietsDown(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www := "www." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
		"--shape", "plain", "--sample-rate", "1000", "--quiet-sample-rate", "5", "--quiet-after", "4s", "--verbose")
	v4, _ := r.srv.Addrs()
	var client *net.UDPConn
	if err := r.tb.Client.Do(func() (err error) {
		client, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(v4))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// sampled sends 300 queries no rule answers (names the zone does not
	// have, no shape to learn) over 1.5 s, two of each CPU's one-second
	// sampling windows at most, and returns how many santad sampled
	round := 0
	sampled := func() uint64 {
		before := r.counters()["miss_sampled"]
		round++
		for i := range 300 {
			q := new(dns.Msg).SetQuestion(fmt.Sprintf("nx%d-%d.%s", round, i, r.zone.Origin), dns.TypeA)
			wire, err := q.Pack()
			if err != nil {
				t.Fatal(err)
			}
			if _, err := client.Write(wire); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		return r.counters()["miss_sampled"] - before
	}
	if n := sampled(); n < 290 {
		t.Fatalf("at --sample-rate 1000, santad sampled %d of 300 misses, want (nearly) all", n)
	}
	if err := ctl.WaitOutput("samples_per_second_and_cpu=5", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond) // santad narrows the sampling once it sees the old subscription closed
	if n := sampled(); n > 20 {
		t.Fatalf("4 s without a new shape, santad sampled %d of 300 misses over 1.5 s at --quiet-sample-rate 5, want at most 20 (5 per second and CPU)", n)
	}
	// dig's EDNS query is a new shape: learned, and the sampling is back
	ask := func() bool {
		got, kernel := r.dig(www, "A")
		if got == "" {
			t.Fatalf("dig %s: no answer", www)
		}
		return kernel
	}
	ask()
	r.untilLearned("dig's EDNS shape while the sampling is quiet", ask, ctl)
	if err := ctl.WaitOutput("samples_per_second_and_cpu=1000", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	time.Sleep(200 * time.Millisecond)
	if n := sampled(); n < 290 {
		t.Errorf("after a new shape, santad sampled %d of 300 misses, want (nearly) all again", n)
	}
}

// TestStartWithServerHung: a controller started beside a hung server
// (SIGSTOP) finds it silent after one question's tries and then asks one
// question at a time: it is ready after about that long, not after every
// question's tries (here 200 queries to each of two addresses, 8 at a
// time, 3 tries of 300 ms: 45 s). Once the server answers again, every question is offloaded
// within seconds.
func TestStartWithServerHung(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 100)
	names := zoneNames(r.zone, 100)[15:] // the generated names: each has an A record
	resume := r.hangServer()
	start := time.Now()
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile(names, []uint16{dns.TypeA}),
		"--shape", "plain", "--shape", "edns", "--poll", "0", "--timeout", "300ms", "--parallel", "8")
	took := time.Since(start)
	if took > 10*time.Second {
		t.Errorf("ready %v after the start beside a hung server, want less than 10 s", took.Round(time.Millisecond))
	}
	t.Logf("ready %v after the start beside a hung server", took.Round(time.Millisecond))
	if err := ctl.WaitOutput("the server answered nothing for 3 tries of --timeout", time.Second); err != nil {
		t.Error(err)
	}
	resume()
	want := uint64(2 * 2 * len(names)) // two shapes, on the IPv4 and the IPv6 socket
	deadline := time.Now().Add(20 * time.Second)
	for r.rules() < want {
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d rules 20 s after the server answers again:\n%s", r.rules(), want, ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("all %d rules %v after the server was resumed", want, time.Since(deadline.Add(-20*time.Second)).Round(time.Millisecond))
	if err := ctl.WaitOutput("the server answers again", time.Second); err != nil {
		t.Error(err)
	}
	if got, kernel := r.dig(names[0], "A"); got == "" || !kernel {
		t.Errorf("dig %s: %q, from the rule processor %v", names[0], got, kernel)
	}
}
