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

// retire hands each old rule's counts to its successor, or to its rule
// set's total of rules gone if it has none (a replace), and unlinks it
// after the grace period. Callers hold d.mu.
func (d *Dataplane) retire(olds []*installed, successors map[RuleID]*installed) {
	now := time.Now()
	start := len(d.retiring)
	for _, o := range olds {
		d.retiring = append(d.retiring, retiring{old: o, successor: successors[o.id], at: now})
	}
	handing := d.retiring[start:]
	counts := d.countsOf(oldRules(handing))
	for i := range handing {
		r := &handing[i]
		r.handed = baseOf(d.bases, r.old.slot).add(counts[i])
		d.handOn(r, r.handed)
	}
	time.AfterFunc(retireGrace, d.reapRetired)
}

// handOn adds counts of r's old rule to its successor, or, if that is gone
// too (or there is none), to the rule set's total of rules gone: either way
// the socket's totals keep them. Callers hold d.mu.
func (d *Dataplane) handOn(r *retiring, counts RuleStats) {
	if s := r.successor; s != nil && d.byID[s.id] == s {
		d.setBase(s.slot, baseOf(d.bases, s.slot).add(counts))
	} else {
		r.old.owner.gone = r.old.owner.gone.add(counts)
	}
}

func oldRules(rs []retiring) []*installed {
	out := make([]*installed, len(rs))
	for i := range rs {
		out[i] = rs[i].old
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
	d.reap(d.retiring[:due])
	d.retiring = d.retiring[due:]
}

// reap hands on the counts retired rules made since they were retired and
// unlinks them. Callers hold d.mu.
func (d *Dataplane) reap(rs []retiring) {
	counts := d.countsOf(oldRules(rs))
	for i := range rs {
		r := &rs[i]
		late := baseOf(d.bases, r.old.slot).add(counts[i])
		d.handOn(r, RuleStats{late.Hits - r.handed.Hits, late.Bytes - r.handed.Bytes})
		d.uninstall(r.old)
	}
}

// unlinkRetired unlinks at once the old versions of rules being deleted:
// a deleted rule must not answer, not even in an older version. Callers
// hold d.mu, and have uninstalled the deleted rules (so the old versions'
// last counts go to their rule set's total of rules gone).
func (d *Dataplane) unlinkRetired(gone map[RuleID]bool) {
	var now []retiring
	kept := d.retiring[:0]
	for _, r := range d.retiring {
		if gone[r.old.id] {
			now = append(now, r)
		} else {
			kept = append(kept, r)
		}
	}
	d.retiring = kept
	d.reap(now)
}

// drainRetired waits out the grace period of every retired rule and unlinks
// them all. Callers hold d.mu.
func (d *Dataplane) drainRetired() {
	if n := len(d.retiring); n > 0 {
		time.Sleep(time.Until(d.retiring[n-1].at.Add(retireGrace)))
		d.reapDue()
	}
}
