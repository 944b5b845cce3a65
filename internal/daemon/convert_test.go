package daemon

import (
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
