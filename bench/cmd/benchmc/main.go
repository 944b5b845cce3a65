//go:build linux

// Command benchmc is `make bench-memcached`: the paper's memcached workload
// (keys of 16 and 21 bytes, 2-byte values, Zipf over 1 M keys, 99.8 % GETs)
// on the namespace testbed, side by side in one run: memcached alone, the
// bare XDP reflector, and memcached with `santa memcached top --count N`
// for N = 0 … every key, plus every key offloaded with GETs only. It builds
// santad and santa from the working tree and writes docs/benchmarks.md
// (section "memcached") and raw results and plots under docs/bench/.
//
//	go run ./bench/cmd/benchmc             # full run (about 25 minutes)
//	go run ./bench/cmd/benchmc -quick      # a few minutes, indicative only
//	go run ./bench/cmd/benchmc -list       # the cases
//	go run ./bench/cmd/benchmc -cases memcached,santa-top-10k -reps 1
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/santa-offload/santa/bench"
	"github.com/santa-offload/santa/bench/mcgen"
	"github.com/santa-offload/santa/internal/testbed"
)

func main() {
	var (
		quick    = flag.Bool("quick", false, "short run: 100k keys, top 1k and 100k, 1 repetition, 2 s points, few rates; writes docs/bench/memcached-quick.* and leaves docs/benchmarks.md alone unless -md is given")
		casesF   = flag.String("cases", "", "comma-separated case names to run (default: all; see -list)")
		topsF    = flag.String("tops", "100,1k,10k,100k,1M", "top n offloaded under the mixed workload (n = 0 is always measured; n above -keys means every key)")
		keysF    = flag.String("keys", "1M", "distinct keys, all stored in memcached")
		mixF     = flag.String("mix", "128k", "distinct requests the generator cycles through (at most 128k = 131072)")
		zipfS    = flag.Float64("s", 0.99, "Zipf exponent of the key popularity")
		setShare = flag.Float64("sets", 0.002, "share of SETs in the mixed workload (the paper's USR pool: 99.8 % GETs)")
		seed     = flag.Int64("seed", 1, "seed of the keys and the mixes")
		pacing   = flag.String("pacing", "spin", "generator pacing: spin (frames evenly spaced, the client CPU spins) or calls (bursts per BPF_PROG_RUN call)")
		refresh  = flag.Duration("refresh", 5*time.Millisecond, "santa memcached --refresh: how soon a rule retired by a write is rebuilt")
		ratesF   = flag.String("rates", "", "offered rates for cases answered mostly in XDP (default 100k,200k,300k,400k,600k,800k,1M,1.2M,1.5M,1.8M)")
		srvRates = flag.String("server-rates", "", "offered rates for cases memcached answers mostly (default 50k,100k,150k,200k,250k,300k)")
		dur      = flag.Duration("duration", 0, "traffic per point, whole seconds (default 3s; quick 2s)")
		reps     = flag.Int("reps", 0, "repetitions per point (default 3; quick 1)")
		stop     = flag.Int("stop-after", 2, "end a case's sweep after this many rates below its best (0: all rates)")
		probe    = flag.Int("probe-rate", 1000, "latency prober requests/s during each point (0: off)")
		serverC  = flag.Int("server-cpu", testbed.DefaultPlacement.ServerCPU, "CPU for all server work")
		clientC  = flag.Int("client-cpu", testbed.DefaultPlacement.ClientCPU, "CPU for the load generator")
		outDir   = flag.String("out", "docs/bench", "directory for raw results and plots")
		mdPath   = flag.String("md", "", "markdown file whose \"## memcached\" section is replaced (default docs/benchmarks.md; quick: none)")
		noMD     = flag.Bool("no-md", false, "do not touch the markdown file")
		listOnly = flag.Bool("list", false, "list the cases and exit")
		render   = flag.String("render", "", "do not measure: re-render the markdown, CSV and plots from this JSON report (e.g. docs/bench/memcached.json)")
		verbose  = flag.Bool("v", false, "log the sampler's ticks and the generator's report per point")
		quietW   = flag.Duration("quiet-wait", 30*time.Second, "before each point, wait up to this long for the CPUs to be idle (others' work)")
		retries  = flag.Int("retries", 2, "repeat a point up to this many times when others' work disturbed it")
		budget   = flag.Duration("quiet-budget", 5*time.Minute, "total time the run may spend waiting for quiet CPUs and repeating disturbed points")
	)
	flag.Parse()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	counts := func(name, s string) []int {
		v, err := bench.ParseRates(s)
		if err != nil {
			fatal(fmt.Errorf("-%s: %w", name, err))
		}
		return v
	}
	stem, md := "memcached", "docs/benchmarks.md"
	cfg := bench.MCConfig{
		Config: bench.Config{
			Rates:       []int{100_000, 200_000, 300_000, 400_000, 600_000, 800_000, 1_000_000, 1_200_000, 1_500_000, 1_800_000},
			Duration:    3 * time.Second,
			Reps:        3,
			Placement:   testbed.Placement{ServerCPU: *serverC, ClientCPU: *clientC},
			Quick:       *quick,
			Verbose:     *verbose,
			QuietWait:   *quietW,
			Retries:     *retries,
			QuietBudget: *budget,
			ProbeRate:   *probe,
			StopAfter:   *stop,
			Command:     strings.TrimSpace("go run ./bench/cmd/benchmc " + strings.Join(os.Args[1:], " ")),
			Logf:        logf,
		},
		ServerRates: []int{50_000, 100_000, 150_000, 200_000, 250_000, 300_000},
		ZipfS:       *zipfS,
		SetShare:    *setShare,
		Seed:        *seed,
		Refresh:     *refresh,
	}
	switch *pacing {
	case "spin":
		cfg.Pacing = mcgen.PaceSpin
	case "calls":
		cfg.Pacing = mcgen.PaceCalls
	default:
		fatal(fmt.Errorf("-pacing: want spin or calls, not %q", *pacing))
	}
	keys, mix := counts("keys", *keysF), counts("mix", *mixF)
	if len(keys) != 1 || len(mix) != 1 {
		fatal(fmt.Errorf("-keys and -mix take one count"))
	}
	cfg.Keys, cfg.MixRequests = keys[0], mix[0]
	if cfg.MixRequests == 128_000 { // "128k" means the generator's limit
		cfg.MixRequests = 1 << 17
	}
	tops := counts("tops", *topsF)
	if *quick {
		cfg.Keys = 100_000
		tops = []int{1_000, 100_000}
		cfg.Rates = []int{300_000, 600_000, 1_000_000, 1_500_000}
		cfg.ServerRates = []int{100_000, 200_000}
		cfg.Duration, cfg.Reps = 2*time.Second, 1
		stem, md = "memcached-quick", ""
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
	plan := bench.PlanMC(tops, cfg.Keys)
	if *listOnly {
		for _, c := range plan {
			fmt.Printf("%-16s %s\n", c.Name, c.Description())
		}
		return
	}
	if *casesF != "" {
		var err error
		if plan, err = bench.SelectCases(plan, *casesF, func(c bench.MCCase) string { return c.Name }); err != nil {
			fatal(err)
		}
	}
	cfg.Cases = plan

	var rep *bench.MCReport
	var err error
	if *render != "" {
		if rep, err = bench.LoadMCReport(*render); err != nil {
			fatal(err)
		}
		if rep.Quick {
			stem = "memcached-quick"
		}
	} else {
		points := 0
		for range plan {
			points += min(len(cfg.Rates), 5)*cfg.Reps + 1 // past saturation the sweep stops
		}
		est := time.Duration(points) * (cfg.Duration + 2*time.Second)
		logf("benchmc: %d cases, about %d points of %v: about %v of traffic and overhead, plus storing the keys and installing rules (minutes for 1 M keys), plus waits for quiet CPUs (at most %v)",
			len(plan), points, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)
		rep, err = bench.WithSanta(logf, func(ctx context.Context, bin string) (*bench.MCReport, error) {
			cfg.Bin = bin
			return bench.RunMemcached(ctx, cfg)
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
	fmt.Fprintln(os.Stderr, "benchmc:", err)
	os.Exit(1)
}
