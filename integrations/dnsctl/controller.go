package dnsctl

import (
	"bytes"
	"container/heap"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/internal/sketch"
)

// Mode says which questions the controller offloads.
type Mode int

const (
	// Static offloads a given list of questions (a names file or a zone file).
	Static Mode = iota + 1
	// Top offloads the n most popular questions of a popularity list.
	Top
	// Adaptive learns the hot questions from miss samples.
	Adaptive
)

func (m Mode) String() string {
	return map[Mode]string{Static: "static", Top: "top", Adaptive: "adaptive"}[m]
}

// Config configures a controller. Zero fields take the defaults in
// DefaultConfig.
type Config struct {
	Socket string // santad's socket ("" = $SANTA_SOCKET or the default)
	// Attach: Port binds every UDP socket on that port (root); PID and FD
	// bind one socket of a process (root).
	Port    uint16
	PID, FD int
	// Server overrides where the controller asks for answers (default:
	// each socket's bound address, or loopback for a wildcard address).
	Server netip.Addr

	Mode      Mode
	Questions []Question // Static and Top
	// Shapes are installed up front for every question (Static and Top).
	Shapes []Shape
	// LearnShapes installs a question's rule for further query shapes
	// (EDNS sizes, DO, cookies, flags) as misses show clients using them.
	LearnShapes bool
	// Zones are the zones the server serves, for SOA polling; empty: each
	// question's zone is found by asking the server for its SOA.
	Zones []string

	MaxRules   int           // per socket; Adaptive evicts the coldest beyond it
	MinSamples uint64        // Adaptive: sampled misses a question needs to be offloaded
	Interval   time.Duration // Adaptive decisions, statistics
	Idle       time.Duration // Adaptive: a rule without hits for this long is removed
	SampleRate uint32        // miss samples per second and CPU (Adaptive, LearnShapes)
	// QuietSampleRate is the sampling of LearnShapes (Static, Top) once
	// the misses showed no new shape for QuietAfter; the first new shape
	// raises it to SampleRate again. Each sample costs santad and the
	// controller CPU on a server that misses often.
	QuietSampleRate uint32
	QuietAfter      time.Duration
	Poll            time.Duration // SOA serial poll interval; 0: no polling
	Notify          string        // address to accept NOTIFY on ("" = off)
	Parallel        int           // questions in flight to the server
	Timeout         time.Duration // per question
	Batch           int           // rules per santad request
	// Tag tags every rule the controller installs. It takes over the rules
	// with its tag that its sockets hold when it starts (follow.Inherited);
	// Run fails with follow.ErrTagClaimed while another controller runs
	// with it on the port.
	Tag string

	Log *slog.Logger
	// Ready, if set, is called once the initial rules are installed.
	Ready func(Report)
}

// DefaultConfig holds the defaults.
var DefaultConfig = Config{
	MaxRules:   100000,
	MinSamples: 4,
	Interval:   time.Second,
	Idle:       60 * time.Second,
	SampleRate: 5000,
	// docs/benchmarks.md: the Zipf mix with the top 10 k offloaded
	// answered 3–13 % more at 100 than at 5000
	QuietSampleRate: 100,
	QuietAfter:      10 * time.Second,
	Poll:            time.Second,
	Parallel:        32,
	Timeout:         time.Second,
	Batch:           1024,
	LearnShapes:     true,
	Tag:             "santa-dns",
}

// Report counts what the controller has done.
type Report struct {
	Sockets   int
	Rules     int            // installed now: an endpoint's questions, once per socket
	Installed uint64         // rules added
	Refreshed uint64         // answers asked again before their TTL ran out
	Changed   uint64         // rules modified after their answer changed
	Removed   uint64         // rules deleted (answer no longer offloadable, expired, evicted, on exit)
	Gone      uint64         // rules that went with their socket, which the server closed
	Skipped   map[string]int // questions not offloaded when first asked, by reason
	Waiting   int            // questions not offloaded for now, asked again (Static, Top): later, or when santad has room
}

// Controller runs one DNS offload.
type Controller struct {
	cfg    Config
	log    *slog.Logger
	client *santa.Client
	santad uint32 // the pid of the santad the run started with
	eps    []*endpoint

	allowed map[Question]bool // Static and Top: the questions that may be offloaded
	// initial are the queries installed up front (Static and Top: every
	// question in every shape), by their bytes after the ID: any other
	// query is of a shape learned from misses (isLearned)
	initial map[string]bool
	zones   map[string]*zone  // apex -> zone
	zoneOf  map[string]string // question name -> apex

	rep   Report
	repMu sync.Mutex
	// created are the sockets whose rule set this controller's attach
	// made, or a predecessor's that it took over (takeOverCreated): it
	// removes them again on exit if no one else added rules.
	created   []uint64
	claim     *follow.Claim     // this run's hold on its tag on the port
	attached  int               // sockets attached to (Report.Sockets once started)
	inherited *follow.Inherited // a predecessor's rules, until installed again or deleted
	room      follow.Room       // when rules went from santad, after it had no room (askAgainWithRoom)
	roomLeft  int               // room askAgainWithRoom found and has not used yet (it asks a batch of unoffloadable questions a second)
	saidFull  bool              // that santad has no room is logged once
	waitOrder uint64            // waiting queries so far (waitingQuery.order)

	// mu guards the endpoints' entries, the wheels, the zones and the santad
	// connection. The main loop holds it except while it asks the server;
	// expireLoop takes it to delete rules whose TTL is running out.
	mu      sync.Mutex
	wheel   map[int64][]*entry // refresh second -> entries due then
	expiry  expiryHeap         // every entry by the time its rule must be gone
	samples chan sampleEvent
	// watcher streams the miss samples; lastShape is when the samples
	// last showed a new shape (or the start), quiet whether they are at
	// QuietSampleRate for want of one (LearnShapes in Static and Top)
	watcher   *follow.Watcher
	lastShape time.Time
	quiet     bool
}

// expiryMargin is how long before its answer's TTL runs out a rule that
// could not be refreshed is deleted: more than expireLoop's period plus a
// santad delete.
const expiryMargin = 300 * time.Millisecond

// endpoint is one address the server listens on: the sockets bound there
// (several with SO_REUSEPORT) share the rules.
type endpoint struct {
	family  int
	addr    netip.AddrPort // where the controller asks
	cookies []uint64
	asker   *Asker
	b       Behaviour
	probed  bool
	// probeAgain is when a miss sample may probe again after a probe
	// that could not probe a question (adapt probes with the questions it
	// offloads at once)
	probeAgain time.Time
	order      orderCheck
	entries    map[string]*entry // match key -> entry
	pending    map[string]bool   // form keys (see formKey) installed or tried
	// learned is how many of entries are of shapes learned from misses
	// (Static, Top): at most MaxRules, a rule that goes frees its place
	learned int
	// waitingLearned is how many of waiting are of shapes learned from
	// misses: at most MaxRules, so that shapes the server does not answer
	// in a way that can be offloaded take bounded memory and queries
	waitingLearned int
	saidMaxRules   bool           // that learned shapes have MaxRules rules is logged (until one goes)
	sketch         *sketch.Sketch // Adaptive: hot form keys
	// samplesOf is a recent sample of each form key the sketch counts.
	samplesOf map[string]*Query
	// waiting are the queries not offloaded for now (Static, Top), by their
	// bytes after the ID: asked again (askagain.go)
	waiting map[string]*waitingQuery
}

// entry is one installed rule (on every socket of its endpoint).
type entry struct {
	key      string
	question Question
	query    *Query
	answer   Answer
	ids      []uint64  // one per endpoint cookie
	fetched  time.Time // when the answer was asked for: its TTL runs from here
	ep       *endpoint
	dead     bool
	learned  bool // of a shape learned from misses (Static, Top): counts towards MaxRules
	lastHits uint64
	lastHit  time.Time
}

// zone is a zone the controller polls, at every endpoint: the port may
// have the sockets of several servers, which serve the zone or not, and
// change it each in its own time.
type zone struct {
	apex string
	at   map[*endpoint]*zoneSerial // what each endpoint's server answered
}

// zoneSerial is what one server answered to the zone's SOA polls.
type zoneSerial struct {
	serial  uint32
	known   bool
	failing bool      // the last SOA poll got no serial (logged once)
	outage  outageLog // the level of those lines
}

// serialAt is what ep's server answered to z's SOA polls so far.
func (z *zone) serialAt(ep *endpoint) *zoneSerial {
	if z.at == nil {
		z.at = map[*endpoint]*zoneSerial{}
	}
	if z.at[ep] == nil {
		z.at[ep] = &zoneSerial{}
	}
	return z.at[ep]
}

type sampleEvent struct {
	ep     *endpoint
	sample santa.Sample
}

// New checks cfg and fills in defaults.
func New(cfg Config) (*Controller, error) {
	d := DefaultConfig
	setDefault(&cfg.MaxRules, d.MaxRules)
	setDefault(&cfg.MinSamples, d.MinSamples)
	setDefault(&cfg.Interval, d.Interval)
	setDefault(&cfg.Idle, d.Idle)
	setDefault(&cfg.SampleRate, d.SampleRate)
	setDefault(&cfg.QuietSampleRate, d.QuietSampleRate)
	setDefault(&cfg.QuietAfter, d.QuietAfter)
	setDefault(&cfg.Parallel, d.Parallel)
	setDefault(&cfg.Timeout, d.Timeout)
	setDefault(&cfg.Batch, d.Batch)
	setDefault(&cfg.Tag, d.Tag)
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	switch {
	case cfg.Port == 0 && cfg.PID == 0:
		return nil, errors.New("say which server socket to attach to: a port, or a pid and fd")
	case cfg.Port != 0 && cfg.PID != 0:
		return nil, errors.New("attach by port or by pid and fd, not both")
	case cfg.Mode != Static && cfg.Mode != Top && cfg.Mode != Adaptive:
		return nil, fmt.Errorf("unknown mode %d", cfg.Mode)
	case cfg.Mode != Adaptive && len(cfg.Questions) == 0:
		return nil, fmt.Errorf("%s mode needs questions to offload (none were given)", cfg.Mode)
	case cfg.Mode != Adaptive && len(cfg.Shapes) == 0:
		return nil, fmt.Errorf("%s mode needs at least one query shape", cfg.Mode)
	case cfg.Interval < 0 || cfg.Idle < 0 || cfg.Poll < 0 || cfg.Timeout < 0:
		return nil, fmt.Errorf("interval %v, idle %v, poll %v, timeout %v: none may be negative",
			cfg.Interval, cfg.Idle, cfg.Poll, cfg.Timeout)
	case cfg.MaxRules < 0 || cfg.Parallel < 0 || cfg.Batch < 0:
		return nil, fmt.Errorf("max rules %d, parallel %d, batch %d: none may be negative", cfg.MaxRules, cfg.Parallel, cfg.Batch)
	}
	if err := api.CheckTag(cfg.Tag); err != nil {
		return nil, err
	}
	c := &Controller{
		cfg: cfg, log: cfg.Log,
		allowed: map[Question]bool{},
		initial: map[string]bool{},
		zones:   map[string]*zone{},
		zoneOf:  map[string]string{},
		wheel:   map[int64][]*entry{},
		samples: make(chan sampleEvent, 4096),
		rep:     Report{Skipped: map[string]int{}},
	}
	for _, q := range cfg.Questions {
		c.allowed[q] = true
	}
	for _, z := range cfg.Zones {
		apex := canonical(z)
		c.zones[apex] = &zone{apex: apex}
	}
	return c, nil
}

func setDefault[T comparable](v *T, d T) {
	var zero T
	if *v == zero {
		*v = d
	}
}

// Report returns a copy of the counters.
func (c *Controller) Report() Report {
	c.repMu.Lock()
	defer c.repMu.Unlock()
	r := c.rep
	// a copy, and nil with nothing in it: a controller that never started
	// has a zero Report, and santa dns then prints no done line
	r.Skipped = nil
	for k, v := range c.rep.Skipped {
		if r.Skipped == nil {
			r.Skipped = map[string]int{}
		}
		r.Skipped[k] = v
	}
	r.Rules, r.Waiting = 0, 0
	for _, ep := range c.eps {
		r.Rules += len(ep.entries) * len(ep.cookies)
		r.Waiting += len(ep.waiting)
	}
	return r
}

func (c *Controller) count(f func(r *Report)) {
	c.repMu.Lock()
	f(&c.rep)
	c.repMu.Unlock()
}

// Run attaches, installs the initial rules and keeps them fresh until ctx
// ends; then it deletes every rule it installed.
func (c *Controller) Run(ctx context.Context) error {
	// a bad NOTIFY address fails before anything is attached or installed
	notified := make(chan string, 16)
	if c.cfg.Notify != "" {
		stop, err := listenNotify(c.cfg.Notify, notified, c.log)
		if err != nil {
			return err
		}
		defer stop()
	}
	client, err := santa.Dial(c.cfg.Socket)
	if err != nil {
		return err
	}
	c.client = client
	c.santad = follow.SantadPID(client)
	defer client.Close()
	if err := c.attach(); err != nil {
		follow.UnbindEmpty(c.client, c.created, c.log)
		return err
	}
	defer func() {
		for _, ep := range c.eps {
			ep.asker.Close()
		}
	}()
	// a stop ends the questions in flight: a hung server would hold it
	// for their tries
	stopAsking := context.AfterFunc(ctx, func() {
		for _, ep := range c.eps {
			ep.asker.Stop()
		}
	})
	defer stopAsking()
	// claimed once attached: --pid and --fd name a socket whose port only
	// santad's answer tells
	if c.claim, err = follow.ClaimTag(c.cfg.Socket, api.ProtocolUDP, c.eps[0].addr.Port(), c.cfg.Tag); err != nil {
		follow.UnbindEmpty(c.client, c.created, c.log)
		return err
	}
	defer c.claim.Release()
	if err := c.takeOverCreated(); err != nil {
		follow.UnbindEmpty(c.client, c.created, c.log)
		return err
	}
	var cookies []uint64
	for _, ep := range c.eps {
		cookies = append(cookies, ep.cookies...)
	}
	if c.inherited, err = follow.Inherit(c.cfg.Socket, c.cfg.Tag, cookies, c.log); err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	defer c.removeAll(ctx)
	expireCtx, stopExpire := context.WithCancel(ctx)
	defer stopExpire()
	go c.expireLoop(expireCtx)

	if err := c.checkZones(); err != nil {
		return err
	}
	// started: counted only now, so that a controller refused its tag or
	// its --zone has a zero Report, and santa dns prints only its error
	c.count(func(r *Report) { r.Sockets = c.attached })
	if c.cfg.Mode != Adaptive {
		if err := c.installInitial(ctx); err != nil {
			return err
		}
	}
	if err := c.installInherited(ctx); err != nil {
		return err
	}
	if err := c.inherited.DeleteRest(c.client); err != nil {
		return err
	}
	if c.cfg.Ready != nil {
		c.cfg.Ready(c.Report())
	}
	subCtx, stopSubs := context.WithCancel(ctx)
	defer stopSubs()
	if c.watcher, err = c.watch(subCtx); err != nil {
		return err
	}
	c.lastShape, c.quiet = time.Now(), false
	return c.loop(ctx, notified, c.watcher.Ended())
}

// attach binds the server's sockets and groups them by address.
func (c *Controller) attach() error {
	var socks []api.SocketInfo
	if c.cfg.Port != 0 {
		s, err := c.client.BindPort(c.cfg.Port)
		if err != nil {
			return fmt.Errorf("attach to UDP port %d: %w", c.cfg.Port, err)
		}
		socks = s
	} else {
		s, err := c.client.BindPID(c.cfg.PID, c.cfg.FD, santa.SampleOptions{})
		if err != nil {
			return fmt.Errorf("attach to fd %d of pid %d: %w", c.cfg.FD, c.cfg.PID, err)
		}
		if s.Protocol != api.ProtocolUDP {
			c.created = created(s)
			return fmt.Errorf("fd %d of pid %d is not a UDP socket (%s): santa dns takes a DNS server's UDP sockets",
				c.cfg.FD, c.cfg.PID, s.AddrPort())
		}
		socks = []api.SocketInfo{s}
	}
	// every rule set attach made is removed again if it fails
	c.created = created(socks...)
	// elsewhere the addresses the controller would ask may be another
	// server's, or nobody's
	here, err := follow.InNamespace(socks)
	if err != nil {
		return err
	}
	if !here {
		return errors.New("the server's sockets are in santad's network namespace, not in this one: run santa dns in it (e.g. ip netns exec NAME santa dns ...)")
	}
	if api.LoopbackOnly(socks) {
		c.log.Warn(api.LoopbackWarning)
	}
	byAddr := map[netip.AddrPort]*endpoint{}
	for _, s := range socks {
		if s.Protocol != 17 {
			continue
		}
		bound := s.AddrPort()
		ep := byAddr[bound]
		if ep == nil {
			ask := bound
			if c.cfg.Server.IsValid() {
				ask = netip.AddrPortFrom(c.cfg.Server, bound.Port())
			} else if bound.Addr().IsUnspecified() {
				lo := netip.MustParseAddr("127.0.0.1")
				if s.Family == 6 {
					lo = netip.IPv6Loopback()
				}
				ask = netip.AddrPortFrom(lo, bound.Port())
			}
			asker, err := NewAsker(ask, c.cfg.Parallel, c.cfg.Timeout, 3)
			if err != nil {
				return err
			}
			asker.Silence = silenceLogger(c.log, ask, c.cfg.Timeout)
			ep = &endpoint{family: int(s.Family), addr: ask, asker: asker,
				entries: map[string]*entry{}, pending: map[string]bool{}, samplesOf: map[string]*Query{},
				waiting: map[string]*waitingQuery{},
				sketch:  sketch.New(4 * min(c.cfg.MaxRules, 16384))}
			byAddr[bound] = ep
			c.eps = append(c.eps, ep)
		}
		ep.cookies = append(ep.cookies, s.Cookie)
	}
	if len(c.eps) == 0 {
		return fmt.Errorf("no UDP socket found to attach to")
	}
	sort.Slice(c.eps, func(i, j int) bool { return c.eps[i].addr.String() < c.eps[j].addr.String() })
	c.attached = len(socks)
	for _, ep := range c.eps {
		c.log.Info("attached", "server", ep.addr, "family", ep.family, "sockets", len(ep.cookies))
	}
	return nil
}

// takeOverCreated takes over the rule sets a predecessor with the tag on
// the port made and left (follow.Claim.TakeOverCreated).
func (c *Controller) takeOverCreated() (err error) {
	bound, err := follow.BoundRuleSets(c.client)
	if err != nil {
		return err
	}
	c.created, err = c.claim.TakeOverCreated(c.created, bound, c.log)
	return err
}

// created are the cookies of the sockets whose rule set santad made for
// this bind.
func created(socks ...api.SocketInfo) []uint64 {
	var out []uint64
	for _, s := range socks {
		if s.Created {
			out = append(out, s.Cookie)
		}
	}
	return out
}

// probe finds out the endpoint's behaviour from the first questions.
func (c *Controller) probe(ep *endpoint, questions []Question) {
	if ep.probed {
		return
	}
	ep.probed = true
	c.mu.Unlock()
	b, n, err := Probe(ep.asker, questions[:min(len(questions), 16)])
	c.mu.Lock()
	// a failure is said once: probing again with other questions may fail
	// many times
	again := !ep.probeAgain.IsZero()
	if err != nil && again {
		c.log.Debug("probing the server failed again", "server", ep.addr, "error", err)
	} else if err != nil {
		c.log.Warn("probing the server failed", "server", ep.addr, "error", err)
	}
	if noAnswer(err) {
		ep.probed = false // again before the next install: the server may answer by then
	} else if n == 0 && len(ep.entries) == 0 {
		// none of these questions could be offloaded (a junk name the server
		// refuses, TTL 0, ...): others may, as long as no rule was made to
		// match every byte
		ep.probed, ep.probeAgain = false, time.Now().Add(time.Second)
	}
	ep.b = b
	if err == nil || !again {
		c.log.Info("probed the server", "server", ep.addr, "questions", n, "behaviour", b.String())
	}
	if err == nil && !b.IgnoresCookie {
		c.log.Info("the server answers DNS cookies: queries that carry a client cookie (dig's default; many resolvers send one) stay with it",
			"server", ep.addr)
	}
}

// installInitial installs every question in every shape on every endpoint.
func (c *Controller) installInitial(ctx context.Context) error {
	var queries []*Query
	var questions []Question
	for _, q := range c.cfg.Questions {
		for _, s := range c.cfg.Shapes {
			wire, err := s.Query(0, q.Name, q.Type)
			if err != nil {
				c.skip(err)
				continue
			}
			pq, err := ParseQuery(wire)
			if err != nil {
				c.skip(err)
				continue
			}
			queries = append(queries, pq)
			questions = append(questions, q)
			c.initial[string(pq.Wire[2:])] = true
		}
	}
	for _, ep := range c.eps {
		c.probe(ep, c.cfg.Questions)
	}
	start := time.Now()
	if err := c.installMany(ctx, c.eps, queries, questions); err != nil {
		return err
	}
	for _, ep := range c.eps {
		c.log.Info("installed", "server", ep.addr, "rules", len(ep.entries), "queries", len(queries),
			"elapsed", time.Since(start).Round(time.Millisecond))
	}
	if len(c.rep.Skipped) > 0 {
		c.log.Info("not offloaded (they stay with the server)", "reasons", c.Report().Skipped)
	}
	return nil
}

// installMany installs queries on every endpoint of eps, a batch at a time
// and taking turns: when santad has no room for all of them, each endpoint
// has the first ones (in top mode the most popular), not one endpoint all.
// It logs its progress on long work, and stops when ctx ends.
func (c *Controller) installMany(ctx context.Context, eps []*endpoint, queries []*Query, questions []Question) error {
	start, logged := time.Now(), time.Now()
	for i := 0; i < len(queries); i += c.cfg.Batch {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		j := min(i+c.cfg.Batch, len(queries))
		for k, ep := range eps {
			err := c.install(ep, queries[i:j], questions[i:j])
			if errors.Is(err, errNoRoom) {
				// asking the server for answers santad has no room for is
				// no use: the rest stays with the server, on every
				// endpoint, until rules go from santad
				left := len(eps)*(len(queries)-j) + (len(eps)-k-1)*(j-i)
				c.count(func(r *Report) { r.Skipped[noRoomReason] += left })
				for _, later := range eps[k+1:] {
					c.waitForRoom(later, queries[i:j], questions[i:j])
				}
				for _, ep := range eps {
					c.waitForRoom(ep, queries[j:], questions[j:])
				}
				return nil
			}
			if err != nil {
				return err
			}
		}
		if time.Since(logged) >= progressEvery {
			logged = time.Now()
			c.log.Info("installing", "done", j, "of", len(queries), "rules", c.Report().Rules,
				"elapsed", time.Since(start).Round(time.Millisecond))
		}
	}
	return nil
}

// progressEvery is how often a long install logs its progress.
const progressEvery = 5 * time.Second

// installInherited installs again, in the shape it had, the question of
// every rule a predecessor left (follow.Inherited) that this run may
// offload and has not installed yet: one a static or top run allows (a
// shape learned from misses, say), any in adaptive mode (kept while it has
// hits). The new rules supersede the old ones, so the rule processor goes
// on answering those questions, and a restart does not send their whole
// load to the server until they are learned again.
func (c *Controller) installInherited(ctx context.Context) error {
	for _, ep := range c.eps {
		// learned shapes (Static, Top) and every rule (Adaptive) count
		// towards MaxRules: installAnswers counts the learned ones it installs
		room := c.cfg.MaxRules - ep.learned
		if c.cfg.Mode == Adaptive {
			room = c.cfg.MaxRules - len(ep.entries)
		}
		var queries []*Query
		var questions []Question
		for _, r := range c.inherited.Rules(ep.cookies[0]) { // an endpoint's sockets hold the same rules
			q := queryOf(r)
			if q == nil || ep.entries[r.MatchKey()] != nil {
				continue
			}
			question := Question{q.Name, q.Type}
			if c.cfg.Mode != Adaptive && !c.allowed[question] {
				continue
			}
			if c.cfg.Mode == Adaptive || c.isLearned(q) {
				if room <= 0 {
					continue
				}
				room--
			}
			queries = append(queries, q)
			questions = append(questions, question)
		}
		if len(queries) == 0 {
			continue
		}
		c.probe(ep, questions)
		for _, q := range queries {
			ep.pending[formKey(q, ep.b)] = true
		}
		before := len(ep.entries)
		if err := c.installMany(ctx, []*endpoint{ep}, queries, questions); err != nil {
			return err
		}
		c.log.Info("installed again the questions of the rules a predecessor left", "server", ep.addr,
			"queries", len(queries), "rules", len(ep.entries)-before)
	}
	return nil
}

// isLearned reports whether q is of a shape learned from misses (Static
// and Top mode): not one of the queries installed up front. Those count
// towards MaxRules.
func (c *Controller) isLearned(q *Query) bool {
	return c.cfg.Mode != Adaptive && !c.initial[string(q.Wire[2:])]
}

// skip counts a question that is not offloaded, by the kind of reason.
func (c *Controller) skip(err error) {
	reason := err.Error()
	if i := strings.IndexAny(reason, "0123456789"); i > 0 && errors.Is(err, ErrNotOffloadable) {
		reason = strings.TrimSpace(reason[:i])
	}
	c.count(func(r *Report) { r.Skipped[reason]++ })
}

// ask asks ep's server one query without holding c.mu.
func (c *Controller) ask(ep *endpoint, wire []byte) ([]byte, error) {
	c.mu.Unlock()
	defer c.mu.Lock()
	return ep.asker.Ask(wire)
}

// askAll asks ep's server every wire query without holding c.mu.
func (c *Controller) askAll(ep *endpoint, wires [][]byte, done func(i int, reply []byte, err error)) {
	c.mu.Unlock()
	defer c.mu.Lock()
	ep.asker.AskAll(wires, done)
}

// checkReply is CheckReply of ep's reply to q, then ep's order check of an
// answer with a set of several records, and whether the reply is the same
// at every UDP size (Answer.AnySize). It runs without c.mu.
func (c *Controller) checkReply(ep *endpoint, q *Query, reply []byte) (Answer, error) {
	a, err := CheckReply(q, reply, ep.family)
	if err != nil {
		return a, err
	}
	if a.AnySize, err = sameAtEverySize(ep, q, reply); err != nil {
		return a, err
	}
	return a, ep.order.check(ep.asker, q, a)
}

// sameAtEverySize reports whether ep's server sends reply, its reply to q,
// whatever UDP size q advertises: a reply of at most 512 bytes (which every
// size admits) from a server whose small replies do not depend on the size
// (Behaviour.IgnoresSize), that is the server's whole answer. A server cuts
// a reply down to a small size by leaving out additional records, without
// TC, so the reply to the largest size must be the same.
func sameAtEverySize(ep *endpoint, q *Query, reply []byte) (bool, error) {
	if !ep.b.IgnoresSize || !q.EDNS || len(reply) > minUDPSize {
		return false, nil
	}
	sizeOff := q.questionEnd + 3
	if binary.BigEndian.Uint16(q.Wire[sizeOff:]) == maxUDPSize {
		return true, nil
	}
	largest := bytes.Clone(q.Wire)
	binary.BigEndian.PutUint16(largest[sizeOff:], maxUDPSize)
	whole, err := ep.asker.Ask(largest)
	if err != nil {
		return false, err
	}
	return bytes.Equal(whole, reply), nil
}

// dropShuffled, once ep's server is known to vary answers with sets of
// several records, turns such answers among answers into errVaries, and
// the first time removes the rules made of such answers before it was
// known (checked in parallel, a shuffled set can come back the same a few
// times).
func (c *Controller) dropShuffled(ep *endpoint, answers []Answer, errs []error) error {
	varies, first := ep.order.found()
	if !varies {
		return nil
	}
	for i := range answers {
		if errs[i] == nil && answers[i].SetOfSeveral {
			errs[i] = errVaries
		}
	}
	if !first {
		return nil
	}
	var gone []*entry
	for _, e := range ep.entries {
		if e.answer.SetOfSeveral && e.ids != nil {
			gone = append(gone, e)
		}
	}
	c.log.Info("the server varies the order of records in a set: answers with sets of several records stay with it",
		"server", ep.addr, "rules_removed", len(gone))
	return c.remove(ep, gone)
}

// install asks the server for every query, makes rules of the answers and
// adds those not installed yet. The questions it does not offload are
// counted (Report.Skipped) and, in Static and Top mode, asked again later,
// or when santad has room (askagain.go).
func (c *Controller) install(ep *endpoint, queries []*Query, questions []Question) error {
	answers, errs, asked, err := c.askChecked(ep, queries)
	if err != nil {
		return err
	}
	left, installErr := c.installAnswers(ep, queries, questions, answers, errs, asked)
	if left > 0 {
		c.count(func(r *Report) { r.Skipped[noRoomReason] += left })
	}
	var waiting []string
	for i, err := range errs {
		if err == nil {
			continue
		}
		c.skip(err)
		if c.askAgainLater(ep, queries[i], questions[i]) {
			waiting = append(waiting, questions[i].Name)
		}
	}
	// a change of their zone asks them again at once
	if err := c.zonesFor(ep, waiting); err != nil {
		return err
	}
	return installErr
}

// askChecked asks ep's server every query and checks each reply: errs[i]
// says why answers[i] cannot be offloaded, if it cannot. The answers' TTLs
// run from asked.
func (c *Controller) askChecked(ep *endpoint, queries []*Query) (answers []Answer, errs []error, asked time.Time, err error) {
	answers = make([]Answer, len(queries))
	errs = make([]error, len(queries))
	wires := make([][]byte, len(queries))
	for i, q := range queries {
		wires[i] = q.Wire
	}
	asked = time.Now()
	c.askAll(ep, wires, func(i int, reply []byte, err error) {
		if err == nil {
			answers[i], err = c.checkReply(ep, queries[i], reply)
		}
		errs[i] = err
	})
	return answers, errs, asked, c.dropShuffled(ep, answers, errs)
}

// installAnswers adds the rule of every answer without an error whose rule
// is not installed yet; a rule santad refuses gets santad's reason in errs.
// When santad has no room for them all it returns errNoRoom and how many
// it left to the server, which wait for room (Static and Top mode).
func (c *Controller) installAnswers(ep *endpoint, queries []*Query, questions []Question, answers []Answer, errs []error, asked time.Time) (left int, err error) {
	fresh := make([]*entry, 0, len(queries))
	rules := make([]api.Rule, 0, len(queries))
	queryOf := make([]int, 0, len(queries)) // fresh[k]'s index in queries
	for i, q := range queries {
		if errs[i] != nil {
			continue
		}
		r := Rule(q, answers[i], ep.b)
		key := r.MatchKey()
		if ep.entries[key] != nil {
			continue
		}
		e := &entry{key: key, question: questions[i], query: q, answer: answers[i], fetched: asked, lastHit: asked, ep: ep,
			learned: c.isLearned(q)}
		r.Expires, r.Tag = uint64(e.expires().Unix()), c.cfg.Tag
		ep.entries[key] = e
		fresh = append(fresh, e)
		rules = append(rules, r)
		queryOf = append(queryOf, i)
	}
	names := make([]string, 0, len(fresh))
	for _, e := range fresh {
		names = append(append(names, e.question.Name), e.answer.Chain...)
	}
	if err := c.zonesFor(ep, names); err != nil {
		return 0, err
	}
	for i := 0; i < len(rules); i += c.cfg.Batch {
		j := min(i+c.cfg.Batch, len(rules))
		added, full, err := c.add(ep, fresh[i:j], rules[i:j], func(k int, err error) { errs[queryOf[i+k]] = err })
		if err != nil {
			return 0, err
		}
		if full { // the rest of fresh stays with the server
			for _, e := range fresh[i:] {
				if e.ids == nil && !e.dead {
					e.dead = true
					left++
					c.waitForRoom(ep, []*Query{e.query}, []Question{e.question})
				}
			}
			j = len(rules)
		}
		for _, e := range fresh[i:j] {
			if e.dead {
				delete(ep.entries, e.key)
			} else {
				c.schedule(e)
				if e.learned {
					ep.learned++
				}
			}
		}
		c.count(func(r *Report) { r.Installed += uint64(added * len(ep.cookies)) })
		if full {
			return left, errNoRoom
		}
	}
	return 0, nil
}

// errNoRoom says santad had no room for a rule install added: the rest of
// its questions stay with the server.
var errNoRoom = errors.New("santad has no room for more rules")

// add installs rules (one per entry) on every socket of ep, as far as
// santad takes them (follow.AddFitting), and returns how many it added. A
// rule santad refuses (e.g. more rules share the bytes the matcher hashes
// than a bucket chain takes) is left to the server, logged, its entry
// marked dead, and passed to refused with santad's reason. It stops at the
// first santad has no room for, and says so (full).
func (c *Controller) add(ep *endpoint, es []*entry, rules []api.Rule, refused func(k int, err error)) (added int, full bool, err error) {
	ids, err := follow.AddFitting(c.client, ep.cookies, rules, c.inherited, func(k int, err error) {
		es[k].dead = true
		refused(k, fmt.Errorf("%w: santad refused the rule: %v", ErrNotOffloadable, err))
		c.log.Debug("santad refused a rule", "question", es[k].query, "error", err)
	})
	for k, e := range es {
		if ids[k] != nil {
			e.ids = ids[k]
			added++
		}
	}
	if follow.NoRoom(err) {
		return added, true, c.outOfRoom(ep, err)
	}
	return added, false, err
}

// noRoomReason is the reason of the questions left to the server because
// santad has no room for their rules.
const noRoomReason = "santad has no room"

// outOfRoom notes santad's usage when it had no room for more rules
// (follow.Room), and says so the first time.
func (c *Controller) outOfRoom(ep *endpoint, err error) error {
	c.roomLeft = 0
	if !c.saidFull {
		c.saidFull = true
		c.log.Warn("santad has no room for more rules: the questions left stay with the server until rules go from santad",
			"server", ep.addr, "error", err)
	}
	return c.room.Refused(c.client)
}

// expires is when e's rule must be gone: the whole second at or before the
// end of its answer's TTL. The rule carries it (api.Rule.Expires), so santad
// removes it then even if this controller is gone.
func (e *entry) expires() time.Time { return time.Unix(e.fetched.Add(e.answer.TTL).Unix(), 0) }

// schedule puts e in the refresh wheel at half its TTL (at least a second
// before its rule expires, and no earlier than a second from now) and in
// the expiry heap at its rule's expiry.
func (c *Controller) schedule(e *entry) {
	at := e.fetched.Add(e.answer.TTL / 2)
	if latest := e.expires().Add(-time.Second); at.After(latest) {
		at = latest
	}
	c.retryAt(e, max(at.Unix(), time.Now().Unix()+1))
	heap.Push(&c.expiry, expiryItem{e, e.fetched})
}

func (c *Controller) retryAt(e *entry, sec int64) { c.wheel[sec] = append(c.wheel[sec], e) }

// expireLoop deletes, ten times a second, the rules whose answer's TTL is
// about to run out because no refresh succeeded in time (the server does
// not answer, or the main loop is busy asking it).
func (c *Controller) expireLoop(ctx context.Context) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.mu.Lock()
			if ctx.Err() != nil { // Run is removing every rule
				c.mu.Unlock()
				return
			}
			now := time.Now() // the lock may have taken a while
			byEP := map[*endpoint][]*entry{}
			for len(c.expiry) > 0 {
				it := c.expiry[0]
				if it.e.expires().Add(-expiryMargin).After(now) && it.fetched == it.e.fetched {
					break
				}
				heap.Pop(&c.expiry)
				if it.fetched == it.e.fetched && !it.e.dead { // not refreshed since
					byEP[it.e.ep] = append(byEP[it.e.ep], it.e)
				}
			}
			for ep, es := range byEP {
				c.log.Info("answers not refreshed in time: removing their rules", "server", ep.addr, "rules", len(es))
				if err := c.remove(ep, es); err != nil {
					c.log.Error("removing expired rules failed", "error", err)
				}
			}
			c.mu.Unlock()
		}
	}
}

// expiryItem is an entry as of one fetch: stale once the entry is refreshed.
type expiryItem struct {
	e       *entry
	fetched time.Time
}

// expiryHeap orders items by the end of their TTL (when they were fetched).
type expiryHeap []expiryItem

func (h expiryHeap) Len() int { return len(h) }
func (h expiryHeap) Less(i, j int) bool {
	return h[i].fetched.Add(h[i].e.answer.TTL).Before(h[j].fetched.Add(h[j].e.answer.TTL))
}
func (h expiryHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *expiryHeap) Push(x any)   { *h = append(*h, x.(expiryItem)) }
func (h *expiryHeap) Pop() any {
	old := *h
	it := old[len(old)-1]
	*h = old[:len(old)-1]
	return it
}

// zonesFor finds the zone of each name of a new entry or waiting query
// (asking the server for the SOA of names outside the configured zones)
// and learns new zones' serials. Polling and NOTIFY both need them.
func (c *Controller) zonesFor(ep *endpoint, names []string) error {
	if c.cfg.Poll == 0 && c.cfg.Notify == "" {
		return nil
	}
	var unknown []string
	seen := map[string]bool{}
	for _, n := range names {
		name := canonical(n)
		if _, ok := c.zoneOf[name]; ok || seen[name] {
			continue
		}
		if apex := c.configuredZone(name); apex != "" {
			c.zoneOf[name] = apex
			continue
		}
		seen[name] = true
		unknown = append(unknown, name)
	}
	for i, apex := range c.zonesHolding(ep, unknown) {
		if apex == "" {
			continue
		}
		c.zoneOf[unknown[i]] = apex
		if c.zones[apex] == nil {
			c.zones[apex] = &zone{apex: apex}
		}
	}
	for _, z := range c.zones {
		if !z.serialAt(ep).known {
			c.pollZone(ep, z)
		}
	}
	return nil
}

// zonesHolding finds, for each name (canonical), the zone whose data
// ep's server answers it from, asking for the SOA of the name: its apex,
// or "" if none is found. When the reply names no zone of the name (a
// CNAME chain, a referral: see soaOf), the SOA of the name above it that
// the reply points to is asked for, so that a change of the CNAME, or of
// the delegation and its glue, refreshes the name's rules.
func (c *Controller) zonesHolding(ep *endpoint, names []string) []string {
	apexes := make([]string, len(names))
	asking := slices.Clone(names) // "": found, or given up
	for {
		var wires [][]byte
		var which []int
		for i, n := range asking {
			if n != "" {
				wire, _ := Shape{}.Query(0, n, soaType)
				wires, which = append(wires, wire), append(which, i)
			}
		}
		if len(wires) == 0 {
			return apexes
		}
		c.askAll(ep, wires, func(k int, reply []byte, err error) {
			i := which[k]
			asked := asking[i]
			asking[i] = ""
			var above string
			if err == nil {
				apexes[i], _, above, err = soaOf(reply)
			}
			// only a name above the one asked: each round asks a shorter name
			if above != "" && above != asked && inZone(asked, above) {
				asking[i] = above
				return
			}
			if err != nil {
				c.log.Debug("no zone found", "name", names[i], "error", err)
			}
		})
	}
}

// configuredZone is the longest configured zone that contains name.
func (c *Controller) configuredZone(name string) string {
	best := ""
	for _, z := range c.cfg.Zones {
		apex := canonical(z)
		if inZone(name, apex) && len(apex) > len(best) {
			best = apex
		}
	}
	return best
}

// loop handles the controller's events until ctx ends or the sample watch
// ends (gone): just after every second of the wall clock the refreshes and
// questions due, then SOA polls, NOTIFYs, miss samples and adaptive
// decisions. It waits with c.mu released, so that expireLoop can remove
// the rules not refreshed in time, and handles each event holding it.
func (c *Controller) loop(ctx context.Context, notified <-chan string, gone <-chan error) error {
	tick := time.NewTimer(untilNextSecond(time.Now()))
	defer tick.Stop()
	var poll <-chan time.Time
	if c.cfg.Poll > 0 {
		t := time.NewTicker(c.cfg.Poll)
		defer t.Stop()
		poll = t.C
	}
	var decide <-chan time.Time
	if c.cfg.Mode == Adaptive {
		t := time.NewTicker(c.cfg.Interval)
		defer t.Stop()
		decide = t.C
	}
	for {
		var handle func() error
		c.mu.Unlock()
		select {
		case <-ctx.Done():
			c.mu.Lock()
			return nil
		case err := <-gone:
			c.mu.Lock()
			return err
		case <-tick.C:
			tick.Reset(untilNextSecond(time.Now()))
			handle = c.everySecond
		case <-poll:
			handle = c.pollAll
		case apex := <-notified:
			handle = func() error { return c.notified(apex) }
		case ev := <-c.samples:
			handle = func() error { return c.learn(ev) }
		case <-decide:
			handle = c.adapt
		}
		c.mu.Lock()
		if err := handle(); err != nil {
			return err
		}
	}
}

// untilNextSecond is the time until just after the next second of the
// wall clock: refreshes are due by the second (schedule).
func untilNextSecond(now time.Time) time.Duration {
	return now.Truncate(time.Second).Add(time.Second + 2*time.Millisecond).Sub(now)
}

// everySecond refreshes the answers and asks again the questions that are
// due, and lowers the miss sampling once no new shape came for a while.
func (c *Controller) everySecond() error {
	now := time.Now()
	if err := c.refreshDue(now); err != nil {
		return err
	}
	if err := c.askAgainDue(now); err != nil {
		return err
	}
	if err := c.askAgainWithRoom(); err != nil {
		return err
	}
	c.quietDown(now)
	return nil
}

// notified checks the zone a NOTIFY named.
func (c *Controller) notified(apex string) error {
	z := c.zones[canonical(apex)]
	if z == nil {
		c.log.Info("NOTIFY for a zone no rule is in", "zone", apex)
		return nil
	}
	return c.checkZone(z)
}

// refreshDue asks again for every answer due for refresh and updates,
// keeps or removes its rule.
func (c *Controller) refreshDue(now time.Time) error {
	var due []*entry
	for sec, es := range c.wheel {
		if sec <= now.Unix() {
			due = append(due, es...)
			delete(c.wheel, sec)
		}
	}
	return c.refresh(due)
}

// refresh re-asks the answers of entries and applies what changed.
func (c *Controller) refresh(entries []*entry) error {
	byEP := map[*endpoint][]*entry{}
	for _, e := range entries {
		if e.dead {
			continue
		}
		for _, ep := range c.eps {
			if ep.entries[e.key] == e {
				byEP[ep] = append(byEP[ep], e)
			}
		}
	}
	for _, ep := range c.eps {
		if err := c.refreshEndpoint(ep, byEP[ep]); err != nil {
			return err
		}
	}
	return nil
}

func (c *Controller) refreshEndpoint(ep *endpoint, es []*entry) error {
	if len(es) == 0 {
		return nil
	}
	queries := make([]*Query, len(es))
	for i, e := range es {
		queries[i] = e.query
	}
	answers, errs, asked, err := c.askChecked(ep, queries)
	if err != nil {
		return err
	}
	var changed, gone []*entry // changed: refreshed, their rules modified (a new expiry at least)
	var rules []api.Rule
	var chains []string // where the new answers' chains lead: their zones are polled too
	differ := 0         // of changed, those whose reply changed
	for i, e := range es {
		switch {
		case e.dead:
			continue // expired while asking
		case errs[i] != nil && !errors.Is(errs[i], ErrNotOffloadable):
			// no answer for now: keep the rule while its TTL allows (expireLoop
			// removes it in time) and ask again in a second
			c.log.Debug("refresh failed, retrying", "question", e.query, "error", errs[i])
			c.retryAt(e, time.Now().Unix()+1)
			continue
		case errs[i] != nil:
			c.log.Info("removing rule", "question", e.query, "reason", errs[i])
			gone = append(gone, e)
			continue
		}
		newRule := Rule(e.query, answers[i], ep.b)
		if newRule.MatchKey() != e.key {
			// e.g. the reply grew past 512 bytes: the rule now matches less
			gone = append(gone, e)
			continue
		}
		if string(answers[i].Reply[2:]) != string(e.answer.Reply[2:]) {
			differ++
			c.count(func(r *Report) { r.Changed += uint64(len(ep.cookies)) })
		}
		// the same reply too: the rule's expiry moves with the new TTL
		e.answer, e.fetched = answers[i], asked
		chains = append(chains, e.answer.Chain...)
		c.count(func(r *Report) { r.Refreshed++ })
		newRule.Expires, newRule.Tag = uint64(e.expires().Unix()), c.cfg.Tag
		changed = append(changed, e)
		rules = append(rules, newRule)
		c.schedule(e)
	}
	for i := 0; i < len(rules); i += c.cfg.Batch {
		j := min(i+c.cfg.Batch, len(rules))
		for ci, cookie := range ep.cookies {
			batch := slices.Clone(rules[i:j])
			for k := range batch {
				batch[k].ID = changed[i+k].ids[ci]
			}
			err := c.client.Modify(santa.Cookie(cookie), batch)
			if follow.NoRoom(err) {
				err = c.replaceRules(ep, changed[i:j], ci, cookie, batch)
			}
			if err != nil {
				// the new answer cannot be offloaded as it is: drop the old one
				c.log.Warn("santad refused updated rules: removing them", "rules", len(batch), "error", err)
				gone = append(gone, changed[i:j]...)
				break
			}
		}
	}
	if err := c.zonesFor(ep, chains); err != nil {
		return err
	}
	if differ > 0 {
		c.log.Info("answers changed", "server", ep.addr, "rules", differ)
	}
	if len(changed) > 0 {
		c.log.Debug("answers refreshed", "server", ep.addr, "rules", len(changed))
	}
	return c.remove(ep, gone)
}

// replaceRules puts rules, the new versions of es's, on socket cookie (the
// ci-th of ep's) when santad has no room to modify them in place (it
// holds both versions while it swaps them, and a full santad has room for
// neither): it deletes the old versions, which makes the room, and adds
// the new ones. Until they are in, the server answers their queries.
func (c *Controller) replaceRules(ep *endpoint, es []*entry, ci int, cookie uint64, rules []api.Rule) error {
	old := make([]uint64, len(es))
	for k, e := range es {
		old[k] = e.ids[ci]
	}
	if err := follow.DeleteRules(c.client, cookie, old); err != nil {
		return err
	}
	add := slices.Clone(rules)
	for k := range add {
		add[k].ID = 0
	}
	ids, err := c.client.Add(santa.Cookie(cookie), add)
	if err != nil {
		return err // the old versions are gone: the caller removes the entries
	}
	for k, e := range es {
		e.ids[ci] = ids[k]
	}
	c.log.Info("santad has no room to update rules in place: replaced them (deleted, then added)",
		"server", ep.addr, "socket", cookie, "rules", len(es))
	return nil
}

// remove deletes entries' rules.
func (c *Controller) remove(ep *endpoint, es []*entry) error {
	for i := 0; i < len(es); i += c.cfg.Batch {
		batch := es[i:min(i+c.cfg.Batch, len(es))]
		for ci, cookie := range ep.cookies {
			ids := make([]uint64, len(batch))
			for k, e := range batch {
				ids[k] = e.ids[ci]
			}
			if err := follow.DeleteRules(c.client, cookie, ids); err != nil {
				return fmt.Errorf("delete %d rules of socket %d: %w", len(ids), cookie, err)
			}
		}
		for _, e := range batch {
			e.dead = true
			delete(ep.entries, e.key)
			if e.learned { // its place is free for another learned shape
				ep.learned--
				ep.saidMaxRules = false
			}
			// a later miss of this form may install it again
			delete(ep.pending, formKey(e.query, ep.b))
			c.askAgainLater(ep, e.query, e.question)
		}
		c.count(func(r *Report) { r.Removed += uint64(len(batch) * len(ep.cookies)) })
	}
	return nil
}

// removeAll deletes every rule with the controller's tag on its sockets (on
// exit): its own and those a predecessor left that it did not get to.
func (c *Controller) removeAll(ctx context.Context) {
	if follow.KeepRules(ctx, c.client, c.santad) {
		c.log.Warn("santad went away: the rules stay for the next controller with this tag to take over")
		return
	}
	removedAll := true
	for _, ep := range c.eps {
		deleted, gone, err := follow.DeleteTaggedCounted(c.client, ep.cookies, c.cfg.Tag)
		if err != nil {
			// santad went away: the next controller with this tag takes them over
			c.log.Warn("removing the rules on exit failed", "server", ep.addr, "error", err)
			removedAll = false
			continue
		}
		// the rules of a socket the server closed went with it
		withSockets := len(ep.entries) * len(gone)
		c.count(func(r *Report) { r.Removed += uint64(deleted); r.Gone += uint64(withSockets) })
		clear(ep.entries)
		ep.learned = 0
		c.log.Info("removed the controller's rules", "server", ep.addr, "rules", deleted, "gone_with_their_sockets", withSockets)
	}
	follow.UnbindEmpty(c.client, c.created, c.log)
	if removedAll {
		if err := c.claim.RecordCreated(nil); err != nil {
			c.log.Warn("recording that the rule sets this run made are unbound failed", "error", err)
		}
	}
}

// canonical is name in lower case, fully qualified: how zones are compared.
func canonical(name string) string { return strings.ToLower(dnsFqdn(name)) }

// inZone reports whether name (canonical) is apex (canonical) or below it.
func inZone(name, apex string) bool {
	return apex == "." || name == apex || strings.HasSuffix(name, "."+apex)
}
