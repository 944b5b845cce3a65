package dnsctl

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/follow"
)

// sampleBytes is the most request bytes santad puts in a miss sample
// (docs/protocol.md): DNS queries are nearly always shorter.
const sampleBytes = 256

// maxAttempted bounds the memory of query forms already tried.
const maxAttempted = 1 << 20

// watch subscribes to every socket's miss samples: streamed into
// c.samples when the controller learns from them (Adaptive mode,
// LearnShapes), else only watched for the server closing the socket.
func (c *Controller) watch(ctx context.Context) (*follow.Watcher, error) {
	epOf := map[uint64]*endpoint{}
	for _, ep := range c.eps {
		for _, cookie := range ep.cookies {
			epOf[cookie] = ep
		}
	}
	opts := follow.WatchOnly
	var each func(uint64, santa.Sample) // nil: only watched
	if c.cfg.Mode == Adaptive || c.cfg.LearnShapes {
		opts = santa.SampleOptions{Bytes: sampleBytes, Rate: c.cfg.SampleRate}
		each = func(cookie uint64, s santa.Sample) {
			select {
			case c.samples <- sampleEvent{epOf[cookie], s}:
			default: // the controller is busy: a sample more or less does not matter
			}
		}
	}
	return follow.NewWatcher(ctx, c.cfg.Socket, slices.Collect(maps.Keys(epOf)), opts, each)
}

// quietDown lowers the sampling of LearnShapes (Static and Top) to
// QuietSampleRate once the misses showed no new shape for QuietAfter.
func (c *Controller) quietDown(now time.Time) {
	if c.quiet || c.cfg.Mode == Adaptive || !c.cfg.LearnShapes || c.cfg.QuietSampleRate >= c.cfg.SampleRate ||
		now.Sub(c.lastShape) < c.cfg.QuietAfter {
		return
	}
	c.setSampleRate(c.cfg.QuietSampleRate, "no new query shape in the misses for "+c.cfg.QuietAfter.String())
	c.quiet = true
}

// newShape notes a new query shape seen in the misses: the sampling goes
// back to SampleRate, as more new shapes tend to follow (a new client
// version, a resolver's configuration change).
func (c *Controller) newShape() {
	c.lastShape = time.Now()
	if c.quiet {
		c.setSampleRate(c.cfg.SampleRate, "a new query shape in the misses")
		c.quiet = false
	}
}

func (c *Controller) setSampleRate(rate uint32, why string) {
	if err := c.watcher.SetRate(rate); err != nil {
		// sampling stays as it was; santad gone ends the watch anyway
		c.log.Warn("could not change the miss sampling", "samples_per_second_and_cpu", rate, "error", err)
		return
	}
	c.log.Debug(why+": sampling misses at a new rate", "samples_per_second_and_cpu", rate)
}

// formKey identifies a query up to what the endpoint's rules generalise
// over (ID, echoed and ignored flags, a client cookie's bytes): queries with
// one form key need one rule.
func formKey(q *Query, b Behaviour) string {
	w := bytes.Clone(q.Wire[2:])
	binary.BigEndian.PutUint16(w, q.Flags()&^(b.Echo|b.Ignore))
	if b.IgnoresCookie && q.HasCookie() {
		clear(w[q.cookieData-2 : q.cookieData-2+q.cookieLen])
	}
	return string(w)
}

// learn handles one miss sample: in Static and Top mode a known question in
// a new shape is installed at once; in Adaptive mode the sample feeds the
// endpoint's heavy-hitter sketch.
func (c *Controller) learn(ev sampleEvent) error {
	s, ep := ev.sample, ev.ep
	if s.RequestLen > len(s.Data) {
		return nil // longer than a sample: not seen whole
	}
	q, err := ParseQuery(bytes.Clone(s.Data))
	if err != nil {
		return nil
	}
	question := Question{q.Name, q.Type}
	if c.cfg.Mode == Adaptive && time.Now().After(ep.probeAgain) { // not for each junk sample
		c.probe(ep, []Question{question})
	}
	if q.HasCookie() && ep.b.AnswersCookies {
		// never offloadable: asking would only keep it asked again for
		// ever and count it towards MaxRules (dig sends a new cookie each time)
		return nil
	}
	key := formKey(q, ep.b)
	if ep.pending[key] {
		return nil
	}
	if c.cfg.Mode == Adaptive {
		ep.sketch.Add(key)
		ep.samplesOf[key] = q
		return nil
	}
	if q.Class != dns.ClassINET || !c.allowed[question] { // the questions given are of class IN
		return nil
	}
	if ep.learned >= c.cfg.MaxRules {
		// not marked tried: a later miss learns it once a place is free
		if !ep.saidMaxRules {
			ep.saidMaxRules = true
			c.log.Info("the rules of shapes learned from misses are at --max-rules: new shapes stay with the server until one of those rules goes",
				"server", ep.addr, "max_rules", c.cfg.MaxRules)
		}
		return nil
	}
	if len(ep.pending) >= maxAttempted {
		clear(ep.pending)
	}
	ep.pending[key] = true
	if c.isLearned(q) { // not a query installed up front whose rule went
		c.newShape()
	}
	// only a rule installed counts towards MaxRules (installAnswers): a
	// shape the server does not answer in a way that can be offloaded is
	// asked again (askagain.go), and takes no place from the shapes it does
	before := ep.learned
	err = c.install(ep, []*Query{q}, []Question{question})
	c.log.Debug("new query shape", "question", q, "installed", ep.learned > before, "learned_rules", ep.learned)
	if !errors.Is(err, errNoRoom) {
		return err
	}
	return nil
}

// adapt installs the endpoint's hot questions (up to MaxRules rules) and
// removes rules without hits for Idle.
func (c *Controller) adapt() error {
	for _, ep := range c.eps {
		if err := c.evictIdle(ep); err != nil {
			return err
		}
		var queries []*Query
		var questions []Question
		for _, key := range ep.sketch.Hot(c.cfg.MinSamples) {
			if len(ep.entries)+len(queries) >= c.cfg.MaxRules {
				break
			}
			q := ep.samplesOf[key]
			if q == nil || ep.pending[key] {
				continue
			}
			if len(ep.pending) >= maxAttempted {
				clear(ep.pending)
			}
			ep.pending[key] = true
			ep.sketch.Forget(key)
			delete(ep.samplesOf, key)
			queries = append(queries, q)
			questions = append(questions, Question{q.Name, q.Type})
		}
		ep.sketch.Decay()
		for key := range ep.samplesOf {
			if !ep.sketch.Has(key) {
				delete(ep.samplesOf, key)
			}
		}
		if len(queries) == 0 {
			continue
		}
		c.probe(ep, questions) // if the first samples' could not be probed
		before := len(ep.entries)
		if err := c.install(ep, queries, questions); err != nil && !errors.Is(err, errNoRoom) {
			return err
		}
		c.log.Info("offloaded hot questions", "server", ep.addr, "new", len(ep.entries)-before, "rules", len(ep.entries))
	}
	return nil
}

// evictIdle removes the endpoint's rules that had no hit for Idle; their
// questions may come back when they are hot again.
func (c *Controller) evictIdle(ep *endpoint) error {
	if len(ep.entries) == 0 {
		return nil
	}
	hits := map[uint64]uint64{}
	for _, cookie := range ep.cookies {
		stats, err := c.client.Stats(santa.Cookie(cookie))
		if err != nil {
			return fmt.Errorf("statistics of socket %d: %w", cookie, err)
		}
		for _, s := range stats {
			hits[s.ID] = s.Hits
		}
	}
	now := time.Now()
	var idle []*entry
	for _, e := range ep.entries {
		var total uint64
		for _, id := range e.ids {
			total += hits[id]
		}
		if total != e.lastHits {
			e.lastHits, e.lastHit = total, now
		} else if now.Sub(e.lastHit) >= c.cfg.Idle {
			idle = append(idle, e)
		}
	}
	for _, e := range idle {
		delete(ep.pending, formKey(e.query, ep.b))
	}
	if len(idle) > 0 {
		c.log.Info("removing idle rules", "server", ep.addr, "rules", len(idle))
	}
	return c.remove(ep, idle)
}
