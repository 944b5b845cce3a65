// Package mcctl is `santa memcached`: it offloads the GETs of hot keys of an
// unmodified memcached over UDP and keeps every offloaded reply consistent
// with memcached's writes (docs/memcached.md).
//
// The write tracker (bpf/tracker.c, at TC ingress and egress) bumps a key's
// guard slot when a write of it reaches memcached and again when the reply
// to the write leaves. The controller reads a key's slot version and the
// epoch version, then fetches the value, then installs a GET rule guarded by
// both versions: if a write raced with the fetch, the rule never answers.
// Every Interval while writes come (up to quietInterval apart when none
// do) it checks the versions of the rules of the slots the tracker reports
// bumped, and fetches the keys whose rules a write retired again. A write
// no reply may follow (noreply, quiet, a reset connection) has no second
// bump from the tracker: the controller bumps its slot itself once the
// write has settled (Settle).
package mcctl

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/internal/sketch"
)

// Mode says which keys are offloaded.
type Mode int

const (
	Static   Mode = iota + 1 // the given keys
	Top                      // the given keys, most popular first, up to MaxRules
	Adaptive                 // the keys that miss most often, learned from miss samples
)

func (m Mode) String() string {
	return map[Mode]string{Static: "static", Top: "top", Adaptive: "adaptive"}[m]
}

// Config configures a Controller. Zero fields take DefaultConfig's.
type Config struct {
	Socket     string         // santad's control socket ("": $SANTA_SOCKET, else api.DefaultSocket)
	Port       uint16         // memcached's UDP port (-U): its sockets get the rules
	TCPPort    uint16         // memcached's TCP port (-p) to fetch from; 0: Port
	Server     netip.AddrPort // where to fetch values over TCP; zero: fetchAddress of the UDP sockets, TCPPort
	GuardsPin  string         // santad's guard map (daemon.Config.GuardsPin)
	Interfaces []string       // where the write tracker goes, and on lo; nil: every interface of the namespace
	Mode       Mode
	Keys       []string // Static and Top
	MaxRules   int      // Top: keys offloaded; Adaptive: rules at most
	MinSamples uint64   // Adaptive: misses of a key (decayed) before it is offloaded
	SampleRate uint32   // Adaptive: miss samples per second and CPU
	Idle       time.Duration
	Interval   time.Duration // scan for retired rules this often while writes come
	Batch      int           // keys per fetch and per santad request
	Timeout    time.Duration // for memcached's replies
	// Settle is how long after a write that gets no reply its key's rules
	// are retired once more: by then memcached has applied it, and a rule
	// built from a value fetched before is rebuilt.
	Settle time.Duration
	// Tag tags every rule the controller installs. It takes over the rules
	// with its tag that its sockets hold when it starts (follow.Inherited);
	// Run fails with follow.ErrTagClaimed while another controller runs
	// with it on the port.
	Tag string
	Log *slog.Logger
	// Ready, if set, is called once the first rules are installed.
	Ready func(Report)
}

// DefaultConfig holds the defaults.
var DefaultConfig = Config{
	GuardsPin:  "/sys/fs/bpf/santa/guards",
	MaxRules:   10000,
	MinSamples: 8,
	SampleRate: 2000,
	Idle:       30 * time.Second,
	Interval:   20 * time.Millisecond,
	Settle:     time.Second,
	Batch:      256,
	Timeout:    2 * time.Second,
	Tag:        "santa-memcached",
}

// Report counts what the controller did.
type Report struct {
	Sockets   int    `json:"sockets"`
	Keys      int    `json:"keys"`      // keys offloaded now: each has a rule on every socket
	Rules     int    `json:"rules"`     // rules now, on all sockets
	Installed uint64 `json:"installed"` // keys offloaded
	Refreshed uint64 `json:"refreshed"` // keys whose rules were rebuilt after a write retired them
	Removed   uint64 `json:"removed"`   // keys whose rules were deleted (key gone, expired, too big, idle)
	Settled   uint64 `json:"settled"`   // slots bumped again after a write without a reply settled
	Skipped   uint64 `json:"skipped"`   // keys not offloadable (missing, too big, invalid)
	// keys not offloaded, or whose rules were removed, while a delayed
	// flush_all was pending (FlushHold)
	HeldForFlush uint64 `json:"held_for_flush"`
	Waiting      int    `json:"waiting"` // keys the last install did not get to for want of room in santad
	// Tracker holds the write tracker's counters (bpf/tracker.h).
	Tracker map[string]uint64 `json:"tracker"`
}

// Controller is one `santa memcached` run.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	client  *santa.Client
	santad  uint32 // the pid of the santad the run started with
	guards  *guardMap
	tracker *Tracker
	links   *linkFollower // nil: Interfaces were given
	fetch   *fetcher
	cookies []uint64      // the attached sockets
	created []uint64      // those the attach bound, and a predecessor's taken over (unbound on exit)
	claim   *follow.Claim // this run's hold on its tag on the port
	entries map[string]*entry
	bySlot  map[uint32][]*entry // entries by guard slot: those a bump of it may retire
	// Entries that expire, by the second their value expires in, counted
	// from start on the monotonic clock (the one time.Time compares by).
	expiry   map[int64]map[string]*entry
	expiryAt int64 // the first bucket that expired has not emptied yet
	start    time.Time

	wanted  map[string]bool // Static and Top: keys to offload once they exist
	missing map[string]bool // the wanted keys without a rule, looked at every second
	hot     *sketch.Sketch  // Adaptive
	samples chan string
	// Keys whose last fetch gave nothing to offload (no value, too big, too
	// short-lived, refused by santad), with the guard versions read before
	// it: fetched again only once a write has bumped either.
	unoffloadable map[string]versions
	// Adaptive: when idle rules were last looked for
	idleChecked time.Time
	settling    settling
	epochSeen   uint64        // the epoch's version at the last scan
	holdLogged  time.Duration // the last delayed flush's hold that was logged
	swept       []uint64      // every slot's version when sweep last looked
	sweepAt     uint32        // where sweep goes on
	sweptAt     time.Time     // when sweep last looked

	// rulesLeft: on exit santad did not confirm that every rule is gone
	// (it went away): the write tracker stays attached to guard them.
	rulesLeft bool
	waiting   int               // keys the last install did not get to for want of room in santad
	room      follow.Room       // when rules went from santad, after it had no room: the waiting keys are worth fetching
	inherited *follow.Inherited // a predecessor's rules, until installed again or deleted

	repMu sync.Mutex
	rep   Report
}

// entry is a key with rules on every attached socket.
type entry struct {
	key          string
	slot         uint32
	keyVersion   uint64
	epochVersion uint64
	ids          []uint64  // per socket, in c.cookies order
	expires      time.Time // memcached's expiry of the value; zero: none
	bucket       int64     // its expiry bucket
	hits         uint64    // Adaptive: the rules' hits at the last idle check
}

// versions are a key's guard slot's and the epoch's versions.
type versions struct{ key, epoch uint64 }

// New checks cfg and makes a controller.
func New(cfg Config) (*Controller, error) {
	d := DefaultConfig
	for _, s := range []struct {
		v *string
		d string
	}{{&cfg.Socket, santa.SocketPath()}, {&cfg.GuardsPin, d.GuardsPin}, {&cfg.Tag, d.Tag}} {
		if *s.v == "" {
			*s.v = s.d
		}
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
	for _, s := range []struct {
		name string
		v, d *time.Duration
	}{{"idle time", &cfg.Idle, &d.Idle}, {"refresh interval", &cfg.Interval, &d.Interval},
		{"timeout", &cfg.Timeout, &d.Timeout}, {"settle time", &cfg.Settle, &d.Settle}} {
		if *s.v == 0 {
			*s.v = *s.d
		}
		if *s.v < 0 {
			return nil, fmt.Errorf("%s %v: must be positive", s.name, *s.v)
		}
	}
	if cfg.Batch == 0 {
		cfg.Batch = d.Batch
	}
	if cfg.TCPPort == 0 {
		cfg.TCPPort = cfg.Port
	}
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	switch {
	case cfg.Port == 0:
		return nil, errors.New("say which UDP port memcached serves (its -U)")
	case cfg.Mode != Static && cfg.Mode != Top && cfg.Mode != Adaptive:
		return nil, fmt.Errorf("unknown mode %d", cfg.Mode)
	case cfg.Mode != Adaptive && len(cfg.Keys) == 0:
		return nil, fmt.Errorf("%s mode needs keys to offload (none were given)", cfg.Mode)
	case cfg.MaxRules < 1:
		return nil, fmt.Errorf("max rules %d: must be at least 1", cfg.MaxRules)
	case cfg.Batch < 1:
		return nil, fmt.Errorf("batch %d: must be at least 1", cfg.Batch)
	}
	if err := api.CheckTag(cfg.Tag); err != nil {
		return nil, err
	}
	c := &Controller{cfg: cfg, log: cfg.Log, entries: map[string]*entry{}, bySlot: map[uint32][]*entry{},
		expiry: map[int64]map[string]*entry{}, start: time.Now(), wanted: map[string]bool{}, missing: map[string]bool{},
		unoffloadable: map[string]versions{}, samples: make(chan string, 4096), settling: settling{due: map[uint32]time.Time{}}}
	keys := cfg.Keys
	if cfg.Mode == Top && len(keys) > cfg.MaxRules {
		keys = keys[:cfg.MaxRules]
	}
	for _, k := range keys {
		if !validKey(k) {
			return nil, fmt.Errorf("key %q: memcached keys are 1 to %d bytes without spaces or control characters", k, maxKeyLen)
		}
		c.wanted[k], c.missing[k] = true, true
	}
	if cfg.Mode == Adaptive {
		c.hot = sketch.New(4 * min(cfg.MaxRules, 16384))
	}
	return c, nil
}

// Report returns the counters.
func (c *Controller) Report() Report {
	c.repMu.Lock()
	r := c.rep
	c.repMu.Unlock()
	if c.tracker != nil && r.Tracker == nil {
		r.Tracker, _ = c.tracker.Counters()
	}
	return r
}

func (c *Controller) count(f func(r *Report)) {
	c.repMu.Lock()
	f(&c.rep)
	c.rep.Keys, c.rep.Rules, c.rep.Waiting = len(c.entries), len(c.entries)*len(c.cookies), c.waiting
	c.repMu.Unlock()
}

// Run starts the write tracker, attaches to memcached's UDP sockets,
// installs the first rules and keeps them consistent until ctx ends; then it
// deletes its rules and only then stops the tracker.
func (c *Controller) Run(ctx context.Context) (err error) {
	// before the tracker: a refused controller must not replace the pins
	// of the running one's
	if c.claim, err = follow.ClaimTag(c.cfg.Socket, api.ProtocolUDP, c.cfg.Port, c.cfg.Tag); err != nil {
		return err
	}
	defer c.claim.Release()
	if c.guards, err = openGuards(c.cfg.GuardsPin); err != nil {
		return err
	}
	defer c.guards.close()
	if err := c.guards.ofSantad(c.cfg.Socket); err != nil {
		return err
	}
	if err := c.startTracker(); err != nil {
		return err
	}
	defer c.stopTracker()
	if c.client, err = santa.Dial(c.cfg.Socket); err != nil {
		return err
	}
	c.santad = follow.SantadPID(c.client)
	defer c.client.Close()
	if err := c.attach(); err != nil {
		return err
	}
	bound, err := follow.BoundRuleSets(c.client)
	if err == nil {
		c.created, err = c.claim.TakeOverCreated(c.created, bound, c.log)
	}
	if err != nil {
		follow.UnbindEmpty(c.client, c.created, c.log)
		return err
	}
	defer c.removeAll(ctx)
	c.fetch = newFetcher(c.cfg.Server.String(), c.cfg.Timeout)
	defer c.fetch.close()
	if err := c.fetch.connect(); err != nil {
		return fmt.Errorf("%w (memcached's TCP address can be given with --server)", err)
	}

	if err := c.install(sortedKeys(c.wanted)); err != nil {
		return err
	}
	if err := c.installInherited(); err != nil {
		return err
	}
	if err := c.inherited.DeleteRest(c.client); err != nil {
		return err
	}
	if c.cfg.Ready != nil {
		c.cfg.Ready(c.Report())
	}
	subCtx, stop := context.WithCancel(ctx)
	defer stop()
	gone, err := c.watch(subCtx)
	if err != nil {
		return err
	}
	return c.loop(ctx, gone)
}

// startTracker loads the write tracker, watching every port memcached
// serves on (memcachedPorts), and attaches it everywhere before
// any value is fetched; without given interfaces it follows the namespace's
// new ones too (linkFollower). Its links are pinned beside the guard map,
// so that rules a killed controller leaves behind stay guarded; a
// predecessor's are replaced.
func (c *Controller) startTracker() error {
	tcpPorts, udpPorts, bound, err := memcachedPorts(c.cfg.Port)
	if err != nil {
		return err
	}
	if !c.cfg.Server.IsValid() {
		c.cfg.Server = netip.AddrPortFrom(fetchAddress(bound), c.cfg.TCPPort)
	}
	// on a connection of its own, closed before the tracker starts: one it
	// did not see open would retire every rule at each request
	ascii, err := textOnly(c.cfg.Server.String(), c.cfg.Timeout)
	if err != nil {
		return fmt.Errorf("%w (memcached's TCP address can be given with --server)", err)
	}
	hold, err := LoadFlushHold(c.pinDir())
	if err != nil {
		return err
	}
	t, err := LoadTracker(TrackerConfig{TCPPorts: tcpPorts, UDPPorts: udpPorts, Guards: c.guards.m, FlushHold: hold,
		TextOnly: ascii})
	if hold != nil {
		hold.Close() // the tracker holds its own reference
	}
	if err != nil {
		return err
	}
	ifnames := c.cfg.Interfaces
	if ifnames == nil {
		if c.links, ifnames, err = followLinks(t, c.guards, c.pinDir(), c.log); err != nil {
			t.Close()
			return err
		}
	} else {
		if !slices.Contains(ifnames, loopback) {
			// writes from memcached's own host come over lo, whatever
			// address they are sent to (the controller's fetches do):
			// unseen, they would leave the old values offloaded
			ifnames = append(slices.Clone(ifnames), loopback)
		}
		for _, name := range ifnames {
			if err := t.Attach(name); err != nil {
				t.Close()
				return err
			}
		}
	}
	if err := t.Pin(c.pinDir()); err != nil {
		if c.links != nil {
			c.links.stop()
		}
		t.Close()
		return err
	}
	c.tracker = t
	c.log.Info("write tracker attached", "interfaces", ifnames, "tcp_ports", tcpPorts, "udp_ports", udpPorts)
	return nil
}

// loopback is the loopback interface of every network namespace.
const loopback = "lo"

// pinDir is where the tracker's links are pinned: one directory per port
// and tag, so that controllers with different tags on one port do not
// replace, or on exit unpin, each other's tracker. The default tag keeps the
// directory of before, which its predecessors pinned.
func (c *Controller) pinDir() string {
	name := "memcached-" + strconv.Itoa(int(c.cfg.Port))
	if c.cfg.Tag != DefaultConfig.Tag {
		name += "-" + url.PathEscape(c.cfg.Tag)
	}
	return filepath.Join(filepath.Dir(c.cfg.GuardsPin), name)
}

func (c *Controller) stopTracker() {
	if c.links != nil {
		c.links.stop()
	}
	final, err := c.tracker.Counters()
	if err == nil {
		c.count(func(r *Report) { r.Tracker = final })
	}
	if c.rulesLeft {
		// the rules may still answer (the data plane outlives santad, and
		// the next santad restores them): writes must keep retiring them
		c.log.Warn("the write tracker stays attached, since santad did not confirm that the controller's rules are gone: "+
			"writes keep retiring them; the next `santa memcached` on this port replaces it, `santad cleanup` removes it",
			"pins", c.pinDir())
		c.tracker.Close()
		return
	}
	if err := c.tracker.Unpin(); err != nil {
		c.log.Warn("unpinning the write tracker failed", "error", err)
	}
	c.tracker.Close()
	os.Remove(c.pinDir())
}

// attach binds memcached's UDP sockets through santad.
func (c *Controller) attach() error {
	socks, err := c.client.BindPort(c.cfg.Port)
	if errors.Is(err, santa.ErrNotFound) {
		return fmt.Errorf("attach to UDP port %d: %w (memcached serves UDP only when started with -U %d: it is off by default)",
			c.cfg.Port, err, c.cfg.Port)
	}
	if err != nil {
		return fmt.Errorf("attach to UDP port %d: %w", c.cfg.Port, err)
	}
	for _, s := range socks {
		if s.Protocol != 17 {
			continue
		}
		c.cookies = append(c.cookies, s.Cookie)
		if s.Created {
			c.created = append(c.created, s.Cookie)
		}
	}
	if len(c.cookies) == 0 {
		return fmt.Errorf("no UDP socket bound to port %d", c.cfg.Port)
	}
	if api.LoopbackOnly(socks) {
		c.log.Warn(api.LoopbackWarning)
	}
	c.count(func(r *Report) { r.Sockets = len(c.cookies) })
	c.log.Info("attached", "port", c.cfg.Port, "sockets", len(c.cookies), "fetch_from", c.cfg.Server)
	c.inherited, err = follow.Inherit(c.cfg.Socket, c.cfg.Tag, c.cookies, c.log)
	return err
}

// fetchAddress is where to fetch values from memcached, whose UDP sockets
// are bound to addrs: memcached's -l binds its TCP sockets to the same
// addresses. Loopback if one of them is a loopback or wildcard address
// (IPv4's if there is one of either kind), else the first IPv4 address,
// else the first.
func fetchAddress(addrs []netip.Addr) netip.Addr {
	loopback4 := netip.AddrFrom4([4]byte{127, 0, 0, 1})
	local6 := false
	for _, a := range addrs {
		if a.IsLoopback() || a.IsUnspecified() {
			if a.Is4() {
				return loopback4
			}
			local6 = true
		}
	}
	if local6 {
		return netip.IPv6Loopback()
	}
	for _, a := range addrs {
		if a.Is4() {
			return a
		}
	}
	if len(addrs) > 0 {
		return addrs[0]
	}
	return loopback4
}

// installInherited offloads again, in adaptive mode, the keys of the rules
// a predecessor left (follow.Inherited), up to MaxRules. Their new rules
// supersede the old ones, so that a restart does not send their GETs to
// memcached until they are learned again; a key without hits for Idle goes
// like any other. (Static and top modes install their keys anyway.)
func (c *Controller) installInherited() error {
	if c.cfg.Mode != Adaptive {
		return nil
	}
	seen := map[string]bool{}
	var keys []string
	for _, cookie := range c.cookies {
		for _, r := range c.inherited.Rules(cookie) {
			if key, ok := keyOf(r); ok && !seen[key] && len(keys) < c.cfg.MaxRules {
				seen[key] = true
				keys = append(keys, key)
			}
		}
	}
	if len(keys) == 0 {
		return nil
	}
	if err := c.install(keys); err != nil {
		return err
	}
	c.log.Info("offloaded again the keys of the rules a predecessor left", "keys", len(keys), "offloaded", len(c.entries))
	return nil
}

// fetched is a key's value with the versions read before it was fetched.
type fetched struct {
	key                      string
	v                        value
	keyVersion, epochVersion uint64
	at                       time.Time
	// held: a delayed flush_all may be applied after the versions were
	// read: the value (not fetched) must not be offloaded
	held bool
}

// fetchAll reads the versions, then fetches the values of keys, in batches.
// A delayed flush_all the tracker saw (FlushHold) empties memcached later,
// with no bump when it does: a batch whose versions were read before it is
// surely applied is held, whether the flush came before the read (then
// nothing is fetched) or during the fetch.
func (c *Controller) fetchAll(keys []string, each func(batch []fetched) error) error {
	for i := 0; i < len(keys); i += c.cfg.Batch {
		batch := keys[i:min(i+c.cfg.Batch, len(keys))]
		out := make([]fetched, len(batch))
		readAt := monotonicNow() // before the versions: the tracker sets the hold before its bumps
		epoch := c.guards.version(epochSlot)
		for k, key := range batch {
			out[k] = fetched{key: key, keyVersion: c.guards.version(KeySlot(key)), epochVersion: epoch}
		}
		held, err := c.flushHeld(readAt)
		if err != nil {
			return err
		}
		if !held {
			at := time.Now()
			vals, err := c.fetch.fetch(batch)
			if err != nil {
				return err
			}
			if held, err = c.flushHeld(readAt); err != nil {
				return err
			}
			for k := range out {
				out[k].v, out[k].at = vals[k], at
			}
		}
		for k := range out {
			out[k].held = held
		}
		if err := each(out); err != nil {
			return err
		}
	}
	return nil
}

// flushHeld reports whether a delayed flush_all the tracker saw may be
// applied after the monotonic time t; it logs each new hold once.
func (c *Controller) flushHeld(t time.Duration) (bool, error) {
	hold, err := c.tracker.FlushHold()
	if err != nil {
		return false, fmt.Errorf("read the write tracker's flush hold: %w", err)
	}
	if hold > c.holdLogged {
		c.holdLogged = hold
		if left := hold - monotonicNow(); left > 0 {
			c.log.Info("a delayed flush_all is pending: no key is offloaded until memcached has surely applied it",
				"for", left.Round(time.Millisecond))
		}
	}
	return hold > t, nil
}

// progressEvery is how often a long install logs its progress.
const progressEvery = 5 * time.Second

// install fetches keys that have no rules yet and adds their rules. When
// santad has no room for more, it adds what fits and stops: the keys it did
// not get to wait until rules have gone from santad (everySecond).
func (c *Controller) install(keys []string) error {
	start, done, logged := time.Now(), 0, time.Now()
	defer func() {
		if time.Since(start) > progressEvery {
			c.log.Info("installed", "keys", done, "rules", len(c.entries), "elapsed", time.Since(start).Round(time.Millisecond))
		}
	}()
	err := c.fetchAll(keys, func(batch []fetched) error {
		done += len(batch)
		if time.Since(logged) > progressEvery { // long work: a million keys take minutes
			logged = time.Now()
			c.log.Info("installing", "done", done, "of", len(keys), "rules", len(c.entries), "elapsed", time.Since(start).Round(time.Millisecond))
		}
		var rules []api.Rule
		var es []*entry
		for _, f := range batch {
			r, e, ok := c.build(f)
			if !ok {
				continue
			}
			rules = append(rules, r)
			es = append(es, e)
		}
		if len(rules) == 0 {
			return nil
		}
		ids, err := follow.AddFitting(c.client, c.cookies, rules, c.inherited, func(k int, err error) {
			c.count(func(r *Report) { r.Skipped++ })
			c.unoffloadable[es[k].key] = versions{es[k].keyVersion, es[k].epochVersion}
			c.log.Debug("santad refused a rule", "key", es[k].key, "error", err)
		})
		added := 0
		for k, e := range es {
			if ids[k] != nil {
				e.ids = ids[k]
				c.put(e)
				added++
			}
		}
		c.count(func(r *Report) { r.Installed += uint64(added) })
		if follow.NoRoom(err) {
			if err := c.waitForRoom(len(keys)-done+len(es)-added, err); err != nil {
				return err
			}
			return fmt.Errorf("%w: %w", errNoRoom, err)
		}
		return err
	})
	if errors.Is(err, errNoRoom) {
		return nil
	}
	if err == nil && c.waiting > 0 {
		c.log.Info("santad had room for the keys that waited", "rules", len(c.entries))
		c.waiting = 0
		c.count(func(*Report) {})
	}
	return err
}

// errNoRoom stops an install pass: santad has no room for more rules (its
// data plane is full, or the quota of the controller's user is reached).
var errNoRoom = errors.New("santad has no room for more rules")

// refused reports whether santad refused rules for what they are or for
// want of room (the rules are not offloaded), rather than failing.
func refused(err error) bool {
	return follow.NoRoom(err) || errors.Is(err, santa.ErrInvalid)
}

// waitForRoom records that n keys wait for room in santad, and santad's
// usage now (follow.Room), and says so when they start to wait.
func (c *Controller) waitForRoom(n int, err error) error {
	if c.waiting == 0 {
		c.log.Warn("keys wait for room in santad, tried again when rules go from santad", "keys", n, "rules", len(c.entries), "error", err)
	}
	c.waiting = n
	c.count(func(*Report) {})
	return c.room.Refused(c.client)
}

// build makes f's rule and entry; ok is false if the value is not offloadable.
func (c *Controller) build(f fetched) (api.Rule, *entry, bool) {
	if f.held { // fetched again once the flush is applied, like a missing key
		c.count(func(r *Report) { r.HeldForFlush++ })
		return api.Rule{}, nil, false
	}
	r, err := getRule(f.key, f.v, f.keyVersion, f.epochVersion)
	// memcached's clock ticks once a second, at the phase of its start: a
	// value with ttl seconds left may expire up to a second sooner. The rule
	// stops answering at the last whole second before then, also if this
	// controller is gone or late (santad then removes it, and refresh adds
	// it again); santad refuses one whose time has come
	earliestExpiry := f.at.Add(time.Duration(f.v.ttl-1) * time.Second)
	if err == nil && f.v.ttl >= 0 && (f.v.ttl < 2 || earliestExpiry.Unix() <= time.Now().Unix()) {
		err = fmt.Errorf("%w: %s expires in %d s (as of its fetch)", errNotOffloadable, f.key, f.v.ttl)
	}
	if err != nil {
		c.count(func(r *Report) { r.Skipped++ })
		c.unoffloadable[f.key] = versions{f.keyVersion, f.epochVersion}
		c.log.Debug("not offloaded", "reason", err)
		return api.Rule{}, nil, false
	}
	r.Tag = c.cfg.Tag
	e := &entry{key: f.key, slot: KeySlot(f.key), keyVersion: f.keyVersion, epochVersion: f.epochVersion}
	if f.v.ttl >= 0 {
		e.expires = earliestExpiry
		r.Expires = uint64(earliestExpiry.Unix())
	}
	return r, e, true
}

// put adds e, or replaces its key's entry, in c.entries and the indexes.
func (c *Controller) put(e *entry) {
	if old := c.entries[e.key]; old != nil {
		c.drop(old)
	}
	c.entries[e.key] = e
	delete(c.missing, e.key)
	delete(c.unoffloadable, e.key)
	c.bySlot[e.slot] = append(c.bySlot[e.slot], e)
	if !e.expires.IsZero() {
		// never behind the walk of expired, so that it is found
		e.bucket = max(int64(e.expires.Sub(c.start)/time.Second), c.expiryAt)
		if c.expiry[e.bucket] == nil {
			c.expiry[e.bucket] = map[string]*entry{}
		}
		c.expiry[e.bucket][e.key] = e
	}
}

// drop removes e from c.entries and the indexes.
func (c *Controller) drop(e *entry) {
	delete(c.entries, e.key)
	if c.wanted[e.key] {
		c.missing[e.key] = true
	}
	if es := slices.DeleteFunc(c.bySlot[e.slot], func(x *entry) bool { return x == e }); len(es) > 0 {
		c.bySlot[e.slot] = es
	} else {
		delete(c.bySlot, e.slot)
	}
	if !e.expires.IsZero() {
		delete(c.expiry[e.bucket], e.key)
	}
}

// dropAll empties c.entries and the indexes: drop for every entry at once
// (a million of them one by one took a second).
func (c *Controller) dropAll() {
	clear(c.entries)
	clear(c.bySlot)
	clear(c.expiry)
	clear(c.unoffloadable)
	c.missing = maps.Clone(c.wanted)
}

// retired lists the keys whose rules a write retired or whose values are
// about to expire. It checks only the entries of the slots bumped since the
// last call, unless the epoch was bumped or bumps went unreported: then it
// checks every entry. First it bumps the slots of the writes without a
// reply that have settled, and sweeps for bumps it was not told of.
func (c *Controller) retired(now time.Time) (keys []string, moved bool, err error) {
	bumped := map[uint32]bool{}
	lost, err := c.tracker.DrainBumps(func(slot uint32, unacked bool) {
		bumped[slot] = true
		if unacked {
			c.settling.add(slot, now.Add(c.cfg.Settle))
		}
	})
	if err != nil {
		return nil, false, err
	}
	if c.links != nil && c.links.epochBumped() { // a new interface was up before the tracker was on it
		c.settling.add(epochSlot, now.Add(c.cfg.Settle))
	}
	settled := c.settling.pop(now, func(slot uint32) {
		c.guards.bump(slot)
		bumped[slot] = true
	})
	if settled > 0 {
		c.count(func(r *Report) { r.Settled += uint64(settled) })
	}
	c.sweep(bumped, now)
	out := map[string]bool{}
	epoch := c.guards.version(epochSlot)
	check := func(e *entry) {
		if e.epochVersion != epoch || c.guards.version(e.slot) != e.keyVersion {
			out[e.key] = true
		}
	}
	// The epoch may also move unreported: the link follower, or another
	// controller's tracker (they share the guard map).
	epochMoved := epoch != c.epochSeen
	c.epochSeen = epoch
	if epochMoved && !bumped[epochSlot] && !lost && c.fetch != nil {
		// Maybe by our fetches: a tracker started after our connection
		// opened cannot follow it, and bumps the epoch at each of them,
		// retiring every rule to fetch again, without end. The next fetch
		// dials anew, seen open by every tracker there is.
		c.fetch.close()
	}
	if lost || bumped[epochSlot] || epochMoved {
		for _, e := range c.entries {
			check(e)
		}
	} else {
		for slot := range bumped {
			for _, e := range c.bySlot[slot] {
				check(e)
			}
		}
	}
	c.expired(now, out)
	return sortedKeys(out), len(bumped) > 0 || lost || epochMoved || len(out) > 0, nil
}

// sweep adds to bumped the slots bumped without a report: another
// controller's tracker shares the guard map, and its writes retire this
// controller's rules of the same slot. Each scan compares the share of the
// slots due since the last with their versions at the last sweep: every
// slot once a second.
func (c *Controller) sweep(bumped map[uint32]bool, now time.Time) {
	if c.swept == nil {
		c.swept = make([]uint64, guardSlots)
		c.sweptAt = now.Add(-c.cfg.Interval)
	}
	elapsed := min(max(now.Sub(c.sweptAt), 0), time.Second)
	c.sweptAt = now
	n := uint32(uint64(guardSlots) * uint64(elapsed) / uint64(time.Second))
	for range max(n, 1) {
		s := c.sweepAt
		if v := c.guards.version(s); v != c.swept[s] {
			c.swept[s] = v
			bumped[s] = true
		}
		c.sweepAt = (s + 1) % guardSlots
	}
}

// expired takes the entries whose values expire by now out of the expiry
// buckets into out: refresh puts them back with their new expiry.
func (c *Controller) expired(now time.Time, out map[string]bool) {
	last := int64(now.Sub(c.start) / time.Second)
	for ; c.expiryAt <= last; c.expiryAt++ {
		b := c.expiry[c.expiryAt]
		for k, e := range b {
			if now.After(e.expires) {
				out[k] = true
				delete(b, k)
			}
		}
		if c.expiryAt == last {
			return // the rest of this second's bucket expires later in it
		}
		delete(c.expiry, c.expiryAt)
	}
}

// refresh fetches the keys again and rebuilds their rules in place, or
// deletes them where the value is gone or no longer offloadable.
func (c *Controller) refresh(keys []string) error {
	return c.fetchAll(keys, func(batch []fetched) error {
		mods := make([][]api.Rule, len(c.cookies))
		var rebuilt, gone []*entry
		for _, f := range batch {
			old := c.entries[f.key]
			r, e, ok := c.build(f)
			if !ok {
				gone = append(gone, old)
				continue
			}
			e.ids, e.hits = old.ids, old.hits
			c.put(e)
			rebuilt = append(rebuilt, e)
			for ci := range c.cookies {
				r.ID = e.ids[ci]
				mods[ci] = append(mods[ci], r)
			}
		}
		for ci, cookie := range c.cookies {
			if len(mods[ci]) == 0 {
				continue
			}
			err := c.client.Modify(santa.Cookie(cookie), mods[ci])
			// another rule may expire between rebuildGone's listing and its modify
			for try := 0; try < 3 && errors.Is(err, santa.ErrNotFound); try++ {
				err = c.rebuildGone(ci, mods[ci], rebuilt)
			}
			if refused(err) {
				// e.g. the new values need more room than santad has: the
				// rules go (a write retired them already), and wanted keys
				// wait with the missing ones
				c.log.Warn("santad refused rebuilt rules: removing them", "rules", len(rebuilt), "error", err)
				return c.remove(append(gone, rebuilt...))
			}
			if err != nil {
				return fmt.Errorf("rebuild %d rules: %w", len(mods[ci]), err)
			}
		}
		c.count(func(r *Report) { r.Refreshed += uint64(len(batch) - len(gone)) })
		return c.remove(gone)
	})
}

// rebuildGone modifies the rules mods of socket c.cookies[ci] (those of
// entries es) after santad refused to because some are gone: rules whose
// value's expiry santad reached first (the controller was late), or deleted
// by someone else. Those it adds again, with new ids.
func (c *Controller) rebuildGone(ci int, mods []api.Rule, es []*entry) error {
	present, err := c.presentIDs(ci)
	if err != nil {
		return err
	}
	var kept, readd []api.Rule
	var readded []*entry
	for k, r := range mods {
		if present[r.ID] {
			kept = append(kept, r)
		} else {
			r.ID = 0
			readd, readded = append(readd, r), append(readded, es[k])
		}
	}
	cookie := santa.Cookie(c.cookies[ci])
	if len(kept) > 0 {
		if err := c.client.Modify(cookie, kept); err != nil {
			return err
		}
	}
	if len(readd) == 0 {
		return nil
	}
	ids, err := c.client.Add(cookie, readd)
	if err != nil {
		return err
	}
	for k, e := range readded {
		e.ids[ci] = ids[k]
	}
	c.log.Info("rules gone under the controller (expired first, or deleted) added again", "rules", len(readd))
	return nil
}

// presentIDs are the ids of the rules with the controller's tag on socket
// c.cookies[ci].
func (c *Controller) presentIDs(ci int) (map[uint64]bool, error) {
	rules, err := c.client.ListTagged(santa.Cookie(c.cookies[ci]), c.cfg.Tag)
	if err != nil {
		return nil, err
	}
	present := make(map[uint64]bool, len(rules))
	for _, r := range rules {
		present[r.ID] = true
	}
	return present, nil
}

// remove deletes the entries' rules from every socket; those already gone
// (expired, or deleted by someone else) are not missed.
func (c *Controller) remove(es []*entry) error {
	if len(es) == 0 {
		return nil
	}
	for ci, cookie := range c.cookies {
		ids := make([]uint64, len(es))
		for k, e := range es {
			ids[k] = e.ids[ci]
		}
		if err := follow.DeleteRules(c.client, cookie, ids); err != nil {
			return fmt.Errorf("delete %d rules of socket %d: %w", len(ids), cookie, err)
		}
	}
	for _, e := range es {
		c.drop(e)
	}
	c.count(func(r *Report) { r.Removed += uint64(len(es)) })
	return nil
}

// removeAll deletes every rule the controller installed and detaches the
// sockets its attach bound (on exit, before the tracker stops); rules it
// cannot delete set rulesLeft.
func (c *Controller) removeAll(ctx context.Context) {
	if follow.KeepRules(ctx, c.client, c.santad) {
		c.log.Warn("santad went away: the rules stay for the next controller with this tag to take over")
		c.rulesLeft = true
		return
	}
	// every rule with the tag on the sockets: this controller's, and those a
	// predecessor left that it did not get to
	n := len(c.entries)
	if err := follow.DeleteTagged(c.client, c.cookies, c.cfg.Tag); err != nil {
		c.log.Warn("removing the rules on exit failed", "error", err)
		c.rulesLeft = true // the next controller with this tag takes them over
	} else {
		c.dropAll()
		c.count(func(r *Report) { r.Removed += uint64(n) })
	}
	if !c.rulesLeft {
		// DeleteTagged found every tagged rule, those of an add santad
		// took but did not answer too, unless santad is gone now
		if _, _, err := c.client.Health(); err != nil {
			c.log.Warn("santad does not answer", "error", err)
			c.rulesLeft = true
		}
	}
	follow.UnbindEmpty(c.client, c.created, c.log)
	if !c.rulesLeft {
		c.log.Info("removed the controller's rules", "rules", n)
		if err := c.claim.RecordCreated(nil); err != nil {
			c.log.Warn("recording that the rule sets this run made are unbound failed", "error", err)
		}
	}
}

// quietInterval is the longest a controller with nothing to do waits
// between scans (unless Interval is longer): a write after a quiet spell
// has its rule rebuilt within it, and then every Interval while writes go
// on. Polling every 20 ms cost an idle controller 2 % of a CPU here.
const quietInterval = 200 * time.Millisecond

// loop rebuilds retired rules every Interval (after scans that found
// nothing, it waits twice as long each time, up to quietInterval); every
// second it retries wanted keys that had no value and, in Adaptive mode,
// installs hot keys and drops idle ones; until ctx ends, a socket's watch
// ends (gone) or the link follower fails.
func (c *Controller) loop(ctx context.Context, gone <-chan error) error {
	interval := c.cfg.Interval
	tick := time.NewTimer(interval)
	defer tick.Stop()
	var linksFailed <-chan error // nil: blocks
	if c.links != nil {
		linksFailed = c.links.failed
	}
	lastSecond := time.Now()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-gone:
			return err
		case err := <-linksFailed:
			return err
		case key := <-c.samples:
			c.sampled(key)
			continue
		case now := <-tick.C:
			keys, moved, err := c.retired(now)
			if err != nil {
				return err
			}
			if moved {
				interval = c.cfg.Interval
			} else {
				interval = min(2*interval, max(quietInterval, c.cfg.Interval))
			}
			tick.Reset(c.nextScan(interval))
			if len(keys) > 0 {
				if err := c.refresh(keys); err != nil {
					return err
				}
			}
			if now.Sub(lastSecond) < time.Second {
				continue
			}
			lastSecond = now
			if err := c.everySecond(now); err != nil {
				return err
			}
		}
	}
}

// nextScan is how long to wait for the next scan: interval, or less when
// a write settles or a value expires before (never less than Interval).
func (c *Controller) nextScan(interval time.Duration) time.Duration {
	wait := interval
	if due, ok := c.settling.next(); ok {
		wait = min(wait, time.Until(due))
	}
	for b := range c.expiry { // one bucket per second with expiring values
		if b <= c.expiryAt { // this second's bucket: its values expire during it
			wait = 0
			break
		}
		wait = min(wait, time.Until(c.start.Add(time.Duration(b)*time.Second)))
	}
	return max(wait, c.cfg.Interval)
}

func (c *Controller) everySecond(now time.Time) error {
	var missing []string
	if c.cfg.Mode == Adaptive {
		if now.Sub(c.idleChecked) >= c.cfg.Idle {
			c.idleChecked = now
			if err := c.dropIdle(); err != nil {
				return err
			}
		}
		hot := c.hot.Hot(c.cfg.MinSamples)
		for _, k := range hot {
			if c.entries[k] == nil && len(c.entries)+len(missing) < c.cfg.MaxRules && c.worthFetching(k) {
				missing = append(missing, k)
			}
		}
		// forget the keys no longer hot: the map stays as small as the sketch
		if len(c.unoffloadable) > len(hot) {
			keep := make(map[string]versions, len(hot))
			for _, k := range hot {
				if v, ok := c.unoffloadable[k]; ok {
					keep[k] = v
				}
			}
			c.unoffloadable = keep
		}
		c.hot.Decay()
	} else {
		// not every wanted key: at a million keys that took 19 % of a CPU
		for _, k := range sortedKeys(c.missing) {
			if c.worthFetching(k) {
				missing = append(missing, k)
			}
		}
	}
	if c.waiting > 0 && len(missing) > 0 {
		// santad had no room for them: fetching their values is no use until rules go
		if free, err := c.room.Freed(c.client); err != nil || free == 0 {
			return err
		}
	}
	before := len(c.entries)
	err := c.install(missing)
	if n := len(c.entries) - before; n > 0 && c.cfg.Mode == Adaptive {
		c.log.Info("offloaded hot keys", "keys", n, "e.g.", strings.Join(missing[:min(len(missing), 3)], " "), "offloaded_now", len(c.entries))
	}
	return err
}

// worthFetching reports whether key is worth fetching: no fetch of it came back
// with nothing to offload, or a write has bumped its guard slot or the
// epoch since the last did (a value changes only by a write, and the
// tracker bumps for each).
func (c *Controller) worthFetching(key string) bool {
	v, ok := c.unoffloadable[key]
	return !ok || v != versions{c.guards.version(KeySlot(key)), c.guards.version(epochSlot)}
}

// dropIdle deletes the rules that answered nothing since the last check.
func (c *Controller) dropIdle() error {
	hits := map[uint64]uint64{} // rule id -> hits, over all sockets
	for _, cookie := range c.cookies {
		stats, err := c.client.Stats(santa.Cookie(cookie))
		if err != nil {
			return fmt.Errorf("rule statistics: %w", err)
		}
		for _, st := range stats {
			hits[st.ID] = st.Hits
		}
	}
	var idle []*entry
	for _, e := range c.entries {
		var n uint64
		for _, id := range e.ids {
			n += hits[id]
		}
		if n == e.hits {
			idle = append(idle, e)
		}
		e.hits = n
	}
	for _, e := range idle {
		c.hot.Forget(e.key)
	}
	return c.remove(idle)
}

// watch subscribes to every socket's miss samples: in Adaptive mode the
// keys of missed GETs go into c.samples, else the sockets are only watched
// for the server closing them.
func (c *Controller) watch(ctx context.Context) (<-chan error, error) {
	opts := follow.WatchOnly
	var each func(uint64, santa.Sample) // nil: only watched
	if c.cfg.Mode == Adaptive {
		opts = santa.SampleOptions{Bytes: uint32(longestGet), Rate: c.cfg.SampleRate}
		each = func(_ uint64, s santa.Sample) {
			if key, ok := sampledKey(s.Data, s.RequestLen); ok {
				select {
				case c.samples <- key:
				default: // busy: a sample more or less does not matter
				}
			}
		}
	}
	return follow.Watch(ctx, c.cfg.Socket, c.cookies, opts, each)
}

// longestGet is the length of a plain UDP GET of the longest key memcached
// takes: a miss sample holds it whole, else sampledKey cannot read its key.
const longestGet = len(udpHeader) + 2 + len("get ") + maxKeyLen + len("\r\n")

// sampledKey is the key of a missed plain UDP GET (the request a rule
// would answer), from its miss sample.
func sampledKey(data []byte, requestLen int) (string, bool) {
	if requestLen != len(data) || len(data) < 8+len("get x\r\n") || string(data[2:6]) != udpHeader[:4] {
		return "", false
	}
	cmd := string(data[8:])
	if !strings.HasPrefix(cmd, "get ") || !strings.HasSuffix(cmd, "\r\n") {
		return "", false
	}
	key := cmd[4 : len(cmd)-2]
	return key, validKey(key)
}

func (c *Controller) sampled(key string) {
	if c.entries[key] == nil {
		c.hot.Add(key)
	}
}

func sortedKeys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
