package dnsctl

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/miekg/dns"
)

// Probe finds out how the server behind a treats the parts of a query that
// vary between clients, by asking it variants of real questions: each flag
// bit (RD, AD, CD) flipped, a query with two different client cookies, and
// different advertised UDP sizes. A property is trusted only if every probe
// question shows it; with no usable probe question nothing is trusted
// (Behaviour{}), which is always correct, just less general.
func Probe(a *Asker, questions []Question) (Behaviour, int, error) {
	b := Behaviour{Echo: flagRD | flagAD | flagCD, Ignore: flagRD | flagAD | flagCD, IgnoresCookie: true, IgnoresSize: true}
	probed := 0
	var lastErr error
	for _, question := range questions {
		got, err := probeOne(a, question)
		if err != nil {
			lastErr = err
			if noAnswer(err) {
				break // a silent server answers the next question no more
			}
			continue
		}
		b.Echo &= got.Echo
		b.Ignore &= got.Ignore
		b.IgnoresCookie = b.IgnoresCookie && got.IgnoresCookie
		b.AnswersCookies = b.AnswersCookies || got.AnswersCookies
		b.IgnoresSize = b.IgnoresSize && got.IgnoresSize
		if probed++; probed == 3 {
			break
		}
	}
	if probed == 0 {
		return Behaviour{}, 0, fmt.Errorf("no question could be probed (last error: %w): matching every query byte exactly", lastErr)
	}
	b.Ignore &^= b.Echo // a bit the reply echoes is not ignored
	return b, probed, nil
}

// probeOne probes with one question; the reply to its plain EDNS query must
// be offloadable and at most 512 bytes, so that sizes do not matter.
func probeOne(a *Asker, question Question) (Behaviour, error) {
	ask := func(s Shape) ([]byte, error) {
		wire, err := s.Query(0x5a5a, question.Name, question.Type)
		if err != nil {
			return nil, err
		}
		return a.Ask(wire)
	}
	base := Shape{EDNS: true, UDPSize: 1232}
	wire, err := base.Query(0x5a5a, question.Name, question.Type)
	if err != nil {
		return Behaviour{}, err
	}
	q, err := ParseQuery(wire)
	if err != nil {
		return Behaviour{}, err
	}
	ref, err := a.Ask(wire)
	if err != nil {
		return Behaviour{}, err
	}
	if _, err := CheckReply(q, ref, 4); err != nil {
		return Behaviour{}, err
	}
	if len(ref) > minUDPSize {
		return Behaviour{}, fmt.Errorf("%s: reply of %d bytes is too long to probe sizes with", q, len(ref))
	}
	var b Behaviour
	for _, bit := range []uint16{flagRD, flagAD, flagCD} {
		s := base
		s.Flags = bit
		reply, err := ask(s)
		if err != nil {
			return Behaviour{}, err
		}
		switch {
		case bytes.Equal(reply, ref):
			b.Ignore |= bit
		case bytes.Equal(reply, withFlags(ref, bit)):
			b.Echo |= bit
		}
	}
	b.IgnoresCookie = true
	for _, cookie := range [][]byte{{1, 2, 3, 4, 5, 6, 7, 8}, {8, 7, 6, 5, 4, 3, 2, 1}} {
		s := base
		s.Options = append([]byte{0, 10, 0, 8}, cookie...)
		reply, err := ask(s)
		if err != nil {
			return Behaviour{}, err
		}
		// the reply may differ from ref only in its OPT length fields if it
		// echoed nothing: compare with what a cookie-less server sends
		b.IgnoresCookie = b.IgnoresCookie && bytes.Equal(reply, ref)
		var m dns.Msg
		b.AnswersCookies = b.AnswersCookies || m.Unpack(reply) == nil && carriesCookie(m.IsEdns0())
	}
	b.IgnoresSize = true
	for _, size := range []uint16{0, 512, 4096, 65535} {
		s := base
		s.UDPSize = size
		reply, err := ask(s)
		if err != nil {
			return Behaviour{}, err
		}
		b.IgnoresSize = b.IgnoresSize && bytes.Equal(reply, ref)
	}
	return b, nil
}

// withFlags is reply with the header flag bits in bits flipped.
func withFlags(reply []byte, bits uint16) []byte {
	out := bytes.Clone(reply)
	binary.BigEndian.PutUint16(out[flagsOff:], binary.BigEndian.Uint16(out[flagsOff:])^bits)
	return out
}
