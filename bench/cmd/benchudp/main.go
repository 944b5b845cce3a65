//go:build linux

// Command benchudp is `make bench-udp`: the UDP benchmark on the namespace
// testbed. It sweeps kxdpgun's offered rate against NSD alone, the bare XDP
// reflector and the registered Santa cases, and writes docs/benchmarks.md
// (section "UDP") and raw results under docs/bench/.
//
//	go run ./bench/cmd/benchudp            # full run (several minutes)
//	go run ./bench/cmd/benchudp -quick     # one repetition, few rates
//	go run ./bench/cmd/benchudp -cases nsd,reflector -rates 200k,1.2M
package main

import (
	"context"
	"flag"
	"fmt"
	"time"

	"github.com/santa-offload/santa/bench"
)

func main() {
	cmd := bench.NewCommand(bench.CommandSpec{
		Name: "benchudp", Stem: "udp", Section: "UDP",
		Quick:    "short run: rates 100k,400k,1.2M, 2 s per point, 1 repetition",
		Duration: "traffic per point, whole seconds (default 3s; quick 2s)",
		Verbose:  "the sampler's ticks and kxdpgun's output", Client: "the load generator",
		QuietWait: 60 * time.Second, QuietBudget: 15 * time.Minute, Retries: 3,
	})
	var (
		ratesF = flag.String("rates", "", "offered rates, e.g. 100k,200k,1.2M (default 100k,200k,300k,400k,800k,1M,1.2M,1.6M)")
		names  = flag.Int("names", 10000, "generated zone names (the default query mix)")
		batch  = flag.Int("batch", 0, "kxdpgun batch size (default: kxdpgun's, 10)")
	)
	flag.Parse()

	cfg := bench.Config{
		Rates:    []int{100_000, 200_000, 300_000, 400_000, 800_000, 1_000_000, 1_200_000, 1_600_000},
		Duration: 3 * time.Second,
		Reps:     3,
		Names:    *names,
		Batch:    *batch,
	}
	if cmd.Quick() {
		cfg.Rates = []int{100_000, 400_000, 1_200_000}
		cfg.Duration, cfg.Reps = 2*time.Second, 1
	}
	cmd.Configure(&cfg)
	if *ratesF != "" {
		cfg.Rates = cmd.Counts("rates", *ratesF)
	}
	cfg.Cases = bench.Plan(cmd, bench.DefaultCases(), bench.Responder.Name, func(c bench.Responder) string {
		d := ""
		if x, ok := c.(bench.Describer); ok {
			d = x.Description()
		}
		return fmt.Sprintf("%-20s %s", c.Name(), d)
	})
	bench.Finish(cmd, bench.LoadReport, func() (*bench.Report, error) {
		points := len(cfg.Cases) * (len(cfg.Rates)*cfg.Reps + 1)
		est := time.Duration(points) * (cfg.Duration + 2500*time.Millisecond)
		cmd.Logf("benchudp: %d cases × %d rates × %d reps, %v per point: about %v (plus waits for quiet CPUs, at most %v)",
			len(cfg.Cases), len(cfg.Rates), cfg.Reps, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)
		return bench.UntilSignal(cmd.Logf, func(ctx context.Context) (*bench.Report, error) { return bench.Run(ctx, cfg) })
	})
}
