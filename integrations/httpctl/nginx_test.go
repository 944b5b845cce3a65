package httpctl

// Tests against a real nginx (internal/testbed's StartNginx) in the server
// namespace of a testbed: the controller fetches from it over loopback,
// and a fake santad (fakeSanta) records the rules it would install.
// End-to-end tests through santad and the TCP data path come with the
// data path.

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// rig is nginx in a testbed and a controller with a fake santad.
type rig struct {
	t  *testing.T
	tb *testbed.Testbed
	ng *testbed.Nginx
	fs *fakeSanta
	c  *Controller
}

// Sockets of the fake listeners: two reuseport members on IPv4, one on IPv6.
var fakeListeners = []api.SocketInfo{
	{Cookie: 11, Family: 4, Protocol: api.ProtocolTCP, Address: []byte{0, 0, 0, 0}, Port: 8080},
	{Cookie: 12, Family: 4, Protocol: api.ProtocolTCP, Address: []byte{0, 0, 0, 0}, Port: 8080},
	{Cookie: 21, Family: 6, Protocol: api.ProtocolTCP, Address: make([]byte, 16), Port: 8080},
}

const testPort = 8080

// nginxExtra are locations of the test server: gzip makes chunked
// responses (gzip_static sends a file's .gz instead, when there is one),
// expires and add_header make headers that change; /upstream/ is the
// test's own server's (holdingUpstream).
var nginxExtra = fmt.Sprintf(`
		gzip on; gzip_min_length 1; gzip_types text/plain; gzip_static on;
		location /rel/ { expires 1h; }
		location /mod/ { expires modified +1h; }
		location /id/ { add_header X-Request-Id $request_id; }
		location /upstream/ { proxy_pass http://127.0.0.1:%d; proxy_read_timeout 10m; }`, upstreamPort)

// upstreamPort is the port of holdingUpstream, in the server namespace.
const upstreamPort = 8081

func newRig(t *testing.T, cfg Config, files map[string][]byte) *rig {
	t.Helper()
	tb := testbed.New(t)
	ng, err := tb.StartNginx(testbed.NginxOptions{Port: testPort, IPv6: true, Files: files, ExtraConfig: nginxExtra})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Port, cfg.Root = testPort, ng.Root
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fs := newFakeSanta()
	c.attach(fs, fakeListeners)
	return &rig{t: t, tb: tb, ng: ng, fs: fs, c: c}
}

type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// do runs f in the server namespace, where nginx listens on loopback.
func (r *rig) do(f func() error) {
	r.t.Helper()
	if err := r.tb.Server.Do(f); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) fetch(req string, maxReply int) (resp *response, err error) {
	r.t.Helper()
	q, perr := parseRequest([]byte(req))
	if perr != nil {
		r.t.Fatal(perr)
	}
	r.tb.Server.Do(func() error {
		resp, err = fetch(context.Background(), netip.MustParseAddrPort(fmt.Sprintf("127.0.0.1:%d", testPort)), q, maxReply, 2*time.Second)
		return nil
	})
	return resp, err
}

// runLoop runs the controller's loop with its inotify watch of the root,
// as Run does, until the test ends.
func (r *rig) runLoop() {
	t := r.t
	t.Helper()
	w, err := watch(r.c.cfg.Root, r.c.log)
	if err != nil {
		t.Fatal(err)
	}
	r.c.w, r.c.rootID = w, idOf(r.c.cfg.Root)
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- r.tb.Server.Do(func() error { return r.c.loop(ctx, nil) }) }()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Error(err)
		}
		r.c.w.close()
	})
}

func get(path string, headers ...string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: test\r\n" + strings.Join(append(headers, ""), "\r\n") + "\r\n"
}

var smallFile = []byte(strings.Repeat("0123456789", 10))

// TestFetch fetches exact requests from nginx and checks what a rule
// would send: the exact response, its framing, and the connection
// semantics.
func TestFetch(t *testing.T) {
	r := newRig(t, Config{}, map[string][]byte{
		"small.txt": smallFile, "big.bin": bytes.Repeat([]byte{'b'}, 5000), "index.html": []byte("<p>hi</p>\n"),
	})
	for _, tc := range []struct {
		name, req string
		status    int
		body      string
		close     bool
	}{
		{name: "GET", req: get("/small.txt"), status: 200, body: string(smallFile)},
		{name: "index", req: get("/"), status: 200, body: "<p>hi</p>\n"},
		{name: "HEAD", req: "HEAD /small.txt HTTP/1.1\r\nHost: test\r\n\r\n", status: 200},
		{name: "HEAD of a big file", req: "HEAD /big.bin HTTP/1.1\r\nHost: test\r\n\r\n", status: 200},
		{name: "HTTP/1.0", req: "GET /small.txt HTTP/1.0\r\n\r\n", status: 200, body: string(smallFile), close: true},
		{name: "HTTP/1.0 keep-alive", req: "GET /small.txt HTTP/1.0\r\nConnection: keep-alive\r\n\r\n", status: 200, body: string(smallFile)},
		{name: "Connection: close", req: get("/small.txt", "Connection: close"), status: 200, body: string(smallFile), close: true},
		// nginx reads Connection its own way, and says in its response what it does
		{name: "two Connection headers, the last keep-alive", req: get("/small.txt", "Connection: close", "Connection: keep-alive"), status: 200, body: string(smallFile)},
		{name: "HTTP/1.0 keep-alive within a token", req: "GET /small.txt HTTP/1.0\r\nConnection: keep-alive-x\r\n\r\n", status: 200, body: string(smallFile)},
		{name: "Range", req: get("/small.txt", "Range: bytes=0-9"), status: 206, body: "0123456789"},
	} {
		resp, err := r.fetch(tc.req, 1448)
		if err != nil {
			t.Errorf("%s: %v", tc.name, err)
			continue
		}
		req, _ := parseRequest([]byte(tc.req))
		if resp.status != tc.status || string(resp.body) != tc.body || endsConnection(req, resp) != tc.close {
			t.Errorf("%s: status %d body %q close %v/%v, want %d %q %v", tc.name, resp.status, resp.body, req.close, resp.close, tc.status, tc.body, tc.close)
		}
		if !bytes.Equal(resp.raw[:resp.headerLen], resp.raw[:bytes.Index(resp.raw, []byte("\r\n\r\n"))+4]) {
			t.Errorf("%s: the header block ends at %d", tc.name, resp.headerLen)
		}
		if _, ok := resp.at(resp.date); !ok {
			t.Errorf("%s: no Date found in %q", tc.name, resp.raw)
		}
		// The rule: the request exactly, the response exactly, the connection semantics.
		e := &entry{req: req, resp: resp, reply: resp.raw}
		lease := time.Unix(time.Now().Unix()+60, 0)
		rule := e.rule(lease, "santa-http")
		var pat []byte
		for _, c := range rule.Conditions {
			pat = append(pat, c.Pattern...)
		}
		if string(pat) != tc.req || rule.MinLen != uint32(len(tc.req)) || rule.MaxLen != rule.MinLen ||
			!bytes.Equal(rule.Processors[0].Template, resp.raw) || rule.Close != tc.close || rule.Expires != uint64(lease.Unix()) || rule.Tag != "santa-http" {
			t.Errorf("%s: rule %+v", tc.name, rule)
		}
	}

	// A conditional request with the current validator: 304, no body.
	resp, err := r.fetch(get("/small.txt"), 1448)
	if err != nil {
		t.Fatal(err)
	}
	resp, err = r.fetch(get("/small.txt", "If-None-Match: "+resp.etag), 1448)
	if err != nil || resp.status != 304 || len(resp.body) != 0 {
		t.Errorf("If-None-Match: %v, %+v", err, resp)
	}

	for _, tc := range []struct {
		name, req, refused string
		maxReply           int
	}{
		{"404", get("/nothing"), "status 404", 1448},
		{"directory without /", get("/rel"), "status 404", 1448},
		{"too big", get("/big.bin"), "too big", 1448},
		{"just too big", get("/small.txt"), "too big", 100},
		{"chunked", get("/small.txt", "Accept-Encoding: gzip"), "Transfer-Encoding", 1448},
	} {
		_, err := r.fetch(tc.req, tc.maxReply)
		if !isNotOffloadable(err) || !strings.Contains(err.Error(), tc.refused) {
			t.Errorf("%s: %v, want a refusal saying %q", tc.name, err, tc.refused)
		}
	}
}

// TestDateModel checks the Date rewrite against nginx: a reply rewritten
// to the Date of a later response is that response, byte for byte, also
// with `expires 1h`; with `expires modified` (whose max-age counts down)
// it is not, and re-validation stops offloading it.
func TestDateModel(t *testing.T) {
	r := newRig(t, Config{DateRefresh: 1000}, map[string][]byte{"small.txt": smallFile, "rel/a.txt": smallFile, "mod/a.txt": smallFile})
	var first []*response
	reqs := []string{get("/small.txt"), get("/rel/a.txt"), get("/mod/a.txt")}
	for _, req := range reqs {
		resp, err := r.fetch(req, 1448)
		if err != nil {
			t.Fatal(err)
		}
		first = append(first, resp)
	}
	if !first[1].relativeExpires() {
		t.Fatalf("expires 1h: Expires does not move with the Date in %q", first[1].raw)
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1100 * time.Millisecond)))
	for i, req := range reqs[:2] {
		later, err := r.fetch(req, 1448)
		if err != nil {
			t.Fatal(err)
		}
		d, _ := later.at(later.date)
		if got := first[i].withDate(d); !bytes.Equal(got, later.raw) {
			t.Errorf("%q: rewritten\n%q\nnginx\n%q", req, got, later.raw)
		}
	}

	// The controller: learn all three, rewrite their Dates, re-validate.
	// (Early in a second: the two fetches of /mod/ must see the same
	// second, or its max-age differs.)
	for _, req := range reqs {
		for range r.c.cfg.MinSamples {
			r.c.sample(11, []byte(req), len(req))
		}
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(time.Second + 10*time.Millisecond)))
	now := time.Now()
	r.do(func() error { return r.c.learn(now) })
	if n := len(r.c.entries); n != 3 {
		t.Fatalf("%d requests offloaded, want 3", n)
	}
	before := r.fs.snapshot()
	for id, rule := range before { // leased for Lease, to the second
		if end := time.Unix(int64(rule.Expires), 0); end.Before(now.Add(r.c.cfg.Lease)) || end.After(now.Add(r.c.cfg.Lease+2*time.Second)) {
			t.Errorf("rule %d expires at %v, want %v after %v", id, end, r.c.cfg.Lease, now)
		}
	}
	sec := now.Truncate(time.Second).Add(time.Second)
	if err := r.c.refresh(sec); err != nil {
		t.Fatal(err)
	}
	after := r.fs.snapshot()
	if rep := r.c.Report(); rep.Dated != 6 || rep.Renewed != 0 { // three requests on two IPv4 sockets
		t.Errorf("%d rules dated and %d renewed, want 6 and 0", rep.Dated, rep.Renewed)
	}
	// With half the lease left every rule is renewed, whatever the Date budget.
	r.c.cfg.DateRefresh = 1
	if err := r.c.refresh(sec.Add(r.c.cfg.Lease/2 + time.Second)); err != nil {
		t.Fatal(err)
	}
	r.c.cfg.DateRefresh = DefaultConfig.DateRefresh
	if rep := r.c.Report(); rep.Renewed != 6 {
		t.Errorf("%d rules renewed with half the lease left, want 6", rep.Renewed)
	}
	for id, rule := range r.fs.snapshot() {
		if rule.Expires < after[id].Expires {
			t.Errorf("rule %d: renewed to expire at %d, before %d", id, rule.Expires, after[id].Expires)
		}
	}
	for id, rule := range after {
		old, tpl := before[id].Processors[0].Template, rule.Processors[0].Template
		if len(old) != len(tpl) || !bytes.Contains(tpl, []byte("Date: "+sec.UTC().Format(http.TimeFormat))) {
			t.Errorf("rule %d: reply after the Date rewrite:\n%q\nbefore:\n%q", id, tpl, old)
		}
	}
	for _, e := range r.c.entries {
		e.checked = time.Time{}
	}
	time.Sleep(time.Until(sec.Add(100 * time.Millisecond))) // nginx's clock must have moved on too
	// A second re-validates a share of the rules (here one) each time.
	for range 3 {
		r.do(func() error { return r.c.revalidate(time.Now()) })
	}
	if len(r.c.entries) != 2 || r.c.entries[entryKey(r.c.groups[0], []byte(reqs[2]))] != nil {
		t.Errorf("after re-validation %d requests offloaded, want the two without expires modified", len(r.c.entries))
	}
	if rep := r.c.Report(); rep.Removed != 1 || rep.Changed != 0 {
		t.Errorf("re-validation: %+v", rep)
	}
}

// TestLearn feeds miss samples to the learner: a request sampled often
// enough is offloaded on every socket of its group, and nothing else is.
func TestLearn(t *testing.T) {
	files := map[string][]byte{"a.txt": smallFile, "b.txt": smallFile, "big.bin": bytes.Repeat([]byte{'b'}, 20000), "id/x": smallFile}
	r := newRig(t, Config{MinSamples: 3, MaxRules: 3}, files)
	feed := func(cookie uint64, req string, n int) {
		for range n {
			r.c.sample(cookie, []byte(req), len(req))
		}
	}
	hot := get("/a.txt", "Accept: */*")
	feed(11, hot, 2)
	feed(12, hot, 2)             // another member of the same group: one request
	feed(11, get("/b.txt"), 1)   // not hot enough
	feed(11, get("/big.bin"), 5) // too big
	feed(11, get("/nothing"), 5) // 404
	feed(11, get("/id/x"), 5)    // a different response to every request
	feed(11, "POST /a.txt HTTP/1.1\r\nHost: test\r\n\r\n", 5)
	feed(99, hot, 5) // not a listening socket of the controller
	incomplete := get("/a.txt", "X-Long: 1")
	for range 5 {
		r.c.sample(11, []byte(incomplete), len(incomplete)+1000) // the sample is a prefix of a longer request
	}
	now := time.Now()
	r.do(func() error { return r.c.learn(now) })
	rules := r.fs.snapshot()
	if len(r.c.entries) != 1 || len(rules) != 2 {
		t.Fatalf("%d requests, %d rules offloaded, want one request on the two IPv4 sockets", len(r.c.entries), len(rules))
	}
	for _, cookie := range []uint64{11, 12} {
		if got := r.fs.rulesOf(cookie); len(got) != 1 || string(got[0].Conditions[0].Pattern) != hot {
			t.Errorf("socket %d: %d rules", cookie, len(got))
		}
	}
	rep := r.c.Report()
	if rep.Installed != 1 || rep.TooBig != 1 || rep.Skipped != 3 || rep.Ignored != 10 {
		t.Errorf("report %+v, want 1 installed, 3 skipped (1 too big), 10 ignored", rep)
	}
	// Refused requests are not fetched again before retryRefused.
	feed(11, get("/big.bin"), 5)
	r.do(func() error { return r.c.learn(now.Add(time.Second)) })
	if rep := r.c.Report(); rep.TooBig != 1 {
		t.Errorf("a refused request was tried again at once (%d too big)", rep.TooBig)
	}

	// The same request on the IPv6 socket is a request of its group.
	feed(21, hot, 6)
	// MaxRules: of three more hot requests, one fits.
	feed(11, get("/b.txt"), 4)
	feed(11, get("/a.txt", "Accept: text/plain"), 4)
	r.do(func() error { return r.c.learn(now.Add(2 * time.Second)) })
	if len(r.c.entries) != 3 {
		t.Errorf("%d requests offloaded, want MaxRules = 3", len(r.c.entries))
	}
	if len(r.fs.rulesOf(21)) != 1 {
		t.Errorf("the IPv6 socket has %d rules, want 1", len(r.fs.rulesOf(21)))
	}

	// --path: only the paths given.
	r2 := newRig(t, Config{MinSamples: 1, Paths: []string{"/b.txt"}}, files)
	r2.c.sample(11, []byte(hot), len(hot))
	b := get("/b.txt")
	r2.c.sample(11, []byte(b), len(b))
	r2.do(func() error { return r2.c.learn(time.Now()) })
	if len(r2.c.entries) != 1 || r2.c.entries[entryKey(r2.c.groups[0], []byte(b))] == nil {
		t.Errorf("with --path /b.txt: %d requests offloaded", len(r2.c.entries))
	}
}

// TestRootMismatchWarns: a --root that lacks the files nginx serves (not
// nginx's document root) draws one warning, naming the first such file;
// with nginx's root there is none.
func TestRootMismatchWarns(t *testing.T) {
	files := map[string][]byte{"a.txt": smallFile, "b.txt": smallFile}
	const warning = "nginx serves a file that --root lacks"
	for _, wrongRoot := range []bool{false, true} {
		var logs testbed.LockedBuffer
		log := slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testWriter{t}), nil))
		r := newRig(t, Config{MinSamples: 1, Log: log}, files)
		if wrongRoot {
			r.c.cfg.Root = t.TempDir()
		}
		for _, req := range []string{get("/a.txt"), get("/b.txt")} {
			r.c.sample(11, []byte(req), len(req))
		}
		r.do(func() error { return r.c.learn(time.Now()) })
		if len(r.c.entries) != 2 {
			t.Fatalf("%d requests offloaded, want 2", len(r.c.entries))
		}
		want := 0
		if wrongRoot {
			want = 1
		}
		if n := strings.Count(logs.String(), warning); n != want {
			t.Errorf("root %s (nginx's: %s): %d warnings, want %d:\n%s", r.c.cfg.Root, r.ng.Root, n, want, logs.String())
		}
		if wrongRoot && !strings.Contains(logs.String(), "missing="+filepath.Join(r.c.cfg.Root, "a.txt")) &&
			!strings.Contains(logs.String(), "missing="+filepath.Join(r.c.cfg.Root, "b.txt")) {
			t.Errorf("the warning does not name the missing file:\n%s", logs.String())
		}
	}
}

// TestChangeWhileNginxHung: a change on disk deletes its rules at once
// while nginx is hung (SIGSTOP), and nothing is refused for the fetch
// under way, here a re-validation waiting out --timeout, which the change
// cuts short. The loop used to wait the whole timeout, and the kernel
// answered the old file meanwhile. (nginx, once resumed, answers that
// fetch too: TestChangeFreesTheFetchWorker checks the cut short.)
func TestChangeWhileNginxHung(t *testing.T) {
	r := newRig(t, Config{MinSamples: 1, Idle: 0, Interval: time.Second, Timeout: time.Minute}, map[string][]byte{"a.txt": smallFile})
	r.runLoop()
	req := get("/a.txt")
	within := func(what string, d time.Duration, ok func(reply string) bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for {
			reply := ""
			if rs := r.fs.rulesOf(11); len(rs) == 1 {
				reply = string(rs[0].Processors[0].Template)
			}
			if ok(reply) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within %v (reply %q)", what, d, reply)
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	r.c.samples <- sample{11, []byte(req), len(req)}
	within("learned", 5*time.Second, func(reply string) bool { return strings.HasSuffix(reply, string(smallFile)) })

	resume := hangNginx(t, r.ng)
	time.Sleep(1500 * time.Millisecond) // a re-validation (every second here) waits for nginx
	if err := os.WriteFile(filepath.Join(r.ng.Root, "a.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	within("the rule deleted after the change, nginx hung", time.Second, func(reply string) bool { return reply == "" })

	resume()
	within("offloaded again with the new file", 5*time.Second, func(reply string) bool { return strings.HasSuffix(reply, "\r\n\r\nchanged") })
	if rep := r.c.Report(); rep.Skipped != 0 || rep.FetchErrors != 0 {
		t.Errorf("a fetch cut short by the change counted as nginx's failure: %+v", rep)
	}
}

// TestChangeFreesTheFetchWorker: a change on disk cuts short the fetch
// under way of the changed file, here one nginx does not answer (its
// upstream holds the request, and --timeout is 1 min), so that the fetch
// worker goes on: once the upstream answers again, another request is
// fetched and offloaded within seconds. Without the cut short, the worker
// waits out the timeout, whatever the loop does meanwhile.
func TestChangeFreesTheFetchWorker(t *testing.T) {
	r := newRig(t, Config{MinSamples: 1, Idle: 0, Interval: time.Second, Timeout: time.Minute},
		map[string][]byte{"upstream/a.txt": []byte("on disk"), "b.txt": smallFile})
	held, release := holdingUpstream(t, r.tb.Server)
	r.runLoop()
	hung := get("/upstream/a.txt")
	r.c.samples <- sample{11, []byte(hung), len(hung)}
	select {
	case <-held:
	case <-time.After(5 * time.Second):
		t.Fatal("the controller's fetch of /upstream/a.txt did not reach the upstream within 5 s")
	}
	if err := os.WriteFile(filepath.Join(r.ng.Root, "upstream", "a.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	release()
	other := get("/b.txt")
	r.c.samples <- sample{11, []byte(other), len(other)}
	deadline := time.Now().Add(5 * time.Second)
	for !slices.ContainsFunc(r.fs.rulesOf(11), func(x api.Rule) bool { return bytes.HasSuffix(x.Processors[0].Template, smallFile) }) {
		if time.Now().After(deadline) {
			t.Fatal("/b.txt not offloaded within 5 s of the change: the fetch of the changed file still holds the fetch worker")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// holdingUpstream is a server for nginx's /upstream/ (nginxExtra) in the
// server namespace: it holds every connection it accepts, never
// answering, until release, and tells held of each; after release it
// answers every new one at once with "upstream". The held connections
// stay held until the test ends.
func holdingUpstream(t *testing.T, server testbed.Side) (held <-chan struct{}, release func()) {
	t.Helper()
	var ln net.Listener
	if err := server.Do(func() (err error) {
		ln, err = net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", upstreamPort))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	heldc, released, done := make(chan struct{}, 1), make(chan struct{}), make(chan struct{})
	var holding []net.Conn
	go func() {
		defer close(done)
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			select {
			case <-released:
				go answerUpstream(conn)
			default:
				holding = append(holding, conn)
				select {
				case heldc <- struct{}{}:
				default:
				}
			}
		}
	}()
	t.Cleanup(func() {
		ln.Close()
		<-done
		for _, conn := range holding {
			conn.Close()
		}
	})
	return heldc, sync.OnceFunc(func() { close(released) })
}

// answerUpstream answers the request on conn with "upstream" and closes it.
func answerUpstream(conn net.Conn) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	br := bufio.NewReader(conn)
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			return
		}
		if line == "\r\n" {
			break
		}
	}
	io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 8\r\nConnection: close\r\n\r\nupstream")
}

// hangNginx stops nginx's processes (SIGSTOP): the kernel still takes
// connections to it, and nginx answers none. resume lets it go on, as the
// test's end does (before nginx is stopped).
func hangNginx(t *testing.T, ng *testbed.Nginx) (resume func()) {
	t.Helper()
	pids, err := ng.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	hung := true
	resume = func() {
		if hung {
			for _, pid := range pids {
				syscall.Kill(pid, syscall.SIGCONT)
			}
			hung = false
		}
	}
	t.Cleanup(resume)
	for _, pid := range pids {
		syscall.Kill(pid, syscall.SIGSTOP)
	}
	return resume
}

// fetchUnderWay says a connection to nginx's port from its own network
// namespace is up: the controller's fetch (to a hung nginx, whose kernel
// completes the handshake).
func fetchUnderWay(t *testing.T, server testbed.Side) bool {
	t.Helper()
	out, err := server.Run("ss", "-Htn", "state", "established", fmt.Sprintf("( dport = :%d )", testPort))
	if err != nil {
		t.Fatalf("ss: %v: %s", err, out)
	}
	return strings.TrimSpace(out) != ""
}

// TestInvalidate runs the controller's loop with its inotify watch: a
// change of a file deletes its rules at once and installs them again with
// nginx's new response; removing the file stops the offload; a file in a
// directory created after the start is watched too.
func TestInvalidate(t *testing.T) {
	css := []byte("p { color: red }\n")
	r := newRig(t, Config{MinSamples: 1, Idle: 0, DateRefresh: 1000}, map[string][]byte{"a.txt": smallFile, "d/index.html": []byte("one"),
		"real.txt": []byte("real"), "s.css": css, "s.css.gz": gzipped(t, css), "idx.html": []byte("idx"),
		"c1.txt": []byte("c1"), "c2.txt": []byte("c2"), "e/x": nil})
	// links within the root, to a file and to a directory; an index file
	// that is a link; a link to a link
	for link, target := range map[string]string{"link.txt": "real.txt", "dl": "d", "e/index.html": "../idx.html",
		"chain.txt": "mid", "mid": "c1.txt"} {
		if err := os.Symlink(target, filepath.Join(r.ng.Root, link)); err != nil {
			t.Fatal(err)
		}
	}
	r.runLoop()
	// nginx ends the path at "#": a fragment sent by a client names a.txt too
	req, dirReq, fragReq := get("/a.txt"), get("/d/"), get("/a.txt#top")
	linkReq, dirLinkReq, gzipReq := get("/link.txt"), get("/dl/"), get("/s.css", "Accept-Encoding: gzip")
	linkIndexReq, chainReq := get("/e/"), get("/chain.txt")
	learn := func(reqs ...string) {
		for _, q := range reqs {
			r.c.samples <- sample{11, []byte(q), len(q)}
		}
	}
	reply := func(req string) string { // the reply of req's rule on socket 11, "" if none
		for _, rule := range r.fs.rulesOf(11) {
			if string(rule.Conditions[0].Pattern) == req {
				return string(rule.Processors[0].Template)
			}
		}
		return ""
	}
	waitReply := func(what, req string, ok func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for !ok(reply(req)) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: reply %q", what, reply(req))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	// learnUntil sends req as a sample again every 100 ms until its reply
	// is ok: a sample that reaches the controller before the change that
	// ends a refusal (inotify, then the watcher) is dropped, and the test
	// would not know when the change has arrived.
	learnUntil := func(what, req string, ok func(string) bool) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for next := time.Now(); !ok(reply(req)); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%s: reply %q", what, reply(req))
			}
			if time.Now().After(next) {
				learn(req)
				next = time.Now().Add(100 * time.Millisecond)
			}
		}
	}
	learn(req, dirReq, fragReq, linkReq, dirLinkReq, gzipReq, linkIndexReq, chainReq)
	waitReply("learned", req, func(s string) bool { return strings.HasSuffix(s, string(smallFile)) })
	waitReply("learned", fragReq, func(s string) bool { return strings.HasSuffix(s, string(smallFile)) })
	waitReply("learned", linkReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nreal") })
	waitReply("learned", dirLinkReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\none") })
	waitReply("learned", gzipReq, func(s string) bool { return strings.HasSuffix(s, string(gzipped(t, css))) })
	waitReply("learned", dirReq, func(s string) bool { return strings.HasSuffix(s, "one") })
	waitReply("learned", linkIndexReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nidx") })
	waitReply("learned", chainReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nc1") })

	// The Date moves on every second, the length stays.
	first := reply(req)
	waitReply("Date rewritten", req, func(s string) bool { return s != first && len(s) == len(first) })

	// A change: the rule goes at once (before nginx's new response is
	// fetched) and comes back with the new body.
	deletes := r.fs.deletes()
	if err := os.WriteFile(filepath.Join(r.ng.Root, "a.txt"), []byte("changed"), 0o644); err != nil {
		t.Fatal(err)
	}
	waitReply("after a write", req, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nchanged") })
	waitReply("after a write, with a fragment", fragReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nchanged") })
	if r.fs.deletes() == deletes {
		t.Error("the rule was not deleted before it was installed again")
	}
	// An atomic replace (rename over it), as deploy tools do.
	tmp := filepath.Join(r.ng.Root, ".a.txt.tmp")
	os.WriteFile(tmp, []byte("renamed"), 0o644)
	if err := os.Rename(tmp, filepath.Join(r.ng.Root, "a.txt")); err != nil {
		t.Fatal(err)
	}
	waitReply("after a rename", req, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nrenamed") })
	// The index file of a directory, also asked for through a link.
	os.WriteFile(filepath.Join(r.ng.Root, "d/index.html"), []byte("two"), 0o644)
	waitReply("after a write of the index file", dirReq, func(s string) bool { return strings.HasSuffix(s, "two") })
	waitReply("after a write of the index file, through a link", dirLinkReq, func(s string) bool { return strings.HasSuffix(s, "two") })
	// A file a link names: inotify reports the file's name, not the link's.
	os.WriteFile(filepath.Join(r.ng.Root, "real.txt"), []byte("really"), 0o644)
	waitReply("after a write of a link's file", linkReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nreally") })
	// The file an index file that is a link names.
	os.WriteFile(filepath.Join(r.ng.Root, "idx.html"), []byte("idx2"), 0o644)
	// The link a link names, pointed elsewhere (a new link renamed over it).
	os.Symlink("c2.txt", filepath.Join(r.ng.Root, "mid.new"))
	if err := os.Rename(filepath.Join(r.ng.Root, "mid.new"), filepath.Join(r.ng.Root, "mid")); err != nil {
		t.Fatal(err)
	}
	waitReply("after a write of the file an index link names", linkIndexReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nidx2") })
	waitReply("after the link a link names was pointed elsewhere", chainReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nc2") })
	// The .gz that gzip_static sends to a client that accepts gzip.
	blue := gzipped(t, []byte("p { color: blue }\n"))
	os.WriteFile(filepath.Join(r.ng.Root, "s.css.gz.tmp"), blue, 0o644)
	if err := os.Rename(filepath.Join(r.ng.Root, "s.css.gz.tmp"), filepath.Join(r.ng.Root, "s.css.gz")); err != nil {
		t.Fatal(err)
	}
	waitReply("after a new .gz", gzipReq, func(s string) bool { return strings.HasSuffix(s, string(blue)) })
	// Removed: nginx says 404, which is not offloaded.
	os.Remove(filepath.Join(r.ng.Root, "a.txt"))
	waitReply("after a remove", req, func(s string) bool { return s == "" })
	time.Sleep(200 * time.Millisecond)
	if reply(req) != "" {
		t.Fatal("the rule of a removed file came back")
	}
	// Back: learned again, at once (the refusal ended with the change).
	// (A refusal lasts a minute; learnUntil gives up after 5 s.)
	os.WriteFile(filepath.Join(r.ng.Root, "a.txt"), []byte("back"), 0o644)
	learnUntil("re-created", req, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nback") })

	// A directory created after the start.
	newReq := get("/new/x.txt")
	if err := os.MkdirAll(filepath.Join(r.ng.Root, "new"), 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(r.ng.Root, "new/x.txt"), []byte("new"), 0o644)
	learnUntil("new directory", newReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nnew") })
	os.WriteFile(filepath.Join(r.ng.Root, "new/x.txt"), []byte("newer"), 0o644)
	waitReply("a file in a new directory", newReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nnewer") })
	// Renaming the directory removes its files; their new paths are
	// watched under the new name.
	os.MkdirAll(filepath.Join(r.ng.Root, "new/sub"), 0o755)
	time.Sleep(50 * time.Millisecond)
	os.Rename(filepath.Join(r.ng.Root, "new"), filepath.Join(r.ng.Root, "old"))
	waitReply("directory renamed", newReq, func(s string) bool { return s == "" })
	time.Sleep(50 * time.Millisecond)
	oldReq, subReq := get("/old/x.txt"), get("/old/sub/y.txt")
	os.WriteFile(filepath.Join(r.ng.Root, "old/sub/y.txt"), []byte("sub"), 0o644)
	time.Sleep(50 * time.Millisecond)
	learn(oldReq, subReq)
	waitReply("renamed directory", oldReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nnewer") })
	waitReply("renamed directory", subReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nsub") })
	os.WriteFile(filepath.Join(r.ng.Root, "old/x.txt"), []byte("older"), 0o644)
	os.WriteFile(filepath.Join(r.ng.Root, "old/sub/y.txt"), []byte("subsub"), 0o644)
	waitReply("a file in a renamed directory", oldReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nolder") })
	waitReply("a file in a subdirectory of a renamed directory", subReq, func(s string) bool { return strings.HasSuffix(s, "\r\n\r\nsubsub") })
}

// gzipped is b compressed with gzip, as a .gz for gzip_static.
func gzipped(t *testing.T, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		t.Fatal(err)
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestRevalidate changes a file behind the watch's back: re-validation
// finds the new response and rebuilds the rule in place; an unchanged
// response costs no santad request.
func TestRevalidate(t *testing.T) {
	r := newRig(t, Config{MinSamples: 1, Interval: 10 * time.Second}, map[string][]byte{"a.txt": smallFile, "b.txt": smallFile})
	for _, q := range []string{get("/a.txt"), get("/b.txt")} {
		r.c.sample(11, []byte(q), len(q))
	}
	now := time.Now()
	r.do(func() error { return r.c.learn(now) })
	if len(r.c.entries) != 2 {
		t.Fatalf("%d requests offloaded", len(r.c.entries))
	}
	// Re-validation is spread: a second re-validates the share of the
	// rules one second of the interval holds (here one).
	revalidate := func(at time.Duration) {
		for i := range 2 {
			r.do(func() error { return r.c.revalidate(now.Add(at + time.Duration(i)*time.Second)) })
		}
	}
	ops := r.fs.ops()
	revalidate(10 * time.Second)
	if r.fs.ops() != ops {
		t.Errorf("re-validating unchanged responses changed rules")
	}
	if err := os.WriteFile(filepath.Join(r.ng.Root, "a.txt"), []byte("changed behind the watch"), 0o644); err != nil {
		t.Fatal(err)
	}
	revalidate(20 * time.Second)
	if rep := r.c.Report(); rep.Changed != 1 {
		t.Errorf("report %+v, want 1 changed", rep)
	}
	for _, rule := range r.fs.rulesOf(11) {
		tpl := string(rule.Processors[0].Template)
		if strings.Contains(string(rule.Conditions[0].Pattern), "/a.txt") != strings.HasSuffix(tpl, "behind the watch") {
			t.Errorf("rule %d: %q", rule.ID, tpl)
		}
	}

	// A link outside the root, which inotify does not watch, pointed at
	// another file of the root: re-validation rebuilds the rule, and from
	// then on a write of the new file counts for it.
	out := t.TempDir()
	os.WriteFile(filepath.Join(r.ng.Root, "c1.txt"), []byte("c1"), 0o644)
	os.WriteFile(filepath.Join(r.ng.Root, "c2.txt"), []byte("c2"), 0o644)
	os.Symlink(filepath.Join(r.ng.Root, "c1.txt"), filepath.Join(out, "l"))
	os.Symlink(filepath.Join(out, "l"), filepath.Join(r.ng.Root, "c.txt"))
	q := get("/c.txt")
	r.c.sample(11, []byte(q), len(q))
	r.do(func() error { return r.c.learn(now.Add(20 * time.Second)) })
	e := r.c.entries[entryKey(r.c.groups[0], []byte(q))]
	if e == nil {
		t.Fatal("/c.txt not offloaded")
	}
	os.Remove(filepath.Join(out, "l"))
	os.Symlink(filepath.Join(r.ng.Root, "c2.txt"), filepath.Join(out, "l"))
	e.checked = now // due before the others
	r.do(func() error { return r.c.revalidate(now.Add(40 * time.Second)) })
	if !strings.HasSuffix(string(e.reply), "\r\n\r\nc2") {
		t.Fatalf("after the outer link was pointed elsewhere: reply %q", e.reply)
	}
	if !affects(filepath.Join(r.ng.Root, "c2.txt"), e.sources, e.dir) {
		t.Errorf("a write of c2.txt does not count for /c.txt once it is served: sources %q", e.sources)
	}
}

// TestRevalidateServerByAddress: a reload that gives an address of the
// wildcard socket a server block of its own (a `listen ADDR:PORT` shares
// that socket) changes nothing over loopback, where responses are
// fetched, but the rule would answer that address's clients with the
// other server's response: re-validation asks over that address too and
// removes the rule.
func TestRevalidateServerByAddress(t *testing.T) {
	r := newRig(t, Config{MinSamples: 1, Interval: time.Second}, map[string][]byte{"a.txt": smallFile})
	q := get("/a.txt")
	r.c.sample(11, []byte(q), len(q))
	now := time.Now()
	r.do(func() error { return r.c.learn(now) })
	if len(r.c.entries) != 1 {
		t.Fatalf("%d requests offloaded", len(r.c.entries))
	}
	conf, err := os.ReadFile(r.ng.Conf)
	if err != nil {
		t.Fatal(err)
	}
	end := bytes.LastIndexByte(conf, '}') // of the http block
	byAddr := fmt.Sprintf("\tserver { listen %v; location / { return 200 'by address\\n'; } }\n", netip.AddrPortFrom(r.tb.Server.IP4, testPort))
	if err := os.WriteFile(r.ng.Conf, append(append(conf[:end:end], byAddr...), conf[end:]...), 0o644); err != nil {
		t.Fatal(err)
	}
	old, err := r.ng.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(r.ng.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	// reloaded once the old worker is gone (until then it may answer too)
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		pids, err := r.ng.PIDs()
		if err != nil {
			t.Fatal(err)
		}
		if len(pids) == len(old) && !slices.ContainsFunc(old, func(p int) bool { return p != r.ng.PID() && slices.Contains(pids, p) }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx did not reload: pids %v, before %v", pids, old)
		}
	}
	r.do(func() error { return r.c.revalidate(now.Add(time.Second)) })
	if len(r.c.entries) != 0 || len(r.fs.rulesOf(11)) != 0 {
		t.Errorf("the rule stays after its response differs by address: %d requests, %d rules", len(r.c.entries), len(r.fs.rulesOf(11)))
	}
}

// TestSantadRefusal: a rule santad refuses is not offloaded, the others
// of its batch are.
func TestSantadRefusal(t *testing.T) {
	r := newRig(t, Config{MinSamples: 1}, map[string][]byte{"a.txt": smallFile, "b.txt": smallFile})
	r.fs.refuse = func(rule api.Rule) error {
		if bytes.Contains(rule.Conditions[0].Pattern, []byte("/b.txt")) {
			return &santa.Error{Op: api.OpAdd, Status: api.StatusInvalid, Message: "bucket chain too long"}
		}
		return nil
	}
	for _, q := range []string{get("/a.txt"), get("/b.txt")} {
		r.c.sample(11, []byte(q), len(q))
	}
	r.do(func() error { return r.c.learn(time.Now()) })
	if len(r.c.entries) != 1 || len(r.fs.snapshot()) != 2 || r.c.Report().Skipped != 1 {
		t.Errorf("%d requests, %d rules, report %+v; want /a.txt on both sockets", len(r.c.entries), len(r.fs.snapshot()), r.c.Report())
	}
	r.c.removeAll(false)
	if n := len(r.fs.snapshot()); n != 0 {
		t.Errorf("%d rules left after removeAll", n)
	}
}

// TestIdle: a rule without hits for Idle is removed, one with hits stays.
func TestIdle(t *testing.T) {
	r := newRig(t, Config{MinSamples: 1, Idle: 30 * time.Second}, map[string][]byte{"a.txt": smallFile, "b.txt": smallFile})
	for _, q := range []string{get("/a.txt"), get("/b.txt")} {
		r.c.sample(11, []byte(q), len(q))
	}
	now := time.Now()
	r.do(func() error { return r.c.learn(now) })
	hit := func(path string) {
		r.fs.mu.Lock()
		defer r.fs.mu.Unlock()
		for _, set := range r.fs.rules {
			for id, rule := range set {
				if bytes.Contains(rule.Conditions[0].Pattern, []byte(path)) {
					r.fs.hits[id]++
				}
			}
		}
	}
	hit("/a.txt")
	if err := r.c.dropIdle(now.Add(10 * time.Second)); err != nil || len(r.c.entries) != 2 {
		t.Fatalf("rules younger than Idle removed (%v): %d left", err, len(r.c.entries))
	}
	hit("/a.txt")
	if err := r.c.dropIdle(now.Add(40 * time.Second)); err != nil {
		t.Fatal(err)
	}
	if len(r.c.entries) != 1 || r.c.entries[entryKey(r.c.groups[0], []byte(get("/a.txt")))] == nil {
		t.Errorf("after the idle check: %d requests offloaded, want /a.txt", len(r.c.entries))
	}
	if n := len(r.fs.snapshot()); n != 2 {
		t.Errorf("%d rules left, want /a.txt's two", n)
	}
	if rep := r.c.Report(); rep.Removed != 1 || rep.Hits != 4 {
		t.Errorf("report %+v, want 1 removed, 4 hits", rep)
	}
	// idle in turn, /a.txt goes; its hits stay counted (the report's total
	// fell to 0, and the status line's rate wrapped around)
	if err := r.c.dropIdle(now.Add(80 * time.Second)); err != nil || len(r.c.entries) != 0 {
		t.Fatalf("after /a.txt idled (%v): %d requests offloaded, want none", err, len(r.c.entries))
	}
	if err := r.c.readHits(); err != nil {
		t.Fatal(err)
	}
	if rep := r.c.Report(); rep.Removed != 2 || rep.Hits != 4 {
		t.Errorf("report %+v, want 2 removed, 4 hits", rep)
	}
}

// fakeSanta is santad's rule store without a data plane.
type fakeSanta struct {
	mu     sync.Mutex
	next   uint64
	rules  map[uint64]map[uint64]api.Rule // cookie -> id -> rule
	nops   int
	ndel   int
	refuse func(api.Rule) error
	hits   map[uint64]uint64 // by rule id
}

func newFakeSanta() *fakeSanta {
	return &fakeSanta{next: 1, rules: map[uint64]map[uint64]api.Rule{}, hits: map[uint64]uint64{}}
}

func (f *fakeSanta) set(t santa.Target) (map[uint64]api.Rule, error) {
	var cookie uint64
	for _, s := range fakeListeners {
		if santa.Cookie(s.Cookie) == t {
			cookie = s.Cookie
		}
	}
	if cookie == 0 {
		return nil, &santa.Error{Status: api.StatusNotFound, Message: "no such socket"}
	}
	if f.rules[cookie] == nil {
		f.rules[cookie] = map[uint64]api.Rule{}
	}
	return f.rules[cookie], nil
}

func (f *fakeSanta) Add(t santa.Target, rules []api.Rule) ([]uint64, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, err := f.set(t)
	if err != nil {
		return nil, err
	}
	for _, r := range rules {
		if f.refuse != nil {
			if err := f.refuse(r); err != nil {
				return nil, err
			}
		}
	}
	f.nops++
	var ids []uint64
	for _, r := range rules {
		r.ID = f.next
		f.next++
		set[r.ID] = r
		ids = append(ids, r.ID)
	}
	return ids, nil
}

func (f *fakeSanta) Modify(t santa.Target, rules []api.Rule) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, err := f.set(t)
	if err != nil {
		return err
	}
	for _, r := range rules {
		if _, ok := set[r.ID]; !ok {
			return &santa.Error{Status: api.StatusNotFound, Message: fmt.Sprintf("no rule %d", r.ID)}
		}
	}
	f.nops++
	for _, r := range rules {
		set[r.ID] = r
	}
	return nil
}

// ListPage lists no rules: the controller only asks whether the socket
// has a rule set.
func (f *fakeSanta) ListPage(t santa.Target, tag string, after uint64, limit uint32) ([]api.Rule, bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, err := f.set(t)
	return nil, false, err
}

func (f *fakeSanta) Delete(t santa.Target, ids []uint64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, err := f.set(t)
	if err != nil {
		return err
	}
	for _, id := range ids {
		if _, ok := set[id]; !ok {
			return &santa.Error{Status: api.StatusNotFound, Message: fmt.Sprintf("no rule %d", id)}
		}
	}
	f.nops++
	f.ndel++
	for _, id := range ids {
		delete(set, id)
	}
	return nil
}

func (f *fakeSanta) Stats(t santa.Target, ids ...uint64) ([]api.RuleStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	set, err := f.set(t)
	if err != nil {
		return nil, err
	}
	var out []api.RuleStats
	for id := range set {
		out = append(out, api.RuleStats{ID: id, Hits: f.hits[id]})
	}
	return out, nil
}

// snapshot returns every rule by id.
func (f *fakeSanta) snapshot() map[uint64]api.Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[uint64]api.Rule{}
	for _, set := range f.rules {
		for id, r := range set {
			out[id] = r
		}
	}
	return out
}

func (f *fakeSanta) rulesOf(cookie uint64) []api.Rule {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []api.Rule
	for _, r := range f.rules[cookie] {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b api.Rule) int { return int(a.ID) - int(b.ID) })
	return out
}

func (f *fakeSanta) ops() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.nops
}

func (f *fakeSanta) deletes() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.ndel
}
