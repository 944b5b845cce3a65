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
	"slices"
	"strings"
	"time"

	"github.com/santa-offload/santa/bench"
	"github.com/santa-offload/santa/internal/testbed"
)

func main() {
	cmd := bench.NewCommand(bench.CommandSpec{
		Name: "benchdns", Stem: "dns", Section: "DNS",
		Quick:    "short run: 20k names, (b) 1,100,10k, (c) 100,10k for NSD only, 1 repetition, few rates",
		Duration: "traffic per point, whole seconds (default 2s)",
		Verbose:  "the sampler's ticks and kxdpgun's output", Client: "the load generator",
		QuietWait: 30 * time.Second, QuietBudget: 5 * time.Minute, Retries: 2,
	})
	var (
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
		stop     = flag.Int("stop-after", 2, "end a case's sweep after this many rates below its best (0: all rates)")
		probe    = flag.Int("probe-rate", 1000, "latency prober queries/s during each point (0: off)")
		batch    = flag.Int("batch", 0, "kxdpgun batch size (default: kxdpgun's, 10)")
	)
	flag.Parse()

	cfg := bench.DNSConfig{
		Config: bench.Config{
			Rates:     []int{200_000, 300_000, 400_000, 600_000, 800_000, 1_000_000, 1_200_000},
			Duration:  2 * time.Second,
			Reps:      3,
			Batch:     *batch,
			ProbeRate: *probe,
			StopAfter: *stop,
		},
		ServerRates:    []int{100_000, 150_000, 200_000, 250_000, 300_000, 400_000},
		ZipfS:          *zipfS,
		Seed:           *seed,
		TTL:            *ttl,
		ControllerArgs: strings.Fields(*ctlArgs),
	}
	switch *bindF {
	case "fd":
	case "port":
		cfg.BindPort = true
	default:
		cmd.Fatal(fmt.Errorf("-bind: want fd or port, not %q", *bindF))
	}
	names, mix := cmd.Counts("names", *namesF), cmd.Counts("mix", *mixF)
	if len(names) != 1 || len(mix) != 1 {
		cmd.Fatal(fmt.Errorf("-names and -mix take one count"))
	}
	cfg.Names, cfg.MixQueries = names[0], mix[0]
	servers := strings.Split(*serversF, ",")
	for _, s := range servers {
		if !slices.Contains(testbed.DNSServerKinds, s) {
			cmd.Fatal(fmt.Errorf("-servers: unknown server %q (have %s)", s, strings.Join(testbed.DNSServerKinds, ", ")))
		}
	}
	full, zipf, others := cmd.Counts("full", *fullF), cmd.Counts("zipf", *zipfF), cmd.Counts("others", *othersF)
	if cmd.Quick() {
		cfg.Names, cfg.MixQueries = 20_000, 100_000
		full, zipf, others = []int{1, 100, 10_000}, []int{100, 10_000}, nil
		servers = []string{testbed.KindNSD}
		cfg.Rates = []int{200_000, 400_000, 800_000, 1_200_000}
		cfg.ServerRates = []int{100_000, 200_000, 300_000}
		cfg.Reps = 1
	}
	cmd.Configure(&cfg.Config)
	if *ratesF != "" {
		cfg.Rates = cmd.Counts("rates", *ratesF)
	}
	if *srvRates != "" {
		cfg.ServerRates = cmd.Counts("server-rates", *srvRates)
	}
	cfg.Cases = bench.Plan(cmd, bench.PlanDNS(servers, full, zipf, others, cfg.Names),
		func(c bench.DNSCase) string { return c.Name },
		func(c bench.DNSCase) string {
			return fmt.Sprintf("%-16s (%s) %s", c.Name, c.Experiment, c.Description())
		})
	bench.Finish(cmd, bench.LoadDNSReport, func() (*bench.DNSReport, error) {
		points := 0
		for _, c := range cfg.Cases {
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
		cmd.Logf("benchdns: %d cases, about %d points of %v: about %v of traffic and overhead, plus zone loads and rule installs (minutes for 1 M names), plus waits for quiet CPUs (at most %v)",
			len(cfg.Cases), points, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)
		return bench.WithSanta(cmd.Logf, func(ctx context.Context, bin string) (*bench.DNSReport, error) {
			cfg.Bin = bin
			return bench.RunDNS(ctx, cfg)
		})
	})
}
