package dnsctl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/santa-offload/santa/api"
)

func mustShape(t *testing.T, text string) Shape {
	t.Helper()
	s, err := ParseShape(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func mustQuery(t *testing.T, shape, name string, qtype uint16) *Query {
	t.Helper()
	wire, err := mustShape(t, shape).Query(0x1234, name, qtype)
	if err != nil {
		t.Fatal(err)
	}
	q, err := ParseQuery(wire)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

func TestShapeRoundTrip(t *testing.T) {
	for _, text := range []string{"plain", "rd", "rd,ad,cd", "edns=1232", "edns=4096,do", "rd,edns=1232,cookie", "edns=512,nsid", "cd,edns=1232,do,cookie"} {
		q := mustQuery(t, text, "Www.Example.test", dns.TypeAAAA)
		if got := ShapeOf(q).String(); got != text {
			t.Errorf("shape %q came back as %q", text, got)
		}
		if q.Name != "Www.Example.test." || q.Type != dns.TypeAAAA {
			t.Errorf("%s: question %s %d", text, q.Name, q.Type)
		}
		// miekg/dns reads the same message
		var m dns.Msg
		if err := m.Unpack(q.Wire); err != nil || m.Id != 0x1234 || (m.IsEdns0() != nil) != q.EDNS {
			t.Errorf("%s: miekg/dns reads %v (err %v)", text, m.String(), err)
		}
	}
	for _, bad := range []string{"", "edns=70000", "edns=x", "rd,foo", "do=1"} {
		if _, err := ParseShape(bad); err == nil {
			t.Errorf("ParseShape(%q) accepted", bad)
		}
	}
}

func TestParseQueryRefuses(t *testing.T) {
	base := mustQuery(t, "edns", "a.example.test", dns.TypeA).Wire
	edit := func(f func(w []byte) []byte) []byte { return f(bytes.Clone(base)) }
	cases := map[string][]byte{
		"short":         base[:11],
		"no question":   base[:12],
		"response":      edit(func(w []byte) []byte { w[2] |= 0x80; return w }),
		"notify opcode": edit(func(w []byte) []byte { w[2] |= 4 << 3; return w }),
		"TC set":        edit(func(w []byte) []byte { w[2] |= 2; return w }),
		"Z set":         edit(func(w []byte) []byte { w[3] |= 0x40; return w }),
		"two questions": edit(func(w []byte) []byte { binary.BigEndian.PutUint16(w[4:], 2); return w }),
		"answer record": edit(func(w []byte) []byte { binary.BigEndian.PutUint16(w[6:], 1); return w }),
		"trailing byte": append(bytes.Clone(base), 0),
		"edns version 1": edit(func(w []byte) []byte {
			w[len(w)-5] = 1 // OPT TTL: ext-rcode, version, flags; then RDLENGTH
			return w
		}),
	}
	plain := mustQuery(t, "plain", "a.example.test", dns.TypeA).Wire
	cases["plain with trailing bytes"] = append(bytes.Clone(plain), 1, 2, 3)
	for name, wire := range cases {
		if _, err := ParseQuery(wire); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// reply builds a server-style reply to q with one A record of ttl.
func reply(t *testing.T, q *Query, ttl uint32, extra func(m *dns.Msg)) []byte {
	t.Helper()
	var qm dns.Msg
	if err := qm.Unpack(q.Wire); err != nil {
		t.Fatal(err)
	}
	m := new(dns.Msg)
	m.SetReply(&qm)
	m.Authoritative = true
	m.Compress = true
	rr, err := dns.NewRR(fmt.Sprintf("%s %d IN A 198.18.0.1", q.Name, ttl))
	if err != nil {
		t.Fatal(err)
	}
	m.Answer = append(m.Answer, rr)
	if o := qm.IsEdns0(); o != nil {
		m.SetEdns0(1232, o.Do())
	}
	if extra != nil {
		extra(m)
	}
	out, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestCheckReply(t *testing.T) {
	q := mustQuery(t, "rd,edns", "www.example.test", dns.TypeA)
	a, err := CheckReply(q, reply(t, q, 300, nil), 4)
	if err != nil || a.TTL.Seconds() != 300 {
		t.Fatalf("good reply: %v, ttl %v", err, a.TTL)
	}
	bad := map[string][]byte{
		"TTL 0":     reply(t, q, 0, nil),
		"TTL 1":     reply(t, q, 1, nil),
		"truncated": reply(t, q, 300, func(m *dns.Msg) { m.Truncated = true }),
		"servfail":  reply(t, q, 300, func(m *dns.Msg) { m.Rcode = dns.RcodeServerFailure }),
		"no EDNS":   reply(t, q, 300, func(m *dns.Msg) { m.Extra = nil }),
		"server cookie": reply(t, q, 300, func(m *dns.Msg) {
			m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0102030405060708aabbccddeeff0011"})
		}),
		"other ID": func() []byte { r := reply(t, q, 300, nil); r[0] ^= 1; return r }(),
		"too big for the client": reply(t, q, 300, func(m *dns.Msg) {
			for i := 0; i < 200; i++ {
				m.Answer = append(m.Answer, m.Answer[0])
			}
		}),
	}
	for name, r := range bad {
		if _, err := CheckReply(q, r, 4); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	upper := mustQuery(t, "rd,edns", "WWW.example.test", dns.TypeA)
	if _, err := CheckReply(upper, reply(t, q, 300, nil), 4); err == nil {
		t.Errorf("a reply for another letter case of the question was accepted")
	}
}

func TestRuleShape(t *testing.T) {
	q := mustQuery(t, "rd,edns,cookie", "www.example.test", dns.TypeA)
	a, err := CheckReply(q, reply(t, q, 300, nil), 4)
	if err != nil {
		t.Fatal(err)
	}
	exact := Rule(q, a, Behaviour{})
	if len(exact.Conditions) != 1 || exact.Conditions[0].Offset != 2 || !bytes.Equal(exact.Conditions[0].Pattern, q.Wire[2:]) {
		t.Errorf("exact rule conditions: %+v", exact.Conditions)
	}
	if exact.MinLen != uint32(len(q.Wire)) || exact.MaxLen != exact.MinLen {
		t.Errorf("length bounds %d..%d, want %d", exact.MinLen, exact.MaxLen, len(q.Wire))
	}
	b := Behaviour{Echo: flagRD | flagCD, Ignore: flagAD, IgnoresCookie: true, IgnoresSize: true}
	a.AnySize = true
	general := Rule(q, a, b)
	// flags (masked), body up to the UDP size, then to the cookie, none after it
	if n := len(general.Conditions); n != 3 {
		t.Fatalf("%d conditions: %+v", n, general.Conditions)
	}
	f := general.Conditions[0]
	if f.Offset != 2 || !bytes.Equal(f.Mask, []byte{0xfe, 0xcf}) || !bytes.Equal(f.Pattern, []byte{0, 0}) {
		t.Errorf("flags condition %+v", f)
	}
	last := general.Conditions[2]
	if end := int(last.Offset) + len(last.Pattern); end != q.cookieData {
		t.Errorf("last condition ends at %d, the cookie starts at %d", end, q.cookieData)
	}
	echo := general.Processors[len(general.Processors)-1]
	if !bytes.Equal(echo.Mask, []byte{0x01, 0x10}) || echo.SrcOffset != 2 || echo.ReplyOffset != 2 {
		t.Errorf("echo processor %+v", echo)
	}
	// a query differing only in what the rule generalises over has the same form key
	other := mustQuery(t, "ad,cd,edns,cookie", "www.example.test", dns.TypeA)
	copy(other.Wire[other.cookieData:], "87654321")
	if formKey(q, b) != formKey(other, b) {
		t.Errorf("form keys differ for queries differing in echoed bits and cookie")
	}
	if formKey(q, Behaviour{}) == formKey(other, Behaviour{}) {
		t.Errorf("form keys equal though nothing is generalised")
	}
}

// TestQueryOf: the query rebuilt from a rule has the rule's question and
// gets a rule with the same match key, whatever the rule generalises over.
func TestQueryOf(t *testing.T) {
	general := Behaviour{Echo: flagRD | flagCD, Ignore: flagAD, IgnoresCookie: true, IgnoresSize: true}
	for _, shape := range []string{"plain", "rd", "rd,ad,edns", "edns=4096,do", "rd,edns,cookie", "cd,edns,nsid"} {
		for _, b := range []Behaviour{{}, general} {
			q := mustQuery(t, shape, "www.Example.test", dns.TypeAAAA)
			a, err := CheckReply(q, reply(t, q, 300, nil), 4)
			if err != nil {
				t.Fatal(err)
			}
			a.AnySize = b.IgnoresSize && q.EDNS
			r := Rule(q, a, b)
			again := queryOf(r)
			if again == nil {
				t.Fatalf("%s, %v: no query rebuilt from %+v", shape, b, r)
			}
			if again.Name != q.Name || again.Type != q.Type {
				t.Errorf("%s, %v: rebuilt %s %d, want %s %d", shape, b, again.Name, again.Type, q.Name, q.Type)
			}
			if k := Rule(again, a, b).MatchKey(); k != r.MatchKey() {
				t.Errorf("%s, %v: the rebuilt query's rule matches %s, want %s", shape, b, k, r.MatchKey())
			}
		}
	}
	other := api.Rule{Conditions: []api.Condition{{Pattern: api.Bytes("other program")}}, ReplyLen: 1, MinLen: 13, MaxLen: 13}
	if q := queryOf(other); q != nil {
		t.Errorf("a query rebuilt from another program's rule: %v", q)
	}
}

func TestReadTop(t *testing.T) {
	in := `# name type count
b.test. A 5
a.test A 10
c.test AAAA 5
b.test. A 1
`
	qs, err := ReadTop(strings.NewReader(in), "list", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := []Question{{"a.test.", dns.TypeA}, {"b.test.", dns.TypeA}}
	if fmt.Sprint(qs) != fmt.Sprint(want) {
		t.Errorf("top 2 = %v, want %v", qs, want)
	}
	if _, err := ReadTop(strings.NewReader("a.test A x\n"), "list", 0); err == nil || !strings.Contains(err.Error(), "list:1") {
		t.Errorf("bad count: %v", err)
	}
	qs, err = ReadNames(strings.NewReader("www.example.test\nmail.example.test MX TXT\n"), "names", []uint16{dns.TypeA, dns.TypeAAAA})
	if err != nil || len(qs) != 4 {
		t.Errorf("names: %v %v", qs, err)
	}
	if _, err := ReadNames(strings.NewReader("www.example.test BOGUS\n"), "names", nil); err == nil {
		t.Errorf("unknown type accepted")
	}
}

// TestReadZoneDirectives: a zone file's $INCLUDE (absolute, or relative
// to the zone file's directory) is followed and $GENERATE expanded, so
// --zone-file offloads what the server serves from the same file.
func TestReadZoneDirectives(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	abs := write("abs.inc", "abs IN A 198.18.0.3\n")
	write("rel.inc", "rel IN TXT \"relative\"\n")
	zone := write("example.zone", "$ORIGIN example.test.\n$TTL 300\n"+
		"@ IN SOA ns1 hostmaster 1 3600 600 86400 300\n"+
		"$GENERATE 1-2 host$ A 198.18.0.$\n"+
		"$INCLUDE "+abs+"\n$INCLUDE rel.inc\n")
	qs, err := LoadQuestions("", zone, "", "", 0, nil)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, q := range qs {
		got = append(got, q.Name+" "+dns.TypeToString[q.Type])
	}
	want := []string{"example.test. SOA", "host1.example.test. A", "host2.example.test. A", "abs.example.test. A", "rel.example.test. TXT"}
	if !slices.Equal(got, want) {
		t.Errorf("questions of the zone file: %v, want %v", got, want)
	}
}

func TestHasSetOfSeveral(t *testing.T) {
	for _, c := range []struct {
		records []string // of the answer section
		want    bool
	}{
		{[]string{"www.example.test. 300 IN A 198.18.255.10"}, false},
		{[]string{"www.example.test. 300 IN A 198.18.255.10", "mail.example.test. 300 IN A 198.18.255.25"}, false},
		{[]string{"www.example.test. 300 IN A 198.18.255.10", "www.example.test. 300 IN AAAA 2001:2::10"}, false},
		{[]string{"www.example.test. 300 IN A 198.18.255.10", "WWW.example.test. 300 IN A 198.18.255.11"}, true},
		{[]string{ // signatures of two types: two sets of one
			"www.example.test. 300 IN RRSIG A 13 3 300 20270101000000 20260101000000 1 example.test. AAAA",
			"www.example.test. 300 IN RRSIG AAAA 13 3 300 20270101000000 20260101000000 1 example.test. AAAA"}, false},
		{[]string{ // one type signed by two keys
			"example.test. 300 IN RRSIG DNSKEY 13 2 300 20270101000000 20260101000000 1 example.test. AAAA",
			"example.test. 300 IN RRSIG DNSKEY 13 2 300 20270101000000 20260101000000 2 example.test. AAAA"}, true},
	} {
		m := new(dns.Msg)
		for _, s := range c.records {
			rr, err := dns.NewRR(s)
			if err != nil {
				t.Fatal(err)
			}
			m.Answer = append(m.Answer, rr)
		}
		if got := HasSetOfSeveral(m); got != c.want {
			t.Errorf("%q: %v, want %v", c.records, got, c.want)
		}
	}
}

// An overloaded server that drops queries goes silent (or leaves SOA polls
// unanswered) and answers again many times a minute: only the first
// outage of a minute is a warning, and only its end is logged at info
// level.
func TestSilenceLoggedOnceAMinute(t *testing.T) {
	var o outageLog
	var levels []slog.Level
	for range 3 {
		levels = append(levels, o.began(), o.ended())
	}
	if want := []slog.Level{slog.LevelWarn, slog.LevelInfo, slog.LevelDebug, slog.LevelDebug, slog.LevelDebug, slog.LevelDebug}; !slices.Equal(levels, want) {
		t.Errorf("three outages in a minute logged at %v, want %v", levels, want)
	}
	o.warned = time.Now().Add(-time.Minute)
	if b, e := o.began(), o.ended(); b != slog.LevelWarn || e != slog.LevelInfo {
		t.Errorf("an outage a minute after the last warning logged at %v, %v; want a warning and info", b, e)
	}

	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelInfo}))
	silence := silenceLogger(log, netip.MustParseAddrPort("198.18.0.1:53"), time.Second)
	for range 3 {
		silence(true)
		silence(false)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2 || !strings.Contains(lines[0], "level=WARN") || !strings.Contains(lines[0], "answered nothing") ||
		!strings.Contains(lines[1], "level=INFO") || !strings.Contains(lines[1], "answers again") {
		t.Errorf("three silences in a row logged:\n%s\nwant one warning and one info line", out.String())
	}
}
