package daemon

import (
	"bytes"
	"math"
	"strings"
	"testing"

	"github.com/santa-offload/santa/api"
)

// Masks take data memory: they count against the byte quota.
func TestCostCountsMasks(t *testing.T) {
	r := api.Rule{
		Conditions: []api.Condition{{Pattern: api.Bytes("abc"), Mask: api.Bytes{0xff, 0xff, 0x0f}}, {Offset: 4, Pattern: api.Bytes("d")}},
		Processors: []api.Processor{{Kind: api.KindCopy, Length: 2, Mask: api.Bytes{1, 1}}},
		ReplyLen:   10,
	}
	if got, want := cost(r), uint64(10+3+3+1+2); got != want {
		t.Errorf("cost %d, want %d", got, want)
	}
}

// A list_rules page and a compacted journal record stay within the frame
// limit because encodedBound never underestimates a rule's encoding, with
// every field at its largest integer form.
func TestEncodedBound(t *testing.T) {
	big := uint64(math.MaxUint64)
	full := func(n int) api.Bytes { return api.Bytes(bytes.Repeat([]byte{0xff}, n)) }
	rules := []api.Rule{
		{Conditions: []api.Condition{{Pattern: api.Bytes("a")}}, Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("r")}}, ReplyLen: 1},
		{
			ID: big, Version: 1<<32 - 1, ReplyLen: 1<<32 - 1, Priority: 1<<32 - 1, MinLen: 1<<32 - 1, MaxLen: 1<<32 - 1,
			Expires: big, Close: true, Tag: strings.Repeat("t", api.MaxTagLen),
			Guards: []api.Guard{{Slot: 1<<32 - 1, Version: big}, {Slot: 1<<32 - 1, Version: big}},
		},
	}
	for i := 0; i < 4; i++ {
		rules[1].Conditions = append(rules[1].Conditions, api.Condition{Offset: 1<<32 - 1, Pattern: full(1024), Mask: full(1024)})
	}
	for i := 0; i < 40; i++ { // puts may overlap: a rule may carry many
		rules[1].Processors = append(rules[1].Processors,
			api.Processor{Kind: api.KindPut, ReplyOffset: 1<<32 - 1, Template: full(1 + i*300)},
			api.Processor{Kind: api.KindCopy, ReplyOffset: 1<<32 - 1, SrcOffset: 1<<32 - 1, Length: 1<<32 - 1, Mask: full(8)})
	}
	empty, err := api.Encode(&api.Message{})
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range rules {
		enc, err := api.Encode(&api.Message{Rules: []api.Rule{r}})
		if err != nil {
			t.Fatal(err)
		}
		if got, bound := len(enc)-len(empty), encodedBound(r); got > bound {
			t.Errorf("rule %d: encoded in %d bytes, bound %d", i, got, bound)
		}
	}
}
