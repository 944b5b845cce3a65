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
	"os"
	"strings"
	"time"

	"github.com/santa-offload/santa/bench"
	"github.com/santa-offload/santa/internal/testbed"
)

func main() {
	var (
		quick    = flag.Bool("quick", false, "short run: 2 s points, 1 repetition; writes docs/bench/http-quick.* and leaves docs/benchmarks.md alone unless -md is given")
		casesF   = flag.String("cases", "", "comma-separated case names to run (default: all; see -list)")
		sizesF   = flag.String("sizes", "100,500,1k,2k,5k,10k", "payloads: bytes of the file (the response body)")
		kaConns  = flag.Int("keepalive-conns", 16, "wrk connections of the keep-alive cases")
		clConns  = flag.Int("close-conns", 32, "wrk connections of the Connection: close cases")
		dur      = flag.Duration("duration", 0, "wrk's run per repetition, whole seconds (default 4s; quick 2s)")
		reps     = flag.Int("reps", 0, "repetitions per case (default 3; quick 1)")
		maxReply = flag.Int("max-reply", 0, "santa http --max-reply (0: the controller's default, the longest reply the data path sends)")
		warmup   = flag.Duration("warmup", 15*time.Second, "longest learning phase of a Santa case (until the controller decided on wrk's requests)")
		ctlArgs  = flag.String("controller-args", "", "more arguments for santa http (space-separated, e.g. \"--date-refresh 0\")")
		serverC  = flag.Int("server-cpu", testbed.DefaultPlacement.ServerCPU, "CPU for all server work")
		clientC  = flag.Int("client-cpu", testbed.DefaultPlacement.ClientCPU, "CPU for wrk")
		outDir   = flag.String("out", "docs/bench", "directory for raw results and the plot")
		mdPath   = flag.String("md", "", "markdown file whose \"## HTTP\" section is replaced (default docs/benchmarks.md; quick: none)")
		noMD     = flag.Bool("no-md", false, "do not touch the markdown file")
		listOnly = flag.Bool("list", false, "list the cases and exit")
		render   = flag.String("render", "", "do not measure: re-render the markdown, CSV and plot from this JSON report (e.g. docs/bench/http.json)")
		verbose  = flag.Bool("v", false, "log the sampler's ticks and wrk's report per point")
		quietW   = flag.Duration("quiet-wait", 30*time.Second, "before each point, wait up to this long for the CPUs to be idle (others' work)")
		retries  = flag.Int("retries", 2, "repeat a point up to this many times when others' work disturbed it")
		budget   = flag.Duration("quiet-budget", 4*time.Minute, "total time the run may spend waiting for quiet CPUs and repeating disturbed points")
	)
	flag.Parse()
	logf := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
	}
	sizes, err := bench.ParseRates(*sizesF)
	if err != nil || len(sizes) == 0 {
		fatal(fmt.Errorf("-sizes: %v", err))
	}
	stem, md := "http", "docs/benchmarks.md"
	cfg := bench.HTTPConfig{
		Config: bench.Config{
			Duration:    4 * time.Second,
			Reps:        3,
			Placement:   testbed.Placement{ServerCPU: *serverC, ClientCPU: *clientC},
			Quick:       *quick,
			Verbose:     *verbose,
			QuietWait:   *quietW,
			Retries:     *retries,
			QuietBudget: *budget,
			Command:     strings.TrimSpace("go run ./bench/cmd/benchhttp " + strings.Join(os.Args[1:], " ")),
			Logf:        logf,
		},
		Sizes:          sizes,
		KeepAliveConns: *kaConns,
		CloseConns:     *clConns,
		MaxReply:       *maxReply,
		Warmup:         *warmup,
		ControllerArgs: strings.Fields(*ctlArgs),
	}
	if *quick {
		cfg.Duration, cfg.Reps = 2*time.Second, 1
		stem, md = "http-quick", ""
	}
	if *mdPath != "" {
		md = *mdPath
	}
	if *noMD {
		md = ""
	}
	if *dur > 0 {
		cfg.Duration = *dur
	}
	if *reps > 0 {
		cfg.Reps = *reps
	}
	plan := bench.PlanHTTP(sizes, cfg.KeepAliveConns, cfg.CloseConns)
	if *listOnly {
		for _, c := range plan {
			fmt.Printf("%-22s %s\n", c.Name, c.Description())
		}
		return
	}
	if *casesF != "" {
		if plan, err = bench.SelectCases(plan, *casesF, func(c bench.HTTPCase) string { return c.Name }); err != nil {
			fatal(err)
		}
	}
	cfg.Cases = plan

	var rep *bench.HTTPReport
	if *render != "" {
		if rep, err = bench.LoadHTTPReport(*render); err != nil {
			fatal(err)
		}
		if rep.Quick {
			stem = "http-quick"
		}
	} else {
		est := time.Duration(len(plan)) * (3*time.Second + time.Duration(cfg.Reps)*(cfg.Duration+1500*time.Millisecond))
		logf("benchhttp: %d cases, %d repetitions of %v each: about %v, plus learning in the Santa cases and waits for quiet CPUs (at most %v)",
			len(plan), cfg.Reps, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)
		rep, err = bench.WithSanta(logf, func(ctx context.Context, bin string) (*bench.HTTPReport, error) {
			cfg.Bin = bin
			return bench.RunHTTP(ctx, cfg)
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
	fmt.Fprintln(os.Stderr, "benchhttp:", err)
	os.Exit(1)
}
