package dataplane

import (
	"errors"
	"fmt"
)

// Condition holds when the request's UDP payload carries Pattern at Offset.
type Condition struct {
	Offset  int    `json:"offset" yaml:"offset"`
	Pattern []byte `json:"pattern" yaml:"pattern"`
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
// order; a later one overwrites what an earlier one wrote.
type Processor struct {
	Kind        ProcessorKind `json:"kind" yaml:"kind"`
	ReplyOffset int           `json:"reply_offset" yaml:"reply_offset"`
	Template    []byte        `json:"template,omitempty" yaml:"template,omitempty"`     // Put
	SrcOffset   int           `json:"src_offset,omitempty" yaml:"src_offset,omitempty"` // Copy
	Length      int           `json:"length,omitempty" yaml:"length,omitempty"`         // Copy
}

// Rule answers requests that satisfy all its Conditions with a reply of
// ReplyLen bytes written by its Processors; reply bytes no processor writes are zero.
// Of several matching rules the one with the lowest Priority wins, then the
// one added first.
type Rule struct {
	Conditions []Condition `json:"conditions" yaml:"conditions"`
	Processors []Processor `json:"processors" yaml:"processors"`
	ReplyLen   int         `json:"reply_len" yaml:"reply_len"`
	Priority   uint32      `json:"priority,omitempty" yaml:"priority,omitempty"`
}

// ErrInvalidRule wraps every reason a rule is refused.
var ErrInvalidRule = errors.New("invalid rule")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrInvalidRule, fmt.Sprintf(format, args...))
}

// compiledRule is a validated rule in the data plane's terms: the reply
// flattened into a template with zeroed gaps plus disjoint copy segments.
type compiledRule struct {
	conds    []Condition
	anchor   int // index of the condition that hangs the rule on a region
	template []byte
	copies   []santaSantaCopy
	minLen   int
	tplCsum  uint16
	priority uint32
}

func compileRule(r Rule) (*compiledRule, error) {
	if len(r.Conditions) == 0 {
		return nil, invalid("a rule needs at least one condition")
	}
	if len(r.Conditions) > MaxConds {
		return nil, invalid("%d conditions: at most %d per rule", len(r.Conditions), MaxConds)
	}
	c := &compiledRule{priority: r.Priority}
	for i, cond := range r.Conditions {
		switch {
		case len(cond.Pattern) == 0:
			return nil, invalid("condition %d: empty pattern", i)
		case len(cond.Pattern) > MaxPattern:
			return nil, invalid("condition %d: pattern of %d bytes: at most %d", i, len(cond.Pattern), MaxPattern)
		case cond.Offset < 0 || cond.Offset+len(cond.Pattern) > ReqWindow:
			return nil, invalid("condition %d: bytes %d..%d lie outside the first %d bytes of the request the matcher sees",
				i, cond.Offset, cond.Offset+len(cond.Pattern), ReqWindow)
		}
		c.conds = append(c.conds, Condition{Offset: cond.Offset, Pattern: append([]byte(nil), cond.Pattern...)})
		c.minLen = max(c.minLen, cond.Offset+len(cond.Pattern))
		// anchor on the longest condition: its region tells rules apart best
		if len(cond.Pattern) > len(c.conds[c.anchor].Pattern) {
			c.anchor = i
		}
	}
	if r.ReplyLen < 1 || r.ReplyLen > MaxReply {
		return nil, invalid("reply length %d: must be between 1 and %d", r.ReplyLen, MaxReply)
	}
	if len(r.Processors) == 0 {
		return nil, invalid("a rule needs at least one processor")
	}

	// Flatten: which source every reply byte ends up with.
	const fromZero, fromTemplate, fromRequest = 0, 1, 2
	kind := make([]byte, r.ReplyLen)
	src := make([]int, r.ReplyLen)
	c.template = make([]byte, r.ReplyLen)
	for i, p := range r.Processors {
		switch p.Kind {
		case Put:
			if len(p.Template) == 0 {
				return nil, invalid("processor %d (put): empty template", i)
			}
			if p.ReplyOffset < 0 || p.ReplyOffset+len(p.Template) > r.ReplyLen {
				return nil, invalid("processor %d (put): writes reply bytes %d..%d of a %d-byte reply",
					i, p.ReplyOffset, p.ReplyOffset+len(p.Template), r.ReplyLen)
			}
			for j, b := range p.Template {
				kind[p.ReplyOffset+j], c.template[p.ReplyOffset+j] = fromTemplate, b
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
			for j := 0; j < p.Length; j++ {
				kind[p.ReplyOffset+j], src[p.ReplyOffset+j] = fromRequest, p.SrcOffset+j
				c.template[p.ReplyOffset+j] = 0
			}
			c.minLen = max(c.minLen, p.SrcOffset+p.Length)
		default:
			return nil, invalid("processor %d: unknown kind %d (want put or copy)", i, p.Kind)
		}
	}
	for i := 0; i < r.ReplyLen; {
		if kind[i] != fromRequest {
			i++
			continue
		}
		j := i + 1
		for j < r.ReplyLen && kind[j] == fromRequest && src[j] == src[j-1]+1 {
			j++
		}
		c.copies = append(c.copies, santaSantaCopy{Src: uint16(src[i]), Dst: uint16(i), Len: uint16(j - i)})
		i = j
	}
	if len(c.copies) > MaxCopies {
		return nil, invalid("the copies form %d separate segments of the reply: at most %d", len(c.copies), MaxCopies)
	}
	c.tplCsum = csumLE(c.template)
	return c, nil
}

// dataLen is the rule's bytes in a data page: patterns and template, each 8-aligned.
func (c *compiledRule) dataLen() int {
	n := align8(len(c.template))
	for _, cond := range c.conds {
		n += align8(len(cond.Pattern))
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
