package dataplane

import (
	"errors"
	"time"
)

// quarantine is how long a freed rule slot, rule set id or data range stays
// unused: a packet in flight may still be reading it (XDP runs for
// microseconds), and a reused slot must never be read half-rewritten.
const quarantine = time.Second

type freed[T any] struct {
	v  T
	at time.Time
}

// slotAllocator hands out ids 1..n-1 (0 ends a chain and marks "none").
type slotAllocator struct {
	next, limit uint32
	free        []uint32
	cooling     []freed[uint32]
	now         func() time.Time
}

func newSlotAllocator(n uint32) *slotAllocator {
	return &slotAllocator{next: 1, limit: n, now: time.Now}
}

var errFull = errors.New("full")

// get returns a free id, and whether it was used before. When only
// quarantined ids are left it waits for the oldest (at most the quarantine).
func (a *slotAllocator) get() (uint32, bool, error) {
	a.thaw()
	if len(a.free) == 0 && a.next >= a.limit && len(a.cooling) > 0 {
		time.Sleep(time.Until(a.cooling[0].at.Add(quarantine)))
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

func (a *slotAllocator) put(id uint32) {
	a.cooling = append(a.cooling, freed[uint32]{id, a.now()})
}

func (a *slotAllocator) thaw() {
	cut := a.now().Add(-quarantine)
	i := 0
	for ; i < len(a.cooling) && !a.cooling[i].at.After(cut); i++ {
		a.free = append(a.free, a.cooling[i].v)
	}
	a.cooling = a.cooling[i:]
}

// available is the number of ids get can still hand out, cooling ones included.
func (a *slotAllocator) available() int {
	return int(a.limit-a.next) + len(a.free) + len(a.cooling)
}

// dataRef locates a rule's bytes: a page and an offset in it.
type dataRef struct{ page, off uint32 }

// dataAllocator places rule data in pages; a rule's bytes never cross a page.
// Freed ranges are reused for requests of the same size.
type dataAllocator struct {
	pages, page, fill uint32
	free              map[int][]dataRef
	cooling           []freed[sizedRef]
	now               func() time.Time
	used              int
}

type sizedRef struct {
	ref  dataRef
	size int
}

func newDataAllocator(pages uint32) *dataAllocator {
	return &dataAllocator{pages: pages, free: map[int][]dataRef{}, now: time.Now}
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
	a.cooling = append(a.cooling, freed[sizedRef]{sizedRef{ref, size}, a.now()})
}

func (a *dataAllocator) thaw() {
	cut := a.now().Add(-quarantine)
	i := 0
	for ; i < len(a.cooling) && a.cooling[i].at.Before(cut); i++ {
		c := a.cooling[i].v
		a.free[c.size] = append(a.free[c.size], c.ref)
	}
	a.cooling = a.cooling[i:]
}
