package dataplane

import (
	"bytes"
	"reflect"
	"strings"
	"testing"
)

// A rule comes back from its packed form as it was given, and the packed
// form owns its bytes.
func TestPackedRule(t *testing.T) {
	long := bytes.Repeat([]byte{0xab}, MaxTCPReply)
	rules := map[string]Rule{
		"dns": {
			Conditions: []Condition{
				{Offset: 2, Pattern: []byte{0x00, 0x00}, Mask: []byte{0x80, 0x00}},
				{Offset: 12, Pattern: []byte("\x07example\x03com\x00\x00\x01\x00\x01")},
			},
			Processors: []Processor{
				{Kind: Put, ReplyOffset: 0, Template: []byte("\x00\x00\x81\x80\x00\x01\x00\x01")},
				{Kind: Copy, ReplyOffset: 0, SrcOffset: 0, Length: 2},
				{Kind: Copy, ReplyOffset: 2, SrcOffset: 2, Length: 1, Mask: []byte{0x01}},
			},
			ReplyLen: 45,
			MinLen:   29,
			MaxLen:   512,
			Expires:  1<<40 + 7,
		},
		"everything": {
			Conditions: []Condition{{Offset: ReqWindow - 1, Pattern: []byte{1}}},
			Processors: []Processor{{Kind: Put, ReplyOffset: 3, Template: long[:MaxTCPReply-3]},
				{Kind: Put, Template: []byte{9}, SrcOffset: -5, Length: -1}},
			ReplyLen: MaxTCPReply,
			Priority: 1<<32 - 1,
			Guards:   []Guard{{Slot: uint32(GuardSlots - 1), Version: 1<<64 - 1}, {Slot: 0, Version: 0}},
			Close:    true,
		},
		"bare": {Conditions: []Condition{{Pattern: []byte("x")}}, Processors: []Processor{{Kind: Copy, Length: 1}}, ReplyLen: 1},
	}
	for name, r := range rules {
		p := packRule(r)
		got, err := p.unpack()
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if !reflect.DeepEqual(got, r) {
			t.Errorf("%s: unpacked\n%+v\nwant\n%+v", name, got, r)
		}
		got.Conditions[0].Pattern[0] ^= 0xff // a listing's caller may keep and change it
		r.Conditions[0].Pattern[0] ^= 0xff   // so may the one who added the rule
		again, _ := p.unpack()
		if r.Conditions[0].Pattern[0] ^= 0xff; !reflect.DeepEqual(again, r) {
			t.Errorf("%s: the packed rule shares bytes with its source or a listing", name)
		}
		for cut := 1; cut < len(p); cut += 1 + len(p)/7 {
			if _, err := p[:len(p)-cut].unpack(); err == nil || !strings.HasPrefix(err.Error(), "packed rule:") {
				t.Errorf("%s: cut by %d bytes: error %v", name, cut, err)
			}
		}
		if _, err := append(p[:len(p):len(p)], 0).unpack(); err == nil {
			t.Errorf("%s: a trailing byte went unnoticed", name)
		}
	}
	if n := len(packRule(rules["dns"])); n > 80 {
		t.Errorf("a DNS-like rule packs into %d bytes", n)
	}
}
