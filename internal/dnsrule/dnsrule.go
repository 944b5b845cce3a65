// Package dnsrule turns a DNS query and the reply a real server gave to it
// into a Santa rule that answers the same query from the kernel.
//
// The rule matches the query's exact wire bytes after the 2-byte ID
// (flags, counts, question and any EDNS record), so it only answers queries
// the server would answer with the same bytes. Its reply is the server's
// reply with the ID copied from the request:
//
//	condition  offset 2: query[2:]
//	processor  copy 2 bytes request[0:2] -> reply[0:2]   (the ID)
//	processor  put  reply[2:]            -> reply[2:]
//
// Names are compared byte for byte: a query that differs only in the case
// of its name, its flags or its EDNS options does not match and reaches the
// server. A longer query that starts with the same bytes does match (the
// data plane has no length condition): with the counts in the condition,
// that only happens for a query with trailing bytes after its last record,
// which NSD (4.6) ignores too: it answers such a query with the same bytes.
package dnsrule

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
	"github.com/santa-offload/santa/internal/ruleconv"
)

const headerLen = 12

// RuleFor builds the rule that answers query with reply. reply must be a
// server's reply to exactly these query bytes (same ID, same question).
func RuleFor(query, reply []byte) (dataplane.Rule, error) {
	if err := check(query, reply); err != nil {
		return dataplane.Rule{}, err
	}
	return dataplane.Rule{
		Conditions: []dataplane.Condition{{Offset: 2, Pattern: bytes.Clone(query[2:])}},
		Processors: []dataplane.Processor{
			{Kind: dataplane.Copy, ReplyOffset: 0, SrcOffset: 0, Length: 2},
			{Kind: dataplane.Put, ReplyOffset: 2, Template: bytes.Clone(reply[2:])},
		},
		ReplyLen: len(reply),
	}, nil
}

// APIRule is r in the form santad's clients send it (package api), e.g.
// to install a rule from RuleFor or FromServer with santa.Client.Add.
func APIRule(r dataplane.Rule) api.Rule { return ruleconv.ToAPI(r) }

// ErrNotAnswer wraps every reason a query/reply pair cannot become a rule.
var ErrNotAnswer = errors.New("dnsrule")

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotAnswer, fmt.Sprintf(format, args...))
}

func check(query, reply []byte) error {
	var q, r dns.Msg
	if err := q.Unpack(query); err != nil {
		return bad("query does not parse: %v", err)
	}
	if err := r.Unpack(reply); err != nil {
		return bad("reply does not parse: %v", err)
	}
	switch {
	case q.Response:
		return bad("query has the QR bit set")
	case !r.Response:
		return bad("reply has the QR bit clear")
	case q.Id != r.Id:
		return bad("reply ID %#04x does not answer query ID %#04x", r.Id, q.Id)
	case len(q.Question) != 1:
		return bad("query has %d questions, want 1", len(q.Question))
	}
	qlen, err := questionLen(query)
	if err != nil {
		return err
	}
	if len(reply) < qlen || !bytes.Equal(reply[4:6], query[4:6]) || !bytes.Equal(reply[headerLen:qlen], query[headerLen:qlen]) {
		return bad("reply is not for this question (%s)", q.Question[0].String())
	}
	switch {
	case len(query)-2 > dataplane.MaxPattern:
		return bad("query of %d bytes: the condition holds at most %d bytes after the ID", len(query), dataplane.MaxPattern)
	case len(query) > dataplane.ReqWindow:
		return bad("query of %d bytes: the rule processor sees only the first %d", len(query), dataplane.ReqWindow)
	case len(reply) > dataplane.MaxReply:
		return bad("reply of %d bytes: at most %d", len(reply), dataplane.MaxReply)
	}
	return nil
}

// questionLen returns where the first question of msg ends: header, name
// (uncompressed, as in any query) and type and class.
func questionLen(msg []byte) (int, error) {
	off := headerLen
	for i := 0; ; i++ {
		if off >= len(msg) || i > 127 {
			return 0, bad("query name runs past the end")
		}
		l := int(msg[off])
		if l&0xc0 != 0 {
			return 0, bad("query name is compressed or uses an extended label")
		}
		off += 1 + l
		if l == 0 {
			break
		}
	}
	off += 4
	if off > len(msg) {
		return 0, bad("query question runs past the end")
	}
	return off, nil
}

// FromServer asks the server at the other end of conn (a connected UDP
// socket) for its reply to the exact bytes of query and returns the rule
// that gives that reply from the kernel, together with the reply.
func FromServer(conn net.Conn, query []byte, timeout time.Duration) (dataplane.Rule, []byte, error) {
	reply, err := Exchange(conn, query, timeout)
	if err != nil {
		return dataplane.Rule{}, nil, fmt.Errorf("ask %v: %w", conn.RemoteAddr(), err)
	}
	rule, err := RuleFor(query, reply)
	if err != nil {
		return dataplane.Rule{}, nil, err
	}
	return rule, reply, nil
}

// Exchange sends the exact bytes of query over conn (a connected UDP
// socket) and returns the first reply that carries the query's ID. Replies
// with other IDs (late answers to earlier queries) are skipped.
func Exchange(conn net.Conn, query []byte, timeout time.Duration) ([]byte, error) {
	if len(query) < headerLen {
		return nil, bad("query of %d bytes is shorter than a DNS header", len(query))
	}
	deadline := time.Now().Add(timeout)
	if err := conn.SetDeadline(deadline); err != nil {
		return nil, err
	}
	if _, err := conn.Write(query); err != nil {
		return nil, err
	}
	buf := make([]byte, 65536)
	for i := 0; i < 1000; i++ { // bounded: at most this many stray datagrams
		n, err := conn.Read(buf)
		if err != nil {
			return nil, err
		}
		if n >= headerLen && buf[0] == query[0] && buf[1] == query[1] {
			return bytes.Clone(buf[:n]), nil
		}
	}
	return nil, fmt.Errorf("no reply with ID %#04x among 1000 datagrams", binary.BigEndian.Uint16(query))
}

// SetID returns a copy of msg with its ID set to id.
func SetID(msg []byte, id uint16) []byte {
	out := bytes.Clone(msg)
	binary.BigEndian.PutUint16(out, id)
	return out
}

// RecordQuery learns the exact bytes a DNS client sends: it runs client
// with the address of pc (a UDP socket the caller opened where the client
// can reach it, e.g. on loopback of the client's namespace), returns the
// first datagram that arrives on pc and answers it with REFUSED so the
// client finishes at once. client's error is ignored (a client may well
// exit non-zero on REFUSED); it must return within timeout.
func RecordQuery(pc net.PacketConn, timeout time.Duration, client func(server netip.AddrPort) error) ([]byte, error) {
	la, ok := pc.LocalAddr().(*net.UDPAddr)
	if !ok {
		return nil, fmt.Errorf("record query: %v is not a UDP address", pc.LocalAddr())
	}
	addr := la.AddrPort()
	addr = netip.AddrPortFrom(addr.Addr().Unmap(), addr.Port())
	done := make(chan error, 1)
	go func() { done <- client(addr) }()

	if err := pc.SetReadDeadline(time.Now().Add(timeout)); err != nil {
		return nil, err
	}
	buf := make([]byte, 65536)
	n, from, rerr := pc.ReadFrom(buf)
	var query []byte
	if rerr == nil {
		query = bytes.Clone(buf[:n])
		if ans := refuse(query); ans != nil {
			_, _ = pc.WriteTo(ans, from)
		}
	}
	select {
	case <-done:
	case <-time.After(timeout):
		return nil, fmt.Errorf("record query: the client did not finish within %v", timeout)
	}
	if rerr != nil {
		return nil, fmt.Errorf("record query: nothing arrived on %v: %w", addr, rerr)
	}
	return query, nil
}

// refuse builds a REFUSED answer to query, nil if query does not parse.
func refuse(query []byte) []byte {
	var q dns.Msg
	if err := q.Unpack(query); err != nil {
		return nil
	}
	r := new(dns.Msg)
	r.SetRcode(&q, dns.RcodeRefused)
	b, err := r.Pack()
	if err != nil {
		return nil
	}
	return b
}

// DigArgs are the arguments for dig asking server for name and qtype,
// followed by extra (display options such as +short). They include
// +nocookie: by default dig sends a fresh random EDNS client cookie with
// every run, so no two runs would send the same bytes and no rule built
// from one run would match the next. Run dig with the same extra options
// when recording its query and when asking for real.
func DigArgs(server netip.AddrPort, name, qtype string, extra ...string) []string {
	args := []string{"+nocookie", "+tries=1", "+time=1", "-p", fmt.Sprint(server.Port()), "@" + server.Addr().String(), name, qtype}
	return append(args, extra...)
}
