//go:build linux

package bench

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// Config is one benchmark run.
type Config struct {
	Cases     []Responder
	Rates     []int         // offered queries/s, ascending
	Duration  time.Duration // per point (whole seconds)
	Reps      int           // repetitions per point; medians are reported
	Names     int           // generated zone names, queried by default
	Batch     int           // kxdpgun -b; 0: its default (10)
	Placement testbed.Placement
	Quick     bool // recorded in the report
	Verbose   bool // log the sampler's ticks and kxdpgun's output

	// ProbeRate > 0 runs a latency prober (see Prober) at that many
	// queries/s during every measured point, from the case's query mix.
	ProbeRate int
	// StopAfter > 0 ends a case's sweep once that many consecutive rates
	// gave fewer replies/s than 98 % of the best rate before them: the case
	// is past its saturation point. 0: every rate is measured.
	StopAfter int

	// Other people's work on the server CPU ruins a measurement. Before
	// each point the harness waits (at most QuietWait) until the server CPU
	// is idle (< 3 % busy over 300 ms), and it repeats a point (at most
	// Retries times) whose server CPU busy time exceeds the run time of the
	// known server threads by more than 10 %.
	QuietWait time.Duration
	Retries   int
	// QuietBudget bounds the total time spent waiting and repeating for
	// others' work over the whole run; once spent, points are measured
	// as they come (and marked when disturbed). 0: no waiting at all.
	QuietBudget time.Duration
	Logf        func(format string, args ...any)
	Command     string // how the run was started, for the report
}

// Sample is one repetition of one point.
type Sample struct {
	Case       string  `json:"case"`
	OfferedQPS int     `json:"offered_qps"`
	Rep        int     `json:"rep"`
	Sent       uint64  `json:"sent"`
	SentPPS    float64 `json:"sent_pps"`
	Replies    uint64  `json:"replies"`
	RepliesPPS float64 `json:"replies_pps"` // kxdpgun: replies / duration
	ServerRx   uint64  `json:"server_rx"`   // frames the server veth received in the window
	ClientRx   uint64  `json:"client_rx"`   // frames the client veth received in the window (replies on the wire)

	WindowSec  float64 `json:"window_s"`      // measured window (traffic plus <= 2 sample periods)
	ServerBusy float64 `json:"server_busy_s"` // server CPU: wall − idle − iowait − steal over the window
	ServerUtil float64 `json:"server_util"`   // ServerBusy / window
	StealSec   float64 `json:"steal_s"`
	ThreadsSec float64 `json:"server_threads_s"`          // exact run time of NSD + server NAPI kthread (+ case pids)
	ExtraSec   float64 `json:"extra_threads_s,omitempty"` // of which the case's own pids (PIDProvider, e.g. santad)
	ClientUtil float64 `json:"client_util"`               // generator CPU, for information

	UsPerReply        float64 `json:"us_per_reply"`         // ServerBusy / Replies
	UsPerReplyThreads float64 `json:"us_per_reply_threads"` // ThreadsSec / Replies
	UsPerFrame        float64 `json:"us_per_frame_sent"`    // ServerBusy / ClientRx: per reply the server put on the wire
	Foreign           float64 `json:"foreign"`              // (ServerBusy − ThreadsSec) / ServerBusy: work on the server CPU by others
	Disturbed         bool    `json:"disturbed,omitempty"`  // Foreign > 10 % or StealShare > 3 % even after retries
	Attempts          int     `json:"attempts"`             // measurements taken for this sample

	// BPF run-time accounting (two clock reads per packet) is on only in
	// the probe and the first repetition of a point: its BPF figures come
	// from there, every other figure from the repetitions without it.
	BPFStats    bool    `json:"bpf_stats,omitempty"`
	ProgID      uint32  `json:"prog_id,omitempty"`
	ProgName    string  `json:"prog_name,omitempty"`
	BPFRunNs    uint64  `json:"bpf_run_ns,omitempty"`
	BPFRunCnt   uint64  `json:"bpf_run_cnt,omitempty"`
	BPFNsPerRun float64 `json:"bpf_ns_per_run,omitempty"` // run_time_ns / run_cnt

	// The case's own count of queries answered in XDP over the point (see
	// AnswerCounter), and its share of all replies.
	XDPAnswered uint64  `json:"xdp_answered,omitempty"`
	XDPShare    float64 `json:"xdp_share,omitempty"`

	// Latency prober (Config.ProbeRate): queries sent and answered during
	// the point, and round-trip-time percentiles of the answered ones. Its
	// replies count in the CPU-per-reply figures.
	ProbeSent     int     `json:"probe_sent,omitempty"`
	ProbeAnswered int     `json:"probe_answered,omitempty"`
	LatP50Us      float64 `json:"lat_p50_us,omitempty"`
	LatP90Us      float64 `json:"lat_p90_us,omitempty"`
	LatP99Us      float64 `json:"lat_p99_us,omitempty"`
	LatMaxUs      float64 `json:"lat_max_us,omitempty"`
}

// Point is the repetitions of one offered rate and their medians.
type Point struct {
	OfferedQPS int      `json:"offered_qps"`
	Reps       []Sample `json:"reps"`
	Median     Sample   `json:"median"` // field-wise medians
	MinUs      float64  `json:"us_per_reply_min"`
	MaxUs      float64  `json:"us_per_reply_max"`
}

// CaseResult is the sweep of one case.
type CaseResult struct {
	Name        string  `json:"name"`
	Description string  `json:"description,omitempty"`
	Queries     int     `json:"queries"`           // distinct queries in kxdpgun's file
	ProbeRatio  float64 `json:"probe_reply_ratio"` // replies/sent at the low-rate probe
	Background  float64 `json:"background_util"`   // server CPU busy while idle, before the case
	Points      []Point `json:"points"`
	Saturation  int     `json:"saturation_index"` // index of the point with the most replies/s
	Knee        int     `json:"knee_index"`       // index of the highest rate with >= 95 % answered, -1 if none
	Error       string  `json:"error,omitempty"`
	Stopped     bool    `json:"stopped_early,omitempty"` // the sweep ended past saturation (Config.StopAfter)
	SetupSec    float64 `json:"setup_s,omitempty"`       // time Setup took
}

// Report is a whole run.
type Report struct {
	Started   time.Time         `json:"started"`
	Finished  time.Time         `json:"finished"`
	Host      map[string]string `json:"host"`
	Command   string            `json:"command"`
	Quick     bool              `json:"quick"`
	Rates     []int             `json:"rates"`
	Duration  float64           `json:"duration_s"`
	Reps      int               `json:"reps"`
	Names     int               `json:"names"`
	Batch     int               `json:"batch"`
	ServerCPU int               `json:"server_cpu"`
	ClientCPU int               `json:"client_cpu"`
	Cases     []CaseResult      `json:"cases"`
}

// kneeRatio is the answered share that defines a case's knee.
const kneeRatio = 0.95

// KneePoint returns the highest offered rate with at least 95 % of the
// queries answered (nil if none): the cleanest cost figure, with no
// requests or replies lost anywhere.
func (c *CaseResult) KneePoint() *Point {
	if c.Knee < 0 || c.Knee >= len(c.Points) {
		return nil
	}
	return &c.Points[c.Knee]
}

// Sat returns the saturation point of a case (nil if it has none).
func (c *CaseResult) Sat() *Point {
	if c.Saturation < 0 || c.Saturation >= len(c.Points) {
		return nil
	}
	return &c.Points[c.Saturation]
}

// Case returns the result of the named case, or nil.
func (r *Report) Case(name string) *CaseResult {
	for i := range r.Cases {
		if r.Cases[i].Name == name {
			return &r.Cases[i]
		}
	}
	return nil
}

// Run builds a testbed, starts NSD and runs every case of cfg. A case that
// fails is recorded with its error and the run goes on; the testbed is
// always removed.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := prepareHost(&cfg); err != nil {
		return nil, err
	}
	logf := cfg.Logf
	if err := checkTools(); err != nil {
		return nil, err
	}

	rep := &Report{
		Started: time.Now(), Host: hostInfo(), Command: cfg.Command, Quick: cfg.Quick,
		Rates: cfg.Rates, Duration: cfg.Duration.Seconds(), Reps: cfg.Reps, Names: cfg.Names,
		Batch: cfg.Batch, ServerCPU: cfg.Placement.ServerCPU, ClientCPU: cfg.Placement.ClientCPU,
	}
	if rep.Batch == 0 {
		rep.Batch = 10
	}

	tb, tmp, closeRun, err := openRun(cfg, "santa-benchudp-")
	if err != nil {
		return nil, err
	}
	defer closeRun()

	zone := tb.ExampleZone(cfg.Names)
	nsd, err := tb.StartNSD(testbed.NSDOptions{Zone: &zone, Pin: true, CPU: cfg.Placement.ServerCPU})
	if err != nil {
		return nil, err
	}
	logf("nsd running (pid %d), zone %s with %d generated names", nsd.PID(), zone.Origin, zone.Generated)

	env := &Env{TB: tb, NSD: nsd, Server: nsd, Zone: zone, Placement: cfg.Placement, Logf: logf}
	for i := 0; i < cfg.Names; i++ {
		env.Queries = append(env.Queries, Query{Name: testbed.GenName(zone.Origin, i), Type: "A"})
	}

	h := &harness{cfg: cfg, tb: tb, env: env, tmp: tmp}
	for _, c := range cfg.Cases {
		if ctx.Err() != nil {
			break
		}
		cr := h.runCase(ctx, c)
		if cr.Error != "" {
			logf("[%s] FAILED: %s", cr.Name, cr.Error)
		}
		rep.Cases = append(rep.Cases, cr)
	}
	rep.Finished = time.Now()
	return rep, ctx.Err()
}

// harness runs cases on one testbed, against env.Server.
type harness struct {
	cfg    Config
	waited time.Duration // spent on quiet waits and repeated points
	spent  bool
	tb     *testbed.Testbed
	env    *Env
	tmp    string // query files
}

func (h *harness) runCase(ctx context.Context, c Responder) (cr CaseResult) {
	logf := h.cfg.Logf
	cr = CaseResult{Name: c.Name(), Saturation: -1, Knee: -1}
	if d, ok := c.(Describer); ok {
		cr.Description = d.Description()
	}
	logf("[%s] setup: %s", cr.Name, cr.Description)
	// Idle background on the server CPU (others' work would inflate busy).
	if bg, err := idleUtil(h.cfg.Placement.ServerCPU, time.Second); err == nil {
		cr.Background = bg
		if bg > 0.02 {
			logf("[%s] note: server cpu%d is %.0f%% busy with others' work; points will wait for quiet and be checked", cr.Name, h.cfg.Placement.ServerCPU, 100*bg)
		}
	}
	setupStart := time.Now()
	err := c.Setup(h.env)
	// in ms, so that a case whose preparation is done elsewhere (DNS: the
	// run's setup steps) records none rather than a microsecond
	cr.SetupSec = math.Round(time.Since(setupStart).Seconds()*1000) / 1000
	if err != nil {
		cr.Error = "setup: " + err.Error()
		if terr := c.Teardown(); terr != nil {
			logf("[%s] teardown after failed setup: %v", cr.Name, terr)
		}
		return cr
	}
	defer func() {
		if err := c.Teardown(); err != nil {
			logf("[%s] teardown: %v", cr.Name, err)
			if cr.Error == "" {
				cr.Error = "teardown: " + err.Error()
			}
		}
		// The next case must start from a bare server veth (unless the
		// program is shared with the next cases).
		if sx, ok := c.(SharedXDP); ok && sx.SharedXDP() {
			return
		}
		if xi, err := h.tb.ServerXDP(); err == nil && xi.ID() != 0 {
			logf("[%s] warning: XDP program %d left on the server veth; removing", cr.Name, xi.ID())
			testbed.DetachXDPNetlink(h.tb.Server.NS, h.tb.Server.Ifindex, testbed.XDPModeDriver)
			testbed.DetachXDPNetlink(h.tb.Server.NS, h.tb.Server.Ifindex, testbed.XDPModeGeneric)
		}
	}()

	var load Load
	if lp, ok := c.(LoadProvider); ok {
		load, err = lp.Load(h.env, h.cfg.ProbeRate)
	} else {
		load, err = h.kxdpgunLoad(c, cr.Name)
	}
	if err != nil {
		cr.Error = err.Error()
		return cr
	}
	if load.Close != nil {
		defer load.Close()
	}
	cr.Queries = load.Distinct
	pt := &point{name: cr.Name, load: load.Generator, prober: load.Prober}
	if pp, ok := c.(PIDProvider); ok {
		pt.extra = pp.ServerPIDs()
	}
	pt.counter, _ = c.(AnswerCounter)
	rates := h.cfg.Rates
	if rp, ok := c.(RateProvider); ok && len(rp.Rates()) > 0 {
		rates = rp.Rates()
	}

	// Probe: a low rate must be answered almost completely.
	probeLoad, probeWhat := 10000, "10k qps"
	if pl, ok := c.(ProbeLoader); ok {
		probeLoad, probeWhat = pl.ProbeLoad()
	}
	probe, err := h.measure(ctx, pt, probeLoad, time.Second, 0)
	if err != nil {
		cr.Error = "probe: " + err.Error()
		return cr
	}
	if probe.Sent > 0 {
		cr.ProbeRatio = float64(probe.Replies) / float64(probe.Sent)
	}
	logf("[%s] probe at %s: %d/%d answered (%.1f%%)%s", cr.Name, probeWhat, probe.Replies, probe.Sent, 100*cr.ProbeRatio, progInfo(probe))
	if cr.ProbeRatio < 0.9 {
		cr.Error = fmt.Sprintf("probe: only %.1f%% of requests answered at %s", 100*cr.ProbeRatio, probeWhat)
		return cr
	}

	foreignLimit := maxForeign
	if fl, ok := c.(ForeignLimiter); ok {
		foreignLimit = fl.MaxForeign()
	}
	best, below := 0.0, 0
	for _, qps := range rates {
		if h.cfg.StopAfter > 0 && below >= h.cfg.StopAfter {
			logf("[%s] past saturation (%d rates below the best): rates from %s qps skipped", cr.Name, below, si(float64(qps)))
			cr.Stopped = true
			break
		}
		p := Point{OfferedQPS: qps}
		for r := 1; r <= h.cfg.Reps; r++ {
			if ctx.Err() != nil {
				cr.Error = "interrupted"
				return cr
			}
			var s Sample
			for attempt := 1; ; attempt++ {
				h.quiet(ctx, cr.Name)
				a, err := h.measure(ctx, pt, qps, h.cfg.Duration, r)
				if err != nil {
					cr.Error = fmt.Sprintf("%d qps rep %d: %v", qps, r, err)
					return cr
				}
				if attempt == 1 || disturbance(a, foreignLimit) < disturbance(s, foreignLimit) {
					s = a // keep the least disturbed attempt
				}
				s.Attempts = attempt
				if disturbance(a, foreignLimit) <= 1 {
					s = a
					s.Attempts = attempt
					break
				}
				if attempt > h.cfg.Retries || ctx.Err() != nil || h.budgetSpent() {
					s.Disturbed = true
					logf("[%s] %s qps rep %d: still disturbed after %d attempts; keeping the least disturbed one (%.0f%% not the server's, %.0f%% stolen), marked disturbed",
						cr.Name, si(float64(qps)), r, attempt, 100*s.Foreign, 100*s.StealShare())
					break
				}
				logf("[%s] %s qps rep %d: %.0f%% of the server CPU's busy time was not the server's (others' work), %.0f%% of its time stolen by the hypervisor; repeating",
					cr.Name, si(float64(qps)), r, 100*a.Foreign, 100*a.StealShare())
				h.waited += time.Duration(a.WindowSec * float64(time.Second))
			}
			logf("[%s] %s qps rep %d/%d: %s replies/s (%.0f%%), server cpu %.0f%%, %.2f µs/reply (threads %.2f, per frame sent %.2f), client cpu %.0f%%%s%s",
				cr.Name, si(float64(qps)), r, h.cfg.Reps, si(s.RepliesPPS), 100*ratio(s.Replies, s.Sent),
				100*s.ServerUtil, s.UsPerReply, s.UsPerReplyThreads, s.UsPerFrame, 100*s.ClientUtil, progInfo(s), probeInfo(s))
			p.Reps = append(p.Reps, s)
		}
		p.Median, p.MinUs, p.MaxUs = median(p.Reps)
		cr.Points = append(cr.Points, p)
		if m := p.Median.RepliesPPS; m < 0.98*best {
			below++
		} else {
			below = 0
		}
		best = max(best, p.Median.RepliesPPS)
	}
	best = -1.0
	for i, p := range cr.Points {
		if p.Median.RepliesPPS > best {
			best, cr.Saturation = p.Median.RepliesPPS, i
		}
		if ratio(p.Median.Replies, p.Median.Sent) >= kneeRatio {
			cr.Knee = i
		}
	}
	if sp := cr.Sat(); sp != nil {
		m := sp.Median
		logf("[%s] saturation at %s qps offered: %s replies/s, %.2f µs server CPU/reply%s",
			cr.Name, si(float64(sp.OfferedQPS)), si(m.RepliesPPS), m.UsPerReply, progInfo(m))
	}
	return cr
}

// kxdpgunLoad is the default load: kxdpgun sending the case's queries (or
// env.Queries), and the DNS latency prober over the same mix.
func (h *harness) kxdpgunLoad(c Responder, name string) (Load, error) {
	qs := h.env.Queries
	if qp, ok := c.(QueryProvider); ok {
		qs = qp.Queries(h.env)
	}
	if len(qs) == 0 {
		return Load{}, errors.New("no queries")
	}
	qfile := filepath.Join(h.tmp, name+".queries")
	if err := WriteQueryFile(qfile, qs); err != nil {
		return Load{}, err
	}
	load := Load{
		Generator: &Gun{TB: h.tb, QueryFile: qfile, Target: h.tb.Server.IP4.String(), CPU: h.cfg.Placement.ClientCPU, Batch: h.cfg.Batch},
		Distinct:  len(qs),
	}
	if lp, ok := c.(LatencyProbe); h.cfg.ProbeRate > 0 && (!ok || lp.LatencyProbe()) {
		p, err := NewProber(h.tb, netip.AddrPortFrom(h.tb.Server.IP4, 53), h.cfg.ProbeRate, qs)
		if err != nil {
			return Load{}, err
		}
		load.Prober = p
	}
	return load, nil
}

func probeInfo(s Sample) string {
	var b strings.Builder
	if s.XDPAnswered > 0 {
		fmt.Fprintf(&b, ", %.0f%% answered in XDP", 100*s.XDPShare)
	}
	if all := s.Replies + uint64(s.ProbeAnswered); s.ExtraSec > 0 && all > 0 {
		fmt.Fprintf(&b, ", case's own processes %.2f µs/reply", 1e6*s.ExtraSec/float64(all))
	}
	if s.ProbeSent > 0 {
		fmt.Fprintf(&b, ", latency p50 %.0f µs p99 %.0f µs (%d/%d probes)", s.LatP50Us, s.LatP99Us, s.ProbeAnswered, s.ProbeSent)
	}
	return b.String()
}

func progInfo(s Sample) string {
	if s.ProgID == 0 || !s.BPFStats {
		return ""
	}
	return fmt.Sprintf(", BPF %s %.0f ns/run", s.ProgName, s.BPFNsPerRun)
}

func ratio(a, b uint64) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// tick is one reading of the sampler.
type tick struct {
	cpu     testbed.CPUSample
	traffic uint64 // frames on the veth pair, both ends, both directions
	srvRx   uint64 // frames received by the server veth
	cliRx   uint64 // frames received by the client veth: replies that crossed the veth
	threads time.Duration
	extra   time.Duration // the case's own pids, part of threads
}

const samplePeriod = 50 * time.Millisecond

func (h *harness) sampleOnce(pids, extra []int) (tick, error) {
	var t tick
	s, err := h.tb.Server.Stats()
	if err != nil {
		return t, err
	}
	c, err := h.tb.Client.Stats()
	if err != nil {
		return t, err
	}
	t.traffic = s.RxPackets + s.TxPackets + c.RxPackets + c.TxPackets
	t.srvRx = s.RxPackets
	t.cliRx = c.RxPackets
	t.threads, err = testbed.RunTimes(pids...)
	if err != nil {
		return t, err
	}
	if len(extra) > 0 {
		if t.extra, err = testbed.RunTimes(extra...); err != nil {
			return t, err
		}
	}
	t.cpu, err = testbed.ReadCPUStat()
	return t, err
}

// point is what measure needs of a case.
type point struct {
	name    string
	load    Generator
	extra   []int         // more server pids (PIDProvider)
	counter AnswerCounter // nil: the case answers nothing in XDP by itself
	prober  *Prober       // nil: no latency probing
}

// measure runs one point: kxdpgun at qps for d, while sampling the server
// CPU, the server threads and the veth counters every 50 ms. The CPU
// figures are taken over the window in which frames moved (plus up to one
// sample period at each end), so kxdpgun's start-up and tear-down do not
// count. With a prober, it sends queries from 0.5 s after kxdpgun's start
// until 0.5 s before its end (rep 0, the probe, goes without).
func (h *harness) measure(ctx context.Context, pt *point, qps int, d time.Duration, rep int) (Sample, error) {
	name, extra := pt.name, pt.extra
	s := Sample{Case: name, OfferedQPS: qps, Rep: rep}
	if err := h.tb.PinNAPI(h.cfg.Placement); err != nil {
		return s, err
	}
	napi, err := h.tb.ServerNAPIThreads()
	if err != nil {
		return s, err
	}
	srvPIDs, err := h.env.Server.PIDs()
	if err != nil {
		return s, err
	}
	pids := append(append(append([]int{}, srvPIDs...), napi...), extra...)

	xi, err := h.tb.ServerXDP()
	if err != nil {
		return s, err
	}
	s.ProgID = xi.ID()
	if s.ProgID != 0 && rep <= 1 {
		stats, err := testbed.EnableBPFStats()
		if err != nil {
			return s, fmt.Errorf("enable BPF stats: %w", err)
		}
		defer stats.Close()
		s.BPFStats = true
	}
	var run0, cnt0 uint64
	if s.ProgID != 0 {
		st, err := testbed.ProgramStats(s.ProgID)
		if err != nil {
			return s, err
		}
		run0, cnt0 = uint64(st.Runtime), st.RunCount
		s.ProgName = progName(s.ProgID)
	}

	// Sampler.
	var (
		mu    sync.Mutex
		ticks []tick
		serr  error
	)
	stop := make(chan struct{})
	done := make(chan struct{})
	// flowing is closed once kxdpgun's traffic is under way (a quarter of
	// the offered rate seen in one sample period): kxdpgun first reads its
	// query file, which takes a while for a million queries.
	flowing := make(chan struct{})
	flowThresh := max(32, uint64(float64(qps)*samplePeriod.Seconds()/4))
	go func() {
		defer close(done)
		tk := time.NewTicker(samplePeriod)
		defer tk.Stop()
		var prev uint64
		flowed := false
		for {
			t, err := h.sampleOnce(pids, extra)
			mu.Lock()
			if err != nil && serr == nil {
				serr = err
			}
			if err == nil {
				if len(ticks) > 0 && t.traffic-prev >= flowThresh && !flowed {
					close(flowing)
					flowed = true
				}
				prev = t.traffic
				ticks = append(ticks, t)
			}
			mu.Unlock()
			select {
			case <-stop:
				return
			case <-tk.C:
			}
		}
	}()

	var answered0 uint64
	if pt.counter != nil {
		if answered0, err = pt.counter.Answered(); err != nil {
			close(stop)
			<-done
			return s, fmt.Errorf("answer counter: %w", err)
		}
	}
	type probeOut struct {
		r   ProbeResult
		err error
	}
	probed := make(chan probeOut, 1)
	secs := max(d.Round(time.Second), time.Second)
	if pt.prober != nil && rep > 0 && secs > time.Second {
		go func() {
			select {
			case <-flowing:
			case <-ctx.Done():
			case <-time.After(secs + 20*time.Second): // kxdpgun's own time limit
				probed <- probeOut{err: errors.New("prober: kxdpgun's traffic never started")}
				return
			}
			r, err := pt.prober.Run(ctx, 300*time.Millisecond, secs-800*time.Millisecond)
			probed <- probeOut{r, err}
		}()
	} else {
		probed <- probeOut{}
	}
	gunStart := time.Now()
	res, gerr := pt.load.Run(ctx, qps, d)
	gunTook := time.Since(gunStart)
	po := <-probed
	time.Sleep(2 * samplePeriod) // let the server drain its queues
	close(stop)
	<-done
	if gerr != nil {
		return s, gerr
	}
	if po.err != nil {
		return s, po.err
	}
	s.ProbeSent, s.ProbeAnswered = po.r.Sent, po.r.Answered
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	s.LatP50Us, s.LatP90Us, s.LatP99Us, s.LatMaxUs = us(po.r.P50), us(po.r.P90), us(po.r.P99), us(po.r.Max)
	if po.r.Sent == 0 && res.LatP50 > 0 { // no prober: the generator's own figures (wrk)
		s.LatP50Us, s.LatP90Us, s.LatP99Us, s.LatMaxUs = us(res.LatP50), us(res.LatP90), us(res.LatP99), us(res.LatMax)
	}
	if pt.counter != nil {
		a, err := pt.counter.Answered()
		if err != nil {
			return s, fmt.Errorf("answer counter: %w", err)
		}
		s.XDPAnswered = a - answered0
	}
	if serr != nil {
		return s, fmt.Errorf("sampling: %w", serr)
	}
	if s.ProgID != 0 {
		st, err := testbed.ProgramStats(s.ProgID)
		if err != nil {
			return s, err
		}
		s.BPFRunNs, s.BPFRunCnt = uint64(st.Runtime)-run0, st.RunCount-cnt0
		if s.BPFRunCnt > 0 {
			s.BPFNsPerRun = float64(s.BPFRunNs) / float64(s.BPFRunCnt)
		}
	}
	s.Sent, s.SentPPS, s.Replies, s.RepliesPPS = res.Sent, res.SentPPS, res.Replies, res.RepliesPPS

	// The traffic window: from the tick before the first one with real
	// traffic to one tick after the last one (work still queued at the
	// server). A few stray frames (e.g. when XDP programs are swapped) do
	// not count as traffic.
	var peak uint64
	for i := 1; i < len(ticks); i++ {
		peak = max(peak, ticks[i].traffic-ticks[i-1].traffic)
	}
	thresh := max(peak/20, 32)
	first, last := -1, -1
	for i := 1; i < len(ticks); i++ {
		if ticks[i].traffic-ticks[i-1].traffic >= thresh {
			if first < 0 {
				first = i - 1
			}
			last = i
		}
	}
	if first < 0 {
		return s, fmt.Errorf("no traffic seen on the veth pair (peak %d frames per %v)", peak, samplePeriod)
	}
	if last+1 < len(ticks) {
		last++
	}
	a, b := ticks[first], ticks[last]
	if h.cfg.Verbose {
		var tr []string
		for i := 1; i < len(ticks); i++ {
			u, _ := ticks[i].cpu.Usage(ticks[i-1].cpu, h.cfg.Placement.ServerCPU)
			tr = append(tr, fmt.Sprintf("%d:%d/%.0f%%", i, ticks[i].traffic-ticks[i-1].traffic, 100*u.Util()))
		}
		h.cfg.Logf("[%s] kxdpgun ran %v; ticks (frames/server busy) %s; window %d..%d\n%s", name, gunTook.Round(time.Millisecond), strings.Join(tr, " "), first, last, strings.TrimSpace(res.Output))
	}
	srv, err := b.cpu.Usage(a.cpu, h.cfg.Placement.ServerCPU)
	if err != nil {
		return s, err
	}
	cli, err := b.cpu.Usage(a.cpu, h.cfg.Placement.ClientCPU)
	if err != nil {
		return s, err
	}
	s.WindowSec = srv.Wall.Seconds()
	s.ServerBusy = srv.Busy.Seconds()
	s.ServerUtil = srv.Util()
	s.StealSec = srv.Steal.Seconds()
	s.ClientUtil = cli.Util()
	s.ThreadsSec = (b.threads - a.threads).Seconds()
	s.ExtraSec = (b.extra - a.extra).Seconds()
	s.ServerRx = b.srvRx - a.srvRx
	s.ClientRx = b.cliRx - a.cliRx
	if all := s.Replies + uint64(s.ProbeAnswered); all > 0 {
		s.UsPerReply = 1e6 * s.ServerBusy / float64(all)
		s.UsPerReplyThreads = 1e6 * s.ThreadsSec / float64(all)
		s.XDPShare = min(1, float64(s.XDPAnswered)/float64(all))
	}
	if s.ServerBusy > 0 {
		s.Foreign = max(0, (s.ServerBusy-s.ThreadsSec)/s.ServerBusy)
	}
	if s.ClientRx > 0 {
		s.UsPerFrame = 1e6 * s.ServerBusy / float64(s.ClientRx)
	}
	return s, nil
}

func progName(id uint32) string {
	out, err := testbed.Run("", "bpftool", "prog", "show", "id", fmt.Sprint(id))
	if err != nil {
		return ""
	}
	// "123: xdp  name reflector  tag …"
	f := strings.Fields(out)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "name" {
			return f[i+1]
		}
	}
	return ""
}

// maxForeign is the share of the server CPU's busy time that may be work
// other than the server's threads before a point is repeated.
const maxForeign = 0.10

// StealShare is the share of the window the hypervisor took from the server CPU.
func (s Sample) StealShare() float64 {
	if s.WindowSec <= 0 {
		return 0
	}
	return s.StealSec / s.WindowSec
}

// disturbance rates a sample against the limits on others' work and on
// steal: the larger of its shares, each over its limit; above 1 the
// sample is disturbed and measured again.
func disturbance(s Sample, foreignLimit float64) float64 {
	return max(s.Foreign/foreignLimit, s.StealShare()/testbed.MaxSteal)
}

// quiet waits until both the server and the client CPU are idle (others'
// work: between points nothing of ours runs), at most cfg.QuietWait.
func (h *harness) quiet(ctx context.Context, name string) {
	start := time.Now()
	defer func() { h.waited += time.Since(start) }()
	deadline := start.Add(h.cfg.QuietWait)
	logged := false
	for ctx.Err() == nil && !h.budgetSpent() {
		a, err := testbed.ReadCPUStat()
		if err != nil {
			return
		}
		time.Sleep(300 * time.Millisecond)
		b, err := testbed.ReadCPUStat()
		if err != nil {
			return
		}
		us, _ := b.Usage(a, h.cfg.Placement.ServerCPU)
		uc, _ := b.Usage(a, h.cfg.Placement.ClientCPU)
		if us.Util() < 0.03 && uc.Util() < 0.05 {
			return
		}
		if time.Now().After(deadline) {
			h.cfg.Logf("[%s] cpus still busy with others' work after %v (server %.0f%%, client %.0f%%); measuring anyway", name, h.cfg.QuietWait, 100*us.Util(), 100*uc.Util())
			return
		}
		if !logged {
			h.cfg.Logf("[%s] others' work on the cpus (server %.0f%%, client %.0f%%); waiting up to %v for quiet", name, 100*us.Util(), 100*uc.Util(), h.cfg.QuietWait)
			logged = true
		}
	}
}

// budgetSpent reports (and logs once) whether the run's budget for
// waiting out others' work is used up.
func (h *harness) budgetSpent() bool {
	if h.waited < h.cfg.QuietBudget {
		return false
	}
	if !h.spent && h.cfg.QuietBudget > 0 {
		h.cfg.Logf("spent the %v budget for waiting out others' work: measuring points as they come from now on", h.cfg.QuietBudget)
	}
	h.spent = true
	return true
}

// idleUtil measures how busy cpu is over d while the harness does nothing.
func idleUtil(cpu int, d time.Duration) (float64, error) {
	a, err := testbed.ReadCPUStat()
	if err != nil {
		return 0, err
	}
	time.Sleep(d)
	b, err := testbed.ReadCPUStat()
	if err != nil {
		return 0, err
	}
	u, err := b.Usage(a, cpu)
	return u.Util(), err
}

// median returns field-wise medians of the samples, and the min and max of
// µs per reply. The BPF figures come from the samples taken with BPF
// run-time accounting on, all others from those without it (if any).
func median(all []Sample) (Sample, float64, float64) {
	if len(all) == 0 {
		return Sample{}, 0, 0
	}
	var ss, withStats []Sample
	for _, s := range all {
		if s.BPFStats {
			withStats = append(withStats, s)
		} else {
			ss = append(ss, s)
		}
	}
	if len(ss) == 0 {
		ss = all
	}
	m := ss[0]
	m.Rep = 0
	med := func(ss []Sample, get func(Sample) float64) float64 {
		v := make([]float64, len(ss))
		for i, s := range ss {
			v[i] = get(s)
		}
		sort.Float64s(v)
		if len(v)%2 == 1 {
			return v[len(v)/2]
		}
		return (v[len(v)/2-1] + v[len(v)/2]) / 2
	}
	medU := func(ss []Sample, get func(Sample) uint64) uint64 {
		return uint64(med(ss, func(s Sample) float64 { return float64(get(s)) }) + 0.5)
	}
	f := func(get func(Sample) float64) float64 { return med(ss, get) }
	u := func(get func(Sample) uint64) uint64 { return medU(ss, get) }
	m.Sent = u(func(s Sample) uint64 { return s.Sent })
	m.SentPPS = f(func(s Sample) float64 { return s.SentPPS })
	m.Replies = u(func(s Sample) uint64 { return s.Replies })
	m.RepliesPPS = f(func(s Sample) float64 { return s.RepliesPPS })
	m.ServerRx = u(func(s Sample) uint64 { return s.ServerRx })
	m.ClientRx = u(func(s Sample) uint64 { return s.ClientRx })
	m.UsPerFrame = f(func(s Sample) float64 { return s.UsPerFrame })
	m.Foreign = f(func(s Sample) float64 { return s.Foreign })
	m.Attempts = 0
	m.Disturbed = false
	for _, s := range ss {
		m.Attempts += s.Attempts
		m.Disturbed = m.Disturbed || s.Disturbed
	}
	m.WindowSec = f(func(s Sample) float64 { return s.WindowSec })
	m.ServerBusy = f(func(s Sample) float64 { return s.ServerBusy })
	m.ServerUtil = f(func(s Sample) float64 { return s.ServerUtil })
	m.StealSec = f(func(s Sample) float64 { return s.StealSec })
	m.ThreadsSec = f(func(s Sample) float64 { return s.ThreadsSec })
	m.ExtraSec = f(func(s Sample) float64 { return s.ExtraSec })
	m.ClientUtil = f(func(s Sample) float64 { return s.ClientUtil })
	m.UsPerReply = f(func(s Sample) float64 { return s.UsPerReply })
	m.UsPerReplyThreads = f(func(s Sample) float64 { return s.UsPerReplyThreads })
	if len(withStats) > 0 {
		m.BPFStats = true
		m.BPFRunNs = medU(withStats, func(s Sample) uint64 { return s.BPFRunNs })
		m.BPFRunCnt = medU(withStats, func(s Sample) uint64 { return s.BPFRunCnt })
		m.BPFNsPerRun = med(withStats, func(s Sample) float64 { return s.BPFNsPerRun })
	}
	m.XDPAnswered = u(func(s Sample) uint64 { return s.XDPAnswered })
	m.XDPShare = f(func(s Sample) float64 { return s.XDPShare })
	m.ProbeSent = int(u(func(s Sample) uint64 { return uint64(s.ProbeSent) }))
	m.ProbeAnswered = int(u(func(s Sample) uint64 { return uint64(s.ProbeAnswered) }))
	m.LatP50Us = f(func(s Sample) float64 { return s.LatP50Us })
	m.LatP90Us = f(func(s Sample) float64 { return s.LatP90Us })
	m.LatP99Us = f(func(s Sample) float64 { return s.LatP99Us })
	m.LatMaxUs = f(func(s Sample) float64 { return s.LatMaxUs })
	lo, hi := ss[0].UsPerReply, ss[0].UsPerReply
	for _, s := range ss {
		lo, hi = min(lo, s.UsPerReply), max(hi, s.UsPerReply)
	}
	return m, lo, hi
}

// si formats 1234567 as "1.23M", 183400 as "183k".
func si(v float64) string {
	switch {
	case v >= 999.5e3:
		return fmt.Sprintf("%.2fM", v/1e6)
	case v >= 1e3:
		return fmt.Sprintf("%.0fk", v/1e3)
	}
	return fmt.Sprintf("%.0f", v)
}

func hostInfo() map[string]string {
	m := map[string]string{}
	var u unix.Utsname
	if unix.Uname(&u) == nil {
		m["kernel"] = unix.ByteSliceToString(u.Release[:])
	}
	m["cpus"] = fmt.Sprint(runtime.NumCPU())
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.TrimSpace(k) == "model name" {
				m["cpu_model"] = strings.TrimSpace(v)
				break
			}
		}
	}
	for _, c := range [][]string{{"kxdpgun", KxdpgunPath, "-V"}, {"nsd", testbed.NSDPath, "-v"}} {
		if out, err := testbed.Run("", c[1], c[2]); err == nil || out != "" {
			line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
			m[c[0]] = line
		}
	}
	if b, err := os.ReadFile("/etc/debian_version"); err == nil {
		m["debian"] = strings.TrimSpace(string(b))
	}
	return m
}

// placedTestbed creates the testbed with cfg's placement; closeTB removes
// it, logging (not failing on) a cleanup problem.
func placedTestbed(cfg Config, logf func(string, ...any)) (tb *testbed.Testbed, closeTB func(), err error) {
	if tb, err = testbed.Create(testbed.Options{}); err != nil {
		return nil, nil, err
	}
	closeTB = func() {
		if err := tb.Close(); err != nil {
			logf("warning: testbed cleanup: %v", err)
		}
	}
	logf("testbed %s: server %s (%s, %s) on cpu%d, client %s on cpu%d",
		tb.ID, tb.Server.Dev, tb.Server.IP4, tb.Server.NS, cfg.Placement.ServerCPU, tb.Client.Dev, cfg.Placement.ClientCPU)
	if err := tb.Place(cfg.Placement); err != nil {
		closeTB()
		return nil, nil, fmt.Errorf("placement: %w", err)
	}
	return tb, closeTB, nil
}

// prepareHost checks what every benchmark needs (root, two distinct CPUs),
// pins this process to the client CPU (everything it does, sampling and
// the generators it starts, stays off the server CPU) and removes what
// killed runs left behind.
func prepareHost(cfg *Config) error {
	if cfg.Logf == nil {
		cfg.Logf = func(string, ...any) {}
	}
	if os.Geteuid() != 0 {
		return errors.New("needs root")
	}
	if runtime.NumCPU() < 2 || cfg.Placement.ServerCPU == cfg.Placement.ClientCPU {
		return fmt.Errorf("need two distinct CPUs for server and client (have %d)", runtime.NumCPU())
	}
	if err := testbed.PinProcess(os.Getpid(), cfg.Placement.ClientCPU); err != nil {
		return fmt.Errorf("pin harness: %w", err)
	}
	if removed, err := testbed.RemoveStale(); err != nil {
		cfg.Logf("warning: removing stale testbeds: %v", err)
	} else if len(removed) > 0 {
		cfg.Logf("removed stale namespaces %v", removed)
	}
	removeStalePins(cfg.Logf)
	return nil
}

// openRun creates the placed testbed and makes a temporary directory named
// after prefix; closeRun undoes both.
func openRun(cfg Config, prefix string) (tb *testbed.Testbed, tmp string, closeRun func(), err error) {
	tb, closeTB, err := placedTestbed(cfg, cfg.Logf)
	if err != nil {
		return nil, "", nil, err
	}
	if tmp, err = os.MkdirTemp("", prefix); err != nil {
		closeTB()
		return nil, "", nil, err
	}
	return tb, tmp, func() {
		os.RemoveAll(tmp)
		closeTB()
	}, nil
}

// stepRecorder returns a function that records a setup step's duration and
// error in steps and logs it.
func stepRecorder(steps *[]SetupStep, logf func(string, ...any)) func(what string, start time.Time, err error) {
	return func(what string, start time.Time, err error) {
		s := SetupStep{What: what, Seconds: time.Since(start).Seconds()}
		if err != nil {
			s.Error = err.Error()
		}
		*steps = append(*steps, s)
		logf("setup: %s took %.1f s%s", what, s.Seconds, map[bool]string{true: " (failed: " + s.Error + ")", false: ""}[err != nil])
	}
}
