package dataplane

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// ErrNotBound is returned for a socket that has no rule set.
var ErrNotBound = errors.New("socket has no rule set")

// SampleOptions configures the miss samples of one rule set.
type SampleOptions struct {
	Bytes     int // request bytes per sample, 0 turns sampling off, at most MaxSample
	PerSecond int // samples per second and CPU
}

type ruleset struct {
	cookie     uint64
	port       uint16 // the local port of the socket, in santa_ports' sets portSets(rs.sock(), rs.sample)
	protocol   uint8
	id         uint32
	regions    []region
	buckets    bucketRange
	disjoint   *disjointSet // while flagDisjoint is set
	flags      uint32
	generation uint32
	rules      []*installed // in insertion order
	sample     SampleOptions
	gone       RuleStats // what rules no longer in the set counted (SocketStats)
}

type installed struct {
	id      RuleID
	version uint32
	owner   *ruleset
	src     packedRule // what the caller gave, for listings
	rule    *compiledRule
	slot    uint32
	bucket  uint32
	region  region
	regionN int // region's index in the rule set's regions
	hash    uint32
	data    dataRef
	order   uint32
}

// Bind gives the socket an empty rule set.
func (d *Dataplane) Bind(sock Socket, sample SampleOptions) error {
	if err := sock.check(); err != nil {
		return err
	}
	if err := checkSample(sample); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	cookie := sock.Cookie
	if _, ok := d.bySocket[cookie]; ok {
		return fmt.Errorf("socket %#x already has a rule set", cookie)
	}
	// santa_sockets holds MaxRulesets entries; the id allocator has room for more
	if len(d.bySocket) >= d.cfg.MaxRulesets {
		return fmt.Errorf("%w: rule sets: all %d in use; raise santad's dataplane.max_rulesets", ErrFull, d.cfg.MaxRulesets)
	}
	rs := &ruleset{cookie: cookie, port: sock.Port, protocol: sock.Protocol, sample: sample}
	id, buckets, err := d.writeRuleset(rs, nil, 0, 0)
	if err != nil {
		return err
	}
	rs.id, rs.buckets, rs.generation = id, buckets, 1
	if sock.Protocol == unix.IPPROTO_TCP {
		// for good: a socket-less connection outlives its rule set, and TC
		// hands it over to the kernel (docs/tcp.md)
		if err := d.setPortBit(portsTCPSeen, sock.Port, true); err != nil {
			d.rsIDs.put(id)
			return fmt.Errorf("bind socket %#x: %w", cookie, err)
		}
	}
	sets := portSets(sock, sample)
	if err := d.countPorts(sets, sock.Port, 1); err != nil {
		d.rsIDs.put(id)
		return fmt.Errorf("bind socket %#x: %w", cookie, err)
	}
	if err := d.objs.SantaSockets.Update(cookie, id, ebpf.UpdateNoExist); err != nil {
		d.countPorts(sets, sock.Port, -1)
		d.rsIDs.put(id)
		return fmt.Errorf("bind socket %#x: %w", cookie, err)
	}
	d.socketsChanged()
	d.bySocket[cookie] = rs
	return nil
}

// socketsChanged follows every change of santa_sockets: the program's
// per-CPU copies of its answers (socket_ruleset_id) expire. Atomic, as the
// release hook's.
func (d *Dataplane) socketsChanged() {
	d.gens.add64(uint32(santaSantaLimitSANTA_GEN_SOCKETS), 0, 1)
}

// sock is the socket the rule set belongs to.
func (rs *ruleset) sock() Socket {
	return Socket{Cookie: rs.cookie, Protocol: rs.protocol, Port: rs.port}
}

func checkSample(s SampleOptions) error {
	if s.Bytes < 0 || s.Bytes > MaxSample {
		return fmt.Errorf("sample bytes %d: must be between 0 and %d", s.Bytes, MaxSample)
	}
	if s.PerSecond < 0 {
		return fmt.Errorf("samples per second %d: must not be negative", s.PerSecond)
	}
	return nil
}

// Released says whether the socket of a bound rule set has closed: the
// release hook has taken it out of the socket map, and its cookie is on
// its way to Released.Read.
func (d *Dataplane) Released(cookie uint64) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if _, ok := d.bySocket[cookie]; !ok {
		return false
	}
	var id uint32
	return errors.Is(d.objs.SantaSockets.Lookup(cookie, &id), ebpf.ErrKeyNotExist)
}

// Unbind removes the socket's rule set and all its rules.
func (d *Dataplane) Unbind(cookie uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	rs, ok := d.bySocket[cookie]
	if !ok {
		return fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	// the release hook deletes a closed socket's entry itself
	if err := d.objs.SantaSockets.Delete(cookie); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("unbind socket %#x: %w", cookie, err)
	}
	d.socketsChanged()
	for _, r := range rs.rules {
		d.uninstall(r)
	}
	d.rsIDs.put(rs.id)
	delete(d.bySocket, cookie)
	// a bit left set only costs its port's requests a socket lookup
	return d.countPorts(portSets(rs.sock(), rs.sample), rs.port, -1)
}

// Bound lists the cookies of the sockets that have rule sets.
func (d *Dataplane) Bound() []uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	cookies := make([]uint64, 0, len(d.bySocket))
	for c := range d.bySocket {
		cookies = append(cookies, c)
	}
	slices.Sort(cookies)
	return cookies
}

// AddRules installs rules for the socket, all or none: the rule processor
// sees either none of them or all of them.
func (d *Dataplane) AddRules(cookie uint64, rules []Rule) ([]RuleID, error) {
	rs, compiled, unlock, err := d.prepare(cookie, rules)
	if err != nil {
		return nil, err
	}
	defer unlock()
	news := d.newInstalled(rs, rules, compiled)
	if err := d.add(rs, news); err != nil {
		return nil, err
	}
	return ids(news), nil
}

// RestoreRules installs rules a previous instance of the data plane had,
// with their IDs and versions, all or none like AddRules. Their statistics
// start at zero until CarryStats adds the previous instance's. Rules added
// later get IDs larger than all of these.
func (d *Dataplane) RestoreRules(cookie uint64, rules []RuleInfo) error {
	if len(rules) == 0 {
		return nil
	}
	src := make([]Rule, len(rules))
	for i, r := range rules {
		src[i] = r.Rule
	}
	rs, compiled, unlock, err := d.prepare(cookie, src)
	if err != nil {
		return err
	}
	defer unlock()
	last := RuleID(0) // insertion order stays ascending ID order (VisitRules)
	if n := len(rs.rules); n > 0 {
		last = rs.rules[n-1].id
	}
	for _, r := range rules {
		if r.ID == 0 || r.Version == 0 {
			return fmt.Errorf("rule %d version %d: IDs and versions start at 1", r.ID, r.Version)
		}
		if _, ok := d.byID[r.ID]; ok {
			return fmt.Errorf("rule %d is installed already", r.ID)
		}
		if r.ID <= last {
			return fmt.Errorf("rule %d comes after rule %d: restore a socket's rules in ascending ID order, after those it has", r.ID, last)
		}
		last = r.ID
	}
	news := d.newInstalled(rs, src, compiled)
	for i, r := range rules {
		news[i].id, news[i].version = r.ID, r.Version
	}
	if err := d.add(rs, news); err != nil {
		return err
	}
	for _, r := range rules {
		d.lastID = max(d.lastID, r.ID)
	}
	return nil
}

// LastID is the largest rule ID given out or restored so far.
func (d *Dataplane) LastID() RuleID {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastID
}

// SkipIDs makes rules added later get IDs larger than last: a previous
// instance gave out IDs up to last, also to rules since gone, and a client
// or a metrics series may still name them.
func (d *Dataplane) SkipIDs(last RuleID) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.lastID = max(d.lastID, last)
}

// CarryStats adds what a previous instance counted (see
// Previous.RuleStats) to the installed rules with those IDs; other IDs are
// ignored. A restart calls it once the previous program no longer runs, so
// that no answer is left uncounted.
func (d *Dataplane) CarryStats(prev map[RuleID]RuleStats) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for id, s := range prev {
		if r, ok := d.byID[id]; ok {
			d.setBase(r.slot, baseOf(d.bases, r.slot).add(s))
		}
	}
}

// RuleUpdate is a new version of an installed rule.
type RuleUpdate struct {
	ID   RuleID
	Rule Rule
}

// ModifyRules replaces rules of the socket by new versions, all or none. A
// modified rule keeps its ID, its place among rules of equal priority and
// its statistics; its version goes up by one. A request sees either the old
// or the new version of a rule, never neither. If any ID is not one of the
// socket's rules nothing changes.
func (d *Dataplane) ModifyRules(cookie uint64, updates []RuleUpdate) error {
	if len(updates) == 0 {
		return nil
	}
	src := make([]Rule, len(updates))
	for i, u := range updates {
		src[i] = u.Rule
	}
	rs, compiled, unlock, err := d.prepare(cookie, src)
	if err != nil {
		return err
	}
	defer unlock()
	news := map[RuleID]*installed{}
	at := make([]int, len(updates)) // where each rule is in rs.rules
	fresh, replaced := make([]*installed, len(updates)), make([]*installed, len(updates))
	for i, u := range updates {
		var ok bool
		if at[i], ok = rs.index(u.ID); !ok {
			return fmt.Errorf("rule %d is not a rule of socket %#x", u.ID, cookie)
		}
		if news[u.ID] != nil {
			return fmt.Errorf("rule %d is modified twice", u.ID)
		}
		o := rs.rules[at[i]]
		n := &installed{id: o.id, version: o.version + 1, owner: rs, src: packRule(u.Rule), rule: compiled[i], order: o.order}
		news[u.ID], fresh[i], replaced[i] = n, n, o
	}
	if err := d.linkInPlace(rs, fresh, replaced); err != nil {
		// the new versions do not suit the rule set's regions: rebuild it
		all := slices.Clone(rs.rules)
		for i, n := range fresh {
			all[at[i]] = n
		}
		return d.rebuild(rs, all)
	}
	for i, n := range fresh {
		rs.rules[at[i]] = n
	}
	// the new versions are visible: retire the old ones, handing on their counts
	d.retire(replaced, news)
	return nil
}

// ReplaceRules swaps the socket's rules for these, atomically.
func (d *Dataplane) ReplaceRules(cookie uint64, rules []Rule) ([]RuleID, error) {
	rs, compiled, unlock, err := d.prepare(cookie, rules)
	if err != nil {
		return nil, err
	}
	defer unlock()
	news := d.newInstalled(rs, rules, compiled)
	old := rs.rules
	if err := d.rebuild(rs, news); err != nil {
		return nil, err
	}
	for _, r := range old {
		delete(d.byID, r.id)
	}
	return ids(news), nil
}

// DeleteRules removes rules of the socket. If any id is not one of the
// socket's rules nothing is removed.
func (d *Dataplane) DeleteRules(cookie uint64, del []RuleID) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	rs, ok := d.bySocket[cookie]
	if !ok {
		return fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	gone := make(map[RuleID]bool, len(del))
	for _, id := range del {
		gone[id] = true
	}
	at, missing, ok := rs.positions(del, gone)
	if !ok {
		return fmt.Errorf("rule %d is not a rule of socket %#x", missing, cookie)
	}
	removed := make([]*compiledRule, len(at))
	leaving := make([]*installed, len(at))
	for k, i := range at {
		d.uninstall(rs.rules[i])
		removed[k], leaving[k] = rs.rules[i].rule, rs.rules[i]
	}
	// read once unlinked: their slots keep their counters within the quarantine
	for k, c := range d.countsOf(leaving) {
		rs.gone = rs.gone.add(baseOf(d.bases, leaving[k].slot)).add(c)
	}
	d.unlinkRetired(gone)
	rs.rules = removeAt(rs.rules, at)
	if rs.disjoint != nil {
		rs.disjoint.removeRules(removed)
	}
	return nil
}

// positions is where the rules del (the set gone) are in rs.rules,
// ascending, each once; or, with false, the first id of del that is not a
// rule of rs.
// A delete of many rules (a controller's exit) takes one pass over the set
// instead of a binary search per rule.
func (rs *ruleset) positions(del []RuleID, gone map[RuleID]bool) ([]int, RuleID, bool) {
	at := make([]int, 0, len(gone))
	if len(gone)*manyRules < len(rs.rules) {
		for _, id := range del {
			i, ok := rs.index(id)
			if !ok {
				return nil, id, false
			}
			at = append(at, i)
		}
		slices.Sort(at)
		return slices.Compact(at), 0, true
	}
	for i, r := range rs.rules {
		if gone[r.id] {
			at = append(at, i)
		}
	}
	if len(at) < len(gone) {
		for _, id := range del {
			if _, ok := rs.index(id); !ok {
				return nil, id, false
			}
		}
	}
	return at, 0, true
}

// manyRules: a change of more than 1/manyRules of a set's rules is done in
// passes over the whole set, which then cost less than a search per rule.
const manyRules = 16

// index is where the rule with this ID is in rs.rules, which ascend by ID.
func (rs *ruleset) index(id RuleID) (int, bool) {
	return slices.BinarySearchFunc(rs.rules, id, func(r *installed, id RuleID) int { return cmp.Compare(r.id, id) })
}

// removeAt removes the elements at the ascending, distinct indexes at from
// s in place, moving the runs between them whole: O(len(at) + the elements
// moved), with no per-element lookups (a data plane of a million rules
// deleted 1000 of them in 46 ms by testing every rule against a set).
func removeAt[S ~[]E, E any](s S, at []int) S {
	if len(at) == 0 {
		return s
	}
	w := at[0]
	for k, i := range at {
		end := len(s)
		if k+1 < len(at) {
			end = at[k+1]
		}
		w += copy(s[w:], s[i+1:end])
	}
	clear(s[w:])
	return s[:w]
}

// RuleInfo is an installed rule as listed.
type RuleInfo struct {
	ID      RuleID
	Version uint32 // 1 when added, one more with every ModifyRules
	Rule    Rule
}

// ListRules returns the socket's rules in insertion order.
func (d *Dataplane) ListRules(cookie uint64) ([]RuleInfo, error) {
	var out []RuleInfo
	err := d.VisitRules(cookie, 0, func(ri RuleInfo) bool {
		out = append(out, ri)
		return true
	})
	return out, err
}

// VisitRules calls visit with each of the socket's rules whose ID is above
// after, in insertion order, until visit returns false. Insertion order is
// ascending ID order, so a listing in pages (after = the last ID of the
// page before) sees once every rule that stays installed meanwhile. visit
// runs with the data plane locked.
func (d *Dataplane) VisitRules(cookie uint64, after RuleID, visit func(RuleInfo) bool) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	rs, ok := d.bySocket[cookie]
	if !ok {
		return fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	start, found := rs.index(after)
	if found {
		start++
	}
	for _, r := range rs.rules[start:] {
		src, err := r.src.unpack()
		if err != nil {
			return fmt.Errorf("rule %d: %w", r.id, err)
		}
		if !visit(RuleInfo{ID: r.id, Version: r.version, Rule: src}) {
			return nil
		}
	}
	return nil
}

// prepare compiles rules and returns them with the socket's rule set, the
// data plane locked; the caller unlocks.
func (d *Dataplane) prepare(cookie uint64, rules []Rule) (*ruleset, []*compiledRule, func(), error) {
	compiled, err := compileAll(rules)
	if err != nil {
		return nil, nil, nil, err
	}
	d.mu.Lock()
	d.reapDue() // free what is due before checking room
	rs, ok := d.bySocket[cookie]
	if !ok {
		d.mu.Unlock()
		return nil, nil, nil, fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	return rs, compiled, d.mu.Unlock, nil
}

func compileAll(rules []Rule) ([]*compiledRule, error) {
	out := make([]*compiledRule, len(rules))
	for i, r := range rules {
		c, err := compileRule(r)
		if err != nil {
			return nil, fmt.Errorf("rule %d: %w", i, err)
		}
		out[i] = c
	}
	return out, nil
}

func ids(rs []*installed) []RuleID {
	out := make([]RuleID, len(rs))
	for i, r := range rs {
		out[i] = r.id
	}
	return out
}

func (d *Dataplane) newInstalled(rs *ruleset, src []Rule, compiled []*compiledRule) []*installed {
	out := make([]*installed, len(compiled))
	for i, c := range compiled {
		d.lastID++
		d.order++
		out[i] = &installed{id: d.lastID, version: 1, owner: rs, src: packRule(src[i]), rule: c, order: d.order}
	}
	return out
}

// place assigns each rule its region, hash and bucket for rule set id under
// the given regions and part of the bucket table, checking capacity and
// chain lengths first.
func (d *Dataplane) place(id uint32, regions []region, buckets bucketRange, rules []*installed) error {
	return d.retryDrained(func() error { return d.tryPlace(id, regions, buckets, rules) })
}

// retryDrained runs try, and if it fails for lack of room while replaced
// rules kept for packets in flight hold some, once more after they are
// freed.
func (d *Dataplane) retryDrained(try func() error) error {
	err := try()
	if err != nil && !errors.Is(err, errNoRegion) && len(d.retiring) > 0 {
		d.drainRetired()
		err = try()
	}
	return err
}

func (d *Dataplane) tryPlace(id uint32, regions []region, buckets bucketRange, rules []*installed) error {
	extra := map[uint32]int{}
	regionsOf := map[region][]region{} // anchor -> regionsFor
	for _, r := range rules {
		anchor := anchorOf(r.rule)
		candidates, ok := regionsOf[anchor]
		if !ok {
			candidates = regionsFor(regions, anchor)
			regionsOf[anchor] = candidates
		}
		if len(candidates) == 0 {
			return errNoRegion
		}
		a := r.rule.conds[r.rule.anchor]
		placed := false
		for _, reg := range candidates {
			hash := regionHash(a.Pattern[:reg.len])
			bucket := bucketOf(d.seed, buckets, id, reg, hash)
			if int(d.chainLen[bucket])+extra[bucket] < MaxChain {
				r.region, r.regionN, r.hash, r.bucket = reg, slices.Index(regions, reg), hash, bucket
				extra[bucket]++
				placed = true
				break
			}
		}
		if !placed {
			reg, also := candidates[0], ""
			if n := len(candidates) - 1; n > 0 {
				also = fmt.Sprintf("; the buckets of the %d shorter regions it could hang on are full too", n)
			}
			return invalid("more than %d rules share the bytes %v of %q (the region the matcher hashes%s); "+
				"add a condition that tells them apart earlier in the request", MaxChain, reg, a.Pattern[:reg.len], also)
		}
	}
	return d.roomFor(rules)
}

// roomFor says, if there is no room for rules in the rule table or the
// rule data memory, which is full.
func (d *Dataplane) roomFor(rules []*installed) error {
	if d.slots.available() < len(rules) {
		return fmt.Errorf("%w: rule table: %d rules to add, %d free of %d; raise santad's dataplane.max_rules",
			ErrFull, len(rules), d.slots.available(), d.cfg.MaxRules)
	}
	need := 0
	for _, r := range rules {
		need += r.rule.dataLen()
	}
	if free := d.cfg.DataMiB*pageData - d.data.used; free < need {
		return fmt.Errorf("%w: rule data memory: need %d bytes, %d free; raise santad's dataplane.data_mib", ErrFull, need, free)
	}
	return nil
}

var errNoRegion = errors.New("no region for the rule")

// add installs new rules into the rule set: in place if its regions and
// part of the bucket table suit them, else by a rebuild.
func (d *Dataplane) add(rs *ruleset, news []*installed) error {
	// said first: where rules go matters only if they fit
	if err := d.retryDrained(func() error { return d.roomFor(news) }); err != nil {
		return err
	}
	fits := rs.buckets.holds(len(rs.rules)+len(news), d.mask)
	// without room for the rebuild's second copy of the set, its part of
	// the table still serves, with longer chains
	stuck := !fits && !d.roomForCopy(rs.rules, news)
	if fits || stuck {
		err := d.linkInPlace(rs, news, nil)
		switch {
		case err == nil:
			rs.rules = append(rs.rules, news...)
			return nil
		case errors.Is(err, ErrFull):
			return err // a rebuild would need more room still
		case stuck:
			return fmt.Errorf("%w: %v; rebuilding the rule set (%d rules) to fit them needs room for a second copy "+
				"of it, and %d of %d rule slots are free: raise santad's dataplane.max_rules to twice the largest rule set",
				ErrFull, err, len(rs.rules), d.slots.available(), d.cfg.MaxRules)
		}
	}
	// new regions, or a larger part of the table: rebuild the rule set
	return d.rebuild(rs, append(slices.Clone(rs.rules), news...))
}

// roomForCopy says whether the rules of all groups fit beside the
// installed ones (counting what retired rules hold for a moment).
func (d *Dataplane) roomForCopy(groups ...[]*installed) bool {
	n := 0
	for _, rules := range groups {
		n += len(rules)
	}
	if d.slots.available()+len(d.retiring) < n {
		return false
	}
	need := 0
	for _, rules := range groups {
		for _, r := range rules {
			need += r.rule.dataLen()
		}
	}
	return d.cfg.DataMiB*pageData-d.data.used >= need
}

// linkInPlace links news, new rules or new versions of the rules in
// replaced, into the rule set as it is, visible all at once by one
// generation step; the caller then puts them in rs.rules. It fails,
// changing nothing, if the rule set's regions do not suit news.
func (d *Dataplane) linkInPlace(rs *ruleset, news, replaced []*installed) error {
	if len(rs.regions) == 0 {
		return errNoRegion
	}
	if err := d.place(rs.id, rs.regions, rs.buckets, news); err != nil {
		return err
	}
	// the rule set stays disjoint if news do not overlap the rules they join
	disjoint, undoDisjoint := false, func() {}
	if ds := rs.disjoint; ds != nil && len(replaced) > 0 && ds.samePatterns(replaced, news) {
		disjoint = true // new versions of the same requests (the usual modify)
	} else if ds != nil {
		dropped, _ := ds.sortedPatterns(compiledOf(replaced))
		ds.remove(dropped)
		added, ok := ds.sortedPatterns(compiledOf(news))
		if disjoint = ok && ds.add(added); disjoint {
			undoDisjoint = func() { ds.remove(added); ds.add(dropped) }
		} else {
			ds.add(dropped) // as it was; the set is dropped once news are in
		}
	}
	gen := rs.generation + 1
	for _, r := range news {
		if err := d.install(rs.id, gen, r); err != nil {
			for _, done := range news {
				if done.slot != 0 {
					d.uninstall(done)
				}
			}
			for _, r := range replaced { // the IDs of modified rules name the old versions again
				d.byID[r.id] = r
			}
			undoDisjoint()
			return err
		}
	}
	if !disjoint && rs.disjoint != nil {
		rs.disjoint = nil
		rs.flags &^= flagDisjoint
		d.rulesets.store32(rs.id, offRulesetFlags, rs.flags)
	}
	d.rulesets.store32(rs.id, offRulesetGen, gen)
	rs.generation = gen
	return nil
}

// rebuild installs rules as a fresh rule set with new regions, points the
// socket at it in one map update, then removes the old one.
func (d *Dataplane) rebuild(rs *ruleset, rules []*installed) error {
	compiled := compiledOf(rules)
	regions, err := deriveRegions(compiled)
	if err != nil {
		return err
	}
	var flags uint32
	disjoint := newDisjointSet(compiled)
	if disjoint != nil {
		flags |= flagDisjoint
	}
	id, buckets, err := d.writeRuleset(rs, regions, flags, len(rules))
	if err != nil {
		return err
	}
	old := append([]*installed(nil), rs.rules...)
	moved := make([]*installed, len(rules))
	for i, r := range rules {
		c := *r
		c.slot, c.data = 0, dataRef{}
		moved[i] = &c
	}
	fail := func(err error) error {
		for _, r := range moved {
			if r.slot != 0 {
				d.uninstall(r)
			}
		}
		for _, r := range old {
			d.byID[r.id] = r
		}
		d.rsIDs.put(id)
		return err
	}
	if err := d.place(id, regions, buckets, moved); err != nil {
		return fail(err)
	}
	for _, r := range moved {
		if err := d.install(id, 1, r); err != nil {
			return fail(err)
		}
	}
	if err := d.objs.SantaSockets.Update(rs.cookie, id, ebpf.UpdateExist); err != nil {
		return fail(fmt.Errorf("switch socket %#x to its new rule set: %w", rs.cookie, err))
	}
	d.socketsChanged()
	successors := map[RuleID]*installed{}
	for _, r := range moved {
		successors[r.id] = r
	}
	d.retire(old, successors)
	d.rsIDs.put(rs.id)
	rs.id, rs.regions, rs.buckets, rs.flags, rs.generation, rs.rules = id, regions, buckets, flags, 1, moved
	rs.disjoint = disjoint
	return nil
}

func compiledOf(rules []*installed) []*compiledRule {
	out := make([]*compiledRule, len(rules))
	for i, r := range rules {
		out[i] = r.rule
	}
	return out
}

// writeRuleset writes a rule set for n rules under a fresh id that no
// socket points at yet, and returns the id and the set's part of the bucket
// table.
func (d *Dataplane) writeRuleset(rs *ruleset, regions []region, flags uint32, n int) (uint32, bucketRange, error) {
	id, _, err := d.rsIDs.get()
	if err != nil {
		return 0, bucketRange{}, fmt.Errorf("%w: rule sets (%d); raise santad's dataplane.max_rulesets", ErrFull, d.cfg.MaxRulesets)
	}
	buckets := bucketRangeFor(d.seed, d.mask, id, n)
	v := santaSantaRuleset{
		Nregions:     uint32(len(regions)),
		Flags:        flags,
		Generation:   1,
		BucketsBase:  buckets.base,
		BucketsMask:  buckets.mask,
		SampleLen:    uint16(rs.sample.Bytes),
		SamplePerSec: uint32(rs.sample.PerSecond),
	}
	for i, r := range regions {
		v.Regions[i] = santaSantaRegion{Off: uint16(r.off), Len: uint16(r.len)}
	}
	encodeInto(d.rulesets.value(id), &v)
	return id, buckets, nil
}

// install writes rule r into a free slot of rule set id and links it at the
// head of its bucket's chain.
func (d *Dataplane) install(id, gen uint32, r *installed) error {
	slot, reused, err := d.slots.get()
	if errors.Is(err, errFull) {
		return fmt.Errorf("%w: rule table; raise santad's dataplane.max_rules", ErrFull)
	}
	if err != nil {
		return err
	}
	ref, err := d.data.get(r.rule.dataLen())
	if err != nil {
		d.slots.put(slot)
		return fmt.Errorf("%w: rule data memory; raise santad's dataplane.data_mib", ErrFull)
	}
	r.slot, r.data = slot, ref
	page := d.pages.value(ref.page)
	c := r.rule
	v := santaSantaRule{
		Id:         uint64(r.id),
		Ruleset:    id,
		Next:       d.buckets.load32(r.bucket, offBucketHead),
		Hash:       r.hash,
		Region:     santaSantaRegion{Off: uint16(r.region.off), Len: uint16(r.region.len)},
		Priority:   c.priority,
		Order:      r.order,
		Generation: gen,
		Page:       ref.page,
		TplCsum:    c.tplCsum,
		ReplyLen:   uint16(len(c.template)),
		MinLen:     uint16(c.minLen),
		MaxLen:     uint16(c.maxLen),
		Nconds:     uint8(len(c.conds)),
		Ncopies:    uint8(len(c.copies)),
		Nguards:    uint8(len(c.guards)),
		Flags:      c.flags,
		Expires:    c.expires,
	}
	copy(v.Guards[:], c.guards)
	// the layout dataLen counts and compileRule's copy mask offsets assume
	at := int(ref.off)
	for i, cond := range c.conds {
		sc := santaSantaCond{Off: uint16(cond.Offset), Len: uint16(len(cond.Pattern)), Data: uint32(at)}
		at = align8(at + copy(page[at:], cond.Pattern))
		if cond.Mask != nil {
			sc.Data |= condMasked
			at = align8(at + copy(page[at:], cond.Mask))
		}
		switch i {
		case 0:
			v.Cond0 = sc
		case 1, 2:
			v.Conds[i-1] = sc
		default:
			v.Cond3 = sc
		}
	}
	v.Tpl = uint32(at)
	at = align8(at + copy(page[at:], c.template))
	for _, m := range c.copyMasks {
		at += copy(page[at:], m[:])
	}
	if len(c.copies) > 0 {
		v.Copy0 = c.copies[0]
		copy(v.Copies[:], c.copies[1:])
	}
	if reused { // its counters were reset when it thawed; a fresh slot's are zero from load
		d.setBase(slot, RuleStats{})
	}
	encodeInto(d.rules.value(slot), &v)
	d.widenRegionLens(id, r.regionN, c.minLen, c.maxLen)
	d.setHead(r.bucket, slot)
	d.chainLen[r.bucket]++
	d.byID[r.id] = r
	return nil
}

// widenRegionLens makes region n of rule set id admit payloads of minLen to
// maxLen bytes, before a rule that answers them becomes visible. The range
// never narrows (deleted rules leave it wide) until the rule set is rebuilt.
func (d *Dataplane) widenRegionLens(id uint32, n, minLen, maxLen int) {
	off := offRulesetLens + n*rangeSize
	cur := d.rulesets.load32(id, off)
	lo, hi := int(cur&0xffff), int(cur>>16)
	if cur != 0 {
		minLen, maxLen = min(minLen, lo), max(maxLen, hi)
	}
	// one 32-bit store: the program never sees half of it
	d.rulesets.store32(id, off, uint32(minLen)|uint32(maxLen)<<16)
}

// setHead makes the rule in slot (0: none) the first of bucket's chain,
// with the hint of where its data lies (struct santa_bucket).
func (d *Dataplane) setHead(bucket, slot uint32) {
	var hint uint32
	if slot != 0 {
		hint = dataHint((*santaSantaRule)(unsafe.Pointer(&d.rules.value(slot)[0])))
	}
	d.buckets.store32(bucket, offBucketHint, hint)
	d.buckets.store32(bucket, offBucketHead, slot)
}

// dataHint says where rule r's patterns and template lie: page << 16 |
// first 64-byte line << 2 | lines - 1, up to 4 lines (the copy masks after
// the template are left out: few rules have them).
func dataHint(r *santaSantaRule) uint32 {
	start, end := r.Tpl, r.Tpl+uint32(r.ReplyLen)
	if r.Nconds > 0 {
		start = r.Cond0.Data &^ condMasked
	}
	first, last := start/64, (max(end, start+1)-1)/64
	return r.Page<<16 | first<<2 | min(last-first, 3)
}

// uninstall unlinks rule r from its chain and frees its slot and data.
func (d *Dataplane) uninstall(r *installed) {
	next := d.rules.load32(r.slot, offRuleNext)
	if d.buckets.load32(r.bucket, offBucketHead) == r.slot {
		d.setHead(r.bucket, next)
	} else {
		for s := d.buckets.load32(r.bucket, offBucketHead); s != 0; s = d.rules.load32(s, offRuleNext) {
			if d.rules.load32(s, offRuleNext) == r.slot {
				d.rules.store32(s, offRuleNext, next)
				break
			}
		}
	}
	d.chainLen[r.bucket]--
	d.slots.put(r.slot)
	d.data.put(r.data, r.rule.dataLen())
	if d.byID[r.id] == r {
		delete(d.byID, r.id)
	}
}
