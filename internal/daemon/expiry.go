package daemon

import (
	"container/heap"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
)

// Rules with an Expires time (api.Rule.Expires, Unix seconds) are removed
// by santad itself when it comes, as if their owner had deleted them, so a
// rule never outlives what it was installed for (a DNS answer's TTL) even if
// its controller is gone. The deadline is journaled with the rule: a
// restarted santad keeps it, and does not restore rules whose time passed.

// expiring is one rule's deadline.
type expiring struct {
	at     uint64 // Unix seconds
	cookie uint64
	id     uint64
}

// expiryQueue is a min-heap of deadlines. An entry whose rule was deleted
// or modified since is skipped when it comes due.
type expiryQueue []expiring

func (q expiryQueue) Len() int           { return len(q) }
func (q expiryQueue) Less(i, j int) bool { return q[i].at < q[j].at }
func (q expiryQueue) Swap(i, j int)      { q[i], q[j] = q[j], q[i] }
func (q *expiryQueue) Push(x any)        { *q = append(*q, x.(expiring)) }
func (q *expiryQueue) Pop() any {
	old := *q
	x := old[len(old)-1]
	*q = old[:len(old)-1]
	return x
}

// expiresBy says a rule with Expires time at (Unix seconds, 0 = never) has
// expired by now. at is unsigned: one past 2^63 is far off, not negative.
func expiresBy(at uint64, now time.Time) bool {
	return at != 0 && at <= uint64(max(now.Unix(), 0))
}

// checkExpires refuses rules whose Expires time has already come.
func checkExpires(rules []api.Rule, now time.Time) error {
	for i, r := range rules {
		if expiresBy(r.Expires, now) {
			return fail(api.StatusInvalid, "rule %d: expires at %d (%s), which has passed: santad's clock reads %d",
				i, r.Expires, time.Unix(int64(r.Expires), 0).UTC().Format(time.RFC3339), now.Unix())
		}
	}
	return nil
}

// scheduleExpiry queues the deadlines of rules just installed on socket
// cookie and wakes the expiry loop if one comes before what it waits for.
// Callers hold d.mu.
func (d *Daemon) scheduleExpiry(cookie uint64, rules []api.Rule) {
	wake := false
	for _, r := range rules {
		if r.Expires == 0 {
			continue
		}
		if len(d.expiry) == 0 || r.Expires < d.expiry[0].at {
			wake = true
		}
		heap.Push(&d.expiry, expiring{at: r.Expires, cookie: cookie, id: r.ID})
	}
	if wake {
		select {
		case d.expiryWake <- struct{}{}:
		default:
		}
	}
}

// expireLoop removes rules as their deadlines come, until santad stops.
func (d *Daemon) expireLoop() {
	defer d.wg.Done()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		d.mu.Lock()
		wait := time.Hour
		if len(d.expiry) > 0 {
			wait = max(0, dataplane.UntilUnix(d.expiry[0].at, time.Now()))
		}
		d.mu.Unlock()
		timer.Reset(wait)
		select {
		case <-d.stop:
			return
		case <-d.expiryWake:
		case <-timer.C:
		}
		d.mu.Lock()
		d.expireDue(time.Now())
		d.mu.Unlock()
	}
}

// expireDue deletes every rule whose deadline has come, one request per
// socket. Callers hold d.mu.
func (d *Daemon) expireDue(now time.Time) {
	due := map[uint64][]uint64{}
	for len(d.expiry) > 0 && expiresBy(d.expiry[0].at, now) {
		e := heap.Pop(&d.expiry).(expiring)
		if rs, ok := d.sets[e.cookie]; ok && rs.rules[e.id].expires == e.at {
			due[e.cookie] = append(due[e.cookie], e.id)
		}
	}
	for cookie, ids := range due {
		rs := d.sets[cookie]
		if err := d.delete(rs, ids); err != nil {
			d.log.Error("removing expired rules failed", "socket", cookie, "rules", len(ids), "error", err)
			continue
		}
		d.metrics.expired.Add(float64(len(ids)))
		d.log.Info("rules expired", "socket", cookie, "owner", rs.info.Owner, "rules", len(ids))
	}
}
