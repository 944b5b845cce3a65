package dataplane

import (
	"bytes"
	"encoding/binary"
	"fmt"
)

// packedRule is a rule as the caller gave it, kept for listings: one
// allocation of varints and bytes. A DNS rule with a 60-byte answer takes
// 137 bytes this way, where the Rule with its slices took about 550 (with a
// million rules, half a gigabyte of santad's heap; first touches of fresh
// memory were what adding them cost most).
type packedRule []byte

const packedClose = 1 // packed flags: Rule.Close

func packRule(r Rule) packedRule {
	var short [256]byte // most rules: then the one allocation is the exact size
	b := short[:0]
	u := binary.AppendUvarint
	flags := uint64(0)
	if r.Close {
		flags |= packedClose
	}
	// an int goes as uint64 and comes back the same, negative or not
	for _, v := range [...]uint64{uint64(r.ReplyLen), uint64(r.Priority), uint64(r.MinLen), uint64(r.MaxLen), flags, r.Expires} {
		b = u(b, v)
	}
	b = u(b, uint64(len(r.Conditions)))
	for _, c := range r.Conditions {
		b = u(b, uint64(c.Offset))
		b = appendPackedBytes(b, c.Pattern)
		b = appendPackedBytes(b, c.Mask)
	}
	b = u(b, uint64(len(r.Processors)))
	for _, p := range r.Processors {
		b = u(b, uint64(p.Kind))
		b = u(b, uint64(p.ReplyOffset))
		b = appendPackedBytes(b, p.Template)
		b = u(b, uint64(p.SrcOffset))
		b = u(b, uint64(p.Length))
		b = appendPackedBytes(b, p.Mask)
	}
	b = u(b, uint64(len(r.Guards)))
	for _, g := range r.Guards {
		b = u(b, uint64(g.Slot))
		b = u(b, g.Version)
	}
	return bytes.Clone(b)
}

func appendPackedBytes(b, v []byte) []byte {
	return append(binary.AppendUvarint(b, uint64(len(v))), v...)
}

// unpack is the rule packRule was given, its byte slices in one fresh copy
// (empty ones nil).
func (p packedRule) unpack() (Rule, error) {
	b := append([]byte(nil), p...)
	var err error
	u := func() uint64 {
		v, n := binary.Uvarint(b)
		if n <= 0 {
			err = fmt.Errorf("packed rule: bad varint")
			b = nil
			return 0
		}
		b = b[n:]
		return v
	}
	bs := func() []byte {
		n := u()
		if n > uint64(len(b)) {
			err = fmt.Errorf("packed rule: %d bytes past the end", n)
			b = nil
		}
		if n == 0 || err != nil {
			return nil
		}
		v := b[:n:n]
		b = b[n:]
		return v
	}
	r := Rule{ReplyLen: int(u()), Priority: uint32(u()), MinLen: int(u()), MaxLen: int(u())}
	r.Close = u()&packedClose != 0
	r.Expires = u()
	if n := u(); n > 0 && err == nil {
		r.Conditions = make([]Condition, min(n, uint64(MaxConds)))
		for i := range r.Conditions {
			r.Conditions[i] = Condition{Offset: int(u()), Pattern: bs(), Mask: bs()}
		}
	}
	if n := u(); n > 0 && err == nil {
		r.Processors = make([]Processor, min(n, uint64(MaxProcessors)))
		for i := range r.Processors {
			r.Processors[i] = Processor{Kind: ProcessorKind(u()), ReplyOffset: int(u()), Template: bs(),
				SrcOffset: int(u()), Length: int(u()), Mask: bs()}
		}
	}
	if n := u(); n > 0 && err == nil {
		r.Guards = make([]Guard, min(n, uint64(MaxGuards)))
		for i := range r.Guards {
			r.Guards[i] = Guard{Slot: uint32(u()), Version: u()}
		}
	}
	if err == nil && len(b) > 0 {
		err = fmt.Errorf("packed rule: %d bytes left over", len(b))
	}
	return r, err
}
