package stalecheck

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/santa-offload/santa/internal/mcproto"
)

// maxValueLen keeps every value, with its VALUE line, in one UDP reply
// datagram (memcached puts at most 1400 bytes in one).
const maxValueLen = 1024

// numberStep separates the write sequence number (the low digits) from
// the part incr and decr move: a number the writer makes is
// base*numberStep + seq, unique per key because seq is. The numbers stay
// far below 2^63: memcached 1.6.18 may call a larger value non-numeric (it
// scans the unterminated item data past the value for a '-').
const numberStep = 1_000_000_000

// model is the state a writer predicts for one of its keys.
type model struct {
	state State
	// padded: the value is an incr/decr result, which memcached may keep
	// with trailing spaces; appending to it would make unknown bytes.
	padded bool
	// unknown: the last write got no successful reply, so it may or may
	// not have happened; the next write is a set.
	unknown bool
}

// number is the key's decimal value, if it has one.
func (m model) number() (uint64, bool) {
	v := m.state.Value
	if !m.state.Present || len(v) == 0 || len(v) > 20 || slices.ContainsFunc(v, func(b byte) bool { return b < '0' || b > '9' }) {
		return 0, false
	}
	n, err := strconv.ParseUint(string(v), 10, 64)
	return n, err == nil
}

// fits reports whether op succeeds on a key in state m and keeps the
// model exact.
func fits(op string, m model) bool {
	present := m.state.Present
	switch op {
	case OpSet:
		return true
	case OpAdd:
		return !present
	case OpReplace, OpCAS, OpDelete, OpTouch:
		return present
	case OpAppend, OpPrepend:
		return present && !m.padded && len(m.state.Value) <= maxValueLen-32
	case OpIncr:
		_, ok := m.number()
		return ok
	case OpDecr:
		n, ok := m.number()
		return ok && n >= 2*numberStep
	}
	return false
}

// plan is one write: what to send and the state it leaves.
type plan struct {
	op      string
	value   []byte // the new value, or the bytes appended or prepended
	flags   uint32
	exptime int32
	delta   uint64 // incr, decr
	next    model
}

// writer writes its own subset of the keys.
type writer struct {
	r       *run
	keys    []*key
	rng     *rand.Rand
	conns   map[string]mcproto.Conn // by protocol, dialed when first used
	rep     *Report
	flushes bool // flush_all is among the ops
	numbers bool // incr or decr is among the ops: half the new values are numbers
}

func (r *run) newWriter(id int, rep *Report) *writer {
	w := &writer{
		r:       r,
		rng:     rand.New(rand.NewPCG(r.cfg.Seed, uint64(id))),
		conns:   map[string]mcproto.Conn{},
		rep:     rep,
		flushes: slices.Contains(r.cfg.Ops, OpFlushAll),
		numbers: slices.Contains(r.cfg.Ops, OpIncr) || slices.Contains(r.cfg.Ops, OpDecr),
	}
	for i := id; i < len(r.keys); i += r.cfg.Writers {
		w.keys = append(w.keys, r.keys[i])
	}
	return w
}

func (w *writer) loop(ctx context.Context) {
	defer func() {
		for _, c := range w.conns {
			c.Close()
		}
	}()
	cfg := w.r.cfg
	for !w.r.done(ctx) {
		proto := cfg.Protocols[w.rng.IntN(len(cfg.Protocols))]
		if w.flushes && w.rng.IntN(cfg.FlushEvery) == 0 {
			w.flush(proto)
		} else {
			w.write(w.keys[w.rng.IntN(len(w.keys))], proto)
		}
		if cfg.WritePause > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(cfg.WritePause):
			}
		}
	}
}

// conn returns the writer's connection for proto.
func (w *writer) conn(proto string) (mcproto.Conn, error) {
	if c := w.conns[proto]; c != nil {
		return c, nil
	}
	c, err := w.r.dial(proto)
	if err == nil {
		w.conns[proto] = c
	}
	return c, err
}

// chooseOp picks a listed op that fits the key's state.
func (w *writer) chooseOp(m model) string {
	if m.unknown {
		return OpSet
	}
	var fit []string
	for _, op := range w.r.cfg.Ops {
		if op != OpFlushAll && fits(op, m) {
			fit = append(fit, op)
		}
	}
	switch {
	case len(fit) > 0:
		return fit[w.rng.IntN(len(fit))]
	case m.state.Present && slices.Contains(w.r.cfg.Ops, OpAdd):
		return OpDelete
	}
	return OpSet
}

// plan chooses the next write of k, the write with history index seq.
func (w *writer) plan(k *key, seq int) plan {
	m := k.model
	p := plan{op: w.chooseOp(m), next: m}
	if w.rng.IntN(2) == 0 {
		p.exptime = 3600 // an expiration time, but none that passes during a run
	}
	switch p.op {
	case OpSet, OpAdd, OpReplace, OpCAS:
		p.value = w.newValue(seq)
		p.flags = uint32(seq)
		p.next = model{state: State{Present: true, Value: p.value, Flags: p.flags}}
	case OpAppend:
		p.value = fmt.Appendf(nil, "(a%d)", seq)
		p.next.state.Value = append(slices.Clip(m.state.Value), p.value...)
	case OpPrepend:
		p.value = fmt.Appendf(nil, "(p%d)", seq)
		p.next.state.Value = append(slices.Clip(p.value), m.state.Value...)
	case OpIncr, OpDecr:
		n, _ := m.number()
		base := n / numberStep
		if p.op == OpIncr {
			base++
		} else {
			base--
		}
		result := base*numberStep + uint64(seq)
		p.delta = max(n, result) - min(n, result)
		p.next = model{state: State{Present: true, Value: strconv.AppendUint(nil, result, 10), Flags: m.state.Flags}, padded: true}
	case OpDelete:
		p.next = model{}
	}
	return p
}

// newValue is the value of a set, add, replace or cas: a number (when
// incr or decr is listed, half of the time) or text with the run's nonce,
// both unique to this write.
func (w *writer) newValue(seq int) []byte {
	if w.numbers && w.rng.IntN(2) == 0 {
		base := 1000 + w.rng.Uint64N(1_000_000)
		return strconv.AppendUint(nil, base*numberStep+uint64(seq), 10)
	}
	v := fmt.Appendf(nil, "%s-%d-", w.r.nonce, seq)
	for range w.rng.IntN(64) {
		v = append(v, 'a'+byte(seq%26))
	}
	return v
}

// write makes one write of k over proto.
func (w *writer) write(k *key, proto string) {
	w.r.writes.RLock()
	defer w.r.writes.RUnlock()
	c, err := w.conn(proto)
	if err != nil {
		w.failed(proto, []*key{k}, "dial", err)
		return
	}
	// Only this writer appends to k's history while it holds writes
	// shared, so the length is stable here.
	p := w.plan(k, len(k.history))
	var cas uint64
	if p.op == OpCAS {
		it, err := c.Gets(k.name)
		got := State{Present: true, Value: it.Value, Flags: it.Flags}
		if err == nil && !(&Write{State: k.model.state, Padded: k.model.padded}).shows(got) {
			err = &modelError{fmt.Errorf("returned %v, want %v", got, k.model.state)}
		}
		if err != nil {
			w.failed(proto, []*key{k}, fmt.Sprintf("gets %q before cas", k.name), err)
			return
		}
		cas = it.CAS
	}
	i := w.record(k, p.op, proto, p.next)
	if err := w.send(c, k.name, p, cas); err != nil {
		w.failed(proto, []*key{k}, fmt.Sprintf("%s %q", p.op, k.name), err)
		return
	}
	w.ack(k, i)
	k.model = p.next
	w.counted(p.op, proto)
}

// send sends the write p of key to memcached.
func (w *writer) send(c mcproto.Conn, key string, p plan, cas uint64) error {
	switch p.op {
	case OpSet:
		return c.Set(key, p.value, p.flags, p.exptime)
	case OpAdd:
		return c.Add(key, p.value, p.flags, p.exptime)
	case OpReplace:
		return c.Replace(key, p.value, p.flags, p.exptime)
	case OpCAS:
		return c.CAS(key, p.value, p.flags, p.exptime, cas)
	case OpAppend:
		return c.Append(key, p.value)
	case OpPrepend:
		return c.Prepend(key, p.value)
	case OpIncr, OpDecr:
		f := c.Incr
		if p.op == OpDecr {
			f = c.Decr
		}
		n, err := f(key, p.delta)
		if err == nil && string(strconv.AppendUint(nil, n, 10)) != string(p.next.state.Value) {
			return &modelError{fmt.Errorf("result %d, want %s", n, p.next.state.Value)}
		}
		return err
	case OpDelete:
		return c.Delete(key)
	case OpTouch:
		return c.Touch(key, p.exptime)
	}
	return fmt.Errorf("no such op %q", p.op)
}

// flush sends a flush_all over proto, which empties every key: it holds
// writes exclusively, so no other write is in flight meanwhile.
func (w *writer) flush(proto string) {
	w.r.writes.Lock()
	defer w.r.writes.Unlock()
	c, err := w.conn(proto)
	if err != nil {
		w.failed(proto, w.r.keys, "dial", err)
		return
	}
	index := make([]int, len(w.r.keys))
	for i, k := range w.r.keys {
		index[i] = w.record(k, OpFlushAll, proto, model{})
	}
	if err := c.FlushAll(); err != nil {
		w.failed(proto, w.r.keys, OpFlushAll, err)
		return
	}
	for i, k := range w.r.keys {
		w.ack(k, index[i])
		k.model = model{}
	}
	w.counted(OpFlushAll, proto)
}

// record appends a write to k's history before it is sent and returns its
// index.
func (w *writer) record(k *key, op, proto string, next model) int {
	k.mu.Lock()
	defer k.mu.Unlock()
	i := len(k.history)
	k.history = append(k.history, Write{Index: i, Op: op, Protocol: proto, State: next.state, Padded: next.padded, Sent: time.Now()})
	return i
}

// ack publishes that write i of k has been acknowledged.
func (w *writer) ack(k *key, i int) {
	k.mu.Lock()
	k.history[i].Acked = time.Now()
	k.mu.Unlock()
	k.acked.Store(int64(i))
}

func (w *writer) counted(op, proto string) {
	w.rep.Writes++
	w.rep.PerOp[op]++
	w.rep.PerProtocol[proto]++
}

// modelError is a reply that contradicts the writer's prediction.
type modelError struct{ error }

// failed handles a write without a successful reply: the keys' states are
// unknown until their next set. A reply that contradicts the writer's
// prediction (e.g. NOT_STORED for an add it thought would succeed) is a
// model error; anything else (no reply, a broken connection) a write
// error, after which the connection is replaced.
func (w *writer) failed(proto string, keys []*key, what string, err error) {
	for _, k := range keys {
		k.model.unknown = true
	}
	var me *modelError
	var se *mcproto.ServerError
	if errors.As(err, &me) || errors.As(err, &se) || errors.Is(err, mcproto.ErrNotStored) ||
		errors.Is(err, mcproto.ErrExists) || errors.Is(err, mcproto.ErrNotFound) || errors.Is(err, mcproto.ErrCacheMiss) {
		if len(w.rep.ModelErrors) < maxErrors {
			w.rep.ModelErrors = append(w.rep.ModelErrors, fmt.Sprintf("%s over %s: %v", what, proto, err))
		}
		return
	}
	w.rep.WriteErrors++
	w.rep.errorf("%s over %s: %v", what, proto, err)
	if c := w.conns[proto]; c != nil {
		c.Close()
		delete(w.conns, proto)
	}
}
