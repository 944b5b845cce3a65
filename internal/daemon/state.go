package daemon

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"
	"unique"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
)

// ruleSet is santad's record of one socket's rule set: who owns it and what
// each rule costs, for authorization and quotas. The rules themselves live in
// the data plane.
type ruleSet struct {
	info   api.SocketInfo // cookie, address, owner uid, pid
	sample dataplane.SampleOptions
	rules  map[uint64]ruleMeta
	bytes  uint64
}

type ruleMeta struct {
	cost    uint64
	version uint32
	charged uint32 // the uid whose quota the rule counts against (chargedUID)
	expires uint64 // api.Rule.Expires
	tag     string // api.Rule.Tag, interned: a million rules share a few tags
}

// usage is what one uid holds, against its quota.
type usage struct{ rules, bytes, rulesets uint64 }

// The operations below change the data plane, then record the change in the
// journal; santad acknowledges a change only once both are done. Callers hold d.mu.

func (d *Daemon) bind(info api.SocketInfo, sample dataplane.SampleOptions) (*ruleSet, error) {
	u := d.usageOf(info.Owner)
	q := d.cfg.Quota.Rulesets
	over := func() bool { return info.Owner != 0 && q != 0 && u.rulesets >= q }
	if over() && (!d.freeReleased(0) || over()) { // counting no socket closed a moment ago
		return nil, fail(api.StatusQuota, "uid %d would hold %d rule sets, over its quota of %d (santad config quota.rulesets): "+
			"close or unbind sockets it no longer offloads", info.Owner, u.rulesets+1, q)
	}
	if err := d.withRoom(0, func() error { return d.dp.Bind(dataplaneSocket(info), sample) }); err != nil {
		return nil, err
	}
	rs := &ruleSet{info: info, sample: sample, rules: map[uint64]ruleMeta{}}
	if err := d.record(&api.Message{Op: api.OpBind, Sockets: []api.SocketInfo{info},
		SampleBytes: uint32(sample.Bytes), SampleRate: uint32(sample.PerSecond)}, func() { d.dp.Unbind(info.Cookie) }); err != nil {
		return nil, err
	}
	d.sets[info.Cookie] = rs
	u.rulesets++
	return rs, nil
}

// dataplaneSocket is what the data plane needs to know of a socket.
func dataplaneSocket(info api.SocketInfo) dataplane.Socket {
	return dataplane.Socket{Cookie: info.Cookie, Protocol: uint8(info.Protocol), Port: info.Port}
}

func (d *Daemon) setSampling(rs *ruleSet, sample dataplane.SampleOptions) error {
	old := rs.sample
	if err := d.dp.SetSampling(rs.info.Cookie, sample); err != nil {
		return err
	}
	if err := d.record(&api.Message{Op: api.OpBind, Sockets: []api.SocketInfo{rs.info},
		SampleBytes: uint32(sample.Bytes), SampleRate: uint32(sample.PerSecond)},
		func() { d.dp.SetSampling(rs.info.Cookie, old) }); err != nil {
		return err
	}
	rs.sample = sample
	return nil
}

func (d *Daemon) unbind(rs *ruleSet) error {
	if err := d.dp.Unbind(rs.info.Cookie); err != nil {
		return err
	}
	d.forget(rs)
	// the rule set is gone from the data plane; a lost journal record only
	// means a restart re-creates it, to be dropped if its socket is closed
	return d.record(&api.Message{Op: api.OpUnbind, Socket: rs.info.Cookie}, nil)
}

// forget drops a rule set santad no longer has in the data plane.
func (d *Daemon) forget(rs *ruleSet) {
	for _, m := range rs.rules {
		d.uncharge(m)
	}
	d.usageOf(rs.info.Owner).rulesets--
	delete(d.sets, rs.info.Cookie)
	d.closeSubscribers(rs.info.Cookie)
}

// chargedUID is the uid whose quota the rules caller installs in rs count
// against: the rule set's owner, whoever the caller; but on a rule set root
// bound (santa attach), which a non-root uid may change by passing the
// socket's fd, the caller, so that its rules count against its quota there
// too. root's own rules there count for no one (uid 0 has no quota).
func chargedUID(caller uint32, rs *ruleSet) uint32 {
	if rs.info.Owner != 0 {
		return rs.info.Owner
	}
	return caller
}

// chargeRecord is what a journal record of rules charged to uid says of
// it: nothing for the owner, the usual case, else the uid, for a restart to
// charge them to it again.
func chargeRecord(rs *ruleSet, uid uint32) *api.DaemonInfo {
	if uid == rs.info.Owner {
		return nil
	}
	return &api.DaemonInfo{UID: uid}
}

// freeReleased frees the rule sets whose sockets closed a moment ago, but
// for that of socket except, before watchReleased reads their release: a
// quota counts them until then, and a user who closed a socket and binds
// or adds anew must not be refused for it. It says whether it freed any.
// Callers hold d.mu.
func (d *Daemon) freeReleased(except uint64) bool {
	freed := false
	for cookie, rs := range d.sets {
		if cookie == except || !d.dp.Released(cookie) {
			continue
		}
		if err := d.unbind(rs); err != nil {
			d.log.Error("freeing the rules of a closed socket failed", "socket", cookie, "error", err)
			continue
		}
		d.log.Info("socket closed: its rules are gone", "socket", cookie, "owner", rs.info.Owner, "rules", len(rs.rules))
		freed = true
	}
	return freed
}

// withRoom runs op, a change of the data plane, and once more if the data
// plane had no room for it and freeReleased made some. Callers hold d.mu.
func (d *Daemon) withRoom(except uint64, op func() error) error {
	err := op()
	if errors.Is(err, dataplane.ErrFull) && d.freeReleased(except) {
		err = op()
	}
	return err
}

// checkQuota refuses a change by caller that would take the uid its rules
// are charged to past its quota (overQuota), counting no rule set whose
// socket has closed.
func (d *Daemon) checkQuota(caller uint32, rs *ruleSet, addRules, addBytes uint64, drop []uint64) error {
	err := d.overQuota(caller, rs, addRules, addBytes, drop)
	if err != nil && d.freeReleased(rs.info.Cookie) {
		err = d.overQuota(caller, rs, addRules, addBytes, drop)
	}
	return err
}

// overQuota refuses a change by caller that would take the uid its rules
// are charged to past its quota: adding rules and bytes, and dropping the
// rules drop (replaced or modified), of which those charged to that uid
// count. root, as owner or as caller, has none.
func (d *Daemon) overQuota(caller uint32, rs *ruleSet, addRules, addBytes uint64, drop []uint64) error {
	uid := chargedUID(caller, rs)
	if uid == 0 || caller == 0 {
		return nil
	}
	var dropRules, dropBytes uint64
	for _, id := range drop {
		if m := rs.rules[id]; m.charged == uid {
			dropRules++
			dropBytes += m.cost
		}
	}
	u := d.usageOf(uid)
	q := d.cfg.Quota
	if rules := u.rules + addRules - dropRules; q.Rules != 0 && rules > q.Rules {
		return fail(api.StatusQuota, "uid %d would hold %d rules, over its quota of %d (santad config quota.rules)",
			uid, rules, q.Rules)
	}
	if bytes := u.bytes + addBytes - dropBytes; q.TemplateBytes != 0 && bytes > q.TemplateBytes {
		return fail(api.StatusQuota, "uid %d would hold %d bytes of patterns and replies, over its quota of %d (santad config quota.template_bytes)",
			uid, bytes, q.TemplateBytes)
	}
	return nil
}

// checkRules refuses rules the socket cannot carry, rules already expired,
// bad tags and processors with another kind's fields.
func checkRules(rs *ruleSet, rules []api.Rule) error {
	if err := checkSocket(rs, rules); err != nil {
		return err
	}
	for i, r := range rules {
		if err := api.CheckTag(r.Tag); err != nil {
			return fail(api.StatusInvalid, "rule %d: %v", i, err)
		}
		if err := checkProcessorFields(r.Processors); err != nil {
			return fail(api.StatusInvalid, "rule %d: %v", i, err)
		}
	}
	return checkExpires(rules, time.Now())
}

// checkProcessorFields refuses a field of the other kind of processor in a
// put or a copy, which the data plane would ignore: the sender meant
// something else. (New requests only: rules restored from the journal are
// not checked again.)
func checkProcessorFields(ps []api.Processor) error {
	for i, p := range ps {
		switch {
		case p.Kind == api.KindPut && (p.SrcOffset != 0 || p.Length != 0 || len(p.Mask) > 0):
			return fmt.Errorf("processor %d (put): a put takes a template and a reply offset; a source offset, length or mask are a copy's", i)
		case p.Kind == api.KindCopy && len(p.Template) > 0:
			return fmt.Errorf("processor %d (copy): a copy takes request bytes, not a template (a put's)", i)
		}
	}
	return nil
}

// checkSocket refuses rules the rule set's socket cannot carry: UDP replies
// that cannot fit one frame (an IPv6 header is 20 bytes longer, so IPv6
// sockets get 20 bytes less of reply; TCP replies may take several
// segments), and Close, which ends a TCP connection, on anything but a TCP
// socket.
func checkSocket(rs *ruleSet, rules []api.Rule) error {
	udp := rs.info.Protocol != api.ProtocolTCP
	limit, why := dataplane.MaxReply, "a UDP reply is one frame"
	if rs.info.Family == 6 {
		limit, why = dataplane.MaxReplyIPv6, "a UDP reply is one frame, and an IPv6 header is 20 bytes longer"
	}
	for i, r := range rules {
		// checked here, not only by the data plane, which knows just the TCP limit
		if udp && (r.ReplyLen < 1 || r.ReplyLen > uint32(limit)) {
			return fail(api.StatusInvalid, "rule %d: reply length %d: must be between 1 and %d: %s",
				i, r.ReplyLen, limit, why)
		}
		if r.Close && rs.info.Protocol != api.ProtocolTCP {
			return fail(api.StatusInvalid, "rule %d: close ends a TCP connection, but socket %d is a UDP socket: "+
				"leave close out of its rules", i, rs.info.Cookie)
		}
	}
	return nil
}

func totalCost(rules []api.Rule) uint64 {
	var n uint64
	for _, r := range rules {
		n += cost(r)
	}
	return n
}

func (d *Daemon) add(caller uint32, rs *ruleSet, rules []api.Rule) ([]uint64, error) {
	if err := checkRules(rs, rules); err != nil {
		return nil, err
	}
	if err := d.checkQuota(caller, rs, uint64(len(rules)), totalCost(rules), nil); err != nil {
		return nil, err
	}
	var ids []dataplane.RuleID
	err := d.withRoom(rs.info.Cookie, func() (err error) {
		ids, err = d.dp.AddRules(rs.info.Cookie, toDataplane(rules))
		return err
	})
	if err != nil {
		return nil, err
	}
	out, rec := newRules(rules, ids)
	uid := chargedUID(caller, rs)
	if err := d.record(&api.Message{Op: api.OpAdd, Socket: rs.info.Cookie, Rules: rec, Daemon: chargeRecord(rs, uid)},
		func() { d.dp.DeleteRules(rs.info.Cookie, ids) }); err != nil {
		return nil, err
	}
	rs.addRules(d.usageOf(uid), uid, rec)
	d.scheduleExpiry(rs.info.Cookie, rec)
	return out, nil
}

// newRules pairs new rules with the ids the data plane gave them: the ids
// for the caller, the rules with id and version 1 for the journal.
func newRules(rules []api.Rule, ids []dataplane.RuleID) ([]uint64, []api.Rule) {
	out := make([]uint64, len(ids))
	rec := make([]api.Rule, len(rules))
	for i, id := range ids {
		out[i] = uint64(id)
		rec[i] = rules[i]
		rec[i].ID, rec[i].Version = uint64(id), 1
	}
	return out, rec
}

// addRules adds rules charged to uid, whose usage u is.
func (rs *ruleSet) addRules(u *usage, uid uint32, rules []api.Rule) {
	for _, r := range rules {
		c := cost(r)
		rs.rules[r.ID] = ruleMeta{cost: c, version: r.Version, charged: uid, expires: r.Expires, tag: unique.Make(r.Tag).Value()}
		rs.bytes += c
		u.rules++
		u.bytes += c
	}
}

func (d *Daemon) dropRules(rs *ruleSet, ids []uint64) {
	for _, id := range ids {
		m := rs.rules[id]
		delete(rs.rules, id)
		rs.bytes -= m.cost
		d.uncharge(m)
	}
}

// uncharge takes a rule that is gone off the usage of the uid it was charged to.
func (d *Daemon) uncharge(m ruleMeta) {
	u := d.usageOf(m.charged)
	u.rules--
	u.bytes -= m.cost
}

func (d *Daemon) replace(caller uint32, rs *ruleSet, rules []api.Rule) ([]uint64, error) {
	if err := checkRules(rs, rules); err != nil {
		return nil, err
	}
	old := slices.Collect(maps.Keys(rs.rules))
	if err := d.checkQuota(caller, rs, uint64(len(rules)), totalCost(rules), old); err != nil {
		return nil, err
	}
	var ids []dataplane.RuleID
	err := d.withRoom(rs.info.Cookie, func() (err error) {
		ids, err = d.dp.ReplaceRules(rs.info.Cookie, toDataplane(rules))
		return err
	})
	if err != nil {
		return nil, err
	}
	out, rec := newRules(rules, ids)
	uid := chargedUID(caller, rs)
	// the old rules are gone from the data plane: there is nothing to roll back to
	err = d.record(&api.Message{Op: api.OpReplace, Socket: rs.info.Cookie, Rules: rec, Daemon: chargeRecord(rs, uid),
		Stats: d.goneRecord(rs)}, nil)
	d.dropRules(rs, old)
	rs.addRules(d.usageOf(uid), uid, rec)
	d.scheduleExpiry(rs.info.Cookie, rec)
	return out, err
}

func (d *Daemon) modify(caller uint32, rs *ruleSet, rules []api.Rule) ([]uint64, error) {
	if err := checkRules(rs, rules); err != nil {
		return nil, err
	}
	var addBytes uint64
	seen := map[uint64]bool{}
	ids := make([]uint64, len(rules))
	updates := make([]dataplane.RuleUpdate, len(rules))
	for i, r := range rules {
		if r.ID == 0 { // a field missing, not a rule missing: no rule has id 0
			return nil, fail(api.StatusInvalid, "rule %d: no id: a modify names the rule it changes by its id", i)
		}
		if _, ok := rs.rules[r.ID]; !ok {
			return nil, fail(api.StatusNotFound, "rule %d: socket %d has no rule with id %d", i, rs.info.Cookie, r.ID)
		}
		if seen[r.ID] {
			return nil, fail(api.StatusInvalid, "rule %d: id %d is modified twice in one request", i, r.ID)
		}
		seen[r.ID] = true
		ids[i] = r.ID
		addBytes += cost(r)
		updates[i] = dataplane.RuleUpdate{ID: dataplane.RuleID(r.ID), Rule: toDataplane(rules[i : i+1])[0]}
	}
	// a modified rule is charged anew, to chargedUID(caller, rs)
	if err := d.checkQuota(caller, rs, uint64(len(rules)), addBytes, ids); err != nil {
		return nil, err
	}
	if err := d.withRoom(rs.info.Cookie, func() error { return d.dp.ModifyRules(rs.info.Cookie, updates) }); err != nil {
		return nil, err
	}
	rec := make([]api.Rule, len(rules))
	for i, r := range rules {
		rec[i] = r
		rec[i].Version = rs.rules[r.ID].version + 1
	}
	uid := chargedUID(caller, rs)
	err := d.record(&api.Message{Op: api.OpModify, Socket: rs.info.Cookie, Rules: rec, Daemon: chargeRecord(rs, uid)}, nil)
	d.dropRules(rs, ids)
	rs.addRules(d.usageOf(uid), uid, rec)
	d.scheduleExpiry(rs.info.Cookie, rec)
	return ids, err
}

func (d *Daemon) delete(rs *ruleSet, ids []uint64) error {
	seen := make(map[uint64]bool, len(ids))
	for _, id := range ids {
		if _, ok := rs.rules[id]; !ok {
			return fail(api.StatusNotFound, "socket %d has no rule with id %d", rs.info.Cookie, id)
		}
		if seen[id] {
			return fail(api.StatusInvalid, "id %d is listed twice", id)
		}
		seen[id] = true
	}
	return d.deleteKnown(rs, ids)
}

// deleteKnown deletes rules ids, which are rules of rs, each once.
func (d *Daemon) deleteKnown(rs *ruleSet, ids []uint64) error {
	del := make([]dataplane.RuleID, len(ids))
	for i, id := range ids {
		del[i] = dataplane.RuleID(id)
	}
	if err := d.dp.DeleteRules(rs.info.Cookie, del); err != nil {
		return err
	}
	d.dropRules(rs, ids)
	return d.record(&api.Message{Op: api.OpDelete, Socket: rs.info.Cookie, IDs: ids, Stats: d.goneRecord(rs)}, nil)
}

// goneRecord is what a journal record says of the rules a socket no longer
// has: what they counted in all (one api.RuleStats, no id), for a restart
// to keep in the socket's totals. Records that remove rules carry it, and
// the binds of a compacted journal; a santad that knows nothing of it
// ignores it. Callers hold d.mu.
func (d *Daemon) goneRecord(rs *ruleSet) []api.RuleStats {
	s, err := d.dp.GoneStats(rs.info.Cookie)
	if err != nil || s == (dataplane.RuleStats{}) {
		return nil
	}
	return []api.RuleStats{{Hits: s.Hits, Bytes: s.Bytes}}
}

// record appends a change to the journal. If that fails, undo (if any)
// reverts the data plane so that santad never runs rules a restart would lose.
func (d *Daemon) record(m *api.Message, undo func()) error {
	if err := d.j.append(m); err != nil {
		d.log.Error("journal write failed", "op", m.Op.String(), "error", err)
		if undo == nil { // nothing to go back to: say so, it is not all or none
			return fail(api.StatusInternal, "santad made the change but could not record it (%v): "+
				"a restart of santad would undo it; see its log", err)
		}
		undo()
		return fail(api.StatusInternal, "santad could not record the change (%v), and made none; see its log", err)
	}
	if d.j.overgrown() {
		if err := d.compact(); err != nil { // the journal stays whole, only longer
			d.log.Warn("journal compaction failed", "error", err)
		}
	}
	return nil
}

// replayed is a rule set rebuilt from the journal.
type replayed struct {
	info   api.SocketInfo
	sample dataplane.SampleOptions
	order  []uint64 // rule ids, oldest first, deleted ones included
	rules  map[uint64]api.Rule
	gone   dataplane.RuleStats // what its rules since gone counted (goneRecord)
	// charged holds the rules charged to another uid than the owner (chargeRecord)
	charged map[uint64]uint32
}

// chargedUID is the uid rule id is charged to.
func (rs *replayed) chargedUID(id uint64) uint32 {
	if uid, ok := rs.charged[id]; ok {
		return uid
	}
	return rs.info.Owner
}

// charge notes who the rules of record m are charged to.
func (rs *replayed) charge(m *api.Message) {
	for _, r := range m.Rules {
		if m.Daemon != nil {
			rs.charged[r.ID] = m.Daemon.UID
		} else {
			delete(rs.charged, r.ID)
		}
	}
}

// idMark is the journal record of the largest rule id santad has given
// out, which a compaction writes first: the rules that had the largest ids
// may be gone (deleted, or their socket closed) and with them the records
// that named them, yet a restarted santad must not give their ids out again
// (a client may still hold one, and metrics series are named by them). It
// is a bind of socket 0, a cookie no socket has, so that an older santad
// reading the journal drops it as a socket closed meanwhile.
func idMark(last uint64) *api.Message {
	return &api.Message{Op: api.OpBind, Sockets: []api.SocketInfo{{}}, After: last}
}

func isIDMark(m *api.Message) bool {
	return m.Op == api.OpBind && len(m.Sockets) == 1 && m.Sockets[0].Cookie == 0
}

// noteGone takes the total of rules gone a record carries (goneRecord);
// a record without one leaves it as it was.
func (rs *replayed) noteGone(m *api.Message) {
	if len(m.Stats) == 1 {
		rs.gone = dataplane.RuleStats{Hits: m.Stats[0].Hits, Bytes: m.Stats[0].Bytes}
	}
}

// replay folds journal records into the rule sets they leave behind, and
// returns the largest rule id they name, deleted rules' included.
func replay(records []*api.Message) (sets map[uint64]*replayed, lastID uint64, err error) {
	sets = map[uint64]*replayed{}
	for i, m := range records {
		if isIDMark(m) {
			lastID = max(lastID, m.After)
			continue
		}
		for _, r := range m.Rules {
			lastID = max(lastID, r.ID)
		}
		if m.Op == api.OpBind {
			if len(m.Sockets) != 1 {
				return nil, 0, fmt.Errorf("journal record %d: bind with %d sockets", i, len(m.Sockets))
			}
			info := m.Sockets[0]
			rs, ok := sets[info.Cookie]
			if !ok {
				rs = &replayed{info: info, rules: map[uint64]api.Rule{}, charged: map[uint64]uint32{}}
				sets[info.Cookie] = rs
			}
			rs.sample = dataplane.SampleOptions{Bytes: int(m.SampleBytes), PerSecond: int(m.SampleRate)}
			rs.noteGone(m)
			continue
		}
		rs, ok := sets[m.Socket]
		if !ok {
			return nil, 0, fmt.Errorf("journal record %d: %s for socket %d, which was never bound", i, m.Op, m.Socket)
		}
		rs.noteGone(m)
		switch m.Op {
		case api.OpReplace:
			rs.order, rs.rules, rs.charged = nil, map[uint64]api.Rule{}, map[uint64]uint32{}
			fallthrough
		case api.OpAdd:
			for _, r := range m.Rules {
				rs.order = append(rs.order, r.ID)
				rs.rules[r.ID] = r
			}
			rs.charge(m)
		case api.OpModify:
			for _, r := range m.Rules {
				rs.rules[r.ID] = r
			}
			rs.charge(m)
		case api.OpDelete:
			for _, id := range m.IDs {
				delete(rs.rules, id)
				delete(rs.charged, id)
			}
		case api.OpUnbind:
			delete(sets, m.Socket)
		default:
			return nil, 0, fmt.Errorf("journal record %d: unexpected op %s", i, m.Op)
		}
	}
	return sets, lastID, nil
}

// ruleInfos returns the replayed rules in their order, but for those whose
// Expires time has come by now (their ids in expired).
func (rs *replayed) ruleInfos(now time.Time) (infos []dataplane.RuleInfo, expired []dataplane.RuleID) {
	infos = make([]dataplane.RuleInfo, 0, len(rs.rules))
	for _, id := range rs.order {
		r, ok := rs.rules[id]
		if !ok {
			continue
		}
		if expiresBy(r.Expires, now) {
			expired = append(expired, dataplane.RuleID(id))
			continue
		}
		infos = append(infos, dataplane.RuleInfo{ID: dataplane.RuleID(id), Version: r.Version, Rule: toDataplane([]api.Rule{r})[0]})
	}
	return infos, expired
}
