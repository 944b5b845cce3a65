package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// What nginx serves: the files the demo offloads, and one it leaves to
// nginx.
var (
	httpHot   = []string{"/index.html", "/style.css", "/big.html"}
	httpOther = "/about.html"
	// styleNew is style.css after the change on disk.
	styleNew = "body { font-family: sans-serif; color: #c00; }\n"
)

// httpMaxReply is the controller's --max-reply: the longest reply the
// socket-less TCP path sends, 10 segments (docs/tcp.md).
const httpMaxReply = 14480

// httpFiles are the files of nginx's document root: a page, its style
// sheet, a page of about 5 kB (four TCP segments) and a page not offloaded.
func httpFiles() map[string][]byte {
	var big strings.Builder
	big.WriteString("<!doctype html>\n<title>Santa: a longer page</title>\n<link rel=\"stylesheet\" href=\"/style.css\">\n<h1>A longer page</h1>\n")
	for i := 1; big.Len() < 5000-80; i++ {
		fmt.Fprintf(&big, "<p>Paragraph %d: sent from eBPF in several TCP segments, no socket involved.</p>\n", i)
	}
	big.WriteString("<p><a href=\"/\">back</a></p>\n")
	return map[string][]byte{
		"index.html": []byte("<!doctype html>\n<title>Santa</title>\n<link rel=\"stylesheet\" href=\"/style.css\">\n" +
			"<h1>Hello from nginx</h1>\n<p>This page may come from eBPF. <a href=\"/big.html\">More</a>, <a href=\"/about.html\">about</a>.</p>\n"),
		"style.css":  []byte("body { font-family: sans-serif; color: #222; }\n"),
		"big.html":   []byte(big.String()),
		"about.html": []byte("<!doctype html>\n<title>About</title>\n<p>nginx itself always serves this page.</p>\n"),
	}
}

// httpCounters are the counters of santad the HTTP part shows, in this
// order, when they move (docs/tcp.md).
var httpCounters = []string{
	"tcp_syn_answered", "answered", "tcp_xdp_no_room", "tcp_long_reply", "tcp_segments_sent", "tcp_request_acked",
	"tcp_fin_answered", "pass_no_match", "miss_sampled", "tcp_handed_over", "tcp_request_repeated", "tcp_resend",
	"tcp_drop_pipelined", "tcp_drop_fin_in_reply", "tcp_handover_window", "tcp_handover_long_reply", "tcp_handover_failed",
	"tcp_emit_failed", "pass_no_room", "pass_no_ruleset", "pass_no_socket", "pass_port_unbound",
}

// httpPart is the demo's HTTP part: nginx, the controller's rules and
// curl in the client namespace.
type httpPart struct {
	*demo
	ng       *testbed.Nginx
	files    map[string][]byte             // the files on disk, by path ("/index.html")
	direct   map[bool]map[string]*httpResp // nginx's own last response to curl, by v6 and path
	listener map[bool]uint64               // nginx's listening sockets (rule sets), by v6
	bound    map[bool]string               // their addresses, by v6
	rules    map[bool]map[string]uint64    // the controller's rule ids by v6 and path
	showBody bool                          // show the body itself, quoted, rather than its size
}

// http is the demo's HTTP part: an unmodified nginx; the HTTP controller of
// the build learns curl's requests of three files from miss samples and
// installs rules with nginx's responses; eBPF then answers whole
// connections, a keep-alive connection is handed to nginx mid-stream, a
// change on disk is seen by the next fetch, and the controller is stopped.
// The controller it starts is m.httpCtl (the caller stops it, also on
// errors); nginx stops with the testbed.
func (m *demo) http(verbose bool) (err error) {
	if err := m.ctx.Err(); err != nil {
		return err
	}
	p := &httpPart{demo: m, files: map[string][]byte{},
		direct:   map[bool]map[string]*httpResp{false: {}, true: {}},
		listener: map[bool]uint64{},
		bound:    map[bool]string{},
		rules:    map[bool]map[string]uint64{false: {}, true: {}}}
	files := httpFiles()
	for name, b := range files {
		p.files["/"+name] = b
	}
	if p.ng, err = m.tb.StartNginx(testbed.NginxOptions{Files: files, IPv6: true, AccessLog: true}); err != nil {
		return err
	}
	version := "nginx"
	if out, err := exec.Command(testbed.NginxPath, "-v").CombinedOutput(); err == nil {
		version = strings.TrimPrefix(strings.TrimSpace(string(out)), "nginx version: ")
	}
	fmt.Fprintln(m.out)
	fmt.Fprintln(m.out, "An unmodified nginx: root offloads its hot static files with the HTTP controller, and eBPF answers whole")
	fmt.Fprintln(m.out, "TCP connections (the handshake, the request, the reply, the FIN) with no socket (docs/tcp.md).")
	fmt.Fprintf(m.out, "  nginx  pid %d (%s, %s) in the server namespace, port %d of %s and [%s]\n",
		p.ng.PID(), testbed.NginxPath, version, p.ng.Addr4.Port(), p.ng.Addr4.Addr(), p.ng.Addr6.Addr())
	var sizes []string
	for _, path := range append(slices.Clone(httpHot), httpOther) {
		sizes = append(sizes, fmt.Sprintf("%s %d B", strings.TrimPrefix(path, "/"), len(p.files[path])))
	}
	fmt.Fprintf(m.out, "         root %s: %s; access log %s\n", p.ng.Root, strings.Join(sizes, ", "), p.ng.AccessLogFile)

	fmt.Fprintln(m.out, "curl -si (the response as received) from the client namespace; nginx answers, and its access log gets a line")
	fmt.Fprintln(m.out, "each (under each fetch: santad's counters that moved; pass_port_unbound: no socket on nginx's port has a rule set):")
	for _, path := range append(slices.Clone(httpHot), httpOther) {
		if _, err := p.get(path, false); err != nil {
			return err
		}
	}
	if _, err := p.get(httpHot[0], true); err != nil {
		return err
	}

	// The controller: it attaches to nginx's listening sockets and learns
	// curl's exact requests from the miss samples.
	fmt.Fprintln(m.out)
	fmt.Fprintf(m.out, "Root offloads three of them with the HTTP controller of the build, `santa http` (%s stays with nginx;\n",
		strings.TrimPrefix(httpOther, "/"))
	fmt.Fprintf(m.out, "--min-samples 1: learn a request from its first miss; --max-reply %d: replies of up to 10 TCP segments):\n", httpMaxReply)
	args := []string{"--port", strconv.Itoa(int(p.ng.Addr4.Port())), "--root", p.ng.Root}
	for _, path := range httpHot {
		args = append(args, "--path", path)
	}
	args = append(args, "--min-samples", "1", "--max-reply", strconv.Itoa(httpMaxReply))
	if m.httpCtl, err = m.runController(verbose, "http", args...); err != nil {
		return err
	}
	m.showReady(m.httpCtl)
	if err := p.findListeners(); err != nil {
		return err
	}
	fmt.Fprintf(m.out, "  (It attached to nginx's listening sockets %d (%v) and %d (%v) through santad:\n",
		p.listener[false], p.bound[false], p.listener[true], p.bound[true])
	fmt.Fprintln(m.out, "  from now on eBPF answers their SYNs, and hands a connection to nginx when a request matches no rule.")
	fmt.Fprintln(m.out, "  A rule answers one exact request, every byte of it; the controller learns them from santad's miss")
	fmt.Fprintln(m.out, "  samples, fetches nginx's response to the same bytes and installs it, and rewrites its Date every second.)")

	if err := p.learn(); err != nil {
		return err
	}
	if err := p.showRules(); err != nil {
		return err
	}

	// The kernel answers, with nginx's bytes.
	fmt.Fprintln(m.out)
	fmt.Fprintln(m.out, "curl again: eBPF answers, nginx sees nothing (=: nginx's response to curl above, byte for byte, but the Date,")
	fmt.Fprintln(m.out, "which the controller rewrites every second; every body is the file on disk):")
	nginxDate := p.direct[false][httpHot[0]].date
	var kernelDate string
	for _, g := range []struct {
		path string
		v6   bool
	}{{httpHot[0], false}, {httpHot[1], false}, {httpHot[2], false}, {httpHot[0], true}, {httpOther, false}} {
		got, err := p.get(g.path, g.v6)
		if err != nil {
			return err
		}
		if g.path == httpHot[0] && !g.v6 {
			kernelDate = got.resp.date
		}
	}
	fmt.Fprintf(m.out, "  (index.html's Date: %s in nginx's response above, %s in the kernel's.)\n", nginxDate, kernelDate)
	fmt.Fprintln(m.out, "  (big.html's reply is several segments: TC sends them as clones of the request, tcp_long_reply and")
	fmt.Fprintln(m.out, "  tcp_segments_sent; about.html has no rule: its connection was handed to nginx, tcp_handed_over.)")

	if err := p.keepAlive(); err != nil {
		return err
	}
	if err := p.change(); err != nil {
		return err
	}
	return p.stop()
}

// findListeners finds nginx's listening sockets, which the controller
// attached to, and adds them to the sockets whose rule hits snapshot reads.
func (p *httpPart) findListeners() error {
	socks, err := p.c.ListSockets()
	if err != nil {
		return err
	}
	for _, s := range socks {
		if s.Protocol == 6 && s.Port == p.ng.Addr4.Port() {
			p.listener[s.Family == 6] = s.Cookie
			p.bound[s.Family == 6] = s.AddrPort().String()
			p.cookies = append(p.cookies, s.Cookie)
		}
	}
	if len(p.listener) != 2 {
		return fmt.Errorf("santad has %d rule sets on nginx's listening sockets after santa http got ready, want 2: %v", len(p.listener), socks)
	}
	return nil
}

// learn fetches each offloaded file (and index.html over IPv6) until the
// controller has installed its rule: the first fetch is a miss, which
// santad samples for the controller.
func (p *httpPart) learn() error {
	fmt.Fprintln(p.out)
	fmt.Fprintln(p.out, "curl again: each first fetch is a miss (eBPF answers the SYN, hands the connection to nginx at the request and")
	fmt.Fprintln(p.out, "samples it); the controller learns curl's request from the sample and installs a rule within a second or so:")
	for _, g := range []struct {
		path string
		v6   bool
	}{{httpHot[0], false}, {httpHot[1], false}, {httpHot[2], false}, {httpHot[0], true}} {
		start := time.Now()
		fetches := 0
		for {
			if time.Since(start) > 10*time.Second {
				return fmt.Errorf("santa http installed no rule for %s over %s within 10 s (%d fetches):\n%s",
					g.path, family(g.v6), fetches, tail(p.httpCtl.Output(), 20))
			}
			if _, err := p.get(g.path, g.v6); err != nil {
				return err
			}
			fetches++
			fetched := time.Now()
			id, err := p.waitRule(g.path, g.v6, 3*time.Second)
			if err != nil {
				return err
			}
			if id != 0 {
				fmt.Fprintf(p.out, "  → rule %d installed %d ms after the fetch\n", id, time.Since(fetched).Milliseconds())
				p.rules[g.v6][g.path] = id
				break
			}
		}
	}
	p.showLog(p.httpCtl)
	return nil
}

// waitRule polls the listener's rules until one answers a GET of path, at
// most d; it returns its id, 0 if none came.
func (p *httpPart) waitRule(path string, v6 bool, d time.Duration) (uint64, error) {
	deadline := time.Now().Add(d)
	for {
		rules, err := p.c.ListRules(santa.Cookie(p.listener[v6]))
		if err != nil && !errors.Is(err, santa.ErrNotFound) {
			return 0, err
		}
		for _, r := range rules {
			if httpRulePath(r) == path {
				return r.ID, nil
			}
		}
		if time.Now().After(deadline) {
			return 0, nil
		}
		if err := sleep(p.ctx, 20*time.Millisecond); err != nil {
			return 0, err
		}
	}
}

// showRules lists the controller's rules on nginx's listening sockets: the
// exact request each answers and its reply.
func (p *httpPart) showRules() error {
	fmt.Fprintln(p.out)
	fmt.Fprintf(p.out, "Its rules (Go client ListRules on nginx's listening sockets %d (IPv4) and %d (IPv6); request: every byte,\n",
		p.listener[false], p.listener[true])
	fmt.Fprintln(p.out, "min_len = max_len; reply: nginx's response, status line, headers and body):")
	all := map[bool][]api.Rule{}
	w := 0
	for _, v6 := range []bool{false, true} {
		rules, err := p.c.ListRules(santa.Cookie(p.listener[v6]))
		if err != nil {
			return err
		}
		slices.SortFunc(rules, func(a, b api.Rule) int { return cmp.Compare(a.ID, b.ID) })
		all[v6] = rules
		for _, r := range rules {
			w = max(w, len(strconv.Quote(string(httpRuleRequest(r)))))
		}
	}
	for _, v6 := range []bool{false, true} {
		for _, r := range all[v6] {
			req := httpRuleRequest(r)
			// segments of a 1500-byte MTU with timestamps (curl's MSS)
			segs := (int(r.ReplyLen) + 1447) / 1448
			if v6 {
				segs = (int(r.ReplyLen) + 1427) / 1428
			}
			closes := ""
			if r.Close {
				closes = ", close"
			}
			fmt.Fprintf(p.out, "  rule %d  %s  %-*s %2d B → %4d-byte reply (%d segment%s%s)\n",
				r.ID, family(v6), w, strconv.Quote(string(req)), len(req), r.ReplyLen, segs, plural(segs), closes)
		}
	}
	return nil
}

// plural is "s" unless n is 1.
func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

// httpRuleRequest is the exact request a rule of the HTTP controller
// answers, rebuilt from its conditions.
func httpRuleRequest(r api.Rule) []byte {
	req := make([]byte, r.MinLen)
	for _, c := range r.Conditions {
		if int(c.Offset) < len(req) {
			copy(req[c.Offset:], c.Pattern)
		}
	}
	return req
}

// httpRulePath is the path of the GET a rule answers ("" if none).
func httpRulePath(r api.Rule) string {
	line, _, _ := strings.Cut(string(httpRuleRequest(r)), "\r\n")
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "GET" {
		return ""
	}
	return f[1]
}

// httpResp is one response as curl received it.
type httpResp struct {
	raw    []byte // status line, headers and body
	head   string // status line and headers, CRLFs and all
	body   []byte
	status string // "200 OK"
	date   string // its Date header
}

// parseHTTP splits a response as curl -si writes it.
func parseHTTP(raw []byte) (*httpResp, error) {
	head, body, ok := bytes.Cut(raw, []byte("\r\n\r\n"))
	if !ok {
		return nil, fmt.Errorf("no end of the header block in %q", raw)
	}
	r := &httpResp{raw: raw, head: string(head) + "\r\n\r\n", body: body}
	lines := strings.Split(string(head), "\r\n")
	st := strings.SplitN(lines[0], " ", 2)
	if len(st) != 2 || !strings.HasPrefix(st[0], "HTTP/1.") {
		return nil, fmt.Errorf("not an HTTP/1 status line: %q", lines[0])
	}
	r.status = st[1]
	for _, l := range lines[1:] {
		if v, ok := strings.CutPrefix(l, "Date: "); ok {
			r.date = v
		}
	}
	return r, nil
}

// withoutDate is the header block without its Date line.
func (r *httpResp) withoutDate() string {
	return strings.Replace(r.head, "Date: "+r.date+"\r\n", "", 1)
}

// httpGet is one fetch with curl and who answered it.
type httpGet struct {
	path     string
	v6       bool
	resp     *httpResp
	santa    bool     // a rule's hits grew
	nginx    []string // the requests nginx logged meanwhile
	hits     string   // "rule N hits a → b"
	counters string   // the counters that moved
}

// url is the URL of path on nginx over one family.
func (p *httpPart) url(path string, v6 bool) string {
	if v6 {
		return p.ng.URL6(path)
	}
	return p.ng.URL4(path)
}

// curl runs curl in the client namespace (at most 5 s) and returns what
// it wrote to stdout.
func (p *httpPart) curl(args ...string) ([]byte, error) {
	if err := p.ctx.Err(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(p.ctx, 10*time.Second)
	defer cancel()
	cmd := testbed.Command(ctx, p.tb.Client.NS, "curl", append([]string{"-sS", "--max-time", "5"}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		if p.ctx.Err() != nil {
			return nil, p.ctx.Err()
		}
		return nil, fmt.Errorf("curl %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.Bytes(), nil
}

// accessLog is nginx's access log, a line per request.
func (p *httpPart) accessLog() []string {
	l := strings.TrimSuffix(p.ng.AccessLog(), "\n")
	if l == "" {
		return nil
	}
	return strings.Split(l, "\n")
}

// logged is how an access log line shows: the request line and status.
func logged(line string) string {
	// 198.18.1.2 - - [date] "GET /about.html HTTP/1.1" 200 80 "-" "curl/7.88.1"
	_, rest, ok := strings.Cut(line, "\"")
	if !ok {
		return line
	}
	req, rest, _ := strings.Cut(rest, "\"")
	status, _, _ := strings.Cut(strings.TrimSpace(rest), " ")
	return strconv.Quote(req) + " " + status
}

// measure runs f between two snapshots of santad's counters, the rules'
// hits and nginx's access log, and says what moved.
func (p *httpPart) measure(f func() error) (g httpGet, err error) {
	before, err := p.snapshot()
	if err != nil {
		return g, err
	}
	logBefore := len(p.accessLog())
	if err := f(); err != nil {
		return g, err
	}
	after, err := p.snapshot()
	if err != nil {
		return g, err
	}
	if l := p.accessLog(); len(l) > logBefore {
		for _, line := range l[logBefore:] {
			// the client's requests only: the controller's own fetches
			// (from the server's side) may fall in the same window
			if remote, _, _ := strings.Cut(line, " "); remote == p.tb.Client.IP4.String() || remote == p.tb.Client.IP6.String() {
				g.nginx = append(g.nginx, logged(line))
			}
		}
	}
	var ids []uint64
	for id := range after.hits {
		if after.hits[id] > before.hits[id] {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	var hits []string
	for _, id := range ids {
		hits = append(hits, fmt.Sprintf("rule %d hits %d → %d", id, before.hits[id], after.hits[id]))
	}
	g.santa, g.hits = len(ids) > 0, strings.Join(hits, ", ")
	var moved []string
	for _, k := range httpCounters {
		if d := after.c[k] - before.c[k]; d != 0 {
			moved = append(moved, fmt.Sprintf("%s +%d", k, d))
		}
	}
	g.counters = strings.Join(moved, ", ")
	return g, nil
}

// get fetches path with curl -si over one family, prints a line (the
// status, the body compared with the file, the response compared with
// nginx's, who answered and the counters that moved) and checks it: the
// body is the file on disk, and a reply of a rule is nginx's last response
// to curl but for the Date.
func (p *httpPart) get(path string, v6 bool) (httpGet, error) {
	var raw []byte
	g, err := p.measure(func() (err error) {
		raw, err = p.curl("-i", p.url(path, v6))
		return err
	})
	if err != nil {
		return g, err
	}
	g.path, g.v6 = path, v6
	if g.resp, err = parseHTTP(raw); err != nil {
		return g, fmt.Errorf("GET %s over %s: %w", path, family(v6), err)
	}
	fmt.Fprintln(p.out, p.line(g))
	return g, p.check(g)
}

// line is how the demo shows a fetch.
func (p *httpPart) line(g httpGet) string {
	r := g.resp
	body := fmt.Sprintf("%4d-byte body", len(r.body))
	if p.showBody {
		body = strconv.Quote(string(r.body))
	}
	if bytes.Equal(r.body, p.files[g.path]) {
		body += " = file"
	} else {
		body += " ≠ file"
	}
	same := ""
	if d := p.direct[g.v6][g.path]; g.santa && d != nil {
		switch {
		case bytes.Equal(r.raw, d.raw):
			same = "= nginx's"
		case r.withoutDate() == d.withoutDate() && bytes.Equal(r.body, d.body):
			same = "= nginx's but Date"
		default:
			same = "≠ nginx's"
		}
	}
	who := "nginx"
	switch {
	case g.santa && len(g.nginx) == 0:
		who = "Santa, " + g.hits
	case g.santa:
		who = "Santa and nginx, " + g.hits
	case len(g.nginx) == 0:
		who = "unclear (no rule hit, nothing in nginx's access log)"
	}
	log := fmt.Sprintf("access log +%d", len(g.nginx))
	if len(g.nginx) > 0 {
		log += ": " + strings.Join(g.nginx, ", ")
	}
	counters := g.counters
	if counters == "" {
		counters = "no counter moved"
	}
	return fmt.Sprintf("  GET %-11s %s  %s  %-21s  %-18s  %s\n      %s; %s",
		g.path, family(g.v6), r.status, body, same, who, counters, log)
}

// check checks a fetch: 200, the body is the file on disk, a reply of
// nginx's becomes the one later replies are compared with, and a reply
// of a rule is that one but for the Date.
func (p *httpPart) check(g httpGet) error {
	r := g.resp
	switch {
	case r.status != "200 OK":
		return fmt.Errorf("GET %s over %s: %s, want 200 OK:\n%s", g.path, family(g.v6), r.status, r.head)
	case !bytes.Equal(r.body, p.files[g.path]):
		return fmt.Errorf("GET %s over %s: the body (%d bytes) is not the file (%d bytes): %q", g.path, family(g.v6), len(r.body), len(p.files[g.path]), r.body)
	case !g.santa && len(g.nginx) == 0:
		return fmt.Errorf("GET %s over %s: no rule hit and nginx did not log it", g.path, family(g.v6))
	case !g.santa:
		p.direct[g.v6][g.path] = r
	case p.direct[g.v6][g.path] != nil && r.withoutDate() != p.direct[g.v6][g.path].withoutDate():
		return fmt.Errorf("GET %s over %s: the headers of the kernel's reply differ from nginx's beyond the Date:\n%s\nnginx's:\n%s",
			g.path, family(g.v6), r.head, p.direct[g.v6][g.path].head)
	}
	return nil
}

// keepAlive fetches an offloaded file and then the file left to nginx over
// one keep-alive connection: eBPF answers the first request and hands
// the connection to nginx at the second.
func (p *httpPart) keepAlive() error {
	dir, err := os.MkdirTemp(p.dir, "curl-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	first, second := filepath.Join(dir, "1"), filepath.Join(dir, "2")
	w := `%{url_effective}: %{http_code}, %{size_download}-byte body, local port %{local_port}, new connections %{num_connects}\n`
	urls := []string{p.url(httpHot[0], false), p.url(httpOther, false)}
	fmt.Fprintln(p.out)
	fmt.Fprintln(p.out, "One keep-alive connection, two requests: the first has a rule, the second not (curl with two URLs):")
	fmt.Fprintf(p.out, "  $ curl -s -o 1 -o 2 -w '%s' \\\n        %s %s\n", strings.TrimSuffix(w, `\n`), urls[0], urls[1])
	var out []byte
	g, err := p.measure(func() (err error) {
		out, err = p.curl("-o", first, "-o", second, "-w", w, urls[0], urls[1])
		return err
	})
	if err != nil {
		return err
	}
	lines := strings.Split(strings.TrimSuffix(string(out), "\n"), "\n")
	for _, l := range lines {
		fmt.Fprintf(p.out, "  %s\n", l)
	}
	for i, f := range []string{first, second} {
		path := []string{httpHot[0], httpOther}[i]
		b, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		if !bytes.Equal(b, p.files[path]) {
			return fmt.Errorf("keep-alive: the body of %s (%d bytes) is not the file (%d bytes): %q", path, len(b), len(p.files[path]), b)
		}
	}
	fmt.Fprintf(p.out, "  bodies = files; %s; nginx's access log +%d: %s\n", g.hits, len(g.nginx), strings.Join(g.nginx, ", "))
	fmt.Fprintf(p.out, "  %s\n", g.counters)
	if len(lines) != 2 || !strings.HasSuffix(lines[1], "new connections 0") {
		return fmt.Errorf("keep-alive: curl did not reuse its connection for the second request: %q", out)
	}
	if !g.santa || len(g.nginx) != 1 || !strings.Contains(g.nginx[0], httpOther) {
		return fmt.Errorf("keep-alive: want the first request answered by a rule and only the second logged by nginx; rules: %q, nginx: %q", g.hits, g.nginx)
	}
	if !strings.Contains(g.counters, "tcp_handed_over +1") {
		return fmt.Errorf("keep-alive: the connection was not handed over once: %s", g.counters)
	}
	fmt.Fprintln(p.out, "  (eBPF answered the first request on the connection; the second matched no rule, so TC handed the")
	fmt.Fprintln(p.out, "  connection to nginx's listener with bpf_sk_assign_tcp_reqsk: nginx accepted it and read the request,")
	fmt.Fprintln(p.out, "  its sequence numbers in line with what eBPF had sent.)")
	return nil
}

// change replaces style.css on disk and shows that the controller deletes
// its rules at once (inotify) and that the next fetch has the new
// content; then it fetches until the rule is back, with the new content.
func (p *httpPart) change() error {
	path := httpHot[1]
	old := p.rules[false][path]
	file := filepath.Join(p.ng.Root, strings.TrimPrefix(path, "/"))
	fmt.Fprintln(p.out)
	fmt.Fprintf(p.out, "%s changes on disk (written to a new file, renamed over the old one, as deploy tools do):\n", strings.TrimPrefix(path, "/"))
	fmt.Fprintf(p.out, "  %q → %q\n", p.files[path], styleNew)
	tmp := file + ".new"
	if err := os.WriteFile(tmp, []byte(styleNew), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, file); err != nil {
		return err
	}
	changed := time.Now()
	p.files[path] = []byte(styleNew)
	// wait until the old rules are gone
	for {
		gone := true
		for _, v6 := range []bool{false, true} {
			rules, err := p.c.ListRules(santa.Cookie(p.listener[v6]))
			if err != nil {
				return err
			}
			for _, r := range rules {
				if r.ID == p.rules[v6][path] {
					gone = false
				}
			}
		}
		if gone {
			break
		}
		if time.Since(changed) > 3*time.Second {
			return fmt.Errorf("santa http did not delete the rules of %s within 3 s of the change:\n%s", path, tail(p.httpCtl.Output(), 20))
		}
		if err := sleep(p.ctx, time.Millisecond); err != nil {
			return err
		}
	}
	fmt.Fprintf(p.out, "  rule %d deleted %d ms after the rename (inotify); curl at once, then until a rule answers again:\n",
		old, time.Since(changed).Milliseconds())
	p.direct[false][path] = nil // nginx's response is for the old file
	p.showBody = true
	defer func() { p.showBody = false }()
	for {
		g, err := p.get(path, false)
		if err != nil {
			return err
		}
		if g.santa {
			id, err := p.waitRule(path, false, 0)
			if err != nil {
				return err
			}
			p.rules[false][path] = id
			fmt.Fprintf(p.out, "  rule %d is back with the new content %d ms after the rename\n", id, time.Since(changed).Milliseconds())
			break
		}
		if time.Since(changed) > 5*time.Second {
			return fmt.Errorf("santa http did not install the rule of %s again within 5 s of the change:\n%s", path, tail(p.httpCtl.Output(), 20))
		}
		if err := sleep(p.ctx, 50*time.Millisecond); err != nil {
			return err
		}
	}
	p.showLog(p.httpCtl)
	return nil
}

// stop stops the controller and shows that its rules are gone and that
// nginx answers again.
func (p *httpPart) stop() error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	if err := p.stopAndShow(p.httpCtl, "the HTTP controller"); err != nil {
		return err
	}
	for v6, cookie := range p.listener {
		rules, err := p.c.ListRules(santa.Cookie(cookie))
		if !errors.Is(err, santa.ErrNotFound) {
			return fmt.Errorf("santa http stopped but nginx's %s listening socket %d still has a rule set (%d rules, %v)", family(v6), cookie, len(rules), err)
		}
	}
	fmt.Fprintf(p.out, "  (nginx's listening sockets %d and %d have no rule set any more (ListRules: not found): the kernel\n",
		p.listener[false], p.listener[true])
	fmt.Fprintln(p.out, "  answers their SYNs again.)")
	fmt.Fprintln(p.out, "curl again: nginx answers itself.")
	for _, g := range []struct {
		path string
		v6   bool
	}{{httpHot[0], false}, {httpHot[2], true}} {
		g, err := p.get(g.path, g.v6)
		if err != nil {
			return err
		}
		if g.santa || len(g.nginx) != 1 {
			return fmt.Errorf("GET %s over %s after the controller stopped: not nginx's (%s; nginx: %q)", g.path, family(g.v6), g.hits, g.nginx)
		}
	}
	return nil
}

// sleep waits d, or until ctx is done.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
