package httpctl

// The controller against a real santad (and the `santa http` command):
// it attaches to nginx's listening sockets, installs exact-request rules,
// rewrites their Dates, rebuilds them when a file changes and removes them
// on exit. Miss samples are fed to it directly: the TCP data path that
// would sample misses, and answer with the rules, is tested with it.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// bin holds santad and santa, built once for the package.
var bin string

func TestMain(m *testing.M) {
	os.Exit(testbed.MainWithSanta(m, "../..", "namespaces, XDP, nginx", &bin))
}

// santadRig is nginx and santad in the server namespace of a testbed.
type santadRig struct {
	tb     *testbed.Testbed
	ng     *testbed.Nginx
	santad *testbed.Santad
}

func newSantadRig(t *testing.T, files map[string][]byte) *santadRig {
	tb := testbed.New(t)
	ng, err := tb.StartNginx(testbed.NginxOptions{Port: testPort, IPv6: true, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	sd := tb.StartSantad(t, bin, "/sys/fs/bpf/santa-httpctl-"+tb.ID, map[string]func() string{"nginx error log": ng.Log})
	return &santadRig{tb: tb, ng: ng, santad: sd}
}

func TestRunWithSantad(t *testing.T) {
	r := newSantadRig(t, map[string][]byte{"a.txt": smallFile})
	ready := make(chan Report, 1)
	c, err := New(Config{Socket: r.santad.Socket, Port: testPort, Root: r.ng.Root, MinSamples: 1, DateRefresh: 1000,
		Log:   slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug})),
		Ready: func(rep Report) { ready <- rep }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.tb.Server.Do(func() error { return c.Run(ctx) }) }()
	select {
	case rep := <-ready:
		if rep.Sockets != 2 {
			t.Errorf("attached to %d sockets, want nginx's two listeners (IPv4, IPv6)", rep.Sockets)
		}
	case err := <-errc:
		t.Fatalf("Run: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("not ready within 20 s")
	}
	client, err := santa.Dial(r.santad.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	v4 := c.groups[0].cookies[0] // groups are set before Ready
	if c.groups[0].family != 4 {
		v4 = c.groups[1].cookies[0]
	}
	rules := func() []api.Rule {
		rs, err := client.ListRules(santa.Cookie(v4))
		if err != nil {
			t.Fatal(err)
		}
		return rs
	}
	wait := func(what string, ok func([]api.Rule) bool) []api.Rule {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for {
			rs := rules()
			if ok(rs) {
				return rs
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: rules %+v", what, rs)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	reqs := []string{get("/a.txt"), "GET /a.txt HTTP/1.0\r\n\r\n"}
	for _, q := range reqs {
		c.samples <- sample{v4, []byte(q), len(q)}
	}
	rs := wait("learned", func(rs []api.Rule) bool { return len(rs) == 2 })
	for _, rule := range rs {
		req := string(rule.Conditions[0].Pattern)
		tpl := rule.Processors[0].Template
		if rule.MinLen != uint32(len(req)) || rule.MaxLen != rule.MinLen || rule.Close != strings.HasSuffix(req, "HTTP/1.0\r\n\r\n") ||
			!bytes.HasSuffix(tpl, smallFile) || rule.ReplyLen != uint32(len(tpl)) {
			t.Errorf("rule for %q: %+v", req, rule)
		}
	}
	wait("Date rewritten", func(now []api.Rule) bool {
		return len(now) == 2 && now[0].Version > 1 && len(now[0].Processors[0].Template) == len(rs[0].Processors[0].Template)
	})
	if err := os.WriteFile(filepath.Join(r.ng.Root, "a.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	wait("rebuilt after a change", func(rs []api.Rule) bool {
		return len(rs) == 2 && bytes.HasSuffix(rs[0].Processors[0].Template, []byte("\r\n\r\nchanged")) &&
			bytes.HasSuffix(rs[1].Processors[0].Template, []byte("\r\n\r\nchanged"))
	})
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("Run: %v", err)
	}
	socks, err := client.ListSockets()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range socks {
		if s.Rules > 0 || s.Cookie == v4 {
			t.Errorf("after the controller stopped: socket %d with %d rules", s.Cookie, s.Rules)
		}
	}
	if rep := c.Report(); rep.Installed != 4 || rep.Invalidated != 2 || rep.Removed != 2 || rep.Dated == 0 {
		t.Errorf("report %+v", rep)
	}
}

// TestCommand runs `santa http` as root runs it: ready, then done on
// SIGTERM.
func TestCommand(t *testing.T) {
	r := newSantadRig(t, map[string][]byte{"a.txt": smallFile})
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "http",
		"--port", "8080", "--root", r.ng.Root, "--path", "/a.txt")
	ctl, err := testbed.StartController(context.Background(), argv, 20*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := "ready: learning on 2 sockets of port 8080"; ctl.Ready() != want {
		t.Errorf("%q, want %q", ctl.Ready(), want)
	}
	if err := ctl.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(ctl.Output(), "done: installed 0") {
		t.Errorf("output:\n%s", ctl.Output())
	}
}

// BenchmarkDateRefresh measures what rewriting the Date of a rule costs:
// 1000 exact-request rules with 1448-byte replies on a listening socket of
// santad, all rewritten in one modify per op, once a second as the
// controller does (run it with -benchtime 10x). It reports the wall time, santad's CPU time and the growth of
// santad's journal per rule.
func BenchmarkDateRefresh(b *testing.B) {
	const n = 1000
	tb := testbed.New(b)
	dir := b.TempDir()
	sd := testbed.NewSantad(filepath.Join(bin, "santad"), tb.Server.NS, dir, "/sys/fs/bpf/santa-httpctl-"+tb.ID,
		"--interface", tb.Server.Dev)
	journal := func() int64 {
		fi, err := os.Stat(filepath.Join(dir, "state", "journal"))
		if err != nil {
			b.Fatal(err)
		}
		return fi.Size()
	}
	if err := sd.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		if err := errors.Join(sd.Stop(syscall.SIGTERM), sd.Cleanup()); err != nil {
			b.Error(err)
		}
	})
	var ln net.Listener
	err := tb.Server.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		ln, err = lc.Listen(context.Background(), "tcp", "127.0.0.1:8080")
		return err
	})
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	client, err := santa.Dial(sd.Socket)
	if err != nil {
		b.Fatal(err)
	}
	defer client.Close()
	sock := santa.Cookie(testbed.Bind(b, client, ln.(*net.TCPListener)).Cookie)
	date := time.Now().Truncate(time.Second)
	resps := make([]*response, n)
	rules := make([]api.Rule, n)
	reqs := make([][]byte, n)
	for i := range n {
		hdr := fmt.Sprintf("HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: %s\r\nContent-Type: text/html\r\nContent-Length: %%04d\r\n"+
			"Last-Modified: %s\r\nConnection: keep-alive\r\nETag: \"6b0118f2-%x\"\r\nAccept-Ranges: bytes\r\n\r\n",
			date.UTC().Format(http.TimeFormat), date.UTC().Format(http.TimeFormat), i)
		body := 1448 - len(hdr) // the %04d becomes four digits
		raw := fmt.Sprintf(hdr, body) + strings.Repeat("x", body)
		if resps[i], err = readResponse(bufio.NewReader(strings.NewReader(raw)), false, 1448); err != nil {
			b.Fatal(err)
		}
		req := fmt.Sprintf("GET /assets/file-%04d.html HTTP/1.1\r\nHost: bench.example\r\nUser-Agent: Mozilla/5.0 (X11; Linux x86_64)\r\n"+
			"Accept: text/html\r\nAccept-Encoding: gzip, deflate\r\nConnection: keep-alive\r\n\r\n", i)
		reqs[i] = []byte(req)
		rules[i] = exactRule(reqs[i], resps[i].raw, false)
	}
	ids, err := client.Add(sock, rules)
	if err != nil {
		b.Fatal(err)
	}
	cpu0, _ := testbed.ProcessRunTime(sd.PID())
	j0 := journal()
	b.ResetTimer()
	for i := range b.N {
		// once a second, as the controller: a rewritten rule's old data is
		// quarantined for a second before santad reuses it
		b.StopTimer()
		time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second)))
		b.StartTimer()
		at := date.Add(time.Duration(i+1) * time.Second)
		for k := range rules {
			rules[k] = exactRule(reqs[k], resps[k].withDate(at), false)
			rules[k].ID = ids[k]
		}
		if err := client.Modify(sock, rules); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	cpu1, _ := testbed.ProcessRunTime(sd.PID())
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/rule")
	b.ReportMetric(float64((cpu1-cpu0).Nanoseconds())/float64(b.N*n), "santad-cpu-ns/rule")
	b.ReportMetric(float64(journal()-j0)/float64(b.N*n), "journal-B/rule")
}

// TestCommandCountsFetchErrors: a request the controller cannot fetch
// from nginx (here --server names a port nobody listens on) is neither
// offloaded nor skipped; the done line (and the status line) count it as
// a failed fetch, so that an operator sees that nothing is offloaded
// because nginx cannot be asked.
func TestCommandCountsFetchErrors(t *testing.T) {
	r := newSantadRig(t, map[string][]byte{"a.txt": smallFile})
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "http",
		"--port", "8080", "--root", r.ng.Root, "--min-samples", "1", "--server", "127.0.0.1:8081", "--report", "1s")
	ctl, err := testbed.StartController(context.Background(), argv, 20*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	// each request misses (no rule), is sampled and is tried within a second
	deadline := time.Now().Add(10 * time.Second)
	for !strings.Contains(ctl.Output(), `msg="not offloaded"`) {
		if time.Now().After(deadline) {
			t.Fatalf("no fetch tried within 10 s:\n%s", ctl.Output())
		}
		if _, err := r.tb.Client.Run("curl", "-sS", "--fail", "--max-time", "5", "-o", "/dev/null", r.ng.URL4("/a.txt")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := ctl.WaitOutput("fetch_errors=1", 5*time.Second); err != nil {
		t.Errorf("status line: %v", err)
	}
	if err := ctl.Stop(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	if want := "skipped 0 (0 too big); 1 failed fetches;"; !strings.Contains(ctl.Output(), want) {
		t.Errorf("the done line lacks %q:\n%s", want, ctl.Output())
	}
}

// predecessorLeftRulesNginxHung is the scene of a takeover from a hung
// nginx: a predecessor was killed and left ten tagged rules on every
// socket of the test port, and nginx is stopped (SIGSTOP) until the test
// ends. It returns the rig, a client of its santad and the sockets.
func predecessorLeftRulesNginxHung(t *testing.T) (*santadRig, *santa.Client, []api.SocketInfo) {
	t.Helper()
	r := newSantadRig(t, map[string][]byte{"a.txt": smallFile})
	client, err := santa.Dial(r.santad.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	socks, err := client.BindPortProtocol(testPort, api.ProtocolTCP, santa.SampleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	const n = 10
	expires := uint64(time.Now().Add(time.Minute).Unix())
	for _, s := range socks {
		var rules []api.Rule
		for i := range n {
			req := fmt.Sprintf("GET /a.txt?q=%d HTTP/1.1\r\nHost: x\r\n\r\n", i)
			rule := exactRule([]byte(req), []byte("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"), false)
			rule.Tag, rule.Expires = DefaultConfig.Tag, expires
			rules = append(rules, rule)
		}
		if _, err := client.Add(santa.Cookie(s.Cookie), rules); err != nil {
			t.Fatal(err)
		}
	}
	hangNginx(t, r.ng)
	return r, client, socks
}

// tagLeft fails the test if a socket still has rules with the controller's tag.
func tagLeft(t *testing.T, client *santa.Client, socks []api.SocketInfo) {
	t.Helper()
	for _, s := range socks {
		left, _, err := client.ListPage(santa.Cookie(s.Cookie), DefaultConfig.Tag, 0, 100)
		if err != nil {
			t.Fatal(err)
		}
		if len(left) != 0 {
			t.Errorf("socket %d: %d rules with the controller's tag left behind", s.Cookie, len(left))
		}
	}
}

// TestTakeoverFromHungNginx: a controller taking over from a predecessor
// fetches each inherited rule's request from nginx again. With nginx hung,
// the first fetch runs out of --timeout and the controller stops there: the
// inherited rules go (their requests go to nginx) and it is ready after
// about one timeout, not one per rule (ten here: it said ready after 10 s).
func TestTakeoverFromHungNginx(t *testing.T) {
	r, client, socks := predecessorLeftRulesNginxHung(t)
	ready := make(chan Report, 1)
	logs := &testbed.LockedBuffer{}
	c, err := New(Config{Socket: r.santad.Socket, Port: testPort, Root: r.ng.Root, MinSamples: 1, Timeout: time.Second,
		Log:   slog.New(slog.NewTextHandler(io.MultiWriter(testWriter{t}, logs), &slog.HandlerOptions{Level: slog.LevelInfo})),
		Ready: func(rep Report) { ready <- rep }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	started := time.Now()
	go func() { errc <- r.tb.Server.Do(func() error { return c.Run(ctx) }) }()
	select {
	case <-ready:
		t.Logf("ready %v after the start", time.Since(started).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		t.Error("not ready 5 s after the start, taking over ten rules from a hung nginx with a 1-s timeout")
	}
	cancel()
	if err := <-errc; err != nil {
		t.Errorf("Run: %v", err)
	}
	if want := "nginx did not answer within --timeout"; !strings.Contains(logs.String(), want) {
		t.Errorf("no log line %q", want)
	}
	tagLeft(t, client, socks)
}

// TestStopWhileTakingOverFromHungNginx: a controller that starts takes
// over the rules a predecessor left by fetching each one's request from
// nginx again. With nginx hung (stopped with SIGSTOP here), that fetch
// waits for --timeout (30 s here); a stop (SIGTERM, the context's end)
// must not wait for it to end: the controller ends at once, leaving none
// of the rules with its tag behind, and counts no failed fetch. (It went
// on fetching, 2 s a request, 20 s for these ten, and then said it was
// ready; later it ended after the fetch in progress, 30 s here.)
func TestStopWhileTakingOverFromHungNginx(t *testing.T) {
	r, client, socks := predecessorLeftRulesNginxHung(t)
	ready := make(chan Report, 1)
	c, err := New(Config{Socket: r.santad.Socket, Port: testPort, Root: r.ng.Root, MinSamples: 1, Timeout: 30 * time.Second,
		Log:   slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Ready: func(rep Report) { ready <- rep }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	go func() { errc <- r.tb.Server.Do(func() error { return c.Run(ctx) }) }()
	deadline := time.Now().Add(10 * time.Second)
	// into the takeover: a fetch's connection is up (the kernel completes
	// the handshake for the stopped nginx), its request unanswered
	for !fetchUnderWay(t, r.tb.Server) {
		if time.Now().After(deadline) {
			t.Fatal("no fetch of the takeover within 10 s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	stopped := time.Now()
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Errorf("Run: %v", err)
		}
		t.Logf("stopped %v after it was told", time.Since(stopped).Round(time.Millisecond))
	case <-time.After(5 * time.Second):
		<-errc // the fetch times out
		t.Fatalf("the controller still ran 5 s after it was told to stop, taking over from a hung nginx (it stopped %v after)",
			time.Since(stopped).Round(time.Millisecond))
	}
	select {
	case <-ready:
		t.Error("the controller said it was ready after it was told to stop")
	default:
	}
	if n := c.Report().FetchErrors; n != 0 {
		t.Errorf("%d failed fetches counted: the stop cut the fetch short, nginx did not fail it", n)
	}
	tagLeft(t, client, socks)
}
