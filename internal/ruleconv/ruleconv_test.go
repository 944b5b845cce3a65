package ruleconv

import (
	"reflect"
	"testing"

	"github.com/santa-offload/santa/api"
)

// Every field survives api -> dataplane -> api, and ToAPI copies the bytes.
func TestRoundTrip(t *testing.T) {
	r := api.Rule{
		Conditions: []api.Condition{{Offset: 2, Pattern: api.Bytes{0x01, 0x00}, Mask: api.Bytes{0x0f, 0xff}}, {Offset: 4, Pattern: api.Bytes("abc")}},
		Processors: []api.Processor{
			{Kind: api.KindPut, ReplyOffset: 1, Template: api.Bytes("xyz")},
			{Kind: api.KindCopy, ReplyOffset: 2, SrcOffset: 3, Length: 2, Mask: api.Bytes{0x01, 0x10}}},
		ReplyLen: 9, Priority: 4, MinLen: 7, MaxLen: 300, Close: true, Expires: 1_900_000_000,
		Guards: []api.Guard{{Slot: 7, Version: 3}, {Slot: 1<<20 - 1, Version: 1 << 40}},
	}
	got := ToAPI(ToDataplane(r))
	if !reflect.DeepEqual(got, r) {
		t.Fatalf("round trip\n got %+v\nwant %+v", got, r)
	}
	got.Conditions[0].Mask[0] = 0
	got.Processors[1].Mask[0] = 0
	if r.Conditions[0].Mask[0] != 0x0f || r.Processors[1].Mask[0] != 0x01 {
		t.Error("ToAPI shares the masks with its argument")
	}
}
