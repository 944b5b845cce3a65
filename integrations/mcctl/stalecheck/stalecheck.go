// Package stalecheck checks memcached's read-after-write guarantee as
// clients see it through Santa: once a client has received the reply to a
// write of a key, no GET of that key sent later over UDP (which the kernel
// may answer from an offloaded rule) returns an older value.
//
// Each key has exactly one writer goroutine, which predicts the key's
// state after every write and keeps the ordered history of those states.
// Writes go over the text, meta and binary protocols on TCP and the text
// protocol on UDP, rotating per write, and are chosen so that they succeed
// (add only on an absent key, replace only on a present one, incr and
// decr only on a decimal value, …). Every write makes a value the key has
// not had before, so a read identifies the write it reflects. When a
// write's reply arrives, the key's last acknowledged history index is
// published. A reader takes that index a before it sends a UDP GET; the
// reply must show the state of a write with index >= a that had been sent
// by the time the reply arrived (a write whose reply is still on its way
// may already show). Anything else is a Violation. A write without a
// reply leaves its key's state unknown until the writer's next set; its
// TCP connection is reset (mcproto), so that it cannot land later.
package stalecheck

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/santa-offload/santa/internal/mcproto"
)

// The protocols writes can use.
const (
	ProtoText   = "text"   // text protocol over TCP
	ProtoMeta   = "meta"   // meta commands over TCP
	ProtoBinary = "binary" // binary protocol over TCP
	ProtoUDP    = "udp"    // text protocol over UDP
)

// AllProtocols lists every protocol, the default of Config.Protocols.
var AllProtocols = []string{ProtoText, ProtoMeta, ProtoBinary, ProtoUDP}

// The write operations.
const (
	OpSet      = "set"
	OpAdd      = "add"
	OpReplace  = "replace"
	OpAppend   = "append"
	OpPrepend  = "prepend"
	OpCAS      = "cas"
	OpIncr     = "incr"
	OpDecr     = "decr"
	OpDelete   = "delete"
	OpTouch    = "touch"
	OpFlushAll = "flush_all"
)

// AllOps lists every operation, the default of Config.Ops.
var AllOps = []string{OpSet, OpAdd, OpReplace, OpAppend, OpPrepend, OpCAS, OpIncr, OpDecr, OpDelete, OpTouch, OpFlushAll}

// MaxViolations is how many violations a Report keeps in detail.
const MaxViolations = 100

// maxErrors is how many error messages a Report keeps.
const maxErrors = 20

// Config describes a run. Zero values take the defaults given.
type Config struct {
	TCP netip.AddrPort // memcached's TCP port: writes over text, meta and binary
	UDP netip.AddrPort // memcached's UDP port: every read, and writes over "udp"

	// Keys under test (memcached keys: at most 250 bytes, no spaces or
	// control characters). Each is written by exactly one writer. They
	// must all fit in memcached's memory: an evicted key reads as absent,
	// which is a violation.
	Keys []string
	// Writers and Readers are the numbers of goroutines (0: 1 each; at
	// most one writer per key).
	Writers, Readers int
	// Protocols writes rotate through, chosen at random per write (nil:
	// AllProtocols).
	Protocols []string
	// Ops writers choose from, at random among those that succeed in the
	// key's current state (nil: AllOps). A key in a state none of them
	// fits is written with set (or, if add is listed, a present key is
	// deleted), so e.g. {"add"} alternates add and delete.
	Ops []string
	// FlushEvery: when flush_all is listed, one write in FlushEvery is a
	// flush_all (0: 1000). flush_all empties every key, so it stops all
	// writers while it runs.
	FlushEvery int

	// Duration bounds the run (0: 5 s); MaxOps bounds the number of reads
	// plus writes (0: no bound). The run stops at whichever comes first.
	Duration time.Duration
	MaxOps   int
	// WritePause is each writer's pause between writes, so that most
	// reads see a settled value (0: none).
	WritePause time.Duration
	// ReadTimeout bounds each UDP GET (0: 1 s). A GET without a reply is
	// counted in ReadErrors, not judged.
	ReadTimeout time.Duration
	// Zipf, if > 1, makes readers pick keys with a Zipf distribution of
	// that exponent over Keys in order (Keys[0] hottest); otherwise they
	// go round robin.
	Zipf float64
	// Seed seeds each goroutine's random choices (0: a random seed); how
	// the goroutines interleave still varies.
	Seed uint64

	// Enter runs f on a thread in the network namespace where memcached
	// is reachable; every socket of the run is created inside it (e.g.
	// testbed.Side.Do). nil: the caller's namespace.
	Enter func(f func() error) error
}

// State is what a GET of a key returns: absent, or a value with flags.
type State struct {
	Present bool
	Value   []byte
	Flags   uint32
}

func (s State) String() string {
	if !s.Present {
		return "absent"
	}
	v := s.Value
	if len(v) > 48 {
		v = append(v[:40:40], "…"...)
	}
	return fmt.Sprintf("%q flags %d", v, s.Flags)
}

// Write is one entry of a key's history: a write and the state it leaves.
type Write struct {
	Index    int    // position in the key's history; 0 is the value the run starts with
	Op       string // one of the Op constants ("init" for index 0)
	Protocol string
	State    State
	// Padded: an incr/decr result, which memcached may store with
	// trailing spaces (it pads a result shorter than the old value when
	// it updates in place).
	Padded bool
	Sent   time.Time
	Acked  time.Time // zero: no successful reply (yet)
}

// shows reports whether a GET that returned read reflects this write.
func (w *Write) shows(read State) bool {
	if w.State.Present != read.Present {
		return false
	}
	if !read.Present {
		return true
	}
	value := read.Value
	if w.Padded {
		value = bytes.TrimRight(value, " ")
	}
	return w.State.Flags == read.Flags && bytes.Equal(w.State.Value, value)
}

// Violation is a stale (or never written) value returned by a GET.
type Violation struct {
	Key      string
	Read     State     // what the GET returned
	Sent     time.Time // when the GET was sent
	Received time.Time // when its reply arrived
	// Acked is the key's newest acknowledged write when the GET was sent:
	// the read had to show it or a newer write.
	Acked Write
	// Source is the newest older write the read shows; nil if no write
	// ever gave the key that state.
	Source *Write
	// Newest is the index of the newest write sent when the reply arrived.
	Newest int
}

func (v Violation) String() string {
	s := fmt.Sprintf("key %q: GET returned %v, but write #%d (%s over %s, to %v) was acknowledged %v before the GET was sent",
		v.Key, v.Read, v.Acked.Index, v.Acked.Op, v.Acked.Protocol, v.Acked.State, v.Sent.Sub(v.Acked.Acked).Round(time.Microsecond))
	if v.Source == nil {
		return s + "; no write ever made that state"
	}
	unacked := ""
	if v.Source.Acked.IsZero() {
		unacked = ", never acknowledged"
	}
	return s + fmt.Sprintf("; the read shows write #%d (%s over %s, sent %v before the GET%s)",
		v.Source.Index, v.Source.Op, v.Source.Protocol, v.Sent.Sub(v.Source.Sent).Round(time.Microsecond), unacked)
}

// Report is the outcome of a run.
type Report struct {
	Writes      uint64            // acknowledged writes
	WriteErrors uint64            // writes without a successful reply: their effect is unknown
	PerOp       map[string]uint64 // acknowledged writes per operation
	PerProtocol map[string]uint64 // acknowledged writes per protocol

	Reads      uint64 // GETs answered, including a final GET of every key after the writers stopped
	ReadErrors uint64 // GETs without a usable reply (timeouts, errors)
	Hits       uint64 // reads that returned a value
	Misses     uint64 // reads that returned none
	Current    uint64 // reads showing the write acknowledged last when they were sent
	Ahead      uint64 // reads showing a newer write, whose reply was still on its way

	Violations uint64      // stale reads
	Stale      []Violation // the first MaxViolations of them, by time
	// ModelErrors are (the first) writes whose outcome memcached reported
	// differently from the writer's prediction: a bug of the checker or
	// the server.
	ModelErrors []string
	Errors      []string // the first write and read errors
	Elapsed     time.Duration
	Seed        uint64 // the seed of the random choices (Config.Seed, or the one picked)
}

func (r Report) String() string {
	return fmt.Sprintf("%d writes (%d errors), %d reads (%d hits, %d misses, %d current, %d ahead, %d errors), %d violations, %d model errors in %v",
		r.Writes, r.WriteErrors, r.Reads, r.Hits, r.Misses, r.Current, r.Ahead, r.ReadErrors,
		r.Violations, len(r.ModelErrors), r.Elapsed.Round(time.Millisecond))
}

// merge adds o's counts to r.
func (r *Report) merge(o *Report) {
	r.Writes += o.Writes
	r.WriteErrors += o.WriteErrors
	for op, n := range o.PerOp {
		r.PerOp[op] += n
	}
	for p, n := range o.PerProtocol {
		r.PerProtocol[p] += n
	}
	r.Reads += o.Reads
	r.ReadErrors += o.ReadErrors
	r.Hits += o.Hits
	r.Misses += o.Misses
	r.Current += o.Current
	r.Ahead += o.Ahead
	r.Violations += o.Violations
	r.Stale = append(r.Stale, o.Stale...)
	r.ModelErrors = append(r.ModelErrors, o.ModelErrors...)
	r.Errors = append(r.Errors, o.Errors...)
}

func (r *Report) errorf(format string, args ...any) {
	if len(r.Errors) < maxErrors {
		r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
	}
}

func newReport() *Report {
	return &Report{PerOp: map[string]uint64{}, PerProtocol: map[string]uint64{}}
}

// key is one key under test.
type key struct {
	name string

	mu      sync.Mutex
	history []Write // every write sent, in order

	acked atomic.Int64 // index of the newest acknowledged write

	// model is the state the key's writer predicts after its last write;
	// only that writer (under run.writes shared) or a flush_all (under
	// run.writes exclusive) touches it.
	model model
}

// run is the shared state of a Run.
type run struct {
	cfg   Config
	keys  []*key
	nonce string // in every value: values of an earlier run cannot match
	start time.Time

	// writes is held shared by each write and exclusively by flush_all,
	// which writes every key.
	writes sync.RWMutex
	budget atomic.Int64 // reads and writes left (MaxOps)
}

// Run runs writers and readers against memcached until cfg.Duration has
// passed, cfg.MaxOps reads and writes are done or ctx ends, then reads
// every key once more and returns what it saw. The error is for a run
// that could not start (bad config, memcached unreachable); stale reads
// are in the Report.
func Run(ctx context.Context, cfg Config) (Report, error) {
	cfg, err := withDefaults(cfg)
	if err != nil {
		return Report{}, err
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0))
	r := &run{cfg: cfg, nonce: fmt.Sprintf("%08x", rng.Uint32())}
	if cfg.MaxOps > 0 {
		r.budget.Store(int64(cfg.MaxOps))
	} else {
		r.budget.Store(math.MaxInt64)
	}
	for _, name := range cfg.Keys {
		r.keys = append(r.keys, &key{name: name})
	}
	if err := r.init(); err != nil {
		return Report{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, cfg.Duration)
	defer cancel()
	r.start = time.Now()
	reports := make([]*Report, cfg.Writers+cfg.Readers)
	var wg sync.WaitGroup
	for i := range cfg.Writers {
		reports[i] = newReport()
		w := r.newWriter(i, reports[i])
		wg.Go(func() { w.loop(ctx) })
	}
	// A reader fails only if it cannot open its socket; the last slot is
	// the final pass's.
	readErrs := make([]error, cfg.Readers+1)
	for i := range cfg.Readers {
		rep := newReport()
		reports[cfg.Writers+i] = rep
		wg.Go(func() {
			if readErrs[i] = r.read(ctx, i, rep); readErrs[i] != nil {
				cancel()
			}
		})
	}
	wg.Wait()

	total := newReport()
	for _, rep := range reports {
		total.merge(rep)
	}
	final := newReport()
	readErrs[cfg.Readers] = r.finalReads(final)
	total.merge(final)
	total.Elapsed = time.Since(r.start)
	total.Seed = cfg.Seed
	slices.SortFunc(total.Stale, func(a, b Violation) int { return a.Sent.Compare(b.Sent) })
	total.Stale = total.Stale[:min(len(total.Stale), MaxViolations)]
	total.Errors = total.Errors[:min(len(total.Errors), maxErrors)]
	total.ModelErrors = total.ModelErrors[:min(len(total.ModelErrors), maxErrors)]
	if err := errors.Join(readErrs...); err != nil {
		return *total, fmt.Errorf("stalecheck: %w", err)
	}
	return *total, nil
}

// withDefaults validates cfg and fills in its defaults.
func withDefaults(cfg Config) (Config, error) {
	if len(cfg.Keys) == 0 {
		return cfg, errors.New("stalecheck: no keys")
	}
	seen := map[string]bool{}
	for _, k := range cfg.Keys {
		if len(k) == 0 || len(k) > 250 || strings.ContainsFunc(k, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return cfg, fmt.Errorf("stalecheck: %q is not a memcached key", k)
		}
		if seen[k] {
			return cfg, fmt.Errorf("stalecheck: key %q listed twice", k)
		}
		seen[k] = true
	}
	if cfg.Writers <= 0 {
		cfg.Writers = 1
	}
	cfg.Writers = min(cfg.Writers, len(cfg.Keys))
	if cfg.Readers <= 0 {
		cfg.Readers = 1
	}
	if cfg.Protocols == nil {
		cfg.Protocols = AllProtocols
	}
	if cfg.Ops == nil {
		cfg.Ops = AllOps
	}
	for _, p := range cfg.Protocols {
		if !slices.Contains(AllProtocols, p) {
			return cfg, fmt.Errorf("stalecheck: unknown protocol %q (want some of %s)", p, strings.Join(AllProtocols, ", "))
		}
	}
	for _, op := range cfg.Ops {
		if !slices.Contains(AllOps, op) {
			return cfg, fmt.Errorf("stalecheck: unknown op %q (want some of %s)", op, strings.Join(AllOps, ", "))
		}
	}
	if len(cfg.Protocols) == 0 || len(cfg.Ops) == 0 {
		return cfg, errors.New("stalecheck: no protocols or no ops")
	}
	if !cfg.UDP.IsValid() || (!cfg.TCP.IsValid() && slices.ContainsFunc(cfg.Protocols, func(p string) bool { return p != ProtoUDP })) {
		return cfg, errors.New("stalecheck: need memcached's UDP address, and its TCP address for TCP protocols")
	}
	if cfg.FlushEvery <= 0 {
		cfg.FlushEvery = 1000
	}
	if cfg.Duration <= 0 {
		cfg.Duration = 5 * time.Second
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = time.Second
	}
	if cfg.Seed == 0 {
		cfg.Seed = rand.Uint64()
	}
	if cfg.Enter == nil {
		cfg.Enter = func(f func() error) error { return f() }
	}
	return cfg, nil
}

// dial opens a connection for writes over proto, in cfg.Enter.
func (r *run) dial(proto string) (mcproto.Conn, error) {
	var c mcproto.Conn
	err := r.cfg.Enter(func() error {
		var err error
		switch proto {
		case ProtoText:
			c, err = mcproto.DialText(r.cfg.TCP.String())
		case ProtoMeta:
			c, err = mcproto.DialMeta(r.cfg.TCP.String())
		case ProtoBinary:
			c, err = mcproto.DialBinary(r.cfg.TCP.String())
		case ProtoUDP:
			c, err = mcproto.DialUDPConn(r.cfg.UDP)
		}
		return err
	})
	return c, err
}

// dialUDP opens a reader's socket, in cfg.Enter.
func (r *run) dialUDP() (*mcproto.UDPClient, error) {
	var u *mcproto.UDPClient
	err := r.cfg.Enter(func() (err error) { u, err = mcproto.DialUDP(r.cfg.UDP); return err })
	return u, err
}

// init gives every key a first value over the first protocol (history
// index 0): keys start present, as the hot keys Santa offloads are.
func (r *run) init() error {
	proto := r.cfg.Protocols[0]
	c, err := r.dial(proto)
	if err != nil {
		return fmt.Errorf("stalecheck: %w", err)
	}
	defer c.Close()
	now := time.Now()
	for _, k := range r.keys {
		st := State{Present: true, Value: fmt.Appendf(nil, "%s-init", r.nonce)}
		if err := c.Set(k.name, st.Value, 0, 0); err != nil {
			return fmt.Errorf("stalecheck: set %q: %w", k.name, err)
		}
		k.history = []Write{{Op: "init", Protocol: proto, State: st, Sent: now, Acked: now}}
		k.model = model{state: st}
	}
	return nil
}

// done consumes one operation of the budget and reports whether the run
// is over.
func (r *run) done(ctx context.Context) bool {
	return ctx.Err() != nil || r.budget.Add(-1) < 0
}

// read is one reader: UDP GETs of keys, judged against their history.
func (r *run) read(ctx context.Context, id int, rep *Report) error {
	u, err := r.dialUDP()
	if err != nil {
		return err
	}
	defer u.Close()
	rng := rand.New(rand.NewPCG(r.cfg.Seed, uint64(1<<32+id)))
	var next func() *key
	if r.cfg.Zipf > 1 {
		z := rand.NewZipf(rng, r.cfg.Zipf, 1, uint64(len(r.keys)-1))
		next = func() *key { return r.keys[z.Uint64()] }
	} else {
		i := id * len(r.keys) / r.cfg.Readers
		next = func() *key { i = (i + 1) % len(r.keys); return r.keys[i] }
	}
	for !r.done(ctx) {
		r.get(u, next(), rep)
	}
	return nil
}

// finalReads gets every key once after the writers have stopped.
func (r *run) finalReads(rep *Report) error {
	u, err := r.dialUDP()
	if err != nil {
		return err
	}
	defer u.Close()
	for _, k := range r.keys {
		r.get(u, k, rep)
	}
	return nil
}

// get sends one UDP GET of k and judges the reply.
func (r *run) get(u *mcproto.UDPClient, k *key, rep *Report) {
	acked := int(k.acked.Load())
	sent := time.Now()
	it, hit, err := u.Get(k.name, r.cfg.ReadTimeout)
	received := time.Now()
	if err != nil {
		rep.ReadErrors++
		rep.errorf("GET %q: %v", k.name, err)
		return
	}
	rep.Reads++
	read := State{Present: hit, Value: it.Value, Flags: it.Flags}
	if hit {
		rep.Hits++
	} else {
		rep.Misses++
	}

	k.mu.Lock()
	defer k.mu.Unlock()
	h := k.history
	if h[acked].shows(read) {
		rep.Current++
		return
	}
	for j := acked + 1; j < len(h); j++ {
		if h[j].shows(read) {
			rep.Ahead++
			return
		}
	}
	rep.Violations++
	if len(rep.Stale) >= MaxViolations {
		return
	}
	v := Violation{Key: k.name, Read: read, Sent: sent, Received: received, Acked: h[acked], Newest: len(h) - 1}
	for j := acked - 1; j >= 0; j-- {
		if h[j].shows(read) {
			src := h[j]
			v.Source = &src
			break
		}
	}
	rep.Stale = append(rep.Stale, v)
}
