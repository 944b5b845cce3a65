package dataplane

import (
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
