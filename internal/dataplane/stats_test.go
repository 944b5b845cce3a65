package dataplane

import (
	"testing"

	"github.com/cilium/ebpf"
)

// countersOf reads the counters of the slots asked for, whichever way it
// reads them: one lookup per slot for a sparse set, batched reads of the
// table up to the highest slot (one short batch, several, up to the table's
// last slot) for a dense one.
func TestCountersOf(t *testing.T) {
	d, err := Load(Config{MaxRules: 3 * statsBatchSlots})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	table := d.objs.SantaRuleStats
	last := table.MaxEntries() - 1
	cpus := ebpf.MustPossibleCPU()
	for _, slot := range []uint32{1, 3, 7, 10, statsBatchSlots - 1, statsBatchSlots, statsBatchSlots + 1, 5000, last} {
		per := make([]santaSantaRuleCounters, cpus)
		for c := range per {
			per[c] = santaSantaRuleCounters{Hits: uint64(slot) + uint64(c), Bytes: 100 * uint64(slot)}
		}
		if err := table.Update(slot, per, ebpf.UpdateAny); err != nil {
			t.Fatal(err)
		}
	}
	var dense []uint32 // every slot below 5001: read in two batches
	for s := uint32(0); s <= 5000; s++ {
		dense = append(dense, s)
	}
	for _, slots := range [][]uint32{
		{3, 7, 10}, // one short batch
		dense,      // crosses a batch's end
		{statsBatchSlots - 1, statsBatchSlots, statsBatchSlots + 1}, // sparse: a lookup each
		{10, last - 5, last}, // sparse up to the table's end
	} {
		highest := uint32(0)
		for _, s := range slots {
			highest = max(highest, s)
		}
		got, err := d.countersOf(slots, highest)
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range slots {
			if want := d.slotCounters(s); got[i] != want {
				t.Fatalf("countersOf(%d slots up to %d): slot %d has %+v, want %+v", len(slots), highest, s, got[i], want)
			}
		}
	}
	all, err := d.countersUpTo(last)
	if err != nil || uint32(len(all)) != last+1 || all[last] != d.slotCounters(last) || all[5000].Hits == 0 {
		t.Fatalf("countersUpTo(the table's last slot): %d slots, last %+v, %v", len(all), all[len(all)-1], err)
	}
}
