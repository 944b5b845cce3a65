//go:build linux

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// The HTTP benchmark (`make bench-http`, bench/cmd/benchhttp): the paper's
// Figure 8. One nginx worker serves a static file of each payload size;
// wrk (one thread, closed loop) asks for one of them over a few keep-alive
// connections, or over a new connection per request (`Connection: close`),
// against nginx with sendfile off, nginx with sendfile on, and Santa: the
// first nginx with santad and `santa http --path FILE`, whose rule answers
// wrk's exact request from the eBPF TCP path. Each case is one point
// (wrk saturates the server or itself); there is no rate sweep.

// The servers of an HTTP case.
const (
	HTTPNginx         = "nginx"          // nginx alone, sendfile off
	HTTPNginxSendfile = "nginx-sendfile" // nginx alone, sendfile on
	HTTPSanta         = "santa"          // nginx (sendfile off), santad and `santa http`
)

// The connection modes of an HTTP case.
const (
	ConnKeepAlive = "keepalive" // wrk's connections stay open
	ConnClose     = "close"     // "Connection: close": one request per connection
)

// HTTPServers and HTTPConns are every server and connection mode, in run
// order.
var (
	HTTPServers = []string{HTTPNginx, HTTPNginxSendfile, HTTPSanta}
	HTTPConns   = []string{ConnKeepAlive, ConnClose}
)

// HTTPCase is one case of the HTTP benchmark.
type HTTPCase struct {
	Name        string `json:"name"`
	Server      string `json:"server"`      // HTTPNginx, HTTPNginxSendfile, HTTPSanta
	Conn        string `json:"conn"`        // ConnKeepAlive, ConnClose
	Size        int    `json:"size"`        // bytes of the file (the response body)
	Path        string `json:"path"`        // its URL path
	Connections int    `json:"connections"` // wrk -c

	// Found by the run:
	Request string `json:"request,omitempty"` // the exact bytes wrk sent to a listener of the harness
	// Variants are the byte strings wrk sends for the case: Request with
	// its header lines in every order (wrk keeps its headers in a Lua
	// table, whose order changes from one wrk process to the next).
	Variants []string `json:"variants,omitempty"`
	Response int      `json:"response_bytes,omitempty"` // nginx's response to Request: status line, headers, body
	// Offload is the controller's decisions on the variants (Santa):
	// "offloaded …" or "not offloaded …" as it logged them.
	Offload []string `json:"offload,omitempty"`
}

// HTTPCaseName is a case's name: server-ka-SIZE or server-close-SIZE.
func HTTPCaseName(server, conn string, size int) string {
	mode := "ka"
	if conn == ConnClose {
		mode = "close"
	}
	return fmt.Sprintf("%s-%s-%s", server, mode, human(size))
}

// HTTPPath is the URL path of the file of size bytes.
func HTTPPath(size int) string { return fmt.Sprintf("/p%d.bin", size) }

// Description is the case's line in the report.
func (c HTTPCase) Description() string {
	conn := fmt.Sprintf("%d keep-alive connections", c.Connections)
	if c.Conn == ConnClose {
		conn = fmt.Sprintf("%d connections, a new one per request (`Connection: close`)", c.Connections)
	}
	what := fmt.Sprintf("GET %s (%d-byte body", c.Path, c.Size)
	if c.Response > 0 {
		what += fmt.Sprintf(", %d-byte response", c.Response)
	}
	what += ") over " + conn
	switch c.Server {
	case HTTPNginxSendfile:
		return "nginx alone, `sendfile on`; " + what
	case HTTPSanta:
		return fmt.Sprintf("nginx (`sendfile off`) with santad and `santa http --path %s`; %s", c.Path, what)
	}
	return "nginx alone, `sendfile off`; " + what
}

// PlanHTTP lists the cases of a run: for each server (nginx, nginx with
// sendfile, Santa), each connection mode and each size, in that order.
func PlanHTTP(sizes []int, keepAliveConns, closeConns int) []HTTPCase {
	var out []HTTPCase
	for _, s := range HTTPServers {
		for _, m := range HTTPConns {
			n := keepAliveConns
			if m == ConnClose {
				n = closeConns
			}
			for _, size := range sizes {
				out = append(out, HTTPCase{Name: HTTPCaseName(s, m, size), Server: s, Conn: m, Size: size, Path: HTTPPath(size), Connections: n})
			}
		}
	}
	return out
}

// HTTPConfig is one run of the HTTP benchmark. Of the embedded Config,
// Rates, Names, Batch, ProbeRate and StopAfter are not used.
type HTTPConfig struct {
	Config
	Sizes          []int
	KeepAliveConns int
	CloseConns     int
	// MaxReply, if not 0, is `santa http --max-reply`: the longest
	// response the controller offloads. 0: the controller's default, the
	// longest reply the data path sends; a longer response stays with
	// nginx.
	MaxReply int
	// Warmup bounds the traffic a Santa case sends before it is measured,
	// until the controller has learned the request and decided on it.
	Warmup time.Duration
	Cases  []HTTPCase
	Bin    string // directory holding santad and santa
	// ControllerArgs are added to `santa http`'s arguments (e.g.
	// --date-refresh 0).
	ControllerArgs []string
}

// HTTPReport is an HTTP run.
type HTTPReport struct {
	Report
	Sizes          []int               `json:"sizes"`
	KeepAliveConns int                 `json:"keepalive_connections"`
	CloseConns     int                 `json:"close_connections"`
	MaxReply       int                 `json:"max_reply"`
	Meta           map[string]HTTPCase `json:"meta"`
	Setup          []SetupStep         `json:"setup"`
	// Done is each controller's done line, by case.
	Done map[string]string `json:"controller_done,omitempty"`
	// Counters are santad's data-path counters (non-zero changes) over
	// each Santa case's runs of wrk: the 1-connection probe, the
	// repetitions and any repeated attempt.
	Counters map[string]map[string]uint64 `json:"dataplane_counters,omitempty"`
	// Requests is wrk's count of responses over the same span (every run
	// of wrk in the case), by case.
	Requests map[string]uint64 `json:"requests,omitempty"`
	// Captured is wrk's request as a listener of the harness read it, by
	// connection mode.
	Captured map[string]string `json:"captured,omitempty"`
}

const httpPort = 80

// clientSysctls are set in the client namespace: with a new connection per
// request, wrk goes through ports fast, and a port whose connection wrk
// closed first sits in TIME_WAIT for a minute.
var clientSysctls = map[string]string{
	"net/ipv4/ip_local_port_range": "1024 65535",
	"net/ipv4/tcp_tw_reuse":        "1",
}

// RunHTTP runs the HTTP benchmark. A case that fails is recorded with its
// error and the run goes on; the testbed, nginx, santad and the
// controllers are always removed.
func RunHTTP(ctx context.Context, cfg HTTPConfig) (*HTTPReport, error) {
	if err := prepareHost(&cfg.Config); err != nil {
		return nil, err
	}
	logf := cfg.Logf
	for _, p := range []string{testbed.NginxPath, WrkPath} {
		if _, err := os.Stat(p); err != nil {
			return nil, fmt.Errorf("%s missing (Debian packages nginx, wrk; run scripts/install-deps.sh)", p)
		}
	}
	for _, b := range []string{"santad", "santa"} {
		if _, err := os.Stat(filepath.Join(cfg.Bin, b)); err != nil {
			return nil, fmt.Errorf("%s not built: %w", b, err)
		}
	}
	if len(cfg.Cases) == 0 {
		return nil, errors.New("no cases")
	}
	rep := &HTTPReport{
		Report: Report{
			Started: time.Now(), Host: hostInfo(), Command: cfg.Command, Quick: cfg.Quick,
			Duration: cfg.Duration.Seconds(), Reps: cfg.Reps,
			ServerCPU: cfg.Placement.ServerCPU, ClientCPU: cfg.Placement.ClientCPU,
		},
		Sizes: cfg.Sizes, KeepAliveConns: cfg.KeepAliveConns, CloseConns: cfg.CloseConns, MaxReply: cfg.MaxReply,
		Meta: map[string]HTTPCase{}, Done: map[string]string{}, Counters: map[string]map[string]uint64{}, Requests: map[string]uint64{},
	}
	if out, _ := testbed.Run("", testbed.NginxPath, "-v"); out != "" {
		rep.Host["nginx"] = strings.TrimSpace(out)
	}
	if out, _ := testbed.Run("", WrkPath, "--version"); out != "" {
		line, _, _ := strings.Cut(strings.TrimSpace(out), "\n")
		line, _, _ = strings.Cut(line, " Copyright")
		rep.Host["wrk"] = line
	}
	if t := sourceTree(); t != "" {
		rep.Host["source"] = t
	}
	step := stepRecorder(&rep.Setup, logf)
	tb, tmp, closeRun, err := openRun(cfg.Config, "santa-benchhttp-")
	if err != nil {
		return nil, err
	}
	defer closeRun()
	if err := tb.Client.Do(func() error {
		for k, v := range clientSysctls {
			if err := os.WriteFile(filepath.Join("/proc/sys", k), []byte(v), 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return nil, fmt.Errorf("client sysctls: %w", err)
	}

	// The document root: a file of each size.
	root := filepath.Join(tmp, "www")
	if err := os.Mkdir(root, 0o755); err != nil {
		return nil, err
	}
	for _, c := range cfg.Cases {
		if err := os.WriteFile(filepath.Join(root, filepath.Base(c.Path)), payload(c.Size), 0o644); err != nil {
			return nil, err
		}
	}

	run := &httpRun{cfg: cfg, tb: tb, tmp: tmp, root: root, rep: rep, step: step, requests: map[string]string{}, capturedPath: map[string]string{}}
	env := &Env{TB: tb, Placement: cfg.Placement, Logf: logf}
	run.h = &harness{cfg: cfg.Config, tb: tb, env: env, tmp: tmp}
	defer run.stopAll()

	// wrk's exact requests, one per connection mode, as a listener on the
	// server's port sees them (before nginx runs).
	t0 := time.Now()
	for _, m := range HTTPConns {
		for _, c := range cfg.Cases {
			if c.Conn != m {
				continue
			}
			req, err := captureRequest(ctx, tb, run.wrk(c))
			if err != nil {
				step("capture wrk's requests", t0, err)
				return nil, err
			}
			if !strings.HasPrefix(req, "GET "+c.Path+" HTTP/1.1\r\n") {
				return nil, fmt.Errorf("wrk's request for %s: %q", c.Path, req)
			}
			run.requests[m], run.capturedPath[m] = req, c.Path
			logf("wrk's request (%s): %q", m, req)
			break
		}
	}
	rep.Captured = run.requests
	step("capture wrk's requests (a listener on port 80)", t0, nil)

	for _, c := range cfg.Cases {
		if ctx.Err() != nil {
			break
		}
		cr := run.runCase(ctx, c)
		if cr.Error != "" {
			logf("[%s] FAILED: %s", cr.Name, cr.Error)
		}
		rep.Cases = append(rep.Cases, cr)
	}
	run.stopAll()
	rep.Finished = time.Now()
	return rep, ctx.Err()
}

// sourceTree describes the working tree santad and santa are built from:
// its commit and where it has uncommitted changes ("" without git).
func sourceTree() string {
	git := func(args ...string) (string, error) {
		out, err := exec.Command("git", append([]string{"-c", "safe.directory=*"}, args...)...).Output()
		return string(out), err
	}
	head, err := git("rev-parse", "--short", "HEAD")
	if err != nil {
		return ""
	}
	head = strings.TrimSpace(head)
	st, err := git("status", "--porcelain")
	if err != nil {
		return "commit " + head
	}
	var dirs []string
	for _, l := range strings.Split(st, "\n") {
		if len(l) < 4 {
			continue
		}
		p := strings.Trim(l[3:], `"`)
		if i := strings.LastIndex(p, "/"); i >= 0 {
			p = p[:i+1]
		}
		if !slices.Contains(dirs, p) {
			dirs = append(dirs, p)
		}
	}
	if len(dirs) == 0 {
		return "commit " + head
	}
	return fmt.Sprintf("commit %s with uncommitted changes in %s", head, strings.Join(dirs, ", "))
}

// payload is the content of the file of n bytes: printable, not
// compressible by accident of repetition (it is never compressed).
func payload(n int) []byte {
	const alphabet = "abcdefghijklmnopqrstuvwxyz0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	b := make([]byte, n)
	x := uint32(2463534242)
	for i := range b {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		b[i] = alphabet[x%uint32(len(alphabet))]
	}
	if n > 0 {
		b[n-1] = '\n'
	}
	return b
}

// httpRun is the state the cases of one run share: nginx, santad and the
// running `santa http`.
type httpRun struct {
	cfg      HTTPConfig
	tb       *testbed.Testbed
	h        *harness
	tmp      string
	root     string
	rep      *HTTPReport
	step     func(string, time.Time, error)
	requests map[string]string // wrk's exact request, by connection mode
	// capturedPath is the path of the captured requests, by mode
	capturedPath map[string]string

	nginx    *testbed.Nginx
	sendfile bool
	santad   *santadRig
	ctl      *controllerProc
}

// wrk is the case's load generator. Each run starts with no TIME_WAIT
// socket on the server (see flushTimeWait).
func (r *httpRun) wrk(c HTTPCase) *Wrk {
	w := &Wrk{TB: r.tb, URL: "http://" + r.tb.Server.IP4.String() + c.Path, CPU: r.cfg.Placement.ClientCPU, Prepare: r.flushTimeWait}
	if c.Conn == ConnClose {
		w.Headers = []string{"Connection: close"}
	}
	return w
}

// flushTimeWait removes the server's TIME_WAIT sockets (`ss -K state
// time-wait` in its namespace). nginx closes first with `Connection:
// close`, so each of its connections leaves one for a minute; wrk's
// single client address has only 64 k ports, and a SYN whose 4-tuple has
// one goes to the kernel (correctly: eBPF must not answer for a socket the
// kernel still has), so without this the connections of a run would
// depend on what ran in the minute before. Within a run they still
// accumulate, as they would on a server.
func (r *httpRun) flushTimeWait() error {
	_, err := testbed.Run(r.tb.Server.NS, "ss", "-K", "-t", "state", "time-wait")
	return err
}

func (r *httpRun) runCase(ctx context.Context, c HTTPCase) CaseResult {
	// wrk's request as captured, for the case's path
	c.Request = strings.Replace(r.requests[c.Conn], " "+r.capturedPath[c.Conn]+" ", " "+c.Path+" ", 1)
	c.Variants = headerOrders(c.Request)
	r.rep.Meta[c.Name] = c
	fail := func(err error) CaseResult {
		r.rep.Meta[c.Name] = c
		return CaseResult{Name: c.Name, Description: c.Description(), Saturation: -1, Knee: -1, Error: "setup: " + err.Error()}
	}
	if c.Server != HTTPSanta {
		r.stopSantad()
	}
	if err := r.startNginx(c.Server == HTTPNginxSendfile); err != nil {
		return fail(err)
	}
	// nginx's response to wrk's exact request (before a controller binds
	// the listener: nginx answers).
	n, err := replay(r.tb, r.nginx.Addr4, c.Request)
	if err != nil {
		return fail(fmt.Errorf("nginx's response to wrk's request: %w", err))
	}
	c.Response = n
	r.rep.Meta[c.Name] = c
	hc := &httpCase{c: c, run: r}
	if c.Server != HTTPSanta {
		return r.h.runCase(ctx, hc)
	}

	if r.santad == nil {
		t0 := time.Now()
		s, err := startSantad(r.tb, r.cfg.Bin, r.tmp, 1000, r.cfg.Logf)
		r.step("start santad", t0, err)
		if err != nil {
			return fail(err)
		}
		r.santad = s
	}
	t0 := time.Now()
	args := []string{"--root", r.root, "--port", fmt.Sprintf("%d/tcp", httpPort), "--path", c.Path, "--idle", "0", "--report", "0", "--verbose"}
	if r.cfg.MaxReply > 0 {
		args = append(args, "--max-reply", strconv.Itoa(r.cfg.MaxReply))
	}
	args = append(args, r.cfg.ControllerArgs...)
	ctl, err := r.santad.startController(ctx, "http", "", args...)
	r.step(fmt.Sprintf("santa http --path %s (ready; %s)", c.Path, c.Name), t0, err)
	if err != nil {
		return fail(err)
	}
	r.ctl = ctl
	defer r.stopController(c.Name)

	// Learning: wrk's traffic misses (nginx answers), the controller
	// samples it, fetches nginx's response and installs the rule.
	t0 = time.Now()
	c.Offload = r.learn(ctx, c)
	r.rep.Meta[c.Name] = c
	r.step(fmt.Sprintf("%s: learning, until the controller decided on %d requests", c.Name, len(c.Variants)), t0, nil)

	// Everything of Santa's runs on the server CPU while measuring.
	if err := pinSanta(r.santad, r.ctl, r.cfg.Placement.ServerCPU); err != nil {
		return fail(err)
	}
	_, before, err := r.santad.client.Health()
	if err != nil {
		return fail(err)
	}
	cr := r.h.runCase(ctx, hc)
	if _, after, err := r.santad.client.Health(); err == nil {
		d := map[string]uint64{}
		for k, v := range after {
			if v > before[k] {
				d[k] = v - before[k]
			}
		}
		r.rep.Counters[c.Name] = d
	}
	r.rep.Requests[c.Name] = hc.replies
	return cr
}

// reDecision finds the controller's decisions on requests in its log:
// "msg=offloaded …" (debug, with --verbose) or "msg="not offloaded" …".
var reDecision = regexp.MustCompile(`msg=(offloaded|"not offloaded") (.*)$`)

// learn sends each variant of wrk's request for the case to the server,
// each on a new connection (the first request of a connection is the one a
// miss sample shows: after a miss the kernel owns the connection), until
// the controller has logged as many decisions as there are variants, at
// most cfg.Warmup. It returns the decisions ("offloaded …", "not
// offloaded …"), or what is missing.
func (r *httpRun) learn(ctx context.Context, c HTTPCase) []string {
	deadline := time.Now().Add(r.cfg.Warmup)
	sent := 0
	decisions := func() []string {
		var out []string
		for _, l := range strings.Split(r.ctl.Output(), "\n") {
			if m := reDecision.FindStringSubmatch(l); m != nil {
				out = append(out, strings.Trim(m[1], `"`)+" "+m[2])
			}
		}
		return out
	}
	for ctx.Err() == nil && time.Now().Before(deadline) {
		for i := 0; i < 10; i++ {
			for _, v := range c.Variants {
				if _, err := replay(r.tb, r.nginx.Addr4, v); err != nil {
					r.cfg.Logf("[%s] learning: %v", c.Name, err)
					time.Sleep(100 * time.Millisecond)
				}
				sent++
			}
			time.Sleep(time.Millisecond)
		}
		if d := decisions(); len(d) >= len(c.Variants) {
			for _, l := range d {
				r.cfg.Logf("[%s] santa http after %d requests: %s", c.Name, sent, l)
			}
			return d
		}
	}
	d := decisions()
	return append(d, fmt.Sprintf("%d of %d requests decided within %v (%d sent)", len(d), len(c.Variants), r.cfg.Warmup, sent))
}

// headerOrders returns req with its header lines in every order, req
// first (wrk's requests have one or two headers).
func headerOrders(req string) []string {
	lines := strings.Split(strings.TrimSuffix(req, "\r\n\r\n"), "\r\n")
	if len(lines) < 2 || len(lines) > 5 {
		return []string{req}
	}
	first, hdrs := lines[0], lines[1:]
	out := []string{req}
	var perm func(k int)
	perm = func(k int) {
		if k == len(hdrs) {
			v := first + "\r\n" + strings.Join(hdrs, "\r\n") + "\r\n\r\n"
			if !slices.Contains(out, v) {
				out = append(out, v)
			}
			return
		}
		for i := k; i < len(hdrs); i++ {
			hdrs[k], hdrs[i] = hdrs[i], hdrs[k]
			perm(k + 1)
			hdrs[k], hdrs[i] = hdrs[i], hdrs[k]
		}
	}
	perm(0)
	return out
}

// startNginx makes sure nginx runs with sendfile as asked (restarting it if
// not): one worker and its master pinned to the server CPU, keep-alive
// connections never closed for their number of requests.
func (r *httpRun) startNginx(sendfile bool) error {
	if r.nginx != nil && r.sendfile == sendfile {
		return nil
	}
	r.stopSantad() // its controller's rule sets belong to nginx's sockets
	r.stopNginx()
	t0 := time.Now()
	n, err := r.tb.StartNginx(testbed.NginxOptions{Root: r.root, Sendfile: sendfile, Workers: 1, KeepaliveRequests: 1_000_000,
		Pin: true, CPU: r.cfg.Placement.ServerCPU})
	onOff := map[bool]string{true: "on", false: "off"}[sendfile]
	r.step("start nginx (1 worker, sendfile "+onOff+")", t0, err)
	if err != nil {
		return err
	}
	r.nginx, r.sendfile = n, sendfile
	r.h.env.Server = n
	return nil
}

func (r *httpRun) stopNginx() {
	if r.nginx == nil {
		return
	}
	if err := r.nginx.Stop(); err != nil {
		r.cfg.Logf("warning: stopping nginx: %v", err)
	}
	r.nginx, r.h.env.Server = nil, nil
}

func (r *httpRun) stopController(name string) {
	if r.ctl == nil {
		return
	}
	pinSanta(r.santad, r.ctl, -1) // delete the rules at full speed
	t0 := time.Now()
	err := r.ctl.stop()
	if line := doneLine(r.ctl.Output()); line != "" && name != "" {
		r.rep.Done[name] = line
	}
	r.step(fmt.Sprintf("stop santa http (%s; deletes its rules)", name), t0, err)
	r.ctl = nil
}

func (r *httpRun) stopSantad() {
	if r.santad == nil {
		return
	}
	r.stopController("")
	t0 := time.Now()
	err := r.santad.stop()
	r.step("stop santad, santad cleanup", t0, err)
	r.santad = nil
}

func (r *httpRun) stopAll() {
	r.stopSantad()
	r.stopNginx()
}

// httpCase is an HTTP case for the harness: wrk's load at the case's
// number of connections, one point.
type httpCase struct {
	c       HTTPCase
	run     *httpRun
	replies uint64 // wrk's responses over every run (countingGen)
}

func (hc *httpCase) Name() string        { return hc.c.Name }
func (hc *httpCase) Description() string { return hc.c.Description() }
func (hc *httpCase) Setup(*Env) error    { return nil }
func (hc *httpCase) Teardown() error     { return nil }

// SharedXDP: santad's program stays for the next Santa case.
func (hc *httpCase) SharedXDP() bool { return hc.c.Server == HTTPSanta }

// MaxForeign: Santa's cases leave the server CPU idle between packets, and
// each wake-up of the server's NAPI kthread is an inter-processor
// interrupt (a VM exit on a VM) that counts as busy time outside any
// thread: about 4 µs per connection with Connection: close (20–25 % of the
// busy time), up to 10 % with keep-alive. nginx keeps the CPU busy: 10 %.
func (hc *httpCase) MaxForeign() float64 {
	if hc.c.Server == HTTPSanta {
		return santaMaxForeign
	}
	return maxForeign
}

// santaMaxForeign is MaxForeign of the Santa cases.
const santaMaxForeign = 0.35

// LatencyProbe: wrk measures latency itself.
func (hc *httpCase) LatencyProbe() bool { return false }

// Rates: one point, at the case's number of connections.
func (hc *httpCase) Rates() []int { return []int{hc.c.Connections} }

// ProbeLoad: the check before the point is one connection.
func (hc *httpCase) ProbeLoad() (int, string) { return 1, "1 connection" }

func (hc *httpCase) ServerPIDs() []int {
	var pids []int
	if hc.c.Server == HTTPSanta && hc.run.santad != nil {
		pids = append(pids, hc.run.santad.sd.PID())
		if hc.run.ctl != nil {
			pids = append(pids, hc.run.ctl.PID())
		}
	}
	return pids
}

func (hc *httpCase) Answered() (uint64, error) {
	if hc.c.Server != HTTPSanta || hc.run.santad == nil {
		return 0, nil
	}
	return hc.run.santad.answered()
}

func (hc *httpCase) Load(env *Env, _ int) (Load, error) {
	return Load{Generator: &countingGen{Generator: hc.run.wrk(hc.c), replies: &hc.replies}, Distinct: 1}, nil
}

// countingGen counts the replies of all its runs: the harness's probe, the
// measured points and the attempts it repeated, the span of santad's
// counters.
type countingGen struct {
	Generator
	replies *uint64
}

func (g *countingGen) Run(ctx context.Context, rate int, d time.Duration) (LoadResult, error) {
	r, err := g.Generator.Run(ctx, rate, d)
	*g.replies += r.Replies
	return r, err
}

// captureRequest runs wrk (one connection, one second) against a listener
// of its own on the server's port and returns the first request it reads:
// the exact bytes wrk sends.
func captureRequest(ctx context.Context, tb *testbed.Testbed, w *Wrk) (string, error) {
	addr := netip.AddrPortFrom(tb.Server.IP4, httpPort)
	var ln net.Listener
	if err := tb.Server.Do(func() (err error) {
		ln, err = net.Listen("tcp", addr.String())
		return err
	}); err != nil {
		return "", err
	}
	defer ln.Close()
	got := make(chan string, 1)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.SetDeadline(time.Now().Add(2 * time.Second))
			req, err := readRequest(bufio.NewReader(c))
			if err == nil {
				c.Write([]byte("HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n"))
			}
			c.Close()
			if err == nil {
				select {
				case got <- req:
				default:
				}
			}
		}
	}()
	_, werr := w.Run(ctx, 1, time.Second)
	select {
	case req := <-got:
		return req, nil
	default:
		return "", fmt.Errorf("wrk sent no complete request to %v (wrk: %v)", addr, werr)
	}
}

// readRequest reads an HTTP request head, up to and including the empty
// line.
func readRequest(br *bufio.Reader) (string, error) {
	var b strings.Builder
	for {
		l, err := br.ReadString('\n')
		b.WriteString(l)
		if err != nil {
			return "", err
		}
		if l == "\r\n" {
			return b.String(), nil
		}
	}
}

// replay sends req to addr from the client namespace on a new connection
// and reads one response with a Content-Length; it returns the
// response's length in bytes (status line, headers and body). The status
// must be 200.
func replay(tb *testbed.Testbed, addr netip.AddrPort, req string) (int, error) {
	n := 0
	err := tb.Client.Do(func() error {
		c, err := net.DialTimeout("tcp", addr.String(), 2*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, req); err != nil {
			return err
		}
		br := bufio.NewReader(c)
		head, err := readRequest(br) // a response head ends the same way
		if err != nil {
			return err
		}
		if !strings.HasPrefix(head, "HTTP/1.1 200 ") {
			status, _, _ := strings.Cut(head, "\r\n")
			return fmt.Errorf("status %q", status)
		}
		length := -1
		for _, l := range strings.Split(head, "\r\n") {
			if k, v, ok := strings.Cut(l, ":"); ok && strings.EqualFold(k, "Content-Length") {
				length, _ = strconv.Atoi(strings.TrimSpace(v))
			}
		}
		if length < 0 {
			return errors.New("no Content-Length")
		}
		if _, err := io.CopyN(io.Discard, br, int64(length)); err != nil {
			return err
		}
		n = len(head) + length
		return nil
	})
	return n, err
}

// counterNames are santad's data-path counters the report shows for Santa
// cases, in order.
var counterNames = []string{"answered", "tcp_syn_answered", "tcp_handed_over", "tcp_xdp_no_room", "tcp_long_reply",
	"tcp_segments_sent", "tcp_handover_long_reply", "pass_no_room", "pass_no_match", "tcp_pass_kernel_socket"}

// otherCounters are the counters of m not in counterNames, sorted.
func otherCounters(m map[string]uint64) []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if !slices.Contains(counterNames, k) {
			out = append(out, k)
		}
	}
	return out
}
