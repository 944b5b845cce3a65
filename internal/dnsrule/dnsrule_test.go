package dnsrule

import (
	"bytes"
	"errors"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
	"github.com/santa-offload/santa/internal/testbed"
)

// pair is a query and a reply to it as an authoritative server writes it.
func pair(t *testing.T, name string, qtype uint16, id uint16, edns bool) (query, reply []byte) {
	t.Helper()
	q := new(dns.Msg)
	q.SetQuestion(name, qtype)
	q.Id = id
	if edns {
		q.SetEdns0(1232, false)
	}
	r := new(dns.Msg)
	r.SetReply(q)
	r.Authoritative = true
	rr, err := dns.NewRR(name + " 300 IN A 198.18.255.10")
	if err != nil {
		t.Fatal(err)
	}
	r.Answer = append(r.Answer, rr)
	if edns {
		r.SetEdns0(1232, false)
	}
	var err1, err2 error
	query, err1 = q.Pack()
	reply, err2 = r.Pack()
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	return query, reply
}

// apply is what the rule processor does with a rule, in Go: it answers req
// if every condition holds, with a reply written by the processors.
func apply(r dataplane.Rule, req []byte) []byte {
	for _, c := range r.Conditions {
		if c.Offset+len(c.Pattern) > len(req) || !bytes.Equal(req[c.Offset:c.Offset+len(c.Pattern)], c.Pattern) {
			return nil
		}
	}
	out := make([]byte, r.ReplyLen)
	for _, p := range r.Processors {
		switch p.Kind {
		case dataplane.Put:
			copy(out[p.ReplyOffset:], p.Template)
		case dataplane.Copy:
			copy(out[p.ReplyOffset:p.ReplyOffset+p.Length], req[p.SrcOffset:p.SrcOffset+p.Length])
		}
	}
	return out
}

func TestRuleFor(t *testing.T) {
	for _, edns := range []bool{false, true} {
		query, reply := pair(t, "www.example.test.", dns.TypeA, 0x1234, edns)
		rule, err := RuleFor(query, reply)
		if err != nil {
			t.Fatal(err)
		}
		want := dataplane.Rule{
			Conditions: []dataplane.Condition{{Offset: 2, Pattern: query[2:]}},
			Processors: []dataplane.Processor{
				{Kind: dataplane.Copy, ReplyOffset: 0, SrcOffset: 0, Length: 2},
				{Kind: dataplane.Put, ReplyOffset: 2, Template: reply[2:]},
			},
			ReplyLen: len(reply),
		}
		if !equalRule(rule, want) {
			t.Fatalf("edns=%v: rule\n got %+v\nwant %+v", edns, rule, want)
		}
		// the rule owns its bytes
		if &rule.Conditions[0].Pattern[0] == &query[2] || &rule.Processors[1].Template[0] == &reply[2] {
			t.Error("rule aliases the caller's buffers")
		}

		// Any ID gets the server's reply with that ID.
		for _, id := range []uint16{0, 0x1234, 0xbeef, 0xffff} {
			got := apply(rule, SetID(query, id))
			if !bytes.Equal(got, SetID(reply, id)) {
				t.Errorf("edns=%v id %#x: reply\n got %x\nwant %x", edns, id, got, SetID(reply, id))
			}
		}
		// Other questions, flags or case do not match.
		other, _ := pair(t, "mail.example.test.", dns.TypeA, 0x1234, edns)
		aaaa, _ := pair(t, "www.example.test.", dns.TypeAAAA, 0x1234, edns)
		upper, _ := pair(t, "WWW.example.test.", dns.TypeA, 0x1234, edns)
		rd := bytes.Clone(query)
		rd[2] ^= 0x01 // RD
		for name, q := range map[string][]byte{"other name": other, "other type": aaaa, "other case": upper, "RD flipped": rd} {
			if apply(rule, q) != nil {
				t.Errorf("edns=%v: %s matched", edns, name)
			}
		}
	}
	// The EDNS and plain queries are different rules.
	q1, _ := pair(t, "www.example.test.", dns.TypeA, 1, false)
	q2, r2 := pair(t, "www.example.test.", dns.TypeA, 1, true)
	rule, _ := RuleFor(q2, r2)
	if apply(rule, q1) != nil {
		t.Error("rule for an EDNS query answers the query without EDNS")
	}
}

func equalRule(a, b dataplane.Rule) bool {
	if a.ReplyLen != b.ReplyLen || a.Priority != b.Priority || len(a.Conditions) != len(b.Conditions) || len(a.Processors) != len(b.Processors) {
		return false
	}
	for i := range a.Conditions {
		if a.Conditions[i].Offset != b.Conditions[i].Offset || !bytes.Equal(a.Conditions[i].Pattern, b.Conditions[i].Pattern) {
			return false
		}
	}
	for i := range a.Processors {
		p, q := a.Processors[i], b.Processors[i]
		if p.Kind != q.Kind || p.ReplyOffset != q.ReplyOffset || p.SrcOffset != q.SrcOffset || p.Length != q.Length || !bytes.Equal(p.Template, q.Template) {
			return false
		}
	}
	return true
}

func TestAPIRule(t *testing.T) {
	query, reply := pair(t, "www.example.test.", dns.TypeA, 0x1234, true)
	rule, err := RuleFor(query, reply)
	if err != nil {
		t.Fatal(err)
	}
	rule.Priority = 3
	got := APIRule(rule)
	want := api.Rule{
		Conditions: []api.Condition{{Offset: 2, Pattern: query[2:]}},
		Processors: []api.Processor{
			{Kind: api.KindCopy, ReplyOffset: 0, SrcOffset: 0, Length: 2},
			{Kind: api.KindPut, ReplyOffset: 2, Template: reply[2:]},
		},
		ReplyLen: uint32(len(reply)),
		Priority: 3,
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %+v\nwant %+v", got, want)
	}
}

func TestRuleForRefuses(t *testing.T) {
	query, reply := pair(t, "www.example.test.", dns.TypeA, 0x1234, true)
	_, otherR := pair(t, "mail.example.test.", dns.TypeA, 0x1234, true)
	flip := func(b []byte, i int, mask byte) []byte {
		c := bytes.Clone(b)
		c[i] ^= mask
		return c
	}
	// a query whose EDNS padding makes it longer than a condition can be
	long := new(dns.Msg)
	long.SetQuestion("www.example.test.", dns.TypeA)
	long.Id = 0x1234
	long.SetEdns0(1232, false)
	long.IsEdns0().Option = append(long.IsEdns0().Option, &dns.EDNS0_PADDING{Padding: make([]byte, 1100)})
	longQ, _ := long.Pack()
	longRM := new(dns.Msg)
	longRM.SetReply(long)
	longR, _ := longRM.Pack()
	// a reply too big for one frame
	big := new(dns.Msg)
	big.SetQuestion("www.example.test.", dns.TypeTXT)
	big.Id = 0x1234
	bigQ, _ := big.Pack()
	bigRM := new(dns.Msg)
	bigRM.SetReply(big)
	for i := 0; i < 8; i++ {
		rr, _ := dns.NewRR(`www.example.test. 300 IN TXT "` + strings.Repeat("x", 250) + `"`)
		bigRM.Answer = append(bigRM.Answer, rr)
	}
	bigR, _ := bigRM.Pack()

	for name, c := range map[string][2][]byte{
		"garbage query":    {[]byte("hello, world"), reply},
		"garbage reply":    {query, []byte("hello, world")},
		"short query":      {query[:5], reply},
		"query is a reply": {reply, reply},
		"reply is a query": {query, query},
		"other ID":         {query, flip(reply, 1, 0x01)},
		"other question":   {query, otherR},
		"too long query":   {longQ, longR},
		"too big reply":    {bigQ, bigR},
	} {
		if _, err := RuleFor(c[0], c[1]); !errors.Is(err, ErrNotAnswer) {
			t.Errorf("%s: err %v, want ErrNotAnswer", name, err)
		} else {
			t.Logf("%s: %v", name, err)
		}
	}
}

func TestDigArgs(t *testing.T) {
	got := strings.Join(DigArgs(netip.MustParseAddrPort("[2001:2::1]:5353"), "www.example.test", "A", "+short"), " ")
	want := "+nocookie +tries=1 +time=1 -p 5353 @2001:2::1 www.example.test A +short"
	if got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

// TestRecordDigQuery records what dig sends (in a namespace of its own) and
// shows that with +nocookie two runs send the same bytes but for the ID,
// which is what makes a rule built from one run match the next.
func TestRecordDigQuery(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (network namespaces)")
	}
	if _, err := exec.LookPath("dig"); err != nil {
		t.Fatal("dig not found (Debian package dnsutils; scripts/install-deps.sh installs it)")
	}
	tb := testbed.New(t)
	record := func(extra ...string) []byte {
		t.Helper()
		pc, err := tb.Client.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		defer pc.Close()
		var out string
		q, err := RecordQuery(pc, 5*time.Second, func(server netip.AddrPort) error {
			var err error
			out, err = tb.Client.Run("dig", DigArgs(server, "www.example.test", "A", extra...)...)
			return err
		})
		if err != nil {
			t.Fatalf("%v (dig said: %s)", err, out)
		}
		if len(extra) == 0 && !strings.Contains(out, "REFUSED") {
			t.Errorf("dig did not see the REFUSED answer: %s", out)
		}
		return q
	}
	a, b := record(), record()
	if len(a) < 12 || !bytes.Equal(a[2:], b[2:]) {
		t.Fatalf("two dig runs sent different queries:\n%x\n%x", a, b)
	}
	var m dns.Msg
	if err := m.Unpack(a); err != nil {
		t.Fatal(err)
	}
	if len(m.Question) != 1 || m.Question[0].Name != "www.example.test." || m.Question[0].Qtype != dns.TypeA {
		t.Errorf("recorded %v", m.Question)
	}
	if opt := m.IsEdns0(); opt != nil {
		for _, o := range opt.Option {
			if o.Option() == dns.EDNS0COOKIE {
				t.Errorf("dig sent a cookie despite +nocookie: %v", o)
			}
		}
	}
	// display options do not change the query
	if c := record("+noall", "+answer"); !bytes.Equal(a[2:], c[2:]) {
		t.Errorf("+noall +answer changed the query:\n%x\n%x", a, c)
	}
	t.Logf("dig's query (%d bytes): %x\n%s", len(a), a, m.String())

	// Nothing arrives: an error, bounded by the timeout.
	pc, err := tb.Client.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	start := time.Now()
	if _, err := RecordQuery(pc, 300*time.Millisecond, func(netip.AddrPort) error { return nil }); err == nil {
		t.Error("no query: no error")
	}
	if time.Since(start) > 2*time.Second {
		t.Errorf("RecordQuery took %v with a 300ms timeout", time.Since(start))
	}
}

// TestExchangeAndFromServer: Exchange skips stray datagrams (late replies
// with other IDs, runts) and FromServer turns the server's reply into a rule.
// The server is a Go responder in the server namespace of a testbed.
func TestExchangeAndFromServer(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root (network namespaces)")
	}
	tb := testbed.New(t)
	addr := netip.AddrPortFrom(tb.Server.IP4, 5300)
	srv, err := tb.Server.ListenUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	query, reply := pair(t, "www.example.test.", dns.TypeA, 0x1234, true)
	go func() {
		buf := make([]byte, 1500)
		for i := 0; i < 2; i++ { // answers two queries
			n, from, err := srv.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if !bytes.Equal(buf[:n], query) {
				srv.WriteToUDPAddrPort([]byte("unexpected query"), from)
				continue
			}
			srv.WriteToUDPAddrPort(SetID(reply, 0x1233), from) // late answer to an earlier query
			srv.WriteToUDPAddrPort([]byte{0x12}, from)         // runt
			srv.WriteToUDPAddrPort(reply, from)
		}
	}()
	c, err := tb.DialUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	got, err := Exchange(c, query, 2*time.Second)
	if err != nil || !bytes.Equal(got, reply) {
		t.Fatalf("Exchange: %x, %v; want %x", got, err, reply)
	}
	c2, err := tb.DialUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	rule, got, err := FromServer(c2, query, 2*time.Second)
	if err != nil || !bytes.Equal(got, reply) {
		t.Fatalf("FromServer: %x, %v; want %x", got, err, reply)
	}
	if want, _ := RuleFor(query, reply); !equalRule(rule, want) {
		t.Errorf("FromServer rule %+v, want %+v", rule, want)
	}
	// no answer: an error once the timeout passes
	c3, err := tb.DialUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c3.Close()
	start := time.Now()
	if _, _, err := FromServer(c3, query, 300*time.Millisecond); err == nil {
		t.Error("no answer: no error")
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("timeout of 300ms took %v", d)
	}
	if _, err := Exchange(c3, []byte{1, 2, 3}, time.Second); !errors.Is(err, ErrNotAnswer) {
		t.Errorf("short query: %v", err)
	}
}
