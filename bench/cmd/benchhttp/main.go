//go:build linux

// Command benchhttp is `make bench-http`: the paper's Figure 8 on the
// namespace testbed. One nginx worker serves a static file of each payload
// size (100 B to 10 kB); wrk asks for it over a few keep-alive connections
// and over a new connection per request (Connection: close), against nginx
// with sendfile off, nginx with sendfile on, and Santa (the same nginx with
// santad and `santa http`, whose rules answer from the eBPF TCP path). It
// builds santad and santa from the working tree and writes docs/benchmarks.md
// (section "HTTP") and raw results and a plot under docs/bench/.
//
//	go run ./bench/cmd/benchhttp             # full run (about 13 minutes)
//	go run ./bench/cmd/benchhttp -quick      # about 3 minutes, indicative only
//	go run ./bench/cmd/benchhttp -list       # the cases
//	go run ./bench/cmd/benchhttp -cases nginx-ka-100,santa-ka-100 -reps 1
//	go run ./bench/cmd/benchhttp -render docs/bench/http.json
package main

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/santa-offload/santa/bench"
)

func main() {
	cmd := bench.NewCommand(bench.CommandSpec{
		Name: "benchhttp", Stem: "http", Section: "HTTP",
		Quick:    "short run: 2 s points, 1 repetition",
		Duration: "wrk's run per repetition, whole seconds (default 4s; quick 2s)",
		Verbose:  "the sampler's ticks and wrk's report", Client: "wrk",
		QuietWait: 30 * time.Second, QuietBudget: 4 * time.Minute, Retries: 2,
	})
	var (
		sizesF   = flag.String("sizes", "100,500,1k,2k,5k,10k", "payloads: bytes of the file (the response body)")
		kaConns  = flag.Int("keepalive-conns", 16, "wrk connections of the keep-alive cases")
		clConns  = flag.Int("close-conns", 32, "wrk connections of the Connection: close cases")
		maxReply = flag.Int("max-reply", 0, "santa http --max-reply (0: the controller's default, the longest reply the data path sends)")
		warmup   = flag.Duration("warmup", 15*time.Second, "longest learning phase of a Santa case (until the controller decided on wrk's requests)")
		ctlArgs  = flag.String("controller-args", "", "more arguments for santa http (space-separated, e.g. \"--date-refresh 0\")")
	)
	flag.Parse()

	sizes := cmd.Counts("sizes", *sizesF)
	if len(sizes) == 0 {
		cmd.Fatal(fmt.Errorf("-sizes: no payload size"))
	}
	cfg := bench.HTTPConfig{
		Config:         bench.Config{Duration: 4 * time.Second, Reps: 3},
		Sizes:          sizes,
		KeepAliveConns: *kaConns,
		CloseConns:     *clConns,
		MaxReply:       *maxReply,
		Warmup:         *warmup,
		ControllerArgs: strings.Fields(*ctlArgs),
	}
	if cmd.Quick() {
		cfg.Duration, cfg.Reps = 2*time.Second, 1
	}
	cmd.Configure(&cfg.Config)
	cfg.Cases = bench.Plan(cmd, bench.PlanHTTP(sizes, cfg.KeepAliveConns, cfg.CloseConns),
		func(c bench.HTTPCase) string { return c.Name },
		func(c bench.HTTPCase) string { return fmt.Sprintf("%-22s %s", c.Name, c.Description()) })
	bench.Finish(cmd, bench.LoadHTTPReport, func() (*bench.HTTPReport, error) {
		est := time.Duration(len(cfg.Cases)) * (3*time.Second + time.Duration(cfg.Reps)*(cfg.Duration+1500*time.Millisecond))
		cmd.Logf("benchhttp: %d cases, %d repetitions of %v each: about %v, plus learning in the Santa cases and waits for quiet CPUs (at most %v)",
			len(cfg.Cases), cfg.Reps, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)
		return bench.WithSanta(cmd.Logf, func(ctx context.Context, bin string) (*bench.HTTPReport, error) {
			cfg.Bin = bin
			return bench.RunHTTP(ctx, cfg)
		})
	})
}
