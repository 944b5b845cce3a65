package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf/link"
	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
	"github.com/santa-offload/santa/internal/resubscribe"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// Version is santad's release, reported by health.
const Version = "0.3.0"

// Daemon is a running santad.
type Daemon struct {
	cfg     Config
	log     *slog.Logger
	started time.Time
	// socketGID owns the control socket (socket_group), -1: left as it is
	socketGID int

	dp       *dataplane.Dataplane
	attsMu   sync.Mutex // guards atts once santad runs (watchInterfaces replaces entries)
	atts     []*dataplane.Attachment
	release  link.Link
	released *dataplane.Released
	samples  *dataplane.MissSamples
	lock     *os.File
	pinsLock *os.File // flock on the bpffs directory: one santad per bpffs too
	pinned   string   // the generation directory this instance pinned, "" before it pins
	made     []string // directories and files Start made, in order: a failed start removes them
	listener *net.UnixListener
	metrics  *metrics
	wg       sync.WaitGroup

	// A request (and a metrics scrape) is handled under requests' read
	// lock. Close sets stopping under the write lock: no request is then
	// running, and later ones are refused, so none touches the journal or
	// the data plane it closes.
	requests sync.RWMutex
	stopping bool

	mu         sync.Mutex // serializes rule-set changes and journal writes
	closed     bool       // under mu: Close closed the journal and (then) the data plane
	j          *journal
	sets       map[uint64]*ruleSet
	usage      map[uint32]*usage
	expiry     expiryQueue   // deadlines of rules with an Expires time
	expiryWake chan struct{} // an earlier deadline was queued
	stop       chan struct{} // closed when santad stops

	subMu sync.Mutex
	subs  map[uint64]map[*subscriber]struct{}

	connMu sync.Mutex
	conns  map[uint32]uint64 // open control connections per non-root uid (quota.connections)

	requestMemory *requestBudget
	userPorts     []portRange // user_ports: where non-root uids may bind sockets; empty: anywhere
}

// Pins: each santad instance pins its maps and its socket-release link in a
// generation directory of its own; the XDP links, which outlive instances,
// are pinned in links/.
func (c Config) linksDir() string             { return filepath.Join(c.BPFFS, "links") }
func (c Config) linkPin(ifname string) string { return filepath.Join(c.linksDir(), "xdp-"+ifname) }
func (c Config) genDir(n int) string          { return filepath.Join(c.BPFFS, "gen-"+strconv.Itoa(n)) }
func (c Config) journalPath() string          { return filepath.Join(c.StateDir, "journal") }
func (c Config) lockPath() string             { return filepath.Join(c.StateDir, "santad.lock") }

// generations lists the generation numbers pinned under BPFFS, oldest first.
func (c Config) generations() []int {
	ents, _ := os.ReadDir(c.BPFFS)
	var gens []int
	for _, e := range ents {
		if n, err := strconv.Atoi(strings.TrimPrefix(e.Name(), "gen-")); err == nil && strings.HasPrefix(e.Name(), "gen-") {
			gens = append(gens, n)
		}
	}
	sort.Ints(gens)
	return gens
}

// Start brings santad up. If a previous santad left its rule processor
// attached, Start rebuilds every rule set from the journal into a freshly
// loaded data plane (counters included), swaps the XDP program on the pinned
// links in one step, and only then lets go of the old one: no rule is lost
// and no packet goes unprocessed.
func Start(cfg Config, log *slog.Logger) (_ *Daemon, err error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	userPorts, _ := cfg.userPorts() // Validate parsed them
	d := &Daemon{cfg: cfg, log: log, started: time.Now(), sets: map[uint64]*ruleSet{},
		usage: map[uint32]*usage{}, subs: map[uint64]map[*subscriber]struct{}{}, conns: map[uint32]uint64{},
		requestMemory: newRequestBudget(cfg.Quota.RequestBytes), userPorts: userPorts,
		expiryWake: make(chan struct{}, 1), stop: make(chan struct{})}
	defer func() {
		if err != nil {
			d.abort()
		}
	}()
	if err := d.mkdirAll(cfg.StateDir, 0o755); err != nil {
		return nil, err
	}
	lockMade := !exists(cfg.lockPath())
	if d.lock, err = lockFile(cfg.lockPath()); err != nil {
		return nil, err
	}
	if lockMade {
		d.made = append(d.made, cfg.lockPath())
	}
	// what the configuration names must exist before anything is loaded,
	// pinned or attached: a failed start leaves the rule processor in place
	for _, name := range cfg.Interfaces {
		if _, err := dataplane.Attachable(name); err != nil {
			return nil, err
		}
		if err := dataplane.XDPFree(name, cfg.linkPin(name)); err != nil {
			return nil, err
		}
	}
	if err := cfg.checkVethEnds(); err != nil {
		return nil, err
	}
	// and the control socket's group
	d.socketGID = -1
	if cfg.SocketGroup != "" {
		if d.socketGID, err = lookupGroup(cfg.SocketGroup); err != nil {
			return nil, err
		}
	}
	// and the control socket itself, listened on (clients wait in its
	// backlog until santad is up)
	if err := d.listen(); err != nil {
		return nil, err
	}
	// and the cgroup v2 directory whose sockets' release is watched
	cgroup := cfg.Cgroup
	if cgroup == "" {
		if cgroup, err = dataplane.CgroupV2Root(); err != nil {
			return nil, err
		}
	} else {
		var st unix.Statfs_t
		if err := unix.Statfs(cgroup, &st); err != nil {
			return nil, fmt.Errorf("cgroup %s: %w", cgroup, err)
		}
		if st.Type != unix.CGROUP2_SUPER_MAGIC {
			return nil, fmt.Errorf("cgroup %s: not a directory of a cgroup v2 hierarchy", cgroup)
		}
	}
	var metricsListener net.Listener
	if cfg.Metrics != "" {
		if metricsListener, err = net.Listen("tcp", cfg.Metrics); err != nil {
			return nil, fmt.Errorf("metrics address: %w", err)
		}
		defer func() {
			if err != nil {
				metricsListener.Close()
			}
		}()
	}
	if err := dataplane.EnsureBPFFS(cfg.BPFFS); err != nil {
		return nil, err
	}
	if err := d.mkdirAll(cfg.BPFFS, 0o700); err != nil {
		return nil, err
	}
	if d.pinsLock, err = lockPins(cfg.BPFFS); err != nil {
		return nil, err
	}
	gens := cfg.generations()
	var prev *dataplane.Previous
	if len(gens) > 0 {
		if prev, err = dataplane.OpenPrevious(cfg.genDir(gens[len(gens)-1])); err != nil {
			log.Warn("previous instance's pins unreadable: its rules are dropped", "error", err)
			prev = nil
		} else {
			defer prev.Close()
		}
	}

	if d.dp, err = dataplane.Load(cfg.dataplaneConfig()); err != nil {
		return nil, err
	}
	if prev != nil {
		// the predecessor's socket-less TCP connections stay valid
		if err := d.dp.AdoptSocketless(prev); err != nil {
			d.log.Warn("previous TCP stamp keys or ports unreadable: its socket-less connections may be reset", "error", err)
		}
	}
	// Watch socket release from before the replay, so a socket closed during
	// it is not missed: the old hook covers the time before, this one after.
	if d.released, err = d.dp.OpenReleased(); err != nil {
		return nil, err
	}
	if !exists(cfg.journalPath()) { // restore writes one
		d.made = append(d.made, cfg.journalPath())
	}
	if d.release, err = d.dp.AttachReleaseHook(cgroup); err != nil {
		return nil, err
	}
	expired, err := d.restore(prev)
	if err != nil {
		return nil, err
	}
	next := 1
	if len(gens) > 0 {
		next = gens[len(gens)-1] + 1
	}
	if err := d.pin(cfg.genDir(next)); err != nil {
		return nil, err
	}
	if d.samples, err = d.dp.OpenMissSamples(); err != nil {
		return nil, err
	}
	interfaces, err := d.subscribeInterfaces()
	if err != nil {
		return nil, err
	}
	if prev != nil {
		if err := d.dp.CarryCounters(prev); err != nil {
			log.Warn("previous rule processor counters unreadable: santa_dataplane_events_total restarts at zero", "error", err)
		}
	}
	// the TCP flows (replies in flight), in this data plane's coordinates:
	// before the swap, and what the predecessor did meanwhile right after
	before, carryErr := d.dp.CarryFlows(prev)
	if carryErr != nil {
		log.Warn("could not carry the TCP flows over: replies in flight are gone "+
			"(a client holding part of one is answered anew at the wrong place)", "error", carryErr)
	}
	// Attaching is the last step that may fail, and undoes itself if it
	// does: a failed start leaves the interfaces, and the predecessor's
	// pins, as they were.
	if err := d.attach(); err != nil {
		interfaces.End()
		return nil, err
	}
	if carryErr == nil {
		after, err := d.dp.CarryFlows(prev)
		if err != nil {
			log.Warn("could not carry over the TCP flows the previous rule processor changed during the swap", "error", err)
		}
		if n := before.Flows + after.Flows; n > 0 {
			log.Info("TCP flows carried over", "flows", n, "replies_in_flight", before.InFlight+after.InFlight,
				"replies_gone", before.Gone+after.Gone)
		}
		// the second pass tried again each flow the first had no room for
		if after.Left > 0 {
			log.Warn("the TCP flow table is too small for the previous rule processor's flows: the least recently active "+
				"were left behind (their connections' next requests start new flows, or go to the kernel; raise dataplane.tcp_flows)",
				"flows_left", after.Left, "replies_in_flight_left", after.LeftInFlight, "size", d.dp.Config().TCPFlows)
		}
	}
	if err := d.dp.PublishFlows(); err != nil {
		// the error says which: socket-less TCP still held back, or the
		// table not pinned for the next santad
		log.Error("could not finish taking the TCP flow table over", "error", err)
	}
	d.detachUnconfigured()
	if prev != nil && len(d.sets) > 0 {
		d.carryStats(prev, expired)
	}
	for _, g := range gens {
		if err := dataplane.Unpin(cfg.genDir(g)); err != nil {
			log.Warn("could not remove an old generation's pins", "dir", cfg.genDir(g), "error", err)
		}
	}
	d.metrics = newMetrics(d)
	d.wg.Add(5)
	go d.acceptLoop()
	go d.watchReleased()
	go d.dispatchSamples()
	go d.expireLoop()
	go d.watchInterfaces(interfaces)
	if metricsListener != nil {
		d.metrics.serve(metricsListener)
	}
	if len(cfg.Interfaces) == 0 {
		log.Warn("no interfaces configured: the rule processor answers nothing until santad runs with --interface or the config's interfaces")
	}
	u := d.dp.Usage()
	log.Info("santad started", "version", Version, "generation", next, "interfaces", cfg.Interfaces,
		"sockets", u.Rulesets, "rules", u.Rules, "socket", cfg.Socket, "metrics", cfg.Metrics)
	return d, nil
}

// checkVethEnds refuses both ends of one veth among the interfaces when
// santad would give the other end of each PeerPassName: attaching to the
// first would put that program on the second, which then has no room for
// the rule processor.
func (c Config) checkVethEnds() error {
	if c.xdpMode() == dataplane.AttachGeneric || !c.VethPeerPass {
		return nil
	}
	for i, name := range c.Interfaces {
		peer, err := dataplane.VethPeerHere(name)
		if err != nil {
			return err
		}
		if peer != "" && slices.Contains(c.Interfaces[i+1:], peer) {
			return fmt.Errorf("interfaces %s and %s are the two ends of one veth: santad gives the other end of a veth it attaches to "+
				"the native-mode XDP program the rule processor's replies need there (%s), so it takes one end; give it the end "+
				"clients' requests arrive on (to attach to both, set veth_peer_pass: false, and the rule processor on each end "+
				"is that program for the other, or xdp_mode: generic)", name, peer, dataplane.PeerPassName)
		}
	}
	return nil
}

// restore rebuilds the rule sets of the journal whose sockets are still
// open, and returns the ids of the rules it left out because their time
// came while no santad ran, by socket.
func (d *Daemon) restore(prev *dataplane.Previous) (expiredRules map[uint64][]dataplane.RuleID, _ error) {
	removed, err := removeCompactionLeftovers(d.cfg.journalPath())
	if len(removed) > 0 {
		d.log.Warn("removed the files of journal compactions a killed santad left unfinished", "files", removed)
	}
	if err != nil {
		d.log.Warn("cannot remove the files of journal compactions a killed santad left unfinished", "error", err)
	}
	records, torn, err := readJournal(d.cfg.journalPath())
	if damaged := (*damagedJournal)(nil); errors.As(err, &damaged) {
		d.log.Error("journal damaged: santad does not start, and leaves the journal as it is", "file", damaged.path,
			"record", damaged.record, "offset", damaged.offset, "reason", damaged.reason,
			"bytes_following", damaged.following, "intact_records_following", damaged.intactRecords)
	}
	if err != nil {
		return nil, err
	}
	if torn.bytes > 0 {
		d.log.Warn("journal ends in an incomplete record, a change santad died writing and never acknowledged: dropped",
			"file", d.cfg.journalPath(), "offset", torn.offset, "bytes", torn.bytes)
	}
	sets, lastID, err := replay(records)
	if err != nil {
		return nil, err
	}
	d.dp.SkipIDs(dataplane.RuleID(lastID))
	t0 := time.Now()
	var dropped, expired, rules int
	expiredRules = map[uint64][]dataplane.RuleID{}
	cookies := make([]uint64, 0, len(sets))
	for c := range sets {
		cookies = append(cookies, c)
	}
	sort.Slice(cookies, func(i, j int) bool { return cookies[i] < cookies[j] })
	for _, cookie := range cookies {
		rs := sets[cookie]
		if prev == nil || !prev.Alive(cookie) {
			dropped++ // its socket closed while no santad ran (or the pins are gone)
			continue
		}
		if err := d.dp.Bind(dataplaneSocket(rs.info), rs.sample); err != nil {
			return nil, fmt.Errorf("restore socket %d: %w", cookie, err)
		}
		if !prev.Alive(cookie) { // closed between the check and the bind: the old hook saw it
			d.dp.Unbind(cookie)
			dropped++
			continue
		}
		infos, gone := rs.ruleInfos(time.Now())
		expired += len(gone)
		expiredRules[cookie] = gone
		if err := d.dp.RestoreRules(cookie, infos); err != nil {
			return nil, fmt.Errorf("restore %d rules of socket %d: %w", len(infos), cookie, err)
		}
		if err := d.dp.CarryGoneStats(cookie, rs.gone); err != nil {
			return nil, err
		}
		set := &ruleSet{info: rs.info, sample: rs.sample, rules: map[uint64]ruleMeta{}}
		restored := make([]api.Rule, len(infos))
		for i, ri := range infos {
			restored[i] = fromDataplane(ri)
			restored[i].Tag = rs.rules[uint64(ri.ID)].Tag
			uid := rs.chargedUID(uint64(ri.ID))
			set.addRules(d.usageOf(uid), uid, restored[i:i+1])
		}
		d.usageOf(rs.info.Owner).rulesets++
		d.sets[cookie] = set
		d.scheduleExpiry(cookie, restored)
		rules += len(infos)
	}
	if len(sets) > 0 {
		d.log.Info("rule sets restored from the journal", "sockets", len(d.sets), "rules", rules,
			"dropped_closed_sockets", dropped, "dropped_expired_rules", expired, "took", time.Since(t0).String())
	}
	return expiredRules, d.compact()
}

// carryStats adds the counts of the previous instance, read once its
// program is swapped out and its last runs (microseconds each) are over.
// The counts of expiredRules, left out by restore, go to their sockets'
// totals of rules gone, and to the journal.
func (d *Daemon) carryStats(prev *dataplane.Previous, expiredRules map[uint64][]dataplane.RuleID) {
	time.Sleep(10 * time.Millisecond)
	base, err := prev.RuleStats()
	if err != nil {
		d.log.Warn("previous counters unreadable: rule statistics restart at zero", "error", err)
		return
	}
	d.dp.CarryStats(base)
	for cookie, ids := range expiredRules {
		var counted dataplane.RuleStats
		for _, id := range ids {
			counted.Hits += base[id].Hits
			counted.Bytes += base[id].Bytes
		}
		rs, ok := d.sets[cookie]
		if !ok || counted == (dataplane.RuleStats{}) {
			continue
		}
		if err := d.dp.CarryGoneStats(cookie, counted); err != nil {
			d.log.Warn("could not keep the counts of expired rules in their socket's totals", "socket", cookie, "error", err)
			continue
		}
		if err := d.record(bindRecord(rs, d.goneRecord(rs)), nil); err != nil {
			d.log.Warn("could not journal the counts of expired rules: a restart drops them from their socket's totals",
				"socket", cookie, "error", err)
		}
	}
}

// bindRecord is the journal record of rs's binding, with the total of its
// rules gone (goneRecord).
func bindRecord(rs *ruleSet, gone []api.RuleStats) *api.Message {
	return &api.Message{Op: api.OpBind, Sockets: []api.SocketInfo{rs.info},
		SampleBytes: uint32(rs.sample.Bytes), SampleRate: uint32(rs.sample.PerSecond), Stats: gone}
}

// compactBatch is how many rules one add record of a compacted journal
// holds at most: a record must fit a frame (api.MaxFrame), which listRules
// also sees to for rules of any size.
const compactBatch = 16384

// compact rewrites the journal as the largest rule id given out, then one
// bind per rule set and its rules as adds of up to compactBatch rules each,
// one per run of rules charged to the same uid.
func (d *Daemon) compact() error {
	var records []*api.Message
	if last := d.dp.LastID(); last != 0 {
		records = append(records, idMark(uint64(last)))
	}
	for cookie, rs := range d.sets {
		records = append(records, bindRecord(rs, d.goneRecord(rs)))
		page := &api.Message{Limit: compactBatch}
		for {
			rules, more, err := d.listRules(rs, page)
			if err != nil {
				return err
			}
			if len(rules) > 0 {
				page.After = rules[len(rules)-1].ID
			}
			for len(rules) > 0 { // an add record per run of rules charged to one uid
				uid := rs.rules[rules[0].ID].charged
				n := 1
				for n < len(rules) && rs.rules[rules[n].ID].charged == uid {
					n++
				}
				records = append(records, &api.Message{Op: api.OpAdd, Socket: cookie, Rules: rules[:n], Daemon: chargeRecord(rs, uid)})
				rules = rules[n:]
			}
			if !more {
				break
			}
		}
	}
	j, err := writeJournal(d.cfg.journalPath(), records)
	if err != nil {
		return err
	}
	if d.j != nil {
		d.j.close()
	}
	d.j = j
	return nil
}

func (d *Daemon) usageOf(uid uint32) *usage {
	u, ok := d.usage[uid]
	if !ok {
		u = &usage{}
		d.usage[uid] = u
	}
	return u
}

// attach puts the rule processor on the configured interfaces, swapping it
// in on links a previous instance pinned; all or none.
func (d *Daemon) attach() error {
	if err := os.MkdirAll(d.cfg.linksDir(), 0o700); err != nil {
		return err
	}
	atts, err := d.dp.AttachPinnedAll(d.cfg.Interfaces, d.cfg.xdpMode(), d.cfg.linkPin)
	d.atts = atts
	return err
}

// detachUnconfigured detaches the rule processor from the interfaces a
// previous instance left it on that are no longer configured.
func (d *Daemon) detachUnconfigured() {
	want := map[string]bool{}
	for _, att := range d.atts {
		for _, pin := range att.Pins() { // the XDP link and the TC handover's
			want[filepath.Base(pin)] = true
		}
	}
	ents, _ := os.ReadDir(d.cfg.linksDir())
	for _, e := range ents {
		if want[e.Name()] {
			continue
		}
		path := filepath.Join(d.cfg.linksDir(), e.Name())
		if l, err := link.LoadPinnedLink(path, nil); err == nil {
			l.Unpin()
			l.Close()
			d.log.Info("detached from an interface no longer configured", "pin", path)
		}
	}
}

// subscribeInterfaces subscribes to the changes of santad's network
// namespace's interfaces.
func (d *Daemon) subscribeInterfaces() (*resubscribe.Subscription[netlink.LinkUpdate], error) {
	return resubscribe.Subscribe(d.log, "interface updates", "the interfaces",
		func(updates chan<- netlink.LinkUpdate, done <-chan struct{}, onError func(error)) error {
			return netlink.LinkSubscribeWithOptions(updates, done, netlink.LinkSubscribeOptions{ErrorCallback: onError})
		})
}

// watchInterfaces follows the configured interfaces by name: the kernel
// detaches XDP from one that is removed (a container's veth, a NIC
// unplugged), santad detaches it from one renamed or moved to another
// network namespace, and an interface that takes the name again (created
// anew, or renamed back) gets the rule processor back. Meanwhile their
// requests reach the applications, as without Santa. If the subscription to interface changes ends, santad
// subscribes again and catches up with the changes it missed.
func (d *Daemon) watchInterfaces(interfaces *resubscribe.Subscription[netlink.LinkUpdate]) {
	defer d.wg.Done()
	d.followInterfaces("") // changed between attach and the subscription
	interfaces.Follow(d.stop,
		func(u netlink.LinkUpdate) { d.followInterfaces(u.Link.Attrs().Name) },
		func() { d.followInterfaces("") })
}

// followInterfaces brings the attachments in line with the interfaces as
// they are now (an event may be older than the interface it names, renamed
// again since): it lets go of those whose interface is gone, renamed or
// moved, and attaches the rule processor again to the configured interface
// named changed ("": every one) if an interface has that name now.
func (d *Daemon) followInterfaces(changed string) {
	d.attsMu.Lock()
	d.letGoOfLostLocked()
	var back []int
	for i, a := range d.atts {
		if a.Closed() && (changed == "" || changed == a.Interface) {
			back = append(back, i)
		}
	}
	d.attsMu.Unlock()
	for _, i := range back {
		name := d.atts[i].Interface // the watcher alone replaces entries
		if _, err := netlink.LinkByName(name); err != nil {
			continue // not back yet
		}
		att, err := d.dp.AttachPinned(name, d.cfg.xdpMode(), d.cfg.linkPin(name))
		if err != nil {
			d.log.Error("interface is back, but the rule processor could not be attached to it", "interface", name, "error", err)
			continue
		}
		d.attsMu.Lock()
		d.atts[i] = att
		d.attsMu.Unlock()
		d.log.Info("interface is back: rule processor attached again", "interface", name, "native", att.Native)
	}
}

// letGoOfLostLocked closes every attachment whose interface was removed
// (the kernel detached XDP with it; another interface may have its index
// now) and detaches the rule processor from every interface renamed or
// moved to another network namespace since it was attached: santad
// attaches by name, in its own namespace. The watcher calls it on link
// events and health before it reports, so that status never calls removed
// an interface that the rule processor still answers on, nor attached one
// it no longer is on, while the watcher is busy. Called with attsMu held.
func (d *Daemon) letGoOfLostLocked() {
	for _, a := range d.atts {
		switch {
		case a.Closed():
		case a.InterfaceGone():
			args := []any{"interface", a.Interface}
			if err := a.Close(); err != nil {
				args = append(args, "close_error", err)
			}
			d.log.Warn("interface removed: its requests go to the applications until it is back", args...)
		default:
			// one request for the index (net.InterfaceByIndex dumps every
			// interface, on every link event of a host with many)
			l, err := netlink.LinkByIndex(a.Ifindex())
			switch {
			case errors.As(err, new(netlink.LinkNotFoundError)):
				// the kernel still has santad's XDP link on it (not
				// InterfaceGone), so it went to another network namespace
				// (or is being removed this instant): the pinned link would
				// keep the rule processor there and off a new interface of
				// its name here
				args := []any{"interface", a.Interface}
				if err := a.Detach(); err != nil {
					args = append(args, "detach_error", err)
				}
				d.log.Warn("interface left santad's network namespace: rule processor detached from it; its requests go to the applications until an interface of its name appears here", args...)
			case err != nil || l.Attrs().Name == a.Interface:
				continue // still so named, or not asked
			default:
				args := []any{"interface", a.Interface, "new_name", l.Attrs().Name}
				if err := a.Detach(); err != nil {
					args = append(args, "detach_error", err)
				}
				d.log.Warn("interface renamed: rule processor detached from it; its requests go to the applications until an interface of its old name appears", args...)
			}
		}
	}
}

// pin pins the data plane and the release hook in dir; abort removes them.
func (d *Daemon) pin(dir string) error {
	d.pinned = dir
	if err := d.dp.Pin(dir); err != nil {
		return err
	}
	return d.release.Pin(filepath.Join(dir, "release_link"))
}

// listen opens the control socket with the configured permissions;
// Start's acceptLoop serves it.
func (d *Daemon) listen() error {
	path := d.cfg.Socket
	if max := len(unix.RawSockaddrUnix{}.Path) - 1; len(path) > max {
		return fmt.Errorf("control socket %s: longer than the %d bytes of a Unix socket's path", path, max)
	}
	if err := d.mkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if err := removeStaleSocket(path); err != nil {
		return err
	}
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	l.SetUnlinkOnClose(false) // a successor may already listen on the path
	d.listener = l
	if claims := api.ClaimsDir(path); !exists(claims) {
		d.made = append(d.made, claims)
	}
	if err := api.MakeClaimsDir(path); err != nil {
		return fmt.Errorf("controllers' directory: %w", err)
	}
	mode, _ := d.cfg.socketMode()
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	if d.socketGID >= 0 {
		if err := os.Chown(path, 0, d.socketGID); err != nil {
			return err
		}
	}
	return nil
}

// removeStaleSocket removes the socket a previous santad of this state
// directory left at path (the lock says none runs), and refuses to remove
// anything else: a file or directory that is not a socket, or the socket
// of a process that listens on it (another santad's, with another state
// directory).
func removeStaleSocket(path string) error {
	st, err := os.Lstat(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("control socket: %w", err)
	}
	if st.Mode().Type() != os.ModeSocket {
		return fmt.Errorf("control socket %s: exists and is not a socket (%v): remove it or give santad another --socket", path, st.Mode().Type())
	}
	if c, err := net.Dial("unix", path); err == nil {
		c.Close()
		return fmt.Errorf("control socket %s: another process listens on it (another santad, with another state directory?): stop it or give santad another --socket", path)
	}
	return os.Remove(path)
}

// Wait blocks until ctx is done, then shuts santad down gracefully.
func (d *Daemon) Wait(ctx context.Context) error {
	<-ctx.Done()
	return d.Close()
}

// Close stops santad but leaves the rule processor attached and its state
// pinned: rules keep answering until the next santad takes over.
func (d *Daemon) Close() error {
	close(d.stop)
	d.listener.Close()
	d.requests.Lock()
	d.stopping = true
	d.requests.Unlock()
	d.released.Close()
	d.samples.Close()
	d.metrics.close()
	d.subMu.Lock()
	for cookie := range d.subs {
		d.closeSubscribersLocked(cookie)
	}
	d.subMu.Unlock()
	d.wg.Wait()
	for _, a := range d.atts {
		a.Release()
	}
	d.release.Close() // its pin keeps it attached
	d.mu.Lock()
	d.closed = true // sample streams that end later leave the data plane alone
	err := d.j.close()
	d.mu.Unlock()
	d.dp.Close()
	d.pinsLock.Close()
	d.lock.Close()
	d.log.Info("santad stopped; the rule processor stays attached until the next santad takes over")
	return err
}

// abort undoes a failed Start, which attached nothing (attach undoes
// itself): it removes the control socket, the pins and the directories,
// lock and journal Start made, and leaves a previous instance's alone.
func (d *Daemon) abort() {
	close(d.stop)
	if d.listener != nil {
		d.listener.Close()
		os.Remove(d.cfg.Socket)
	}
	if d.pinned != "" {
		if err := dataplane.Unpin(d.pinned); err != nil {
			d.log.Warn("could not remove the pins of the failed start", "dir", d.pinned, "error", err)
		}
		os.Remove(d.cfg.linksDir()) // if attach made it: a previous instance's links keep it
	}
	if d.release != nil {
		d.release.Close()
	}
	if d.released != nil {
		d.released.Close()
	}
	if d.samples != nil {
		d.samples.Close()
	}
	if d.dp != nil {
		if err := d.dp.UnpinFresh(); err != nil {
			d.log.Warn("could not remove the shared maps the failed start pinned", "error", err)
		}
		d.dp.Close()
	}
	if d.j != nil {
		d.j.close()
	}
	if d.pinsLock != nil {
		d.pinsLock.Close()
	}
	// what it made, innermost first; a directory only if empty: a
	// controller may have claimed a tag meanwhile
	for _, path := range slices.Backward(d.made) {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			d.log.Warn("could not remove what the failed start made", "path", path, "error", err)
		}
	}
	if d.lock != nil {
		d.lock.Close()
	}
}

// mkdirAll makes dir and its missing parents, as os.MkdirAll, and
// remembers those it made for abort.
func (d *Daemon) mkdirAll(dir string, mode os.FileMode) error {
	var missing []string
	for p := filepath.Clean(dir); !exists(p); p = filepath.Dir(p) {
		missing = append(missing, p)
		if p == filepath.Dir(p) {
			break
		}
	}
	if err := os.MkdirAll(dir, mode); err != nil {
		return err
	}
	for _, p := range slices.Backward(missing) {
		d.made = append(d.made, p)
	}
	return nil
}

// exists says whether path names anything (a dangling link too); a path
// it cannot tell about counts as there, which a failed start leaves alone.
func exists(path string) bool {
	_, err := os.Lstat(path)
	return !errors.Is(err, os.ErrNotExist)
}

// Cleanup detaches the rule processor and removes every pin and the state
// santad keeps: for uninstalling, and for tests. It returns what it
// removed, one line each, for santad cleanup to say.
func Cleanup(cfg Config) (removed []string, cerr error) {
	var errs []error
	did := func(what string, err error) {
		if err != nil {
			errs = append(errs, err)
		} else {
			removed = append(removed, what)
		}
	}
	// never under a running santad, which would go on without its journal
	lockThere := exists(cfg.lockPath())
	if lock, err := lockFile(cfg.lockPath()); err == nil {
		// removed last, still held: nothing of santad's is left in the state directory
		defer func() {
			err := os.Remove(cfg.lockPath())
			if err == nil && lockThere { // else this call made it
				removed = append(removed, "removed the lock "+cfg.lockPath())
			}
			cerr = errors.Join(cerr, err, lock.Close())
		}()
	} else if !errors.Is(err, os.ErrNotExist) { // no state directory: no santad
		return nil, err
	}
	// nor under a santad of another state directory that pins there
	if pins, err := lockPins(cfg.BPFFS); err == nil {
		defer pins.Close()
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	ents, _ := os.ReadDir(cfg.linksDir())
	for _, e := range ents {
		if l, err := link.LoadPinnedLink(filepath.Join(cfg.linksDir(), e.Name()), nil); err == nil {
			// the rule processor first: without the peer's program its
			// replies would be dropped until it is gone
			ifname := strings.TrimPrefix(e.Name(), "xdp-")
			peer := peerPassOf(l, ifname)
			did("detached the rule processor from "+ifname, errors.Join(l.Unpin(), l.Detach(), l.Close()))
			if peer != 0 {
				did("removed "+dataplane.PeerPassName+" from the other end of "+ifname, dataplane.RemovePeerPass(peer))
			}
		}
	}
	for _, g := range cfg.generations() {
		did("removed the pins of generation "+strconv.Itoa(g)+" in "+cfg.genDir(g), dataplane.Unpin(cfg.genDir(g)))
	}
	for _, p := range [][2]string{{"the pin directory", cfg.BPFFS}, {"the journal", cfg.journalPath()},
		{"the control socket", cfg.Socket}} {
		if exists(p[1]) {
			did("removed "+p[0]+" "+p[1], os.RemoveAll(p[1]))
		}
	}
	claims, err := removeClaims(api.ClaimsDir(cfg.Socket))
	for _, c := range claims {
		did("removed "+c, nil)
	}
	errs = append(errs, err)
	leftovers, err := removeCompactionLeftovers(cfg.journalPath())
	for _, l := range leftovers {
		did("removed the unfinished journal compaction "+l, nil)
	}
	errs = append(errs, err)
	return removed, errors.Join(errs...)
}

// removeClaims removes the controllers' claim files in dir that no
// controller holds (a controller leaves its file when it ends), and dir
// once it is empty, and returns what it removed; a running controller
// keeps its claim.
func removeClaims(dir string) (removed []string, _ error) {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	} else if err != nil {
		return nil, err
	}
	var errs []error
	gone := func(path string, err error) {
		if err == nil {
			removed = append(removed, path)
		}
		errs = append(errs, err)
	}
	for _, e := range ents {
		path := filepath.Join(dir, e.Name())
		if e.Type().IsRegular() {
			// O_NONBLOCK and O_NOFOLLOW: another user may have swapped in a fifo or a symlink
			f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW, 0)
			if err != nil {
				errs = append(errs, err)
				continue
			}
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err == nil {
				gone(path, os.Remove(path))
			} else if !errors.Is(err, unix.EWOULDBLOCK) { // held: a controller runs
				errs = append(errs, err)
			}
			errs = append(errs, f.Close())
			continue
		}
		gone(path, os.RemoveAll(path)) // nothing a controller made (RemoveAll follows no link)
	}
	if err := os.Remove(dir); err == nil {
		removed = append(removed, dir)
	} else if !errors.Is(err, unix.ENOTEMPTY) && !errors.Is(err, unix.EEXIST) {
		errs = append(errs, err)
	}
	return removed, errors.Join(errs...)
}

// peerPassOf is the ifindex of the interface XDP link l is attached to, for
// removing the program santad gave its veth peer (dataplane.PeerPassName),
// if l is attached to ifname; 0 if none: an ifindex only names ifname in
// santad's network namespace, where cleanup is to run.
func peerPassOf(l link.Link, ifname string) int {
	info, err := l.Info()
	if err != nil || info.XDP() == nil || info.XDP().Ifindex == 0 {
		return 0 // no XDP link, or attached nowhere
	}
	ifindex := int(info.XDP().Ifindex)
	if !interfaceNamed(ifindex, ifname) {
		slog.Warn("interface of a pinned XDP link not found in this network namespace: run cleanup in santad's to remove the program santad gave its veth peer",
			"interface", ifname, "ifindex", ifindex)
		return 0
	}
	return ifindex
}

// interfaceNamed says whether ifindex is the interface ifname in santad's
// network namespace (not one removed, renamed or of another namespace).
func interfaceNamed(ifindex int, ifname string) bool {
	iface, err := net.InterfaceByIndex(ifindex)
	return err == nil && iface.Name == ifname
}

// lockPins takes an exclusive lock on the bpffs directory dir: a santad of
// another state directory pinning there would take this one's pins for a
// predecessor's, detach the rule processor from this one's interfaces and
// remove its maps (and its cleanup would remove them all).
func lockPins(dir string) (*os.File, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another santad, of another state_dir, pins at %s: give each santad a bpffs directory of its own (%w)", dir, err)
	}
	return f, nil
}

// lockFile takes an exclusive lock so that only one santad runs per state directory.
func lockFile(path string) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, err
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("another santad holds %s: stop it first (%w)", path, err)
	}
	return f, nil
}
