//go:build linux

// Package bench is the benchmark harness behind `make bench-udp` (go run
// ./bench/cmd/benchudp) and `make bench-dns` (go run ./bench/cmd/benchdns,
// see dns.go): it sweeps the offered rate of kxdpgun against server-side
// responders on the namespace testbed and measures replies/s, server CPU
// per reply, BPF run time per packet and, with the latency prober,
// round-trip times.
package bench

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/santa-offload/santa/bench/reflector"
	"github.com/santa-offload/santa/internal/testbed"
)

// Query is one line of kxdpgun's query file: a name and a type ("A",
// "AAAA", "TXT"…).
type Query struct {
	Name string
	Type string
}

// Env is what a case gets to work with. The harness creates it once per
// run; every case sees the same testbed and the same NSD.
type Env struct {
	TB  *testbed.Testbed
	NSD *testbed.NSD // UDP benchmark: serves Zone on port 53 of both server addresses, pinned to Placement.ServerCPU
	// Server is the server whose processes count as server work (the
	// UDP benchmark: NSD).
	Server    Server
	Zone      testbed.Zone // example.test. with Zone.Generated names h0..h<N-1> (testbed.GenName)
	Queries   []Query      // the default query mix: every generated name, type A
	Placement testbed.Placement
	Logf      func(format string, args ...any)
}

// Server is what the harness needs of the server under test.
type Server interface {
	// PIDs are the server's processes; all their threads count as server
	// work.
	PIDs() ([]int, error)
}

// Generator sends load from the client namespace for one point of a sweep.
// Every Run is bounded: it ends after d. rate is the offered rate in
// requests/s, or for a closed-loop generator (wrk) its number of
// connections.
type Generator interface {
	Run(ctx context.Context, rate int, d time.Duration) (LoadResult, error)
}

// Load is a case's load generator and, optionally, its latency prober.
type Load struct {
	Generator Generator
	Prober    *Prober // nil: no latency probing
	Distinct  int     // distinct requests in the generator's mix
	Close     func()  // nil or called after the case's sweep
}

// Responder is one benchmark case: whatever answers (or lets NSD answer)
// the queries arriving on the server veth.
//
// Setup runs once before the sweep, Teardown once after it. Setup must
// leave the server veth with at most the case's own XDP program attached,
// and Teardown must remove it (the next case starts from a bare veth with
// NSD listening). The harness finds the program through the interface (no
// need to hand it over) and reads its BPF run-time statistics.
type Responder interface {
	// Name is short and stable (it keys the result files), e.g.
	// "santa-1m".
	Name() string
	// Setup prepares the case: attach programs to env.TB.Server (inside the
	// server namespace: env.TB.Server.Do), install rules, etc.
	Setup(env *Env) error
	// Teardown undoes Setup.
	Teardown() error
}

// Optional interfaces a Responder may implement.
type (
	// Describer gives a one-line description for the report.
	Describer interface{ Description() string }

	// QueryProvider replaces env.Queries for this case (e.g. one name for
	// a one-rule case, or names that match no rule). Called after Setup.
	QueryProvider interface{ Queries(env *Env) []Query }

	// PIDProvider adds processes whose run time counts as server work
	// (besides NSD and the server veth's NAPI kthread). Called after Setup.
	PIDProvider interface{ ServerPIDs() []int }

	// RateProvider replaces Config.Rates for this case (e.g. rates around
	// a kernel server's capacity instead of an XDP responder's).
	RateProvider interface{ Rates() []int }

	// LoadProvider gives the case's own load instead of kxdpgun with
	// QueryProvider's queries (e.g. memcached GETs); probeRate is
	// Config.ProbeRate. Called after Setup.
	LoadProvider interface {
		Load(env *Env, probeRate int) (Load, error)
	}

	// AnswerCounter counts the queries the case's XDP program answered
	// itself so far (the rest went to the server); the harness reports the
	// difference over each point.
	AnswerCounter interface{ Answered() (uint64, error) }

	// SharedXDP reports that the case's XDP program outlives it (e.g.
	// santad's, shared by several cases): the harness leaves it attached.
	SharedXDP interface{ SharedXDP() bool }

	// ProbeLoader replaces the load of the short check, before the sweep,
	// that the case answers almost every request (10000 queries/s): the
	// load to pass to the generator and how to say it in the log, e.g. one
	// connection for a closed-loop generator (wrk).
	ProbeLoader interface{ ProbeLoad() (int, string) }

	// ForeignLimiter replaces maxForeign (10 %) for the case: the share of
	// the server CPU's busy time outside the known server threads above
	// which a point counts as disturbed by others' work, for cases whose
	// own kernel work runs outside any thread (e.g. the interrupts that
	// wake an idle server CPU for every few packets).
	ForeignLimiter interface{ MaxForeign() float64 }

	// LatencyProbe reports whether the latency prober (Config.ProbeRate)
	// makes sense for the case; false for responders whose replies a
	// kernel socket would not accept (the reflector sends the query back
	// with its partial checksum).
	LatencyProbe interface{ LatencyProbe() bool }
)

var (
	regMu    sync.Mutex
	registry []Responder
)

// Register adds a case to DefaultCases (after the built-in ones), e.g.
// from an init function in a file of this package:
//
//	func init() { bench.Register(&SantaCase{Rules: 1_000_000}) }
func Register(r Responder) {
	regMu.Lock()
	defer regMu.Unlock()
	registry = append(registry, r)
}

// DefaultCases are the cases of `make bench-udp`, in run order: NSD alone,
// NSD behind a pass-only XDP program, the bare reflector, then the registered ones.
//
// The Santa cases plug in here (see santa.go): Santa with 1, 10 k
// and 1 M matching rules, and Santa with 1 M rules that match nothing (its
// baseline is "nsd": non-matching traffic with no program).
func DefaultCases() []Responder {
	cs := []Responder{&NSDOnly{}, &XDPPass{}, &Reflector{Port: 53}}
	regMu.Lock()
	defer regMu.Unlock()
	return append(cs, registry...)
}

// NSDOnly is NSD with no XDP program on the server veth: the plain kernel
// path every query takes without Santa.
type NSDOnly struct{}

func (*NSDOnly) Name() string { return "nsd" }
func (*NSDOnly) Description() string {
	return "NSD alone, no XDP program on the server veth"
}
func (*NSDOnly) Setup(env *Env) error {
	xi, err := env.TB.ServerXDP()
	if err != nil {
		return err
	}
	if xi.ID() != 0 {
		return fmt.Errorf("server veth still has XDP program %d", xi.ID())
	}
	return nil
}
func (*NSDOnly) Teardown() error { return nil }

// Reflector is the bare XDP reflector on the server veth (swap MAC, IP and
// UDP ports, XDP_TX): the most any XDP responder can do on this testbed.
type Reflector struct {
	Port uint16
	r    *reflector.Reflector
}

func (c *Reflector) Name() string { return "reflector" }
func (c *Reflector) Description() string {
	return "bare XDP reflector (swap MAC/IP/ports, XDP_TX): the testbed's limit"
}
func (c *Reflector) Setup(env *Env) error {
	r, err := reflector.Load(c.Port)
	if err != nil {
		return err
	}
	if err := env.TB.Server.Do(func() error { return r.Attach(env.TB.Server.Ifindex) }); err != nil {
		r.Close()
		return err
	}
	c.r = r
	return nil
}
func (c *Reflector) Teardown() error {
	if c.r == nil {
		return nil
	}
	err := c.r.Close()
	c.r = nil
	return err
}

// XDPPass is NSD behind an XDP program that passes everything: what any XDP
// program on a veth costs traffic that reaches the server (the veth copies
// such frames into pages for XDP and back into skbs), before Santa does any work.
type XDPPass struct{ tb *testbed.Testbed }

func (*XDPPass) Name() string { return "xdp-pass" }
func (*XDPPass) Description() string {
	return "NSD behind an XDP program that only returns XDP_PASS: the veth's XDP tax on passed traffic"
}
func (c *XDPPass) Setup(env *Env) error {
	prog, err := testbed.NewXDPPass()
	if err != nil {
		return err
	}
	defer prog.Close() // the attachment holds its own reference
	c.tb = env.TB
	return testbed.AttachXDPNetlink(env.TB.Server.NS, env.TB.Server.Ifindex, prog, testbed.XDPModeDriver)
}
func (c *XDPPass) Teardown() error {
	return testbed.DetachXDPNetlink(c.tb.Server.NS, c.tb.Server.Ifindex, testbed.XDPModeDriver)
}
