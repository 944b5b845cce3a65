// Command santa-demo shows Santa as its users run it. It builds a
// two-namespace testbed and starts the real daemon, bin/santad, in the
// server namespace on the server's veth. Then:
//
//   - an operator's view: a real NSD serves a zone; root runs the DNS
//     controller of the build, `santa dns static` (bin/santa), in the server
//     namespace: it attaches to NSD's port-53 sockets through santad, probes
//     NSD, and installs rules whose replies are NSD's own answers for two
//     names; dig in the client namespace gets those names from the kernel
//     and the rest from NSD, also while NSD is paused; at the end root stops
//     the controller (SIGTERM) and it deletes its rules;
//   - an application's view: the paper's Listing 1 in Python, running as
//     uid nobody, binds a socket and adds its own rule through the Python
//     client; the kernel answers it while the application is paused;
//   - memcached (Debian's, unmodified) holds keys a client set over TCP;
//     root runs the memcached controller of the build, `santa memcached
//     static`: it attaches to memcached's UDP sockets, puts its write
//     tracker on every interface and installs rules whose replies are
//     memcached's own for three keys; UDP GETs from the client namespace
//     are answered by the kernel, byte for byte as memcached does; a write
//     over TCP (text set, binary incr) is seen by the very next GET, and
//     the rule comes back with the new value; the offloaded keys are still
//     answered while memcached is paused; at the end root stops the
//     controller and memcached answers again;
//   - nginx (Debian's, unmodified) serves a few files; root runs the HTTP
//     controller of the build, `santa http`: it attaches to nginx's
//     listening sockets, learns curl's exact requests of three files from
//     santad's miss samples and installs rules whose replies are nginx's
//     own responses (one of about 5 kB, several TCP segments); curl from
//     the client namespace then gets them from eBPF, which answers whole
//     connections with no socket: the same bytes as nginx's but the Date,
//     and nginx's access log shows nothing; a keep-alive connection whose
//     second request has no rule is handed to nginx mid-stream; a file
//     changed on disk is seen by the next fetch (inotify); at the end root
//     stops the controller and nginx answers again.
//
// It removes everything it made when it ends, also on Ctrl-C: the
// controllers and santad are stopped, memcached resumed and stopped,
// nginx stopped, and `santad cleanup` detaches XDP and removes its pins.
//
// Needs root, bin/santad and bin/santa (make build), the source tree's
// clients/python, nsd, dig, memcached, nginx, curl, iproute2, util-linux
// and Debian's python3 with cbor2 (make demo installs and builds all of
// it).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// What the demo offloads, and the name it leaves to NSD.
var (
	offload = []question{{"www.example.test", "A"}, {"txt.example.test", "TXT"}}
	other   = question{"mail.example.test", "A"}
)

// digOptions are dig's options: one try of one second (a paused NSD times
// out fast) and only the answer section. dig's query keeps its defaults
// (RD and AD, EDNS with UDP size 1232 and a random client cookie).
var digOptions = []string{"+tries=1", "+time=1", "+noall", "+answer"}

type question struct{ name, qtype string }

func (q question) String() string { return q.name + " " + q.qtype }

func main() {
	verbose := flag.Bool("v", false, "log every testbed setup step, santad's log and the controllers' (--verbose)")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [-v]\n\n"+
			"Starts santad in a namespace testbed, offloads names of a real NSD to it with\n"+
			"the DNS controller (santa dns static) and shows dig getting answers from the\n"+
			"kernel (XDP) and from NSD; then an unprivileged application adds its own\n"+
			"rule through the Python client; then the memcached controller (santa\n"+
			"memcached static) offloads GETs of a real memcached, and writes over TCP are\n"+
			"seen by the very next GET; then the HTTP controller (santa http) offloads\n"+
			"static files of a real nginx, answered over TCP by eBPF with no socket.\n"+
			"Needs root and bin/santad, bin/santa next to this program (make build).\n\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()

	// SIGPIPE too (santa-demo | head): stop early and clean up rather than die.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM, syscall.SIGPIPE)
	defer stop()
	err := run(ctx, os.Stdout, *verbose)
	switch {
	case err == nil: // finished (a late Ctrl-C found nothing left to stop)
	case ctx.Err() != nil && strings.Contains(err.Error(), "cleanup:"):
		fmt.Fprintf(os.Stderr, "santa-demo: interrupted; %v\n", err)
		os.Exit(130)
	case ctx.Err() != nil:
		fmt.Fprintln(os.Stderr, "santa-demo: interrupted; cleaned up")
		os.Exit(130)
	case err != nil:
		fmt.Fprintf(os.Stderr, "santa-demo: %v\n", err)
		os.Exit(1)
	}
}

// demo holds what run set up.
type demo struct {
	ctx      context.Context
	out      io.Writer
	tb       *testbed.Testbed
	santad   *testbed.Santad
	bins     binaries
	dir      string        // santad's socket and state, the names file, the CLI's copy
	santaBin string        // the santa CLI, copied where uid nobody can run it
	c        *santa.Client // root's connection to santad
	nsd      *testbed.NSD
	ctl      *controller // the DNS controller
	mcCtl    *controller // the memcached controller
	httpCtl  *controller // the HTTP controller
	app      *app
	cookie   map[bool]uint64         // NSD's socket by v6
	server   map[bool]netip.AddrPort // NSD's address by v6
	cookies  []uint64                // every socket with a rule set: NSD's, then the app's
	rules    map[bool]map[question]uint64
	names    map[uint64]string // rule id → what it answers
}

// binaries are the programs of the build the demo runs.
type binaries struct{ santad, santa, python string }

func run(ctx context.Context, out io.Writer, verbose bool) (err error) {
	if err := preflight(); err != nil {
		return err
	}
	bins, err := findBinaries()
	if err != nil {
		return err
	}
	if stale, err := testbed.RemoveStale(); err != nil {
		return fmt.Errorf("remove namespaces left by earlier runs: %w", err)
	} else if len(stale) > 0 {
		fmt.Fprintf(out, "(removed namespaces left by an earlier run: %s)\n", strings.Join(stale, " "))
	}
	if stale, err := removeStaleSantad(bins.santad); err != nil {
		return fmt.Errorf("remove santad pins left by earlier runs: %w", err)
	} else if len(stale) > 0 {
		fmt.Fprintf(out, "(removed santad pins and state left by an earlier run: %s)\n", strings.Join(stale, " "))
	}

	var cleanups []func() error
	defer func() {
		var errs []error
		for i := len(cleanups) - 1; i >= 0; i-- {
			errs = append(errs, cleanups[i]())
		}
		if cerr := errors.Join(errs...); cerr != nil {
			err = errors.Join(err, fmt.Errorf("cleanup: %w", cerr))
		} else if err == nil {
			fmt.Fprintln(out, "\nCleaned up: the app, NSD, memcached and nginx stopped, santad stopped and `santad cleanup` run"+
				" (XDP detached, pins removed), namespaces removed; no process of the demo is left.")
		}
	}()

	logf := func(string, ...any) {}
	if verbose {
		logf = func(f string, a ...any) { fmt.Fprintf(os.Stderr, "  [testbed] "+f+"\n", a...) }
	}
	tb, err := testbed.Create(testbed.Options{Logf: logf})
	if err != nil {
		return err
	}
	cleanups = append(cleanups, tb.Close)
	m := &demo{ctx: ctx, out: out, tb: tb, bins: bins,
		cookie: map[bool]uint64{},
		server: map[bool]netip.AddrPort{},
		rules:  map[bool]map[question]uint64{false: {}, true: {}},
		names:  map[uint64]string{},
	}

	// santad's socket and state, the CLI and the Python client live here:
	// mode 0755, so uid nobody reaches the socket (the clone may be closed to it).
	dir, err := os.MkdirTemp("/run", fmt.Sprintf("santa-demo-%d-", os.Getpid()))
	if err != nil {
		return err
	}
	m.dir = dir
	cleanups = append(cleanups, func() error { return os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		return err
	}
	pyDir := filepath.Join(dir, "python")
	if err := copyPythonClient(bins.python, pyDir); err != nil {
		return err
	}
	m.santaBin = filepath.Join(dir, "santa")
	if b, err := os.ReadFile(bins.santa); err != nil {
		return err
	} else if err := os.WriteFile(m.santaBin, b, 0o755); err != nil {
		return err
	}

	fmt.Fprintln(out, "Santa demo: santad answers chosen requests in the kernel (XDP), for a real NSD,")
	fmt.Fprintln(out, "for an unprivileged application that adds its own rule, for a real memcached,")
	fmt.Fprintln(out, "and over TCP, with no socket, for a real nginx.")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  testbed  client %-15s ── veth ──  server %s\n", tb.Client.IP4, tb.Server.IP4)
	fmt.Fprintf(out, "           client %-15s            server %s\n", tb.Client.IP6, tb.Server.IP6)

	if err := ctx.Err(); err != nil {
		return err
	}
	m.santad = newSantad(bins.santad, dir, tb.Server.NS, tb.Server.Dev)
	cleanups = append(cleanups, func() error { return stopSantad(m.santad) })
	if verbose {
		m.santad.Out = os.Stderr
		fmt.Fprintf(os.Stderr, "  [santad] %s %s\n", bins.santad, strings.Join(m.santad.Args, " "))
	}
	if err := m.santad.Start(ctx); err != nil {
		return err
	}
	if m.c, err = santa.Dial(m.santad.Socket); err != nil {
		return err
	}
	cleanups = append(cleanups, m.c.Close)
	info, _, err := m.c.Health()
	if err != nil {
		return err
	}
	mode := "?"
	for _, i := range info.Interfaces {
		if i.Name == tb.Server.Dev {
			mode = i.Mode
		}
	}
	fmt.Fprintf(out, "  santad   pid %d in the server namespace (%s), XDP rule processor on %s (%s mode)\n",
		m.santad.PID(), bins.santad, tb.Server.Dev, mode)
	fmt.Fprintf(out, "           control socket %s, pins %s\n", m.santad.Socket, bpffsDir())

	if err := ctx.Err(); err != nil {
		return err
	}
	m.nsd, err = tb.StartNSD(testbed.NSDOptions{})
	if err != nil {
		return err
	}
	m.server[false], m.server[true] = m.nsd.Addr4, m.nsd.Addr6
	fmt.Fprintf(out, "  NSD      pid %d serves %s on port 53 of both server addresses (unmodified)\n", m.nsd.PID(), m.nsd.Zone.Origin)

	// The DNS controller: it attaches, probes NSD, installs the rules.
	if err := ctx.Err(); err != nil {
		return err
	}
	m.ctl, err = m.startController(verbose)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, m.ctl.stop)
	if err := m.showController(); err != nil {
		return err
	}

	// dig, side by side.
	fmt.Fprintln(out)
	fmt.Fprintln(out, "dig in the client namespace:")
	for _, v6 := range []bool{false, true} {
		left, err := m.digCompare(offload[0], v6)
		if err != nil {
			return err
		}
		right, err := m.digCompare(other, v6)
		if err != nil {
			return err
		}
		fmt.Fprintln(out)
		sideBySide(out, left, right)
	}

	// The proof: NSD paused, Santa still answers.
	if err := m.paused(); err != nil {
		return err
	}

	// An application's own rule, through the Python client.
	err = m.listing1(pyDir)
	if m.app != nil {
		cleanups = append(cleanups, m.app.stop)
	}
	if err != nil {
		return err
	}

	if err := m.printCounters(); err != nil {
		return err
	}
	if err := m.stopController(); err != nil {
		return err
	}

	// memcached and its controller.
	cleanups = append(cleanups, func() error {
		if m.mcCtl == nil {
			return nil
		}
		return m.mcCtl.stop()
	})
	if err := m.memcached(verbose); err != nil {
		return err
	}

	// nginx and the HTTP controller.
	cleanups = append(cleanups, func() error {
		if m.httpCtl == nil {
			return nil
		}
		return m.httpCtl.stop()
	})
	return m.http(verbose)
}

func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("must run as root (network namespaces, santad); try: sudo make demo")
	}
	var missing []string
	for _, tool := range []string{testbed.NSDPath, testbed.NSDCheckconfPath, "dig", testbed.MemcachedPath, testbed.NginxPath, "curl", "ip", "nsenter", "setpriv", python} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: run scripts/install-deps.sh (packages nsd, dnsutils, memcached, nginx, curl, iproute2, util-linux, python3-cbor2)",
			strings.Join(missing, ", "))
	}
	if out, err := exec.Command(python, "-c", "import cbor2").CombinedOutput(); err != nil {
		return fmt.Errorf("%s cannot import cbor2, which the Python client needs (apt-get install python3-cbor2): %s",
			python, strings.TrimSpace(string(out)))
	}
	return nil
}

// findBinaries finds santad and the santa CLI of the build and the Python
// client of the source tree.
func findBinaries() (b binaries, err error) {
	if b.santad, err = findBinary("santad"); err != nil {
		return b, err
	}
	if b.santa, err = findBinary("santa"); err != nil {
		return b, err
	}
	b.python, err = findPythonClient()
	return b, err
}

// showController shows what the controller said when it got ready (its
// ready line and log: the sockets it attached to, the probe's result, the
// rules installed) and the rules it installed, as santad lists them.
func (m *demo) showController() error {
	m.showReady(m.ctl)
	fmt.Fprintln(m.out, "  (--shape is dig's query: EDNS with a random client cookie. NSD ignores cookies (see the probe), so one rule")
	fmt.Fprintln(m.out, "  answers any; without it the controller would learn the shape from dig's first query, which NSD answers.)")

	// NSD's sockets, which the controller attached to through santad.
	socks, err := m.c.ListSockets()
	if err != nil {
		return err
	}
	for _, s := range socks {
		for v6, addr := range m.server {
			if s.Protocol == 17 && s.AddrPort() == addr {
				m.cookie[v6] = s.Cookie
				m.cookies = append(m.cookies, s.Cookie)
			}
		}
	}
	if len(m.cookie) != 2 {
		return fmt.Errorf("santad has no rule set on NSD's sockets %v and %v after santa dns got ready: %v", m.server[false], m.server[true], socks)
	}
	slices.Sort(m.cookies)

	fmt.Fprintln(m.out)
	fmt.Fprintf(m.out, "Its rules (Go client ListRules on NSD's sockets %d and %d; reply: NSD's answer, ID copied from the query):\n",
		m.cookie[false], m.cookie[true])
	for _, v6 := range []bool{false, true} {
		rules, err := m.c.ListRules(santa.Cookie(m.cookie[v6]))
		if err != nil {
			return err
		}
		slices.SortFunc(rules, func(a, b api.Rule) int { return cmp.Compare(a.ID, b.ID) })
		for _, r := range rules {
			q, ok := ruleQuestion(r)
			if !ok {
				return fmt.Errorf("rule %d of NSD's socket %d: no DNS reply in it: %+v", r.ID, m.cookie[v6], r)
			}
			if _, dup := m.rules[v6][q]; !dup {
				m.rules[v6][q] = r.ID
			}
			m.names[r.ID] = fmt.Sprintf("%-22s %s", q, family(v6))
			fmt.Fprintf(m.out, "  rule %d  %-22s %s  %d-byte query, any %s → %d-byte reply\n",
				r.ID, q, family(v6), r.MinLen, strings.Join(openParts(r), ", "), r.ReplyLen)
		}
	}
	for _, v6 := range []bool{false, true} {
		for _, q := range offload {
			if _, ok := m.rules[v6][q]; !ok {
				return fmt.Errorf("santa dns installed no rule for %v over %s", q, family(v6))
			}
		}
	}
	return nil
}

// stopController stops the controller as an operator does, with SIGTERM,
// and shows its "done:" line and that its rules are gone.
func (m *demo) stopController() error {
	if err := m.stopAndShow(m.ctl, "the DNS controller"); err != nil {
		return err
	}
	for v6, cookie := range m.cookie {
		rules, err := m.c.ListRules(santa.Cookie(cookie))
		if !errors.Is(err, santa.ErrNotFound) {
			return fmt.Errorf("santa dns stopped but NSD's %s socket %d still has a rule set (%d rules, %v)", family(v6), cookie, len(rules), err)
		}
	}
	fmt.Fprintln(m.out, "$ santa rules ls      (the controller also detached NSD's sockets: only the app's rule set is left)")
	out, err := m.cli(false, "rules", "ls")
	if err != nil {
		return err
	}
	fmt.Fprintln(m.out, out)
	fmt.Fprintln(m.out, "dig again: NSD answers the offloaded names itself.")
	return m.digLine(offload[0], false)
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

func digArgs(srv netip.AddrPort, q question) []string {
	return append([]string{"@" + srv.Addr().String(), q.name, q.qtype}, digOptions...)
}

// digRun runs dig in the client namespace; the output comes back also
// when dig fails (a timeout).
func (m *demo) digRun(srv netip.AddrPort, q question) (string, error) {
	if err := m.ctx.Err(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	cmd := testbed.Command(ctx, m.tb.Client.NS, "dig", digArgs(srv, q)...)
	b, err := cmd.CombinedOutput()
	return string(b), err
}

// digResult is one dig run and what the counters say about it.
type digResult struct {
	title    string
	command  string
	answer   string
	by       string
	evidence string
}

// snapshot is santad's view at one moment: the rule processor's counters
// (health) and every rule's hits (stats of each rule set).
type snapshot struct {
	c    map[string]uint64
	hits map[uint64]uint64
}

func (m *demo) snapshot() (snapshot, error) {
	_, c, err := m.c.Health()
	if err != nil {
		return snapshot{}, err
	}
	s := snapshot{c: c, hits: map[uint64]uint64{}}
	for _, cookie := range m.cookies {
		st, err := m.c.Stats(santa.Cookie(cookie))
		if errors.Is(err, santa.ErrNotFound) {
			continue // detached (NSD's, once the controller stopped)
		}
		if err != nil {
			return snapshot{}, err
		}
		for _, r := range st {
			s.hits[r.ID] = r.Hits
		}
	}
	return s, nil
}

// digCompare runs dig for q over one family and works out who answered
// from Santa's counters.
func (m *demo) digCompare(q question, v6 bool) (digResult, error) {
	srv := m.server[v6]
	r := digResult{command: "$ dig " + strings.Join(digArgs(srv, q), " ")}
	if id, ok := m.rules[v6][q]; ok {
		r.title = fmt.Sprintf("%v over %s (rule %d)", q, family(v6), id)
	} else {
		r.title = fmt.Sprintf("%v over %s (no rule)", q, family(v6))
	}
	before, err := m.snapshot()
	if err != nil {
		return r, err
	}
	out, derr := m.digRun(srv, q)
	if m.ctx.Err() != nil {
		return r, m.ctx.Err()
	}
	after, err := m.snapshot()
	if err != nil {
		return r, err
	}
	r.answer = parseDig(out)
	if derr != nil {
		r.answer = "no answer: " + firstLine(out)
	}
	r.by, r.evidence = attribute(before, after, m.rules[v6][q], "NSD")
	return r, nil
}

// attribute says who answered, from what moved between two snapshots:
// Santa if the rule's hits grew, else server if the request was passed on
// (no rule matched, no rule set on any socket of its port, no socket santad
// knows or no rule set on it, or the rule's guards say a write retired it).
func attribute(before, after snapshot, rule uint64, server string) (by, evidence string) {
	answered := after.c["answered"] - before.c["answered"]
	passed := after.c["pass_no_match"] - before.c["pass_no_match"]
	if rule != 0 && after.hits[rule] > before.hits[rule] {
		return "Santa, in the kernel (XDP)",
			fmt.Sprintf("rule %d hits %d → %d", rule, before.hits[rule], after.hits[rule])
	}
	if passed > 0 && answered == 0 {
		return server + " (no rule matched, passed on)",
			fmt.Sprintf("pass_no_match %d → %d", before.c["pass_no_match"], after.c["pass_no_match"])
	}
	if after.c["pass_port_unbound"] > before.c["pass_port_unbound"] && answered == 0 {
		return server + " (no socket on its port has a rule set, passed on)",
			fmt.Sprintf("pass_port_unbound %d → %d", before.c["pass_port_unbound"], after.c["pass_port_unbound"])
	}
	if after.c["pass_no_socket"] > before.c["pass_no_socket"] && answered == 0 {
		return server + " (its socket is not attached to santad, passed on)",
			fmt.Sprintf("pass_no_socket %d → %d", before.c["pass_no_socket"], after.c["pass_no_socket"])
	}
	if after.c["pass_no_ruleset"] > before.c["pass_no_ruleset"] && answered == 0 {
		return server + " (its socket has no rule set, passed on)",
			fmt.Sprintf("pass_no_ruleset %d → %d", before.c["pass_no_ruleset"], after.c["pass_no_ruleset"])
	}
	if after.c["pass_invalidated"] > before.c["pass_invalidated"] && answered == 0 {
		return server + " (a write retired the rule, passed on)",
			fmt.Sprintf("pass_invalidated %d → %d", before.c["pass_invalidated"], after.c["pass_invalidated"])
	}
	var moved []string
	for k, v := range after.c {
		if v != before.c[k] {
			moved = append(moved, fmt.Sprintf("%s +%d", k, v-before.c[k]))
		}
	}
	slices.Sort(moved)
	return "unclear", fmt.Sprintf("answered +%d, pass_no_match +%d (moved: %s)", answered, passed, strings.Join(moved, ", "))
}

// parseDig picks the answer records from dig's output (+noall +answer).
func parseDig(out string) string {
	var recs []string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, ";") {
			continue
		}
		rr, err := dns.NewRR(l)
		if err != nil || rr == nil {
			continue
		}
		f := strings.Fields(rr.String())
		if len(f) >= 4 {
			// type and data, TTL in brackets
			recs = append(recs, strings.Join(f[3:], " ")+" (TTL "+f[1]+")")
		}
	}
	if len(recs) == 0 {
		return "(empty answer section)"
	}
	return strings.Join(recs, "; ")
}

func firstLine(s string) string {
	for _, l := range strings.Split(s, "\n") {
		if l = strings.TrimSpace(strings.TrimLeft(l, "; ")); l != "" {
			return l
		}
	}
	return "dig failed"
}

func sideBySide(out io.Writer, l, r digResult) {
	rows := [][3]string{
		{"", l.title, r.title},
		{"answer", l.answer, r.answer},
		{"from", l.by, r.by},
		{"counters", l.evidence, r.evidence},
	}
	w := 0
	for _, row := range rows {
		w = max(w, len(row[1]))
	}
	fmt.Fprintf(out, "  %s\n  %s\n", l.command, r.command)
	for i, row := range rows {
		fmt.Fprintf(out, "  %-8s  %-*s  │  %s\n", row[0], w, row[1], row[2])
		if i == 0 {
			fmt.Fprintf(out, "  %s\n", strings.Repeat("─", 8+2+w+2)+"┼"+strings.Repeat("─", max(len(r.title), 20)+2))
		}
	}
}

// paused stops NSD and shows that the offloaded names still get answers.
func (m *demo) paused() error {
	pids, err := m.nsd.PIDs()
	if err != nil {
		return err
	}
	cont := func() {
		for _, p := range pids {
			_ = syscall.Kill(p, syscall.SIGCONT) // NSD's own processes, by pid
		}
	}
	defer cont()
	for _, p := range pids {
		if err := syscall.Kill(p, syscall.SIGSTOP); err != nil {
			return fmt.Errorf("SIGSTOP nsd pid %d: %w", p, err)
		}
	}
	fmt.Fprintln(m.out)
	fmt.Fprintf(m.out, "NSD paused (SIGSTOP to pids %v); dig again:\n", pids)
	for _, v6 := range []bool{false, true} {
		for _, q := range append(slices.Clone(offload), other) {
			if err := m.digLine(q, v6); err != nil {
				return err
			}
		}
	}
	cont()
	fmt.Fprintln(m.out, "NSD resumed (SIGCONT).")
	return nil
}

// digLine runs dig for q over one family and prints one line: the answer
// and who gave it.
func (m *demo) digLine(q question, v6 bool) error {
	r, err := m.digCompare(q, v6)
	if err != nil {
		return err
	}
	line := fmt.Sprintf("  %-22s %s  %-38s", q, family(v6), r.answer)
	if strings.HasPrefix(r.answer, "no answer") {
		line = fmt.Sprintf("  %-22s %s  %-38s", q, family(v6), "no answer: timed out")
	} else if strings.HasPrefix(r.by, "Santa") {
		line += "  Santa, " + r.evidence
	} else {
		line += "  " + r.by + ", " + r.evidence
	}
	fmt.Fprintln(m.out, strings.TrimRight(line, " "))
	return nil
}

// printCounters shows what santad reports at the end: the rule
// processor's counters (health) and every rule's hits (stats).
func (m *demo) printCounters() error {
	fmt.Fprintln(m.out)
	_, c, err := m.c.Health()
	if err != nil {
		return err
	}
	var keys []string
	for k, v := range c {
		if v != 0 {
			keys = append(keys, k)
		}
	}
	slices.SortFunc(keys, func(a, b string) int {
		if (a == "answered") != (b == "answered") {
			if a == "answered" {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var parts []string
	for _, k := range keys {
		parts = append(parts, fmt.Sprintf("%s %d", k, c[k]))
	}
	fmt.Fprintf(m.out, "Santa's counters (santad health, all CPUs): %s\n", strings.Join(parts, ", "))
	fmt.Fprintln(m.out, "Per rule (santad stats):")
	var all []api.RuleStats
	for _, cookie := range m.cookies {
		st, err := m.c.Stats(santa.Cookie(cookie))
		if err != nil {
			return err
		}
		all = append(all, st...)
	}
	slices.SortFunc(all, func(a, b api.RuleStats) int { return cmp.Compare(a.ID, b.ID) })
	for _, s := range all {
		hits := "hits"
		if s.Hits == 1 {
			hits = "hit "
		}
		fmt.Fprintf(m.out, "  rule %d  %s  %3d %s  %5d bytes sent\n", s.ID, m.names[s.ID], s.Hits, hits, s.Bytes)
	}
	fmt.Fprintln(m.out, "(pass_no_match: requests NSD or the app answered; miss_sampled: those on NSD's sockets that santad")
	fmt.Fprintln(m.out, " sampled for the controller, which learns query shapes of its names from them;")
	fmt.Fprintln(m.out, " the other pass reasons are frames no rule could answer: multicast, not UDP, NSD's start-up probes)")
	return nil
}
