package dnsctl

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
)

// Largest UDP payloads the rule processor sends: a 1500-byte MTU less the
// IP and UDP headers.
const (
	maxReply4 = 1472
	maxReply6 = 1452
	// maxPattern is the longest condition pattern santad accepts.
	maxPattern = 1024
)

// Behaviour is what probing found out about how a server treats the parts
// of a query that vary between clients (see Probe). The zero value trusts
// nothing: every query byte is matched exactly.
type Behaviour struct {
	// Echo holds the header flag bits the server copies from the query into
	// its reply (RD and CD on an authoritative server); Ignore the bits that
	// do not change the reply at all.
	Echo, Ignore uint16
	// IgnoresCookie: the reply to a query with a client cookie carries no
	// cookie and does not depend on it (the server does not implement DNS
	// cookies), so a rule may answer any client cookie.
	IgnoresCookie bool
	// AnswersCookies: the reply to a query with a client cookie carries a
	// server cookie, so no query with a cookie can be offloaded.
	AnswersCookies bool
	// IgnoresSize: a reply of at most 512 bytes does not depend on the
	// advertised EDNS UDP size.
	IgnoresSize bool
}

func (b Behaviour) String() string {
	return fmt.Sprintf("echoes %s, ignores %s, client cookies %s, UDP size %s",
		flagNames(b.Echo), flagNames(b.Ignore), ignored(b.IgnoresCookie), ignored(b.IgnoresSize))
}

func ignored(b bool) string {
	if b {
		return "ignored"
	}
	return "matched exactly"
}

func flagNames(bits uint16) string {
	s := Shape{Flags: bits}.String()
	if s == "plain" {
		return "no flags"
	}
	return s
}

// Answer is a server's reply to a query, checked to be one a rule may give.
type Answer struct {
	Reply []byte
	TTL   time.Duration // the smallest TTL of its records: the rule's lifetime
	Rcode int
	// SetOfSeveral: a record set of the reply has two or more records,
	// whose order a server may vary from one reply to the next.
	SetOfSeveral bool
	// Chain are the names a CNAME or DNAME chain in the answer section
	// leads to (canonical): the owners other than the question's and the
	// CNAMEs' targets, which may be missing (NXDOMAIN). The answer comes
	// from their zones too, which may be other zones of the server.
	Chain []string
	// AnySize: the server sends this reply whatever UDP size the query
	// advertises (see Controller.checkReply), so a rule may leave the
	// size out.
	AnySize bool
}

// CheckReply checks that reply is the server's answer to q that a rule may
// give to every client sending q: a complete (not truncated) NOERROR or
// NXDOMAIN answer for exactly q's question, within q's advertised UDP size
// and the rule processor's reply limit for family, EDNS iff q has EDNS, no
// server cookie (it depends on the client and the time), and a TTL above 1.
func CheckReply(q *Query, reply []byte, family int) (Answer, error) {
	var m dns.Msg
	if err := m.Unpack(reply); err != nil {
		return Answer{}, fmt.Errorf("reply does not parse: %w", err)
	}
	limit := maxReply4
	if family == 6 {
		limit = maxReply6
	}
	switch {
	case !m.Response || m.Opcode != dns.OpcodeQuery:
		return Answer{}, fmt.Errorf("not a response to a standard query")
	case !bytes.Equal(reply[:2], q.Wire[:2]):
		return Answer{}, fmt.Errorf("reply ID %#04x does not answer query ID %#04x", reply[:2], q.Wire[:2])
	case m.Truncated:
		return Answer{}, notOffloadable("the server truncated its reply (TC): it stays in charge of truncation")
	case m.Rcode != dns.RcodeSuccess && m.Rcode != dns.RcodeNameError:
		return Answer{}, notOffloadable("rcode %s", dns.RcodeToString[m.Rcode])
	case len(reply) < q.questionEnd || !bytes.Equal(reply[4:6], q.Wire[4:6]) ||
		!bytes.Equal(reply[headerLen:q.questionEnd], q.Question()):
		return Answer{}, fmt.Errorf("reply is not for the question of %s", q)
	case len(reply) > int(q.UDPSize):
		return Answer{}, notOffloadable("reply of %d bytes exceeds the client's UDP size %d", len(reply), q.UDPSize)
	case len(reply) > limit:
		return Answer{}, notOffloadable("reply of %d bytes exceeds the %d bytes the rule processor sends over IPv%d", len(reply), limit, family)
	case len(q.Wire) > maxPattern+4:
		return Answer{}, notOffloadable("query of %d bytes is longer than a rule condition", len(q.Wire))
	}
	opt := m.IsEdns0()
	if (opt != nil) != q.EDNS {
		return Answer{}, fmt.Errorf("reply has EDNS %t, query %t", opt != nil, q.EDNS)
	}
	if carriesCookie(opt) {
		return Answer{}, notOffloadable("the reply carries a server cookie, which depends on the client and the time")
	}
	ttl := ^uint32(0)
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		for _, rr := range section {
			if rr.Header().Rrtype != dns.TypeOPT {
				ttl = min(ttl, rr.Header().Ttl)
			}
		}
	}
	if ttl == ^uint32(0) {
		return Answer{}, notOffloadable("the reply has no record to take a TTL from")
	}
	switch ttl {
	case 0:
		return Answer{}, notOffloadable("TTL 0: the answer may not be reused")
	case 1:
		// its rule ends at the whole second at or before the TTL's end,
		// before any refresh (a second after the fetch at the earliest):
		// it would go and come back every few seconds
		return Answer{}, notOffloadable("TTL of one second: its rule would run out before it could be refreshed")
	}
	return Answer{Reply: reply, TTL: time.Duration(ttl) * time.Second, Rcode: m.Rcode, SetOfSeveral: HasSetOfSeveral(&m),
		Chain: chainOf(&m)}, nil
}

// chainOf is Answer.Chain of m; nil for an answer of the question's name
// alone.
func chainOf(m *dns.Msg) []string {
	var chain []string
	question := canonical(m.Question[0].Name)
	add := func(name string) {
		if name = canonical(name); name != question && !slices.Contains(chain, name) {
			chain = append(chain, name)
		}
	}
	for _, rr := range m.Answer {
		add(rr.Header().Name)
		if cname, ok := rr.(*dns.CNAME); ok {
			add(cname.Target)
		}
	}
	return chain
}

// carriesCookie reports whether opt, a message's OPT record or nil, has a
// COOKIE option.
func carriesCookie(opt *dns.OPT) bool {
	if opt == nil {
		return false
	}
	for _, o := range opt.Option {
		if o.Option() == dns.EDNS0COOKIE {
			return true
		}
	}
	return false
}

// HasSetOfSeveral reports whether a section of m holds two records of one
// set: the same owner, class and type (for RRSIGs, the same type covered).
func HasSetOfSeveral(m *dns.Msg) bool {
	type set struct {
		name                  string
		class, rtype, covered uint16
	}
	for _, section := range [][]dns.RR{m.Answer, m.Ns, m.Extra} {
		seen := map[set]bool{}
		for _, rr := range section {
			h := rr.Header()
			s := set{name: strings.ToLower(h.Name), class: h.Class, rtype: h.Rrtype}
			if sig, ok := rr.(*dns.RRSIG); ok {
				s.covered = sig.TypeCovered
			}
			if seen[s] {
				return true
			}
			seen[s] = true
		}
	}
	return false
}

// Rule is the rule that answers q with a.Reply for every query that the
// server, as b describes it, would answer with the same bytes:
//
//   - the ID is copied from the query, and so are the flag bits in b.Echo;
//   - the flag bits in neither b.Echo nor b.Ignore must equal q's;
//   - every other byte must equal q's, except a client cookie's bytes when
//     b.IgnoresCookie and the UDP size when a.AnySize;
//   - the request must be exactly as long as q (nothing may follow).
func Rule(q *Query, a Answer, b Behaviour) api.Rule {
	w := q.Wire
	var holes [][2]int // byte ranges of w no condition covers, in order
	if b.IgnoresCookie && q.HasCookie() {
		holes = append(holes, [2]int{q.cookieData, q.cookieData + q.cookieLen})
	}
	if a.AnySize {
		sizeOff := q.questionEnd + 3
		holes = append([][2]int{{sizeOff, sizeOff + 2}}, holes...)
	}
	// sized up front: a million rules' appends were a tenth of the controller's garbage
	conds := make([]api.Condition, 0, 2+len(holes))
	bodyStart := flagsOff
	if mask := ^(b.Echo | b.Ignore); mask != 0xffff {
		flags := binary.BigEndian.Uint16(w[flagsOff:])
		conds = append(conds, api.Condition{
			Offset:  flagsOff,
			Pattern: binary.BigEndian.AppendUint16(nil, flags&mask),
			Mask:    binary.BigEndian.AppendUint16(nil, mask),
		})
		bodyStart = flagsOff + 2
	}
	for _, h := range append(holes, [2]int{len(w), len(w)}) {
		if h[0] > bodyStart {
			conds = append(conds, api.Condition{Offset: uint32(bodyStart), Pattern: bytes.Clone(w[bodyStart:h[0]])})
		}
		bodyStart = h[1]
	}
	procs := append(make([]api.Processor, 0, 3), santa.Copy(0, 0, 2), santa.Put(2, bytes.Clone(a.Reply[2:])))
	if b.Echo != 0 {
		echo := santa.Copy(flagsOff, flagsOff, 2)
		echo.Mask = binary.BigEndian.AppendUint16(nil, b.Echo)
		procs = append(procs, echo)
	}
	return api.Rule{
		Conditions: conds,
		Processors: procs,
		ReplyLen:   uint32(len(a.Reply)),
		MinLen:     uint32(len(w)),
		MaxLen:     uint32(len(w)),
	}
}

// queryOf rebuilds the query that a rule made by Rule was made for, with
// ID 0 and zeros where the rule compares nothing (flag bits it echoes or
// ignores, an ignored cookie or UDP size); nil if r is no such rule.
func queryOf(r api.Rule) *Query {
	if r.MinLen == 0 || r.MinLen != r.MaxLen || r.MinLen > maxPattern+4 {
		return nil
	}
	wire := make([]byte, r.MinLen)
	for _, c := range r.Conditions {
		if int(c.Offset)+len(c.Pattern) > len(wire) {
			return nil
		}
		copy(wire[c.Offset:], c.Pattern)
	}
	q, err := ParseQuery(wire)
	if err != nil {
		return nil
	}
	return q
}
