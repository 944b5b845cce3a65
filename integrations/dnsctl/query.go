// Package dnsctl is the DNS controller behind `santa dns`: it offloads the
// answers of an unmodified authoritative DNS server (NSD, Knot, BIND, ...)
// to Santa through santad's public client API. It asks the server itself
// for every answer, turns each (query, reply) pair into a rule that gives
// the same reply byte for byte (the transaction ID copied from the query),
// and keeps the rules no older than their answers: it refreshes them before
// their TTL runs out and at once when a zone's SOA serial changes.
//
// docs/dns.md describes the behaviour (which queries are answered, which go
// to the server, and why).
package dnsctl

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"strings"

	"github.com/miekg/dns"
)

// Offsets and bits of the DNS header (RFC 1035 §4.1.1, RFC 4035 §3.2).
const (
	headerLen = 12
	flagsOff  = 2

	flagQR = 1 << 15
	flagTC = 1 << 9
	flagRD = 1 << 8
	flagZ  = 1 << 6
	flagAD = 1 << 5
	flagCD = 1 << 4

	opcodeMask = 0xf << 11
	rcodeMask  = 0xf

	optFixedLen = 11      // root name, type, class, TTL, RDLENGTH
	ednsDO      = 1 << 15 // in the OPT record's TTL field
	minUDPSize  = 512     // what a server assumes for a smaller or absent EDNS size
	maxUDPSize  = 65535   // the largest EDNS size a query can advertise
)

// ErrNotOffloadable wraps every reason a query or reply cannot be answered
// from the kernel; such queries simply stay with the server.
var ErrNotOffloadable = errors.New("not offloadable")

func notOffloadable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrNotOffloadable, fmt.Sprintf(format, args...))
}

// Query is a standard query the controller can offload, with the byte
// positions a rule treats specially.
type Query struct {
	Wire  []byte // the query as sent, ID included
	Name  string // the question name as sent (letter case kept), fully qualified
	Type  uint16
	Class uint16

	questionEnd int // end of the question section = start of the OPT record, if any
	EDNS        bool
	UDPSize     uint16 // advertised UDP payload size (minUDPSize without EDNS)
	DO          bool
	// cookieData is the offset of the client cookie option's data and
	// cookieLen its length (0: no cookie option).
	cookieData, cookieLen int
}

// ParseQuery checks that wire is a query a rule can answer and splits it.
// It accepts: opcode QUERY, QR, TC, Z and RCODE clear, exactly one question
// with an uncompressed name, no answer or authority records, and at most one
// additional record, which must be an EDNS version 0 OPT record ending the
// message. Anything else (other opcodes, several questions, trailing bytes,
// malformed messages) is left to the server.
func ParseQuery(wire []byte) (*Query, error) {
	if len(wire) < headerLen {
		return nil, notOffloadable("%d bytes: shorter than a DNS header", len(wire))
	}
	var m dns.Msg
	if err := m.Unpack(wire); err != nil {
		return nil, notOffloadable("malformed: %v", err)
	}
	flags := binary.BigEndian.Uint16(wire[flagsOff:])
	counts := [4]uint16{}
	for i := range counts {
		counts[i] = binary.BigEndian.Uint16(wire[4+2*i:])
	}
	switch {
	case flags&flagQR != 0:
		return nil, notOffloadable("a response, not a query")
	case flags&opcodeMask != 0:
		return nil, notOffloadable("opcode %s", dns.OpcodeToString[int(flags&opcodeMask>>11)])
	case flags&(flagTC|flagZ|rcodeMask) != 0:
		return nil, notOffloadable("TC, Z or RCODE set in a query (flags %#04x)", flags)
	case counts[0] != 1:
		return nil, notOffloadable("%d questions", counts[0])
	case len(m.Question) != 1: // Unpack stops without an error where a message ends early
		return nil, notOffloadable("QDCOUNT 1, but the message ends before its question")
	case counts[1] != 0 || counts[2] != 0 || counts[3] > 1:
		return nil, notOffloadable("records in the answer (%d), authority (%d) or additional (%d) section",
			counts[1], counts[2], counts[3])
	}
	q := &Query{Wire: wire, Name: m.Question[0].Name, Type: m.Question[0].Qtype, Class: m.Question[0].Qclass, UDPSize: minUDPSize}
	end, err := nameEnd(wire, headerLen)
	if err != nil {
		return nil, err
	}
	q.questionEnd = end + 4
	if counts[3] == 0 {
		if q.questionEnd != len(wire) {
			return nil, notOffloadable("%d bytes after the question", len(wire)-q.questionEnd)
		}
		return q, nil
	}
	if err := q.parseOPT(); err != nil {
		return nil, err
	}
	return q, nil
}

// nameEnd is where the uncompressed name starting at off ends.
func nameEnd(wire []byte, off int) (int, error) {
	for labels := 0; ; labels++ {
		if off >= len(wire) || labels > 127 {
			return 0, notOffloadable("question name runs past the end")
		}
		l := int(wire[off])
		if l&0xc0 != 0 {
			return 0, notOffloadable("question name is compressed or uses an extended label type")
		}
		off += 1 + l
		if l == 0 {
			return off, nil
		}
	}
}

// parseOPT reads the OPT record that must follow the question and end the message.
func (q *Query) parseOPT() error {
	w, o := q.Wire, q.questionEnd
	if len(w) < o+optFixedLen || w[o] != 0 || binary.BigEndian.Uint16(w[o+1:]) != dns.TypeOPT {
		return notOffloadable("the additional record is not an OPT record with the root name")
	}
	q.EDNS = true
	q.UDPSize = max(binary.BigEndian.Uint16(w[o+3:]), minUDPSize)
	ttl := binary.BigEndian.Uint32(w[o+5:])
	if ext, version := ttl>>24, ttl>>16&0xff; ext != 0 || version != 0 {
		return notOffloadable("EDNS version %d, extended RCODE %d", version, ext)
	}
	q.DO = ttl&ednsDO != 0
	rdlen := int(binary.BigEndian.Uint16(w[o+9:]))
	if o+optFixedLen+rdlen != len(w) {
		return notOffloadable("the OPT record does not end the message")
	}
	for p := o + optFixedLen; p < len(w); {
		if p+4 > len(w) {
			return notOffloadable("truncated EDNS option")
		}
		code, olen := binary.BigEndian.Uint16(w[p:]), int(binary.BigEndian.Uint16(w[p+2:]))
		if p+4+olen > len(w) {
			return notOffloadable("EDNS option %d runs past the end", code)
		}
		if code == dns.EDNS0COOKIE {
			if q.cookieLen != 0 {
				return notOffloadable("two cookie options")
			}
			q.cookieData, q.cookieLen = p+4, olen
		}
		p += 4 + olen
	}
	return nil
}

// Flags is the query's 16-bit flags field.
func (q *Query) Flags() uint16 { return binary.BigEndian.Uint16(q.Wire[flagsOff:]) }

// Question is the question section's bytes: name, type and class.
func (q *Query) Question() []byte { return q.Wire[headerLen:q.questionEnd] }

// HasCookie reports whether the query carries a client (or client and server) cookie.
func (q *Query) HasCookie() bool { return q.cookieLen != 0 }

// String is a short human description: name, type and shape.
func (q *Query) String() string {
	return fmt.Sprintf("%s %s (%s)", q.Name, dns.TypeToString[q.Type], ShapeOf(q))
}

// Shape is everything about a query except its ID and question: the flags,
// whether it has EDNS, its advertised size, the DO bit and its options. The
// controller builds queries for a name from a shape and installs one rule
// per (question, shape) that clients use.
type Shape struct {
	Flags   uint16 // header flags (RD, AD, CD ...)
	EDNS    bool
	UDPSize uint16 // with EDNS
	DO      bool
	Options []byte // raw EDNS options (code, length, data ...)
}

// ShapeOf is q's shape.
func ShapeOf(q *Query) Shape {
	s := Shape{Flags: q.Flags(), EDNS: q.EDNS}
	if q.EDNS {
		s.UDPSize = binary.BigEndian.Uint16(q.Wire[q.questionEnd+3:])
		s.DO = q.DO
		s.Options = bytes.Clone(q.Wire[q.questionEnd+optFixedLen:])
	}
	return s
}

// Query builds the query of this shape for name and qtype (class IN) with ID id.
func (s Shape) Query(id uint16, name string, qtype uint16) ([]byte, error) {
	name = dns.Fqdn(name)
	if _, ok := dns.IsDomainName(name); !ok {
		return nil, fmt.Errorf("%q is not a domain name", name)
	}
	w := make([]byte, headerLen, headerLen+len(name)+2+4+optFixedLen+len(s.Options))
	binary.BigEndian.PutUint16(w[0:], id)
	binary.BigEndian.PutUint16(w[flagsOff:], s.Flags)
	binary.BigEndian.PutUint16(w[4:], 1)
	if s.EDNS {
		binary.BigEndian.PutUint16(w[10:], 1)
	}
	nameBuf := make([]byte, 256)
	n, err := dns.PackDomainName(name, nameBuf, 0, nil, false)
	if err != nil {
		return nil, fmt.Errorf("%q: %w", name, err)
	}
	w = append(w, nameBuf[:n]...)
	w = binary.BigEndian.AppendUint16(w, qtype)
	w = binary.BigEndian.AppendUint16(w, dns.ClassINET)
	if s.EDNS {
		w = append(w, 0)
		w = binary.BigEndian.AppendUint16(w, dns.TypeOPT)
		w = binary.BigEndian.AppendUint16(w, s.UDPSize)
		var ttl uint32
		if s.DO {
			ttl = ednsDO
		}
		w = binary.BigEndian.AppendUint32(w, ttl)
		w = binary.BigEndian.AppendUint16(w, uint16(len(s.Options)))
		w = append(w, s.Options...)
	}
	return w, nil
}

// String names the shape the way --shape takes it (see ParseShape).
func (s Shape) String() string {
	var parts []string
	for _, f := range []struct {
		bit  uint16
		name string
	}{{flagRD, "rd"}, {flagAD, "ad"}, {flagCD, "cd"}} {
		if s.Flags&f.bit != 0 {
			parts = append(parts, f.name)
		}
	}
	if s.EDNS {
		parts = append(parts, fmt.Sprintf("edns=%d", s.UDPSize))
		if s.DO {
			parts = append(parts, "do")
		}
		for p := 0; p+4 <= len(s.Options); {
			code, l := binary.BigEndian.Uint16(s.Options[p:]), int(binary.BigEndian.Uint16(s.Options[p+2:]))
			parts = append(parts, optionName(code))
			p += 4 + l
		}
	}
	if len(parts) == 0 {
		return "plain"
	}
	return strings.Join(parts, ",")
}

func optionName(code uint16) string {
	switch code {
	case dns.EDNS0COOKIE:
		return "cookie"
	case dns.EDNS0SUBNET:
		return "ecs"
	case dns.EDNS0PADDING:
		return "padding"
	case dns.EDNS0NSID:
		return "nsid"
	}
	return fmt.Sprintf("opt%d", code)
}

// key is a map key for the shape.
func (s Shape) key() string {
	return fmt.Sprintf("%04x/%t/%d/%t/%x", s.Flags, s.EDNS, s.UDPSize, s.DO, s.Options)
}

// ParseShape reads a shape: "plain", or a comma-separated list of
// rd, ad, cd (header flags), edns or edns=SIZE (an OPT record, default size
// 1232), do (DNSSEC OK, implies edns), cookie (an 8-byte client cookie,
// implies edns) and nsid (an empty NSID option, implies edns).
func ParseShape(text string) (Shape, error) {
	var s Shape
	if text == "plain" {
		return s, nil
	}
	edns := func() {
		if !s.EDNS {
			s.EDNS, s.UDPSize = true, 1232
		}
	}
	for _, part := range strings.Split(text, ",") {
		name, value, hasValue := strings.Cut(strings.TrimSpace(part), "=")
		switch {
		case name == "rd" && !hasValue:
			s.Flags |= flagRD
		case name == "ad" && !hasValue:
			s.Flags |= flagAD
		case name == "cd" && !hasValue:
			s.Flags |= flagCD
		case name == "edns":
			edns()
			if hasValue {
				var size uint16
				if _, err := fmt.Sscanf(value, "%d", &size); err != nil || fmt.Sprint(size) != value {
					return Shape{}, fmt.Errorf("shape %q: edns=%s: want a UDP size from 0 to 65535", text, value)
				}
				s.UDPSize = size
			}
		case name == "do" && !hasValue:
			edns()
			s.DO = true
		case name == "cookie" && !hasValue:
			edns()
			s.Options = append(s.Options, 0, dns.EDNS0COOKIE, 0, 8, 0x53, 0x61, 0x6e, 0x74, 0x61, 0x21, 0x21, 0x21)
		case name == "nsid" && !hasValue:
			edns()
			s.Options = append(s.Options, 0, dns.EDNS0NSID, 0, 0)
		default:
			return Shape{}, fmt.Errorf("shape %q: unknown part %q (want plain, or a list of rd, ad, cd, edns[=SIZE], do, cookie, nsid)", text, part)
		}
	}
	return s, nil
}
