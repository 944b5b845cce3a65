package dataplane

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
)

// A rule answers only while its guards' slots hold its versions; a bumped
// slot retires it (counted as pass_invalidated), a rule built for the new
// version answers again, and the guard map outlives the data plane.
func TestGuards(t *testing.T) {
	pin := filepath.Join(mountBPFFS(t), "guards")
	e := newEnv(t, Config{GuardsPin: pin})
	guards := e.d.objs.SantaGuards
	bump := func(slot uint32) uint64 {
		var v uint64
		if err := guards.Lookup(slot, &v); err != nil {
			t.Fatal(err)
		}
		v++
		if err := guards.Put(slot, v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, v6 := range []bool{false, true} {
		c, s := fixtureAddrs(e, v6, 7710)
		cookie := e.socket(s, false)
		versions := map[uint32]uint64{7: 0, 1: 0}
		if v6 { // the IPv4 round left both slots at 1
			versions = map[uint32]uint64{7: 1, 1: 1}
		}
		rule := func() Rule {
			return Rule{Conditions: []Condition{cond(0, "get k\r\n")}, Processors: []Processor{put(0, "VALUE")}, ReplyLen: 5,
				Guards: []Guard{{Slot: 7, Version: versions[7]}, {Slot: 1, Version: versions[1]}}}
		}
		ids := e.bindRules(cookie, rule())
		req := request(c, s, "get k\r\n")
		name := fmt.Sprintf("v6=%v", v6)
		e.expect(name+" fresh", req.build(t), xdpTx, req.answer([]byte("VALUE")).build(t), "answered")
		for _, slot := range []uint32{7, 1} { // either guard retires it
			versions[slot] = bump(slot)
			e.expect(fmt.Sprintf("%s slot %d bumped", name, slot), req.build(t), xdpPass, nil, "pass_invalidated")
			if err := e.d.ModifyRules(cookie, []RuleUpdate{{ID: ids[0], Rule: rule()}}); err != nil {
				t.Fatal(err)
			}
			e.expect(fmt.Sprintf("%s slot %d rebuilt", name, slot), req.build(t), xdpTx, req.answer([]byte("VALUE")).build(t), "answered")
		}
		if err := e.d.DeleteRules(cookie, ids); err != nil {
			t.Fatal(err)
		}
	}

	// a successor reuses the pinned map, versions and all
	var before uint64
	if err := guards.Lookup(uint32(7), &before); err != nil || before != 2 {
		t.Fatalf("slot 7 = %d, %v; want 2", before, err)
	}
	next, err := Load(Config{GuardsPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	var after uint64
	if err := next.objs.SantaGuards.Lookup(uint32(7), &after); err != nil || after != before {
		t.Fatalf("successor's slot 7 = %d, %v; want %d", after, err, before)
	}
	// a map of another layout is refused by name
	other := filepath.Join(filepath.Dir(pin), "other")
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 4, MaxEntries: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(other); err != nil {
		t.Fatal(err)
	}
	if _, err := Load(Config{GuardsPin: other}); err == nil || !strings.Contains(err.Error(), "not this version's") {
		t.Fatalf("loading with a foreign guard map: %v", err)
	}
}

func TestGuardValidation(t *testing.T) {
	base := Rule{Conditions: []Condition{cond(0, "x")}, Processors: []Processor{put(0, "y")}, ReplyLen: 1}
	for _, tc := range []struct {
		guards []Guard
		want   string
	}{
		{[]Guard{{Slot: uint32(GuardSlots)}}, "guard 0: slot 1048576 is past the guard map's 1048576 slots"},
		{[]Guard{{}, {}, {}}, "3 guards: at most 2 per rule"},
	} {
		r := base
		r.Guards = tc.guards
		_, err := compileRule(r)
		if !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v, want %q", tc.guards, err, tc.want)
		}
	}
	r := base
	r.Guards = []Guard{{Slot: uint32(GuardSlots) - 1, Version: 1 << 63}}
	if _, err := compileRule(r); err != nil {
		t.Error(err)
	}
}
