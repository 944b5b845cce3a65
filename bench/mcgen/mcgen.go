//go:build linux

// Package mcgen is a UDP load generator for the namespace testbed that can
// saturate an XDP responder (kxdpgun only speaks DNS; a socket-based
// generator tops out near 290 k/s here). It is meant for memcached over UDP
// (see GetPayloads, Keys) but sends any UDP payloads.
//
// Frames are sent with BPF_PROG_RUN in live-frame mode
// (BPF_F_TEST_XDP_LIVE_FRAMES) from the client veth into the server veth:
// the kernel runs an XDP program on page-pool frames, the program copies
// the next prebuilt frame out of an array map and returns XDP_TX, which live
// mode turns into a transmission out of the ctx's ingress interface (the
// client veth). The frames are complete Ethernet frames built in user space
// (MACs of both veth ends, full IPv4/IPv6 header and UDP checksums), so the
// server sees ordinary, fully checksummed datagrams, arriving at the server
// veth as XDP frames (not skbs, as with kxdpgun's AF_XDP copy mode).
// Optionally the first two payload bytes (the memcached UDP request id) are
// rewritten per frame, fixing the UDP checksum incrementally.
//
// The same program, attached to the client veth in place of the testbed's
// xdp_pass while the Generator exists, counts the replies: UDP datagrams
// from the server port are counted and dropped, everything else is passed.
// Close puts the testbed's xdp_pass back. (It must be one program: a
// program run with repeat > 1 that is not attached anywhere is added to and
// removed from the kernel's XDP dispatcher around every call, which waits
// for RCU grace periods, 50–200 ms per call here.) The two roles are told
// apart by XDP metadata that only the BPF_PROG_RUN frames carry.
//
// Pacing (Config.Pacing): PaceCalls sends Batch frames per call back to back
// and sleeps between calls (clock_nanosleep on absolute deadlines); PaceSpin
// spaces every frame inside the kernel and keeps the client CPU busy. Both
// run on a locked OS thread inside the client namespace, pinned to
// Config.CPU. Every Run is bounded in time (≤ MaxDuration) and in frames
// (rate×d; the program enforces the budget). The loop is open: frames the
// server veth cannot take (its ring of 256 frames is full) are counted in
// Result.XmitErrors, not retried.
//
// Costs and limits measured on the 2-vCPU test VM (kernel 6.18):
//   - every call creates and destroys a page pool: ≈40–80 µs of client CPU
//     per call plus ≈0.15–0.2 µs per frame, so the sender's CPU per frame
//     is ≈5 µs at Batch 16, ≈0.8–1 µs at Batch 64, ≈0.4 µs at 256 and
//     ≈0.2–0.35 µs at 1024; PaceSpin, whose calls last 1 ms, sends
//     2.5–3 M frames/s unpaced on one core (≈0.16–0.25 µs per frame);
//   - the pools outlive their call by about a second (frames still in
//     flight), take ids from a system-wide space of 65534 XDP memory models
//     and each release walks all of them under a global mutex: calls per
//     second are capped (Config.MaxCallRate), see DefaultMaxCallRate;
//   - live frames are whole pages: an skb built from one at the server has
//     a truesize of 4240 bytes instead of 832 for the same datagram sent
//     from a socket, so a socket with the default 212992-byte receive
//     buffer holds only 50 queued datagrams instead of 256 (a burst of 64
//     already overflows it). net.core.rmem_default is read-only outside the
//     initial namespace on this kernel: use SetUDPRcvbuf on a socket
//     server (e.g. memcached) to give it the usual capacity back.
package mcgen

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -mcpu=v3 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel mcgen bpf/mcgen.c

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

const (
	maxFrame  = 512     // bytes per prebuilt frame, Ethernet header included (MAX_FRAME in bpf/mcgen.c)
	maxFrames = 1 << 17 // prebuilt frames at most (about 66 MB of array map)
	ethLen    = 14
	ip4Len    = 20
	ip6Len    = 40
	udpLen    = 8
	metaLen   = 8 // XDP metadata in front of generator frames

	// MaxBatch is the largest Config.Batch.
	MaxBatch = 16384
	// MaxPoolBatch is the largest Config.PoolBatch (the kernel's
	// TEST_XDP_MAX_BATCH).
	MaxPoolBatch = 256
	// DefaultMaxCallRate is the default Config.MaxCallRate and
	// HardMaxCallRate its upper limit. Every BPF_PROG_RUN call in live
	// mode creates a page pool and registers it as an XDP memory model;
	// the pool outlives the call by about a second when frames are still
	// in flight (they usually are), the ids come from one system-wide
	// space of 65534, and every pool's release walks the table of all of
	// them under a global mutex (in a kworker on the client CPU). Tens of
	// thousands of calls per second exhaust the ids (ENOSPC, for every
	// XDP user on the machine) and a few thousand already cost a
	// noticeable share of the client CPU.
	DefaultMaxCallRate = 2000
	HardMaxCallRate    = 10000
	// AutoCallRate is the call rate AutoBatch aims at.
	AutoCallRate = 1000
	// MaxDuration bounds one Run.
	MaxDuration = 10 * time.Minute
	// DefaultSrcPortBase is the first source port used.
	DefaultSrcPortBase = 40000
)

// MaxPayload is the largest UDP payload for family 4 or 6.
func MaxPayload(family int) int {
	if family == 6 {
		return maxFrame - ethLen - ip6Len - udpLen
	}
	return maxFrame - ethLen - ip4Len - udpLen
}

// Pacing is how a Generator holds its rate.
type Pacing int

const (
	// PaceCalls sends Batch frames back to back per BPF_PROG_RUN call
	// (flushed to the veth every PoolBatch frames) and sleeps between
	// calls so that the average is the rate. The server sees bursts of
	// Batch frames at the generator's full speed (several M/s); the
	// sending thread is busy only while sending.
	PaceCalls Pacing = iota
	// PaceSpin spaces the frames evenly inside the kernel: every call
	// runs the program SpinCall long, and the program sends a frame only
	// when the next one is due (otherwise the page is dropped unsent).
	// Smooth traffic at any rate, but the sending thread keeps its CPU
	// busy for the whole run (like a DPDK generator), so its CPU time says
	// nothing about the cost per frame, and it holds the rate only while
	// it has that CPU to itself.
	PaceSpin
)

// Config describes what a Generator sends.
type Config struct {
	// TB is the testbed: frames go from TB.Client's veth (its MAC and
	// address as source) to TB.Server's veth (MAC and address as
	// destination). Required.
	TB *testbed.Testbed
	// Family is 4 or 6.
	Family int
	// DstPort is the server's UDP port (e.g. 11211). Replies are the UDP
	// datagrams arriving at the client veth from this port to one of the
	// generator's source ports (others, e.g. a prober's, are passed).
	DstPort uint16
	// Payloads are the UDP payloads, sent in order and cycled. At most
	// 131072 of them, each at most MaxPayload(Family) bytes.
	Payloads [][]byte
	// RequestID: rewrite payload bytes 0..1 (big endian) of every frame
	// with a 16-bit counter (the memcached UDP frame header's request id)
	// and count a reply as matched when the id in its first two payload
	// bytes is one that was sent and not answered yet. Payloads must then
	// be at least 2 bytes long.
	RequestID bool
	// SrcPorts spreads the frames over this many client source ports,
	// SrcPortBase, SrcPortBase+1, … (RSS-like variety). 0 means 1. Frame i
	// carries payload i mod len(Payloads) from port SrcPortBase + i mod
	// SrcPorts; the generator cycles over lcm(len(Payloads), SrcPorts)
	// prebuilt frames (or len(Payloads) if the lcm exceeds the frame limit).
	SrcPorts int
	// SrcPortBase is the first source port (0: DefaultSrcPortBase).
	SrcPortBase uint16
	// Batch is the number of frames per BPF_PROG_RUN call (its repeat
	// count) with PaceCalls, sent back to back: the burst size of the
	// generator. Pacing happens between calls. 0 picks AutoBatch(rate) for
	// every Run. Unused with PaceSpin.
	Batch int
	// PoolBatch is live mode's batch_size: the kernel runs the program
	// on this many page-pool frames, then flushes them to the veth (whose
	// ring towards the server holds 256 frames). 1..256; 0: 64 (at most
	// Batch with PaceCalls).
	PoolBatch int
	// Pacing selects how the rate is held (PaceCalls, the default, or
	// PaceSpin).
	Pacing Pacing
	// SpinCall is the length of one BPF_PROG_RUN call with PaceSpin
	// (0: 1 ms).
	SpinCall time.Duration
	// MaxCallRate bounds BPF_PROG_RUN calls per second (see
	// DefaultMaxCallRate, the default; at most HardMaxCallRate). A paced
	// Run whose rate needs more calls per second than this with Batch
	// frames per call fails; an unpaced Run spaces its calls.
	MaxCallRate int
	// CPU is the CPU the sending thread is pinned to while Run runs; -1
	// leaves its affinity alone. The zero value is CPU0, the client CPU of
	// testbed.DefaultPlacement.
	CPU int
	// Drain is how long Run keeps counting replies after the last frame
	// was sent (0: 100 ms).
	Drain time.Duration
}

// Result is what one Run did.
type Result struct {
	Sent       uint64        // frames transmitted with XDP_TX by the generator program
	Xmit       uint64        // frames the client veth put into the server veth's ring (ethtool tx_queue_*_xdp_xmit; Sent = Xmit + XmitErrors)
	XmitErrors uint64        // of those, refused by the veth (server side's ring full): never arrived
	Vanished   uint64        // Sent − Xmit − XmitErrors: frames dropped before the veth counted them (no NAPI on the server veth); should be 0
	Failed     uint64        // frames the program could not build (should be 0)
	Replies    uint64        // UDP datagrams from DstPort that arrived at the client veth
	Matched    uint64        // RequestID only: replies whose request id was in flight
	Unmatched  uint64        // RequestID only: other replies (duplicates, ids already answered or never sent)
	Passed     uint64        // other frames at the client veth, passed to the stack
	Calls      uint64        // BPF_PROG_RUN calls
	Iterations uint64        // program runs requested (repeat counts; with PaceSpin most send nothing)
	Idle       uint64        // program runs that sent nothing (pacing or the frame limit)
	Elapsed    time.Duration // from the first call until the last returned (a paced run: d)
	Drain      time.Duration // waited after that for late replies
	ThreadCPU  time.Duration // CPU time of the sending thread during the send loop (schedstat)
	Rate       int           // requested rate (frames/s, 0: as fast as possible)
	Batch      int           // frames per call used (PaceCalls; 0 with PaceSpin)
	PoolBatch  int           // live-mode batch_size used
}

// AutoBatch is the Batch used for rate when Config.Batch is 0: enough
// frames per call for about AutoCallRate calls per second, at least 16 and
// at most 256 (the server veth's ring), but more if maxCallRate calls per
// second would not do; 256 when unpaced.
func AutoBatch(rate, maxCallRate int) int {
	if rate <= 0 {
		return 256
	}
	b := min(max((rate+AutoCallRate-1)/AutoCallRate, 16), 256)
	if maxCallRate > 0 {
		b = max(b, (rate+maxCallRate-1)/maxCallRate)
	}
	return min(b, MaxBatch)
}

// SendRate is Sent per second of Elapsed.
func (r Result) SendRate() float64 {
	if r.Elapsed <= 0 {
		return 0
	}
	return float64(r.Sent) / r.Elapsed.Seconds()
}

// Delivered is Sent minus XmitErrors: frames that reached the server veth.
func (r Result) Delivered() uint64 {
	if r.XmitErrors > r.Sent {
		return 0
	}
	return r.Sent - r.XmitErrors
}

// CPUPerFrame is the sending thread's CPU time per sent frame. With
// PaceSpin it includes the spinning between frames (meaningful only when
// Idle is 0, i.e. unpaced).
func (r Result) CPUPerFrame() time.Duration {
	if r.Sent == 0 {
		return 0
	}
	return r.ThreadCPU / time.Duration(r.Sent)
}

func (r Result) String() string {
	s := fmt.Sprintf("sent %d (%.0f/s, %d xmit errors", r.Sent, r.SendRate(), r.XmitErrors)
	if r.Vanished > 0 {
		s += fmt.Sprintf(", %d vanished", r.Vanished)
	}
	s += fmt.Sprintf(") replies %d in %v", r.Replies, r.Elapsed.Round(time.Millisecond))
	if r.Matched+r.Unmatched > 0 {
		s += fmt.Sprintf(" (matched %d, unmatched %d)", r.Matched, r.Unmatched)
	}
	switch {
	case r.Sent > 0 && r.Idle == 0:
		s += fmt.Sprintf(", %v sender CPU/frame", r.CPUPerFrame())
	case r.Sent > 0:
		s += fmt.Sprintf(", sender spun %v", r.ThreadCPU.Round(time.Millisecond))
	}
	return s
}

// Generator is a loaded generator with its reply counter attached to the
// client veth.
type Generator struct {
	cfg     Config
	objs    mcgenObjects
	data    []byte // initial frame content for PROG_RUN
	nframes int

	mu     sync.Mutex
	closed bool
}

// New builds the frames, loads the program and attaches it to the client
// veth (replacing the testbed's xdp_pass until Close). It also turns GRO on
// at the server veth, as testbed.Place does: a veth accepts XDP frames
// from its peer only while it has NAPI, i.e. an XDP program or GRO; without
// either they would be dropped uncounted.
func New(cfg Config) (*Generator, error) {
	if cfg.TB == nil {
		return nil, errors.New("mcgen: Config.TB is required")
	}
	if cfg.Family != 4 && cfg.Family != 6 {
		return nil, fmt.Errorf("mcgen: Family %d, want 4 or 6", cfg.Family)
	}
	if cfg.DstPort == 0 {
		return nil, errors.New("mcgen: DstPort is required")
	}
	if len(cfg.Payloads) == 0 || len(cfg.Payloads) > maxFrames {
		return nil, fmt.Errorf("mcgen: %d payloads, want 1..%d", len(cfg.Payloads), maxFrames)
	}
	for i, p := range cfg.Payloads {
		if len(p) > MaxPayload(cfg.Family) {
			return nil, fmt.Errorf("mcgen: payload %d is %d bytes, at most %d", i, len(p), MaxPayload(cfg.Family))
		}
		if cfg.RequestID && len(p) < 2 {
			return nil, fmt.Errorf("mcgen: payload %d is shorter than the 2-byte request id", i)
		}
	}
	if cfg.SrcPorts <= 0 {
		cfg.SrcPorts = 1
	}
	if cfg.SrcPortBase == 0 {
		cfg.SrcPortBase = DefaultSrcPortBase
	}
	if int(cfg.SrcPortBase)+cfg.SrcPorts-1 > 65535 {
		return nil, fmt.Errorf("mcgen: %d source ports from %d exceed 65535", cfg.SrcPorts, cfg.SrcPortBase)
	}
	if cfg.Batch < 0 || cfg.Batch > MaxBatch {
		return nil, fmt.Errorf("mcgen: Batch %d out of range 0..%d", cfg.Batch, MaxBatch)
	}
	if cfg.PoolBatch < 0 || cfg.PoolBatch > MaxPoolBatch {
		return nil, fmt.Errorf("mcgen: PoolBatch %d out of range 0..%d", cfg.PoolBatch, MaxPoolBatch)
	}
	if cfg.MaxCallRate == 0 {
		cfg.MaxCallRate = DefaultMaxCallRate
	}
	if cfg.MaxCallRate < 0 || cfg.MaxCallRate > HardMaxCallRate {
		return nil, fmt.Errorf("mcgen: MaxCallRate %d out of range 1..%d", cfg.MaxCallRate, HardMaxCallRate)
	}
	if cfg.Drain <= 0 {
		cfg.Drain = 100 * time.Millisecond
	}
	if cfg.SpinCall <= 0 {
		cfg.SpinCall = time.Millisecond
	}
	if cfg.SpinCall > 100*time.Millisecond {
		return nil, fmt.Errorf("mcgen: SpinCall %v > 100ms", cfg.SpinCall)
	}
	if cfg.Pacing != PaceCalls && cfg.Pacing != PaceSpin {
		return nil, fmt.Errorf("mcgen: unknown Pacing %d", cfg.Pacing)
	}

	frames := BuildFrames(cfg)
	magic := rand.Uint64() | 1
	spec, err := loadMcgen()
	if err != nil {
		return nil, err
	}
	spec.Maps["frames"].MaxEntries = uint32(len(frames))
	l4 := ethLen + ip4Len
	if cfg.Family == 6 {
		l4 = ethLen + ip6Len
	}
	for name, v := range map[string]any{
		"nframes":        uint32(len(frames)),
		"server_port":    cfg.DstPort,
		"client_port_lo": cfg.SrcPortBase,
		"client_port_hi": cfg.SrcPortBase + uint16(cfg.SrcPorts-1),
		"l4_off":         uint32(l4),
		"stamp_id":       boolU8(cfg.RequestID),
		"gen_magic":      magic,
	} {
		sv, ok := spec.Variables[name]
		if !ok {
			return nil, fmt.Errorf("mcgen: no variable %s in the BPF object", name)
		}
		if err := sv.Set(v); err != nil {
			return nil, fmt.Errorf("mcgen: set %s: %w", name, err)
		}
	}
	g := &Generator{cfg: cfg, nframes: len(frames)}
	if err := spec.LoadAndAssign(&g.objs, nil); err != nil {
		return nil, fmt.Errorf("mcgen: load: %w", err)
	}
	keys := make([]uint32, len(frames))
	vals := make([]mcgenFrame, len(frames))
	for i, f := range frames {
		keys[i] = uint32(i)
		vals[i].Len = uint32(len(f))
		copy(vals[i].Data[:], f)
	}
	if _, err := g.objs.Frames.BatchUpdate(keys, vals, nil); err != nil {
		g.objs.Close()
		return nil, fmt.Errorf("mcgen: store %d frames: %w", len(frames), err)
	}
	// Live mode starts every page with this content and length: 8 bytes
	// of metadata (the magic that selects the generator role) and a
	// frame. The program overwrites the frame, adjusting its length, and
	// strips the metadata before transmitting.
	g.data = binary.NativeEndian.AppendUint64(nil, magic)
	g.data = append(g.data, frames[0]...)

	if _, err := cfg.TB.Server.Run("ethtool", "-K", cfg.TB.Server.Dev, "gro", "on"); err != nil {
		g.objs.Close()
		return nil, fmt.Errorf("mcgen: GRO on at the server veth: %w", err)
	}
	c := cfg.TB.Client
	if err := testbed.AttachXDPNetlink(c.NS, c.Ifindex, g.objs.Mcgen, testbed.XDPModeDriver); err != nil {
		g.objs.Close()
		return nil, fmt.Errorf("mcgen: attach reply counter to %s: %w", c.Dev, err)
	}
	return g, nil
}

func boolU8(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Frames is the number of prebuilt frames the generator cycles over.
func (g *Generator) Frames() int { return g.nframes }

// Close puts the testbed's xdp_pass back on the client veth and unloads the
// program. Safe to call more than once.
func (g *Generator) Close() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return nil
	}
	g.closed = true
	err := g.cfg.TB.AttachClientPass()
	if cerr := g.objs.Close(); err == nil {
		err = cerr
	}
	return err
}

type counters struct {
	sent, failed, idle                  uint64
	replies, matched, unmatched, passed uint64
	xmit, xmitErr                       uint64
}

func (g *Generator) read() (counters, error) {
	var c counters
	if err := g.objs.Sent.Get(&c.sent); err != nil {
		return c, err
	}
	if err := g.objs.Failed.Get(&c.failed); err != nil {
		return c, err
	}
	if err := g.objs.Idle.Get(&c.idle); err != nil {
		return c, err
	}
	for i, p := range []*uint64{&c.replies, &c.matched, &c.unmatched, &c.passed} {
		var per []uint64
		if err := g.objs.Counts.Lookup(uint32(i), &per); err != nil {
			return c, fmt.Errorf("mcgen: read counters: %w", err)
		}
		for _, v := range per {
			*p += v
		}
	}
	var err error
	c.xmit, c.xmitErr, err = xdpXmitStats(g.cfg.TB.Client)
	return c, err
}

// xdpXmitStats reads the veth's ethtool counters tx_queue_N_xdp_xmit and
// tx_queue_N_xdp_xmit_errors (frames this end put into, or could not put
// into, the peer's XDP ring), summed over the queues.
func xdpXmitStats(s testbed.Side) (xmit, errs uint64, err error) {
	out, err := s.Run("ethtool", "-S", s.Dev)
	if err != nil {
		return 0, 0, err
	}
	for _, line := range strings.Split(out, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(k, "tx_queue_") {
			continue
		}
		n, perr := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if perr != nil {
			continue
		}
		switch {
		case strings.HasSuffix(k, "_xdp_xmit_errors"):
			errs += n
		case strings.HasSuffix(k, "_xdp_xmit"):
			xmit += n
		}
	}
	return xmit, errs, nil
}

// boostNAPI makes the client veth's threaded-NAPI kthreads (if any)
// SCHED_FIFO 1 until restore is called. The sending thread keeps the client
// CPU busy inside BPF_PROG_RUN (all the time with PaceSpin, for a whole
// batch with PaceCalls); a normal-priority NAPI kthread on the same CPU then
// runs too late, the server's ring towards the client (256 frames)
// overflows and replies are lost. A real-time NAPI thread preempts the
// sender between two kernel batches (PoolBatch frames).
func boostNAPI(tb *testbed.Testbed) (restore func(), err error) {
	pids, err := tb.ClientNAPIThreads()
	if err != nil {
		return nil, fmt.Errorf("mcgen: find client NAPI threads: %w", err)
	}
	type saved struct {
		pid  int
		attr *unix.SchedAttr
	}
	var done []saved
	restore = func() {
		for _, s := range done {
			unix.SchedSetAttr(s.pid, s.attr, 0)
		}
	}
	for _, pid := range pids {
		old, err := unix.SchedGetAttr(pid, 0)
		if err != nil {
			restore()
			return nil, fmt.Errorf("mcgen: sched_getattr of NAPI thread %d: %w", pid, err)
		}
		if old.Policy == unix.SCHED_FIFO || old.Policy == unix.SCHED_RR {
			continue
		}
		attr := &unix.SchedAttr{Policy: unix.SCHED_FIFO, Priority: 1}
		if err := unix.SchedSetAttr(pid, attr, 0); err != nil {
			restore()
			return nil, fmt.Errorf("mcgen: make NAPI thread %d SCHED_FIFO: %w", pid, err)
		}
		done = append(done, saved{pid, old})
	}
	return restore, nil
}

// xdpMD is struct xdp_md, the PROG_RUN context.
type xdpMD struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}

// Run sends at rate frames per second (0 or less: as fast as one thread
// can) for d, then waits Config.Drain for late replies, and returns the
// counts of this run. It stops early when ctx is done (returning what was
// done so far and ctx's error). At most rate×d frames are sent. A paced
// run lasts d. Runs of one Generator are serialised. While Run runs, the
// client veth's threaded-NAPI kthreads (testbed.Place) are SCHED_FIFO, so
// that the replies are processed in time on the sender's CPU.
func (g *Generator) Run(ctx context.Context, rate int, d time.Duration) (Result, error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closed {
		return Result{}, errors.New("mcgen: generator closed")
	}
	if d <= 0 || d > MaxDuration {
		return Result{}, fmt.Errorf("mcgen: duration %v out of range (0, %v]", d, MaxDuration)
	}
	if rate < 0 {
		rate = 0
	}
	res := Result{Rate: rate}
	before, err := g.read()
	if err != nil {
		return res, err
	}
	var loopErr error
	restore, err := boostNAPI(g.cfg.TB)
	if err != nil {
		return res, err
	}
	defer restore()
	err = g.cfg.TB.Client.Do(func() error {
		var rerr error
		res, rerr = g.loop(ctx, rate, d)
		res.Rate = rate
		return rerr
	})
	if err != nil {
		loopErr = err
	}
	// Late replies.
	if loopErr == nil {
		t := time.NewTimer(g.cfg.Drain)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
		}
		res.Drain = g.cfg.Drain
	}
	after, err := g.read()
	if err != nil {
		return res, errors.Join(loopErr, err)
	}
	res.Sent = after.sent - before.sent
	res.Failed = after.failed - before.failed
	res.Idle = after.idle - before.idle
	res.Replies = after.replies - before.replies
	res.Matched = after.matched - before.matched
	res.Unmatched = after.unmatched - before.unmatched
	res.Passed = after.passed - before.passed
	res.Xmit = after.xmit - before.xmit
	res.XmitErrors = after.xmitErr - before.xmitErr
	if res.Sent > res.Xmit+res.XmitErrors {
		res.Vanished = res.Sent - res.Xmit - res.XmitErrors
	}
	if loopErr == nil && ctx.Err() != nil {
		loopErr = ctx.Err()
	}
	return res, loopErr
}

// loop runs on a locked OS thread in the client namespace.
func (g *Generator) loop(ctx context.Context, rate int, d time.Duration) (Result, error) {
	var res Result
	tid := unix.Gettid()
	if g.cfg.CPU >= 0 {
		var old unix.CPUSet
		if err := unix.SchedGetaffinity(0, &old); err != nil {
			return res, fmt.Errorf("mcgen: get affinity: %w", err)
		}
		var set unix.CPUSet
		set.Set(g.cfg.CPU)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return res, fmt.Errorf("mcgen: pin to cpu%d: %w", g.cfg.CPU, err)
		}
		defer unix.SchedSetaffinity(0, &old)
	}
	// Fine-grained sleeps: timer slack 1 µs while pacing (default 50 µs).
	if slack, err := unix.PrctlRetInt(unix.PR_GET_TIMERSLACK, 0, 0, 0, 0); err == nil {
		unix.Prctl(unix.PR_SET_TIMERSLACK, 1000, 0, 0, 0)
		defer unix.Prctl(unix.PR_SET_TIMERSLACK, uintptr(slack), 0, 0, 0)
	}

	spin := g.cfg.Pacing == PaceSpin
	batch := g.cfg.Batch
	if batch == 0 {
		batch = AutoBatch(rate, g.cfg.MaxCallRate)
	}
	if !spin && rate > 0 && (rate+batch-1)/batch > g.cfg.MaxCallRate {
		return res, fmt.Errorf("mcgen: rate %d/s with %d frames per call needs more than MaxCallRate %d calls/s: use Batch ≥ %d",
			rate, batch, g.cfg.MaxCallRate, (rate+g.cfg.MaxCallRate-1)/g.cfg.MaxCallRate)
	}
	ppBatch := g.cfg.PoolBatch
	if spin {
		batch = 0 // unused: calls last SpinCall
		if ppBatch == 0 {
			ppBatch = 64
		}
	} else {
		if ppBatch == 0 {
			ppBatch = 64
		}
		ppBatch = min(ppBatch, batch)
	}
	res.Batch, res.PoolBatch = batch, ppBatch

	// At most rate×d frames when paced, otherwise far beyond what one
	// core can do (50 M/s); the program enforces it (budget).
	limit := uint64(50e6 * d.Seconds())
	if rate > 0 {
		limit = uint64(float64(rate) * d.Seconds())
	}
	v := &g.objs.mcgenVariables
	var sent0 uint64
	if err := v.Sent.Get(&sent0); err != nil {
		return res, err
	}
	sentSoFar := func() uint64 {
		var n uint64
		v.Sent.Get(&n)
		return n - sent0
	}
	// A sender that fell behind (preempted, other load on its CPU) makes up
	// for at most maxLag of backlog and gives up the rest, so the average
	// holds through short stalls without long bursts. With PaceSpin the
	// backlog goes out back to back, so it is held to 128 frames (half the
	// server veth's ring).
	maxLag := 10 * time.Millisecond
	if spin && rate > 0 {
		maxLag = min(max(time.Duration(128*float64(time.Second)/float64(rate)), 20*time.Microsecond), maxLag)
	}
	var interval uint64 // 1/16 ns per frame, spin mode
	if spin && rate > 0 {
		interval = uint64(16e9 / float64(rate))
	}
	start := monotonic()
	for _, x := range []struct {
		v   interface{ Set(any) error }
		val uint64
	}{
		{v.Budget, limit},
		{v.PaceInterval, interval},
		{v.PaceNext, uint64(start) << 4},
		{v.PaceMaxlag, uint64(maxLag.Nanoseconds()) << 4},
	} {
		if err := x.v.Set(x.val); err != nil {
			return res, fmt.Errorf("mcgen: set pacing state: %w", err)
		}
	}
	// Whatever happens, no frames after the loop.
	defer v.Budget.Set(uint64(0))
	defer v.PaceInterval.Set(uint64(0))

	opts := &ebpf.RunOptions{
		Data: g.data,
		Context: xdpMD{
			Data:           metaLen,
			DataEnd:        uint32(len(g.data)),
			IngressIfindex: uint32(g.cfg.TB.Client.Ifindex),
		},
		Repeat:    uint32(batch),
		Flags:     unix.BPF_F_TEST_XDP_LIVE_FRAMES,
		BatchSize: uint32(ppBatch),
	}
	cpu0, _ := testbed.ThreadRunTime(os.Getpid(), tid)
	end := start + d.Nanoseconds()
	minGap := int64(1e9 / g.cfg.MaxCallRate) // between call starts
	spinCall := g.cfg.SpinCall.Nanoseconds()
	repeat := int64(batch)
	if spin {
		// First guess: one call of SpinCall at ~100 ns per iteration.
		repeat = max(int64(ppBatch), spinCall/100)
	}
	origin := start // calls mode: frame n is due at origin + n/rate
	var lastCall int64
	var runErr error
	sleepUntil := func(t int64) {
		ts := unix.NsecToTimespec(t)
		for unix.ClockNanosleep(unix.CLOCK_MONOTONIC, unix.TIMER_ABSTIME, &ts, nil) == unix.EINTR {
		}
	}
	for {
		now := monotonic()
		if now >= end || ctx.Err() != nil {
			break
		}
		sent := sentSoFar()
		if sent >= limit {
			break
		}
		if lastCall != 0 && lastCall+minGap > now {
			if lastCall+minGap >= end {
				break
			}
			sleepUntil(lastCall + minGap)
			now = monotonic()
		}
		n := uint64(repeat)
		if !spin {
			if rate > 0 {
				due := origin + int64(float64(sent)*1e9/float64(rate))
				if due > now {
					if due >= end {
						break
					}
					sleepUntil(due)
				} else if lag := now - due; lag > maxLag.Nanoseconds() {
					origin += lag - maxLag.Nanoseconds() // give up the backlog
				}
			}
			n = min(n, limit-sent)
		}
		opts.Repeat = uint32(n)
		lastCall = monotonic()
		if _, err := g.objs.Mcgen.Run(opts); err != nil {
			runErr = fmt.Errorf("mcgen: BPF_PROG_RUN (live frames): %w", err)
			break
		}
		res.Calls++
		res.Iterations += n
		if spin {
			// Aim the next call at SpinCall, and not past the end.
			took := max(monotonic()-lastCall, 1)
			want := min(spinCall, max(end-monotonic(), 0))
			repeat = min(max(repeat*want/took, int64(ppBatch)), 1<<22)
		}
	}
	// A paced run lasts d even when its frames went out earlier (the last
	// call sends a whole batch at once), so that Sent/Elapsed is the rate.
	if rate > 0 && runErr == nil && ctx.Err() == nil {
		if now := monotonic(); now < end {
			sleepUntil(end)
		}
	}
	res.Elapsed = time.Duration(monotonic() - start)
	if cpu1, err := testbed.ThreadRunTime(os.Getpid(), tid); err == nil {
		res.ThreadCPU = cpu1 - cpu0
	}
	return res, runErr
}

func monotonic() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}

// --- frames ---

// BuildFrames returns the Ethernet frames a generator with cfg sends, in
// order (exported for inspection and tests). cfg must be valid for New.
func BuildFrames(cfg Config) [][]byte {
	srcPorts := max(cfg.SrcPorts, 1)
	base := cfg.SrcPortBase
	if base == 0 {
		base = DefaultSrcPortBase
	}
	n := lcm(len(cfg.Payloads), srcPorts)
	if n > maxFrames {
		n = len(cfg.Payloads)
	}
	c, s := cfg.TB.Client, cfg.TB.Server
	out := make([][]byte, n)
	for i := range out {
		p := cfg.Payloads[i%len(cfg.Payloads)]
		sport := base + uint16(i%srcPorts)
		if cfg.Family == 6 {
			out[i] = udp6Frame(c.MAC, s.MAC, c.IP6.As16(), s.IP6.As16(), sport, cfg.DstPort, p)
		} else {
			out[i] = udp4Frame(c.MAC, s.MAC, c.IP4.As4(), s.IP4.As4(), sport, cfg.DstPort, p)
		}
	}
	return out
}

func lcm(a, b int) int {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	if a/x > maxFrames/b+1 {
		return maxFrames + 1
	}
	return a / x * b
}

func udp4Frame(src, dst []byte, sip, dip [4]byte, sport, dport uint16, payload []byte) []byte {
	f := make([]byte, ethLen+ip4Len+udpLen+len(payload))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], 0x0800)
	ip := f[ethLen:]
	ip[0] = 0x45
	binary.BigEndian.PutUint16(ip[2:], uint16(ip4Len+udpLen+len(payload)))
	binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
	ip[8] = 64
	ip[9] = unix.IPPROTO_UDP
	copy(ip[12:16], sip[:])
	copy(ip[16:20], dip[:])
	binary.BigEndian.PutUint16(ip[10:], ^fold(sum(ip[:ip4Len], 0)))
	u := ip[ip4Len:]
	putUDP(u, sport, dport, payload)
	ps := sum(sip[:], 0)
	ps = sum(dip[:], ps)
	ps += unix.IPPROTO_UDP + uint32(len(u))
	setUDPCsum(u, ps)
	return f
}

func udp6Frame(src, dst []byte, sip, dip [16]byte, sport, dport uint16, payload []byte) []byte {
	f := make([]byte, ethLen+ip6Len+udpLen+len(payload))
	copy(f[0:6], dst)
	copy(f[6:12], src)
	binary.BigEndian.PutUint16(f[12:], 0x86DD)
	ip := f[ethLen:]
	ip[0] = 0x60
	binary.BigEndian.PutUint16(ip[4:], uint16(udpLen+len(payload)))
	ip[6] = unix.IPPROTO_UDP
	ip[7] = 64
	copy(ip[8:24], sip[:])
	copy(ip[24:40], dip[:])
	u := ip[ip6Len:]
	putUDP(u, sport, dport, payload)
	ps := sum(sip[:], 0)
	ps = sum(dip[:], ps)
	ps += unix.IPPROTO_UDP + uint32(len(u))
	setUDPCsum(u, ps)
	return f
}

func putUDP(u []byte, sport, dport uint16, payload []byte) {
	binary.BigEndian.PutUint16(u[0:], sport)
	binary.BigEndian.PutUint16(u[2:], dport)
	binary.BigEndian.PutUint16(u[4:], uint16(udpLen+len(payload)))
	copy(u[udpLen:], payload)
}

func setUDPCsum(u []byte, pseudo uint32) {
	c := ^fold(sum(u, pseudo))
	if c == 0 {
		c = 0xffff
	}
	binary.BigEndian.PutUint16(u[6:], c)
}

// sum adds b as big-endian 16-bit words to s (one's complement, unfolded).
func sum(b []byte, s uint32) uint32 {
	for len(b) >= 2 {
		s += uint32(b[0])<<8 | uint32(b[1])
		b = b[2:]
	}
	if len(b) == 1 {
		s += uint32(b[0]) << 8
	}
	return s
}

func fold(s uint32) uint16 {
	for s > 0xffff {
		s = (s & 0xffff) + s>>16
	}
	return uint16(s)
}
