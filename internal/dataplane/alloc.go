package dataplane

import (
	"errors"
	"slices"
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
	// reset, if set, readies ids whose quarantine is over for reuse, all
	// that thawed at once (the rule slots' counters: one system call per
	// batch rather than one per rule). Until it succeeds they wait in thawed.
	reset  func(ids []uint32) error
	thawed []uint32
}

func newSlotAllocator(n uint32) *slotAllocator {
	return &slotAllocator{next: 1, limit: n, cooling: cooling[uint32]{now: time.Now}}
}

var errFull = errors.New("full")

// get returns a free id, and whether it was used before. When only
// quarantined ids are left it waits for the oldest (at most the quarantine).
func (a *slotAllocator) get() (uint32, bool, error) {
	if err := a.thaw(); err != nil {
		return 0, false, err
	}
	if len(a.free) == 0 && a.next >= a.limit && a.cooling.n > 0 {
		a.cooling.wait()
		if err := a.thaw(); err != nil {
			return 0, false, err
		}
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

func (a *slotAllocator) thaw() error {
	if a.reset == nil {
		a.cooling.thaw(func(id uint32) { a.free = append(a.free, id) })
		return nil
	}
	a.cooling.thaw(func(id uint32) { a.thawed = append(a.thawed, id) })
	if len(a.thawed) == 0 {
		return nil
	}
	if err := a.reset(a.thawed); err != nil {
		return err
	}
	a.free = append(a.free, a.thawed...)
	a.thawed = a.thawed[:0]
	return nil
}

// available is the number of ids get can still hand out, cooling ones included.
func (a *slotAllocator) available() int {
	return int(a.limit-a.next) + len(a.free) + len(a.thawed) + a.cooling.n
}

// dataRef locates a rule's bytes: a page and an offset in it.
type dataRef struct{ page, off uint32 }

// dataAllocator places rule data in pages; a rule's bytes never cross a
// page. A request takes the smallest free range that holds it, else fresh
// space (page after page). A freed range merges with its free neighbours in
// its page, so that values which change size (a memcached value, a DNS
// answer) do not strand memory in ranges of their old sizes.
type dataAllocator struct {
	pages, page, fill uint32                      // fresh space starts at fill in page
	bySize            map[int]map[uint64]struct{} // free ranges by size: their addresses
	sizes             []int                       // the sizes in bySize, ascending
	byStart           map[uint64]int              // free range address -> size
	byEnd             map[uint64]uint64           // free range end -> address
	cooling           cooling[sizedRef]
	used              int
}

// An address is a page's first byte's (page × pageData) plus an offset.
func addrOf(r dataRef) uint64 { return uint64(r.page)*uint64(pageData) + uint64(r.off) }

func refAt(addr uint64) dataRef {
	return dataRef{uint32(addr / uint64(pageData)), uint32(addr % uint64(pageData))}
}

type sizedRef struct {
	ref  dataRef
	size int
}

func newDataAllocator(pages uint32) *dataAllocator {
	return &dataAllocator{pages: pages, bySize: map[int]map[uint64]struct{}{}, byStart: map[uint64]int{},
		byEnd: map[uint64]uint64{}, cooling: cooling[sizedRef]{now: time.Now}}
}

// get returns a range of size bytes. When it finds no room but freed
// ranges are cooling, it waits for the oldest (at most the quarantine).
func (a *dataAllocator) get(size int) (dataRef, error) {
	ref, err := a.take(size)
	if err != nil && a.cooling.n > 0 {
		a.cooling.wait()
		ref, err = a.take(size)
	}
	return ref, err
}

func (a *dataAllocator) take(size int) (dataRef, error) {
	if size > pageData {
		return dataRef{}, errFull
	}
	a.thaw()
	if i, _ := slices.BinarySearch(a.sizes, size); i < len(a.sizes) {
		have := a.sizes[i]
		for addr := range a.bySize[have] {
			a.unlink(addr, have)
			if have > size {
				a.link(addr+uint64(size), have-size)
			}
			a.used += size
			return refAt(addr), nil
		}
	}
	if int(a.fill)+size > pageData && a.page < a.pages {
		if a.fill < uint32(pageData) { // the page's tail, for smaller requests
			a.free(addrOf(dataRef{a.page, a.fill}), pageData-int(a.fill))
		}
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
	a.cooling.thaw(func(c sizedRef) { a.free(addrOf(c.ref), c.size) })
}

// free makes a range free, merged with its free neighbours in its page;
// one that ends where fresh space starts becomes fresh space again.
func (a *dataAllocator) free(addr uint64, size int) {
	page := uint64(pageData)
	if addr%page != 0 {
		if prev, ok := a.byEnd[addr]; ok {
			n := a.byStart[prev]
			a.unlink(prev, n)
			addr, size = prev, size+n
		}
	}
	end := addr + uint64(size)
	if end == addrOf(dataRef{a.page, a.fill}) && a.fill > 0 {
		a.fill -= uint32(size)
		return
	}
	if end%page != 0 {
		if n, ok := a.byStart[end]; ok {
			a.unlink(end, n)
			size += n
		}
	}
	a.link(addr, size)
}

// link records a free range.
func (a *dataAllocator) link(addr uint64, size int) {
	set := a.bySize[size]
	if set == nil {
		set = map[uint64]struct{}{}
		a.bySize[size] = set
		i, _ := slices.BinarySearch(a.sizes, size)
		a.sizes = slices.Insert(a.sizes, i, size)
	}
	set[addr] = struct{}{}
	a.byStart[addr] = size
	a.byEnd[addr+uint64(size)] = addr
}

// unlink forgets a free range (taken, or merged into a larger one).
func (a *dataAllocator) unlink(addr uint64, size int) {
	set := a.bySize[size]
	delete(set, addr)
	if len(set) == 0 {
		delete(a.bySize, size)
		i, _ := slices.BinarySearch(a.sizes, size)
		a.sizes = slices.Delete(a.sizes, i, i+1)
	}
	delete(a.byStart, addr)
	delete(a.byEnd, addr+uint64(size))
}
