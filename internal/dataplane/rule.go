package dataplane

import (
	"bytes"
	"errors"
	"fmt"
)

// Condition holds when the request's UDP payload carries Pattern at Offset.
// With a Mask (one byte per pattern byte) only the request bits where the
// mask has a 1 are compared; the pattern must have no bits outside the mask.
// Rules are found by hashing request bytes a condition compares in full: a
// rule needs a condition whose first mask byte is 0xff (or that has no mask).
type Condition struct {
	Offset  int    `json:"offset" yaml:"offset"`
	Pattern []byte `json:"pattern" yaml:"pattern"`
	Mask    []byte `json:"mask,omitempty" yaml:"mask,omitempty"`
}

// ProcessorKind says what a processor writes into the reply.
type ProcessorKind int

const (
	// Put writes the processor's Template at ReplyOffset.
	Put ProcessorKind = iota + 1
	// Copy writes Length request bytes from SrcOffset at ReplyOffset.
	Copy
)

func (k ProcessorKind) String() string {
	switch k {
	case Put:
		return "put"
	case Copy:
		return "copy"
	}
	return fmt.Sprintf("ProcessorKind(%d)", int(k))
}

// Processor is one step that writes part of the reply. Processors run in
// order; a later one overwrites what an earlier one wrote. A Copy with a Mask
// (one byte per copied byte, at most MaxCopyMask) copies only the request
// bits where the mask has a 1; the reply's other bits keep what earlier puts
// wrote (or zero). It may not mix its bits into reply bytes an earlier copy
// wrote, except by overwriting them whole (mask byte 0xff).
type Processor struct {
	Kind        ProcessorKind `json:"kind" yaml:"kind"`
	ReplyOffset int           `json:"reply_offset" yaml:"reply_offset"`
	Template    []byte        `json:"template,omitempty" yaml:"template,omitempty"`     // Put
	SrcOffset   int           `json:"src_offset,omitempty" yaml:"src_offset,omitempty"` // Copy
	Length      int           `json:"length,omitempty" yaml:"length,omitempty"`         // Copy
	Mask        []byte        `json:"mask,omitempty" yaml:"mask,omitempty"`             // Copy, optional
}

// Guard ties a rule to a version of something its reply depends on: the rule
// answers only while slot Slot of the guard map (GuardsPin) holds Version.
// A write tracker bumps the slots of what a write changes, before the
// application sees the write and again once it has applied it, so a rule
// built from a value read before the write can never answer after it.
type Guard struct {
	Slot    uint32 `json:"slot" yaml:"slot"`
	Version uint64 `json:"version" yaml:"version"`
}

// Rule answers requests that satisfy all its Conditions with a reply of
// ReplyLen bytes written by its Processors; reply bytes no processor writes are zero.
// A request (UDP payload) shorter than MinLen or longer than MaxLen does not
// match; 0 is no bound. A rule whose Guards do not all hold does not match.
// Of several matching rules the one with the lowest Priority wins, then the
// one added first. Close (TCP only) makes the reply end the connection: it
// goes out with FIN. The data plane stores it for any rule set; santad
// refuses it for UDP sockets. A rule with Expires (Unix seconds) no longer
// matches from that time on: the data plane keeps to it by itself, so it
// holds while no santad runs to remove the rule.
type Rule struct {
	Conditions []Condition `json:"conditions" yaml:"conditions"`
	Processors []Processor `json:"processors" yaml:"processors"`
	ReplyLen   int         `json:"reply_len" yaml:"reply_len"`
	Priority   uint32      `json:"priority,omitempty" yaml:"priority,omitempty"`
	MinLen     int         `json:"min_len,omitempty" yaml:"min_len,omitempty"`
	MaxLen     int         `json:"max_len,omitempty" yaml:"max_len,omitempty"`
	Guards     []Guard     `json:"guards,omitempty" yaml:"guards,omitempty"`
	Close      bool        `json:"close,omitempty" yaml:"close,omitempty"`
	Expires    uint64      `json:"expires,omitempty" yaml:"expires,omitempty"`
}

// ErrInvalidRule wraps every reason a rule is refused.
var ErrInvalidRule = errors.New("invalid rule")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRule, fmt.Sprintf(format, args...))
}

// compiledRule is a validated rule in the data plane's terms: the reply
// flattened into a template with zeroed gaps plus disjoint copy segments.
type compiledRule struct {
	conds     []Condition // Mask nil where every bit is compared
	anchor    int         // index of the condition that hangs the rule on a region
	anchorLen int         // bytes at the anchor's start it compares in full
	template  []byte
	copies    []santaSantaCopy
	copyMasks [][MaxCopyMask]byte // of the masked copies, in order; after the template in the page
	minLen    int
	maxLen    int
	tplCsum   uint16
	priority  uint32
	guards    []santaSantaGuard
	flags     uint8  // santa_rule.flags: SANTA_RULE_*
	expires   uint64 // santa_rule.expires: CLOCK_MONOTONIC ns, with SANTA_RULE_EXPIRES
}

// fullLen is how many bytes at the start of cond are compared in full.
func fullLen(cond Condition) int {
	if cond.Mask == nil {
		return len(cond.Pattern)
	}
	n := 0
	for n < len(cond.Mask) && cond.Mask[n] == 0xff {
		n++
	}
	return n
}

// storedMask is mask as the data plane stores it: nil for none or all ones.
func storedMask(mask []byte) []byte {
	if len(mask) == 0 || bytes.Count(mask, []byte{0xff}) == len(mask) {
		return nil
	}
	return bytes.Clone(mask)
}

func compileRule(r Rule) (*compiledRule, error) {
	if len(r.Conditions) == 0 {
		return nil, invalid("a rule needs at least one condition")
	}
	if len(r.Conditions) > MaxConds {
		return nil, invalid("%d conditions: at most %d per rule", len(r.Conditions), MaxConds)
	}
	c := &compiledRule{priority: r.Priority}
	if r.Close {
		c.flags |= uint8(santaSantaLimitSANTA_RULE_CLOSE)
	}
	if r.Expires != 0 {
		at, err := monotonicAt(r.Expires)
		if err != nil {
			return nil, err
		}
		c.flags |= uint8(santaSantaLimitSANTA_RULE_EXPIRES)
		c.expires = at
	}
	for i, cond := range r.Conditions {
		switch {
		case len(cond.Pattern) == 0:
			return nil, invalid("condition %d: empty pattern", i)
		case len(cond.Pattern) > MaxPattern:
			return nil, invalid("condition %d: pattern of %d bytes: at most %d", i, len(cond.Pattern), MaxPattern)
		case cond.Offset < 0 || cond.Offset+len(cond.Pattern) > ReqWindow:
			return nil, invalid("condition %d: bytes %d..%d lie outside the first %d bytes of the request the matcher sees",
				i, cond.Offset, cond.Offset+len(cond.Pattern), ReqWindow)
		case len(cond.Mask) > 0 && len(cond.Mask) != len(cond.Pattern):
			return nil, invalid("condition %d: mask of %d bytes for a pattern of %d: give one mask byte per pattern byte",
				i, len(cond.Mask), len(cond.Pattern))
		}
		for j := range cond.Mask {
			if extra := cond.Pattern[j] &^ cond.Mask[j]; extra != 0 {
				return nil, invalid("condition %d: pattern byte %d (%#02x) has bits %#02x outside its mask (%#02x): clear them",
					i, j, cond.Pattern[j], extra, cond.Mask[j])
			}
		}
		cond = Condition{Offset: cond.Offset, Pattern: bytes.Clone(cond.Pattern), Mask: storedMask(cond.Mask)}
		c.conds = append(c.conds, cond)
		c.minLen = max(c.minLen, cond.Offset+len(cond.Pattern))
		// anchor on the longest run of bytes compared in full: its region
		// tells rules apart best
		if n := fullLen(cond); n > c.anchorLen {
			c.anchor, c.anchorLen = i, n
		}
	}
	if c.anchorLen == 0 {
		return nil, invalid("no condition compares its first byte in full (mask 0xff): " +
			"the matcher finds rules by hashing such bytes")
	}
	// UDP replies are one frame (santad checks MaxReply against the socket)
	if r.ReplyLen < 1 || r.ReplyLen > MaxTCPReply {
		return nil, invalid("reply length %d: must be between 1 and %d", r.ReplyLen, MaxTCPReply)
	}
	if len(r.Processors) == 0 {
		return nil, invalid("a rule needs at least one processor")
	}
	if len(r.Processors) > MaxProcessors {
		return nil, invalid("%d processors: a rule has at most %d (write adjacent bytes with one put)", len(r.Processors), MaxProcessors)
	}

	// Flatten: which source every reply byte ends up with. Most replies are
	// short: their record stays on the stack (a million rules made a
	// gigabyte of garbage here).
	var short [512]replyByte
	var flat []replyByte
	if r.ReplyLen <= len(short) {
		flat = short[:r.ReplyLen]
	} else {
		flat = make([]replyByte, r.ReplyLen)
	}
	c.template = make([]byte, r.ReplyLen)
	for i, p := range r.Processors {
		switch p.Kind {
		case Put:
			if len(p.Template) == 0 {
				return nil, invalid("processor %d (put): empty template", i)
			}
			if len(p.Mask) > 0 {
				return nil, invalid("processor %d (put): only copies take a mask", i)
			}
			if p.ReplyOffset < 0 || p.ReplyOffset+len(p.Template) > r.ReplyLen {
				return nil, invalid("processor %d (put): writes reply bytes %d..%d of a %d-byte reply",
					i, p.ReplyOffset, p.ReplyOffset+len(p.Template), r.ReplyLen)
			}
			for j, b := range p.Template {
				flat[p.ReplyOffset+j].from, c.template[p.ReplyOffset+j] = fromTemplate, b
			}
		case Copy:
			if p.Length < 1 {
				return nil, invalid("processor %d (copy): length %d must be positive", i, p.Length)
			}
			if p.ReplyOffset < 0 || p.ReplyOffset+p.Length > r.ReplyLen {
				return nil, invalid("processor %d (copy): writes reply bytes %d..%d of a %d-byte reply",
					i, p.ReplyOffset, p.ReplyOffset+p.Length, r.ReplyLen)
			}
			if p.SrcOffset < 0 || p.SrcOffset+p.Length > ReqWindow {
				return nil, invalid("processor %d (copy): request bytes %d..%d lie outside the first %d bytes",
					i, p.SrcOffset, p.SrcOffset+p.Length, ReqWindow)
			}
			if len(p.Mask) > 0 && p.Length > MaxCopyMask {
				return nil, invalid("processor %d (copy): a masked copy of %d bytes: masked copies hold at most %d",
					i, p.Length, MaxCopyMask)
			}
			if len(p.Mask) > 0 && len(p.Mask) != p.Length {
				return nil, invalid("processor %d (copy): mask of %d bytes for a copy of %d: give one mask byte per copied byte",
					i, len(p.Mask), p.Length)
			}
			m := storedMask(p.Mask)
			for j := 0; j < p.Length; j++ {
				d := p.ReplyOffset + j
				if m == nil {
					flat[d], c.template[d] = replyByte{from: fromRequest, src: uint16(p.SrcOffset + j)}, 0
					continue
				}
				if (flat[d].from == fromRequest || flat[d].from == fromMasked) && m[j] != 0xff {
					return nil, invalid("processor %d (copy): mask byte %d (%#02x) would mix request bits into reply byte %d, "+
						"which an earlier copy wrote; a masked copy keeps only bits a put wrote (or zero)", i, j, m[j], d)
				}
				flat[d] = replyByte{from: fromMasked, src: uint16(p.SrcOffset + j), by: uint8(i), mask: m[j]}
				c.template[d] &^= m[j]
			}
			c.minLen = max(c.minLen, p.SrcOffset+p.Length)
		default:
			return nil, invalid("processor %d: unknown kind %d (want put or copy)", i, p.Kind)
		}
	}
	// Segments: runs of reply bytes from consecutive request bytes; a masked
	// copy's run stays a segment of its own, its mask stored after the template.
	for i := 0; i < r.ReplyLen; {
		if f := flat[i].from; f != fromRequest && f != fromMasked {
			i++
			continue
		}
		j := i + 1
		for j < r.ReplyLen && flat[j].from == flat[i].from && flat[j].src == flat[j-1].src+1 &&
			(flat[i].from == fromRequest || flat[j].by == flat[i].by) {
			j++
		}
		seg := santaSantaCopy{Src: flat[i].src, Dst: uint16(i), Len: uint16(j - i)}
		if flat[i].from == fromMasked {
			var m [MaxCopyMask]byte
			for k := i; k < j; k++ {
				m[k-i] = flat[k].mask
			}
			seg.Mask = uint16(align8(r.ReplyLen) + MaxCopyMask*len(c.copyMasks))
			c.copyMasks = append(c.copyMasks, m)
		}
		c.copies = append(c.copies, seg)
		i = j
	}
	if len(c.copies) > MaxCopies {
		return nil, invalid("the copies form %d separate segments of the reply: at most %d", len(c.copies), MaxCopies)
	}
	if err := c.lengthBounds(r); err != nil {
		return nil, err
	}
	if len(r.Guards) > MaxGuards {
		return nil, invalid("%d guards: at most %d per rule", len(r.Guards), MaxGuards)
	}
	for i, g := range r.Guards {
		if g.Slot >= uint32(GuardSlots) {
			return nil, invalid("guard %d: slot %d is past the guard map's %d slots", i, g.Slot, GuardSlots)
		}
		c.guards = append(c.guards, santaSantaGuard{Slot: g.Slot, Version: g.Version})
	}
	c.tplCsum = csumLE(c.template)
	return c, nil
}

// Where a reply byte comes from (replyByte.from).
const (
	fromZero = iota
	fromTemplate
	fromRequest
	fromMasked
)

// replyByte is where one reply byte comes from, as compileRule flattens the
// processors: src is the request byte (fromRequest, fromMasked), by the
// masked copy's processor and mask the bits it takes from the request.
type replyByte struct {
	src  uint16
	from uint8
	by   uint8
	mask uint8
}

// lengthBounds checks the rule's request length bounds against what its
// conditions and copies read (c.minLen so far) and sets c.minLen and c.maxLen.
func (c *compiledRule) lengthBounds(r Rule) error {
	switch {
	case r.MinLen < 0 || r.MinLen > ReqWindow:
		return invalid("min length %d: must be between 0 and %d (the request bytes the matcher sees)", r.MinLen, ReqWindow)
	case r.MaxLen < 0 || r.MaxLen > ReqWindow:
		return invalid("max length %d: must be between 0 and %d (the request bytes the matcher sees)", r.MaxLen, ReqWindow)
	case r.MaxLen > 0 && r.MaxLen < c.minLen:
		return invalid("max length %d: the conditions and copies read %d request bytes, so the rule could never match",
			r.MaxLen, c.minLen)
	case r.MaxLen > 0 && r.MinLen > r.MaxLen:
		return invalid("min length %d exceeds max length %d", r.MinLen, r.MaxLen)
	}
	c.minLen = max(c.minLen, r.MinLen)
	c.maxLen = ReqWindow
	if r.MaxLen > 0 {
		c.maxLen = r.MaxLen
	}
	return nil
}

// dataLen is the rule's bytes in a data page: patterns, their masks and the
// template, each 8-aligned, then the copies' masks (install lays them out).
func (c *compiledRule) dataLen() int {
	n := align8(len(c.template)) + MaxCopyMask*len(c.copyMasks)
	for _, cond := range c.conds {
		n += align8(len(cond.Pattern)) + align8(len(cond.Mask))
	}
	return n
}

func align8(n int) int { return (n + 7) &^ 7 }

// csumLE is the folded ones' complement sum of b as 16-bit words loaded in
// little-endian order: what the rule processor's csum_bytes computes.
func csumLE(b []byte) uint16 {
	var sum uint64
	for i := 0; i+1 < len(b); i += 2 {
		sum += uint64(b[i]) | uint64(b[i+1])<<8
	}
	if len(b)%2 == 1 {
		sum += uint64(b[len(b)-1])
	}
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}
