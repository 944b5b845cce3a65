package dataplane

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func masked(off int, pattern, mask string) Condition {
	return Condition{Offset: off, Pattern: []byte(pattern), Mask: []byte(mask)}
}

func copyMasked(dst, src int, mask string) Processor {
	return Processor{Kind: Copy, ReplyOffset: dst, SrcOffset: src, Length: len(mask), Mask: []byte(mask)}
}

// A masked condition compares only the bits its mask has; the word-wise
// compare and the 1..7-byte tail both honour it.
func TestMaskedConditions(t *testing.T) {
	e := newEnv(t, Config{})
	for _, v6 := range []bool{false, true} {
		c, s := fixtureAddrs(e, v6, 7700)
		rules := []Rule{
			// a full condition to hang on, and a 12-byte masked one (one word and a 4-byte tail)
			{Conditions: []Condition{cond(0, "MASK"),
				masked(4, "\x01\x00\x00\x00\x00\x00\x00\x80"+"ab\x00\x00", "\x0f\xff\x00\x00\x00\x00\x00\xc0"+"\xff\xff\x00\x01")},
				Processors: []Processor{put(0, "masked")}, ReplyLen: 6},
			// the anchor is the fully compared prefix "PRE" of a masked condition
			{Conditions: []Condition{masked(0, "PRE\x05", "\xff\xff\xff\x0f")}, Processors: []Processor{put(0, "prefix")}, ReplyLen: 6},
		}
		e.bindRules(e.socket(s, false), rules...)
		for _, tc := range []struct {
			req  string
			want string // "" for a miss
		}{
			{"MASK\x01\x00\x00\x00\x00\x00\x00\x80ab\x00\x00", "masked"},
			{"MASK\xf1\x00\xff\xff\xff\xff\xff\xbfab\xff\xfe", "masked"}, // every bit outside the mask differs
			{"MASK\x02\x00\x00\x00\x00\x00\x00\x80ab\x00\x00", ""},       // a compared bit of the first byte
			{"MASK\x01\x01\x00\x00\x00\x00\x00\x80ab\x00\x00", ""},       // a fully compared byte
			{"MASK\x01\x00\x00\x00\x00\x00\x00\x40ab\x00\x00", ""},       // a compared bit of the word's last byte
			{"MASK\x01\x00\x00\x00\x00\x00\x00\x80ac\x00\x00", ""},       // in the tail
			{"MASK\x01\x00\x00\x00\x00\x00\x00\x80ab\x00\x01", ""},       // the tail's last compared bit
			{"MASK\x01\x00\x00\x00\x00\x00\x00\x80ab\x00", ""},           // too short
			{"PRE\x05", "prefix"},
			{"PRE\xf5", "prefix"},
			{"PRE\x06", ""},
			{"PRF\x05", ""},
		} {
			name := fmt.Sprintf("v6=%v %q", v6, tc.req)
			req := request(c, s, tc.req)
			if tc.want == "" {
				e.expect(name, req.build(t), xdpPass, nil, "pass_no_match")
			} else {
				e.expect(name, req.build(t), xdpTx, req.answer([]byte(tc.want)).build(t), "answered")
			}
		}
	}
}

// Rules whose fully compared bytes differ are disjoint even where their
// masked bytes would overlap; rules that differ only in masked bits are not.
func TestMaskedDisjoint(t *testing.T) {
	rules := func(rs ...Rule) []*compiledRule {
		out, err := compileAll(rs)
		if err != nil {
			t.Fatal(err)
		}
		return out
	}
	a := Rule{Conditions: []Condition{masked(0, "ab\x00", "\xff\xff\x00")}, Processors: []Processor{put(0, "a")}, ReplyLen: 1}
	b := Rule{Conditions: []Condition{masked(0, "ac\x00", "\xff\xff\x00")}, Processors: []Processor{put(0, "b")}, ReplyLen: 1}
	c := Rule{Conditions: []Condition{masked(0, "a\x00c", "\xff\x00\xff")}, Processors: []Processor{put(0, "c")}, ReplyLen: 1}
	if newDisjointSet(rules(a, b)) == nil {
		t.Error("ab? and ac? are disjoint")
	}
	if newDisjointSet(rules(a, c)) != nil {
		t.Error("ab? and a?c both match abc: not disjoint")
	}
}

// A masked copy puts the request's bits under its mask into the bits an
// earlier put (or nothing) left; the reply's checksum covers them (the
// expected frames carry gopacket's checksums).
func TestMaskedCopies(t *testing.T) {
	e := newEnv(t, Config{})
	for _, v6 := range []bool{false, true} {
		c, s := fixtureAddrs(e, v6, 7701)
		rules := []Rule{
			// DNS-like: copy the id, put the flags, echo two flag bits
			{Conditions: []Condition{cond(4, "DNS")}, ReplyLen: 6, Processors: []Processor{
				copyP(0, 0, 2), put(2, "\x84\x00\xaa\xbb"), copyMasked(2, 2, "\x01\x10")}},
			// odd offsets, a mask of 8 bytes with 0xff and 0x00 bytes, over zero and template bytes
			{Conditions: []Condition{cond(0, "ODD")}, ReplyLen: 13, Processors: []Processor{
				put(0, "ttttttttttttt"), copyMasked(3, 3, "\xff\x0f\x00\xf0\x01\x80\xff\x7e")}},
			// a later put splits a masked copy; a later copy overwrites part of it
			{Conditions: []Condition{cond(0, "SPLIT")}, ReplyLen: 8, Processors: []Processor{
				copyMasked(1, 5, "\xf0\xf0\xf0\xf0\xf0"), put(3, "P"), copyP(5, 0, 1)}},
			// a masked copy that overwrites an earlier copy's byte whole
			{Conditions: []Condition{cond(0, "WHOLE")}, ReplyLen: 3, Processors: []Processor{
				copyP(0, 0, 2), copyMasked(1, 5, "\xff\x0f")}},
		}
		e.bindRules(e.socket(s, false), rules...)
		for _, tc := range []struct{ req, want string }{
			{"\x12\x34\xff\xffDNS", "\x12\x34\x85\x10\xaa\xbb"},
			{"\x12\x34\x00\x00DNS", "\x12\x34\x84\x00\xaa\xbb"},
			{"ODD\xab\xab\xab\xab\xab\xab\xab\xab", "ttt\xab\x7b\x74\xa4\x75\xf4\xab\x2a" + "tt"},
			{"ODD\x00\x00\x00\x00\x00\x00\x00\x00", "ttt\x00\x70\x74\x04\x74\x74\x00\x00" + "tt"},
			{"SPLIT\x9a\xbc\xde\xf1\x23", "\x00\x90\xb0P\xf0S\x00\x00"},
			{"WHOLE\xab\xcd", "W\xab\x0d"},
		} {
			name := fmt.Sprintf("v6=%v %q", v6, tc.req)
			req := request(c, s, tc.req)
			e.expect(name, req.build(t), xdpTx, req.answer([]byte(tc.want)).build(t), "answered")
			req.partialSum = true // a local sender's request: the reply's checksum is still computed in full
			e.expect(name+" partial", req.build(t), xdpTx, req.answer([]byte(tc.want)).build(t), "answered")
		}
	}
}

// MinLen and MaxLen bound the request's payload length; a request out of a
// rule's bounds is left to other rules.
func TestRequestLengthBounds(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7702)
	bounded := Rule{Conditions: []Condition{cond(0, "LEN")}, Processors: []Processor{put(0, "bounded")}, ReplyLen: 7,
		MinLen: 10, MaxLen: 12}
	exact := Rule{Conditions: []Condition{cond(0, "EXACT")}, Processors: []Processor{put(0, "exact")}, ReplyLen: 5,
		MinLen: 8, MaxLen: 8}
	atMost := Rule{Conditions: []Condition{cond(0, "MAX")}, Processors: []Processor{put(0, "max")}, ReplyLen: 3, MaxLen: 5}
	fallback := Rule{Conditions: []Condition{cond(0, "LEN")}, Processors: []Processor{put(0, "other")}, ReplyLen: 5, Priority: 1}
	e.bindRules(e.socket(s, false), bounded, exact, atMost, fallback)
	for _, tc := range []struct {
		n    int
		head string
		want string // "" for a miss
	}{
		{9, "LEN", "other"}, {10, "LEN", "bounded"}, {11, "LEN", "bounded"}, {12, "LEN", "bounded"}, {13, "LEN", "other"},
		{7, "EXACT", ""}, {8, "EXACT", "exact"}, {9, "EXACT", ""},
		{3, "MAX", "max"}, {4, "MAX", "max"}, {5, "MAX", "max"}, {6, "MAX", ""},
	} {
		name := fmt.Sprintf("%s of %d bytes", tc.head, tc.n)
		req := request(c, s, tc.head+strings.Repeat(".", tc.n-len(tc.head)))
		if tc.want == "" {
			e.expect(name, req.build(t), xdpPass, nil, "pass_no_match")
		} else {
			e.expect(name, req.build(t), xdpTx, req.answer([]byte(tc.want)).build(t), "answered")
		}
	}
}

// Rules with masks and bounds are listed as given, and restore from the listing.
func TestMaskedRulesListed(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7703)
	sock := e.socket(s, false)
	r := Rule{Conditions: []Condition{masked(0, "ab\x00", "\xff\xff\x0f"), masked(3, "xy", "\xff\xff")},
		Processors: []Processor{put(0, "r"), copyMasked(1, 2, "\xf0")}, ReplyLen: 2, MinLen: 6, MaxLen: 9}
	e.bindRules(sock, r)
	list, err := e.d.ListRules(sock)
	if err != nil || len(list) != 1 || !reflect.DeepEqual(list[0].Rule, r) {
		t.Fatalf("listed %+v (%v), want %+v", list, err, r)
	}
	if _, err := e.d.ReplaceRules(sock, nil); err != nil {
		t.Fatal(err)
	}
	list[0].ID += 100
	if err := e.d.RestoreRules(sock, list); err != nil {
		t.Fatal(err)
	}
	req := request(c, s, "ab\xf0xy.")
	e.expect("restored", req.build(t), xdpTx, req.answer([]byte("r\xf0")).build(t), "answered")
}

func TestMaskAndLengthRefusals(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7704)
	sock := e.socket(s, false)
	e.bindRules(sock, reply("good", "G"))
	one := []Processor{put(0, "x")}
	for name, tc := range map[string]struct {
		rule Rule
		want string
	}{
		"mask shorter than pattern": {Rule{Conditions: []Condition{masked(0, "abc", "\xff\xff")}, Processors: one, ReplyLen: 1},
			"condition 0: mask of 2 bytes for a pattern of 3"},
		"pattern bits outside mask": {Rule{Conditions: []Condition{cond(0, "a"), masked(1, "\x00\x31", "\xff\x0f")}, Processors: one, ReplyLen: 1},
			"condition 1: pattern byte 1 (0x31) has bits 0x30 outside its mask (0x0f)"},
		"no anchorable byte": {Rule{Conditions: []Condition{masked(0, "a", "\x7f"), masked(4, "\x00b", "\x00\xff")}, Processors: one, ReplyLen: 1},
			"no condition compares its first byte in full"},
		"copy mask too long": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: []Processor{copyMasked(0, 0, "123456789")}, ReplyLen: 9},
			"masked copies hold at most 8"},
		"copy mask length": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: []Processor{{Kind: Copy, Length: 2, Mask: []byte{1}}}, ReplyLen: 2},
			"processor 0 (copy): mask of 1 bytes for a copy of 2"},
		"mask on a put": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: []Processor{{Kind: Put, Template: []byte("x"), Mask: []byte{1}}}, ReplyLen: 1},
			"processor 0 (put): only copies take a mask"},
		"masked copy over a copy": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: []Processor{copyP(0, 0, 2), copyMasked(1, 4, "\x0f")}, ReplyLen: 2},
			"processor 1 (copy): mask byte 0 (0x0f) would mix request bits into reply byte 1"},
		"max below a condition": {Rule{Conditions: []Condition{cond(0, "a"), cond(8, "b")}, Processors: one, ReplyLen: 1, MaxLen: 8},
			"max length 8: the conditions and copies read 9 request bytes"},
		"max below a copy": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: []Processor{copyP(0, 9, 1)}, ReplyLen: 1, MaxLen: 9},
			"max length 9: the conditions and copies read 10 request bytes"},
		"min above max": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: one, ReplyLen: 1, MinLen: 6, MaxLen: 5},
			"min length 6 exceeds max length 5"},
		"max past window": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: one, ReplyLen: 1, MaxLen: ReqWindow + 1},
			"max length 1473: must be between 0 and 1472"},
		"negative min": {Rule{Conditions: []Condition{cond(0, "a")}, Processors: one, ReplyLen: 1, MinLen: -1},
			"min length -1: must be between 0 and 1472"},
	} {
		_, err := e.d.AddRules(sock, []Rule{reply("fine", "F"), tc.rule})
		if !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want ErrInvalidRule saying %q", name, err, tc.want)
		}
	}
	e.expect("nothing installed", request(c, s, "fine").build(t), xdpPass, nil, "pass_no_match")
}
