package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/integrations/dnsctl"
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

// runTests builds santad and the santa CLI into a temp dir on PATH, where
// the demo finds them when they are not next to its executable (the test
// binary's directory has neither).
func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "santa-demo-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, c := range []string{"santad", "santa"} {
		cmd := exec.Command("go", "build", "-buildvcs=false", "-o", filepath.Join(dir, c), "../"+c)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", c, err, out)
			return 1
		}
	}
	os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return m.Run()
}

// TestDemo runs the whole demo and checks what it tells the reader.
func TestDemo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and runs santad")
	}
	if err := preflight(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), &out, false); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []string{
		"XDP rule processor on",
		// the real controller ran, probed NSD and installed a rule per name and family
		"dns static --port 53/udp --names ",
		"ready: 4 rules on 2 sockets (0 questions not offloaded)",
		"log: probed the server: ",
		"client cookies ignored",
		"log: installed: ",
		"57-byte query, any ID, flags RD AD CD, UDP size, cookie → 123-byte reply",
		// side by side: the kernel answered the offloaded name, NSD the other
		"from      Santa, in the kernel (XDP)             │  NSD (no rule matched, passed on)",
		// the controller stopped cleanly and its rules are gone
		"done: installed 4, refreshed 0, changed 0, removed 4 rules",
		"log: removed the controller's rules: ",
		"ready cookie=",
		"(app paused: SIGSTOP to pid",
		`"Hello"  → "COMSYS"      Santa, in the kernel (XDP), rule 5 hits 0 → 1`,
		`"other"  → "app:other"   the app (no rule matched, passed on)`,
		`"stats"  → "hits=1"      the app (no rule matched, passed on)`,
		"  65534  ",
		`@0="Hello"`,
		// memcached: the real controller attached to its three UDP sockets
		"memcached static --keys ",
		"ready: 3 keys offloaded, 9 rules on 3 sockets (0 keys not offloaded)",
		"log: write tracker attached: ",
		"STORED",
		"(text protocol) → STORED",
		"(binary protocol: Increment, opcode 0x05) → 101",
		"memcached resumed (SIGCONT).",
		"log: removed the controller's rules: rules=3",
		// nginx: the real HTTP controller attached to its two listening sockets
		"http --port 80 --root ",
		"ready: learning on 2 sockets of port 80",
		"log: attached: port=80 sockets=1 family=4 fetch_from=127.0.0.1:80",
		"log: attached: port=80 sockets=1 family=6 fetch_from=[::1]:80",
		"log: removed the controller's rules: rules=4",
		"Cleaned up",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	for _, re := range []string{
		// the side by side, both families: the offloaded name's rule hit
		`(?m)^  counters  rule \d+ hits 0 → 1 +│  pass_no_match \d+ → \d+$`,
		// NSD paused: the offloaded names from their rules, the other times out
		`(?m)^  www\.example\.test A +IPv4  A 198\.18\.255\.10 \(TTL 300\) +Santa, rule \d+ hits 1 → 2$`,
		`(?m)^  www\.example\.test A +IPv6  A 198\.18\.255\.10 \(TTL 300\) +Santa, rule \d+ hits 1 → 2$`,
		`(?m)^  txt\.example\.test TXT +IPv4  TXT "hello from the testbed" \(TTL 300\) +Santa, rule \d+ hits 0 → 1$`,
		`(?m)^  txt\.example\.test TXT +IPv6  TXT "hello from the testbed" \(TTL 300\) +Santa, rule \d+ hits 0 → 1$`,
		`(?m)^  mail\.example\.test A +IPv4  no answer: timed out$`,
		`(?m)^  mail\.example\.test A +IPv6  no answer: timed out$`,
		// after the controller stopped: NSD answers
		`(?m)^  www\.example\.test A +IPv4  A 198\.18\.255\.10 \(TTL 300\) +NSD \(no socket on its port has a rule set, passed on\)`,
		// memcached answers before the controller; its rules, guarded by the key's slot and the epoch
		`(?m)^  get user:42 +IPv4  "VALUE user:42 0 12\\r\\nAda Lovelace\\r\\nEND\\r\\n" +memcached \(no socket on its port has a rule set, passed on\)`,
		`(?m)^  get user:42 +rules \d+ IPv4, \d+ IPv6, \d+ loopback +any request id → 47-byte reply; guards: key slot \d+ at v\d+, epoch at v\d+$`,
		// the kernel answers the offloaded keys with memcached's bytes, the other is memcached's
		`(?m)^  get user:42 +IPv4  "VALUE user:42 0 12\\r\\nAda Lovelace\\r\\nEND\\r\\n" += Santa, answered \d+ → \d+, rule \d+ hits 0 → 1$`,
		`(?m)^  get user:42 +IPv6  "VALUE user:42 0 12\\r\\nAda Lovelace\\r\\nEND\\r\\n" += Santa, answered \d+ → \d+, rule \d+ hits 0 → 1$`,
		`(?m)^  get visits +IPv4  "VALUE visits 0 3\\r\\n100\\r\\nEND\\r\\n" += Santa, answered \d+ → \d+, rule \d+ hits 0 → 1$`,
		`(?m)^  get session:7f3a +IPv4  "VALUE session:7f3a 0 5\\r\\nalice\\r\\nEND\\r\\n" +memcached \(no rule matched, passed on\)`,
		// after each write the rule comes back with the new value (the GET
		// right after the write is memcached's, unless a rebuild came first)
		`(?m)^  get user:42 +IPv4  "VALUE user:42 0 9\\r\\nAda Byron\\r\\nEND\\r\\n" +[= ] Santa, answered \d+ → \d+, rule \d+ hits \d+ → \d+\n  the rule is back with the new value \d+ ms after the write's reply`,
		`(?m)^  get visits +IPv4  "VALUE visits 0 3\\r\\n101\\r\\nEND\\r\\n" +[= ] Santa, answered \d+ → \d+, rule \d+ hits \d+ → \d+\n  the rule is back with the new value \d+ ms after the write's reply`,
		// memcached paused: the offloaded keys from the kernel, the other times out
		`(?m)^memcached paused \(SIGSTOP to pid \d+\); UDP GETs again:\n(  get (user:42|page:home|visits) +IPv[46]  "VALUE [^"]*" += Santa, answered \d+ → \d+, rule \d+ hits \d+ → \d+\n){4}  get session:7f3a +IPv4  no answer: timed out\n`,
		// the controller's done line: both writes seen by the tracker
		`(?m)^  done: 3 keys offloaded, \d+ rebuilt, 3 removed; \d+ slots bumped again after writes without a reply; 0 held for a delayed flush; tracker: .*\bwrites=2\b`,
		// after the controller stopped: memcached answers
		`(?m)^  get user:42 +IPv4  "VALUE user:42 0 9\\r\\nAda Byron\\r\\nEND\\r\\n" +memcached \(no socket on its port has a rule set, passed on\)`,
		`(?m)^  get visits +IPv6  "VALUE visits 0 3\\r\\n101\\r\\nEND\\r\\n" +memcached \(no socket on its port has a rule set, passed on\)`,
		// nginx answers before the controller
		`(?m)^  GET /index\.html IPv4  200 OK +205-byte body = file +nginx\n      pass_port_unbound \+\d+; access log \+1: "GET /index\.html HTTP/1\.1" 200$`,
		// each first fetch is a miss: eBPF answers the SYN and hands the connection to nginx; the controller learns the request
		`(?m)^  GET /big\.html +IPv4  200 OK +\d+-byte body = file +nginx\n      tcp_syn_answered \+1, pass_no_match \+1, miss_sampled \+1, tcp_handed_over \+1; access log \+1: "GET /big\.html HTTP/1\.1" 200\n(.*\n.*\n)*?  → rule \d+ installed \d+ ms after the fetch$`,
		// curl's exact request, nginx's response in several segments
		`(?m)^  rule \d+  IPv4  "GET /big\.html HTTP/1\.1\\r\\nHost: [\d.]+\\r\\nUser-Agent: curl/[\d.]+\\r\\nAccept: \*/\*\\r\\n\\r\\n" +\d+ B → +\d+-byte reply \([2-9] segments\)$`,
		`(?m)^  rule \d+  IPv6  "GET /index\.html HTTP/1\.1\\r\\nHost: \[[\da-f:]+\]\\r\\n[^"]*" +\d+ B → +\d+-byte reply \(1 segment\)$`,
		// eBPF answers whole connections with nginx's bytes (but the Date); nginx logs nothing
		`(?m)^  GET /index\.html IPv4  200 OK +205-byte body = file  = nginx's( but Date)? +Santa, rule \d+ hits 0 → 1\n      tcp_syn_answered \+1, answered \+1, .*tcp_fin_answered \+1; access log \+0$`,
		`(?m)^  GET /index\.html IPv6  200 OK +205-byte body = file  = nginx's( but Date)? +Santa, rule \d+ hits 0 → 1\n      tcp_syn_answered \+1, answered \+1, .*tcp_fin_answered \+1; access log \+0$`,
		`(?m)^  GET /style\.css  IPv4  200 OK +47-byte body = file  = nginx's( but Date)? +Santa, rule \d+ hits 0 → 1\n.*; access log \+0$`,
		`(?m)^  GET /big\.html   IPv4  200 OK +\d+-byte body = file  = nginx's( but Date)? +Santa, rule \d+ hits 0 → 1\n      tcp_syn_answered \+1, answered \+1, tcp_long_reply \+1, tcp_segments_sent \+[2-9], .*tcp_fin_answered \+1; access log \+0$`,
		`(?m)^  GET /about\.html IPv4  200 OK +82-byte body = file +nginx\n      tcp_syn_answered \+1, pass_no_match \+1, miss_sampled \+1, tcp_handed_over \+1; access log \+1: "GET /about\.html HTTP/1\.1" 200$`,
		// one keep-alive connection: eBPF's reply, then the handover to nginx
		`(?m)^  http://[\d.]+:80/index\.html: 200, 205-byte body, local port (\d+), new connections 1\n  http://[\d.]+:80/about\.html: 200, 82-byte body, local port \d+, new connections 0\n  bodies = files; rule \d+ hits \d+ → \d+; nginx's access log \+1: "GET /about\.html HTTP/1\.1" 200\n  .*\banswered \+1\b.*\btcp_handed_over \+1$`,
		// a change on disk: the rule goes at once, nginx serves the new file, the rule comes back with it
		`(?m)^  rule \d+ deleted \d+ ms after the rename \(inotify\)`,
		`(?m)^  GET /style\.css  IPv4  200 OK  "body \{ font-family: sans-serif; color: #c00; \}\\n" = file +nginx\n`,
		`(?m)^  GET /style\.css  IPv4  200 OK  "body \{ font-family: sans-serif; color: #c00; \}\\n" = file  = nginx's( but Date)? +Santa, rule \d+ hits 0 → 1\n.*\n  rule \d+ is back with the new content \d+ ms after the rename$`,
		// the controller stopped: its rules are gone, nginx answers
		`(?m)^  done: installed 5, invalidated 1, changed 0, removed 4 requests; `,
		`(?m)^  GET /index\.html IPv4  200 OK +205-byte body = file +nginx\n      pass_port_unbound \+\d+; access log \+1: "GET /index\.html HTTP/1\.1" 200$`,
		`(?m)^  GET /big\.html   IPv6  200 OK +\d+-byte body = file +nginx\n      pass_port_unbound \+\d+; access log \+1: "GET /big\.html HTTP/1\.1" 200$`,
	} {
		if n := len(regexp.MustCompile(re).FindAllString(s, -1)); n == 0 || (strings.Contains(re, "counters") && n != 2) {
			t.Errorf("output lacks %s (%d matches)", re, n)
		}
	}
	// and NSD's sockets have no rule set any more: only the app's is listed
	if after := s[strings.Index(s, "$ santa rules ls      (the controller"):]; strings.Contains(after, ":53/udp") {
		t.Errorf("NSD's sockets are still listed after the controller stopped")
	}
	if strings.Contains(s, "unclear") {
		t.Error("the demo could not tell who answered a request")
	}
	if strings.Contains(s, "≠") {
		t.Error("a reply differs from the file or from nginx's response")
	}
	for _, c := range []string{"tcp_handover_failed", "tcp_emit_failed", "tcp_resend", "pass_no_room"} {
		if strings.Contains(s, c+" +") {
			t.Errorf("the HTTP part moved %s", c)
		}
	}
	checkCleanedUp(t)
}

// checkCleanedUp checks that the demo left no process (santad, NSD, the
// controller, the app), no pins and no namespace behind.
func checkCleanedUp(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(bpffsPrefix + fmt.Sprint(os.Getpid())); !os.IsNotExist(err) {
		t.Errorf("santad's pins are still there after the demo (stat: %v)", err)
	}
	if left, _ := filepath.Glob(fmt.Sprintf("/run/netns/santa-%d-*", os.Getpid())); len(left) > 0 {
		t.Errorf("namespaces left after the demo: %v", left)
	}
	if left, _ := filepath.Glob(fmt.Sprintf("%s%d-*", runPrefix, os.Getpid())); len(left) > 0 {
		t.Errorf("state left after the demo: %v", left)
	}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range stats {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // exited meanwhile
		}
		// pid (comm) state ppid ...: comm may hold spaces, not ")"
		s := string(b)
		f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
		if len(f) > 1 && f[1] == fmt.Sprint(os.Getpid()) {
			t.Errorf("process left after the demo: %s", strings.TrimSpace(s[:strings.LastIndexByte(s, ')')+1]))
		}
	}
}

// A cancelled context stops the demo early, and it still cleans up.
func TestDemoInterrupted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and runs santad")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, false); err == nil {
		t.Fatalf("cancelled demo returned no error:\n%s", out.String())
	}
	if strings.Contains(out.String(), "Cleaned up") {
		t.Errorf("cancelled demo claims it ran:\n%s", out.String())
	}
	checkCleanedUp(t)
}

// Ctrl-C while the controller runs: the demo stops it, santad and NSD,
// and leaves nothing behind.
func TestDemoInterruptedWithController(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and runs santad")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOn{prefix: "  ready:", cancel: cancel}
	err := run(ctx, out, false)
	if err == nil || ctx.Err() == nil {
		t.Fatalf("demo interrupted once the controller was ready: %v (context: %v)\n%s", err, ctx.Err(), out.String())
	}
	if strings.Contains(err.Error(), "cleanup:") {
		t.Errorf("cleanup failed: %v", err)
	}
	if !strings.Contains(out.String(), "ready:") {
		t.Errorf("the controller never got ready:\n%s", out.String())
	}
	checkCleanedUp(t)
}

// Ctrl-C while memcached is paused and the memcached controller runs: the
// demo resumes memcached and stops it, the controller and santad, and
// leaves nothing behind.
func TestDemoInterruptedWhileMemcachedPaused(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and runs santad")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOn{prefix: "memcached paused", cancel: cancel}
	err := run(ctx, out, false)
	if err == nil || ctx.Err() == nil {
		t.Fatalf("demo interrupted while memcached was paused: %v (context: %v)\n%s", err, ctx.Err(), out.String())
	}
	if strings.Contains(err.Error(), "cleanup:") {
		t.Errorf("cleanup failed: %v", err)
	}
	if !strings.Contains(out.String(), "memcached paused") {
		t.Errorf("the demo never paused memcached:\n%s", out.String())
	}
	checkCleanedUp(t)
}

// Ctrl-C while the HTTP controller runs: the demo stops it, nginx and
// santad, and leaves nothing behind.
func TestDemoInterruptedWithHTTPController(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and runs santad")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	out := &cancelOn{prefix: "  ready: learning on", cancel: cancel}
	err := run(ctx, out, false)
	if err == nil || ctx.Err() == nil {
		t.Fatalf("demo interrupted once the HTTP controller was ready: %v (context: %v)\n%s", err, ctx.Err(), out.String())
	}
	if strings.Contains(err.Error(), "cleanup:") {
		t.Errorf("cleanup failed: %v", err)
	}
	if !strings.Contains(out.String(), "ready: learning on") {
		t.Errorf("the HTTP controller never got ready:\n%s", out.String())
	}
	checkCleanedUp(t)
}

// cancelOn is an output that calls cancel once a line starts with prefix.
type cancelOn struct {
	bytes.Buffer
	prefix string
	cancel func()
}

func (c *cancelOn) Write(p []byte) (int, error) {
	n, err := c.Buffer.Write(p)
	for _, l := range strings.Split(c.Buffer.String(), "\n") {
		if strings.HasPrefix(l, c.prefix) {
			c.cancel()
		}
	}
	return n, err
}

func TestParseDig(t *testing.T) {
	out := "www.example.test.\t300\tIN\tA\t198.18.255.10\ntxt.example.test. 300 IN TXT \"a b\"\n;; Query time: 0 msec\n"
	if got, want := parseDig(out), `A 198.18.255.10 (TTL 300); TXT "a b" (TTL 300)`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := parseDig(""); got != "(empty answer section)" {
		t.Errorf("empty: %q", got)
	}
}

func TestAttribute(t *testing.T) {
	snap := func(answered, nomatch, hits uint64) snapshot {
		return snapshot{c: map[string]uint64{"answered": answered, "pass_no_match": nomatch},
			hits: map[uint64]uint64{7: hits}}
	}
	if by, ev := attribute(snap(1, 1, 1), snap(2, 1, 2), 7, "NSD"); !strings.HasPrefix(by, "Santa") || ev != "rule 7 hits 1 → 2" {
		t.Errorf("rule hit: %q %q", by, ev)
	}
	if by, ev := attribute(snap(1, 1, 1), snap(1, 2, 1), 0, "the app"); by != "the app (no rule matched, passed on)" || ev != "pass_no_match 1 → 2" {
		t.Errorf("no rule: %q %q", by, ev)
	}
	if by, _ := attribute(snap(1, 1, 1), snap(2, 1, 1), 7, "NSD"); by != "unclear" {
		t.Errorf("answered by another rule: %q", by)
	}
	// memcached: a write retired the rule; before the controller, a socket santad never saw
	retired := snap(1, 1, 1)
	retired.c["pass_invalidated"] = 1
	if by, ev := attribute(snap(1, 1, 1), retired, 7, "memcached"); by != "memcached (a write retired the rule, passed on)" || ev != "pass_invalidated 0 → 1" {
		t.Errorf("retired rule: %q %q", by, ev)
	}
	unbound := snap(1, 1, 1)
	unbound.c["pass_port_unbound"] = 2
	if by, ev := attribute(snap(1, 1, 1), unbound, 0, "memcached"); by != "memcached (no socket on its port has a rule set, passed on)" || ev != "pass_port_unbound 0 → 2" {
		t.Errorf("port without rule sets: %q %q", by, ev)
	}
	unknown := snap(1, 1, 1)
	unknown.c["pass_no_socket"] = 3
	if by, ev := attribute(snap(1, 1, 1), unknown, 0, "memcached"); by != "memcached (its socket is not attached to santad, passed on)" || ev != "pass_no_socket 0 → 3" {
		t.Errorf("unknown socket: %q %q", by, ev)
	}
}

func TestFindBinary(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "santa-demo-test-tool")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	if got, err := findBinary("santa-demo-test-tool"); err != nil || got != p {
		t.Errorf("on PATH: %q, %v", got, err)
	}
	_, err := findBinary("santa-demo-no-such-tool")
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("missing: %v", err)
	}
}

func TestFindPythonClient(t *testing.T) {
	dir, err := findPythonClient()
	if err != nil {
		t.Fatal(err)
	}
	if !isFile(filepath.Join(dir, "examples", "listing1.py")) {
		t.Errorf("%s has no examples/listing1.py", dir)
	}
}

func TestLogLine(t *testing.T) {
	for in, want := range map[string]string{
		`time=2025-01-01T00:00:00.000Z level=INFO msg="probed the server" server=198.18.0.1:53 behaviour="echoes rd"`: `probed the server: server=198.18.0.1:53 behaviour="echoes rd"`,
		`time=2025-01-01T00:00:00.000Z level=INFO msg=attached server=198.18.0.1:53 sockets=1`:                        `attached: server=198.18.0.1:53 sockets=1`,
		`time=2025-01-01T00:00:00.000Z level=WARN msg=oops`:                                                           `level=WARN msg=oops`,
		`time=2025-01-01T00:00:00.000Z level=INFO msg=quiet`:                                                          `quiet`,
	} {
		if got := logLine(in); got != want {
			t.Errorf("logLine(%q) = %q, want %q", in, got, want)
		}
	}
}

// The rules the controller builds, described as the demo lists them.
func TestRuleDescription(t *testing.T) {
	m := new(dns.Msg)
	m.SetQuestion("www.example.test.", dns.TypeA)
	m.RecursionDesired, m.AuthenticatedData = true, true
	m.SetEdns0(1232, false)
	m.IsEdns0().Option = append(m.IsEdns0().Option, &dns.EDNS0_COOKIE{Code: dns.EDNS0COOKIE, Cookie: "0123456789abcdef"})
	wire, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	q, err := dnsctl.ParseQuery(wire)
	if err != nil {
		t.Fatal(err)
	}
	r := new(dns.Msg)
	r.SetReply(m)
	r.Answer = []dns.RR{&dns.A{Hdr: dns.RR_Header{Name: "www.example.test.", Rrtype: dns.TypeA, Class: dns.ClassINET, Ttl: 300}, A: []byte{198, 18, 255, 10}}}
	r.SetEdns0(1232, false)
	reply, err := r.Pack()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		b    dnsctl.Behaviour
		want string
	}{
		{dnsctl.Behaviour{Echo: 1 << 8, Ignore: 1<<5 | 1<<4, IgnoresCookie: true, IgnoresSize: true}, "ID, flags RD AD CD, UDP size, cookie"},
		{dnsctl.Behaviour{IgnoresCookie: true}, "ID, cookie"},
		{dnsctl.Behaviour{}, "ID"},
	} {
		// the controller finds the reply the same at any size only where the server ignores it
		rule := dnsctl.Rule(q, dnsctl.Answer{Reply: reply, AnySize: c.b.IgnoresSize}, c.b)
		if got := strings.Join(openParts(rule), ", "); got != c.want {
			t.Errorf("%v: open parts %q, want %q", c.b, got, c.want)
		}
		if got, ok := ruleQuestion(rule); !ok || got != (question{"www.example.test", "A"}) {
			t.Errorf("%v: question %v, %t", c.b, got, ok)
		}
	}
}

// What the HTTP part reads from curl, nginx's access log and the rules.
func TestHTTPHelpers(t *testing.T) {
	raw := []byte("HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: Sat, 21 Nov 2026 04:36:29 GMT\r\nContent-Length: 2\r\n\r\nhi")
	r, err := parseHTTP(raw)
	if err != nil {
		t.Fatal(err)
	}
	if r.status != "200 OK" || r.date != "Sat, 21 Nov 2026 04:36:29 GMT" || string(r.body) != "hi" ||
		r.withoutDate() != "HTTP/1.1 200 OK\r\nServer: nginx\r\nContent-Length: 2\r\n\r\n" {
		t.Errorf("parsed %+v, without Date %q", r, r.withoutDate())
	}
	if _, err := parseHTTP([]byte("HTTP/1.1 200 OK\r\n")); err == nil {
		t.Error("a response without the end of its header block parsed")
	}
	line := `198.18.1.2 - - [21/Nov/2026:04:36:29 +0000] "GET /about.html HTTP/1.1" 200 82 "-" "curl/7.88.1"`
	if got, want := logged(line), `"GET /about.html HTTP/1.1" 200`; got != want {
		t.Errorf("logged: %q, want %q", got, want)
	}
	req := "GET /big.html HTTP/1.1\r\nHost: x\r\n\r\n"
	rule := api.Rule{MinLen: uint32(len(req)), MaxLen: uint32(len(req)),
		Conditions: []api.Condition{{Offset: 0, Pattern: []byte(req[:20])}, {Offset: 20, Pattern: []byte(req[20:])}}}
	if got := string(httpRuleRequest(rule)); got != req {
		t.Errorf("request %q, want %q", got, req)
	}
	if got := httpRulePath(rule); got != "/big.html" {
		t.Errorf("path %q", got)
	}
}
