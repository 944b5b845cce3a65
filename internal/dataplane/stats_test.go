package dataplane

import (
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

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

// A rule in a reused slot counts from zero: the slot's per-CPU counters are
// reset, in one batch with every slot that thawed with it, when its
// quarantine is over. With room for one rule, the second rule waits for the
// first one's slot.
func TestReusedSlotCountsFromZero(t *testing.T) {
	e := newEnv(t, Config{MaxRules: 1})
	c, s := fixtureAddrs(e, false, 7230)
	sock := e.socket(s, false)
	answer := func(req, want string) {
		t.Helper()
		p := request(c, s, req)
		e.expect(req, p.build(t), xdpTx, p.answer([]byte(want)).build(t), "answered")
	}
	hits := func(id RuleID) uint64 {
		t.Helper()
		stats, err := e.d.RuleStats(sock)
		if err != nil {
			t.Fatal(err)
		}
		return stats[id].Hits
	}
	first := e.bindRules(sock, reply("key-a", "A"))
	answer("key-a", "A")
	answer("key-a", "A")
	slot := e.d.byID[first[0]].slot
	if n := hits(first[0]); n != 2 {
		t.Fatalf("first rule: %d hits, want 2", n)
	}
	if err := e.d.DeleteRules(sock, first); err != nil {
		t.Fatal(err)
	}
	second, err := e.d.AddRules(sock, []Rule{reply("key-b", "B")})
	if err != nil {
		t.Fatal(err)
	}
	if got := e.d.byID[second[0]].slot; got != slot {
		t.Fatalf("second rule in slot %d, want the first's (%d)", got, slot)
	}
	if n := hits(second[0]); n != 0 {
		t.Fatalf("second rule, in the first's slot: %d hits before any request, want 0", n)
	}
	answer("key-b", "B")
	if n, per := hits(second[0]), e.d.slotCounters(slot); n != 1 || per.Hits != 1 {
		t.Fatalf("second rule: %d hits, its slot's counters %+v; want 1", n, per)
	}
}

// A slot allocator whose reset fails hands out none of the ids that thawed,
// and retries them on the next get.
func TestSlotResetFails(t *testing.T) {
	now := time.Unix(1000, 0)
	a := newSlotAllocator(2) // one id: 1
	a.cooling.now = func() time.Time { return now }
	fail := errors.New("reset failed")
	var resets [][]uint32
	a.reset = func(ids []uint32) error {
		resets = append(resets, slices.Clone(ids))
		return fail
	}
	id, reused, err := a.get()
	if id != 1 || reused || err != nil {
		t.Fatalf("first get: %d, %v, %v", id, reused, err)
	}
	a.put(id)
	now = now.Add(2 * quarantine)
	if _, _, err := a.get(); !errors.Is(err, fail) {
		t.Fatalf("get with a failing reset: %v, want %v", err, fail)
	}
	if a.available() != 1 {
		t.Fatalf("available after a failed reset: %d, want 1", a.available())
	}
	a.reset = func(ids []uint32) error { resets = append(resets, slices.Clone(ids)); return nil }
	id, reused, err = a.get()
	if id != 1 || !reused || err != nil {
		t.Fatalf("get after the reset works: %d, %v, %v", id, reused, err)
	}
	if want := [][]uint32{{1}, {1}}; !reflect.DeepEqual(resets, want) {
		t.Errorf("resets %v, want %v", resets, want)
	}
}
