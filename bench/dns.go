//go:build linux

package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/santa-offload/santa/internal/dnsnames"
	"github.com/santa-offload/santa/internal/testbed"
)

// The DNS benchmark (`make bench-dns`): the paper's DNS experiments side by
// side on the namespace testbed, with Santa driven the way an operator
// drives it: santad attached to the server veth and `santa dns` offloading
// a real server's answers.
//
//	(a) each server (NSD, Knot, BIND; one UDP worker) alone, and with Santa
//	    attached to its socket but no rules;
//	(b) every name offloaded, for 1 … 1 M rules (NSD), with the bare XDP
//	    reflector as the testbed's limit;
//	(c) a Zipf query mix over 1 M names with the n most popular offloaded
//	    (`santa dns top`), n = 0 … 1 M (NSD; Knot and BIND for some n).

// Experiments.
const (
	ExpAlone = "a" // server alone / Santa attached without rules
	ExpFull  = "b" // every name offloaded
	ExpZipf  = "c" // Zipf mix, top n offloaded
)

// DNSCase is one case of the DNS benchmark.
type DNSCase struct {
	Name       string `json:"name"`
	Server     string `json:"server"`     // nsd, knot, bind
	Experiment string `json:"experiment"` // a, b, c ("a" cases are also c's n = 0)
	// Santa: "" (server alone), "attached" (bound, no rules), "top"
	// (`santa dns top --count N`), "reflector" (the bare reflector instead
	// of Santa).
	Santa string `json:"santa"`
	N     int    `json:"n"`   // names offloaded
	Mix   string `json:"mix"` // "zipf": the Zipf mix over all names; "names": the N offloaded names, uniformly
	// ZipfShare is the share of the Zipf mix the N offloaded names get
	// (Zipf mix only).
	ZipfShare float64 `json:"zipf_share,omitempty"`
}

// DNSConfig is one run of the DNS benchmark.
type DNSConfig struct {
	Config              // the harness: Rates is the sweep for cases answered mostly in XDP
	ServerRates []int   // the sweep for cases the kernel server answers
	Names       int     // names in the zone (dnsnames.TopListNames)
	MixQueries  int     // queries in the Zipf mix (kxdpgun's file)
	ZipfS       float64 // Zipf exponent
	Seed        int64
	TTL         int       // zone TTL, s: no rule is refreshed during the run
	Cases       []DNSCase // in run order (PlanDNS)
	Bin         string    // directory holding santad and santa (built from the working tree)
	// BindPort binds every socket on port 53 (`--port 53/udp`: the IPv4
	// and the IPv6 socket, two rules per name); false binds the IPv4
	// socket the queries go to (`--pid PID --fd FD`: one rule per name).
	BindPort bool
	// ControllerArgs are more flags for `santa dns top` (e.g.
	// --learn-shapes=false); none: the controller's defaults.
	ControllerArgs []string
}

// human formats a count the way case names do: 1, 100, 1k, 10k, 1m.
func human(n int) string {
	switch {
	case n >= 1_000_000 && n%1_000_000 == 0:
		return fmt.Sprintf("%dm", n/1_000_000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}

// PlanDNS lists the cases of the DNS benchmark in run order: per server,
// the server alone, (NSD: the reflector,) Santa attached without rules,
// then by growing number of offloaded names, so that one `santa dns`
// serves every case with the same names offloaded. full: the rule counts
// of (b); zipf: the n of (c) for NSD; others: the n of (c) for Knot and
// BIND (n = 0 is the "attached" case).
func PlanDNS(servers []string, full, zipf, others []int, names int) []DNSCase {
	var out []DNSCase
	for _, srv := range servers {
		out = append(out, DNSCase{Name: srv, Server: srv, Experiment: ExpAlone, Mix: "zipf"})
		if srv == testbed.KindNSD && len(full) > 0 {
			out = append(out, DNSCase{Name: CaseReflector, Server: srv, Experiment: ExpFull, Santa: "reflector", Mix: "names", N: names})
		}
		out = append(out, DNSCase{Name: srv + "-zipf-0", Server: srv, Experiment: ExpAlone, Santa: "attached", Mix: "zipf"})
		fs, zs := full, zipf
		if srv != testbed.KindNSD {
			fs, zs = nil, others
		}
		ns := slices.Sorted(slices.Values(append(slices.Clone(fs), zs...)))
		ns = slices.Compact(ns)
		for _, n := range ns {
			if n <= 0 || n > names {
				continue
			}
			if slices.Contains(fs, n) {
				out = append(out, DNSCase{Name: srv + "-full-" + human(n), Server: srv, Experiment: ExpFull, Santa: "top", N: n, Mix: "names"})
			}
			if slices.Contains(zs, n) {
				out = append(out, DNSCase{Name: srv + "-zipf-" + human(n), Server: srv, Experiment: ExpZipf, Santa: "top", N: n, Mix: "zipf"})
			}
		}
	}
	return out
}

// Description is a one-line description of the case for the report.
func (c DNSCase) Description() string {
	srv := map[string]string{"nsd": "NSD", "knot": "Knot", "bind": "BIND"}[c.Server]
	mix := "the Zipf mix over all names"
	if c.Mix == "names" {
		mix = fmt.Sprintf("the %d offloaded names, uniformly", c.N)
		if c.Santa == "reflector" {
			mix = fmt.Sprintf("all %d names, uniformly", c.N)
		}
	}
	switch c.Santa {
	case "":
		return fmt.Sprintf("%s alone, no XDP program; queries: %s", srv, mix)
	case "attached":
		return fmt.Sprintf("%s with santad attached to the server veth and its socket bound (`santa attach`), no rules (n = 0); queries: %s", srv, mix)
	case "reflector":
		return fmt.Sprintf("bare XDP reflector (swap MAC/IP/ports, XDP_TX), the testbed's limit; %s idle; queries: %s", srv, mix)
	}
	return fmt.Sprintf("%s with `santa dns top --count %d` (the %d most popular names offloaded through santad); queries: %s", srv, c.N, c.N, mix)
}

// DNSReport is a whole DNS run: the harness report plus what each case was.
type DNSReport struct {
	Report
	ServerRates []int              `json:"server_rates"`
	MixQueries  int                `json:"mix_queries"`
	ZipfS       float64            `json:"zipf_s"`
	Seed        int64              `json:"seed"`
	TTL         int                `json:"ttl"`
	ProbeRate   int                `json:"probe_rate"`
	StopAfter   int                `json:"stop_after"`
	BindPort    bool               `json:"bind_port"`
	CtlArgs     []string           `json:"controller_args,omitempty"`
	Meta        map[string]DNSCase `json:"meta"`
	// Setup durations (zone loads, rule installs), by what was set up.
	Setup []SetupStep `json:"setup"`
}

// SetupStep is one timed preparation step.
type SetupStep struct {
	What    string  `json:"what"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// RunDNS runs the DNS benchmark. A case that fails is recorded with its
// error and the run goes on; the testbed, santad, the controllers and the
// servers are always removed.
func RunDNS(ctx context.Context, cfg DNSConfig) (*DNSReport, error) {
	if err := prepareHost(&cfg.Config); err != nil {
		return nil, err
	}
	logf := cfg.Logf
	if err := checkTools(); err != nil {
		return nil, err
	}
	for _, p := range []string{testbed.KnotPath, testbed.NamedPath} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s missing (Debian packages knot, bind9; run scripts/install-deps.sh)", p)
		}
	}
	for _, b := range []string{"santad", "santa"} {
		if _, err := os.Stat(filepath.Join(cfg.Bin, b)); err != nil {
			return nil, fmt.Errorf("%s not built: %w", b, err)
		}
	}

	rep := &DNSReport{
		Report: Report{
			Started: time.Now(), Host: hostInfo(), Command: cfg.Command, Quick: cfg.Quick,
			Rates: cfg.Rates, Duration: cfg.Duration.Seconds(), Reps: cfg.Reps, Names: cfg.Names,
			Batch: cfg.Batch, ServerCPU: cfg.Placement.ServerCPU, ClientCPU: cfg.Placement.ClientCPU,
		},
		ServerRates: cfg.ServerRates, MixQueries: cfg.MixQueries, ZipfS: cfg.ZipfS, Seed: cfg.Seed,
		TTL: cfg.TTL, ProbeRate: cfg.ProbeRate, StopAfter: cfg.StopAfter, BindPort: cfg.BindPort, CtlArgs: cfg.ControllerArgs, Meta: map[string]DNSCase{},
	}
	if rep.Batch == 0 {
		rep.Batch = 10
	}
	for _, c := range [][]string{{"knotd", testbed.KnotPath, "-V"}, {"named", testbed.NamedPath, "-v"}} {
		if out, err := testbed.Run("", c[1], c[2]); err == nil || out != "" {
			line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
			line, _, _ = strings.Cut(line, " <id:") // named -v: "BIND 9.18… <id:>"
			rep.Host[c[0]] = line
		}
	}
	step := stepRecorder(&rep.Setup, logf)
	tb, tmp, closeRun, err := openRun(cfg.Config, "santa-benchdns-")
	if err != nil {
		return nil, err
	}
	defer closeRun()

	// The names, the Zipf mix and the controller's popularity list.
	t0 := time.Now()
	names := dnsnames.TopListNames(cfg.Names, cfg.Seed)
	mix := dnsnames.ZipfQueries(names, cfg.MixQueries, cfg.ZipfS, cfg.Seed)
	ranks := filepath.Join(tmp, "ranks")
	err = dnsnames.WriteQueryFile(ranks, names, "A", nil)
	step(fmt.Sprintf("%d names, a Zipf mix of %d queries (s = %g)", len(names), len(mix), cfg.ZipfS), t0, err)
	if err != nil {
		return nil, err
	}
	mixQ := make([]Query, len(mix))
	for i, n := range mix {
		mixQ[i] = Query{Name: n, Type: "A"}
	}
	hsum := 0.0
	harm := make([]float64, len(names)+1) // harm[n]: Zipf weight of the top n
	for i := range names {
		hsum += math.Pow(float64(i+1), -cfg.ZipfS)
		harm[i+1] = hsum
	}
	maxN := 0
	for i := range cfg.Cases {
		c := &cfg.Cases[i]
		if c.Mix == "zipf" {
			c.ZipfShare = harm[min(c.N, len(names))] / hsum
		}
		if c.Santa == "top" {
			maxN = max(maxN, c.N)
		}
		rep.Meta[c.Name] = *c
	}

	env := &Env{TB: tb, Placement: cfg.Placement, Logf: logf}
	h := &harness{cfg: cfg.Config, tb: tb, env: env, tmp: tmp}
	run := &dnsRun{cfg: cfg, tb: tb, h: h, tmp: tmp, ranks: ranks, names: names, mix: mixQ, maxN: maxN, step: step}
	defer run.stopSantad()

	for i := 0; i < len(cfg.Cases); {
		// One server for all its cases.
		srv := cfg.Cases[i].Server
		j := i
		for j < len(cfg.Cases) && cfg.Cases[j].Server == srv {
			j++
		}
		group := cfg.Cases[i:j]
		i = j
		if ctx.Err() != nil {
			break
		}
		zone := tb.NamesZone(names)
		zone.TTL = cfg.TTL
		t0 := time.Now()
		server, err := tb.StartDNSServer(srv, testbed.DNSServerOptions{Zone: &zone, Pin: true, CPU: cfg.Placement.ServerCPU, Workers: 1})
		step(fmt.Sprintf("start %s with a zone of %d names", srv, len(names)), t0, err)
		if err != nil {
			for _, c := range group {
				rep.Cases = append(rep.Cases, CaseResult{Name: c.Name, Saturation: -1, Knee: -1, Error: "server: " + err.Error()})
			}
			continue
		}
		env.Server, env.Zone = server, zone
		run.server = server
		for _, c := range group {
			if ctx.Err() != nil {
				break
			}
			cr := run.runCase(ctx, c)
			if cr.Error != "" {
				logf("[%s] FAILED: %s", cr.Name, cr.Error)
			}
			rep.Cases = append(rep.Cases, cr)
		}
		run.stopController()
		run.stopSantad()
		if err := server.Stop(); err != nil {
			logf("warning: stopping %s: %v", srv, err)
		}
	}
	rep.Finished = time.Now()
	return rep, ctx.Err()
}

// dnsRun is the state shared by the cases of one run: the server, santad
// and the running `santa dns`.
type dnsRun struct {
	cfg    DNSConfig
	tb     *testbed.Testbed
	h      *harness
	tmp    string
	ranks  string // popularity list for `santa dns top`
	names  []string
	mix    []Query
	maxN   int
	step   func(string, time.Time, error)
	server testbed.DNSServer
	santad *santadRig
	ctl    *controllerProc
	ctlN   int
}

func (r *dnsRun) runCase(ctx context.Context, c DNSCase) CaseResult {
	logf := r.cfg.Logf
	fail := func(err error) CaseResult {
		return CaseResult{Name: c.Name, Description: c.Description(), Saturation: -1, Knee: -1, Error: "setup: " + err.Error()}
	}
	dc := &dnsCase{c: c, run: r}
	switch c.Santa {
	case "", "reflector":
		r.stopController()
		r.stopSantad()
		if c.Santa == "reflector" {
			return r.h.runCase(ctx, &dnsReflector{Reflector: Reflector{Port: 53}, dnsCase: dc})
		}
	case "attached", "top":
		if err := r.startSantad(); err != nil {
			return fail(err)
		}
		if c.Santa == "attached" {
			r.stopController()
			t0 := time.Now()
			bind, err := r.bindArgs()
			if err != nil {
				return fail(err)
			}
			out, err := r.santad.cli(append([]string{"attach"}, bind...)...)
			r.step("santa attach "+strings.Join(bind, " "), t0, err)
			if err != nil {
				return fail(err)
			}
			logf("[%s] %s", c.Name, strings.Join(strings.Fields(out), " "))
		} else if r.ctl == nil || r.ctlN != c.N {
			r.stopController()
			t0 := time.Now()
			bind, err := r.bindArgs()
			if err != nil {
				return fail(err)
			}
			args := append(bind, "--queries", r.ranks, "--count", fmt.Sprint(c.N), "--shape", "plain", "--zone", ".")
			ctl, err := r.santad.startController(ctx, "dns", "top", append(args, r.cfg.ControllerArgs...)...)
			r.step(fmt.Sprintf("santa dns top --count %d (ready)", c.N), t0, err)
			if err != nil {
				return fail(err)
			}
			r.ctl, r.ctlN = ctl, c.N
		}
		// Everything of Santa's runs on the server CPU while measuring.
		if err := pinSanta(r.santad, r.ctl, r.cfg.Placement.ServerCPU); err != nil {
			return fail(err)
		}
	}
	return r.h.runCase(ctx, dc)
}

func (r *dnsRun) startSantad() error {
	if r.santad != nil {
		return nil
	}
	t0 := time.Now()
	rules := r.maxN
	if r.cfg.BindPort {
		rules *= 2 // IPv4 and IPv6 socket
	}
	s, err := startSantad(r.tb, r.cfg.Bin, r.tmp, rules, r.cfg.Logf)
	r.step("start santad", t0, err)
	if err != nil {
		return err
	}
	r.santad = s
	return nil
}

// bindArgs say which server socket santa binds: every socket on port 53,
// or the IPv4 socket the queries go to by its holder's pid and fd number.
func (r *dnsRun) bindArgs() ([]string, error) {
	if r.cfg.BindPort {
		return []string{"--port", "53/udp"}, nil
	}
	pids, err := r.server.PIDs()
	if err != nil {
		return nil, err
	}
	v4, _ := r.server.Addrs()
	pid, fd, err := socketFD(pids, v4)
	if err != nil {
		return nil, err
	}
	return []string{"--pid", fmt.Sprint(pid), "--fd", fmt.Sprint(fd)}, nil
}

func (r *dnsRun) stopSantad() {
	r.stopController()
	if r.santad == nil {
		return
	}
	t0 := time.Now()
	err := r.santad.stop()
	r.step("stop santad, santad cleanup", t0, err)
	r.santad = nil
}

func (r *dnsRun) stopController() {
	if r.ctl == nil {
		return
	}
	// Install the next rule set at full speed: santad may use every CPU
	// again while the controller deletes its rules and the next one adds.
	pinSanta(r.santad, r.ctl, -1)
	t0 := time.Now()
	err := r.ctl.stop()
	r.step(fmt.Sprintf("stop santa dns top --count %d (deletes its rules)", r.ctlN), t0, err)
	r.ctl, r.ctlN = nil, 0
}

// dnsCase is a DNS case for the harness; the run sets up and tears down
// what it shares with other cases (santad, the controller).
type dnsCase struct {
	c   DNSCase
	run *dnsRun
}

func (d *dnsCase) Name() string        { return d.c.Name }
func (d *dnsCase) Description() string { return d.c.Description() }
func (d *dnsCase) Setup(*Env) error    { return nil }
func (d *dnsCase) Teardown() error     { return nil }

// SharedXDP: santad's program stays attached for the next case.
func (d *dnsCase) SharedXDP() bool { return d.c.Santa == "attached" || d.c.Santa == "top" }

func (d *dnsCase) Queries(*Env) []Query {
	if d.c.Mix == "zipf" {
		return d.run.mix
	}
	n := min(d.c.N, len(d.run.names))
	perm := dnsnames.Permutation(n, d.run.cfg.Seed)
	qs := make([]Query, n)
	for i, p := range perm {
		qs[i] = Query{Name: d.run.names[p], Type: "A"}
	}
	return qs
}

// Rates: the kernel server answers most queries of the cases without
// Santa, with Santa but no rules, and with few names offloaded.
func (d *dnsCase) Rates() []int {
	if d.c.Santa == "" || d.c.Santa == "attached" {
		return d.run.cfg.ServerRates
	}
	return d.run.cfg.Rates
}

func (d *dnsCase) ServerPIDs() []int {
	var pids []int
	if d.run.santad != nil && d.SharedXDP() {
		pids = append(pids, d.run.santad.sd.PID())
	}
	if d.run.ctl != nil && d.c.Santa == "top" {
		pids = append(pids, d.run.ctl.PID())
	}
	return pids
}

// Answered is santad's count of requests the rule processor answered.
func (d *dnsCase) Answered() (uint64, error) {
	if d.run.santad == nil || !d.SharedXDP() {
		return 0, nil
	}
	return d.run.santad.answered()
}

// dnsReflector is the bare reflector with the DNS case's queries and rates.
type dnsReflector struct {
	Reflector
	*dnsCase
}

func (d *dnsReflector) Name() string              { return d.dnsCase.Name() }
func (d *dnsReflector) Description() string       { return d.dnsCase.Description() }
func (d *dnsReflector) Setup(env *Env) error      { return d.Reflector.Setup(env) }
func (d *dnsReflector) Teardown() error           { return d.Reflector.Teardown() }
func (d *dnsReflector) SharedXDP() bool           { return false }
func (d *dnsReflector) LatencyProbe() bool        { return false }
func (d *dnsReflector) ServerPIDs() []int         { return nil }
func (d *dnsReflector) Answered() (uint64, error) { return 0, nil }

// removeStalePins removes santad pin directories of earlier runs whose
// process is gone (a run killed before its cleanup).
func removeStalePins(logf func(string, ...any)) {
	dirs, _ := filepath.Glob(santadPinPrefix + "santa-*")
	for _, d := range dirs {
		var pid, n int
		if _, err := fmt.Sscanf(d, santadPinPrefix+"santa-%d-%d", &pid, &n); err != nil {
			continue
		}
		if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err == nil {
			continue
		}
		if err := os.RemoveAll(d); err != nil {
			logf("warning: removing stale pins %s: %v", d, err)
		} else {
			logf("removed stale pins %s", d)
		}
	}
}
