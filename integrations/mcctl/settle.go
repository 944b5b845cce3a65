package mcctl

import "time"

// settling holds the slots of the writes that memcached may apply with no
// reply after them (DrainBumps's unacked), until the controller bumps them
// once more, Settle after their latest report. A rule rebuilt from a value
// fetched between such a write's bump at ingress and memcached applying it
// is retired then, and rebuilt with the value the write left.
type settling struct {
	due   map[uint32]time.Time // slot -> when to bump it
	queue []settle             // by due time: every due is now + Settle
}

type settle struct {
	slot uint32
	due  time.Time
}

// add (re)schedules slot's bump for due, later than any before: a write
// after an earlier one may be applied after it.
func (s *settling) add(slot uint32, due time.Time) {
	if s.due[slot].Equal(due) {
		return // reported again in the same scan
	}
	s.due[slot] = due
	s.queue = append(s.queue, settle{slot, due})
}

// pop calls bump for every slot due by now and returns how many it bumped.
func (s *settling) pop(now time.Time, bump func(slot uint32)) int {
	n, i := 0, 0
	for ; i < len(s.queue) && !s.queue[i].due.After(now); i++ {
		q := s.queue[i]
		if s.due[q.slot].Equal(q.due) { // else rescheduled later
			delete(s.due, q.slot)
			bump(q.slot)
			n++
		}
	}
	s.queue = s.queue[i:]
	return n
}

// next is the earliest time a slot may be due, if any is queued.
func (s *settling) next() (time.Time, bool) {
	if len(s.queue) == 0 {
		return time.Time{}, false
	}
	return s.queue[0].due, true
}
