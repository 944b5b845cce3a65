package daemon

import (
	"cmp"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/dataplane"
	"golang.org/x/sys/unix"
)

// session is one client connection, with the credentials the kernel
// attached to it: they, and fds the client passes, are all santad trusts.
type session struct {
	d        *Daemon
	conn     *api.Conn
	uid      uint32
	pid      int32
	reserved uint64 // of the uid's quota.request_bytes, for the request at hand
}

// reserve takes n bytes of the uid's request memory for the request at hand.
func (s *session) reserve(n int) error {
	if err := s.d.requestMemory.reserve(s.uid, s.reserved, uint64(n)); err != nil {
		return err
	}
	s.reserved += uint64(n)
	return nil
}

// releaseRequest gives back the request memory of the request at hand.
func (s *session) releaseRequest() {
	s.d.requestMemory.release(s.uid, s.reserved)
	s.reserved = 0
}

// Pauses after a failed accept: it fails again at once while its cause
// lasts (santad out of fds, EMFILE), and retrying at once spins a CPU and
// floods the log.
const (
	acceptRetryFirst = 5 * time.Millisecond
	acceptRetryMax   = time.Second
)

func (d *Daemon) acceptLoop() {
	defer d.wg.Done()
	var pause time.Duration
	for {
		c, err := d.listener.AcceptUnix()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			pause = min(max(2*pause, acceptRetryFirst), acceptRetryMax)
			d.log.Warn("accept failed", "error", err, "retry_in", pause)
			select {
			case <-time.After(pause):
			case <-d.stop:
				return
			}
			continue
		}
		pause = 0
		cred, err := peerCred(c)
		if err != nil {
			d.log.Warn("no peer credentials: connection refused", "error", err)
			c.Close()
			continue
		}
		s := &session{d: d, conn: api.NewConn(c), uid: cred.Uid, pid: cred.Pid}
		if err := d.openConnection(s.uid); err != nil {
			d.log.Debug("connection refused", "uid", s.uid, "pid", s.pid, "error", err)
			d.metrics.request(0, api.StatusQuota)
			// unasked, with seq 0: the clients take it for the answer to their first request
			s.conn.Send(&api.Message{V: api.Version, Status: api.StatusQuota, Error: err.Error()}, -1)
			s.conn.Close()
			continue
		}
		go func() {
			defer d.closeConnection(s.uid)
			s.serve()
		}()
	}
}

// openConnection counts a new control connection of uid against
// quota.connections, or refuses it.
func (d *Daemon) openConnection(uid uint32) error {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	if uid == 0 {
		return nil
	}
	if limit := d.cfg.Quota.Connections; limit != 0 && d.conns[uid] >= limit {
		return fail(api.StatusQuota, "uid %d already holds %d connections to santad, its quota (quota.connections): close some", uid, limit)
	}
	d.conns[uid]++
	return nil
}

func (d *Daemon) closeConnection(uid uint32) {
	d.connMu.Lock()
	defer d.connMu.Unlock()
	if uid == 0 {
		return
	}
	if d.conns[uid]--; d.conns[uid] == 0 {
		delete(d.conns, uid)
	}
}

func peerCred(c *net.UnixConn) (*unix.Ucred, error) {
	raw, err := c.SyscallConn()
	if err != nil {
		return nil, err
	}
	var cred *unix.Ucred
	var serr error
	if err := raw.Control(func(fd uintptr) { cred, serr = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED) }); err != nil {
		return nil, err
	}
	return cred, serr
}

func (s *session) serve() {
	defer s.conn.Close()
	reserve := s.reserve
	if s.uid == 0 || s.d.cfg.Quota.RequestBytes == 0 {
		reserve = nil // nothing to bound: spare the walk of each frame's headers (a tenth of decoding it)
	}
	for {
		req, files, err := s.conn.RecvWithin(reserve)
		if err != nil {
			s.releaseRequest()
			closeFiles(files)
			status := api.StatusMalformed
			if statusOf(err) == api.StatusQuota {
				status = api.StatusQuota
			}
			// a frame that did not decode, or that was skipped, leaves the stream in step
			inStep := errors.Is(err, api.ErrMalformed) || status == api.StatusQuota
			if inStep || errors.Is(err, api.ErrFrame) {
				s.d.metrics.request(0, status)
				refusal := &api.Message{V: api.Version, Status: status, Error: err.Error()}
				if req != nil { // the op and seq the frame's first bytes name: the client knows what was refused
					refusal.Op, refusal.Seq = req.Op, req.Seq
				}
				s.conn.Send(refusal, -1)
			}
			if inStep {
				continue
			}
			if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) && !errors.Is(err, api.ErrFrame) {
				s.d.log.Debug("connection ended", "uid", s.uid, "pid", s.pid, "error", err)
			}
			return
		}
		resp, stream, stopping := s.handle(req, files)
		s.releaseRequest() // done with the request: a client slow to read the answer holds none
		closeFiles(files)  // santad never keeps an application's socket open
		if stopping {
			return // unanswered, as if santad had gone: it did not act on it
		}
		resp.V, resp.Op, resp.Seq = api.Version, req.Op, req.Seq
		err = s.conn.Send(resp, -1)
		if errors.Is(err, api.ErrTooLarge) { // nothing was sent: say why instead
			err = s.conn.Send(&api.Message{V: api.Version, Op: req.Op, Seq: req.Seq, Status: api.StatusInvalid,
				Error: fmt.Sprintf("%v: list_rules in pages (limit, after)", err)}, -1)
		}
		if err != nil {
			if stream != nil {
				s.d.unsubscribe(stream) // the subscription never began: it widens no sampling
			}
			return
		}
		if stream != nil {
			s.stream(stream)
			return
		}
	}
}

func closeFiles(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}

// handle answers one request. For subscribe it also returns the subscriber
// whose samples the connection carries from then on. While santad stops it
// does nothing and returns true.
func (s *session) handle(req *api.Message, files []*os.File) (*api.Message, *subscriber, bool) {
	s.d.requests.RLock()
	defer s.d.requests.RUnlock()
	if s.d.stopping {
		return nil, nil, true
	}
	resp, sub, err := s.dispatch(req, files)
	status := api.StatusOK
	if err != nil {
		status = statusOf(err)
		resp = &api.Message{Status: status, Error: err.Error()}
		lvl := s.d.log.Debug
		if status == api.StatusInternal {
			lvl = s.d.log.Error
		}
		lvl("request refused", "op", req.Op.String(), "uid", s.uid, "pid", s.pid, "status", status.String(), "error", err)
	}
	s.d.metrics.request(req.Op, status)
	return resp, sub, false
}

func (s *session) dispatch(req *api.Message, files []*os.File) (*api.Message, *subscriber, error) {
	if req.V != api.Version {
		return nil, nil, fail(api.StatusVersion, "protocol version %d: santad %s speaks version %d", req.V, Version, api.Version)
	}
	if len(files) > 1 {
		return nil, nil, fail(api.StatusInvalid, "%d fds passed: pass at most one socket per request", len(files))
	}
	if req.Op != api.OpBind && (req.PID != 0 || req.FD != 0 || req.Port != 0 || req.Protocol != 0) {
		return nil, nil, fail(api.StatusInvalid, "pid, fd, port and protocol belong to bind only")
	}
	if req.Op != api.OpListRules && (req.After != 0 || req.Limit != 0) {
		return nil, nil, fail(api.StatusInvalid, "after and limit belong to list_rules only")
	}
	if req.Op != api.OpListRules && req.Op != api.OpDelete && req.Tag != "" {
		return nil, nil, fail(api.StatusInvalid, "tag belongs to list_rules and delete only (a rule's tag goes in the rule)")
	}
	if req.More {
		return nil, nil, fail(api.StatusInvalid, "more belongs to list_rules responses, not to requests")
	}
	if err := misplacedKeys(req); err != nil {
		return nil, nil, err
	}
	d := s.d
	switch req.Op {
	case api.OpHealth:
		return s.health()
	case api.OpBind:
		return s.bind(req, files)
	case api.OpListSockets:
		return s.listSockets()
	case api.OpSubscribe:
		sub, err := s.subscribe(req, files)
		return &api.Message{}, sub, err
	case api.OpSample:
		return nil, nil, fail(api.StatusInvalid, "sample is an event santad sends, not a request")
	}
	if _, ok := rulesetOps[req.Op]; !ok {
		return nil, nil, fail(api.StatusUnsupported, "unknown op %d: santad %s knows ops 1 to %d", req.Op, Version, api.OpSample)
	}
	d.mu.Lock()
	rs, bound, err := s.target(req, files, rulesetOps[req.Op])
	if err == nil && req.Op == api.OpStats {
		cookie := rs.info.Cookie
		d.mu.Unlock() // the counters are read without santad's lock (addTotals)
		stats, err := d.stats(cookie, req.IDs)
		if err != nil {
			return nil, nil, err
		}
		return &api.Message{Stats: stats}, nil, nil
	}
	defer d.mu.Unlock()
	if err != nil {
		return nil, nil, err
	}
	resp := &api.Message{}
	switch req.Op {
	case api.OpUnbind:
		err = d.unbind(rs)
	case api.OpAdd:
		resp.IDs, err = d.add(s.uid, rs, req.Rules)
	case api.OpReplace:
		resp.IDs, err = d.replace(s.uid, rs, req.Rules)
	case api.OpModify:
		resp.IDs, err = d.modify(s.uid, rs, req.Rules)
	case api.OpDelete:
		resp.IDs, err = d.deleteTagged(rs, req.IDs, req.Tag)
	case api.OpListRules:
		resp.Rules, resp.More, err = d.listRules(rs, req)
	}
	if err != nil {
		if bound {
			// all or none: a refused request leaves no rule set behind either
			if uerr := d.unbind(rs); uerr != nil {
				d.log.Error("unbinding the socket a refused request bound", "socket", rs.info.Cookie, "error", uerr)
			}
		}
		return nil, nil, err
	}
	return resp, nil, nil
}

// misplacedKeys refuses the keys of a request that its op does not read:
// ignoring them would ignore what the client asked for (ids on a
// list_rules, sampling on an add), as an unknown key would.
func misplacedKeys(req *api.Message) error {
	op := req.Op
	switch {
	case req.Status != 0 || req.Error != "" || req.Sockets != nil || req.Stats != nil || req.Daemon != nil ||
		req.Counters != nil || req.Sample != nil || req.RequestLen != 0:
		return fail(api.StatusInvalid, "status, error, sockets, stats, daemon, counters, sample and request_len belong to responses and events, not to requests")
	case req.Rules != nil && op != api.OpAdd && op != api.OpReplace && op != api.OpModify:
		return fail(api.StatusInvalid, "rules belong to add, replace and modify only")
	case req.IDs != nil && op != api.OpDelete && op != api.OpStats:
		return fail(api.StatusInvalid, "ids belong to delete and stats only")
	case (req.SampleBytes != 0 || req.SampleRate != 0) && op != api.OpBind && op != api.OpSubscribe:
		return fail(api.StatusInvalid, "sample_bytes and sample_rate belong to bind and subscribe only")
	case req.Socket != 0 && (op == api.OpHealth || op == api.OpListSockets):
		return fail(api.StatusInvalid, "socket: %s is about no one socket", op)
	}
	return nil
}

// rulesetOps are the operations on one socket's rule set; true if a passed
// fd binds the socket when it has no rule set yet.
var rulesetOps = map[api.Op]bool{
	api.OpUnbind: false, api.OpAdd: true, api.OpReplace: true, api.OpModify: false,
	api.OpDelete: false, api.OpListRules: false, api.OpStats: false,
}

// target resolves the rule set a request is about and checks the caller may
// touch it; bound says it bound the socket for this request. Callers hold d.mu.
func (s *session) target(req *api.Message, files []*os.File, autobind bool) (*ruleSet, bool, error) {
	d := s.d
	if len(files) == 1 {
		info, err := passedSocket(req, files[0])
		if err != nil {
			return nil, false, err
		}
		// holding the socket proves the right to its rules, whoever bound it
		if rs, ok := d.sets[info.Cookie]; ok {
			return rs, false, nil
		}
		if !autobind {
			return nil, false, fail(api.StatusNotFound, "socket %d has no rule set: add rules or bind it first", info.Cookie)
		}
		if err := s.mayBind(info); err != nil {
			return nil, false, err
		}
		info.Owner, info.PID = s.uid, uint32(s.pid)
		rs, err := d.bind(info, dataplane.SampleOptions{})
		return rs, err == nil, err
	}
	if req.Socket == 0 {
		return nil, false, fail(api.StatusInvalid, "no target socket: pass the socket's fd (SCM_RIGHTS) or name its cookie in 'socket'")
	}
	rs, ok := d.sets[req.Socket]
	if !ok {
		return nil, false, fail(api.StatusNotFound, "no rule set for socket %d (closed, or never bound: pass its fd to bind it)", req.Socket)
	}
	if s.uid != 0 && rs.info.Owner != s.uid {
		return nil, false, fail(api.StatusPermission, "socket %d belongs to uid %d, not to you (uid %d): pass the socket's fd to prove it is yours",
			req.Socket, rs.info.Owner, s.uid)
	}
	return rs, false, nil
}

// passedSocket describes the socket a request passed, which must be the
// one it names if it names one.
func passedSocket(req *api.Message, f *os.File) (api.SocketInfo, error) {
	info, err := inspectSocket(int(f.Fd()))
	if err == nil && req.Socket != 0 && req.Socket != info.Cookie {
		err = fail(api.StatusInvalid, "the passed socket has cookie %d, the request names %d", info.Cookie, req.Socket)
	}
	return info, err
}

// mayBind refuses a non-root caller a rule set for a socket on a port
// outside user_ports: the rule processor answers before the host's
// firewall, so a user's rules would answer requests it drops.
func (s *session) mayBind(info api.SocketInfo) error {
	if s.uid == 0 || len(s.d.userPorts) == 0 {
		return nil
	}
	for _, r := range s.d.userPorts {
		if r.holds(info.Port, info.Protocol) {
			return nil
		}
	}
	transport := "udp"
	if info.Protocol == api.ProtocolTCP {
		transport = "tcp"
	}
	return fail(api.StatusPermission, "port %d/%s is not among santad's user_ports %v: a non-root uid binds sockets only there, "+
		"as the rule processor answers before the host's firewall; root may attach the socket (santa attach)",
		info.Port, transport, s.d.cfg.UserPorts)
}

func (s *session) health() (*api.Message, *subscriber, error) {
	d := s.d
	c, err := d.dp.Counters()
	if err != nil {
		return nil, nil, err
	}
	u := d.dp.Usage()
	info := &api.DaemonInfo{
		Version: Version, Protocol: api.Version, PID: uint32(os.Getpid()),
		UptimeSeconds: uint64(time.Since(d.started).Seconds()),
		Sockets:       uint64(u.Rulesets), Rules: uint64(u.Rules), MaxRules: uint64(d.dp.Config().MaxRules),
		DataBytes: uint64(u.DataBytes), MaxDataBytes: uint64(u.MaxDataBytes), UID: s.uid,
	}
	d.attsMu.Lock()
	d.letGoOfLostLocked()
	for _, a := range d.atts {
		mode := "generic"
		if a.Native {
			mode = "native"
		}
		iface := api.Interface{Name: a.Interface, Mode: mode}
		if a.Closed() || !interfaceNamed(a.Ifindex(), a.Interface) {
			iface.Mode = "removed" // until it is back (watchInterfaces)
		} else if peer, err := a.PeerXDP(); err != nil {
			iface.Peer = "unknown: " + err.Error()
		} else {
			iface.Peer = peer
		}
		info.Interfaces = append(info.Interfaces, iface)
	}
	d.attsMu.Unlock()
	if s.uid != 0 {
		info.QuotaRules, info.QuotaBytes = d.cfg.Quota.Rules, d.cfg.Quota.TemplateBytes
		info.QuotaRulesets = d.cfg.Quota.Rulesets
	}
	d.mu.Lock()
	if use, ok := d.usage[s.uid]; ok {
		info.UsedRules, info.UsedBytes = use.rules, use.bytes
		info.UsedRulesets = use.rulesets
	}
	d.mu.Unlock()
	return &api.Message{Daemon: info, Counters: dataplane.CounterNames(c)}, nil, nil
}

func (s *session) bind(req *api.Message, files []*os.File) (*api.Message, *subscriber, error) {
	d := s.d
	if req.SampleBytes > uint32(dataplane.MaxSample) {
		return nil, nil, fail(api.StatusInvalid, "sample_bytes %d: at most %d (a whole request the matcher sees)",
			req.SampleBytes, dataplane.MaxSample)
	}
	// a rate of 0 would take no sample at all (as a subscribe without one, refused there too)
	if req.SampleBytes != 0 && req.SampleRate == 0 {
		return nil, nil, fail(api.StatusInvalid, "sample_bytes %d without sample_rate: no request would be sampled; give sample_rate (samples per second and CPU, e.g. 1000)",
			req.SampleBytes)
	}
	sample := dataplane.SampleOptions{Bytes: int(req.SampleBytes), PerSecond: int(req.SampleRate)}
	var found []api.SocketInfo
	if req.Protocol != 0 && req.Port == 0 {
		return nil, nil, fail(api.StatusInvalid, "protocol belongs to a bind by port: pid and fd, or a passed fd, name the socket itself")
	}
	switch req.Protocol {
	case 0, api.ProtocolUDP, api.ProtocolTCP:
	default:
		return nil, nil, fail(api.StatusInvalid, "protocol %d: a bind by port takes %d (UDP, the default) or %d (TCP listeners)",
			req.Protocol, api.ProtocolUDP, api.ProtocolTCP)
	}
	switch {
	case req.PID != 0 || req.FD != 0 || req.Port != 0:
		if len(files) > 0 {
			return nil, nil, fail(api.StatusInvalid, "bind takes a passed fd, or pid and fd, or port: not several")
		}
		if req.Socket != 0 {
			return nil, nil, fail(api.StatusInvalid, "socket goes with a passed fd (its cookie): a bind by pid and fd, or by port, names its sockets by those")
		}
		if s.uid != 0 {
			return nil, nil, fail(api.StatusPermission, "binding another process's socket by pid or port needs root; "+
				"an application passes its own socket's fd instead")
		}
		var err error
		if req.Port != 0 {
			if req.PID != 0 || req.FD != 0 {
				return nil, nil, fail(api.StatusInvalid, "bind takes pid and fd, or port: not both")
			}
			proto := req.Protocol
			if proto == 0 {
				proto = api.ProtocolUDP
			}
			found, err = socketsOnPort(req.Port, proto)
		} else {
			var info api.SocketInfo
			info, err = socketOfProcess(int(req.PID), int(req.FD))
			found = []api.SocketInfo{info}
		}
		if err != nil {
			return nil, nil, err
		}
	case len(files) == 1:
		info, err := passedSocket(req, files[0])
		if err != nil {
			return nil, nil, err
		}
		info.Owner, info.PID = s.uid, uint32(s.pid)
		found = []api.SocketInfo{info}
	default:
		return nil, nil, fail(api.StatusInvalid, "bind needs a socket: pass its fd (SCM_RIGHTS), or as root name pid and fd, or port")
	}
	out, err := d.bindFound(found, sample, req.SampleBytes != 0 || req.SampleRate != 0, s.mayBind)
	if err != nil {
		return nil, nil, err
	}
	d.addTotals(out)
	return &api.Message{Sockets: out}, nil, nil
}

// bindFound binds the sockets that have no rule set yet, if mayBind lets
// it, sets the sampling of the others if setSample, and describes them
// all. All or none: if one fails, the rule sets it created are unbound and
// the sampling it changed is restored.
func (d *Daemon) bindFound(found []api.SocketInfo, sample dataplane.SampleOptions, setSample bool,
	mayBind func(api.SocketInfo) error) ([]api.SocketInfo, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	var undo []func() error
	out := make([]api.SocketInfo, 0, len(found))
	for _, info := range found {
		rs, ok := d.sets[info.Cookie]
		var err error
		switch {
		case !ok:
			if err = mayBind(info); err == nil {
				rs, err = d.bind(info, sample)
			}
			if err == nil {
				undo = append(undo, func() error { return d.unbind(rs) })
			}
		case setSample:
			old := rs.sample
			if err = d.setSampling(rs, sample); err == nil {
				undo = append(undo, func() error { return d.setSampling(rs, old) })
			}
		}
		if err != nil {
			for _, u := range slices.Backward(undo) {
				if uerr := u(); uerr != nil {
					d.log.Error("undoing part of a refused bind", "error", uerr)
				}
			}
			return nil, err
		}
		si := d.socketInfo(rs)
		si.Created = !ok
		out = append(out, si)
	}
	return out, nil
}

// socketInfo describes a rule set for list_sockets and bind, hits and reply
// bytes not yet counted (addTotals). Callers hold d.mu.
func (d *Daemon) socketInfo(rs *ruleSet) api.SocketInfo {
	si := rs.info
	si.Rules, si.TemplateBytes = uint64(len(rs.rules)), rs.bytes
	return si
}

// addTotals counts the hits and reply bytes of each socket's rules, those
// since gone included (they only grow while the socket is bound), without
// santad's lock: reading the counters of a million rules takes about 0.4 s,
// which would hold up every request.
func (d *Daemon) addTotals(socks []api.SocketInfo) {
	for i := range socks {
		if stats, gone, err := d.dp.SocketStats(socks[i].Cookie); err == nil {
			total := dataplane.Total(stats, gone)
			socks[i].Hits, socks[i].ReplyBytes = total.Hits, total.Bytes
		}
	}
}

func (s *session) listSockets() (*api.Message, *subscriber, error) {
	d := s.d
	resp := &api.Message{}
	d.mu.Lock()
	for _, rs := range d.sets {
		if s.uid == 0 || rs.info.Owner == s.uid {
			resp.Sockets = append(resp.Sockets, d.socketInfo(rs))
		}
	}
	d.mu.Unlock()
	d.addTotals(resp.Sockets)
	slices.SortFunc(resp.Sockets, func(a, b api.SocketInfo) int { return cmp.Compare(a.Cookie, b.Cookie) })
	return resp, nil, nil
}

// listRules lists the rules req asks for (req.After, req.Limit, req.Tag)
// and says whether more follow. A page (req.Limit > 0) also ends before its
// size could reach half the frame limit, after at least one rule.
func (d *Daemon) listRules(rs *ruleSet, req *api.Message) ([]api.Rule, bool, error) {
	var out []api.Rule
	more, size := false, 0
	err := d.dp.VisitRules(rs.info.Cookie, dataplane.RuleID(req.After), func(ri dataplane.RuleInfo) bool {
		tag := rs.rules[uint64(ri.ID)].tag // santad's, not the data plane's
		if req.Tag != "" && tag != req.Tag {
			return true
		}
		r := fromDataplane(ri)
		r.Tag = tag
		n := encodedBound(r)
		if req.Limit > 0 && (len(out) == int(req.Limit) || len(out) > 0 && size+n > api.MaxFrame/2) {
			more = true
			return false
		}
		out, size = append(out, r), size+n
		return true
	})
	return out, more, err
}

// deleteTagged deletes the rules ids, or with tag (and no ids) every rule
// that has it, and returns the ids it deleted for a tag.
func (d *Daemon) deleteTagged(rs *ruleSet, ids []uint64, tag string) ([]uint64, error) {
	if tag == "" {
		return nil, d.delete(rs, ids)
	}
	if len(ids) > 0 {
		return nil, fail(api.StatusInvalid, "delete takes ids or a tag, not both")
	}
	for id, m := range rs.rules {
		if m.tag == tag {
			ids = append(ids, id)
		}
	}
	if len(ids) == 0 {
		return nil, nil
	}
	slices.Sort(ids)
	return ids, d.deleteKnown(rs, ids) // rules of rs, each once: nothing to check
}

func (d *Daemon) stats(cookie uint64, ids []uint64) ([]api.RuleStats, error) {
	all, err := d.dp.RuleStats(cookie)
	if errors.Is(err, dataplane.ErrNotBound) { // unbound since the request was checked
		return nil, fail(api.StatusNotFound, "socket %d has no rule set", cookie)
	}
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		for id := range all {
			ids = append(ids, uint64(id))
		}
		slices.Sort(ids)
	}
	out := make([]api.RuleStats, len(ids))
	seen := make(map[uint64]bool, len(ids))
	for i, id := range ids {
		st, ok := all[dataplane.RuleID(id)]
		if !ok {
			return nil, fail(api.StatusNotFound, "socket %d has no rule with id %d", cookie, id)
		}
		if seen[id] {
			return nil, fail(api.StatusInvalid, "id %d is listed twice", id)
		}
		seen[id] = true
		out[i] = api.RuleStats{ID: id, Hits: st.Hits, Bytes: st.Bytes}
	}
	return out, nil
}
