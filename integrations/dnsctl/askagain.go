package dnsctl

import (
	"cmp"
	"errors"
	"slices"
	"time"
)

// waitingQuery is a query of a given question (Static and Top mode) that
// is not offloaded for now: the server's answer could not be offloaded
// when it was first asked, or its rule was removed later (the answer went
// missing, was truncated or too big, did not come in time, santad refused
// the rule or its update, ...). The given questions stay wanted, so it is
// asked again, less often each time the answer still cannot be offloaded,
// until its rule is installed. A query santad had no room for waits for
// room instead: it is asked again once rules have gone from santad
// (askAgainWithRoom), in the order the queries were left.
type waitingQuery struct {
	query    *Query
	question Question
	next     time.Time     // when to ask again
	wait     time.Duration // from a failed ask to the next one
	forRoom  bool          // left to the server for want of room in santad
	learned  bool          // of a shape learned from misses (endpoint.waitingLearned)
	order    uint64        // when it was left: room goes to the first ones
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
	return c.keepWaiting(ep, q, question) != nil
}

// waitForRoom keeps the queries santad had no room for wanted in Static
// and Top mode, to be asked again once rules have gone from santad.
func (c *Controller) waitForRoom(ep *endpoint, queries []*Query, questions []Question) {
	for i, q := range queries {
		if wq := c.keepWaiting(ep, q, questions[i]); wq != nil {
			wq.forRoom = true
		}
	}
}

// keepWaiting returns q's waiting query in Static and Top mode, new or
// not, and nil in Adaptive mode, or for a query of a shape learned from
// misses when MaxRules such queries wait already (it is not asked again:
// a later miss may learn it again once it is no longer pending).
func (c *Controller) keepWaiting(ep *endpoint, q *Query, question Question) *waitingQuery {
	if c.cfg.Mode == Adaptive {
		return nil
	}
	key := string(q.Wire[2:]) // the query up to its ID
	if ep.waiting[key] == nil {
		learned := c.isLearned(q)
		if learned && ep.waitingLearned >= c.cfg.MaxRules {
			c.log.Debug("not asking again for a learned shape: --max-rules learned shapes are waiting already", "question", q)
			return nil
		}
		if learned {
			ep.waitingLearned++
		}
		c.waitOrder++
		ep.waiting[key] = &waitingQuery{query: q, question: question, order: c.waitOrder, learned: learned,
			next: time.Now().Add(firstAskAgainWait), wait: firstAskAgainWait}
	}
	return ep.waiting[key]
}

// placesFor leaves out of waiting the queries of learned shapes beyond the
// places MaxRules leaves for their rules: those wait on, asked again when
// a place is free (and their backoff is due).
func (c *Controller) placesFor(ep *endpoint, waiting []*waitingQuery) []*waitingQuery {
	free := c.cfg.MaxRules - ep.learned
	kept := make([]*waitingQuery, 0, len(waiting))
	for _, wq := range waiting {
		if wq.learned {
			if free <= 0 {
				wq.next = time.Now().Add(wq.wait)
				continue
			}
			free--
		}
		kept = append(kept, wq)
	}
	if n := len(waiting) - len(kept); n > 0 {
		c.log.Debug("learned shapes not asked again: their rules are at --max-rules", "server", ep.addr, "queries", n)
	}
	return kept
}

// askAgainDue asks again for every endpoint's waiting queries that are due.
func (c *Controller) askAgainDue(now time.Time) error {
	for _, ep := range c.eps {
		var due []*waitingQuery
		for _, wq := range ep.waiting {
			if !wq.forRoom && !wq.next.After(now) {
				due = append(due, wq)
			}
		}
		if _, err := c.askAgain(ep, due); err != nil {
			return err
		}
	}
	return nil
}

// askAgainInZone asks ep's server again at once for the waiting queries
// of names in the zone apex, which just changed there: their answers may
// be offloadable now (those waiting for room in santad wait on).
func (c *Controller) askAgainInZone(ep *endpoint, apex string) error {
	var inZone []*waitingQuery
	for _, wq := range ep.waiting {
		if !wq.forRoom && c.zoneOf[canonical(wq.question.Name)] == apex {
			wq.wait = firstAskAgainWait
			inZone = append(inZone, wq)
		}
	}
	_, err := c.askAgain(ep, inZone)
	return err
}

// askAgainWithRoom asks again for the queries left to the server for want
// of room once rules have gone from santad (follow.Room), as many as fit
// in the room it has then: the first ones left, the endpoints taking turns
// a batch at a time, until they are all in, the room is taken or santad
// has no room again. A query whose answer cannot be offloaded now takes no
// room (it waits on its backoff instead): the next ones are asked in its
// place, up to a batch (Config.Batch) of such queries a second, so that
// many of them do not cost the server a burst; the room left is used the
// next second (roomLeft).
func (c *Controller) askAgainWithRoom() error {
	forRoom := map[*endpoint][]*waitingQuery{}
	waiting := 0
	for _, ep := range c.eps {
		for _, wq := range ep.waiting {
			if wq.forRoom {
				forRoom[ep] = append(forRoom[ep], wq)
			}
		}
		slices.SortFunc(forRoom[ep], func(a, b *waitingQuery) int { return cmp.Compare(a.order, b.order) })
		waiting += len(forRoom[ep])
	}
	if waiting == 0 {
		return nil
	}
	free, err := c.room.Freed(c.client)
	if err != nil {
		return err
	}
	if free > 0 {
		c.roomLeft = 0 // santad's room now
		c.log.Info("rules went from santad: asking again for questions it had no room for", "room", free, "waiting", waiting)
	} else if free, c.roomLeft = c.roomLeft, 0; free > 0 {
		c.log.Info("santad has room left: asking again for more questions that waited for it", "room", free, "waiting", waiting)
	} else {
		return nil
	}
	var asked, added, unfit int // queries asked; of them, rules added (per endpoint) and not offloadable now
	defer func() {
		c.log.Info("asked again for questions that waited for room", "asked", asked, "installed", added,
			"not_offloadable", unfit, "still_waiting", waiting-added-unfit)
	}()
	for more := true; more; {
		more = false
		for _, ep := range c.eps {
			n := min(c.cfg.Batch, len(forRoom[ep]), free/len(ep.cookies))
			if unfit >= c.cfg.Batch {
				c.roomLeft = free // the next second
				return nil
			}
			if n == 0 {
				continue
			}
			batch := forRoom[ep][:n]
			forRoom[ep], more = forRoom[ep][n:], true
			before := len(ep.entries)
			full, err := c.askAgain(ep, batch)
			if err != nil {
				return err
			}
			// only the rules added take room
			in := max(len(ep.entries)-before, 0)
			free -= in * len(ep.cookies)
			asked, added = asked+n, added+in
			for _, wq := range batch {
				if !wq.forRoom && ep.waiting[string(wq.query.Wire[2:])] == wq {
					unfit++
				}
			}
			if full {
				return nil
			}
		}
	}
	return nil
}

// askAgain asks ep's server again for waiting queries and installs the
// rules of those it now answers in a way that can be offloaded. Those
// santad has no room for wait for room (full says so); the others wait
// twice as long as last time (up to maxAskAgainWait). They are not
// counted as not offloaded again: Report.Skipped counts questions, not asks.
func (c *Controller) askAgain(ep *endpoint, waiting []*waitingQuery) (full bool, err error) {
	if waiting = c.placesFor(ep, waiting); len(waiting) == 0 {
		return false, nil
	}
	queries := make([]*Query, len(waiting))
	questions := make([]Question, len(waiting))
	for i, wq := range waiting {
		queries[i], questions[i] = wq.query, wq.question
	}
	c.probe(ep, questions) // if the server was silent at the last probe
	answers, errs, asked, err := c.askChecked(ep, queries)
	if err != nil {
		return false, err
	}
	_, err = c.installAnswers(ep, queries, questions, answers, errs, asked)
	if full = errors.Is(err, errNoRoom); err != nil && !full {
		return false, err
	}
	var answered, fitted []*Query // offloaded now: after waiting for an answer, for room
	for i, wq := range waiting {
		switch {
		case errs[i] != nil:
			wq.forRoom = false
			if errors.Is(errs[i], ErrServerSilent) { // not asked: again soon, in case the server answers by then
				wq.wait = firstAskAgainWait
			} else {
				wq.wait = min(2*wq.wait, maxAskAgainWait)
			}
			wq.next = time.Now().Add(wq.wait)
			c.log.Debug("a question is still not offloaded", "question", wq.query, "error", errs[i], "next_ask_in", wq.wait)
		case ep.entries[Rule(wq.query, answers[i], ep.b).MatchKey()] != nil:
			delete(ep.waiting, string(wq.query.Wire[2:]))
			if wq.learned {
				ep.waitingLearned--
			}
			if wq.forRoom {
				fitted = append(fitted, wq.query)
			} else {
				answered = append(answered, wq.query)
			}
		default: // left for want of room, its own rule's or that of a query it matches alike
			wq.forRoom = true
		}
	}
	if len(answered) > 0 {
		c.log.Info("the server answers questions that were not offloaded in a way that can be: their rules are installed",
			"server", ep.addr, "rules", len(answered), "first", answered[0])
	}
	if len(fitted) > 0 {
		c.log.Info("santad had room for questions that waited for it: their rules are installed",
			"server", ep.addr, "rules", len(fitted), "first", fitted[0])
	}
	return full, nil
}
