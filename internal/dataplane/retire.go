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
	for _, o := range olds {
		r := retiring{old: o, successor: successors[o.id], at: now}
		if r.successor != nil {
			r.handed = d.slotStats(o.slot)
			d.setBase(r.successor.slot, r.handed)
		}
		d.retiring = append(d.retiring, r)
	}
	time.AfterFunc(retireGrace, d.reapRetired)
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
	i := 0
	for ; i < len(d.retiring) && time.Since(d.retiring[i].at) >= retireGrace; i++ {
		r := d.retiring[i]
		if s := r.successor; s != nil && d.byID[s.id] == s {
			late := d.slotStats(r.old.slot)
			d.setBase(s.slot, baseOf(d.bases, s.slot).add(RuleStats{late.Hits - r.handed.Hits, late.Bytes - r.handed.Bytes}))
		}
		d.uninstall(r.old)
	}
	d.retiring = d.retiring[i:]
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
