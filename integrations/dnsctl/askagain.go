package dnsctl

import (
	"errors"
	"time"
)

// waitingQuery is a query of a given question (Static and Top mode) that
// is not offloaded for now: the server's answer could not be offloaded
// when it was first asked, or its rule was removed later (the answer went
// missing, was truncated or too big, did not come in time, santad refused
// the rule or its update, ...). The given questions stay wanted, so it is
// asked again, less often each time the answer still cannot be offloaded,
// until its rule is installed.
type waitingQuery struct {
	query    *Query
	question Question
	next     time.Time     // when to ask again
	wait     time.Duration // from a failed ask to the next one
}

// A waiting query is asked again after firstAskAgainWait, then twice as
// long after each failed ask up to maxAskAgainWait: a question the server
// never answers in a way that can be offloaded costs it one query a minute.
const (
	firstAskAgainWait = time.Second
	maxAskAgainWait   = time.Minute
)

// askAgainLater keeps q, whose answer cannot be offloaded for now, wanted
// in Static and Top mode, and says whether it does (Adaptive mode learns
// it again from misses if it is still hot).
func (c *Controller) askAgainLater(ep *endpoint, q *Query, question Question) bool {
	if c.cfg.Mode == Adaptive {
		return false
	}
	key := string(q.Wire[2:]) // the query up to its ID
	if ep.waiting[key] == nil {
		ep.waiting[key] = &waitingQuery{query: q, question: question,
			next: time.Now().Add(firstAskAgainWait), wait: firstAskAgainWait}
	}
	return true
}

// askAgainDue asks again for every endpoint's waiting queries that are due.
func (c *Controller) askAgainDue(now time.Time) error {
	for _, ep := range c.eps {
		var due []*waitingQuery
		for _, wq := range ep.waiting {
			if !wq.next.After(now) {
				due = append(due, wq)
			}
		}
		if err := c.askAgain(ep, due); err != nil {
			return err
		}
	}
	return nil
}

// askAgainInZone asks again at once for the waiting queries of names in
// the zone apex, which just changed: their answers may be offloadable now.
func (c *Controller) askAgainInZone(apex string) error {
	for _, ep := range c.eps {
		var inZone []*waitingQuery
		for _, wq := range ep.waiting {
			if c.zoneOf[canonical(wq.question.Name)] == apex {
				wq.wait = firstAskAgainWait
				inZone = append(inZone, wq)
			}
		}
		if err := c.askAgain(ep, inZone); err != nil {
			return err
		}
	}
	return nil
}

// askAgain asks ep's server again for waiting queries and installs the
// rules of those it now answers in a way that can be offloaded; the others
// wait twice as long as last time (up to maxAskAgainWait). They are not
// counted as not offloaded again: Report.Skipped counts questions, not asks.
func (c *Controller) askAgain(ep *endpoint, waiting []*waitingQuery) error {
	if len(waiting) == 0 {
		return nil
	}
	queries := make([]*Query, len(waiting))
	questions := make([]Question, len(waiting))
	for i, wq := range waiting {
		queries[i], questions[i] = wq.query, wq.question
	}
	answers, errs, asked, err := c.askChecked(ep, queries)
	if err != nil {
		return err
	}
	if _, err := c.installAnswers(ep, queries, questions, answers, errs, asked); err != nil && !errors.Is(err, errNoRoom) {
		return err
	}
	var offloaded []*Query
	for i, wq := range waiting {
		if errs[i] == nil && ep.entries[Rule(wq.query, answers[i], ep.b).MatchKey()] != nil {
			delete(ep.waiting, string(wq.query.Wire[2:]))
			offloaded = append(offloaded, wq.query)
			continue
		}
		wq.wait = min(2*wq.wait, maxAskAgainWait)
		wq.next = time.Now().Add(wq.wait)
		c.log.Debug("a question is still not offloaded", "question", wq.query, "error", errs[i], "next_ask_in", wq.wait)
	}
	if len(offloaded) > 0 {
		c.log.Info("the server answers questions that were not offloaded in a way that can be: their rules are installed",
			"server", ep.addr, "rules", len(offloaded), "first", offloaded[0])
	}
	return nil
}
