//go:build linux

package bench

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// Targets of the DNS benchmark.
const (
	// TargetFullVsReflector: with every name offloaded, server CPU per
	// reply within this factor of the bare reflector's.
	TargetFullVsReflector = 1.15
	// TargetFullVsNSD: … which is at least this many times NSD's replies
	// per server core.
	TargetFullVsNSD = 5.3
	// TargetZipf10k: the Zipf mix with the top 10 k names offloaded gives
	// at least this many times the server's replies/s alone.
	TargetZipf10k = 2.0
)

// LoadDNSReport reads a report written by WriteFiles (the .json file).
func LoadDNSReport(path string) (*DNSReport, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	r := &DNSReport{}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return r, nil
}

// WriteFiles writes <dir>/<stem>.json, <stem>.csv and, with gnuplot, the
// plots <stem>-a.png (servers alone and with Santa attached),
// <stem>-b.png (every name offloaded), <stem>-c.png (Zipf mix) and
// <stem>-summary.png, each with its .gp script. It returns the paths
// written and warnings (e.g. no gnuplot).
func (r *DNSReport) WriteFiles(dir, stem string) ([]string, []string, error) {
	return writeFiles(dir, stem, r, r.writeCSV, r.plots(stem))
}

// writeFiles writes a report as <dir>/<stem>.json, its CSV (by writeCSV)
// as <stem>.csv and, with gnuplot, its plots. It returns the paths written
// and warnings (e.g. no gnuplot).
func writeFiles(dir, stem string, report any, writeCSV func(path string) error, plots []plotSpec) ([]string, []string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, nil, err
	}
	j, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return nil, nil, err
	}
	p := filepath.Join(dir, stem+".json")
	if err := os.WriteFile(p, append(j, '\n'), 0o644); err != nil {
		return nil, nil, err
	}
	written := []string{p}
	p = filepath.Join(dir, stem+".csv")
	if err := writeCSV(p); err != nil {
		return written, nil, err
	}
	written = append(written, p)
	var warns []string
	for _, pl := range plots {
		w, warn, err := plot(dir, pl.stem, pl.script)
		written = append(written, w...)
		if err != nil {
			return written, warns, err
		}
		if warn != "" {
			warns = append(warns, warn)
			if strings.Contains(warn, "not installed") {
				break
			}
		}
	}
	return written, warns, nil
}

// plotSpec is one figure of a report: <stem>.gp and the .png it draws.
type plotSpec struct{ stem, title, script string }

// plots are the report's figures: three sweeps and a summary.
func (r *DNSReport) plots(stem string) []plotSpec {
	var out []plotSpec
	exps := []struct{ exp, title string }{
		{ExpAlone, "DNS (a): servers alone and with Santa attached, no rules"},
		{ExpFull, "DNS (b): every name offloaded (NSD)"},
		{ExpZipf, fmt.Sprintf("DNS (c): Zipf mix over %s names, top n offloaded", strings.ToUpper(human(r.Names)))},
	}
	for _, e := range exps {
		cases := r.casesOf(e.exp)
		if e.exp != ExpAlone { // the server alone for reference
			if c := r.Case(r.baseline(e.exp)); c != nil {
				cases = append([]CaseResult{*c}, cases...)
			}
		}
		if len(cases) == 0 {
			continue
		}
		s := fmt.Sprintf("%s-%s", stem, e.exp)
		title := fmt.Sprintf("%s (kxdpgun, median of %d)", e.title, r.Reps)
		out = append(out, plotSpec{s, e.title, sweepPlot(s+".png", title, "benchdns", r.Started, cases, 0)})
	}
	if s := r.summaryPlot(stem + "-summary"); s != "" {
		out = append(out, plotSpec{stem + "-summary", "summary", s})
	}
	return out
}

// baseline is the server-alone case an experiment's cases compare with.
func (r *DNSReport) baseline(exp string) string {
	for _, c := range r.Cases {
		if m, ok := r.Meta[c.Name]; ok && m.Santa == "" && (exp == ExpAlone || m.Server == "nsd") {
			return c.Name
		}
	}
	return "nsd"
}

// casesOf returns the cases of an experiment in run order; (c) includes
// the n = 0 cases ("attached", experiment a) of the servers it measures.
func (r *DNSReport) casesOf(exp string) []CaseResult {
	var out []CaseResult
	servers := map[string]bool{}
	for _, c := range r.Cases {
		if m := r.Meta[c.Name]; m.Experiment == ExpZipf {
			servers[m.Server] = true
		}
	}
	for _, c := range r.Cases {
		m, ok := r.Meta[c.Name]
		if !ok {
			continue
		}
		if m.Experiment == exp || (exp == ExpZipf && m.Santa == "attached" && servers[m.Server]) {
			out = append(out, c)
		}
	}
	return out
}

// aloneOf is the case of the same server without Santa ("" if none).
func (r *DNSReport) aloneOf(name string) *CaseResult {
	m, ok := r.Meta[name]
	if !ok {
		return nil
	}
	for i := range r.Cases {
		if o := r.Meta[r.Cases[i].Name]; o.Server == m.Server && o.Santa == "" && o.Name != "" {
			return &r.Cases[i]
		}
	}
	return nil
}

func satMedian(c *CaseResult) (Sample, bool) {
	if c == nil || c.Sat() == nil {
		return Sample{}, false
	}
	return c.Sat().Median, true
}

func (r *DNSReport) summaryPlot(stem string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "# Generated by bench/cmd/benchdns (%s). Run: gnuplot %s.gp\n", r.Started.Format(time.RFC3339), stem)
	// (b): server µs per reply against the number of rules.
	var full strings.Builder
	for _, c := range r.casesOf(ExpFull) {
		m := r.Meta[c.Name]
		if s, ok := satMedian(&c); ok && m.Santa == "top" {
			fmt.Fprintf(&full, "%d %.3f %.0f\n", m.N, s.UsPerReply, s.RepliesPPS)
		}
	}
	ref, _ := satMedian(r.Case(CaseReflector))
	nsd, _ := satMedian(r.Case("nsd"))
	// (c): replies/s and latency against n, one block per server.
	var zipf strings.Builder
	var zservers []string
	lr := commonRate(r.casesOf(ExpZipf))
	for _, srv := range []string{"nsd", "knot", "bind"} {
		any := false
		for _, c := range r.casesOf(ExpZipf) {
			m := r.Meta[c.Name]
			if m.Server != srv {
				continue
			}
			if s, ok := satMedian(&c); ok {
				x := 0.0 // n = 0 at the left edge of the log axis
				if m.N > 0 {
					x = math.Log10(float64(m.N))
				}
				var l Sample
				for _, p := range c.Points {
					if p.OfferedQPS == lr {
						l = p.Median
					}
				}
				fmt.Fprintf(&zipf, "%g %.0f %.1f %.1f \"%s\"\n", x, s.RepliesPPS, l.LatP50Us, l.LatP99Us, human(m.N))
				any = true
			}
		}
		if any {
			zipf.WriteString("\n\n")
			zservers = append(zservers, srv)
		}
	}
	if full.Len() == 0 && zipf.Len() == 0 {
		return ""
	}
	fmt.Fprintf(&b, "$full << EOD\n%sEOD\n$zipf << EOD\n%sEOD\n", full.String(), zipf.String())
	fmt.Fprintf(&b, `set terminal pngcairo size 1500,500 noenhanced font ",11"
set output "%s.png"
set multiplot layout 1,3
set grid
set key top left
set title "(b) every name offloaded (NSD): server CPU per reply"
set logscale x
set xlabel "rules (names offloaded)"
set ylabel "server CPU µs per reply (at saturation)"
set format x "%%.0s%%c"
set yrange [0:*]
`, stem)
	var pl []string
	if full.Len() > 0 {
		pl = append(pl, `$full using 1:2 title "Santa (santa dns top)" with linespoints linewidth 2`)
	}
	if ref.UsPerReply > 0 {
		pl = append(pl, fmt.Sprintf(`%.3f title "bare reflector" with lines dashtype 2`, ref.UsPerReply),
			fmt.Sprintf(`%.3f title "1.15 × reflector (target)" with lines dashtype 3`, TargetFullVsReflector*ref.UsPerReply))
	}
	if nsd.UsPerReply > 0 {
		pl = append(pl, fmt.Sprintf(`%.3f title "NSD alone" with lines dashtype 4`, nsd.UsPerReply))
	}
	if len(pl) > 0 {
		fmt.Fprintf(&b, "plot [0.5:2e6] %s\n", strings.Join(pl, ", \\\n     "))
	} else {
		b.WriteString("plot [0.5:2e6] 0 notitle\n")
	}
	b.WriteString(`unset logscale x
set title "(c) Zipf mix: replies/s at saturation, top n offloaded"
set xlabel "n offloaded (log; leftmost: n = 0)"
set ylabel "replies/s"
set format x "%g"
set xtics ("0" 0, "100" 2, "1k" 3, "10k" 4, "100k" 5, "1M" 6)
set format y "%.1s%c"
set xrange [-0.3:6.3]
`)
	var zp, lp []string
	for i, srv := range zservers {
		zp = append(zp, fmt.Sprintf(`$zipf index %d using 1:2 title "%s" with linespoints linewidth 2 linecolor %d`, i, srv, i+1))
		lp = append(lp, fmt.Sprintf(`$zipf index %d using 1:3 title "%s p50" with linespoints linewidth 2 linecolor %d`, i, srv, i+1),
			fmt.Sprintf(`$zipf index %d using 1:4 title "%s p99" with linespoints dashtype 2 linecolor %d`, i, srv, i+1))
	}
	if len(zp) == 0 {
		zp, lp = []string{"0 notitle"}, []string{"1 notitle"}
	}
	fmt.Fprintf(&b, "plot %s\n", strings.Join(zp, ", \\\n     "))
	fmt.Fprintf(&b, "set title \"(c) Zipf mix: prober latency at %s queries/s offered\"\n", si(float64(lr)))
	b.WriteString(`
set ylabel "round-trip time, µs"
set logscale y
set format y "%g"
set yrange [*:*]
`)
	fmt.Fprintf(&b, "plot %s\nunset multiplot\n", strings.Join(lp, ", \\\n     "))
	return b.String()
}

// Markdown renders the "## DNS" section of docs/benchmarks.md.
func (r *DNSReport) Markdown(stem string) string {
	var b strings.Builder
	h := r.Host
	named, _, _ := strings.Cut(h["named"], " <id:") // named -v: "BIND 9.18… <id:>"
	b.WriteString("## DNS\n\n")
	b.WriteString("<!-- Generated by `go run ./bench/cmd/benchdns` (make bench-dns); rerun it instead of editing. -->\n\n")
	fmt.Fprintf(&b, "Measured %s on %s (%s CPUs), kernel %s, Debian %s; %s, %s, %s, %s. The run took %s.\n",
		r.Started.Format("2006-01-02 15:04 MST"), orDash(h["cpu_model"]), orDash(h["cpus"]), orDash(h["kernel"]),
		orDash(h["debian"]), orDash(h["kxdpgun"]), orDash(h["nsd"]), orDash(h["knotd"]), orDash(named),
		r.Finished.Sub(r.Started).Round(time.Second))
	if r.Quick {
		b.WriteString("\n**Quick run** (`-quick`): few names, one repetition, few rates; indicative only.\n")
	}
	fmt.Fprintf(&b, "\n**Reproduce:** `make bench-dns` (= `go run ./bench/cmd/benchdns`, as root). This run: `%s`.\n", r.Command)
	fmt.Fprintf(&b, `
**Method.** The UDP benchmark's testbed, placement and measurement (see "UDP" above):
two network namespaces joined by a veth pair; everything on the server side (the DNS
server, the server veth's threaded-NAPI kthread, santad and `+"`santa dns`"+`) pinned to
CPU%d, the generator, the latency prober and this harness on CPU%d. **Generator:**
kxdpgun (AF_XDP, one thread, open loop: it sends a batch of %d, drains the replies that
have arrived with a non-blocking poll(), then sleeps (usleep) until the next batch is
due, never waiting for a reply; after the traffic it keeps receiving for 1 s), type A
queries without flags or EDNS, the same form for every case. Each point
runs %.0f s, %d repetitions, medians reported; the offered rate is swept (%s q/s for
the cases the kernel server answers, %s q/s for the others) and a case's sweep stops
once %d consecutive rates answered less than 98 %% of its best. A case is reported at
its **saturation point** (the rate with the most replies/s) and at its **knee** (the
highest rate with ≥ 95 %% answered). **Server CPU per reply** is the server CPU's busy
time (wall − idle − iowait − steal) over the window in which frames moved, divided by
all replies (kxdpgun's and the prober's); "threads" is the same from the exact run time
of the server's threads, the server NAPI kthread, santad and the controller, a
cross-check that nothing else ran there ("santad + ctl" is santad's and the
controller's part of it: miss samples, SOA polls). **BPF ns/packet** is run_time_ns / run_cnt of
the program on the server veth; `+bpfStatsNote+` **Answered in XDP** is santad's count of answered
requests over the point divided by all replies.

**Latency.** kxdpgun measures none, so during every measured point a light prober sends
%d queries/s (open loop, one UDP socket in the client namespace bound to port %d, below
kxdpgun's source ports so that its XDP program leaves the replies to the kernel; bounded
to %d queries and 1 s of waiting) drawn from the case's own query mix in kxdpgun's query
form, from 0.3 s after kxdpgun's traffic started until 0.5 s before it ends, and records
each round-trip time (Go timestamps around the socket calls). The prober shares CPU%d
with the generator, which is busy at high rates: its figures include queueing on the
client side as well as in the server, and compare cases with each other, not with a
real network.

**Zone and names.** %d realistic names (`+"`dnsnames.TopListNames`"+`, seed %d: the shape of
public top lists) in one root zone (`+"`testbed.NamesZone`"+`, one A record per name, TTL %d s so
that no rule is refreshed during the run). Each server answers from its own copy of that
zone with one UDP worker (NSD server-count 1 with rate limiting off, Knot udp-workers 1,
BIND -n 1 -U 1). The **Zipf mix** is %d queries drawn with weight 1/rank^%g
(`+"`dnsnames.ZipfQueries`"+`, counts apportioned exactly, shuffled) over all %d names. (b)
queries the N offloaded names uniformly (each once per round, random order) and serves
them from the same full zone as (c): the replies to those names are the same as from
a zone of only N names.
`, r.ServerCPU, r.ClientCPU, r.Batch, r.Duration, r.Reps, rateList(r.ServerRates), rateList(r.Rates), r.StopAfter,
		r.ProbeRate, DefaultProbePort, maxProbes, r.ClientCPU,
		r.Names, r.Seed, r.TTL, r.MixQueries, r.ZipfS, r.Names)
	bindArg, rulesPer := "--pid PID --fd FD", "one rule per name on the server's IPv4 socket (the one every query goes to, named by the server's pid and the socket's fd number)"
	if r.BindPort {
		bindArg, rulesPer = "--port 53/udp", "one rule per name on each of the server's sockets (IPv4 and IPv6: 2N rules in santad)"
	}
	learning := "miss-sample shape learning on, its default: santad forwards up to 5000 sampled misses per second and CPU to it, which shows in the \"santad + ctl\" column"
	if slices.Contains(r.CtlArgs, "--learn-shapes=false") {
		learning = "miss-sample shape learning off"
	}
	dnsArg := bindArg
	if len(r.CtlArgs) > 0 {
		dnsArg += " " + strings.Join(r.CtlArgs, " ")
	}
	fmt.Fprintf(&b, `
**Santa.** santad (built from the working tree) attached to the server veth in native XDP;
`+"`santa attach %[3]s`"+` binds the server's socket without rules (n = 0);
`+"`santa dns top %[1]s --queries RANKS --count N --shape plain --zone .`"+` asks the
server for the answers of the N most popular names (RANKS lists all names by rank) and
installs their rules through santad, %[2]s, then keeps running (SOA polling every
second, %[4]s) until it is stopped; it deletes its rules when it stops. One controller serves every case with the same N (the (b) and (c) cases of that
N). Installing and deleting rules is not measured as load; the times are listed below.
`, dnsArg, rulesPer, bindArg, learning)

	b.WriteString("\nReference figures on this kind of testbed before the project (shared/notes/kernel-findings.md): NSD 4.8 µs per reply, Knot 4.7, BIND 6.9, bare XDP reflector 0.79 µs (47 ns of it BPF). Expect ±10 % between runs.\n")

	r.tableA(&b)
	r.tableB(&b)
	r.tableC(&b)
	r.targetTable(&b)

	b.WriteString("\n### All cases at saturation\n\n")
	r.caseTable(&b, (*CaseResult).Sat)
	b.WriteString("\n### All cases at the knee (the highest offered rate with ≥ 95 % answered)\n\n")
	r.caseTable(&b, (*CaseResult).KneePoint)
	b.WriteString(`
Columns: **replies/s** counted by kxdpgun; **server CPU** busy share of the server CPU;
**µs / reply** server CPU per reply (median of the repetitions, min–max); **threads** the
same from the server-side threads' run time; **BPF ns** per packet of the program on the
server veth; **XDP** share of replies answered by Santa's rules; **p50 / p99** prober
round-trip times; **× alone** replies/s relative to the same server alone at the same
kind of point. † marks a point where others' work on the server CPU or the hypervisor's steal could not be avoided.
`)

	b.WriteString("\n### Sweeps: replies/s by offered rate (medians)\n")
	for _, e := range []struct{ exp, title string }{{ExpAlone, "(a)"}, {ExpFull, "(b)"}, {ExpZipf, "(c)"}} {
		cases := r.casesOf(e.exp)
		if len(cases) == 0 {
			continue
		}
		fmt.Fprintf(&b, "\n%s\n\n", e.title)
		sweepTable(&b, cases)
	}
	b.WriteString("\nCells: replies/s of queries/s actually sent (server CPU µs per reply); — not measured (the sweep stopped past saturation, or another rate list).\n")

	b.WriteString("\n### Cases\n\n")
	for _, c := range r.Cases {
		fmt.Fprintf(&b, "* `%s`: %s (%d distinct queries in kxdpgun's file).", c.Name, r.Meta[c.Name].Description(), c.Queries)
		writeRepeats(&b, c)
		if c.Error != "" {
			fmt.Fprintf(&b, " **Failed:** %s", strings.ReplaceAll(c.Error, "\n", " "))
		}
		b.WriteString("\n")
	}

	if len(r.Setup) > 0 {
		b.WriteString("\n### Setup times\n\n| step | s |\n|---|---:|\n")
		for _, s := range r.Setup {
			e := ""
			if s.Error != "" {
				e = " (failed)"
			}
			fmt.Fprintf(&b, "| %s%s | %.1f |\n", s.What, e, s.Seconds)
		}
	}

	fmt.Fprintf(&b, "\nRaw data: [docs/bench/%s.json](bench/%s.json), [docs/bench/%s.csv](bench/%s.csv).", stem, stem, stem, stem)
	if _, err := exec.LookPath("gnuplot"); err == nil {
		var imgs []string
		for _, p := range r.plots(stem) {
			fmt.Fprintf(&b, " Plot [%s.png](bench/%s.png) (script %s.gp).", p.stem, p.stem, p.stem)
			imgs = append(imgs, fmt.Sprintf("![%s](bench/%s.png)", p.title, p.stem))
		}
		b.WriteString("\n\n" + strings.Join(imgs, "\n\n") + "\n")
	} else {
		b.WriteString("\n")
	}
	return b.String()
}

func rateList(rs []int) string {
	var s []string
	for _, q := range rs {
		s = append(s, si(float64(q)))
	}
	return strings.Join(s, ", ")
}

func lat(s Sample) string {
	if s.ProbeSent == 0 {
		return "—"
	}
	loss := ""
	if s.ProbeAnswered < s.ProbeSent*199/200 {
		loss = fmt.Sprintf(" (%.0f %% lost)", 100*float64(s.ProbeSent-s.ProbeAnswered)/float64(s.ProbeSent))
	}
	return fmt.Sprintf("%.0f / %.0f%s", s.LatP50Us, s.LatP99Us, loss)
}

func bpf(s Sample) string {
	if s.ProgID == 0 {
		return "—"
	}
	return fmt.Sprintf("%.0f", s.BPFNsPerRun)
}

func xdpShare(s Sample, m DNSCase) string {
	switch m.Santa {
	case "", "reflector":
		return "—"
	}
	return fmt.Sprintf("%.0f %%", 100*s.XDPShare)
}

func times(a, b float64) string {
	if a <= 0 || b <= 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", a/b)
}

func (r *DNSReport) tableA(b *strings.Builder) {
	var rows []string
	for _, c := range r.Cases {
		m := r.Meta[c.Name]
		if m.Experiment != ExpAlone || m.Santa != "" {
			continue
		}
		alone, ok1 := satMedian(r.Case(c.Name))
		att, ok2 := satMedian(r.Case(m.Server + "-zipf-0"))
		if !ok1 {
			continue
		}
		row := fmt.Sprintf("| %s | %s | %.2f | %s |", m.Server, si(alone.RepliesPPS), alone.UsPerReply, lat(alone))
		if ok2 {
			row += fmt.Sprintf(" %s | %.2f | %s | %s | %s | %s |", si(att.RepliesPPS), att.UsPerReply, bpf(att), lat(att),
				times(att.RepliesPPS, alone.RepliesPPS), times(att.UsPerReply, alone.UsPerReply))
		} else {
			row += " — | — | — | — | — | — |"
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n### (a) Each server alone, and with Santa attached but no rules\n\n")
	b.WriteString("One UDP worker pinned to the server CPU; the Zipf mix (all of it reaches the server). At saturation.\n\n")
	b.WriteString("| server | alone: replies/s | µs / reply | p50 / p99 µs | Santa attached: replies/s | µs / reply | BPF ns / packet | p50 / p99 µs | replies/s attached ÷ alone | µs / reply attached ÷ alone |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
}

func (r *DNSReport) tableB(b *strings.Builder) {
	cases := r.casesOf(ExpFull)
	if len(cases) == 0 {
		return
	}
	nsd, _ := satMedian(r.Case("nsd"))
	ref, _ := satMedian(r.Case(CaseReflector))
	b.WriteString("\n### (b) Every name offloaded (NSD)\n\n")
	b.WriteString("Queries: the N offloaded names, uniformly. At saturation; the knee (≥ 95 % answered) in the last columns.\n\n")
	b.WriteString("| case | rules | replies/s | × NSD alone | answered in XDP | server µs / reply (min–max) | × reflector | replies per core ÷ NSD's | BPF ns / packet | p50 / p99 µs | knee: replies/s | knee: µs / reply | knee: p50 / p99 µs |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	if c := r.Case("nsd"); c != nil && c.Sat() != nil {
		k := ""
		if kp := c.KneePoint(); kp != nil {
			k = fmt.Sprintf("%s | %.2f | %s", si(kp.Median.RepliesPPS), kp.Median.UsPerReply, lat(kp.Median))
		} else {
			k = "— | — | —"
		}
		fmt.Fprintf(b, "| nsd (alone, Zipf mix) | 0 | %s | 1.00× | — | %.2f (%.2f–%.2f) | %s | 1.00× | — | %s | %s |\n",
			si(nsd.RepliesPPS), nsd.UsPerReply, c.Sat().MinUs, c.Sat().MaxUs, times(nsd.UsPerReply, ref.UsPerReply), lat(nsd), k)
	}
	for _, c := range cases {
		m := r.Meta[c.Name]
		sp := c.Sat()
		if sp == nil {
			fmt.Fprintf(b, "| %s | %s | — | — | — | — | — | — | — | — | — | — | — |\n", c.Name, rulesOf(m))
			continue
		}
		s := sp.Median
		k := "— | — | —"
		if kp := c.KneePoint(); kp != nil {
			k = fmt.Sprintf("%s | %.2f | %s", si(kp.Median.RepliesPPS), kp.Median.UsPerReply, lat(kp.Median))
		}
		dag := ""
		if s.Disturbed {
			dag = " †"
		}
		fmt.Fprintf(b, "| %s | %s | %s | %s | %s | %.2f (%.2f–%.2f)%s | %s | %s | %s | %s | %s |\n",
			c.Name, rulesOf(m), si(s.RepliesPPS), times(s.RepliesPPS, nsd.RepliesPPS), xdpShare(s, m),
			s.UsPerReply, sp.MinUs, sp.MaxUs, dag, times(s.UsPerReply, ref.UsPerReply), times(nsd.UsPerReply, s.UsPerReply),
			bpf(s), lat(s), k)
	}
	b.WriteString("\n")
	if r.BindPort {
		b.WriteString("\"rules\" counts names; santad holds two rules per name (IPv4 and IPv6 socket). ")
	}
	b.WriteString("\"replies per core ÷ NSD's\" is NSD's µs per reply divided by the case's.\n")
}

// commonRate is the offered rate at which latencies are compared: 200 k
// q/s (about one server's capacity) if every case measured it, else the
// lowest rate they all measured (0 if none).
func commonRate(cases []CaseResult) int {
	count := map[int]int{}
	for _, c := range cases {
		for _, p := range c.Points {
			count[p.OfferedQPS]++
		}
	}
	if count[200_000] == len(cases) {
		return 200_000
	}
	best := 0
	for q, n := range count {
		if n == len(cases) && (best == 0 || q < best) {
			best = q
		}
	}
	return best
}

// latAt is the prober's latency of c at offered rate q.
func latAt(c *CaseResult, q int) string {
	if c == nil {
		return "—"
	}
	for _, p := range c.Points {
		if p.OfferedQPS == q {
			return lat(p.Median)
		}
	}
	return "—"
}

// names is "1 name", "10k names".
func names(n int) string {
	if n == 1 {
		return "1 name"
	}
	return human(n) + " names"
}

func rulesOf(m DNSCase) string {
	if m.Santa == "reflector" {
		return "— (reflector)"
	}
	return human(m.N)
}

func (r *DNSReport) tableC(b *strings.Builder) {
	cases := r.casesOf(ExpZipf)
	if len(cases) == 0 {
		return
	}
	lr := commonRate(cases)
	b.WriteString("\n### (c) Zipf mix over all names, the top n offloaded\n\n")
	lrs := "—"
	if lr > 0 {
		lrs = si(float64(lr))
	}
	fmt.Fprintf(b, "Zipf s = %g over %d names; `santa dns top --count n`. At saturation; the last column at the same offered load for all (%s q/s).\n\n", r.ZipfS, r.Names, lrs)
	fmt.Fprintf(b, "| server | n | Zipf share of the top n | answered in XDP | replies/s | × server alone | server µs / reply | BPF ns / packet | p50 / p99 µs | at %s q/s: p50 / p99 µs |\n", lrs)
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	last := ""
	for _, c := range cases {
		m := r.Meta[c.Name]
		if m.Server != last {
			last = m.Server
			if a := r.Case(m.Server); a != nil {
				if s, ok := satMedian(a); ok {
					fmt.Fprintf(b, "| %s alone | — | — | — | %s | 1.00× | %.2f | — | %s | %s |\n", m.Server, si(s.RepliesPPS), s.UsPerReply, lat(s), latAt(a, lr))
				}
			}
		}
		s, ok := satMedian(&c)
		if !ok {
			fmt.Fprintf(b, "| %s | %s | %.0f %% | — | — | — | — | — | — | — |\n", m.Server, human(m.N), 100*m.ZipfShare)
			continue
		}
		alone, _ := satMedian(r.aloneOf(c.Name))
		fmt.Fprintf(b, "| %s | %s | %.0f %% | %s | %s | %s | %.2f | %s | %s | %s |\n",
			m.Server, human(m.N), 100*m.ZipfShare, xdpShare(s, m), si(s.RepliesPPS), times(s.RepliesPPS, alone.RepliesPPS),
			s.UsPerReply, bpf(s), lat(s), latAt(&c, lr))
	}
}

func (r *DNSReport) targetTable(b *strings.Builder) {
	var rows []string
	verdict := func(ok bool) string {
		if ok {
			return "met"
		}
		return "**not met**"
	}
	med := func(c *CaseResult, pick func(*CaseResult) *Point) (Sample, bool) {
		if c == nil || pick(c) == nil {
			return Sample{}, false
		}
		return pick(c).Median, true
	}
	picks := []struct {
		name string
		pick func(*CaseResult) *Point
	}{{"saturation", (*CaseResult).Sat}, {"knee", (*CaseResult).KneePoint}}
	for _, c := range r.casesOf(ExpFull) {
		m := r.Meta[c.Name]
		if m.Santa != "top" {
			continue
		}
		for _, p := range picks {
			s, ok := med(&c, p.pick)
			ref, okRef := med(r.Case(CaseReflector), p.pick)
			if ok && okRef && ref.UsPerReply > 0 {
				x := s.UsPerReply / ref.UsPerReply
				rows = append(rows, fmt.Sprintf("| every name offloaded, %s: server CPU per reply vs bare reflector | %s | %.2f× (%.2f / %.2f µs) | ≤ %.2f× | %s |",
					names(m.N), p.name, x, s.UsPerReply, ref.UsPerReply, TargetFullVsReflector, verdict(x <= TargetFullVsReflector)))
			}
		}
		for _, p := range picks {
			s, ok := med(&c, p.pick)
			nsd, okNSD := med(r.Case("nsd"), p.pick)
			if ok && okNSD && s.UsPerReply > 0 {
				x := nsd.UsPerReply / s.UsPerReply
				rows = append(rows, fmt.Sprintf("| every name offloaded, %s: replies per server core vs NSD | %s | %.2f× (%.2f / %.2f µs) | ≥ %.1f× | %s |",
					names(m.N), p.name, x, nsd.UsPerReply, s.UsPerReply, TargetFullVsNSD, verdict(x >= TargetFullVsNSD)))
			}
		}
	}
	for _, c := range r.casesOf(ExpZipf) {
		m := r.Meta[c.Name]
		if m.N != 10_000 {
			continue
		}
		s, ok1 := satMedian(&c)
		a, ok2 := satMedian(r.aloneOf(c.Name))
		if !ok1 || !ok2 || a.RepliesPPS <= 0 {
			continue
		}
		x := s.RepliesPPS / a.RepliesPPS
		rows = append(rows, fmt.Sprintf("| Zipf mix, top 10k offloaded (%s): replies/s vs %s alone | saturation | %.2f× (%s / %s) | ≥ %.1f× | %s |",
			m.Server, m.Server, x, si(s.RepliesPPS), si(a.RepliesPPS), TargetZipf10k, verdict(x >= TargetZipf10k)))
	}
	if len(rows) == 0 {
		return
	}
	b.WriteString("\n### Targets\n\nRatios of medians, at the saturation point and at the knee of each case.\n\n| target | at | measured | limit | |\n|---|---|---:|---:|---|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n")
}

func (r *DNSReport) caseTable(b *strings.Builder, pick func(*CaseResult) *Point) {
	b.WriteString("| case | offered q/s | replies/s | answered | server CPU | µs / reply (min–max) | threads µs / reply | santad + ctl µs / reply | BPF ns / packet | XDP | p50 / p99 µs | × alone |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	for i := range r.Cases {
		c := &r.Cases[i]
		m := r.Meta[c.Name]
		p := pick(c)
		if p == nil {
			fmt.Fprintf(b, "| %s | — | — | — | — | — | — | — | — | — | — | — |\n", c.Name)
			continue
		}
		s := p.Median
		extra := "—"
		if all := s.Replies + uint64(s.ProbeAnswered); all > 0 && (m.Santa == "attached" || m.Santa == "top") {
			extra = fmt.Sprintf("%.2f", 1e6*s.ExtraSec/float64(all))
		}
		dag := ""
		if s.Disturbed {
			dag = " †"
		}
		var base float64
		if a := r.aloneOf(c.Name); a != nil && pick(a) != nil {
			base = pick(a).Median.RepliesPPS
		}
		if m.Santa == "reflector" {
			if a := r.Case("nsd"); a != nil && pick(a) != nil {
				base = pick(a).Median.RepliesPPS
			}
		}
		fmt.Fprintf(b, "| %s | %s | %s | %.0f %% | %.0f %% | %.2f (%.2f–%.2f)%s | %.2f | %s | %s | %s | %s | %s |\n",
			c.Name, si(float64(p.OfferedQPS)), si(s.RepliesPPS), 100*ratio(s.Replies, s.Sent), 100*s.ServerUtil,
			s.UsPerReply, p.MinUs, p.MaxUs, dag, s.UsPerReplyThreads, extra, bpf(s), xdpShare(s, m), lat(s), times(s.RepliesPPS, base))
	}
}

// sweepTable renders replies/s by offered rate, one column per case.
func sweepTable(b *strings.Builder, cases []CaseResult) {
	var rates []int
	seen := map[int]bool{}
	for _, c := range cases {
		for _, p := range c.Points {
			if !seen[p.OfferedQPS] {
				seen[p.OfferedQPS] = true
				rates = append(rates, p.OfferedQPS)
			}
		}
	}
	slices.Sort(rates)
	b.WriteString("| offered q/s |")
	for _, c := range cases {
		fmt.Fprintf(b, " %s |", c.Name)
	}
	b.WriteString("\n|---:|")
	for range cases {
		b.WriteString("---:|")
	}
	b.WriteString("\n")
	for _, q := range rates {
		fmt.Fprintf(b, "| %s |", si(float64(q)))
		for _, c := range cases {
			cell := "—"
			for _, p := range c.Points {
				if p.OfferedQPS == q {
					cell = fmt.Sprintf("%s of %s (%.2f µs)", si(p.Median.RepliesPPS), si(p.Median.SentPPS), p.Median.UsPerReply)
					if p.Median.Disturbed {
						cell += " †"
					}
				}
			}
			fmt.Fprintf(b, " %s |", cell)
		}
		b.WriteString("\n")
	}
}
