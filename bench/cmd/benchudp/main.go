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
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/santa-offload/santa/bench"
	"github.com/santa-offload/santa/internal/testbed"
)

func main() {
	var (
		quick    = flag.Bool("quick", false, "short run: rates 100k,400k,1.2M, 2 s per point, 1 repetition; writes docs/bench/udp-quick.* and leaves docs/benchmarks.md alone unless -md is given")
		casesF   = flag.String("cases", "", "comma-separated case names (default: all: "+strings.Join(caseNames(bench.DefaultCases()), ",")+")")
		ratesF   = flag.String("rates", "", "offered rates, e.g. 100k,200k,1.2M (default 100k,200k,300k,400k,800k,1M,1.2M,1.6M)")
		dur      = flag.Duration("duration", 0, "traffic per point, whole seconds (default 3s; quick 2s)")
		reps     = flag.Int("reps", 0, "repetitions per point (default 3; quick 1)")
		names    = flag.Int("names", 10000, "generated zone names (the default query mix)")
		batch    = flag.Int("batch", 0, "kxdpgun batch size (default: kxdpgun's, 10)")
		serverC  = flag.Int("server-cpu", testbed.DefaultPlacement.ServerCPU, "CPU for all server work")
		clientC  = flag.Int("client-cpu", testbed.DefaultPlacement.ClientCPU, "CPU for the load generator")
		outDir   = flag.String("out", "docs/bench", "directory for raw results and the plot")
		mdPath   = flag.String("md", "", "markdown file whose \"## UDP\" section is replaced (default docs/benchmarks.md; quick: none)")
		noMD     = flag.Bool("no-md", false, "do not touch the markdown file")
		listOnly = flag.Bool("list", false, "list the cases and exit")
		render   = flag.String("render", "", "do not measure: re-render the markdown, CSV and plot from this JSON report (e.g. docs/bench/udp.json)")
		verbose  = flag.Bool("v", false, "log the sampler's ticks and kxdpgun's output per point")
		quietW   = flag.Duration("quiet-wait", 60*time.Second, "before each point, wait up to this long for the server CPU to be idle (others' work)")
		retries  = flag.Int("retries", 3, "repeat a point up to this many times when others' work disturbed it (server CPU busy > server threads by 10 %)")
		budget   = flag.Duration("quiet-budget", 15*time.Minute, "total time the run may spend waiting for quiet CPUs and repeating disturbed points")
	)
	flag.Parse()

	all := bench.DefaultCases()
	if *listOnly {
		for _, c := range all {
			d := ""
			if x, ok := c.(bench.Describer); ok {
				d = x.Description()
			}
			fmt.Printf("%-20s %s\n", c.Name(), d)
		}
		return
	}

	cfg := bench.Config{
		Rates:       []int{100_000, 200_000, 300_000, 400_000, 800_000, 1_000_000, 1_200_000, 1_600_000},
		Duration:    3 * time.Second,
		Reps:        3,
		Names:       *names,
		Batch:       *batch,
		Placement:   testbed.Placement{ServerCPU: *serverC, ClientCPU: *clientC},
		Quick:       *quick,
		Verbose:     *verbose,
		QuietWait:   *quietW,
		Retries:     *retries,
		QuietBudget: *budget,
		Command:     strings.TrimSpace("go run ./bench/cmd/benchudp " + strings.Join(os.Args[1:], " ")),
		Logf: func(format string, args ...any) {
			fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
		},
	}
	stem := "udp"
	md := "docs/benchmarks.md"
	if *quick {
		cfg.Rates = []int{100_000, 400_000, 1_200_000}
		cfg.Duration = 2 * time.Second
		cfg.Reps = 1
		stem = "udp-quick"
		md = ""
	}
	if *mdPath != "" {
		md = *mdPath
	}
	if *noMD {
		md = ""
	}
	if *ratesF != "" {
		rs, err := bench.ParseRates(*ratesF)
		if err != nil {
			fatal(err)
		}
		cfg.Rates = rs
	}
	if *dur > 0 {
		cfg.Duration = *dur
	}
	if *reps > 0 {
		cfg.Reps = *reps
	}
	if *casesF == "" {
		cfg.Cases = all
	} else {
		byName := map[string]bench.Responder{}
		for _, c := range all {
			byName[c.Name()] = c
		}
		for _, n := range strings.Split(*casesF, ",") {
			c, ok := byName[strings.TrimSpace(n)]
			if !ok {
				fatal(fmt.Errorf("unknown case %q (have %s)", n, strings.Join(caseNames(all), ", ")))
			}
			cfg.Cases = append(cfg.Cases, c)
		}
	}

	if *render == "" {
		points := len(cfg.Cases) * (len(cfg.Rates)*cfg.Reps + 1)
		est := time.Duration(points) * (cfg.Duration + 2500*time.Millisecond)
		cfg.Logf("benchudp: %d cases × %d rates × %d reps, %v per point: about %v (plus waits for quiet CPUs, at most %v)",
			len(cfg.Cases), len(cfg.Rates), cfg.Reps, cfg.Duration, est.Round(10*time.Second), cfg.QuietBudget)
	}
	var rep *bench.Report
	var err error
	if *render != "" {
		rep, err = bench.LoadReport(*render)
		if err != nil {
			fatal(err)
		}
		if rep.Quick {
			stem = "udp-quick"
		}
	} else {
		ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
		defer stop()
		rep, err = bench.Run(ctx, cfg)
		if rep == nil {
			fatal(err)
		}
		if err != nil {
			cfg.Logf("interrupted: %v (writing what was measured)", err)
		}
	}
	files, warn, werr := rep.WriteFiles(*outDir, stem)
	if werr != nil {
		fatal(werr)
	}
	if warn != "" {
		cfg.Logf("warning: %s", warn)
	}
	section := rep.Markdown(stem)
	if md != "" {
		if err := bench.UpdateMarkdown(md, section); err != nil {
			fatal(err)
		}
		files = append(files, md)
	}
	fmt.Println(section)
	cfg.Logf("wrote %s", strings.Join(files, ", "))
	failed := false
	for _, c := range rep.Cases {
		if c.Error != "" {
			failed = true
		}
	}
	if err != nil || failed {
		os.Exit(1)
	}
}

func caseNames(cs []bench.Responder) []string {
	var n []string
	for _, c := range cs {
		n = append(n, c.Name())
	}
	return n
}

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "benchudp:", err)
	os.Exit(1)
}
