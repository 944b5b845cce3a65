package dataplane

import (
	"errors"
	"time"
)

// quarantine is how long a freed rule slot, rule set id or data range stays
// unused: a packet in flight may still be reading it (XDP runs for
// microseconds), and a reused slot must never be read half-rewritten.
const quarantine = time.Second

// cooling holds freed values for the quarantine. Values freed within
// cohortSpan of each other share one cohort and one time (a delete of a
// million rules keeps a few times, not a million); a cohort thaws a
// quarantine after its last value was freed.
type cooling[T any] struct {
	cohorts []cohort[T]
	n       int // values in all cohorts
	now     func() time.Time
}

type cohort[T any] struct {
	first, last time.Time
	vs          []T
}

const cohortSpan = 10 * time.Millisecond

func (c *cooling[T]) add(v T) {
	now := c.now()
	if k := len(c.cohorts) - 1; k >= 0 && now.Sub(c.cohorts[k].first) < cohortSpan {
		c.cohorts[k].vs = append(c.cohorts[k].vs, v)
		c.cohorts[k].last = now
	} else {
		c.cohorts = append(c.cohorts, cohort[T]{first: now, last: now, vs: []T{v}})
	}
	c.n++
}

// thaw hands each value whose quarantine is over to f, oldest first.
func (c *cooling[T]) thaw(f func(T)) {
	cut := c.now().Add(-quarantine)
	i := 0
	for ; i < len(c.cohorts) && !c.cohorts[i].last.After(cut); i++ {
		for _, v := range c.cohorts[i].vs {
			f(v)
		}
		c.n -= len(c.cohorts[i].vs)
	}
	clear(c.cohorts[:i]) // let the thawed cohorts' slices go
	c.cohorts = c.cohorts[i:]
}

// wait sleeps until the oldest cohort thaws.
func (c *cooling[T]) wait() {
	if len(c.cohorts) > 0 {
		time.Sleep(time.Until(c.cohorts[0].last.Add(quarantine)))
	}
}

// slotAllocator hands out ids 1..n-1 (0 ends a chain and marks "none").
type slotAllocator struct {
	next, limit uint32
	free        []uint32
	cooling     cooling[uint32]
}

func newSlotAllocator(n uint32) *slotAllocator {
	return &slotAllocator{next: 1, limit: n, cooling: cooling[uint32]{now: time.Now}}
}

var errFull = errors.New("full")

// get returns a free id, and whether it was used before. When only
// quarantined ids are left it waits for the oldest (at most the quarantine).
func (a *slotAllocator) get() (uint32, bool, error) {
	a.thaw()
	if len(a.free) == 0 && a.next >= a.limit && a.cooling.n > 0 {
		a.cooling.wait()
		a.thaw()
	}
	if n := len(a.free); n > 0 {
		id := a.free[n-1]
		a.free = a.free[:n-1]
		return id, true, nil
	}
	if a.next >= a.limit {
		return 0, false, errFull
	}
	a.next++
	return a.next - 1, false, nil
}

func (a *slotAllocator) put(id uint32) { a.cooling.add(id) }

func (a *slotAllocator) thaw() {
	a.cooling.thaw(func(id uint32) { a.free = append(a.free, id) })
}

// available is the number of ids get can still hand out, cooling ones included.
func (a *slotAllocator) available() int {
	return int(a.limit-a.next) + len(a.free) + a.cooling.n
}

// dataRef locates a rule's bytes: a page and an offset in it.
type dataRef struct{ page, off uint32 }

// dataAllocator places rule data in pages; a rule's bytes never cross a page.
// Freed ranges are reused for requests of the same size.
type dataAllocator struct {
	pages, page, fill uint32
	free              map[int][]dataRef
	cooling           cooling[sizedRef]
	used              int
}

type sizedRef struct {
	ref  dataRef
	size int
}

func newDataAllocator(pages uint32) *dataAllocator {
	return &dataAllocator{pages: pages, free: map[int][]dataRef{}, cooling: cooling[sizedRef]{now: time.Now}}
}

func (a *dataAllocator) get(size int) (dataRef, error) {
	a.thaw()
	if l := a.free[size]; len(l) > 0 {
		a.free[size] = l[:len(l)-1]
		a.used += size
		return l[len(l)-1], nil
	}
	if int(a.fill)+size > pageData {
		a.page++
		a.fill = 0
	}
	if a.page >= a.pages {
		return dataRef{}, errFull
	}
	ref := dataRef{a.page, a.fill}
	a.fill += uint32(size)
	a.used += size
	return ref, nil
}

func (a *dataAllocator) put(ref dataRef, size int) {
	a.used -= size
	a.cooling.add(sizedRef{ref, size})
}

func (a *dataAllocator) thaw() {
	a.cooling.thaw(func(c sizedRef) { a.free[c.size] = append(a.free[c.size], c.ref) })
}
