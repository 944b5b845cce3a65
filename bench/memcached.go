//go:build linux

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/cilium/ebpf"

	"github.com/santa-offload/santa/bench/mcgen"
	"github.com/santa-offload/santa/internal/testbed"
)

// The memcached benchmark (`make bench-memcached`, bench/cmd/benchmc): the
// paper's §6 workload (Facebook's USR pool: keys of 16 and 21 bytes, 2-byte
// values, Zipf-like popularity over 1 M keys, 99.8 % GETs) against one
// memcached -U thread, alone and with `santa memcached top --count N`,
// beside the bare XDP reflector. kxdpgun speaks only DNS, and a socket
// generator tops out far below XDP, so the load comes from mcgen
// (BPF_PROG_RUN live frames from the client veth).

// The Santa kinds of a memcached case.
const (
	MCAlone     = ""          // memcached alone
	MCReflector = "reflector" // the bare XDP reflector answers every frame
	MCTop       = "top"       // santa memcached top --count N
)

// The request mixes of a memcached case.
const (
	MixMixed = "mixed" // GETs and SETs (MCConfig.SetShare), Zipf over all keys
	MixGets  = "gets"  // GETs only, Zipf over all keys
)

// MCCase is one case of the memcached benchmark.
type MCCase struct {
	Name  string `json:"name"`
	Santa string `json:"santa"` // MCAlone, MCReflector, MCTop
	N     int    `json:"n"`     // keys offloaded (MCTop; 0: attached, tracker on, no rule matching the mix)
	Mix   string `json:"mix"`   // MixMixed or MixGets
	// Offloaded is the share of the mix's requests that are GETs of an
	// offloaded key (computed from the mix the generator sends).
	Offloaded float64 `json:"offloaded"`
}

// Description is the case's line in the report.
func (c MCCase) Description() string {
	mix := "the mix of GETs and SETs"
	if c.Mix == MixGets {
		mix = "GETs only"
	}
	switch c.Santa {
	case MCReflector:
		return "bare XDP reflector on the server veth (swaps addresses, XDP_TX): the testbed's limit; " + mix
	case MCTop:
		if c.N == 0 {
			return "memcached with `santa memcached static` attached and its write tracker on, one rule for a key the mix never asks for; " + mix
		}
		share := ""
		if c.Offloaded > 0 { // known once the mix is drawn
			share = fmt.Sprintf(" (%.1f %% of the requests are GETs of an offloaded key)", 100*c.Offloaded)
		}
		return fmt.Sprintf("memcached with `santa memcached top --count %d`%s; %s", c.N, share, mix)
	}
	return "memcached alone (-U, one worker thread), no XDP program; " + mix
}

// PlanMC lists the cases of a run: memcached alone, the reflector,
// Santa attached with no matching rule, the top n for every n of tops (on
// the mixed workload), and every key offloaded with GETs only (the full
// offload the issue compares with the reflector).
func PlanMC(tops []int, keys int) []MCCase {
	cs := []MCCase{
		{Name: "memcached", Mix: MixMixed},
		{Name: "reflector", Santa: MCReflector, Mix: MixGets},
		{Name: "santa-0", Santa: MCTop, Mix: MixMixed},
	}
	for _, n := range tops {
		if n > 0 {
			cs = append(cs, MCCase{Name: "santa-top-" + human(min(n, keys)), Santa: MCTop, N: min(n, keys), Mix: MixMixed})
		}
	}
	return append(cs, MCCase{Name: "santa-all-gets", Santa: MCTop, N: keys, Mix: MixGets})
}

// MCConfig is one run of the memcached benchmark.
type MCConfig struct {
	Config            // the harness: Rates is the sweep for cases answered mostly in XDP
	ServerRates []int // the sweep for cases memcached answers mostly
	Keys        int   // distinct keys, all stored in memcached (mcgen.Keys)
	// MixRequests is the number of distinct requests the generator cycles
	// through (at most 131072 frames).
	MixRequests int
	ZipfS       float64
	SetShare    float64 // share of SETs in the mixed workload (0.002)
	Seed        int64
	Pacing      mcgen.Pacing
	Refresh     time.Duration // santa memcached --refresh
	Cases       []MCCase
	Bin         string // directory holding santad and santa
}

// MCReport is a memcached run.
type MCReport struct {
	Report
	ServerRates []int             `json:"server_rates"`
	MixRequests int               `json:"mix_requests"`
	ZipfS       float64           `json:"zipf_s"`
	SetShare    float64           `json:"set_share"`
	Seed        int64             `json:"seed"`
	Pacing      string            `json:"pacing"`
	Refresh     float64           `json:"refresh_s"`
	ProbeRate   int               `json:"probe_rate"`
	StopAfter   int               `json:"stop_after"`
	Meta        map[string]MCCase `json:"meta"`
	Setup       []SetupStep       `json:"setup"`
	// Tracker is the write tracker's BPF cost over each Santa case (all
	// its points): run time per run and runs per reply.
	Tracker map[string]TrackerCost `json:"tracker,omitempty"`
	// Done is each controller's done line (keys offloaded, rebuilt,
	// removed; the write tracker's counters), by the case that started it.
	Done map[string]string `json:"controller_done,omitempty"`
}

const mcPort = 11211

// unusedKey is stored in memcached but never asked for: santa-0's rule.
const unusedKey = "santa-bench-unused-key"

// RunMemcached runs the memcached benchmark.
func RunMemcached(ctx context.Context, cfg MCConfig) (*MCReport, error) {
	if err := prepareHost(&cfg.Config); err != nil {
		return nil, err
	}
	logf := cfg.Logf
	if _, err := os.Stat(testbed.MemcachedPath); err != nil {
		return nil, fmt.Errorf("%s missing (Debian package memcached; run scripts/install-deps.sh)", testbed.MemcachedPath)
	}
	for _, b := range []string{"santad", "santa"} {
		if _, err := os.Stat(filepath.Join(cfg.Bin, b)); err != nil {
			return nil, fmt.Errorf("%s not built: %w", b, err)
		}
	}
	if cfg.Keys < 1 || cfg.MixRequests < 1 || cfg.SetShare < 0 || cfg.SetShare >= 1 {
		return nil, fmt.Errorf("keys %d, mix of %d requests, set share %g: out of range", cfg.Keys, cfg.MixRequests, cfg.SetShare)
	}
	rep := &MCReport{
		Report: Report{
			Started: time.Now(), Host: hostInfo(), Command: cfg.Command, Quick: cfg.Quick,
			Rates: cfg.Rates, Duration: cfg.Duration.Seconds(), Reps: cfg.Reps, Names: cfg.Keys,
			ServerCPU: cfg.Placement.ServerCPU, ClientCPU: cfg.Placement.ClientCPU,
		},
		ServerRates: cfg.ServerRates, MixRequests: cfg.MixRequests, ZipfS: cfg.ZipfS, SetShare: cfg.SetShare, Seed: cfg.Seed,
		Pacing: map[mcgen.Pacing]string{mcgen.PaceCalls: "calls", mcgen.PaceSpin: "spin"}[cfg.Pacing], Refresh: cfg.Refresh.Seconds(),
		ProbeRate: cfg.ProbeRate, StopAfter: cfg.StopAfter, Meta: map[string]MCCase{}, Done: map[string]string{}, Tracker: map[string]TrackerCost{},
	}
	if out, err := testbed.Run("", testbed.MemcachedPath, "-V"); err == nil {
		rep.Host["memcached"] = strings.TrimSpace(out)
	}
	step := stepRecorder(&rep.Setup, logf)
	tb, tmp, closeRun, err := openRun(cfg.Config, "santa-benchmc-")
	if err != nil {
		return nil, err
	}
	defer closeRun()

	// The keys (ranked: keys[0] is the most popular), the two mixes and the
	// controller's key lists.
	t0 := time.Now()
	keys := mcgen.Keys(cfg.Keys, cfg.Seed)
	mixes := map[string][][]byte{
		MixMixed: mcgen.MixPayloads(keys, cfg.MixRequests, cfg.ZipfS, cfg.SetShare, []byte("zz"), cfg.Seed),
		MixGets:  mcgen.GetPayloads(keys, cfg.MixRequests, cfg.ZipfS, cfg.Seed),
	}
	ranks, unused := filepath.Join(tmp, "ranks"), filepath.Join(tmp, "unused")
	err = errors.Join(os.WriteFile(ranks, []byte(strings.Join(keys, "\n")+"\n"), 0o644),
		os.WriteFile(unused, []byte(unusedKey+"\n"), 0o644))
	step(fmt.Sprintf("%d keys, mixes of %d requests (Zipf s = %g, %.1f %% SETs)", len(keys), cfg.MixRequests, cfg.ZipfS, 100*cfg.SetShare), t0, err)
	if err != nil {
		return nil, err
	}
	rank := make(map[string]int, len(keys))
	for i, k := range keys {
		rank[k] = i
	}
	maxN := 0
	for i := range cfg.Cases {
		c := &cfg.Cases[i]
		if c.Santa == MCTop {
			c.Offloaded = offloadedShare(mixes[c.Mix], rank, c.N)
			maxN = max(maxN, c.N)
		}
		rep.Meta[c.Name] = *c
	}

	t0 = time.Now()
	mc, err := tb.StartMemcached(testbed.MemcachedOptions{Port: mcPort, Threads: 1, Pin: true, CPU: cfg.Placement.ServerCPU,
		MemoryMB: max(256, cfg.Keys>>10), IPv4Only: true})
	if err == nil {
		err = preload(tb, mc, keys)
	}
	step(fmt.Sprintf("start memcached, store %d keys", len(keys)+1), t0, err)
	if err != nil {
		return nil, err
	}
	defer mc.Stop()
	// Live frames make 5× fatter skbs than socket-sent datagrams: give
	// memcached's socket the capacity it would have for real traffic.
	if n, err := mcgen.SetUDPRcvbuf(mc.PID(), mcgen.RcvbufForLiveFrames); err != nil || n != 1 {
		return nil, fmt.Errorf("memcached's UDP receive buffer: %d sockets changed: %v", n, err)
	}

	env := &Env{TB: tb, Server: mc, Placement: cfg.Placement, Logf: logf}
	h := &harness{cfg: cfg.Config, tb: tb, env: env, tmp: tmp}
	run := &mcRun{cfg: cfg, tb: tb, mc: mc, h: h, tmp: tmp, ranks: ranks, unused: unused, mixes: mixes, maxN: maxN, step: step, rep: rep}
	defer run.stopSantad()
	for _, c := range cfg.Cases {
		if ctx.Err() != nil {
			break
		}
		cr := run.runCase(ctx, rep.Meta[c.Name])
		if cr.Error != "" {
			logf("[%s] FAILED: %s", cr.Name, cr.Error)
		}
		rep.Cases = append(rep.Cases, cr)
	}
	run.stopSantad()
	rep.Finished = time.Now()
	return rep, ctx.Err()
}

// offloadedShare is the share of mix that is GETs of the n most popular
// keys.
func offloadedShare(mix [][]byte, rank map[string]int, n int) float64 {
	hits := 0
	for _, p := range mix {
		key, ok := strings.CutPrefix(string(p[mcgen.MemcachedHeaderLen:]), "get ")
		if r, found := rank[strings.TrimSuffix(key, "\r\n")]; ok && found && r < n {
			hits++
		}
	}
	return float64(hits) / float64(len(mix))
}

// preload stores every key with a 2-byte value (and unusedKey) over one
// pipelined TCP connection from the client namespace, then checks that
// memcached holds them all (no eviction).
func preload(tb *testbed.Testbed, mc *testbed.Memcached, keys []string) error {
	return tb.Client.Do(func() error {
		conn, err := net.DialTimeout("tcp", mc.Addr4.String(), 5*time.Second)
		if err != nil {
			return err
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5*time.Minute + time.Duration(len(keys))*time.Microsecond))
		w := bufio.NewWriterSize(conn, 1<<20)
		const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789"
		for i, k := range append(keys, unusedKey) {
			fmt.Fprintf(w, "set %s 0 0 2 noreply\r\n%c%c\r\n", k, alphabet[i%36], alphabet[i/36%36])
		}
		w.WriteString("stats\r\n")
		if err := w.Flush(); err != nil {
			return err
		}
		r := bufio.NewReader(conn)
		items := -1
		for {
			line, err := r.ReadString('\n')
			if err != nil {
				return fmt.Errorf("stats after the sets: %w", err)
			}
			if line == "END\r\n" {
				break
			}
			if f := strings.Fields(line); len(f) == 3 && f[1] == "curr_items" {
				fmt.Sscan(f[2], &items)
			} else if !strings.HasPrefix(line, "STAT ") {
				return fmt.Errorf("memcached refused a set: %q", strings.TrimSpace(line))
			}
		}
		if items != len(keys)+1 {
			return fmt.Errorf("memcached holds %d items after storing %d (too little memory?)", items, len(keys)+1)
		}
		return nil
	})
}

// mcRun is the state the cases of one run share: memcached, santad and
// the running `santa memcached`.
type mcRun struct {
	cfg          MCConfig
	tb           *testbed.Testbed
	mc           *testbed.Memcached
	h            *harness
	tmp          string
	ranks        string // every key, most popular first
	unused       string // unusedKey alone
	mixes        map[string][][]byte
	maxN         int
	step         func(string, time.Time, error)
	rep          *MCReport
	santad       *santadRig
	ctl          *controllerProc
	ctlN         int    // keys the running controller offloads; -1: santa-0's
	ctlStartedBy string // the case that started it
}

func (r *mcRun) runCase(ctx context.Context, c MCCase) CaseResult {
	mcase := &mcCase{c: c, run: r}
	if c.Santa != MCTop {
		r.stopSantad()
		return r.h.runCase(ctx, mcase)
	}
	fail := func(err error) CaseResult {
		return CaseResult{Name: c.Name, Description: c.Description(), Saturation: -1, Knee: -1, Error: "setup: " + err.Error()}
	}
	want := c.N
	if want == 0 {
		want = -1
	}
	if r.santad == nil {
		t0 := time.Now()
		s, err := startSantad(r.tb, r.cfg.Bin, r.tmp, r.maxN, r.cfg.Logf)
		r.step("start santad", t0, err)
		if err != nil {
			return fail(err)
		}
		r.santad = s
	}
	if r.ctl == nil || r.ctlN != want {
		r.stopController()
		t0 := time.Now()
		args := []string{"--port", fmt.Sprintf("%d/udp", mcPort), "--server", r.mc.Addr4.String(),
			"--guards", filepath.Join(r.santad.bpffs, "guards"), "--refresh", r.cfg.Refresh.String()}
		mode, what := "top", fmt.Sprintf("santa memcached top --count %d (ready)", c.N)
		if c.N == 0 {
			mode, what = "static", "santa memcached static (one unused key; ready)"
			args = append(args, "--keys", r.unused)
		} else {
			args = append(args, "--keys", r.ranks, "--count", fmt.Sprint(c.N))
		}
		ctl, err := r.santad.startController(ctx, "memcached", mode, args...)
		r.step(what, t0, err)
		if err != nil {
			return fail(err)
		}
		r.ctl, r.ctlN, r.ctlStartedBy = ctl, want, c.Name
	}
	// Everything of Santa's runs on the server CPU while measuring.
	if err := pinSanta(r.santad, r.ctl, r.cfg.Placement.ServerCPU); err != nil {
		return fail(err)
	}
	ns0, runs0, err := trackerRunTime()
	if err != nil {
		return fail(err)
	}
	cr := r.h.runCase(ctx, mcase)
	if ns, runs, err := trackerRunTime(); err == nil && runs > runs0 {
		var replies uint64
		for _, p := range cr.Points {
			for _, s := range p.Reps {
				replies += s.Replies
			}
		}
		t := TrackerCost{NsPerRun: float64(ns-ns0) / float64(runs-runs0)}
		if replies > 0 {
			t.RunsPerReply = float64(runs-runs0) / float64(replies)
		}
		r.rep.Tracker[c.Name] = t
	}
	return cr
}

// TrackerCost is the write tracker's BPF run time over a case.
type TrackerCost struct {
	NsPerRun     float64 `json:"ns_per_run"`
	RunsPerReply float64 `json:"runs_per_reply"` // ingress and egress, every interface
}

// trackerRunTime sums the run time and runs of every loaded write tracker
// program (mc_ingress, mc_egress), with BPF statistics on.
func trackerRunTime() (ns, runs uint64, err error) {
	for id := ebpf.ProgramID(0); ; {
		if id, err = ebpf.ProgramGetNextID(id); err != nil {
			return ns, runs, nil // the last id
		}
		p, err := ebpf.NewProgramFromID(id)
		if err != nil {
			continue // gone meanwhile
		}
		info, ierr := p.Info()
		st, serr := p.Stats()
		p.Close()
		if ierr != nil || serr != nil || (info.Name != "mc_ingress" && info.Name != "mc_egress") {
			continue
		}
		ns, runs = ns+uint64(st.Runtime), runs+st.RunCount
	}
}

func (r *mcRun) stopController() {
	if r.ctl == nil {
		return
	}
	pinSanta(r.santad, r.ctl, -1) // delete the rules at full speed
	t0 := time.Now()
	err := r.ctl.stop()
	if line := doneLine(r.ctl.Output()); line != "" {
		r.rep.Done[r.ctlStartedBy] = line
	}
	r.step(fmt.Sprintf("stop santa memcached (%s; deletes its rules)", r.ctlStartedBy), t0, err)
	r.ctl, r.ctlN = nil, 0
}

// doneLine is the controller's last report: keys offloaded, rebuilt and
// removed, and the write tracker's counters.
func doneLine(out string) string {
	for _, l := range strings.Split(out, "\n") {
		if d, ok := strings.CutPrefix(l, "done: "); ok {
			return strings.TrimSpace(d)
		}
	}
	return ""
}

func (r *mcRun) stopSantad() {
	r.stopController()
	if r.santad == nil {
		return
	}
	t0 := time.Now()
	err := r.santad.stop()
	r.step("stop santad, santad cleanup", t0, err)
	r.santad = nil
}

// mcCase is a memcached case for the harness; the run sets up what cases
// share (santad, the controller), the reflector case attaches its own.
type mcCase struct {
	c         MCCase
	run       *mcRun
	reflector *Reflector
}

func (m *mcCase) Name() string        { return m.c.Name }
func (m *mcCase) Description() string { return m.c.Description() }

func (m *mcCase) Setup(env *Env) error {
	if m.c.Santa != MCReflector {
		return nil
	}
	m.reflector = &Reflector{Port: mcPort}
	return m.reflector.Setup(env)
}

func (m *mcCase) Teardown() error {
	if m.reflector == nil {
		return nil
	}
	return m.reflector.Teardown()
}

// SharedXDP: santad's program stays for the next Santa case.
func (m *mcCase) SharedXDP() bool { return m.c.Santa == MCTop }

// LatencyProbe: the reflector's replies are the requests sent back.
func (m *mcCase) LatencyProbe() bool { return m.c.Santa != MCReflector }

// Rates: the server's sweep where memcached answers most requests.
func (m *mcCase) Rates() []int {
	if m.c.Santa == MCAlone || (m.c.Santa == MCTop && m.c.Offloaded < 0.5) {
		return m.run.cfg.ServerRates
	}
	return m.run.cfg.Rates
}

func (m *mcCase) ServerPIDs() []int {
	var pids []int
	if m.c.Santa == MCTop && m.run.santad != nil {
		pids = append(pids, m.run.santad.sd.PID())
		if m.run.ctl != nil {
			pids = append(pids, m.run.ctl.PID())
		}
	}
	return pids
}

func (m *mcCase) Answered() (uint64, error) {
	if m.c.Santa != MCTop || m.run.santad == nil {
		return 0, nil
	}
	return m.run.santad.answered()
}

func (m *mcCase) Load(env *Env, probeRate int) (Load, error) {
	mix := m.run.mixes[m.c.Mix]
	g, err := mcgen.New(mcgen.Config{TB: env.TB, Family: 4, DstPort: mcPort, Payloads: mix, RequestID: true,
		SrcPorts: 64, Pacing: m.run.cfg.Pacing, CPU: env.Placement.ClientCPU})
	if err != nil {
		return Load{}, err
	}
	load := Load{Generator: mcLoad{g}, Distinct: len(mix), Close: func() { g.Close() }}
	if probeRate > 0 && m.LatencyProbe() {
		if load.Prober, err = NewPayloadProber(env.TB, m.run.mc.Addr4, probeRate, mix); err != nil {
			g.Close()
			return Load{}, err
		}
	}
	return load, nil
}

// mcLoad is mcgen as the harness's generator: replies are the replies to
// requests in flight (a late duplicate does not count).
type mcLoad struct{ g *mcgen.Generator }

func (l mcLoad) Run(ctx context.Context, rate int, d time.Duration) (LoadResult, error) {
	r, err := l.g.Run(ctx, rate, d)
	secs := math.Max(d.Seconds(), 1e-9)
	return LoadResult{Sent: r.Sent, SentPPS: r.SendRate(), Replies: r.Matched, RepliesPPS: float64(r.Matched) / secs,
		Duration: d.Seconds(), Output: r.String()}, err
}
