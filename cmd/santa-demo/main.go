// Command santa-demo shows Santa answering DNS queries in the kernel: it
// builds a two-namespace testbed, starts a real NSD in the server
// namespace, attaches Santa's XDP rule processor to the server's veth,
// installs rules for a couple of names (with the replies NSD itself gives)
// and runs dig from the client namespace for an offloaded name and for one
// that is not. It removes everything it made when it ends, also on Ctrl-C.
//
// Needs root, nsd, dig and iproute2 (make demo installs them).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/dataplane"
	"github.com/santa-offload/santa/internal/dnsrule"
	"github.com/santa-offload/santa/internal/sockets"
	"github.com/santa-offload/santa/internal/testbed"
)

// What the demo offloads, and the name it leaves to NSD.
var (
	offload = []question{{"www.example.test", "A"}, {"txt.example.test", "TXT"}}
	other   = question{"mail.example.test", "A"}
)

// digDisplay are dig's display options; they do not change the query.
var digDisplay = []string{"+noall", "+answer"}

type question struct{ name, qtype string }

func (q question) String() string { return q.name + " " + q.qtype }

func main() {
	verbose := flag.Bool("v", false, "log every testbed setup step")
	flag.Usage = func() {
		fmt.Fprintf(flag.CommandLine.Output(), "usage: %s [-v]\n\n"+
			"Runs NSD behind Santa in a namespace testbed and shows dig getting\n"+
			"answers from the kernel (XDP) and from NSD. Needs root.\n\n", os.Args[0])
		flag.PrintDefaults()
	}
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Stdout, *verbose)
	switch {
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
	ctx    context.Context
	out    io.Writer
	tb     *testbed.Testbed
	nsd    *testbed.NSD
	d      *dataplane.Dataplane
	cookie map[bool]uint64         // NSD's socket by v6
	server map[bool]netip.AddrPort // NSD's address by v6
	rules  map[bool]map[question]dataplane.RuleID
	names  map[dataplane.RuleID]string
}

func run(ctx context.Context, out io.Writer, verbose bool) (err error) {
	if err := preflight(); err != nil {
		return err
	}
	if stale, err := testbed.RemoveStale(); err != nil {
		return fmt.Errorf("remove namespaces left by earlier runs: %w", err)
	} else if len(stale) > 0 {
		fmt.Fprintf(out, "(removed namespaces left by an earlier run: %s)\n", strings.Join(stale, " "))
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
			fmt.Fprintln(out, "\nCleaned up: XDP detached, NSD stopped, namespaces removed.")
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
	m := &demo{ctx: ctx, out: out, tb: tb,
		cookie: map[bool]uint64{},
		server: map[bool]netip.AddrPort{},
		rules:  map[bool]map[question]dataplane.RuleID{false: {}, true: {}},
		names:  map[dataplane.RuleID]string{},
	}

	fmt.Fprintln(out, "Santa demo: a real NSD serves a zone; Santa answers chosen names in the kernel (XDP).")
	fmt.Fprintln(out)
	fmt.Fprintf(out, "  testbed  client %-15s ── veth ──  server %s\n", tb.Client.IP4, tb.Server.IP4)
	fmt.Fprintf(out, "           client %-15s            server %s\n", tb.Client.IP6, tb.Server.IP6)

	if err := ctx.Err(); err != nil {
		return err
	}
	m.nsd, err = tb.StartNSD(testbed.NSDOptions{})
	if err != nil {
		return err
	}
	m.server[false], m.server[true] = m.nsd.Addr4, m.nsd.Addr6
	fmt.Fprintf(out, "  NSD      pid %d serves %s on port 53\n", m.nsd.PID(), m.nsd.Zone.Origin)

	socks, err := sockets.FindUDPSockets(m.nsd.PID(), 53)
	if err != nil {
		return err
	}
	cleanups = append(cleanups, func() error { return sockets.CloseAll(socks) })
	var found []string
	for _, s := range socks {
		for v6, a := range m.server {
			if s.Local == a {
				m.cookie[v6] = s.Cookie
			}
		}
		found = append(found, fmt.Sprintf("%v (cookie %#x)", s.Local, s.Cookie))
	}
	if len(m.cookie) != 2 {
		return fmt.Errorf("NSD's UDP sockets: found %v, want %v and %v", found, m.nsd.Addr4, m.nsd.Addr6)
	}
	fmt.Fprintf(out, "  sockets  NSD's, taken with pidfd_getfd: %s\n", strings.Join(found, ", "))

	m.d, err = dataplane.Load(dataplane.Config{})
	if err != nil {
		return err
	}
	cleanups = append(cleanups, m.d.Close)
	var att *dataplane.Attachment
	if err := tb.Server.Do(func() error {
		var err error
		att, err = m.d.Attach(tb.Server.Dev, dataplane.AttachAuto)
		return err
	}); err != nil {
		return err
	}
	cleanups = append(cleanups, att.Close)
	mode := "native"
	if !att.Native {
		mode = "generic"
	}
	fmt.Fprintf(out, "  Santa    XDP rule processor on %s (%s mode)\n", tb.Server.Dev, mode)
	for _, c := range m.cookie {
		if err := m.d.Bind(c, dataplane.SampleOptions{}); err != nil {
			return err
		}
	}

	// Rules: the exact bytes dig sends, and NSD's own reply to them.
	fmt.Fprintln(out)
	fmt.Fprintln(out, "Rules (condition: dig's query after the ID; reply: NSD's answer, ID copied):")
	for _, q := range offload {
		query, err := m.recordDig(q)
		if err != nil {
			return err
		}
		for _, v6 := range []bool{false, true} {
			rule, reply, err := m.ask(v6, query)
			if err != nil {
				return err
			}
			ids, err := m.d.AddRules(m.cookie[v6], []dataplane.Rule{rule})
			if err != nil {
				return err
			}
			m.rules[v6][q] = ids[0]
			m.names[ids[0]] = fmt.Sprintf("%-22s %s", q, family(v6))
			fmt.Fprintf(out, "  rule %d  %-22s %s  %d-byte query → %d-byte reply\n", ids[0], q, family(v6), len(query), len(reply))
		}
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

	m.printCounters()
	return nil
}

func preflight() error {
	if os.Geteuid() != 0 {
		return errors.New("must run as root (network namespaces, XDP, pidfd_getfd); try: sudo make demo")
	}
	var missing []string
	for _, tool := range []string{testbed.NSDPath, testbed.NSDCheckconfPath, "dig", "ip"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("missing %s: run scripts/install-deps.sh (packages nsd, dnsutils, iproute2)", strings.Join(missing, ", "))
	}
	return nil
}

func family(v6 bool) string {
	if v6 {
		return "IPv6"
	}
	return "IPv4"
}

// recordDig learns the exact bytes dig sends for q: dig asks a socket on
// the client namespace's loopback, which answers REFUSED.
func (m *demo) recordDig(q question) ([]byte, error) {
	pc, err := m.tb.Client.ListenUDP(netip.MustParseAddrPort("127.0.0.1:0"))
	if err != nil {
		return nil, err
	}
	defer pc.Close()
	query, err := dnsrule.RecordQuery(pc, 5*time.Second, func(srv netip.AddrPort) error {
		_, err := m.digRun(srv, q)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("record dig's query for %v: %w", q, err)
	}
	return query, nil
}

// ask sends query to NSD from the client namespace and builds the rule.
func (m *demo) ask(v6 bool, query []byte) (dataplane.Rule, []byte, error) {
	c, err := m.tb.DialUDP(m.server[v6])
	if err != nil {
		return dataplane.Rule{}, nil, err
	}
	defer c.Close()
	return dnsrule.FromServer(c, query, 2*time.Second)
}

func (m *demo) digArgs(srv netip.AddrPort, q question) []string {
	return dnsrule.DigArgs(srv, q.name, q.qtype, digDisplay...)
}

// digRun runs dig in the client namespace; the output comes back also
// when dig fails (a timeout).
func (m *demo) digRun(srv netip.AddrPort, q question) (string, error) {
	if err := m.ctx.Err(); err != nil {
		return "", err
	}
	ctx, cancel := context.WithTimeout(m.ctx, 10*time.Second)
	defer cancel()
	cmd := testbed.Command(ctx, m.tb.Client.NS, "dig", m.digArgs(srv, q)...)
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

type snapshot struct {
	c    map[string]uint64
	hits map[dataplane.RuleID]uint64
}

func (m *demo) snapshot() (snapshot, error) {
	c, err := m.d.Counters()
	if err != nil {
		return snapshot{}, err
	}
	s := snapshot{c: dataplane.CounterNames(c), hits: map[dataplane.RuleID]uint64{}}
	for _, cookie := range m.cookie {
		st, err := m.d.RuleStats(cookie)
		if err != nil {
			return snapshot{}, err
		}
		for id, r := range st {
			s.hits[id] = r.Hits
		}
	}
	return s, nil
}

// digCompare runs dig for q over one family and works out who answered
// from Santa's counters.
func (m *demo) digCompare(q question, v6 bool) (digResult, error) {
	srv := m.server[v6]
	r := digResult{command: "$ dig " + strings.Join(m.digArgs(srv, q), " ")}
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
	r.by, r.evidence = attribute(before, after, m.rules[v6][q])
	return r, nil
}

// attribute says who answered, from what moved between two snapshots.
func attribute(before, after snapshot, rule dataplane.RuleID) (by, evidence string) {
	answered := after.c["answered"] - before.c["answered"]
	passed := after.c["pass_no_match"] - before.c["pass_no_match"]
	if rule != 0 && after.hits[rule] > before.hits[rule] {
		return "Santa, in the kernel (XDP)",
			fmt.Sprintf("rule %d hits %d → %d", rule, before.hits[rule], after.hits[rule])
	}
	if passed > 0 && answered == 0 {
		return "NSD (no rule matched, passed on)",
			fmt.Sprintf("pass_no_match %d → %d", before.c["pass_no_match"], after.c["pass_no_match"])
	}
	return "unclear", fmt.Sprintf("answered +%d, pass_no_match +%d", answered, passed)
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
		}
	}
	cont()
	fmt.Fprintln(m.out, "NSD resumed (SIGCONT).")
	return nil
}

func (m *demo) printCounters() {
	fmt.Fprintln(m.out)
	c, err := m.d.Counters()
	if err != nil {
		fmt.Fprintf(m.out, "counters: %v\n", err)
		return
	}
	names := dataplane.CounterNames(c)
	var keys []string
	for k, v := range names {
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
		parts = append(parts, fmt.Sprintf("%s %d", k, names[k]))
	}
	fmt.Fprintf(m.out, "Santa's counters (all CPUs): %s\n", strings.Join(parts, ", "))
	fmt.Fprintln(m.out, "Per rule:")
	var ids []dataplane.RuleID
	stats := map[dataplane.RuleID]dataplane.RuleStats{}
	for _, cookie := range m.cookie {
		st, err := m.d.RuleStats(cookie)
		if err != nil {
			continue
		}
		for id, s := range st {
			ids = append(ids, id)
			stats[id] = s
		}
	}
	slices.Sort(ids)
	for _, id := range ids {
		hits := "hits"
		if stats[id].Hits == 1 {
			hits = "hit "
		}
		fmt.Fprintf(m.out, "  rule %d  %s  %3d %s  %5d bytes sent\n", id, m.names[id], stats[id].Hits, hits, stats[id].Bytes)
	}
	fmt.Fprintln(m.out, "(the other pass reasons count frames that are not DNS queries: IPv6 multicast, ICMP)")
}
