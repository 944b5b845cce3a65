package dataplane

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// TestCoolingQuarantine checks that no freed value comes back before a
// whole quarantine has passed since it was freed, although values freed
// close together share one time, and that a steady trickle of frees does
// not keep one cohort open forever.
func TestCoolingQuarantine(t *testing.T) {
	t0 := time.Unix(1000, 0)
	now := t0
	c := cooling[int]{now: func() time.Time { return now }}
	thawed := func() []int {
		var out []int
		c.thaw(func(v int) { out = append(out, v) })
		return out
	}
	at := func(d time.Duration) { now = t0.Add(d) }

	at(0)
	c.add(1)
	at(5 * time.Millisecond)
	c.add(2) // same cohort as 1: it waits for 2
	at(20 * time.Millisecond)
	c.add(3)
	if c.n != 3 {
		t.Fatalf("n = %d, want 3", c.n)
	}
	for _, step := range []struct {
		at   time.Duration
		want []int
	}{
		{quarantine - time.Millisecond, nil},
		{quarantine + 4*time.Millisecond, nil}, // 2 was freed 999 ms ago
		{quarantine + 5*time.Millisecond, []int{1, 2}},
		{quarantine + 19*time.Millisecond, nil},
		{quarantine + 20*time.Millisecond, []int{3}},
	} {
		at(step.at)
		if got := thawed(); !slices.Equal(got, step.want) {
			t.Errorf("at %v: thawed %v, want %v", step.at, got, step.want)
		}
	}
	if c.n != 0 || len(c.cohorts) != 0 {
		t.Errorf("after all thawed: n = %d, %d cohorts", c.n, len(c.cohorts))
	}

	// a free every 2 ms for 3 s: a value thaws a quarantine after its own
	// free at the latest cohortSpan later, never earlier
	start := 10 * time.Second
	freedAt := map[int]time.Duration{}
	for i := 0; i < 1500; i++ {
		at(start + time.Duration(i)*2*time.Millisecond)
		for _, v := range thawed() {
			wait := now.Sub(t0) - freedAt[v]
			if wait < quarantine || wait > quarantine+cohortSpan+2*time.Millisecond {
				t.Fatalf("value %d thawed %v after its free", v, wait)
			}
			delete(freedAt, v)
		}
		c.add(i)
		freedAt[i] = now.Sub(t0)
	}
	if len(freedAt) > 510 || len(freedAt) < 500 {
		t.Errorf("%d values still cooling after the trickle, want the last second's 500 (and a cohort)", len(freedAt))
	}
}

// TestDataAllocatorReusesFreedMemory drives the data allocator with random
// requests and frees of many sizes: no two live ranges overlap or cross a
// page, and once everything is freed and thawed every page can be handed
// out whole again, although the sizes changed all along (the allocator
// used to reuse a freed range only for a request of its exact size).
func TestDataAllocatorReusesFreedMemory(t *testing.T) {
	const pages = 4
	now := time.Unix(1000, 0)
	a := newDataAllocator(pages)
	a.cooling.now = func() time.Time { return now }
	used := make([]bool, pages*pageData) // byte by byte: what is handed out
	type live struct {
		ref  dataRef
		size int
	}
	var lives []live
	mark := func(l live, v bool) {
		if int(l.ref.off)+l.size > pageData {
			t.Fatalf("range %+v of %d bytes crosses its page", l.ref, l.size)
		}
		base := int(l.ref.page)*pageData + int(l.ref.off)
		for i := base; i < base+l.size; i++ {
			if used[i] == v {
				t.Fatalf("range %+v of %d bytes: byte %d is already %v", l.ref, l.size, i-base, v)
			}
			used[i] = v
		}
	}
	release := func(k int) {
		l := lives[k]
		mark(l, false)
		a.put(l.ref, l.size)
		lives[k] = lives[len(lives)-1]
		lives = lives[:len(lives)-1]
	}
	rng := rand.New(rand.NewPCG(1, 2))
	full := 0
	for step := range 60000 {
		now = now.Add(time.Millisecond)
		// the sizes drift: small ones first, large ones later
		size := 8 * (1 + rng.IntN(16+step/100))
		if len(lives) > 0 && rng.IntN(5) < 2 { // more requests than frees: it fills
			release(rng.IntN(len(lives)))
			continue
		}
		ref, err := a.get(size)
		if err != nil {
			if len(lives) == 0 {
				t.Fatalf("step %d: a request of %d bytes finds no room with nothing handed out", step, size)
			}
			full++
			release(rng.IntN(len(lives)))
			continue
		}
		l := live{ref, size}
		mark(l, true)
		lives = append(lives, l)
	}
	if full == 0 {
		t.Error("the allocator never filled: the test did not reach the case it is for")
	}
	for len(lives) > 0 {
		release(len(lives) - 1)
	}
	now = now.Add(2 * quarantine)
	if a.used != 0 {
		t.Errorf("used = %d after every range was freed", a.used)
	}
	for p := range pages {
		if _, err := a.get(pageData); err != nil {
			t.Fatalf("page %d of %d: a whole page is not free again: %v", p+1, pages, err)
		}
	}
}
