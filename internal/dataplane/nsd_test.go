// External test package: dnsrule (which builds the rules) imports dataplane,
// so an in-package test could not import dnsrule. This test uses only the
// data plane's public API, as santad will.
package dataplane_test

import (
	"bytes"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/dataplane"
	"github.com/santa-offload/santa/internal/dnsrule"
	"github.com/santa-offload/santa/internal/sockets"
	"github.com/santa-offload/santa/internal/testbed"
)

// nsdNeeds fails the test (never skips it) when something it needs is missing.
func nsdNeeds(t *testing.T, tools ...string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces, XDP, pidfd_getfd on NSD")
	}
	for _, tool := range tools {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install it with scripts/install-deps.sh (%v)", tool, err)
		}
	}
}

// nsdBed is a real NSD in the server namespace of a testbed, Santa attached
// to the server veth, and a rule set on each of NSD's UDP sockets.
type nsdBed struct {
	t      *testing.T
	tb     *testbed.Testbed
	nsd    *testbed.NSD
	d      *dataplane.Dataplane
	cookie map[bool]uint64         // by v6
	server map[bool]netip.AddrPort // by v6
}

func newNSDBed(t *testing.T) *nsdBed {
	nsdNeeds(t, testbed.NSDPath, "dig", "ip")
	tb := testbed.New(t)
	nsd, err := tb.StartNSD(testbed.NSDOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b := &nsdBed{t: t, tb: tb, nsd: nsd,
		cookie: map[bool]uint64{},
		server: map[bool]netip.AddrPort{false: nsd.Addr4, true: nsd.Addr6}}

	// NSD's own sockets, found through its fds.
	socks, err := sockets.FindUDPSockets(nsd.PID(), 53)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sockets.CloseAll(socks) })
	for _, s := range socks {
		t.Logf("NSD pid %d: UDP socket %v cookie %#x", nsd.PID(), s.Local, s.Cookie)
		for v6, a := range b.server {
			if s.Local == a {
				if _, dup := b.cookie[v6]; dup {
					t.Fatalf("two sockets on %v", a)
				}
				b.cookie[v6] = s.Cookie
			}
		}
	}
	if len(socks) != 2 || len(b.cookie) != 2 {
		t.Fatalf("NSD's UDP sockets: %+v, want one on %v and one on %v", socks, nsd.Addr4, nsd.Addr6)
	}

	b.d, err = dataplane.Load(dataplane.Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { b.d.Close() })
	var att *dataplane.Attachment
	if err := tb.Server.Do(func() error {
		var err error
		att, err = b.d.Attach(tb.Server.Dev, dataplane.AttachAuto)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { att.Close() })
	t.Logf("Santa attached to %s (native XDP: %v)", tb.Server.Dev, att.Native)
	for _, c := range b.cookie {
		if err := b.d.Bind(dataplane.Socket{Cookie: c, Protocol: syscall.IPPROTO_UDP, Port: 53}, dataplane.SampleOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

func nsdFamily(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// query packs a query as miekg/dns sends it (RD off, optionally EDNS).
func nsdQuery(t *testing.T, name string, qtype uint16, id uint16, edns bool) []byte {
	t.Helper()
	m := new(dns.Msg)
	m.SetQuestion(name, qtype)
	m.RecursionDesired = false
	m.Id = id
	if edns {
		m.SetEdns0(1232, false)
	}
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// ask sends query from a fresh client socket and returns the reply.
func (b *nsdBed) ask(v6 bool, query []byte, timeout time.Duration) ([]byte, error) {
	c, err := b.tb.DialUDP(b.server[v6])
	if err != nil {
		b.t.Fatal(err)
	}
	defer c.Close()
	return dnsrule.Exchange(c, query, timeout)
}

// offload asks NSD for the reply to query and installs the rule that gives
// it; it returns the rule and NSD's reply.
func (b *nsdBed) offload(v6 bool, query []byte) (dataplane.RuleID, []byte) {
	b.t.Helper()
	c, err := b.tb.DialUDP(b.server[v6])
	if err != nil {
		b.t.Fatal(err)
	}
	defer c.Close()
	rule, reply, err := dnsrule.FromServer(c, query, 2*time.Second)
	if err != nil {
		b.t.Fatalf("over %s: %v", nsdFamily(v6), err)
	}
	ids, err := b.d.AddRules(b.cookie[v6], []dataplane.Rule{rule})
	if err != nil {
		b.t.Fatal(err)
	}
	return ids[0], reply
}

type nsdSnapshot struct {
	c    map[string]uint64
	hits map[dataplane.RuleID]uint64
}

func (b *nsdBed) snapshot() nsdSnapshot {
	b.t.Helper()
	c, err := b.d.Counters()
	if err != nil {
		b.t.Fatal(err)
	}
	s := nsdSnapshot{c: dataplane.CounterNames(c), hits: map[dataplane.RuleID]uint64{}}
	for _, cookie := range b.cookie {
		st, err := b.d.RuleStats(cookie)
		if err != nil {
			b.t.Fatal(err)
		}
		for id, rs := range st {
			s.hits[id] = rs.Hits
		}
	}
	return s
}

// moved checks that since before, exactly the named counters moved, by
// the given amounts (answered and pass_no_match are always checked), and
// that only rule hit (if non-zero) gained hits, by the given amount.
func (b *nsdBed) moved(what string, before nsdSnapshot, counters map[string]uint64, hit dataplane.RuleID, hits uint64) {
	b.t.Helper()
	after := b.snapshot()
	want := map[string]uint64{"answered": 0, "pass_no_match": 0}
	for k, v := range counters {
		want[k] = v
	}
	for k, v := range want {
		if got := after.c[k] - before.c[k]; got != v {
			b.t.Errorf("%s: counter %s moved by %d, want %d", what, k, got, v)
		}
	}
	for id, h := range after.hits {
		w := uint64(0)
		if id == hit {
			w = hits
		}
		if got := h - before.hits[id]; got != w {
			b.t.Errorf("%s: rule %d hits moved by %d, want %d", what, id, got, w)
		}
	}
}

type nsdName struct {
	name  string
	qtype uint16
	edns  bool
}

func (n nsdName) String() string { return n.name + " " + dns.TypeToString[n.qtype] }

// fromXDP checks that query (with a fresh ID) is answered by rule id with
// want (NSD's reply), byte for byte but for the ID.
func (b *nsdBed) fromXDP(v6 bool, what string, query, want []byte, id dataplane.RuleID, newID uint16) {
	b.t.Helper()
	before := b.snapshot()
	q := dnsrule.SetID(query, newID)
	got, err := b.ask(v6, q, time.Second)
	if err != nil {
		b.t.Errorf("%s over %s: %v", what, nsdFamily(v6), err)
		return
	}
	if !bytes.Equal(got, dnsrule.SetID(want, newID)) {
		b.t.Errorf("%s over %s: reply differs from NSD's (but for the ID):\n got %x\nwant %x", what, nsdFamily(v6), got, dnsrule.SetID(want, newID))
	}
	b.moved(what+" over "+nsdFamily(v6), before, map[string]uint64{"answered": 1}, id, 1)
}

// fromNSD checks that query misses every rule and is answered by NSD; it
// returns NSD's answer.
func (b *nsdBed) fromNSD(v6 bool, what string, query []byte) *dns.Msg {
	b.t.Helper()
	before := b.snapshot()
	got, err := b.ask(v6, query, 2*time.Second)
	if err != nil {
		b.t.Errorf("%s over %s: %v", what, nsdFamily(v6), err)
		return nil
	}
	b.moved(what+" over "+nsdFamily(v6), before, map[string]uint64{"pass_no_match": 1}, 0, 0)
	m := new(dns.Msg)
	if err := m.Unpack(got); err != nil {
		b.t.Errorf("%s over %s: NSD's reply does not parse: %v", what, nsdFamily(v6), err)
		return nil
	}
	return m
}

// answers renders the answer section as "name TTL class type data" lines.
func nsdAnswers(m *dns.Msg) string {
	if m == nil {
		return "<nil>"
	}
	var lines []string
	for _, rr := range m.Answer {
		lines = append(lines, strings.Join(strings.Fields(rr.String()), " "))
	}
	if len(lines) == 0 {
		return dns.RcodeToString[m.Rcode]
	}
	return strings.Join(lines, "\n")
}

// digRecord learns the exact query dig sends for name/qtype with args.
func (b *nsdBed) digRecord(name, qtype string, extra ...string) []byte {
	b.t.Helper()
	pc, err := b.tb.Client.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		b.t.Fatal(err)
	}
	defer pc.Close()
	q, err := dnsrule.RecordQuery(pc, 5*time.Second, func(srv netip.AddrPort) error {
		_, err := b.tb.Client.Run("dig", dnsrule.DigArgs(srv, name, qtype, extra...)...)
		return err
	})
	if err != nil {
		b.t.Fatal(err)
	}
	return q
}

// dig runs dig in the client namespace and returns its normalised output.
func (b *nsdBed) dig(v6 bool, name, qtype string, extra ...string) (string, error) {
	out, err := b.tb.Client.Run("dig", dnsrule.DigArgs(b.server[v6], name, qtype, extra...)...)
	var lines []string
	for _, l := range strings.Split(out, "\n") {
		if f := strings.Fields(l); len(f) > 0 {
			lines = append(lines, strings.Join(f, " "))
		}
	}
	return strings.Join(lines, "\n"), err
}

// TestNSDOffload runs a real NSD behind Santa. Rules built from NSD's own
// replies answer their names from XDP, byte for byte as NSD would but for
// the ID; every other query reaches NSD; over IPv4 and IPv6; with miekg/dns
// and with dig. Finally NSD is stopped with SIGSTOP: the offloaded names
// still get answers, the others time out.
func TestNSDOffload(t *testing.T) {
	b := newNSDBed(t)
	const zone = testbed.ZoneOrigin
	offloaded := []nsdName{
		{"www." + zone, dns.TypeA, false},
		{"www." + zone, dns.TypeAAAA, false},
		{"txt." + zone, dns.TypeTXT, true},
	}
	plain := map[nsdName]string{ // what NSD answers
		{"mail." + zone, dns.TypeA, false}:        "mail." + zone + " 300 IN A 198.18.255.25",
		{zone, dns.TypeMX, true}:                  zone + " 300 IN MX 10 mail." + zone,
		{"nonexistent." + zone, dns.TypeA, false}: "NXDOMAIN",
		{"WWW." + zone, dns.TypeA, false}:         "WWW." + zone + " 300 IN A 198.18.255.10", // names are matched byte for byte
		{"www." + zone, dns.TypeA, true}:          "www." + zone + " 300 IN A 198.18.255.10", // the rule is for the query without EDNS
	}
	// a rule on the IPv4 socket only: never answers over IPv6
	v4only := nsdName{"mail." + zone, dns.TypeAAAA, false}

	type installed struct {
		id    dataplane.RuleID
		query []byte
		reply []byte
	}
	rules := map[bool]map[nsdName]installed{false: {}, true: {}}
	for _, v6 := range []bool{false, true} {
		for i, n := range offloaded {
			q := nsdQuery(t, n.name, n.qtype, uint16(0x100+i), n.edns)
			id, reply := b.offload(v6, q)
			rules[v6][n] = installed{id, q, reply}
			var m dns.Msg
			if err := m.Unpack(reply); err != nil || m.Rcode != dns.RcodeSuccess || len(m.Answer) == 0 {
				t.Fatalf("NSD's reply for %v: %v %v", n, err, &m)
			}
			t.Logf("%s: rule %d for %v: %d-byte query -> %d-byte reply: %s", nsdFamily(v6), id, n, len(q), len(reply), nsdAnswers(&m))
		}
	}
	q := nsdQuery(t, v4only.name, v4only.qtype, 0x200, v4only.edns)
	id, reply := b.offload(false, q)
	rules[false][v4only] = installed{id, q, reply}

	t.Run("offloaded", func(t *testing.T) {
		for _, v6 := range []bool{false, true} {
			for _, n := range append(offloaded, v4only) {
				r, ok := rules[v6][n]
				if !ok {
					continue
				}
				for _, id := range []uint16{0xbeef, 0x0001} {
					b.fromXDP(v6, n.String(), r.query, r.reply, r.id, id)
				}
			}
		}
	})

	t.Run("not offloaded", func(t *testing.T) {
		for _, v6 := range []bool{false, true} {
			for n, want := range plain {
				m := b.fromNSD(v6, n.String(), nsdQuery(t, n.name, n.qtype, 0x300, n.edns))
				if got := nsdAnswers(m); got != want {
					t.Errorf("%v over %s: NSD answered %q, want %q", n, nsdFamily(v6), got, want)
				}
			}
		}
		// the IPv4 socket's rule does not answer the same query over IPv6
		m := b.fromNSD(true, "IPv4-only rule", dnsrule.SetID(rules[false][v4only].query, 0x301))
		if got, want := nsdAnswers(m), "mail."+zone+" 300 IN AAAA 2001:2:0:ff::25"; got != want {
			t.Errorf("IPv4-only rule over IPv6: NSD answered %q, want %q", got, want)
		}
	})

	// dig: learn the exact bytes dig sends, ask NSD with them, install the
	// rule, then let dig ask for real.
	digName, digType := "www."+zone, "A"
	digWant := "www." + zone + " 300 IN A 198.18.255.10"
	digRules := map[bool]dataplane.RuleID{}
	t.Run("dig", func(t *testing.T) {
		dq := b.digRecord(digName, digType, "+noall", "+answer")
		for _, v6 := range []bool{false, true} {
			id, _ := b.offload(v6, dq)
			digRules[v6] = id
			before := b.snapshot()
			out, err := b.dig(v6, digName, digType, "+noall", "+answer")
			if err != nil || out != digWant {
				t.Errorf("dig over %s: %q, %v; want %q", nsdFamily(v6), out, err, digWant)
			}
			b.moved("dig "+digName+" over "+nsdFamily(v6), before, map[string]uint64{"answered": 1}, id, 1)
			t.Logf("dig @%s %s %s (from XDP, rule %d): %s", b.server[v6].Addr(), digName, digType, id, out)

			before = b.snapshot()
			out, err = b.dig(v6, "mail."+zone, "A", "+noall", "+answer")
			if want := "mail." + zone + " 300 IN A 198.18.255.25"; err != nil || out != want {
				t.Errorf("dig mail over %s: %q, %v; want %q", nsdFamily(v6), out, err, want)
			}
			b.moved("dig mail over "+nsdFamily(v6), before, map[string]uint64{"pass_no_match": 1}, 0, 0)
		}
	})

	// Prove the kernel answered: with NSD stopped, the offloaded names
	// still get their answers and the others time out.
	t.Run("NSD stopped", func(t *testing.T) {
		pids, err := b.nsd.PIDs()
		if err != nil {
			t.Fatal(err)
		}
		cont := func() {
			for _, p := range pids {
				syscall.Kill(p, syscall.SIGCONT) // NSD's own processes, by pid
			}
		}
		defer cont()
		for _, p := range pids {
			if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
				t.Fatalf("SIGSTOP nsd %d: %v", p, err)
			}
		}
		t.Logf("NSD stopped (pids %v)", pids)
		for _, v6 := range []bool{false, true} {
			for _, n := range offloaded {
				r := rules[v6][n]
				b.fromXDP(v6, "stopped NSD: "+n.String(), r.query, r.reply, r.id, 0x4242)
			}
			before := b.snapshot()
			out, err := b.dig(v6, digName, digType, "+noall", "+answer")
			if err != nil || out != digWant {
				t.Errorf("stopped NSD: dig over %s: %q, %v; want %q", nsdFamily(v6), out, err, digWant)
			}
			b.moved("stopped NSD: dig over "+nsdFamily(v6), before, map[string]uint64{"answered": 1}, digRules[v6], 1)

			n := nsdName{"mail." + zone, dns.TypeA, false}
			before = b.snapshot()
			if got, err := b.ask(v6, nsdQuery(t, n.name, n.qtype, 0x500, false), 300*time.Millisecond); err == nil {
				t.Errorf("stopped NSD: %v over %s was answered: %x", n, nsdFamily(v6), got)
			}
			b.moved("stopped NSD: "+n.String()+" over "+nsdFamily(v6), before, map[string]uint64{"pass_no_match": 1}, 0, 0)
			out, err = b.dig(v6, "mail."+zone, "A", "+noall", "+answer")
			if err == nil {
				t.Errorf("stopped NSD: dig mail over %s answered: %q", nsdFamily(v6), out)
			}
		}
		cont()
		// NSD works again (it first answers what queued up while stopped).
		for _, v6 := range []bool{false, true} {
			var got []byte
			var err error
			for i := 0; i < 10 && got == nil; i++ {
				got, err = b.ask(v6, nsdQuery(t, "mail."+zone, dns.TypeA, uint16(0x600+i), false), time.Second)
			}
			if err != nil {
				t.Errorf("NSD continued: no answer over %s: %v", nsdFamily(v6), err)
			}
		}
	})

	c, err := b.d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	var nz []string
	for k, v := range dataplane.CounterNames(c) {
		if v != 0 {
			nz = append(nz, fmt.Sprintf("%s=%d", k, v))
		}
	}
	t.Logf("counters: %s", strings.Join(nz, " "))
}
