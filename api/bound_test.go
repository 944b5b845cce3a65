package api

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"runtime"
	"testing"
)

// decodeAllocs is what decoding data allocates, in bytes.
func decodeAllocs(t *testing.T, data []byte) uint64 {
	t.Helper()
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	if _, err := Decode(data); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	return after.TotalAlloc - before.TotalAlloc
}

// TestDecodedBound: DecodedBound holds what decoding allocates, for
// messages of tiny elements (which decode to over 100 times their size)
// and for real rules, and takes every shared test vector.
func TestDecodedBound(t *testing.T) {
	const n = 100000
	ruleArray := func(rule []byte) []byte { // {0: 1, 1: add, 9: [rule × n]}
		b := binary.BigEndian.AppendUint32([]byte{0xa3, 0x00, 0x01, 0x01, byte(OpAdd), 0x09, 0x9a}, n)
		return append(b, bytes.Repeat(rule, n)...)
	}
	real, err := Encode(&Message{V: Version, Op: OpAdd, Rules: func() []Rule {
		rules := make([]Rule, n)
		for i := range rules {
			rules[i] = Rule{Conditions: []Condition{{Offset: 2, Pattern: Bytes("\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03www\x07example\x03com\x00")}},
				Processors: []Processor{{Kind: KindCopy, Length: 2}, {Kind: KindPut, ReplyOffset: 2, Template: bytes.Repeat([]byte{0x81}, 60)}},
				ReplyLen:   62, Tag: "santa-dns"}
		}
		return rules
	}()})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := Encode(&Message{V: Version, Op: OpDelete, Socket: 1, IDs: make([]uint64, n)})
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{
		"empty rules":     ruleArray([]byte{0xa0}),
		"priority 1 only": ruleArray([]byte{0xa1, 0x05, 0x01}),
		"DNS rules":       real,
		"ids":             ids,
	} {
		bound, err := DecodedBound(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		allocs := decodeAllocs(t, data)
		t.Logf("%s: %d bytes, decoding allocates %d, bound %d", name, len(data), allocs, bound)
		if uint64(bound) < allocs {
			t.Errorf("%s: bound %d below the %d bytes decoding allocates", name, bound, allocs)
		}
	}
	for _, v := range readVectors(t, vectorsPath, len(vectorMessages)) {
		b, err := hex.DecodeString(v.CBOR)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodedBound(b); err != nil {
			t.Errorf("%s: %v", v.Name, err)
		}
	}
}
