package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/signal"
	"reflect"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/integrations/dnsctl"
	followpkg "github.com/santa-offload/santa/integrations/follow"
)

// dnsFlags are the options every `santa dns` mode takes.
type dnsFlags struct {
	port     string
	pid, fd  int
	fdGiven  bool // --fd was given: fd 0 is a number too
	server   string
	shapes   []string
	zones    []string
	duration time.Duration
	verbose  bool
	follow   bool
	cfg      dnsctl.Config
}

func dnsCmd(e env, g *globals) *cobra.Command {
	f := &dnsFlags{cfg: dnsctl.DefaultConfig}
	cmd := &cobra.Command{
		Use:   "dns",
		Short: "Offload the hot answers of an unmodified DNS server (root)",
		Long: `santa dns attaches to the UDP sockets of a running authoritative DNS server
(NSD, Knot, BIND, ...) through santad and offloads its answers: it asks the
server itself for every answer and installs a rule that sends the same reply,
byte for byte, with the query's ID. It keeps running: it asks again before an
answer's TTL runs out, polls the zones' SOA serials (and accepts NOTIFY) to
follow zone changes, and deletes its rules when it stops (SIGINT, SIGTERM,
SIGHUP or --duration). It must run in the server's network namespace. See docs/dns.md.

Modes:
  static    the questions of a names file or a zone file
  top       the N most popular questions of a query list (a priori top-N)
  adaptive  the questions that miss most often, learned from miss samples`,
	}
	cmd.PersistentPreRunE = func(cmd *cobra.Command, _ []string) error {
		f.fdGiven = cmd.Flags().Changed("fd")
		if err := refuseNotPositive(cmd, "parallel", "timeout", "tag", "max-rules", "sample-rate", "quiet-sample-rate", "quiet-after", "min-samples", "interval", "idle"); err != nil {
			return err
		}
		return f.checkRanges()
	}
	pf := cmd.PersistentFlags()
	pf.StringVar(&f.port, "port", "", "attach to every UDP socket bound to this port, e.g. 53/udp")
	pf.IntVar(&f.pid, "pid", 0, "attach to one socket of this process (with --fd)")
	pf.IntVar(&f.fd, "fd", 0, "the socket's fd number in --pid")
	pf.StringVar(&f.server, "server", "", "ask this address for answers (default: each socket's bound address, loopback for a wildcard)")
	pf.StringArrayVar(&f.shapes, "shape", []string{"plain", "edns"},
		"query shape to install for every question (repeatable): plain, or a list of rd, ad, cd, edns[=SIZE], do, cookie, nsid")
	pf.BoolVar(&f.cfg.LearnShapes, "learn-shapes", f.cfg.LearnShapes, "also install a question's rule for further shapes that clients send (seen in misses)")
	pf.Uint32Var(&f.cfg.SampleRate, "sample-rate", f.cfg.SampleRate,
		"miss samples per second and CPU: adaptive's input, and what --learn-shapes looks at")
	pf.Uint32Var(&f.cfg.QuietSampleRate, "quiet-sample-rate", f.cfg.QuietSampleRate,
		"static and top: --learn-shapes' miss samples per second and CPU after --quiet-after without a new shape (the next new shape restores --sample-rate)")
	pf.DurationVar(&f.cfg.QuietAfter, "quiet-after", f.cfg.QuietAfter, "static and top: how long without a new query shape in the misses lowers the sampling to --quiet-sample-rate")
	pf.StringArrayVar(&f.zones, "zone", nil, "a zone the server serves, for SOA polling (repeatable; default: ask the server for each name's zone); a name is polled in the longest one that holds it: list child zones too")
	pf.DurationVar(&f.cfg.Poll, "poll", f.cfg.Poll, "SOA serial poll interval (0: no polling; rules still follow their TTLs)")
	pf.StringVar(&f.cfg.Notify, "notify", "", "accept DNS NOTIFY on this address, e.g. 127.0.0.1:5354 (point the server's notify at it)")
	pf.IntVar(&f.cfg.Parallel, "parallel", f.cfg.Parallel, "questions in flight to the server")
	pf.DurationVar(&f.cfg.Timeout, "timeout", f.cfg.Timeout, "wait for each answer (3 tries)")
	pf.IntVar(&f.cfg.MaxRules, "max-rules", f.cfg.MaxRules, "adaptive: rules per server address; static and top: rules of shapes learned from misses installed at a time, per server address (shapes not offloaded do not count; a rule that goes frees its place)")
	pf.DurationVar(&f.duration, "duration", 0, "stop after this long (0: run until SIGINT or SIGTERM)")
	pf.BoolVar(&f.verbose, "verbose", false, "log every refresh and sample decision")
	pf.StringVar(&f.cfg.Tag, "tag", f.cfg.Tag, "tag every rule with this: at start the controller takes over or deletes the rules with it on its sockets, which a predecessor left (two controllers on one port need different tags: a second one with this tag refuses to start while this one runs)")
	pf.BoolVar(&f.follow, "follow", false, "when the server closes its sockets (restart) or santad goes away or is not running yet, wait for it and attach again (needs --port)")

	var namesFile, zoneFile, origin, types string
	static := &cobra.Command{
		Use:   "static (--names FILE | --zone-file FILE [--origin ZONE])",
		Short: "Offload the questions of a names file or a zone file",
		Long: `--names reads lines "NAME [TYPE ...]" (types default to --types); --zone-file
offloads every name and type in a zone file (except RRSIG, NSEC, NSEC3).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if namesFile != "" && zoneFile != "" {
				return errors.New("give --names FILE or --zone-file FILE, not both")
			}
			if namesFile == "" && zoneFile == "" {
				return errors.New("give --names FILE or --zone-file FILE")
			}
			// either would be ignored, and the questions not the ones meant
			if namesFile != "" && cmd.Flags().Changed("origin") {
				return errors.New("--origin is for --zone-file: the names of a names file are read as fully qualified (www.example.com)")
			}
			if zoneFile != "" && cmd.Flags().Changed("types") {
				return errors.New("--types is for --names: a zone file gives each name's types")
			}
			defTypes, err := parseTypes(types)
			if err != nil {
				return err
			}
			qs, err := dnsctl.LoadQuestions(namesFile, zoneFile, origin, "", 0, defTypes)
			if err != nil {
				return err
			}
			return f.run(e, g, dnsctl.Static, qs)
		},
	}
	static.Flags().StringVar(&namesFile, "names", "", "file of questions, one per line: NAME [TYPE ...] (- for stdin)")
	static.Flags().StringVar(&zoneFile, "zone-file", "", "zone file whose names and types to offload")
	static.Flags().StringVar(&origin, "origin", ".", "origin of --zone-file if it has no $ORIGIN")
	static.Flags().StringVar(&types, "types", "A,AAAA", "types asked for names listed without one")

	var topFile string
	var topN int
	top := &cobra.Command{
		Use:   "top --queries FILE --count N",
		Short: "Offload the N most popular questions of a query list",
		Long: `--queries reads lines "NAME TYPE [COUNT]", e.g. from a query log: with counts
the list is ranked by count, without them by order. The N first are offloaded
(the strategy of the Santa paper, §5.5).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if topFile == "" || topN <= 0 {
				return errors.New("give --queries FILE and --count N (N > 0)")
			}
			qs, err := dnsctl.LoadQuestions("", "", "", topFile, topN, nil)
			if err != nil {
				return err
			}
			return f.run(e, g, dnsctl.Top, qs)
		},
	}
	top.Flags().StringVar(&topFile, "queries", "", "query list: NAME TYPE [COUNT] per line (- for stdin)")
	top.Flags().IntVar(&topN, "count", 0, "how many of the most popular questions to offload")

	adaptive := &cobra.Command{
		Use:   "adaptive",
		Short: "Offload the questions that miss most often, learned from miss samples",
		Long: `adaptive subscribes to the sockets' miss samples, counts questions (in the
form clients send them) in a heavy-hitter sketch (Space-Saving), offloads those
seen at least --min-samples times in a decaying window, up to --max-rules, and
removes rules without hits for --idle.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return f.run(e, g, dnsctl.Adaptive, nil) },
	}
	adaptive.Flags().Uint64Var(&f.cfg.MinSamples, "min-samples", f.cfg.MinSamples, "sampled misses a question needs to be offloaded")
	adaptive.Flags().DurationVar(&f.cfg.Interval, "interval", f.cfg.Interval, "how often to decide (and halve the counts)")
	adaptive.Flags().DurationVar(&f.cfg.Idle, "idle", f.cfg.Idle, "remove a rule after this long without hits")

	cmd.AddCommand(static, top, adaptive)
	return cmd
}

// maxParallel bounds --parallel: each question in flight has a socket of
// its own at each server address, with a 64 KiB buffer.
const maxParallel = 1024

// checkRanges refuses the values of --poll, --pid, --fd and --parallel that
// refuseNotPositive lets through and the controller cannot use, naming the
// flag and what it takes (the controller's own check names its settings,
// some of which are no flag).
func (f *dnsFlags) checkRanges() error {
	switch {
	case f.cfg.Poll < 0:
		return fmt.Errorf("--poll %q: must be 0 (no polling) or more (default %v)", f.cfg.Poll.String(), dnsctl.DefaultConfig.Poll)
	case f.pid < 0:
		return fmt.Errorf("--pid %d: want a process id, from 1", f.pid)
	case f.fd < 0:
		return fmt.Errorf("--fd %d: want an fd number, from 0", f.fd)
	case f.cfg.Parallel > maxParallel:
		return fmt.Errorf("--parallel %d: at most %d (each question in flight has a socket of its own)", f.cfg.Parallel, maxParallel)
	}
	return nil
}

func parseTypes(s string) ([]uint16, error) {
	var out []uint16
	for _, t := range strings.FieldsFunc(s, func(r rune) bool { return r == ',' || r == ' ' }) {
		v, err := dnsctl.ParseType(t)
		if err != nil {
			return nil, fmt.Errorf("--types: %w", err)
		}
		out = append(out, v)
	}
	return out, nil
}

// run starts the controller and waits for a signal or --duration.
func (f *dnsFlags) run(e env, g *globals, mode dnsctl.Mode, qs []dnsctl.Question) error {
	cfg := f.cfg
	cfg.Socket = g.socketPath
	cfg.Mode, cfg.Questions, cfg.Zones = mode, qs, f.zones
	switch {
	case f.port != "" && f.pid == 0:
		p, err := parsePort(f.port)
		if err != nil {
			return err
		}
		cfg.Port = p
	case f.port == "" && f.pid != 0 && !f.follow:
		if !f.fdGiven {
			return errors.New("--pid needs --fd: the number of the server's socket in that process (ls -l /proc/PID/fd)")
		}
		cfg.PID, cfg.FD = f.pid, f.fd
	case f.port == "" && f.pid != 0:
		return errors.New("--follow needs --port: a restarted server has a new pid")
	default:
		return errors.New("give --port PORT/udp, or --pid PID --fd FD")
	}
	if f.server != "" {
		a, err := netip.ParseAddr(f.server)
		if err != nil {
			return fmt.Errorf("--server %q: want an IP address, e.g. 127.0.0.1 or ::1 (the port is --port's)", f.server)
		}
		cfg.Server = a
	}
	for _, s := range f.shapes {
		shape, err := dnsctl.ParseShape(s)
		if err != nil {
			return fmt.Errorf("--shape: %w", err)
		}
		cfg.Shapes = append(cfg.Shapes, shape)
	}
	cfg.Log = controllerLog(e, f.verbose)
	cfg.Ready = func(r dnsctl.Report) {
		fmt.Fprintf(e.stdout, "ready: %d rules on %d sockets (%d questions not offloaded)\n", r.Rules, r.Sockets, sum(r.Skipped))
	}
	return runController(e, func() (*dnsctl.Controller, error) { return dnsctl.New(cfg) }, f.duration,
		followpkg.Options{Follow: f.follow, Socket: cfg.Socket, Port: cfg.Port, Protocol: api.ProtocolUDP, Log: cfg.Log},
		func(r dnsctl.Report) string {
			return fmt.Sprintf("done: installed %d, refreshed %d, changed %d, removed %d rules, %d gone with their sockets; %d questions not offloaded yet, asked again",
				r.Installed, r.Refreshed, r.Changed, r.Removed, r.Gone, r.Waiting)
		})
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// controllerLog is a controller's log on stderr, debug lines with verbose.
func controllerLog(e env, verbose bool) *slog.Logger {
	level := slog.LevelInfo
	if verbose {
		level = slog.LevelDebug
	}
	return slog.New(slog.NewTextHandler(e.stderr, &slog.HandlerOptions{Level: level}))
}

// followSettle is how long a following controller waits after the
// server's port has a socket again before it asks the server for answers:
// the server may still be loading its data.
const followSettle = time.Second

// controller is what the three controllers have in common.
type controller[R any] interface {
	Run(context.Context) error
	Report() R
}

// runController runs the controller newCtl builds until SIGINT, SIGTERM,
// SIGHUP or duration (0: no limit); with follow it builds and runs a new one each
// time the server or santad went away and came back (package follow); the
// new one takes over the rules the last one could not delete, by their tag
// (follow.Inherited). After each run that did anything (or ended without
// an error) it prints done's line about the report: a controller that could
// not start has nothing to report but its error. A bad option fails before
// any waiting: newCtl is called once first to check it.
func runController[R any, C controller[R]](e env, newCtl func() (C, error), duration time.Duration,
	opts followpkg.Options, done func(R) string) error {
	if duration < 0 {
		return fmt.Errorf("--duration %v: must be 0 (run until SIGINT or SIGTERM) or more", duration)
	}
	if _, err := newCtl(); err != nil {
		return err
	}
	ctx, stop := controllerContext(duration)
	defer stop()
	opts.Settle = followSettle
	return followpkg.Run(ctx, opts, func(ctx context.Context) error {
		ctl, err := newCtl()
		if err != nil {
			return err
		}
		err = ctl.Run(ctx)
		if r := ctl.Report(); err == nil || !reflect.ValueOf(r).IsZero() {
			fmt.Fprintln(e.stdout, done(r))
		}
		return err
	})
}

// controllerContext ends on SIGINT, SIGTERM, SIGHUP or after d (0:
// never). SIGHUP too: a controller killed with its terminal would leave
// its rules answering, without following zone or key changes, until their
// TTL or lease ends. A SIGHUP ignored at start (nohup) stays ignored.
func controllerContext(d time.Duration) (context.Context, context.CancelFunc) {
	stopOn := []os.Signal{os.Interrupt, syscall.SIGTERM}
	if !signal.Ignored(syscall.SIGHUP) {
		stopOn = append(stopOn, syscall.SIGHUP)
	}
	ctx, stop := signal.NotifyContext(context.Background(), stopOn...)
	if d <= 0 {
		return ctx, stop
	}
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); stop() }
}
