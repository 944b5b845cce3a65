package bench

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// CommandSpec is what a benchmark command (bench/cmd/bench*) says of itself
// for the flags they all take.
type CommandSpec struct {
	Name        string        // the command: benchdns
	Stem        string        // its files: docs/bench/<Stem>.* (<Stem>-quick.* with -quick)
	Section     string        // its markdown section: "## <Section>"
	Quick       string        // what -quick runs
	Duration    string        // -duration: what a point is, and its defaults
	Verbose     string        // what -v logs per point
	Client      string        // what runs on the client CPU
	QuietWait   time.Duration // -quiet-wait's default
	QuietBudget time.Duration // -quiet-budget's default
	Retries     int           // -retries' default
}

// Command holds the flags every benchmark command takes, and its log and
// exit. NewCommand registers them; the command parses the flags.
type Command struct {
	spec                                CommandSpec
	quick, noMD, list, verbose          *bool
	cases, md, out, render              *string
	duration, quietWait, quietBudget    *time.Duration
	reps, retries, serverCPU, clientCPU *int
}

// NewCommand registers the shared flags of a benchmark command on the
// command line.
func NewCommand(spec CommandSpec) *Command {
	return &Command{
		spec:        spec,
		quick:       flag.Bool("quick", false, spec.Quick+"; writes docs/bench/"+spec.Stem+"-quick.* and leaves docs/benchmarks.md alone unless -md is given"),
		cases:       flag.String("cases", "", "comma-separated case names to run (default: all; see -list)"),
		duration:    flag.Duration("duration", 0, spec.Duration),
		reps:        flag.Int("reps", 0, "repetitions per point (default 3; quick 1)"),
		serverCPU:   flag.Int("server-cpu", testbed.DefaultPlacement.ServerCPU, "CPU for all server work"),
		clientCPU:   flag.Int("client-cpu", testbed.DefaultPlacement.ClientCPU, "CPU for "+spec.Client),
		out:         flag.String("out", "docs/bench", "directory for raw results and plots"),
		md:          flag.String("md", "", "markdown file whose \"## "+spec.Section+"\" section is replaced (default docs/benchmarks.md; quick: none)"),
		noMD:        flag.Bool("no-md", false, "do not touch the markdown file"),
		list:        flag.Bool("list", false, "list the cases and exit"),
		render:      flag.String("render", "", "do not measure: re-render the markdown, CSV and plots from this JSON report (e.g. docs/bench/"+spec.Stem+".json)"),
		verbose:     flag.Bool("v", false, "log "+spec.Verbose+" per point"),
		quietWait:   flag.Duration("quiet-wait", spec.QuietWait, "before each point, wait up to this long for the CPUs to be idle (others' work)"),
		retries:     flag.Int("retries", spec.Retries, "repeat a point up to this many times when others' work disturbed it (server CPU busy beyond the server threads)"),
		quietBudget: flag.Duration("quiet-budget", spec.QuietBudget, "total time the run may spend waiting for quiet CPUs and repeating disturbed points"),
	}
}

// Quick reports whether -quick was given.
func (c *Command) Quick() bool { return *c.quick }

// Configure sets cfg's shared fields from the flags: the caller has set
// its defaults (and those of -quick); -duration and -reps override them.
func (c *Command) Configure(cfg *Config) {
	cfg.Placement = testbed.Placement{ServerCPU: *c.serverCPU, ClientCPU: *c.clientCPU}
	cfg.Quick, cfg.Verbose = *c.quick, *c.verbose
	cfg.QuietWait, cfg.Retries, cfg.QuietBudget = *c.quietWait, *c.retries, *c.quietBudget
	cfg.Command = strings.TrimSpace("go run ./bench/cmd/" + c.spec.Name + " " + strings.Join(os.Args[1:], " "))
	cfg.Logf = c.Logf
	if *c.duration > 0 {
		cfg.Duration = *c.duration
	}
	if *c.reps > 0 {
		cfg.Reps = *c.reps
	}
}

// Logf logs a line on stderr with the time.
func (c *Command) Logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

// Fatal says why the command cannot go on and exits.
func (c *Command) Fatal(err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", c.spec.Name, err)
	os.Exit(1)
}

// Counts parses flag name's list of counts (100k,1.2M), or exits.
func (c *Command) Counts(name, s string) []int {
	v, err := ParseRates(s)
	if err != nil {
		c.Fatal(fmt.Errorf("-%s: %w", name, err))
	}
	return v
}

// Plan lists the cases of plan and exits with -list, and keeps those named
// by -cases; line is a case's line in the list.
func Plan[C any](c *Command, plan []C, name func(C) string, line func(C) string) []C {
	if *c.list {
		for _, k := range plan {
			fmt.Println(line(k))
		}
		os.Exit(0)
	}
	if *c.cases == "" {
		return plan
	}
	sel, err := SelectCases(plan, *c.cases, name)
	if err != nil {
		c.Fatal(err)
	}
	return sel
}

// Finish publishes a report: the one -render names (loaded by load), or
// the one measure makes. Files go under -out and the section into -md (a
// quick run's into none unless -md names one). It exits non-zero if
// measuring was interrupted or a case failed.
func Finish[T any, R interface {
	*T
	Publishable
	IsQuick() bool
}](c *Command, load func(path string) (R, error), measure func() (R, error)) {
	var rep R
	var err error
	if *c.render != "" {
		if rep, err = load(*c.render); err != nil {
			c.Fatal(err)
		}
	} else if rep, err = measure(); rep == nil {
		c.Fatal(err)
	}
	stem, md := c.spec.Stem, "docs/benchmarks.md"
	if rep.IsQuick() {
		stem, md = stem+"-quick", ""
	}
	if *c.md != "" {
		md = *c.md
	}
	if *c.noMD {
		md = ""
	}
	if perr := Publish(rep, *c.out, stem, md, c.Logf); perr != nil {
		c.Fatal(perr)
	}
	if err != nil {
		os.Exit(1) // interrupted
	}
}
