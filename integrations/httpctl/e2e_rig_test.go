package httpctl

// The end-to-end rig (e2e_test.go): nginx, santad attached to the server
// veth and the controller (Run) in the server namespace of a testbed, real
// clients in the client namespace, and helpers to read santad's counters
// and rules and to talk HTTP over raw TCP.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// e2eMaxReply lets the controller offload replies of up to 10 segments
// (SANTA_MAX_TCP_REPLY), the longest the TCP path sends.
const e2eMaxReply = 14480

// e2eOptions configure newE2E.
type e2eOptions struct {
	files     map[string][]byte
	root      string   // nginx's document root; "": one of the testbed's
	paths     []string // Config.Paths; nil: every path
	accessLog bool
	lease     time.Duration // Config.Lease; 0: the default
	timeout   time.Duration // Config.Timeout; 0: the default
	// nginxHTTP is NginxOptions.ExtraHTTPConfig: more of nginx's http block
	nginxHTTP string
	// impair: an impaired testbed (testbed.NewImpaired) with short TCP
	// timers; the impairment itself is set by the test (rig.link).
	impair bool
	// reuseport: nginx listens with reuseport (NginxOptions.Reuseport)
	reuseport bool
	// workers is nginx's worker_processes (0: 1); with reuseport each has
	// a listening socket of its own per address
	workers int
}

// e2eRig is nginx, santad and a running controller in a testbed.
type e2eRig struct {
	t      *testing.T
	tb     *testbed.Testbed
	link   *testbed.Link // nil unless impaired
	ng     *testbed.Nginx
	sd     *testbed.Santad
	client *santa.Client
	ctl    *Controller
	files  map[string][]byte

	cancel  context.CancelFunc
	errc    chan error
	stopped bool
}

func newE2E(t *testing.T, o e2eOptions) *e2eRig {
	t.Helper()
	r := &e2eRig{t: t, files: o.files}
	if o.impair {
		r.tb, r.link = testbed.NewImpaired(t, testbed.Options{}, testbed.ImpairOptions{Seed: 6})
		// short retransmission timeouts keep the test's duration bounded
		// (as internal/dataplane's TestTCPSocketlessLoss)
		for _, side := range []testbed.Side{r.tb.Client, r.tb.Server} {
			if _, err := side.Run("sysctl", "-q", "-w", "net.ipv4.tcp_rto_min_us=10000",
				"net.ipv4.tcp_rto_max_ms=1000", "net.ipv4.tcp_syn_linear_timeouts=20"); err != nil {
				t.Fatal(err)
			}
		}
	} else {
		r.tb = testbed.New(t)
	}
	ng, err := r.tb.StartNginx(testbed.NginxOptions{Port: testPort, IPv6: true, Root: o.root, Files: o.files, AccessLog: o.accessLog, ExtraHTTPConfig: o.nginxHTTP,
		Reuseport: o.reuseport, Workers: o.workers})
	if err != nil {
		t.Fatal(err)
	}
	r.ng = ng
	r.sd = r.tb.StartSantad(t, bin, "/sys/fs/bpf/santa-httpctl-"+r.tb.ID, map[string]func() string{"nginx error log": ng.Log})
	if r.client, err = santa.Dial(r.sd.Socket); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.client.Close() })
	r.startController(o)
	t.Cleanup(func() { r.stopController() })
	return r
}

// startController starts a controller and waits until it is ready.
func (r *e2eRig) startController(o e2eOptions) {
	t := r.t
	t.Helper()
	ready := make(chan Report, 1)
	var err error
	r.ctl, err = New(Config{Socket: r.sd.Socket, Port: testPort, Root: r.ng.Root, Paths: o.paths, MinSamples: 1,
		MaxReply: e2eMaxReply, DateRefresh: 1000, Lease: o.lease, Timeout: o.timeout,
		Log:   slog.New(slog.NewTextHandler(testWriter{t}, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Ready: func(rep Report) { ready <- rep }})
	if err != nil {
		t.Fatal(err)
	}
	var ctx context.Context
	ctx, r.cancel = context.WithCancel(context.Background())
	r.errc = make(chan error, 1)
	r.stopped = false
	go func() { r.errc <- r.tb.Server.Do(func() error { return r.ctl.Run(ctx) }) }()
	select {
	case rep := <-ready:
		want := 2 // IPv4 and IPv6
		if o.reuseport && o.workers > 1 {
			want *= o.workers
		}
		if rep.Sockets != want {
			t.Fatalf("attached to %d sockets, want nginx's %d listeners", rep.Sockets, want)
		}
	case err := <-r.errc:
		r.stopped = true
		t.Fatalf("controller: %v", err)
	case <-time.After(20 * time.Second):
		t.Fatal("controller not ready within 20 s")
	}
}

// restartSantad starts santad again (after it stopped) and connects to it.
func (r *e2eRig) restartSantad() {
	r.t.Helper()
	if err := r.sd.Start(context.Background()); err != nil {
		r.t.Fatal(err)
	}
	client, err := santa.Dial(r.sd.Socket)
	if err != nil {
		r.t.Fatal(err)
	}
	r.client.Close() // the stopped santad's
	r.client = client
}

// stopController stops the controller, which deletes its rules and
// detaches the listeners: from then on nginx answers everything.
func (r *e2eRig) stopController() {
	r.t.Helper()
	if r.stopped {
		return
	}
	r.stopped = true
	r.cancel()
	select {
	case err := <-r.errc:
		if err != nil {
			r.t.Errorf("controller: %v", err)
		}
	case <-time.After(10 * time.Second):
		r.t.Error("controller did not stop within 10 s")
	}
}

// counters are the rule processor's counters (santad's health).
func (r *e2eRig) counters() map[string]uint64 {
	r.t.Helper()
	_, c, err := r.client.Health()
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// delta is after - before for every counter that moved.
func delta(before, after map[string]uint64) map[string]uint64 {
	d := map[string]uint64{}
	for k, v := range after {
		if v != before[k] {
			d[k] = v - before[k]
		}
	}
	return d
}

// e2eRule is a rule of the controller as santad has it.
type e2eRule struct {
	cookie  uint64
	family  uint32
	id      uint64
	request string // the exact request it answers
	reply   []byte
	close   bool
	hits    uint64
}

// rules lists the rules on nginx's listening sockets, with their hits.
func (r *e2eRig) rules() []e2eRule {
	r.t.Helper()
	socks, err := r.client.ListSockets()
	if err != nil {
		r.t.Fatal(err)
	}
	var out []e2eRule
	for _, s := range socks {
		if s.Port != testPort || s.Protocol != api.ProtocolTCP {
			continue
		}
		rs, err := r.client.ListRules(santa.Cookie(s.Cookie))
		if err != nil {
			r.t.Fatal(err)
		}
		stats, err := r.client.Stats(santa.Cookie(s.Cookie))
		if err != nil {
			r.t.Fatal(err)
		}
		hits := map[uint64]uint64{}
		for _, st := range stats {
			hits[st.ID] = st.Hits
		}
		for _, rule := range rs {
			conds := slicesSortedByOffset(rule.Conditions)
			var req []byte
			for _, c := range conds {
				req = append(req, c.Pattern...)
			}
			out = append(out, e2eRule{cookie: s.Cookie, family: s.Family, id: rule.ID, request: string(req),
				reply: rule.Processors[0].Template, close: rule.Close, hits: hits[rule.ID]})
		}
	}
	return out
}

func slicesSortedByOffset(cs []api.Condition) []api.Condition {
	out := append([]api.Condition(nil), cs...)
	sort.Slice(out, func(i, j int) bool { return out[i].Offset < out[j].Offset })
	return out
}

// requestLine is the first line of a request.
func requestLine(req string) string {
	line, _, _ := strings.Cut(req, "\r\n")
	return line
}

// waitRules polls the rules until ok holds (at most 10 s: learning runs
// once a second) and returns them.
func (r *e2eRig) waitRules(what string, ok func([]e2eRule) bool) []e2eRule {
	r.t.Helper()
	rs, done := r.learnedWithin(10*time.Second, ok)
	if !done {
		var lines []string
		for _, x := range rs {
			lines = append(lines, fmt.Sprintf("IPv%d %q (%d hits)", x.family, x.request, x.hits))
		}
		r.t.Fatalf("%s: not offloaded within 10 s; rules:\n%s\ncontroller %+v; counters %v", what, strings.Join(lines, "\n"), r.ctl.Report(), r.counters())
	}
	return rs
}

// learnedWithin polls the rules until ok holds or d has passed, and
// returns them and whether ok held.
func (r *e2eRig) learnedWithin(d time.Duration, ok func([]e2eRule) bool) ([]e2eRule, bool) {
	r.t.Helper()
	deadline := time.Now().Add(d)
	for {
		rs := r.rules()
		if ok(rs) || time.Now().After(deadline) {
			return rs, ok(rs)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitLines waits until, for every request line given, a rule of the
// family answers a request with that request line.
func (r *e2eRig) waitLines(family uint32, lines ...string) []e2eRule {
	r.t.Helper()
	return r.waitRules(fmt.Sprintf("IPv%d %q", family, lines), func(rs []e2eRule) bool {
		have := map[string]bool{}
		for _, x := range rs {
			if x.family == family {
				have[requestLine(x.request)] = true
			}
		}
		for _, l := range lines {
			if !have[l] {
				return false
			}
		}
		return true
	})
}

// waitRequests waits until every exact request has a rule on IPv4.
func (r *e2eRig) waitRequests(reqs ...string) []e2eRule {
	r.t.Helper()
	return r.waitRules(fmt.Sprintf("%d exact requests", len(reqs)), func(rs []e2eRule) bool {
		have := map[string]bool{}
		for _, x := range rs {
			if x.family == 4 {
				have[x.request] = true
			}
		}
		for _, q := range reqs {
			if !have[q] {
				return false
			}
		}
		return true
	})
}

// hitsByLine sums the rules' hits by request line (IPv4 and IPv6).
func hitsByLine(rs []e2eRule) map[string]uint64 {
	m := map[string]uint64{}
	for _, x := range rs {
		m[requestLine(x.request)] += x.hits
	}
	return m
}

// curl runs curl in the client namespace with a time limit.
func (r *e2eRig) curl(args ...string) string {
	r.t.Helper()
	out, err := r.tb.Client.Run("curl", append([]string{"-sS", "--fail", "--max-time", "20"}, args...)...)
	if err != nil {
		r.t.Fatalf("curl: %v", err)
	}
	return out
}

// curlFile fetches path over IPv4 with curl into the file name under dir
// and returns the file's path.
func (r *e2eRig) curlFile(dir, name, path string) string {
	r.t.Helper()
	out := filepath.Join(dir, name)
	r.curl("-o", out, r.ng.URL4(path))
	return out
}

// checkFile fails unless the file at p holds want.
func checkFile(t *testing.T, p string, want []byte, what string) {
	t.Helper()
	got, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s: %d bytes differ from the file's %d (%.80q)", what, len(got), len(want), got)
	}
}

// dial connects to addr from the client namespace, with plain TCP.
func (r *e2eRig) dial(addr netip.AddrPort) net.Conn {
	r.t.Helper()
	var c net.Conn
	err := r.tb.Client.Do(func() error {
		d := net.Dialer{Timeout: 10 * time.Second}
		d.SetMultipathTCP(false)
		var err error
		c, err = d.Dial("tcp", addr.String())
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return c
}

// httpResp is one response as read from a connection.
type httpResp struct {
	raw    []byte
	status string // the status line
	header []string
	body   []byte
}

func (h *httpResp) get(name string) string {
	for _, l := range h.header {
		if n, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(n, name) {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// readHTTP reads one response to a request (head: a HEAD) from br; its
// raw bytes are exactly what br consumed.
func readHTTP(br *bufio.Reader, head bool) (*httpResp, error) {
	h := &httpResp{}
	for {
		line, err := br.ReadString('\n')
		h.raw = append(h.raw, line...)
		if err != nil {
			return h, fmt.Errorf("reading the response header: %w (after %q)", err, h.raw)
		}
		if h.status == "" {
			h.status = strings.TrimSuffix(line, "\r\n")
			continue
		}
		if line == "\r\n" {
			break
		}
		h.header = append(h.header, strings.TrimSuffix(line, "\r\n"))
	}
	n := 0
	if cl := h.get("Content-Length"); cl != "" {
		var err error
		if n, err = strconv.Atoi(cl); err != nil {
			return h, fmt.Errorf("bad Content-Length %q", cl)
		}
	}
	if head || strings.Contains(h.status, " 304 ") || strings.Contains(h.status, " 204 ") {
		n = 0
	}
	h.body = make([]byte, n)
	if _, err := io.ReadFull(br, h.body); err != nil {
		return h, fmt.Errorf("reading a %d-byte body: %w", n, err)
	}
	h.raw = append(h.raw, h.body...)
	return h, nil
}

// conversation is what one connection read: the responses in order, the
// whole byte stream, and whether the server closed it after the last one.
type conversation struct {
	resps  []*httpResp
	stream []byte
	closed bool
}

// converse sends each request on one connection and reads its response
// before the next (no pipelining); after the last it waits up to wait for
// the end of the connection (and fails on any further byte). If the last
// response says Connection: close, a wait > 0 is at least 2 s: the end
// is expected, and a slow machine may take more than a blink to send it.
func (r *e2eRig) converse(addr netip.AddrPort, reqs []string, wait time.Duration) conversation {
	r.t.Helper()
	c := r.dial(addr)
	defer c.Close()
	var conv conversation
	br := bufio.NewReader(c)
	for i, q := range reqs {
		if _, err := io.WriteString(c, q); err != nil {
			r.t.Fatalf("request %d %q: %v", i, requestLine(q), err)
		}
		c.SetReadDeadline(time.Now().Add(15 * time.Second))
		h, err := readHTTP(br, strings.HasPrefix(q, "HEAD "))
		conv.stream = append(conv.stream, h.raw...)
		if err != nil {
			r.t.Fatalf("request %d %q: %v (counters %v)", i, requestLine(q), err, r.counters())
		}
		conv.resps = append(conv.resps, h)
	}
	if wait > 0 && len(conv.resps) > 0 && conv.resps[len(conv.resps)-1].get("Connection") == "close" {
		wait = max(wait, 2*time.Second)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	rest, err := io.ReadAll(br)
	conv.stream = append(conv.stream, rest...)
	var ne net.Error
	switch {
	case len(rest) > 0:
		r.t.Errorf("%d bytes after the last response: %.80q", len(rest), rest)
	case err == nil:
		conv.closed = true
	case errors.As(err, &ne) && ne.Timeout():
	default:
		r.t.Errorf("after the last response: %v", err)
	}
	return conv
}

// maskDate replaces the value of every Date header of an HTTP byte
// stream (an IMF-fixdate, 29 bytes) by a fixed string of the same length.
func maskDate(stream []byte) []byte {
	out := bytes.Clone(stream)
	const key = "\r\nDate: "
	for i := 0; ; {
		j := bytes.Index(out[i:], []byte(key))
		if j < 0 || i+j+len(key)+dateLen > len(out) {
			return out
		}
		i += j + len(key)
		copy(out[i:], bytes.Repeat([]byte("*"), dateLen))
		i += dateLen
	}
}

// clientAccessLog is the request lines of nginx's access log that came
// from the client namespace (not the controller's fetches over loopback).
func (r *e2eRig) clientAccessLog() []string {
	var out []string
	for _, l := range strings.Split(r.ng.AccessLog(), "\n") {
		if !strings.HasPrefix(l, r.tb.Client.IP4.String()+" ") {
			continue
		}
		// combined: addr - user [time] "request" status bytes "referer" "ua"
		if _, rest, ok := strings.Cut(l, `"`); ok {
			if line, _, ok := strings.Cut(rest, `"`); ok {
				out = append(out, line)
			}
		}
	}
	return out
}

// writeTemp writes a file under dir and returns its path.
func writeTemp(t *testing.T, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}
