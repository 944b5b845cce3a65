package dnsctl

import (
	"errors"
	"time"
)

// removedQuery is a query of a given question (Static and Top mode) whose
// rule was removed while the controller ran: its answer went missing, was
// truncated or too big, was not refreshed in time, santad refused its
// update, ... The given questions stay wanted, so it is asked again, less
// often each time the answer still cannot be offloaded, until its rule is
// installed again.
type removedQuery struct {
	query    *Query
	question Question
	next     time.Time     // when to ask again
	wait     time.Duration // from a failed ask to the next one
}

// A removed query is asked again after firstAskAgainWait, then twice as
// long after each failed ask up to maxAskAgainWait: a question the server
// never answers in a way that can be offloaded costs it one query a minute.
const (
	firstAskAgainWait = time.Second
	maxAskAgainWait   = time.Minute
)

// askAgainLater keeps the question of e, whose rule was just removed,
// wanted in Static and Top mode (Adaptive mode learns it again from misses
// if it is still hot).
func (c *Controller) askAgainLater(ep *endpoint, e *entry) {
	if c.cfg.Mode == Adaptive {
		return
	}
	key := string(e.query.Wire[2:]) // the query up to its ID
	if ep.removed[key] == nil {
		ep.removed[key] = &removedQuery{query: e.query, question: e.question,
			next: time.Now().Add(firstAskAgainWait), wait: firstAskAgainWait}
	}
}

// askAgainDue asks again for every endpoint's removed queries that are due.
func (c *Controller) askAgainDue(now time.Time) error {
	for _, ep := range c.eps {
		var due []*removedQuery
		for _, rq := range ep.removed {
			if !rq.next.After(now) {
				due = append(due, rq)
			}
		}
		if err := c.askAgain(ep, due); err != nil {
			return err
		}
	}
	return nil
}

// askAgainInZone asks again at once for the removed queries of names in
// the zone apex, which just changed: their answers may be back.
func (c *Controller) askAgainInZone(apex string) error {
	for _, ep := range c.eps {
		var inZone []*removedQuery
		for _, rq := range ep.removed {
			if c.zoneOf[canonical(rq.question.Name)] == apex {
				rq.wait = firstAskAgainWait
				inZone = append(inZone, rq)
			}
		}
		if err := c.askAgain(ep, inZone); err != nil {
			return err
		}
	}
	return nil
}

// askAgain asks ep's server again for removed queries and installs the
// rules of those it now answers in a way that can be offloaded; the others
// wait twice as long as last time (up to maxAskAgainWait). They are not
// counted as not offloaded again: Report.Skipped counts questions, not asks.
func (c *Controller) askAgain(ep *endpoint, removed []*removedQuery) error {
	if len(removed) == 0 {
		return nil
	}
	queries := make([]*Query, len(removed))
	questions := make([]Question, len(removed))
	for i, rq := range removed {
		queries[i], questions[i] = rq.query, rq.question
	}
	answers, errs, asked, err := c.askChecked(ep, queries)
	if err != nil {
		return err
	}
	if _, err := c.installAnswers(ep, queries, questions, answers, errs, asked); err != nil && !errors.Is(err, errNoRoom) {
		return err
	}
	var back []*Query
	for i, rq := range removed {
		if errs[i] == nil && ep.entries[Rule(rq.query, answers[i], ep.b).MatchKey()] != nil {
			delete(ep.removed, string(rq.query.Wire[2:]))
			back = append(back, rq.query)
			continue
		}
		rq.wait = min(2*rq.wait, maxAskAgainWait)
		rq.next = time.Now().Add(rq.wait)
		c.log.Debug("a removed question is still not offloaded", "question", rq.query, "error", errs[i], "next_ask_in", rq.wait)
	}
	if len(back) > 0 {
		c.log.Info("the server answers removed questions again: their rules are installed again",
			"server", ep.addr, "rules", len(back), "first", back[0])
	}
	return nil
}
