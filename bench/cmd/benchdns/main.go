//go:build linux

// Command benchdns is `make bench-dns`: the DNS experiments on the namespace
// testbed, side by side in one run. It builds santad and santa from the
// working tree, then measures (a) NSD, Knot and BIND alone and with Santa
// attached but no rules, (b) NSD with every name offloaded for 1 … 1 M
// names, with the bare XDP reflector as the testbed's limit, and (c) a Zipf
// query mix over 1 M names with the top n offloaded by `santa dns top`. It
// writes docs/benchmarks.md (section "DNS") and raw results and plots under
// docs/bench/.
//
//	go run ./bench/cmd/benchdns             # full run (about 35 minutes)
//	go run ./bench/cmd/benchdns -quick      # a few minutes, indicative only
//	go run ./bench/cmd/benchdns -list       # the cases
//	go run ./bench/cmd/benchdns -cases nsd,nsd-zipf-0,nsd-zipf-10k -reps 1
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/santa-offload/santa/bench"
	"github.com/santa-offload/santa/internal/testbed"
)

func main() {
	var (
		quick    = flag.Bool("quick", false, "short run: 20k names, (b) 1,100,10k, (c) 100,10k for NSD only, 1 repetition, 2 s points, few rates; writes docs/bench/dns-quick.* and leaves docs/benchmarks.md alone unless -md is given")
		casesF   = flag.String("cases", "", "comma-separated case names to run (default: all; see -list)")
		serversF = flag.String("servers", "nsd,knot,bind", "servers for (a) and (c)")
		fullF    = flag.String("full", "1,100,10k,100k,1M", "(b): names offloaded, every one queried (NSD)")
		zipfF    = flag.String("zipf", "100,1k,10k,100k,1M", "(c): top n offloaded under the Zipf mix, NSD (n = 0 is always measured)")
		othersF  = flag.String("others", "10k", "(c): top n offloaded under the Zipf mix, Knot and BIND (empty: only n = 0)")
		namesF   = flag.String("names", "1M", "names in the zone")
		mixF     = flag.String("mix", "1M", "queries in the Zipf mix (kxdpgun's query file)")
		zipfS    = flag.Float64("s", 1.0, "Zipf exponent")
		seed     = flag.Int64("seed", 1, "seed of the names and the mix")
		ttl      = flag.Int("ttl", 86400, "zone TTL in seconds (rules are refreshed at half of it)")
		ctlArgs  = flag.String("controller-args", "", "more flags for `santa dns top`, space-separated (e.g. --learn-shapes=false; default: its defaults)")
		bindF    = flag.String("bind", "fd", "which server socket santa binds: fd (the IPv4 socket the queries go to, by --pid and --fd: one rule per name) or port (--port 53/udp: IPv4 and IPv6 socket, two rules per name)")
		ratesF   = flag.String("rates", "", "offered rates for cases answered mostly in XDP (default 200k,300k,400k,600k,800k,1M,1.2M)")
		srvRates = flag.String("server-rates", "", "offered rates for cases the server answers: alone, attached (default 100k,150k,200k,250k,300k,400k)")
		dur      = flag.Duration("duration", 0, "traffic per point, whole seconds (default 2s)")
		reps     = flag.Int("reps", 0, "repetitions per point (default 3; quick 1)")
		stop     = flag.Int("stop-after", 2, "end a case's sweep after this many rates below its best (0: all rates)")
		probe    = flag.Int("probe-rate", 1000, "latency prober queries/s during each point (0: off)")
		batch    = flag.Int("batch", 0, "kxdpgun batch size (default: kxdpgun's, 10)")
		serverC  = flag.Int("server-cpu", testbed.DefaultPlacement.ServerCPU, "CPU for all server work")
		clientC  = flag.Int("client-cpu", testbed.DefaultPlacement.ClientCPU, "CPU for the load generator")
		outDir   = flag.String("out", "docs/bench", "directory for raw results and plots")
		mdPath   = flag.String("md", "", "markdown file whose \"## DNS\" section is replaced (default docs/benchmarks.md; quick: none)")
		noMD     = flag.Bool("no-md", false, "do not touch the markdown file")
		listOnly = flag.Bool("list", false, "list the cases and exit")
		render   = flag.String("render", "", "do not measure: re-render the markdown, CSV and plots from this JSON report (e.g. docs/bench/dns.json)")
		verbose  = flag.Bool("v", false, "log the sampler's ticks and kxdpgun's output per point")
		quietW   = flag.Duration("quiet-wait", 30*time.Second, "before each point, wait up to this long for the CPUs to be idle (others' work)")
		retries  = flag.Int("retries", 2, "repeat a point up to this many times when others' work disturbed it")
		budget   = flag.Duration("quiet-budget", 5*time.Minute, "total time the run may spend waiting for quiet CPUs and repeating disturbed points")
	)
	flag.Parse()

	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	stem, md := "dns", "docs/benchmarks.md"
	cfg := bench.DNSConfig{
		Config: bench.Config{
			Rates:       []int{200_000, 300_000, 400_000, 600_000, 800_000, 1_000_000, 1_200_000},
			Duration:    2 * time.Second,
			Reps:        3,
			Batch:       *batch,
			Placement:   testbed.Placement{ServerCPU: *serverC, ClientCPU: *clientC},
			Quick:       *quick,
			Verbose:     *verbose,
			QuietWait:   *quietW,
			Retries:     *retries,
			QuietBudget: *budget,
			ProbeRate:   *probe,
			StopAfter:   *stop,
			Command:     strings.TrimSpace("go run ./bench/cmd/benchdns " + strings.Join(os.Args[1:], " ")),
			Logf:        logf,
		},
		ServerRates: []int{100_000, 150_000, 200_000, 250_000, 300_000, 400_000},
		ZipfS:       *zipfS,
		Seed:        *seed,
		TTL:         *ttl,
	}
	cfg.ControllerArgs = strings.Fields(*ctlArgs)
	switch *bindF {
	case "fd":
	case "port":
		cfg.BindPort = true
	default:
		fatal(fmt.Errorf("-bind: want fd or port, not %q", *bindF))
	}
	counts := func(name, s string) []int {
		v, err := bench.ParseRates(s)
		if err != nil {
			fatal(fmt.Errorf("-%s: %w", name, err))
		}
		return v
	}
	names, mix := counts("names", *namesF), counts("mix", *mixF)
	if len(names) != 1 || len(mix) != 1 {
		fatal(fmt.Errorf("-names and -mix take one count"))
	}
	cfg.Names, cfg.MixQueries = names[0], mix[0]
	servers := strings.Split(*serversF, ",")
	for _, s := range servers {
		if !slices.Contains(testbed.DNSServerKinds, s) {
			fatal(fmt.Errorf("-servers: unknown server %q (have %s)", s, strings.Join(testbed.DNSServerKinds, ", ")))
		}
	}
	full, zipf, others := counts("full", *fullF), counts("zipf", *zipfF), counts("others", *othersF)
	if *quick {
		cfg.Names, cfg.MixQueries = 20_000, 100_000
		full, zipf, others = []int{1, 100, 10_000}, []int{100, 10_000}, nil
		servers = []string{testbed.KindNSD}
		cfg.Rates = []int{200_000, 400_000, 800_000, 1_200_000}
		cfg.ServerRates = []int{100_000, 200_000, 300_000}
		cfg.Reps = 1
		stem, md = "dns-quick", ""
	}
	if *mdPath != "" {
		md = *mdPath
	}
	if *noMD {
		md = ""
	}
	if *ratesF != "" {
		cfg.Rates = counts("rates", *ratesF)
	}
	if *srvRates != "" {
		cfg.ServerRates = counts("server-rates", *srvRates)
	}
	if *dur > 0 {
		cfg.Duration = *dur
	}
	if *reps > 0 {
		cfg.Reps = *reps
	}
	plan := bench.PlanDNS(servers, full, zipf, others, cfg.Names)
	if *listOnly {
		for _, c := range plan {
			fmt.Printf("%-16s (%s) %s\n", c.Name, c.Experiment, c.Description())
		}
		return
	}
	if *casesF != "" {
		var err error
		if plan, err = bench.SelectCases(plan, *casesF, func(c bench.DNSCase) string { return c.Name }); err != nil {
			fatal(err)
		}
	}
	cfg.Cases = plan

	var rep *bench.DNSReport
	var err error
	if *render != "" {
		if rep, err = bench.LoadDNSReport(*render); err != nil {
			fatal(err)
		}
		if rep.Quick {
			stem = "dns-quick"
		}
	} else {
		points := 0
		for _, c := range plan {
			n := len(cfg.Rates)
			if c.Santa == "" || c.Santa == "attached" {
				n = len(cfg.ServerRates)
			}
			if cfg.StopAfter > 0 {
				n = min(n, 5) // past saturation the sweep stops
			}
			points += n*cfg.Reps + 1
		}
		// kxdpgun takes about 1.2 s to start sending and 1 s after.
		est := time.Duration(points) * (cfg.Duration + 2500*time.Millisecond)
		logf("benchdns: %d cases, about %d points of %v: about %v of traffic and overhead, plus zone loads and rule installs (minutes for 1 M names), plus waits for quiet CPUs (at most %v)",
			len(plan), points, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)

		rep, err = bench.WithSanta(logf, func(ctx context.Context, bin string) (*bench.DNSReport, error) {
			cfg.Bin = bin
			return bench.RunDNS(ctx, cfg)
		})
		if rep == nil {
			fatal(err)
		}
	}
	if perr := bench.Publish(rep, *outDir, stem, md, logf); perr != nil {
		fatal(perr)
	}
	if err != nil {
		os.Exit(1) // interrupted
	}
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchdns:", err)
	os.Exit(1)
}
