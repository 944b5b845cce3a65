package dataplane

import "time"

// retireGrace is how long a rule stays linked after a newer version or a
// new rule set took its place. A packet that read the rule set's id or
// generation just before the switch may still walk the old chain; unlinking
// the old rule at once would let it find neither version. An XDP run takes
// microseconds, so this is ample.
const retireGrace = 50 * time.Millisecond

// retiring is a rule waiting to be unlinked, and the rule that took its
// place (nil if none), which gets the counts the old one still makes.
type retiring struct {
	old, successor *installed
	handed         RuleStats // the old rule's counts already handed on
	at             time.Time
}

// retire hands each old rule's counts to its successor and unlinks it after
// the grace period. Callers hold d.mu.
func (d *Dataplane) retire(olds []*installed, successors map[RuleID]*installed) {
	now := time.Now()
	start := len(d.retiring)
	for _, o := range olds {
		d.retiring = append(d.retiring, retiring{old: o, successor: successors[o.id], at: now})
	}
	handing := d.retiring[start:]
	counts := d.oldCounts(handing, func(r *retiring) bool { return r.successor != nil })
	for i := range handing {
		if r := &handing[i]; r.successor != nil {
			r.handed = baseOf(d.bases, r.old.slot).add(counts[i])
			d.setBase(r.successor.slot, r.handed)
		}
	}
	time.AfterFunc(retireGrace, d.reapRetired)
}

// oldCounts reads the per-CPU counters of the old rules of rs for which
// wanted holds (zero for the others), batched when there are many: a
// rebuild retires every rule of its set. Callers hold d.mu.
func (d *Dataplane) oldCounts(rs []retiring, wanted func(*retiring) bool) []RuleStats {
	var slots []uint32
	var at []int
	var highest uint32
	for i := range rs {
		if wanted(&rs[i]) {
			slots = append(slots, rs[i].old.slot)
			at = append(at, i)
			highest = max(highest, rs[i].old.slot)
		}
	}
	counts, err := d.countersOf(slots, highest)
	if err != nil { // as slotCounters: unreadable counters count nothing
		counts = make([]RuleStats, len(slots))
	}
	out := make([]RuleStats, len(rs))
	for j, i := range at {
		out[i] = counts[j]
	}
	return out
}

func (d *Dataplane) reapRetired() {
	d.mu.Lock()
	defer d.mu.Unlock()
	if !d.closed {
		d.reapDue()
	}
}

// reapDue unlinks the retired rules whose grace period is over. Callers hold d.mu.
func (d *Dataplane) reapDue() {
	due := 0
	for due < len(d.retiring) && time.Since(d.retiring[due].at) >= retireGrace {
		due++
	}
	live := func(r *retiring) bool { return r.successor != nil && d.byID[r.successor.id] == r.successor }
	counts := d.oldCounts(d.retiring[:due], live)
	for i := range d.retiring[:due] {
		r := &d.retiring[i]
		if live(r) {
			late := baseOf(d.bases, r.old.slot).add(counts[i])
			s := r.successor
			d.setBase(s.slot, baseOf(d.bases, s.slot).add(RuleStats{late.Hits - r.handed.Hits, late.Bytes - r.handed.Bytes}))
		}
		d.uninstall(r.old)
	}
	d.retiring = d.retiring[due:]
}

// unlinkRetired unlinks at once the old versions of rules being deleted:
// a deleted rule must not answer, not even in an older version. Callers hold d.mu.
func (d *Dataplane) unlinkRetired(gone map[RuleID]bool) {
	kept := d.retiring[:0]
	for _, r := range d.retiring {
		if gone[r.old.id] {
			d.uninstall(r.old)
		} else {
			kept = append(kept, r)
		}
	}
	d.retiring = kept
}

// drainRetired waits out the grace period of every retired rule and unlinks
// them all. Callers hold d.mu.
func (d *Dataplane) drainRetired() {
	if n := len(d.retiring); n > 0 {
		time.Sleep(time.Until(d.retiring[n-1].at.Add(retireGrace)))
		d.reapDue()
	}
}
