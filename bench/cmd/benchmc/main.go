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
	"time"

	"github.com/santa-offload/santa/bench"
	"github.com/santa-offload/santa/bench/mcgen"
)

func main() {
	cmd := bench.NewCommand(bench.CommandSpec{
		Name: "benchmc", Stem: "memcached", Section: "memcached",
		Quick:    "short run: 100k keys, top 1k and 100k, 1 repetition, 2 s points, few rates",
		Duration: "traffic per point, whole seconds (default 3s; quick 2s)",
		Verbose:  "the sampler's ticks and the generator's report", Client: "the load generator",
		QuietWait: 30 * time.Second, QuietBudget: 5 * time.Minute, Retries: 2,
	})
	var (
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
		stop     = flag.Int("stop-after", 2, "end a case's sweep after this many rates below its best (0: all rates)")
		probe    = flag.Int("probe-rate", 1000, "latency prober requests/s during each point (0: off)")
	)
	flag.Parse()

	cfg := bench.MCConfig{
		Config: bench.Config{
			Rates:     []int{100_000, 200_000, 300_000, 400_000, 600_000, 800_000, 1_000_000, 1_200_000, 1_500_000, 1_800_000},
			Duration:  3 * time.Second,
			Reps:      3,
			ProbeRate: *probe,
			StopAfter: *stop,
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
		cmd.Fatal(fmt.Errorf("-pacing: want spin or calls, not %q", *pacing))
	}
	keys, mix := cmd.Counts("keys", *keysF), cmd.Counts("mix", *mixF)
	if len(keys) != 1 || len(mix) != 1 {
		cmd.Fatal(fmt.Errorf("-keys and -mix take one count"))
	}
	cfg.Keys, cfg.MixRequests = keys[0], mix[0]
	if cfg.MixRequests == 128_000 { // "128k" means the generator's limit
		cfg.MixRequests = 1 << 17
	}
	tops := cmd.Counts("tops", *topsF)
	if cmd.Quick() {
		cfg.Keys = 100_000
		tops = []int{1_000, 100_000}
		cfg.Rates = []int{300_000, 600_000, 1_000_000, 1_500_000}
		cfg.ServerRates = []int{100_000, 200_000}
		cfg.Duration, cfg.Reps = 2*time.Second, 1
	}
	cmd.Configure(&cfg.Config)
	if *ratesF != "" {
		cfg.Rates = cmd.Counts("rates", *ratesF)
	}
	if *srvRates != "" {
		cfg.ServerRates = cmd.Counts("server-rates", *srvRates)
	}
	cfg.Cases = bench.Plan(cmd, bench.PlanMC(tops, cfg.Keys),
		func(c bench.MCCase) string { return c.Name },
		func(c bench.MCCase) string { return fmt.Sprintf("%-16s %s", c.Name, c.Description()) })
	bench.Finish(cmd, bench.LoadMCReport, func() (*bench.MCReport, error) {
		points := 0
		for range cfg.Cases {
			points += min(len(cfg.Rates), 5)*cfg.Reps + 1 // past saturation the sweep stops
		}
		est := time.Duration(points) * (cfg.Duration + 2*time.Second)
		cmd.Logf("benchmc: %d cases, about %d points of %v: about %v of traffic and overhead, plus storing the keys and installing rules (minutes for 1 M keys), plus waits for quiet CPUs (at most %v)",
			len(cfg.Cases), points, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)
		return bench.WithSanta(cmd.Logf, func(ctx context.Context, bin string) (*bench.MCReport, error) {
			cfg.Bin = bin
			return bench.RunMemcached(ctx, cfg)
		})
	})
}
