// Package httpctl is `santa http`: it offloads the hot static GET and HEAD
// requests of an unmodified nginx to the rule processor's TCP path
// (docs/http.md).
//
// A rule answers one exact request: its conditions cover every byte of the
// request line and headers, and the request must be exactly that long. Its
// reply is nginx's own response to those bytes, fetched by replaying them
// to nginx on a connection of the controller's own. So every header a
// client sends is part of the match, and the same bytes get the same
// response, Connection and Keep-Alive included. The controller learns the
// exact requests from the listening sockets' miss samples (the hottest,
// optionally only for configured paths), keeps each reply's Date current,
// retires a rule the moment inotify reports a change of its file under the
// document root and installs it again with the new response, and
// re-validates every rule against nginx periodically for what inotify does
// not see.
package httpctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/internal/sketch"
)

// What the TCP data path sends (docs/tcp.md): at most 10 segments of
// tcpSegment4 reply bytes over IPv4 (a 1500-byte MTU, TCP timestamps).
// santad refuses longer replies.
const (
	tcpSegment4 = 1448
	maxTCPReply = 10 * tcpSegment4
)

// Config configures a Controller. New gives zero fields DefaultConfig's
// values, except DateRefresh, Idle and Report, where zero means off.
type Config struct {
	Socket string // santad's control socket; "": $SANTA_SOCKET, else api.DefaultSocket
	Port   uint16 // nginx's TCP port: every socket listening on it gets the rules
	// Server is where requests are replayed to fetch responses. Zero: each
	// listening socket's own address, loopback (127.0.0.1 or ::1) for a
	// wildcard one.
	Server netip.AddrPort
	Root   string // nginx's document root (its `root`), watched for changes
	// Paths, if not empty, are the only request paths offloaded (as nginx
	// resolves them: percent-decoded, without the query; "/" and "/dir/" for
	// index files). The exact requests are still learned from miss samples.
	Paths      []string
	MaxRules   int    // requests offloaded at most (each has a rule per listening socket)
	MinSamples uint64 // sampled misses of a request (halved every second) before it is offloaded
	SampleRate uint32 // miss samples per second and CPU
	// MaxReply is the longest response offloaded, status line, headers and
	// body, on IPv4 listeners (the data path sends up to 10 segments); IPv6
	// listeners take 20 bytes less per segment (the larger IP header).
	MaxReply int
	// DateRefresh is how many rules per second get their reply's Date
	// rewritten to the current second, oldest first; 0: replies keep the
	// Date of their fetch.
	DateRefresh int
	Interval    time.Duration // re-validate every rule against nginx once per Interval
	// Lease is how long a rule answers after the controller last renewed
	// it (it does when half is left): how long the rules outlive a
	// controller that is gone without deleting them (killed, or santad
	// restarted), with their Date and body as they were. At least 4s.
	Lease   time.Duration
	Idle    time.Duration // remove a rule without hits for this long; 0: never
	Settle  time.Duration // after a change on disk, fetch again once the file was quiet this long
	Timeout time.Duration // for nginx's responses
	Report  time.Duration // log a status line this often; 0: never
	// Tag tags every rule the controller installs. It takes over the
	// rules with its tag that its sockets hold when it starts, which a
	// predecessor left (follow.Inherited): their requests are fetched
	// again and offloaded with new rules in their place (relearn). Run
	// fails with follow.ErrTagClaimed while another controller runs with
	// it on the port.
	Tag string
	Log *slog.Logger
	// Ready, if set, is called once the controller is attached, watching
	// and learning.
	Ready func(Report)
}

// DefaultConfig holds the defaults.
var DefaultConfig = Config{
	Port:        80,
	MaxRules:    1000,
	MinSamples:  8,
	SampleRate:  2000,
	MaxReply:    maxTCPReply,
	DateRefresh: 1000,
	Interval:    10 * time.Second,
	Lease:       30 * time.Second,
	Idle:        30 * time.Second,
	Settle:      100 * time.Millisecond,
	Timeout:     2 * time.Second,
	Report:      time.Minute,
	Tag:         "santa-http",
}

// Report counts what the controller did.
type Report struct {
	Sockets     int    `json:"sockets"`      // listening sockets with rules
	Rules       int    `json:"rules"`        // requests offloaded now
	Installed   uint64 `json:"installed"`    // requests offloaded (learned, or back after a change)
	Invalidated uint64 `json:"invalidated"`  // requests whose rules a change on disk deleted
	Changed     uint64 `json:"changed"`      // requests whose rules were rebuilt because re-validation found a new response
	Removed     uint64 `json:"removed"`      // requests no longer offloaded (idle, or no longer offloadable)
	Dated       uint64 `json:"dated"`        // rules whose Date was rewritten
	Renewed     uint64 `json:"renewed"`      // rules whose lease was renewed
	Skipped     uint64 `json:"skipped"`      // learned requests not offloaded (see the log for why)
	TooBig      uint64 `json:"too_big"`      // of those, responses longer than MaxReply
	FetchErrors uint64 `json:"fetch_errors"` // requests to nginx that failed
	Samples     uint64 `json:"samples"`      // miss samples read
	Ignored     uint64 `json:"ignored"`      // of those, not one complete GET or HEAD of an eligible path
	Hits        uint64 `json:"hits"`         // replies the rules sent, those since removed included, as of the last statistics read
}

// ruleClient is what the controller asks of santad (a *santa.Client); the
// tests give it a fake.
type ruleClient interface {
	Add(t santa.Target, rules []api.Rule) ([]uint64, error)
	Modify(t santa.Target, rules []api.Rule) error
	Delete(t santa.Target, ids []uint64) error
	ListPage(t santa.Target, tag string, after uint64, limit uint32) ([]api.Rule, bool, error)
	Stats(t santa.Target, ids ...uint64) ([]api.RuleStats, error)
}

// group is the listening sockets whose responses come from one address:
// a request learned on one of them gets a rule on each.
type group struct {
	index    int
	fetch    netip.AddrPort
	family   uint32
	cookies  []uint64
	maxReply int
	// wildcard: the sockets listen on every address of the family, and
	// nginx may pick a different server block for each (probe)
	wildcard bool
}

// entry is one exact request of one group: offloaded (its rules' ids in
// ids, one per socket of the group), or pending (its rules deleted after
// a change on disk, fetched again at due).
type entry struct {
	key     string
	g       *group
	req     request
	obj     string // the file or directory nginx serves it from
	dir     bool
	sources []string  // whose changes may change its response (sources), as of its last fetch
	resp    *response // as fetched
	reply   []byte    // as installed: resp.raw, its Date rewritten
	dated   time.Time // the Date in reply (zero without one)
	checked time.Time // fetched or re-validated last
	since   time.Time // installed at
	leased  time.Time // its rules' Expires: they answer until then unless renewed
	ids     []uint64
	hits    uint64    // of its rules, at the last statistics read
	idle    uint64    // hits at the last idle check
	due     time.Time // pending: when to fetch again
}

// rule is e's rule, tagged tag, answering until lease ends.
func (e *entry) rule(lease time.Time, tag string) api.Rule {
	r := exactRule(e.req.raw, e.reply, endsConnection(e.req, e.resp))
	r.Expires, r.Tag = uint64(lease.Unix()), tag
	return r
}

// minLease is the shortest Config.Lease: renewed with half of it left, in
// whole seconds, a rule keeps a second or more to spare.
const minLease = 4 * time.Second

// leaseEnd is the Expires of a rule (re)installed at now: Lease later,
// rounded up to the second.
func (c *Controller) leaseEnd(now time.Time) time.Time {
	end := now.Add(c.cfg.Lease)
	if t := end.Truncate(time.Second); t.Before(end) {
		return t.Add(time.Second)
	}
	return end
}

// refusal is a request not offloaded, not tried again before until
// (or before a change of its file).
type refusal struct {
	sources []string
	dir     bool
	until   time.Time
}

// retryRefused is how long a request that was not offloadable is left
// alone (unless its file changes); retryVaries how long one whose
// response varies from request to request or with time.
const (
	retryRefused = time.Minute
	retryVaries  = 10 * time.Minute
)

// errVaries says nginx's response to a request is not the same for every
// copy of it (beyond its Date).
var errVaries = fmt.Errorf("%w: nginx's response varies", errNotOffloadable)

// maxBatchTime bounds the time a batch of fetches from nginx takes, so
// that what it fetched is applied soon and the next batch (a request
// whose file changed goes first) does not wait long behind a slow nginx.
const maxBatchTime = 300 * time.Millisecond

// maxLearnPerSecond bounds the requests fetched and installed per second.
const maxLearnPerSecond = 256

// Controller is one `santa http` run.
type Controller struct {
	cfg      Config
	log      *slog.Logger
	rules    ruleClient
	groups   []*group
	byCookie map[uint64]*group
	// created are the sockets whose rule set this controller's attach made,
	// or a predecessor's that it took over (takeOverCreated): unbound on
	// exit if left empty.
	created   []uint64
	claim     *follow.Claim // this run's hold on its tag on the port
	entries   map[string]*entry
	pending   map[string]*entry
	refused   map[string]refusal
	logged    map[string]bool // requests whose refusal was logged at Info
	notInRoot bool            // the warning that nginx serves files Root lacks is logged
	paths     map[string]bool // Paths, cleaned; nil: every path
	hot       *sketch.Sketch
	samples   chan sample

	// binder binds the port's listening sockets (nil: the controller does
	// not look for sockets nginx opens after its start); watchCtx is the
	// context of the sample subscriptions, gone says when one ends.
	binder     *santa.Client
	watchCtx   context.Context
	gone       chan error
	unbindable map[uint64]bool // listening sockets santad did not bind when asked
	scanWarned bool            // the failure to list the port's listeners is logged

	// rootGiven is Config.Root as given (cfg.Root is the directory it
	// resolved to); w watches cfg.Root, whose identity is rootID (nil
	// w: the document root is not followed)
	rootGiven  string
	w          *watcher
	rootID     fileID
	rootWarned bool // the failure to watch the new document root is logged
	// inLoop: the loop runs, and fetches from nginx go to the fetch
	// worker (fetchNext), a change under the root cutting the fetch under
	// way short; before the loop (a takeover) and in tests they are made
	// at once, and a change waits for the loop
	inLoop bool
	// fetching is the batch the fetch worker fetches (nil: none), sent
	// to it on toFetch and back on fetched when done; changed are the
	// paths under the root that changed meanwhile, whose requests'
	// responses may be stale
	fetching *fetchBatch
	toFetch  chan *fetchBatch
	fetched  chan *fetchBatch
	changed  []string
	// toLearn are the requests learn found hot, for the next learn
	// batch; revalidateDue says the next re-validation batch is due
	toLearn       []string
	revalidateDue bool

	// ctx ends the fetches from nginx: Run's context, the loop's in the
	// loop (which ends with it)
	ctx context.Context

	idleChecked, reported time.Time
	reportHits            uint64
	ruleHits              map[uint64]uint64 // rule id -> its hits at the last statistics read

	repMu sync.Mutex
	rep   Report
}

type sample struct {
	cookie     uint64
	data       []byte
	requestLen int
}

// New checks cfg and makes a controller.
func New(cfg Config) (*Controller, error) {
	d := DefaultConfig
	if cfg.Port == 0 {
		cfg.Port = d.Port
	}
	if cfg.MaxRules == 0 {
		cfg.MaxRules = d.MaxRules
	}
	if cfg.MinSamples == 0 {
		cfg.MinSamples = d.MinSamples
	}
	if cfg.SampleRate == 0 {
		cfg.SampleRate = d.SampleRate
	}
	if cfg.MaxReply == 0 {
		cfg.MaxReply = d.MaxReply
	}
	if cfg.Tag == "" {
		cfg.Tag = d.Tag
	}
	for _, s := range []struct{ v, d *time.Duration }{{&cfg.Interval, &d.Interval}, {&cfg.Lease, &d.Lease}, {&cfg.Settle, &d.Settle}, {&cfg.Timeout, &d.Timeout}} {
		if *s.v == 0 {
			*s.v = *s.d
		}
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Root == "" {
		return nil, errors.New("say where nginx's document root is (its root directive)")
	}
	given, err := filepath.Abs(cfg.Root)
	if err != nil {
		return nil, fmt.Errorf("document root: %w", err)
	}
	// Events and request paths are compared as paths under the real root.
	root, err := filepath.EvalSymlinks(cfg.Root)
	if err == nil {
		root, err = filepath.Abs(root)
	}
	if err != nil {
		return nil, fmt.Errorf("document root: %w", err)
	}
	if st, err := os.Stat(root); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("document root %s: not a directory (nginx's root directive names one)", cfg.Root)
	}
	cfg.Root = root
	switch {
	case cfg.MaxRules < 1:
		return nil, fmt.Errorf("max rules %d: must be at least 1", cfg.MaxRules)
	case cfg.MaxReply < 64:
		return nil, fmt.Errorf("max reply %d: too small for any response", cfg.MaxReply)
	case cfg.MaxReply > maxTCPReply:
		return nil, fmt.Errorf("max reply %d: the data path sends at most %d bytes (10 segments)", cfg.MaxReply, maxTCPReply)
	case cfg.DateRefresh < 0:
		return nil, fmt.Errorf("date refresh %d: must be 0 (off) or more", cfg.DateRefresh)
	case cfg.Interval < time.Second:
		return nil, fmt.Errorf("interval %v: at least a second", cfg.Interval)
	case cfg.Lease < minLease:
		return nil, fmt.Errorf("lease %v: at least %v (it is renewed when half is left, to the second)", cfg.Lease, minLease)
	case cfg.Idle < 0 || cfg.Report < 0 || cfg.Settle < 0 || cfg.Timeout < 0:
		return nil, errors.New("idle, report, settle and timeout cannot be negative")
	}
	if err := api.CheckTag(cfg.Tag); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, rootGiven: given, log: cfg.Log, byCookie: map[uint64]*group{}, entries: map[string]*entry{},
		pending: map[string]*entry{}, refused: map[string]refusal{}, logged: map[string]bool{},
		hot: sketch.New(4 * min(cfg.MaxRules, 16384)), samples: make(chan sample, 4096), ctx: context.Background()}
	if len(cfg.Paths) > 0 {
		c.paths = map[string]bool{}
		for _, p := range cfg.Paths {
			clean, err := targetPath(p)
			if err != nil {
				return nil, fmt.Errorf("path %q: %w", p, err)
			}
			c.paths[clean] = true
		}
	}
	return c, nil
}

// Report returns the counters.
func (c *Controller) Report() Report {
	c.repMu.Lock()
	defer c.repMu.Unlock()
	return c.rep
}

func (c *Controller) count(f func(r *Report)) {
	c.repMu.Lock()
	f(&c.rep)
	c.rep.Rules = len(c.entries)
	c.repMu.Unlock()
}

// Run attaches to nginx's listening sockets through santad, watches the
// document root, learns and offloads hot requests and keeps their replies
// current until ctx ends; then it deletes its rules.
func (c *Controller) Run(ctx context.Context) error {
	var err error
	if c.claim, err = follow.ClaimTag(c.cfg.Socket, api.ProtocolTCP, c.cfg.Port, c.cfg.Tag); err != nil {
		return err
	}
	defer c.claim.Release()
	client, err := santa.Dial(c.cfg.Socket)
	if err != nil {
		return err
	}
	defer client.Close()
	socks, err := bindListeners(client, c.cfg.Port)
	if err != nil {
		return err
	}
	if api.LoopbackOnly(socks) {
		c.log.Warn(api.LoopbackWarning)
	}
	c.attach(client, socks)
	c.binder = client
	santad := follow.SantadPID(client)
	rulesRemoved := false
	defer func() {
		follow.UnbindEmpty(client, c.created, c.log)
		if rulesRemoved {
			// the rule sets left bound hold others' rules: not this tag's
			c.recordCreated(nil)
		}
	}()
	if err := c.takeOverCreated(); err != nil {
		return err
	}
	inherited, err := follow.Inherit(c.cfg.Socket, c.cfg.Tag, slices.Collect(maps.Keys(c.byCookie)), c.log)
	if err != nil {
		return err
	}
	defer func() { rulesRemoved = c.removeAll(follow.KeepRules(ctx, client, santad)) }()
	// watched before the takeover fetches: a file changed after its
	// response was fetched again must count for its rule
	w, err := watch(c.cfg.Root, c.log)
	if err != nil {
		return fmt.Errorf("watch %s: %w", c.cfg.Root, err)
	}
	c.w, c.rootID = w, idOf(c.cfg.Root)
	defer func() { c.w.close() }() // the watch of the root it follows now
	c.ctx = ctx
	if err := c.relearn(inherited, time.Now()); err != nil {
		return err
	}
	if err := inherited.DeleteRest(client); err != nil {
		return err
	}
	if ctx.Err() != nil {
		return nil // stopped while taking over: nothing left behind
	}
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	c.watchCtx, c.gone = subCtx, make(chan error, 1)
	if err := c.watch(slices.Collect(maps.Keys(c.byCookie))); err != nil {
		return err
	}
	if c.cfg.Ready != nil {
		c.cfg.Ready(c.Report())
	}
	return c.loop(ctx, c.gone)
}

// attach takes the listening sockets and groups them by the address their
// responses are fetched from.
func (c *Controller) attach(rules ruleClient, socks []api.SocketInfo) {
	c.rules = rules
	for _, s := range socks {
		g := c.groupOf(s)
		g.cookies = append(g.cookies, s.Cookie)
		c.byCookie[s.Cookie] = g
		if s.Created {
			c.created = append(c.created, s.Cookie)
		}
	}
	c.count(func(r *Report) { r.Sockets = len(socks) })
	for _, g := range c.groups {
		c.log.Info("attached", "port", c.cfg.Port, "sockets", len(g.cookies), "family", g.family, "fetch_from", g.fetch)
	}
}

// takeOverCreated takes over the rule sets a predecessor with the tag on
// the port made and left (follow.Claim.TakeOverCreated): those on the
// listeners this run attached to. Left bound, an empty rule set has eBPF
// answer every handshake of nginx's listener and hand each connection over.
func (c *Controller) takeOverCreated() (err error) {
	attached := func(cookie uint64) bool { return c.byCookie[cookie] != nil }
	c.created, err = c.claim.TakeOverCreated(c.created, attached, c.log)
	return err
}

// recordCreated records cookies as the rule sets this run made, for the
// next controller with the tag should this one be killed.
func (c *Controller) recordCreated(cookies []uint64) {
	if err := c.claim.RecordCreated(cookies); err != nil {
		c.log.Warn("recording the rule sets this run made failed", "error", err)
	}
}

// groupOf is the group of listening socket s: the one whose responses
// are fetched from the same address, made if there is none yet.
func (c *Controller) groupOf(s api.SocketInfo) *group {
	fetch, wildcard := c.cfg.Server, false
	if !fetch.IsValid() {
		a := s.AddrPort().Addr().Unmap()
		switch {
		case a.IsValid() && !a.IsUnspecified():
		case s.Family == 4:
			a, wildcard = netip.AddrFrom4([4]byte{127, 0, 0, 1}), true
		default:
			a, wildcard = netip.IPv6Loopback(), true
		}
		fetch = netip.AddrPortFrom(a, c.cfg.Port)
	}
	for _, g := range c.groups {
		if g.fetch == fetch && g.family == s.Family {
			return g
		}
	}
	g := &group{index: len(c.groups), fetch: fetch, family: s.Family, maxReply: c.cfg.MaxReply, wildcard: wildcard}
	if s.Family == 6 { // each segment carries 20 bytes less
		g.maxReply -= 20 * ((c.cfg.MaxReply + tcpSegment4 - 1) / tcpSegment4)
	}
	c.groups = append(c.groups, g)
	return g
}

// watch streams the miss samples of the listening sockets cookies into
// c.samples, and says on c.gone when the server closes one.
func (c *Controller) watch(cookies []uint64) error {
	ended, err := follow.Watch(c.watchCtx, c.cfg.Socket, cookies,
		santa.SampleOptions{Bytes: reqWindow, Rate: c.cfg.SampleRate},
		func(cookie uint64, s santa.Sample) {
			select {
			case c.samples <- sample{cookie, s.Data, s.RequestLen}:
			default: // busy: a sample more or less does not matter
			}
		})
	if err != nil {
		return err
	}
	go func() {
		for {
			select {
			case err := <-ended:
				select {
				case c.gone <- err:
				case <-c.watchCtx.Done():
					return
				}
			case <-c.watchCtx.Done():
				return
			}
		}
	}()
	return nil
}

// survive returns err unless it says that listening sockets went (a
// socket's samples ended, or santad has no rule set for it) while every
// group keeps another socket: a reload of nginx with fewer workers (with
// reuseport, a socket each) closes some of the port's sockets and keeps
// the rest. Their rules went with them; the controller drops them from
// their groups and carries on with the others, their rules in place. When
// a group loses all its sockets (nginx stopped or restarted), err stands:
// the controller ends (with --follow, starts over).
func (c *Controller) survive(err error) error {
	if err == nil || !follow.Gone(err) {
		return err
	}
	var sg *follow.SocketGoneError
	named := errors.As(err, &sg)
	if named && c.byCookie[sg.Cookie] == nil {
		return nil // dropped already
	}
	have, lerr := listenerCookies(c.cfg.Port)
	if lerr != nil {
		return err
	}
	var closed []uint64
	for cookie := range c.byCookie {
		if !have[cookie] || (named && cookie == sg.Cookie) {
			closed = append(closed, cookie)
		}
	}
	if len(closed) == 0 {
		return err
	}
	left := map[*group]int{}
	for _, g := range c.groups {
		left[g] = len(g.cookies)
	}
	for _, cookie := range closed {
		left[c.byCookie[cookie]]--
	}
	for g, n := range left {
		if n == 0 && len(g.cookies) > 0 {
			return err
		}
	}
	for _, cookie := range closed {
		c.dropSocket(cookie)
	}
	c.count(func(r *Report) { r.Sockets = len(c.byCookie) })
	return nil
}

// dropSocket forgets listening socket cookie, which nginx closed: its
// rule set and rules went with it.
func (c *Controller) dropSocket(cookie uint64) {
	g := c.byCookie[cookie]
	ci := slices.Index(g.cookies, cookie)
	for _, e := range c.entries {
		if e.g == g && e.ids != nil {
			e.ids = slices.Delete(e.ids, ci, ci+1)
		}
	}
	g.cookies = slices.Delete(g.cookies, ci, ci+1)
	delete(c.byCookie, cookie)
	c.created = slices.DeleteFunc(c.created, func(x uint64) bool { return x == cookie })
	c.log.Info("nginx closed a listening socket (a reload): its rules went with it, the other sockets keep theirs",
		"port", c.cfg.Port, "socket", cookie, "family", g.family, "sockets_of_group", len(g.cookies))
}

// attachNew attaches to the listening sockets nginx opened on the port
// since the controller attached (a reload that adds a listen, or more
// workers with reuseport: nginx keeps the old sockets and opens the new
// ones beside them, and connections go to either). Without a rule set a
// new socket's connections would never be offloaded; so each joins the
// group of its address with the group's rules (a new address makes a new
// group, which learns), and its misses are sampled.
func (c *Controller) attachNew() error {
	if c.binder == nil {
		return nil
	}
	have, err := listenerCookies(c.cfg.Port)
	if err != nil {
		if !c.scanWarned {
			c.scanWarned = true
			c.log.Warn("cannot list the port's listening sockets: sockets nginx opens from now on (a reload) are not offloaded", "error", err)
		}
		return nil
	}
	fresh := false
	for cookie := range have {
		if c.byCookie[cookie] == nil && !c.unbindable[cookie] {
			fresh = true
			break
		}
	}
	if !fresh {
		return nil
	}
	socks, err := bindListeners(c.binder, c.cfg.Port)
	if err != nil {
		if follow.Gone(err) {
			return nil // closing again (nginx stopping): the watch tells
		}
		return err
	}
	bound := map[uint64]bool{}
	var added []uint64
	for _, s := range socks {
		bound[s.Cookie] = true
		if c.byCookie[s.Cookie] != nil {
			continue
		}
		if s.Created {
			c.created = append(c.created, s.Cookie)
			c.recordCreated(c.created)
		}
		g := c.groupOf(s)
		if err := c.join(g, s.Cookie); err != nil {
			return err
		}
		added = append(added, s.Cookie)
		c.log.Info("attached to a new listening socket", "port", c.cfg.Port, "socket", s.Cookie, "address", s.AddrPort(),
			"family", g.family, "fetch_from", g.fetch, "sockets_of_group", len(g.cookies))
	}
	for cookie := range have {
		if c.byCookie[cookie] == nil && !bound[cookie] {
			if c.unbindable == nil {
				c.unbindable = map[uint64]bool{}
			}
			c.unbindable[cookie] = true // not in santad's namespace, or MPTCP: not asked again
		}
	}
	c.count(func(r *Report) { r.Sockets = len(c.byCookie) })
	if len(added) == 0 {
		return nil
	}
	return c.watch(added)
}

// join adds listening socket cookie to group g: the rules of g's
// offloaded requests are added to it, and it takes part in all that
// follows. A request whose rule the new socket cannot take (santad has no
// room) is no longer offloaded on any socket of g, so that the group's
// sockets stay alike.
func (c *Controller) join(g *group, cookie uint64) error {
	var es []*entry
	for _, e := range c.entries {
		if e.g == g && e.ids != nil {
			es = append(es, e)
		}
	}
	rules := make([]api.Rule, len(es))
	for i, e := range es {
		rules[i] = e.rule(e.leased, c.cfg.Tag)
	}
	ids, err := follow.AddFitting(c.rules, []uint64{cookie}, rules, nil, func(int, error) {})
	if err != nil && !isRefusal(err) {
		return fmt.Errorf("add the rules of %d requests to a new listening socket: %w", len(rules), err)
	}
	var left []*entry
	for k, e := range es {
		if ids[k] == nil {
			left = append(left, e)
		}
	}
	if len(left) > 0 {
		c.log.Warn("santad took not every rule for a new listening socket: those requests are left to nginx", "requests", len(left), "error", err)
		if err := c.remove(left); err != nil { // from the group's other sockets
			return err
		}
	}
	g.cookies = append(g.cookies, cookie)
	c.byCookie[cookie] = g
	for k, e := range es {
		if ids[k] != nil {
			e.ids = append(e.ids, ids[k][0])
		}
	}
	return nil
}

// loop handles samples and changes on disk as they come; every
// 10 ms it has what changed and settled fetched again; just after every
// second of the wall clock it rewrites Dates, has what got hot fetched,
// and the rules due for re-validation, and removes idle rules; until ctx
// ends or a socket's watch ends (gone). The fetches from nginx run off
// the loop, a batch at a time (fetchNext), so that a slow or hung nginx
// holds up neither the Date rewrites nor the handling of a change; a
// change under the document root also cuts the fetch under way short
// (watcher.fetchContext).
func (c *Controller) loop(ctx context.Context, gone <-chan error) error {
	fine := time.NewTicker(10 * time.Millisecond)
	defer fine.Stop()
	second := time.NewTimer(untilNextSecond(time.Now()))
	defer second.Stop()
	now := time.Now()
	c.idleChecked, c.reported = now, now
	c.toFetch, c.fetched = make(chan *fetchBatch, 1), make(chan *fetchBatch, 1)
	if err := c.startFetchWorker(); err != nil {
		return err
	}
	ctx, stopFetching := context.WithCancel(ctx)
	c.ctx, c.inLoop = ctx, true
	defer func() {
		stopFetching()
		if c.fetching != nil {
			<-c.fetched // the fetch under way ends with ctx
			c.fetching = nil
		}
		close(c.toFetch)
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-gone:
			if err := c.survive(err); err != nil {
				return err
			}
		case s := <-c.samples:
			c.sample(s.cookie, s.data, s.requestLen)
		case p, ok := <-c.w.changed:
			if !ok {
				return errors.New("the watch of the document root stopped")
			}
			c.w.taken()
			if err := c.survive(c.invalidate(p, time.Now())); err != nil {
				return err
			}
		case b := <-c.fetched:
			c.fetching = nil
			if err := c.survive(b.apply(b)); err != nil {
				return err
			}
			if err := c.survive(c.fetchNext(time.Now())); err != nil {
				return err
			}
		case now := <-fine.C:
			if err := c.survive(c.followRoot(now)); err != nil {
				return err
			}
			if err := c.survive(c.fetchNext(now)); err != nil {
				return err
			}
		case <-second.C:
			now := time.Now()
			second.Reset(untilNextSecond(now))
			if err := c.survive(c.everySecond(now)); err != nil {
				return err
			}
		}
	}
}

// untilNextSecond is the time until just after the next second of the
// wall clock, when a new Date is due.
func untilNextSecond(now time.Time) time.Duration {
	return now.Truncate(time.Second).Add(time.Second + 2*time.Millisecond).Sub(now)
}

func (c *Controller) everySecond(now time.Time) error {
	if err := c.attachNew(); err != nil {
		return err
	}
	if err := c.refresh(now); err != nil {
		return err
	}
	if err := c.learn(now); err != nil {
		return err
	}
	if err := c.revalidate(now); err != nil {
		return err
	}
	if c.cfg.Idle > 0 && now.Sub(c.idleChecked) >= c.cfg.Idle {
		c.idleChecked = now
		if err := c.dropIdle(now); err != nil {
			return err
		}
	}
	if c.cfg.Report > 0 && now.Sub(c.reported) >= c.cfg.Report {
		if err := c.readHits(); err != nil {
			return err
		}
		r := c.Report()
		c.log.Info("status", "rules", r.Rules, "sockets", r.Sockets,
			"hits_per_second", math.Round(10*float64(r.Hits-c.reportHits)/now.Sub(c.reported).Seconds())/10,
			"installed", r.Installed, "invalidated", r.Invalidated, "changed", r.Changed, "removed", r.Removed,
			"skipped", r.Skipped, "too_big", r.TooBig, "fetch_errors", r.FetchErrors, "dated", r.Dated, "renewed", r.Renewed, "samples", r.Samples)
		c.reported, c.reportHits = now, r.Hits
	}
	return nil
}

// entryKey names a request of group g.
func entryKey(g *group, raw []byte) string { return strconv.Itoa(g.index) + "\n" + string(raw) }

// sample counts a miss sample of a listening socket: a complete GET or
// HEAD of an eligible path that is not offloaded yet.
func (c *Controller) sample(cookie uint64, data []byte, requestLen int) {
	c.count(func(r *Report) { r.Samples++ })
	g := c.byCookie[cookie]
	if g == nil {
		return
	}
	ignore := func() { c.count(func(r *Report) { r.Ignored++ }) }
	if requestLen != len(data) { // the request is longer than the sample: longer than a rule sees
		ignore()
		return
	}
	req, err := parseRequest(data)
	if err != nil || (c.paths != nil && !c.paths[req.path]) {
		ignore()
		return
	}
	key := entryKey(g, req.raw)
	if c.entries[key] != nil || c.pending[key] != nil {
		return
	}
	if r, ok := c.refused[key]; ok && time.Now().Before(r.until) {
		return
	}
	c.hot.Add(key)
}

// learn offloads the requests sampled at least MinSamples times (the
// hottest first, up to MaxRules), then halves the counts. They are
// fetched once the fetch worker is free (learnBatch).
func (c *Controller) learn(now time.Time) error {
	c.toLearn = c.hot.Hot(c.cfg.MinSamples)
	c.hot.Decay()
	return c.fetchNext(now)
}

// learnBatch fetches the requests learn found hot that are neither
// offloaded, pending nor refused (at most maxLearnPerSecond), until room
// of them are answered; those not fetched are learned again.
func (c *Controller) learnBatch(now time.Time) *fetchBatch {
	keys := c.toLearn
	c.toLearn = nil
	room := min(c.cfg.MaxRules-len(c.entries)-len(c.pending), maxLearnPerSecond)
	if room <= 0 {
		return nil
	}
	var tasks []*fetchTask
	for _, key := range keys {
		if len(tasks) == maxLearnPerSecond {
			break
		}
		if c.entries[key] != nil || c.pending[key] != nil {
			continue
		}
		if r, ok := c.refused[key]; ok {
			if now.Before(r.until) {
				continue
			}
			delete(c.refused, key)
		}
		gi, raw, _ := strings.Cut(key, "\n")
		i, _ := strconv.Atoi(gi)
		req, err := parseRequest([]byte(raw))
		if err != nil {
			continue
		}
		tasks = append(tasks, c.probeTask(c.newEntry(c.groups[i], req)))
	}
	return newBatch(tasks, room, now, c.probed)
}

// relearn offloads again the requests of the rules a predecessor left
// (in), up to MaxRules, each fetched anew and probed like a learned one.
// Their new rules supersede the old ones, so that a restart does not send
// those requests to nginx until they are learned again; one without hits
// goes after Idle like any other. The first fetch that runs out of Timeout
// ends it: the rest go with DeleteRest.
func (c *Controller) relearn(in *follow.Inherited, now time.Time) error {
	var news []*entry
	seen := map[string]bool{}
	hung := false
	for _, g := range c.groups {
		for _, r := range in.Rules(g.cookies[0]) { // a group's sockets hold the same rules
			if c.stopped() || hung {
				break // the rest go with DeleteRest
			}
			raw, ok := requestOf(r)
			if !ok || len(c.entries)+len(news) >= c.cfg.MaxRules {
				continue
			}
			req, err := parseRequest(raw)
			if err != nil || (c.paths != nil && !c.paths[req.path]) {
				continue
			}
			e := c.newEntry(g, req)
			if !seen[e.key] {
				err := c.probe(e, now)
				if err == nil {
					news = append(news, e)
				}
				// nginx took --timeout to not answer: each of the rest
				// would take as long, and ready would wait for them all
				hung = isTimeout(err)
			}
			seen[e.key] = true
		}
	}
	if hung {
		c.log.Warn("nginx did not answer within --timeout: the rules a predecessor left that were not checked yet are removed, their requests go to nginx and are learned again from miss samples",
			"timeout", c.cfg.Timeout, "checked", len(seen))
	}
	if len(news) == 0 {
		return nil
	}
	if err := c.install(news, in, now); err != nil {
		return err
	}
	c.log.Info("offloaded again the requests of the rules a predecessor left", "requests", len(news), "offloaded", len(c.entries))
	return nil
}

// stopped reports whether the run was told to end.
func (c *Controller) stopped() bool {
	return c.ctx.Err() != nil
}

func (c *Controller) newEntry(g *group, req request) *entry {
	return &entry{key: entryKey(g, req.raw), g: g, req: req, obj: objectPath(c.cfg.Root, req.path), dir: strings.HasSuffix(req.path, "/")}
}

// probe fetches e's response and keeps it if it may be offloaded (see
// probeTask), at once: the takeover's fetches, before the loop. On
// failure it refuses e for a while and returns why.
func (c *Controller) probe(e *entry, now time.Time) error {
	t := c.probeTask(e)
	if t.err == nil {
		t.resp, t.err = c.fetcher(nil).fetchSame(t)
	}
	if errors.Is(t.err, errCutShort) {
		return t.err // no failure of nginx's
	}
	return c.took(e, t.resp, t.err, now)
}

// probeTask is the fetch of e's request before it is offloaded: twice,
// and both responses complete, offloadable and, Date aside, the same (a
// response that differs between two identical requests, such as one with
// a per-request cookie or id, must not be answered from a rule). For a
// wildcard listener also over every other address a client may send the
// request to, where it must be the same too: a rule answers the request
// whatever address it came to, and nginx picks the server block by that
// address when a `listen ADDR:PORT` shares the wildcard socket.
func (c *Controller) probeTask(e *entry) *fetchTask {
	e.sources = sources(e.obj, e.dir) // a link may point elsewhere since the last fetch
	return c.task(e, 2)
}

// task is the fetch of e's request over every other address of its
// wildcard group (wildcardAddrs), then n times from the group's address.
func (c *Controller) task(e *entry, n int) *fetchTask {
	t := &fetchTask{e: e, req: e.req, main: e.g.fetch, maxReply: e.g.maxReply}
	if e.g.wildcard {
		t.from, t.err = c.wildcardAddrs(e.g)
	}
	for range n {
		t.from = append(t.from, e.g.fetch)
	}
	return t
}

// took makes the response of e's probe e's, or, on failure (err), refuses
// e for a while and returns err.
func (c *Controller) took(e *entry, resp *response, err error, now time.Time) error {
	if err != nil {
		c.refuse(e, err, now)
		return err
	}
	c.setResponse(e, resp, now)
	c.checkRoot(e)
	return nil
}

// probed applies a batch of probes (learned or pending requests): the
// requests that may be offloaded are installed, the others refused. One
// whose file changed while it was fetched (the response may be the old
// file's) is neither: a pending one is fetched again once the file has
// settled, a learned one is learned again; so are those not fetched.
func (c *Controller) probed(b *fetchBatch) error {
	var news []*entry
	for _, t := range b.tasks[:b.done] {
		if c.changedWhileFetched(t.e) {
			continue
		}
		delete(c.pending, t.e.key)
		if c.took(t.e, t.resp, t.err, b.now) == nil {
			news = append(news, t.e)
		}
	}
	return c.install(news, nil, b.now)
}

// changedWhileFetched says a change under the root during the batch under
// way affects e.
func (c *Controller) changedWhileFetched(e *entry) bool {
	return slices.ContainsFunc(c.changed, func(p string) bool { return affects(p, e.sources, e.dir) })
}

// isTimeout says err is a fetch that ran out of time.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// wildcardAddrs are the addresses other than g.fetch (loopback) over which
// a client may reach g's wildcard sockets: the addresses of the family of
// the interfaces that are up in the controller's network namespace (but
// IPv6 link-local ones, and those another group listens on: connections
// to them go to its sockets).
func (c *Controller) wildcardAddrs(g *group) ([]netip.AddrPort, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return nil, fmt.Errorf("listing the local addresses a wildcard listener takes requests on: %w", err)
	}
	var out []netip.AddrPort
	for _, ifc := range ifaces {
		if ifc.Flags&net.FlagUp == 0 {
			continue
		}
		ifAddrs, err := ifc.Addrs()
		if err != nil {
			return nil, fmt.Errorf("listing the addresses of %s, where a wildcard listener takes requests: %w", ifc.Name, err)
		}
		for _, ia := range ifAddrs {
			pfx, err := netip.ParsePrefix(ia.String())
			if err != nil {
				continue
			}
			a := pfx.Addr().Unmap()
			if a.Is4() != (g.family == 4) || a.IsLoopback() || a.IsLinkLocalUnicast() {
				continue
			}
			addr := netip.AddrPortFrom(a, c.cfg.Port)
			if !slices.ContainsFunc(c.groups, func(o *group) bool { return o.fetch == addr }) {
				out = append(out, addr)
			}
		}
	}
	return out, nil
}

// checkRoot warns, once, when nginx serves e's request with a 200 but Root
// has no such file or directory: Root is not nginx's document root (or the
// location uses alias), so inotify does not see the file change and only
// re-validation, every Interval, catches a change.
func (c *Controller) checkRoot(e *entry) {
	if c.notInRoot || e.resp.status != http.StatusOK {
		return
	}
	if _, err := os.Stat(e.obj); err == nil {
		return
	}
	c.notInRoot = true
	c.log.Warn("nginx serves a file that --root lacks: is --root nginx's document root? Changes to such files are seen only by re-validation (--interval)",
		"request", e.req.line(), "missing", e.obj, "interval", c.cfg.Interval)
}

// setResponse makes r e's response and reply (with its Date as fetched).
func (c *Controller) setResponse(e *entry, r *response, now time.Time) {
	e.resp, e.reply, e.checked = r, r.raw, now
	e.dated, _ = r.at(r.date)
}

// refuse records that e is not offloaded, for retryRefused or until its
// file changes, and says why in the log: at Info the first time for the
// request, at Debug after that.
func (c *Controller) refuse(e *entry, err error, now time.Time) {
	retry := retryRefused
	if errors.Is(err, errVaries) {
		retry = retryVaries
	}
	c.refused[e.key] = refusal{sources: e.sources, dir: e.dir, until: now.Add(retry)}
	c.hot.Forget(e.key)
	c.count(func(r *Report) {
		switch {
		case errors.Is(err, errTooBig):
			r.Skipped++
			r.TooBig++
		case isNotOffloadable(err), isRefusal(err):
			r.Skipped++
		default:
			r.FetchErrors++
		}
	})
	level := slog.LevelDebug
	if !c.logged[e.key] {
		level = slog.LevelInfo
		if len(c.logged) > 100000 {
			clear(c.logged)
		}
		c.logged[e.key] = true
	}
	c.log.Log(context.Background(), level, "not offloaded", "request", e.req.line(), "from", e.g.fetch, "reason", err)
	if len(c.refused) > 16*c.cfg.MaxRules {
		for k, r := range c.refused {
			if now.After(r.until) {
				delete(c.refused, k)
			}
		}
	}
}

// isRefusal reports whether santad refused a rule (rather than failing).
func isRefusal(err error) bool {
	var se *santa.Error
	return errors.As(err, &se) && !errors.Is(err, santa.ErrNotFound) && !errors.Is(err, santa.ErrInternal)
}

// install adds the rules of new entries, as far as santad takes them
// (follow.AddFitting), superseding those of in (nil: none). An entry whose
// rule santad refuses (e.g. a bucket chain would grow too long), or has no
// room for, is not offloaded and is tried again later (refuse).
func (c *Controller) install(es []*entry, in *follow.Inherited, now time.Time) error {
	byGroup := map[*group][]*entry{}
	for _, e := range es {
		byGroup[e.g] = append(byGroup[e.g], e)
	}
	for _, g := range c.groups {
		batch := byGroup[g]
		if len(batch) == 0 {
			continue
		}
		refused := map[*entry]bool{}
		err := c.addRules(g, batch, in, func(e *entry, err error) {
			refused[e] = true
			c.refuse(e, err, now)
		})
		if err == nil {
			continue
		}
		if !isRefusal(err) {
			return err
		}
		// santad has no room, or refused the rest for a reason of its own
		for _, e := range batch {
			if e.ids == nil && !refused[e] {
				c.refuse(e, err, now)
			}
		}
	}
	return nil
}

// addRules adds the entries' rules on every socket of g (each rule all or
// none), as far as santad takes them (follow.AddFitting), superseding
// those of in, and records those added. refused gets each entry whose rule
// santad refused for what it is; the error is why santad took no more.
func (c *Controller) addRules(g *group, es []*entry, in *follow.Inherited, refused func(*entry, error)) error {
	lease := c.leaseEnd(time.Now())
	rules := make([]api.Rule, len(es))
	for i, e := range es {
		rules[i] = e.rule(lease, c.cfg.Tag)
	}
	ids, err := follow.AddFitting(c.rules, g.cookies, rules, in, func(k int, err error) { refused(es[k], err) })
	now, added := time.Now(), 0
	var lines []string // a few of the requests added, for the log
	for k, e := range es {
		if ids[k] == nil {
			continue
		}
		e.ids, e.since, e.leased, e.hits, e.idle = ids[k], now, lease, 0, 0
		c.entries[e.key] = e
		delete(c.pending, e.key)
		c.hot.Forget(e.key)
		c.log.Debug("offloaded", "request", e.req.line(), "reply_bytes", len(e.reply), "status", e.resp.status, "close", rules[k].Close)
		if added++; len(lines) < 3 {
			lines = append(lines, e.req.line())
		}
	}
	if added > 0 {
		c.log.Info("offloaded requests", "family", g.family, "requests", added, "e.g.", strings.Join(lines, "; "), "offloaded_now", len(c.entries))
	}
	c.count(func(r *Report) { r.Installed += uint64(added) })
	return err
}

// modifyRules replaces the rules of the entries by their current rule
// in place, on every socket of their group, with a new lease.
func (c *Controller) modifyRules(es []*entry) error {
	lease := c.leaseEnd(time.Now())
	byCookie := map[uint64][]api.Rule{}
	for _, e := range es {
		r := e.rule(lease, c.cfg.Tag)
		for ci, cookie := range e.g.cookies {
			r.ID = e.ids[ci]
			byCookie[cookie] = append(byCookie[cookie], r)
		}
	}
	for _, g := range c.groups {
		for _, cookie := range g.cookies {
			if rules := byCookie[cookie]; len(rules) > 0 {
				if err := c.rules.Modify(santa.Cookie(cookie), rules); err != nil {
					return fmt.Errorf("modify %d rules: %w", len(rules), err)
				}
			}
		}
	}
	// only now: a rule left with its old lease is renewed again sooner
	for _, e := range es {
		e.leased = lease
	}
	return nil
}

// deleteRules deletes the entries' rules from every socket (those santad
// removed already are left out: follow.DeleteRules) and forgets
// the entries.
func (c *Controller) deleteRules(es []*entry) error {
	byCookie := map[uint64][]uint64{}
	for _, e := range es {
		for ci, cookie := range e.g.cookies {
			byCookie[cookie] = append(byCookie[cookie], e.ids[ci])
		}
		delete(c.entries, e.key)
		e.ids = nil
	}
	var errs []error
	for _, g := range c.groups {
		for _, cookie := range g.cookies {
			if ids := byCookie[cookie]; len(ids) > 0 {
				if err := follow.DeleteRules(c.rules, cookie, ids); err != nil {
					errs = append(errs, fmt.Errorf("delete %d rules: %w", len(ids), err))
				}
			}
		}
	}
	c.count(func(*Report) {})
	return errors.Join(errs...)
}

// remove deletes the entries' rules: they are no longer offloaded.
func (c *Controller) remove(es []*entry) error {
	if len(es) == 0 {
		return nil
	}
	for _, e := range es {
		c.hot.Forget(e.key)
	}
	c.count(func(r *Report) { r.Removed += uint64(len(es)) })
	return c.deleteRules(es)
}

// invalidate deletes at once the rules of every request whose response
// a change of path p may have changed (see affects), and fetches them
// again once p has been quiet for Settle (pendingBatch). Requests
// refused before are tried again at the next chance.
func (c *Controller) invalidate(p string, now time.Time) error {
	if c.fetching != nil {
		c.changed = append(c.changed, p)
	}
	var hit []*entry
	for _, e := range c.entries {
		if affects(p, e.sources, e.dir) {
			hit = append(hit, e)
		}
	}
	for _, e := range c.pending {
		if affects(p, e.sources, e.dir) {
			e.due = now.Add(c.cfg.Settle)
		}
	}
	for k, r := range c.refused {
		if affects(p, r.sources, r.dir) {
			delete(c.refused, k)
		}
	}
	if len(hit) == 0 {
		return nil
	}
	err := c.deleteRules(hit)
	for _, e := range hit {
		e.due = now.Add(c.cfg.Settle)
		c.pending[e.key] = e
	}
	c.count(func(r *Report) { r.Invalidated += uint64(len(hit)) })
	c.log.Debug("file changed: rules deleted", "path", p, "requests", len(hit))
	return err
}

// fileID names a file (a directory) by device and inode; the zero value
// is none.
type fileID struct{ dev, ino uint64 }

func idOf(p string) fileID {
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		return fileID{}
	}
	return fileID{uint64(st.Dev), st.Ino}
}

// followRoot notices that the document root as given is another
// directory now: a symbolic link on its way (nginx's root, or a directory
// above it) points elsewhere, as when a deploy swaps a `current` link to
// the next release, or the directory was renamed away and another put in
// its place. nginx serves the new directory from its next request on (it
// resolves the root for every request); so the controller watches the new
// directory instead, and every request is fetched again (its rules
// deleted at once, as for a change of every file), mapped to its file in
// the new directory. It returns the new watch's changes, nil if nothing
// moved. A root that is missing for a moment (between the steps of a
// deploy) is looked for again at the next tick.
func (c *Controller) followRoot(now time.Time) error {
	if c.w == nil {
		return nil
	}
	root, err := filepath.EvalSymlinks(c.rootGiven)
	if err == nil {
		root, err = filepath.Abs(root)
	}
	if err != nil {
		return nil
	}
	id := idOf(root)
	if id == (fileID{}) || (root == c.cfg.Root && id == c.rootID) {
		return nil
	}
	if fi, err := os.Stat(root); err != nil || !fi.IsDir() {
		return nil
	}
	w, err := watch(root, c.log)
	if err != nil {
		if !c.rootWarned {
			c.rootWarned = true
			c.log.Warn("the document root is another directory now, which cannot be watched: rules keep the old files until re-validation",
				"root", c.rootGiven, "now", root, "error", err)
		}
		return nil
	}
	old := c.cfg.Root
	if root == old {
		c.log.Info("the document root is another directory now (one put in its place): every request is fetched again", "root", c.rootGiven)
	} else {
		c.log.Info("the document root is another directory now: every request is fetched again", "root", c.rootGiven, "was", old, "now", root)
	}
	c.w.close()
	c.w, c.cfg.Root, c.rootID, c.rootWarned, c.notInRoot = w, root, id, false, false
	for _, e := range c.entries {
		e.sources = append(e.sources, old) // every one of them goes
	}
	for _, e := range c.pending {
		e.sources = append(e.sources, old)
	}
	err = c.invalidate(old, now)
	for _, e := range c.pending { // now all of them: their files are under the new root
		e.obj = objectPath(root, e.req.path)
	}
	clear(c.refused) // their files may be there now
	return err
}

// pendingBatch fetches the requests whose files changed and have been
// quiet since for Settle, to offload them again if they still may be.
func (c *Controller) pendingBatch(now time.Time) *fetchBatch {
	var tasks []*fetchTask
	for _, e := range c.pending {
		if !now.Before(e.due) {
			tasks = append(tasks, c.probeTask(e))
		}
	}
	return newBatch(tasks, 0, now, c.probed)
}

// refresh rewrites the rules whose lease has half or less left (all of
// them: a rule not renewed stops answering), and up to DateRefresh rules
// in all (counting one per socket) whose Date is behind the current
// second, the oldest Date first. Every rule it rewrites gets the current
// Date, unless DateRefresh is 0. A Date has a fixed length, so the rule
// keeps its size, and an Expires that moves with the Date (nginx's
// `expires TIME`) moves with it.
func (c *Controller) refresh(now time.Time) error {
	if err := c.forgetLapsed(now); err != nil {
		return err
	}
	sec := now.Truncate(time.Second)
	renewBy := now.Add(c.cfg.Lease / 2)
	var due, stale []*entry
	for _, e := range c.entries {
		switch {
		case e.leased.Before(renewBy):
			due = append(due, e)
		case c.cfg.DateRefresh > 0 && !e.dated.IsZero() && e.dated.Before(sec):
			stale = append(stale, e)
		}
	}
	slices.SortFunc(stale, func(a, b *entry) int { return a.dated.Compare(b.dated) })
	budget := c.cfg.DateRefresh
	for _, e := range due {
		budget -= len(e.g.cookies)
	}
	n := 0
	for ; n < len(stale); n++ {
		cost := len(stale[n].g.cookies)
		if (n > 0 || len(due) > 0) && cost > budget { // at least one request a second, however many sockets
			break
		}
		budget -= cost
	}
	es := append(due, stale[:n]...)
	if len(es) == 0 {
		return nil
	}
	dated := 0
	for _, e := range es {
		if c.cfg.DateRefresh > 0 && !e.dated.IsZero() && e.dated.Before(sec) {
			e.reply, e.dated = e.resp.withDate(sec), sec
			dated += len(e.g.cookies)
		}
	}
	if err := c.modifyRules(es); err != nil {
		if !isRefusal(err) {
			return err
		}
		// e.g. santad full: tried again next second, with a second to spare
		c.log.Warn("renewing rules failed", "rules", len(es), "error", err)
		return nil
	}
	renewed := 0
	for _, e := range due {
		renewed += len(e.g.cookies)
	}
	c.count(func(r *Report) { r.Dated += uint64(dated); r.Renewed += uint64(renewed) })
	return nil
}

// forgetLapsed forgets the entries whose lease has passed (the controller
// was held up for half a lease): their rules no longer answer and santad
// removes them, if it has not yet. They can be learned again.
func (c *Controller) forgetLapsed(now time.Time) error {
	var lapsed []*entry
	for _, e := range c.entries {
		if !e.leased.After(now) {
			lapsed = append(lapsed, e)
		}
	}
	if len(lapsed) == 0 {
		return nil
	}
	c.log.Warn("rules lapsed: the controller did not renew them in time", "rules", len(lapsed))
	return c.remove(lapsed)
}

// revalidate has the responses of the rules not checked for Interval
// fetched again (revalidateBatch), once the fetch worker is free.
func (c *Controller) revalidate(now time.Time) error {
	c.revalidateDue = true
	return c.fetchNext(now)
}

// revalidateBatch fetches the responses of the rules not checked for
// Interval (their share of a second, oldest first), for a wildcard
// listener over its other addresses too (as probeTask: a reload may since
// have given one of them a server block of its own, which loopback's
// response does not show).
func (c *Controller) revalidateBatch(now time.Time) *fetchBatch {
	if !c.revalidateDue {
		return nil
	}
	c.revalidateDue = false
	var due []*entry
	for _, e := range c.entries {
		if now.Sub(e.checked) >= c.cfg.Interval {
			due = append(due, e)
		}
	}
	slices.SortFunc(due, func(a, b *entry) int { return a.checked.Compare(b.checked) })
	share := (len(c.entries)*int(time.Second) + int(c.cfg.Interval) - 1) / int(c.cfg.Interval)
	var tasks []*fetchTask
	for _, e := range due[:min(len(due), max(share, 1))] {
		tasks = append(tasks, c.task(e, 1))
	}
	return newBatch(tasks, 0, now, c.revalidated)
}

// revalidated compares the responses a re-validation batch fetched with
// what the rules send, Date aside. A new body or ETag is a change inotify
// did not report (a file outside the watched tree, a network file system,
// a change of nginx's configuration): the rule is rebuilt with the new
// response. Other differences are headers that change with time (a
// max-age counting down, a per-request cookie): the request is no longer
// offloaded. A rule deleted meanwhile (its file changed, it idled) is
// left as it is.
func (c *Controller) revalidated(b *fetchBatch) error {
	now := b.now
	var changed, gone []*entry
	for _, t := range b.tasks[:b.done] {
		e, r, err := t.e, t.resp, t.err
		if c.entries[e.key] != e {
			continue
		}
		switch {
		case err != nil && !isNotOffloadable(err):
			c.count(func(r *Report) { r.FetchErrors++ })
			c.log.Warn("re-validation failed; the rule stays", "request", e.req.line(), "error", err)
			e.checked = now
			continue
		case err != nil:
			c.refuse(e, err, now)
			gone = append(gone, e)
			continue
		}
		e.checked = now
		d, _ := r.at(r.date)
		if bytes.Equal(e.resp.withDate(d), r.raw) {
			continue
		}
		if !bytes.Equal(e.resp.body, r.body) || e.resp.etag != r.etag {
			c.log.Info("response changed: rule rebuilt", "request", e.req.line(), "etag", r.etag, "was", e.resp.etag)
			c.setResponse(e, r, now)
			e.sources = sources(e.obj, e.dir) // what inotify missed may be a link pointed elsewhere
			changed = append(changed, e)
			continue
		}
		c.refuse(e, fmt.Errorf("%w: its headers change with time (beyond Date and an Expires that moves with it)", errVaries), now)
		gone = append(gone, e)
	}
	if len(changed) > 0 {
		if err := c.modifyRules(changed); err != nil {
			if !isRefusal(err) {
				return err
			}
			c.log.Warn("rebuilding rules failed: they are removed", "rules", len(changed), "error", err)
			gone = append(gone, changed...)
		} else {
			c.count(func(r *Report) { r.Changed += uint64(len(changed)) })
		}
	}
	return c.remove(gone)
}

// readHits reads the rules' hits from santad into the entries, and adds
// what each rule answered since the last read to the report: the report
// keeps counting what rules removed or replaced since had answered (the
// hits between their last read and their removal aside).
func (c *Controller) readHits() error {
	hits := map[uint64]uint64{}
	for cookie := range c.byCookie {
		stats, err := c.rules.Stats(santa.Cookie(cookie))
		if errors.Is(err, santa.ErrNotFound) {
			continue // closed by nginx, its rules with it: the others still count
		}
		if err != nil {
			return fmt.Errorf("rule statistics: %w", err)
		}
		for _, st := range stats {
			hits[st.ID] = st.Hits
		}
	}
	var added uint64
	own := map[uint64]uint64{} // the controller's rules; others may share the sockets
	for _, e := range c.entries {
		var n uint64
		for _, id := range e.ids {
			n += hits[id]
			own[id] = hits[id]
			added += hits[id] - min(c.ruleHits[id], hits[id])
		}
		e.hits = n
	}
	c.ruleHits = own
	c.count(func(r *Report) { r.Hits += added })
	return nil
}

// dropIdle removes the rules that answered nothing since the last check
// and were installed before it.
func (c *Controller) dropIdle(now time.Time) error {
	if err := c.readHits(); err != nil {
		return err
	}
	var idle []*entry
	for _, e := range c.entries {
		if e.hits == e.idle && now.Sub(e.since) >= c.cfg.Idle {
			idle = append(idle, e)
		}
		e.idle = e.hits
	}
	if len(idle) > 0 {
		c.log.Debug("idle rules removed", "requests", len(idle))
	}
	return c.remove(idle)
}

// removeAll deletes every rule of the controller (on exit), after reading
// their hits for the report, unless keep: santad went away under the run
// (follow.KeepRules), and the rules stay, ending with their lease unless a
// controller takes them over. It says whether it deleted them all.
func (c *Controller) removeAll(keep bool) bool {
	if keep {
		c.log.Warn("santad went away: the rules stay for the next controller with this tag to take over")
		return false
	}
	// santa.ErrNotFound: the rules went with their socket (nginx stopped)
	if err := c.readHits(); err != nil && !errors.Is(err, santa.ErrNotFound) {
		c.log.Warn("reading the rules' hits on exit failed", "error", err)
	}
	all := make([]*entry, 0, len(c.entries))
	for _, e := range c.entries {
		all = append(all, e)
	}
	clear(c.pending)
	if err := c.deleteRules(all); err != nil {
		// santad went away: the next controller with this tag deletes them
		c.log.Warn("removing the rules on exit failed", "error", err)
		return false
	}
	c.count(func(r *Report) { r.Removed += uint64(len(all)) })
	c.log.Info("removed the controller's rules", "rules", len(all))
	return true
}
