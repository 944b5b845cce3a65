package httpctl

// End-to-end tests through the real data path (issue 6, "Tests"): nginx in
// the server namespace, santad attached to the server veth, the controller
// (Run) learning the exact requests from the miss samples of real clients
// in the client namespace (curl, wrk, Python's http.client, headless
// Chromium), then the same clients answered by eBPF; under loss and
// reordering; a differential test of offload on and off; connections that
// start with eBPF replies and go on with nginx (docs/http.md, "Tests").

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"image"
	"image/png"
	"io"
	"maps"
	"math/rand"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// e2eFiles are nginx's documents: a small file (one segment), an index
// page, a file of 5 segments (a long reply, sent by TC) and one of 20 kB,
// longer than 10 segments (never offloaded).
func e2eFiles() map[string][]byte {
	rnd := rand.New(rand.NewSource(6))
	blob := func(n int) []byte {
		b := make([]byte, n)
		rnd.Read(b)
		return b
	}
	return map[string][]byte{
		"a.txt":      []byte("hello from nginx, or from eBPF\n"),
		"index.html": []byte("<html><body><p>santa e2e index</p></body></html>\n"),
		"m.bin":      blob(6000),
		"big.bin":    blob(20000),
		"q.txt":      []byte(strings.Repeat("query string file\n", 20)),
		"other.txt":  []byte("never offloaded (not among the paths)\n"),
	}
}

// fileFor is the file nginx serves for a request target: the path
// without "/" and the query, index.html for "/".
func fileFor(target string) string {
	p, _, _ := strings.Cut(strings.TrimPrefix(target, "/"), "?")
	if p == "" {
		return "index.html"
	}
	return p
}

// TestE2ECurl: curl, one URL per invocation and several URLs on one
// keep-alive connection, over IPv4 and IPv6: after the first misses are
// learned, every reply comes from eBPF (counters, rule hits), byte for
// byte the file; a keep-alive connection that asks for a file too big to
// offload goes on with nginx.
func TestE2ECurl(t *testing.T) {
	files := e2eFiles()
	r := newE2E(t, e2eOptions{files: files})
	dir := t.TempDir()
	out := func(name string) string { return filepath.Join(dir, name) }
	urls := map[uint32]func(string) string{4: r.ng.URL4, 6: r.ng.URL6}
	// learning: each request first on a connection of its own; it misses,
	// is sampled and hands the connection to nginx
	for _, fam := range []uint32{4, 6} {
		url := urls[fam]
		for _, p := range []string{"/a.txt", "/m.bin", "/", "/big.bin"} {
			r.curl("-o", out("learn"), url(p))
			checkFile(t, out("learn"), files[fileFor(p)], "learning "+url(p))
		}
		r.curl("-I", url("/a.txt"))
	}
	for _, fam := range []uint32{4, 6} {
		r.waitLines(fam, "GET /a.txt HTTP/1.1", "GET /m.bin HTTP/1.1", "GET / HTTP/1.1", "HEAD /a.txt HTTP/1.1")
	}
	if rep := r.ctl.Report(); rep.TooBig == 0 {
		t.Errorf("big.bin not refused as too big: %+v", rep)
	}

	before, rules0 := r.counters(), hitsByLine(r.rules())
	for _, fam := range []uint32{4, 6} {
		url := urls[fam]
		// keep-alive: four URLs, one connection
		got := r.curl("-w", "%{num_connects} ",
			"-o", out("1"), url("/a.txt"), "-o", out("2"), url("/m.bin"), "-o", out("3"), url("/"), "-o", out("4"), url("/a.txt"))
		if got != "1 0 0 0 " {
			t.Errorf("IPv%d keep-alive: connects per request %q, want \"1 0 0 0 \"", fam, got)
		}
		for i, f := range []string{"a.txt", "m.bin", "index.html", "a.txt"} {
			checkFile(t, out(fmt.Sprint(i+1)), files[f], fmt.Sprintf("IPv%d keep-alive %s", fam, f))
		}
		// separate invocations
		for _, p := range []string{"/a.txt", "/m.bin"} {
			r.curl("-o", out("sep"), url(p))
			checkFile(t, out("sep"), files[p[1:]], fmt.Sprintf("IPv%d %s", fam, p))
		}
		head := r.curl("-I", url("/a.txt"))
		if !strings.HasPrefix(head, "HTTP/1.1 200 OK\r\n") || !strings.Contains(head, fmt.Sprintf("\r\nContent-Length: %d\r\n", len(files["a.txt"]))) {
			t.Errorf("IPv%d HEAD: %q", fam, head)
		}
	}
	after, rules1 := r.counters(), hitsByLine(r.rules())
	d := delta(before, after)
	t.Logf("counters: %v", d)
	// per family: 4 keep-alive, 2 separate, 1 HEAD
	for name, want := range map[string]uint64{"answered": 14, "tcp_long_reply": 4, "tcp_handed_over": 0, "tcp_syn_answered": 8} {
		if d[name] != want {
			t.Errorf("%s +%d, want +%d", name, d[name], want)
		}
	}
	for line, want := range map[string]uint64{"GET /a.txt HTTP/1.1": 6, "GET /m.bin HTTP/1.1": 4, "GET / HTTP/1.1": 2, "HEAD /a.txt HTTP/1.1": 2} {
		if got := rules1[line] - rules0[line]; got != want {
			t.Errorf("rule hits of %q +%d, want +%d", line, got, want)
		}
	}

	// a keep-alive connection that asks for a file too big to offload:
	// eBPF answers the first request, nginx the rest
	before = r.counters()
	got := r.curl("-w", "%{num_connects} ",
		"-o", out("1"), r.ng.URL4("/a.txt"), "-o", out("2"), r.ng.URL4("/big.bin"), "-o", out("3"), r.ng.URL4("/m.bin"))
	if got != "1 0 0 " {
		t.Errorf("keep-alive with a handover: connects per request %q, want \"1 0 0 \"", got)
	}
	for i, f := range []string{"a.txt", "big.bin", "m.bin"} {
		checkFile(t, out(fmt.Sprint(i+1)), files[f], "keep-alive with a handover: "+f)
	}
	d = delta(before, r.counters())
	if d["answered"] != 1 || d["tcp_handed_over"] != 1 {
		t.Errorf("keep-alive with a handover: counters %v, want answered +1, tcp_handed_over +1", d)
	}
}

// TestE2EHandedOverConnectionLearned: a request that only ever comes after
// a handover, on a keep-alive connection nginx owns by then, is learned
// too (the rule processor samples data on the kernel's connections for the
// listener's subscribers), and then answered by eBPF on a connection of
// its own. The first request of each connection is too big to offload.
func TestE2EHandedOverConnectionLearned(t *testing.T) {
	files := e2eFiles()
	r := newE2E(t, e2eOptions{files: files})
	dir := t.TempDir()
	out := func(name string) string { return filepath.Join(dir, name) }
	before := r.counters()
	for i := 0; i < 3; i++ {
		got := r.curl("-w", "%{num_connects} ", "-o", out("big"), r.ng.URL4("/big.bin"), "-o", out("q"), r.ng.URL4("/q.txt"))
		if got != "1 0 " {
			t.Fatalf("keep-alive: connects per request %q, want \"1 0 \"", got)
		}
		checkFile(t, out("q"), files["q.txt"], "q.txt after big.bin")
	}
	if d := delta(before, r.counters()); d["tcp_handed_over"] != 3 || d["answered"] != 0 {
		t.Fatalf("the learning connections: counters %v, want 3 handed over and none answered", d)
	}
	if _, ok := r.learnedWithin(3*time.Second, func(rs []e2eRule) bool {
		return slices.ContainsFunc(rs, func(x e2eRule) bool { return requestLine(x.request) == "GET /q.txt HTTP/1.1" })
	}); !ok {
		t.Fatalf("GET /q.txt, sent only on connections nginx owned, was not learned (report %+v)", r.ctl.Report())
	}
	before = r.counters()
	r.curl("-o", out("q"), r.ng.URL4("/q.txt"))
	checkFile(t, out("q"), files["q.txt"], "q.txt on a connection of its own")
	if d := delta(before, r.counters()); d["answered"] != 1 || d["tcp_handed_over"] != 0 {
		t.Errorf("q.txt on a connection of its own: counters %v, want answered +1 and no handover", d)
	}
}

// TestE2EServerByAddress: nginx picks the server block by the address a
// connection came to when a `listen ADDR:PORT` shares the wildcard socket
// (here a server on 127.0.0.1, where the controller fetches a wildcard
// listener's responses from). A rule on that socket would answer clients
// of every address alike, so a request whose response differs over the
// addresses a client may use is not offloaded: curl over IPv4 gets the
// file, not the loopback server's text. Over IPv6, where no server block
// differs, the request is offloaded.
func TestE2EServerByAddress(t *testing.T) {
	files := e2eFiles()
	r := newE2E(t, e2eOptions{files: files, nginxHTTP: "server { listen 127.0.0.1:8080; location / { return 200 'the loopback server\n'; } }"})
	urls := []string{r.ng.URL4("/a.txt"), r.ng.URL6("/a.txt")}
	for _, u := range urls {
		r.curl(u)
	}
	r.waitLines(6, "GET /a.txt HTTP/1.1")
	time.Sleep(1100 * time.Millisecond) // the next learning round, which must not offload it over IPv4
	for _, x := range r.rules() {
		if x.family == 4 {
			t.Errorf("IPv4 rule for %q, with reply %q", requestLine(x.request), x.reply)
		}
	}
	for i, u := range urls {
		before := r.counters()
		if got := r.curl(u); got != string(files["a.txt"]) {
			t.Errorf("%s: %q, want the file", u, got)
		}
		if answered := delta(before, r.counters())["answered"]; answered != uint64(i) {
			t.Errorf("%s: answered +%d by eBPF, want +%d", u, answered, i)
		}
	}
}

// TestE2EWrk: wrk's requests, learned from its first misses, are then all
// answered by eBPF: thousands of replies, none but a 200 with the file's
// bytes (checked by wrk's response callback).
func TestE2EWrk(t *testing.T) {
	files := e2eFiles()
	r := newE2E(t, e2eOptions{files: files})
	dir := t.TempDir()
	// wrk's response callback counts the responses and those whose status
	// or body is not the file's
	script := writeTemp(t, dir, "check.lua", fmt.Sprintf(`
checked, bad = 0, 0
local want = %q
response = function(status, headers, body)
	checked = checked + 1
	if status ~= 200 or body ~= want then bad = bad + 1 end
end
local threads = {}
setup = function(thread) table.insert(threads, thread) end
done = function(summary, latency, requests)
	for _, th in ipairs(threads) do
		io.write(string.format("checked %%d bad %%d\n", th:get("checked"), th:get("bad")))
	end
end
`, files["a.txt"]))
	wrk := func(d string) (out string, requests int) {
		t.Helper()
		var checked, bad int
		out, err := r.tb.Client.Run("wrk", "-t1", "-c2", "-d"+d, "-s", script, r.ng.URL4("/a.txt"))
		if err != nil {
			t.Fatalf("wrk: %v", err)
		}
		for _, l := range strings.Split(out, "\n") {
			fmt.Sscanf(strings.TrimSpace(l), "%d requests in", &requests)
			fmt.Sscanf(l, "checked %d bad %d", &checked, &bad)
		}
		if strings.Contains(out, "Non-2xx") || strings.Contains(out, "Socket errors") || checked == 0 || checked < requests || bad != 0 {
			t.Errorf("wrk -d%s: %d requests, %d checked, %d bad:\n%s", d, requests, checked, bad, out)
		}
		return out, requests
	}
	// learning: the first request of each of wrk's two connections misses
	// and hands the connection over; nginx answers the rest
	wrk("1s")
	r.waitLines(4, "GET /a.txt HTTP/1.1")
	before := r.counters()
	out, requests := wrk("2s")
	d := delta(before, r.counters())
	t.Logf("wrk: %d requests; counters %v\n%s", requests, d, out)
	// every request of the two connections is eBPF's
	if d["answered"] < uint64(requests) || requests < 1000 || d["tcp_handed_over"] != 0 {
		t.Errorf("answered +%d for wrk's %d requests (handed over +%d), want all of them, at least 1000",
			d["answered"], requests, d["tcp_handed_over"])
	}
}

// pythonClient is run with python3 in the client namespace: argv host
// port mode. It makes its requests with http.client, and one over a raw
// socket (http.client's HTTP/1.0 request has no header at all: "GET
// /a.txt HTTP/1.0\r\n\r\n"), and prints, as JSON, for each: its name,
// status, version, headers, body (base64), the local port of its
// connection and whether the response ends the connection. Mode "learn"
// makes each request on a new connection; "check" makes the first four on
// one keep-alive connection.
const pythonClient = `
import base64, http.client, json, socket, sys

host, port, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]

class HTTP10(http.client.HTTPConnection):
    _http_vsn = 10
    _http_vsn_str = "HTTP/1.0"

def call(conn, name, method, path, headers={}):
    conn.request(method, path, headers=headers)
    r = conn.getresponse()
    body = r.read()
    port = conn.sock.getsockname()[1] if conn.sock else None
    out.append({"name": name, "status": r.status, "version": r.version, "headers": r.getheaders(),
                "body": base64.b64encode(body).decode(), "port": port, "will_close": r.will_close})

out = []
reqs = [("GET", "GET", "/a.txt", {}), ("HEAD", "HEAD", "/a.txt", {}), ("GET long", "GET", "/m.bin", {}),
        ("HEAD long", "HEAD", "/m.bin", {})]
if mode == "learn":
    for name, m, p, h in reqs:
        c = http.client.HTTPConnection(host, port, timeout=10)
        call(c, name, m, p, h)
        c.close()
else:
    c = http.client.HTTPConnection(host, port, timeout=10)
    for name, m, p, h in reqs:
        call(c, name, m, p, h)
    c.close()
c = HTTP10(host, port, timeout=10)
call(c, "HTTP/1.0", "GET", "/a.txt")
c.close()
c = http.client.HTTPConnection(host, port, timeout=10)
call(c, "close", "GET", "/m.bin", {"Connection": "close"})
c.close()
s = socket.create_connection((host, port), timeout=10)
s.sendall(b"GET /m.bin HTTP/1.0\r\nUser-Agent: raw-socket\r\n\r\n")
raw = b""
while True:
    b = s.recv(65536)
    if not b:
        break
    raw += b
head, _, body = raw.partition(b"\r\n\r\n")
lines = head.decode().split("\r\n")
out.append({"name": "raw HTTP/1.0", "status": int(lines[0].split(" ")[1]), "version": 11 if lines[0].startswith("HTTP/1.1 ") else 10,
            "headers": [l.split(": ", 1) for l in lines[1:]], "body": base64.b64encode(body).decode(),
            "port": s.getsockname()[1], "will_close": True})
s.close()
print(json.dumps(out))
`

type pyResult struct {
	Name      string     `json:"name"`
	Status    int        `json:"status"`
	Version   int        `json:"version"`
	Headers   [][]string `json:"headers"`
	Body      []byte     `json:"body"`
	Port      int        `json:"port"`
	WillClose bool       `json:"will_close"`
}

// runPython runs pythonClient and checks every response against the
// files: status 200, the file's bytes (none for HEAD, with its length),
// connection semantics.
func (r *e2eRig) runPython(script, mode string) []pyResult {
	t := r.t
	t.Helper()
	out, err := r.tb.Client.Run("timeout", "60", "python3", script, r.tb.Server.IP4.String(), fmt.Sprint(testPort), mode)
	if err != nil {
		t.Fatalf("python: %v", err)
	}
	var res []pyResult
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("python's output: %v\n%s", err, out)
	}
	want := map[string]struct {
		file      string
		head      bool
		willClose bool
	}{
		"GET": {"a.txt", false, false}, "HEAD": {"a.txt", true, false}, "GET long": {"m.bin", false, false},
		"HEAD long": {"m.bin", true, false}, "HTTP/1.0": {"a.txt", false, true}, "close": {"m.bin", false, true},
		"raw HTTP/1.0": {"m.bin", false, true},
	}
	if len(res) != len(want) {
		t.Fatalf("python %s: %d results, want %d", mode, len(res), len(want))
	}
	for _, x := range res {
		w := want[x.Name]
		body := r.files[w.file]
		length := ""
		for _, h := range x.Headers {
			if len(h) == 2 && strings.EqualFold(h[0], "Content-Length") {
				length = h[1]
			}
		}
		if w.head {
			body = nil
		}
		if x.Status != 200 || x.Version != 11 || !bytes.Equal(x.Body, body) || length != fmt.Sprint(len(r.files[w.file])) || x.WillClose != w.willClose {
			t.Errorf("python %s %q: status %d, HTTP %d, %d bytes (want %d), Content-Length %q, will close %v (want %v)",
				mode, x.Name, x.Status, x.Version, len(x.Body), len(body), length, x.WillClose, w.willClose)
		}
	}
	return res
}

// TestE2EPython: Python's http.client, GET and HEAD on one keep-alive
// connection, HTTP/1.0 (close), Connection: close, and a raw socket's
// HTTP/1.0 request (a long reply) read until the server closes: learned
// from their first misses, then all answered by eBPF, byte for byte the
// files.
func TestE2EPython(t *testing.T) {
	r := newE2E(t, e2eOptions{files: e2eFiles()})
	script := writeTemp(t, t.TempDir(), "client.py", pythonClient)
	r.runPython(script, "learn")
	r.waitLines(4, "GET /a.txt HTTP/1.1", "HEAD /a.txt HTTP/1.1", "GET /m.bin HTTP/1.1", "HEAD /m.bin HTTP/1.1",
		"GET /a.txt HTTP/1.0")
	r.waitRules("the raw HTTP/1.0 request", func(rs []e2eRule) bool {
		return slices.ContainsFunc(rs, func(x e2eRule) bool {
			return x.request == "GET /m.bin HTTP/1.0\r\nUser-Agent: raw-socket\r\n\r\n" && x.close
		})
	})
	before := r.counters()
	res := r.runPython(script, "check")
	d := delta(before, r.counters())
	t.Logf("counters %v", d)
	for _, x := range res[1:4] {
		if x.Port != res[0].Port {
			t.Errorf("%q on local port %d, want the keep-alive connection's %d", x.Name, x.Port, res[0].Port)
		}
	}
	// 4 on the keep-alive connection, 3 on connections of their own
	for name, want := range map[string]uint64{"answered": 7, "tcp_syn_answered": 4, "tcp_handed_over": 0, "tcp_long_reply": 3} {
		if d[name] != want {
			t.Errorf("%s +%d, want +%d", name, d[name], want)
		}
	}
}

// chromiumFiles are a page whose stylesheet, script and image are
// offloaded. The script writes into the DOM what it saw: that it ran, the
// stylesheet's color, and (on load) the image's size once decoded.
func chromiumFiles(t *testing.T) map[string][]byte {
	img := image.NewNRGBA(image.Rect(0, 0, 7, 5))
	for i := range img.Pix {
		img.Pix[i] = byte(i*37 + 11)
	}
	var png_ bytes.Buffer
	if err := png.Encode(&png_, img); err != nil {
		t.Fatal(err)
	}
	// a script of 3 segments: a long reply
	js := `(function () {
	var mark = "script ran: " + "offloaded";
	document.getElementById("js").textContent = mark;
	var c = getComputedStyle(document.getElementById("css")).color;
	document.getElementById("css").textContent = "color " + c;
	function img() {
		var i = document.getElementById("img");
		document.getElementById("imgout").textContent = "image " + i.naturalWidth + "x" + i.naturalHeight;
	}
	var i = document.getElementById("img");
	if (i.complete) { img(); } else { i.addEventListener("load", img); }
})();
/*` + strings.Repeat(" padding so that the script takes three segments", 80) + ` */
`
	return map[string][]byte{
		"index.html": []byte(`<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>santa e2e</title>
<link rel="icon" href="data:,">
<link rel="stylesheet" href="/static/style.css">
</head><body>
<p id="css">no stylesheet</p>
<p><img id="img" src="/static/pixel.png" alt="pixel"></p>
<p id="imgout">no image</p>
<p id="js">no script</p>
<script src="/static/app.js"></script>
</body></html>
`),
		"static/style.css": []byte("body { font-family: sans-serif; }\n#css { color: rgb(1, 2, 3); }\n"),
		"static/app.js":    []byte(js),
		"static/pixel.png": png_.Bytes(),
	}
}

// TestE2EChromium: headless Chromium loads a page and its stylesheet,
// script and image. Chromium's requests are learned from its misses over
// a load or two (each load's first miss on a connection hands it to nginx,
// which then serves the rest of that connection, whose requests are
// sampled too), then a load is answered by eBPF alone: the DOM shows the
// script ran, the style applied and the image decoded, and every rule
// counted its hit.
func TestE2EChromium(t *testing.T) {
	if _, err := os.Stat("/usr/bin/chromium"); err != nil {
		t.Fatal("no /usr/bin/chromium: run scripts/install-deps.sh")
	}
	files := chromiumFiles(t)
	r := newE2E(t, e2eOptions{files: files})
	home := t.TempDir()
	load := func(i int) {
		t.Helper()
		// a new profile each time: no cache, the same requests
		out, err := r.tb.Client.Run("env", "HOME="+home, "timeout", "60", "chromium",
			"--headless=new", "--no-sandbox", "--user-data-dir="+filepath.Join(home, fmt.Sprint("profile", i)),
			"--dump-dom", r.ng.URL4("/"))
		if err != nil {
			t.Fatalf("chromium: %v", err)
		}
		for _, want := range []string{`<p id="js">script ran: offloaded</p>`, `<p id="css">color rgb(1, 2, 3)</p>`,
			`<p id="imgout">image 7x5</p>`, "<title>santa e2e</title>"} {
			if !strings.Contains(out, want) {
				t.Errorf("load %d: no %q in the DOM:\n%s", i, want, out)
			}
		}
	}
	lines := []string{"GET / HTTP/1.1", "GET /static/style.css HTTP/1.1", "GET /static/app.js HTTP/1.1", "GET /static/pixel.png HTTP/1.1"}
	offloaded := func(rs []e2eRule) int {
		hits := hitsByLine(rs)
		n := 0
		for _, l := range lines {
			if _, ok := hits[l]; ok {
				n++
			}
		}
		return n
	}
	loads := 0
	for have := 0; have < len(lines); {
		if loads == 6 {
			t.Fatalf("after %d loads, %d of Chromium's %d requests offloaded; rules %v", loads, have, len(lines), hitsByLine(r.rules()))
		}
		load(loads)
		loads++
		// the next second's learning offloads what missed
		last := have
		deadline := time.Now().Add(2500 * time.Millisecond)
		for have == last && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
			have = offloaded(r.rules())
		}
		t.Logf("after load %d: %d of %d requests offloaded", loads, have, len(lines))
	}
	before, hits0 := r.counters(), hitsByLine(r.rules())
	load(loads)
	d, hits1 := delta(before, r.counters()), hitsByLine(r.rules())
	t.Logf("the last load: counters %v", d)
	for _, l := range lines {
		if hits1[l] <= hits0[l] {
			t.Errorf("%q: no hit of its rule in the last load", l)
		}
	}
	if d["answered"] < uint64(len(lines)) || d["tcp_handed_over"] != 0 {
		t.Errorf("answered +%d, handed over +%d; want at least %d, none", d["answered"], d["tcp_handed_over"], len(lines))
	}
	// the rules' replies are nginx's responses: the files' bytes
	for _, x := range r.rules() {
		target := strings.Fields(requestLine(x.request))[1]
		if _, body, _ := bytes.Cut(x.reply, []byte("\r\n\r\n")); !bytes.Equal(body, files[fileFor(target)]) {
			t.Errorf("the rule for %q: body differs from the file", requestLine(x.request))
		}
	}
}

// diffCase is a connection of the differential test: requests sent one
// after the other (each after the previous response).
type diffCase struct {
	name string
	reqs []string
}

// TestE2EDifferential sends the same request bytes over raw TCP with the
// offload on (the controller's rules installed, learned from these very
// requests; the counters and the rules' hits prove eBPF answered exactly
// the offloaded ones) and off (the controller stopped: its rules deleted,
// the listeners detached, nginx answers all), and compares what the
// client reads: every byte of every status line, header and body, and
// whether the connection ends, must be the same, except the Date header's
// value. GET and HEAD, HTTP/1.0 and 1.1, keep-alive and close, a Range
// request (206), If-Modified-Since and If-None-Match (304), a query
// string, an index, a 404 and a file too big to offload (both never
// offloaded: they hand the connection to nginx).
func TestE2EDifferential(t *testing.T) {
	files := e2eFiles()
	r := newE2E(t, e2eOptions{files: files})
	host := "Host: " + r.ng.Addr4.String() + "\r\n"
	fi, err := os.Stat(filepath.Join(r.ng.Root, "a.txt"))
	if err != nil {
		t.Fatal(err)
	}
	mtime := fi.ModTime().UTC()
	etag := fmt.Sprintf(`"%x-%x"`, mtime.Unix(), fi.Size()) // nginx's ETag
	req := func(line, headers string) string { return line + "\r\n" + headers + "\r\n" }
	q := map[string]string{
		"GET":                req("GET /a.txt HTTP/1.1", host+"User-Agent: santa-e2e\r\nAccept: */*\r\n"),
		"HEAD":               req("HEAD /a.txt HTTP/1.1", host+"User-Agent: santa-e2e\r\nAccept: */*\r\n"),
		"HTTP/1.0":           req("GET /a.txt HTTP/1.0", "User-Agent: santa-e2e\r\n"),
		"HTTP/1.0 keepalive": req("GET /a.txt HTTP/1.0", host+"Connection: keep-alive\r\n"),
		"HEAD HTTP/1.0":      req("HEAD /m.bin HTTP/1.0", ""),
		"close":              req("GET /a.txt HTTP/1.1", host+"Connection: close\r\n"),
		"close, keep-alive":  req("GET /a.txt HTTP/1.1", host+"Connection: close\r\nConnection: keep-alive\r\n"),
		"keep-alive-x":       req("GET /a.txt HTTP/1.0", host+"Connection: keep-alive-x\r\n"),
		"long":               req("GET /m.bin HTTP/1.1", host),
		"long close":         req("GET /m.bin HTTP/1.1", host+"Connection: close\r\n"),
		"range":              req("GET /m.bin HTTP/1.1", host+"Range: bytes=100-2099\r\n"),
		"if-modified-since":  req("GET /a.txt HTTP/1.1", host+"If-Modified-Since: "+mtime.Format(http.TimeFormat)+"\r\n"),
		"if-none-match":      req("GET /a.txt HTTP/1.1", host+"If-None-Match: "+etag+"\r\n"),
		"query":              req("GET /q.txt?x=1&y=two%20words HTTP/1.1", host),
		"index":              req("GET / HTTP/1.1", host+"Accept: text/html\r\n"),
		"HEAD big":           req("HEAD /big.bin HTTP/1.1", host),
		"404":                req("GET /missing.txt HTTP/1.1", host),
		"big":                req("GET /big.bin HTTP/1.1", host),
	}
	never := map[string]bool{"404": true, "big": true}
	var cases []diffCase
	for _, name := range slices.Sorted(maps.Keys(q)) {
		cases = append(cases, diffCase{name, []string{q[name]}})
	}
	cases = append(cases,
		diffCase{"keep-alive", []string{q["GET"], q["HEAD"], q["long"], q["range"], q["if-modified-since"], q["if-none-match"],
			q["query"], q["index"], q["HEAD big"], q["HTTP/1.0 keepalive"], q["GET"], q["close"]}},
		diffCase{"keep-alive, 404", []string{q["GET"], q["404"], q["GET"], q["long"], q["HEAD"]}},
		diffCase{"keep-alive, big", []string{q["long"], q["big"], q["range"], q["HTTP/1.0"]}},
		diffCase{"HTTP/1.0 keep-alive", []string{q["HTTP/1.0 keepalive"], q["HTTP/1.0 keepalive"], q["HEAD HTTP/1.0"]}},
		diffCase{"long close", []string{q["long"], q["long close"]}},
		diffCase{"nginx's Connection", []string{q["close, keep-alive"], q["keep-alive-x"], q["GET"]}},
	)
	// expected: eBPF answers each offloaded request until the first that
	// is not, which hands the connection over
	wantHits, wantAnswered, wantHandovers := map[string]uint64{}, uint64(0), uint64(0)
	for _, c := range cases {
		for _, x := range c.reqs {
			if never[reqName(q, x)] {
				wantHandovers++
				break
			}
			wantHits[x]++
			wantAnswered++
		}
	}
	run := func(phase string) map[string]conversation {
		out := map[string]conversation{}
		for _, c := range cases {
			conv := r.converse(r.ng.Addr4, c.reqs, 100*time.Millisecond)
			checkResponses(t, phase+" "+c.name, files, c.reqs, conv)
			out[c.name] = conv
		}
		return out
	}

	// learning: each request first on a connection of its own
	for _, x := range q {
		r.converse(r.ng.Addr4, []string{x}, 0)
	}
	var offloaded []string
	for name, x := range q {
		if !never[name] {
			offloaded = append(offloaded, x)
		}
	}
	r.waitRequests(offloaded...)
	if rep := r.ctl.Report(); rep.TooBig != 1 || rep.Skipped != 2 {
		t.Errorf("controller %+v: want the big file too big and the 404 skipped", rep)
	}

	before, rules0 := r.counters(), r.rules()
	on := run("on")
	d, rules1 := delta(before, r.counters()), r.rules()
	t.Logf("offload on: counters %v", d)
	if d["answered"] != wantAnswered || d["tcp_handed_over"] != wantHandovers {
		t.Errorf("offload on: answered +%d, handed over +%d; want +%d, +%d", d["answered"], d["tcp_handed_over"], wantAnswered, wantHandovers)
	}
	hits := func(rs []e2eRule) map[string]uint64 {
		m := map[string]uint64{}
		for _, x := range rs {
			m[x.request] += x.hits
		}
		return m
	}
	h0, h1 := hits(rules0), hits(rules1)
	for _, x := range offloaded {
		if got := h1[x] - h0[x]; got != wantHits[x] {
			t.Errorf("offload on: the rule of %s: +%d hits, want +%d", reqName(q, x), got, wantHits[x])
		}
	}
	// the offloaded replies' Dates are current (rewritten every second)
	now := time.Now()
	for name, conv := range on {
		for _, resp := range conv.resps {
			if dt, err := http.ParseTime(resp.get("Date")); err != nil || dt.Before(now.Add(-3*time.Second)) || dt.After(now.Add(time.Second)) {
				t.Errorf("offload on, %s: Date %q, now %v", name, resp.get("Date"), now.UTC().Format(http.TimeFormat))
			}
		}
	}

	r.stopController()
	before = r.counters()
	off := run("off")
	d = delta(before, r.counters())
	t.Logf("offload off: counters %v", d)
	if d["answered"] != 0 || d["tcp_syn_answered"] != 0 {
		t.Errorf("offload off: eBPF answered: %v", d)
	}

	for _, c := range cases {
		a, b := on[c.name], off[c.name]
		if a.closed != b.closed {
			t.Errorf("%s: the connection ends after the last response: %v with offload, %v without", c.name, a.closed, b.closed)
		}
		if !bytes.Equal(maskDate(a.stream), maskDate(b.stream)) {
			t.Errorf("%s: the byte streams differ beyond Date:\n on: %q\noff: %q", c.name, firstDiff(maskDate(a.stream), maskDate(b.stream)),
				firstDiff(maskDate(b.stream), maskDate(a.stream)))
		}
		for i := range min(len(a.resps), len(b.resps)) {
			if (a.resps[i].get("Date") == "") != (b.resps[i].get("Date") == "") {
				t.Errorf("%s, response %d: a Date header with offload %v, without %v", c.name, i, a.resps[i].get("Date") != "", b.resps[i].get("Date") != "")
			}
		}
	}
}

// reqName is the name of request x in q.
func reqName(q map[string]string, x string) string {
	for name, y := range q {
		if y == x {
			return name
		}
	}
	return "?"
}

// firstDiff is a's bytes from a little before where it first differs
// from b.
func firstDiff(a, b []byte) []byte {
	i := 0
	for i < len(a) && i < len(b) && a[i] == b[i] {
		i++
	}
	from := max(0, i-40)
	return a[from:min(len(a), i+80)]
}

// checkResponses checks responses against the files: each request's
// status and body (a Range's bytes, none for HEAD or 304), and that a
// connection ends exactly when nginx's last response says it does.
func checkResponses(t *testing.T, what string, files map[string][]byte, reqs []string, conv conversation) {
	t.Helper()
	for i, x := range reqs {
		resp := conv.resps[i]
		f := strings.Fields(requestLine(x))
		status, body := "200 OK", files[fileFor(f[1])]
		switch {
		case strings.Contains(x, "\r\nRange: bytes=100-2099\r\n"):
			status, body = "206 Partial Content", body[100:2100]
		case strings.Contains(x, "\r\nIf-"):
			status, body = "304 Not Modified", nil
		case body == nil:
			status = "404 Not Found"
			body = resp.body // nginx's error page
		}
		if f[0] == "HEAD" {
			body = nil
		}
		if resp.status != "HTTP/1.1 "+status || !bytes.Equal(resp.body, body) {
			t.Errorf("%s, request %d %q: %q with %d bytes, want %q with %d", what, i, requestLine(x), resp.status, len(resp.body), status, len(body))
		}
	}
	// nginx says whether it ends the connection (it reads the request's
	// Connection header its own way: the last of two counts)
	wantClose := conv.resps[len(reqs)-1].get("Connection") == "close"
	if conv.closed != wantClose {
		t.Errorf("%s: connection closed %v, want %v", what, conv.closed, wantClose)
	}
}

// TestE2EMixed: connections that start with replies from eBPF, then ask
// for something nginx must answer (a path the controller does not
// offload), then for offloaded paths again, which nginx now answers: the
// kernel owns the connection. The byte stream the client reads is the one
// nginx alone sends (Date aside), and nginx's access log holds exactly
// the requests from the handover on.
func TestE2EMixed(t *testing.T) {
	files := e2eFiles()
	r := newE2E(t, e2eOptions{files: files, paths: []string{"/a.txt", "/m.bin"}, accessLog: true})
	host := "Host: " + r.ng.Addr4.String() + "\r\n"
	get := func(p, extra string) string { return "GET " + p + " HTTP/1.1\r\n" + host + extra + "\r\n" }
	a, m, other := get("/a.txt", ""), get("/m.bin", ""), get("/other.txt", "")
	cases := []struct {
		name  string
		reqs  []string
		eBPF  int // the first eBPF answers; nginx the rest
		close bool
	}{
		{"short replies first", []string{a, a, other, a, m, "HEAD /a.txt HTTP/1.1\r\n" + host + "\r\n", get("/a.txt", "Connection: close\r\n")}, 2, true},
		{"a long reply first", []string{m, other, m, a}, 1, false},
		{"a close after the handover", []string{a, m, other, get("/m.bin", "Connection: close\r\n")}, 2, true},
	}
	for _, x := range []string{a, m} {
		r.converse(r.ng.Addr4, []string{x}, 0)
	}
	r.converse(r.ng.Addr4, []string{other}, 0) // not offloaded: not among the paths
	r.waitRequests(a, m)
	time.Sleep(1100 * time.Millisecond) // the next learning round, which must not offload other.txt
	if rep := r.ctl.Report(); rep.Rules != 2 || rep.Ignored == 0 {
		t.Fatalf("controller %+v: want a.txt and m.bin offloaded, other.txt's sample ignored", rep)
	}

	run := func(phase string, offload bool) map[string]conversation {
		out := map[string]conversation{}
		for _, c := range cases {
			log0 := len(r.clientAccessLog())
			before := r.counters()
			conv := r.converse(r.ng.Addr4, c.reqs, 200*time.Millisecond)
			d := delta(before, r.counters())
			checkResponses(t, phase+" "+c.name, files, c.reqs, conv)
			out[c.name] = conv
			want := c.reqs
			if offload {
				want = c.reqs[c.eBPF:]
				if d["answered"] != uint64(c.eBPF) || d["tcp_handed_over"] != 1 {
					t.Errorf("%s %s: answered +%d, handed over +%d; want +%d, +1", phase, c.name, d["answered"], d["tcp_handed_over"], c.eBPF)
				}
			} else if d["answered"] != 0 || d["tcp_handed_over"] != 0 {
				t.Errorf("%s %s: counters %v", phase, c.name, d)
			}
			var wantLines []string
			for _, q := range want {
				wantLines = append(wantLines, requestLine(q))
			}
			// nginx logs a request once it has answered it
			var got []string
			for deadline := time.Now().Add(2 * time.Second); ; time.Sleep(20 * time.Millisecond) {
				got = r.clientAccessLog()[log0:]
				if len(got) >= len(wantLines) || time.Now().After(deadline) {
					break
				}
			}
			if !slices.Equal(got, wantLines) {
				t.Errorf("%s %s: nginx's access log:\n%q\nwant:\n%q", phase, c.name, got, wantLines)
			}
			if conv.closed != c.close {
				t.Errorf("%s %s: closed %v, want %v", phase, c.name, conv.closed, c.close)
			}
		}
		return out
	}
	on := run("on", true)
	r.stopController()
	off := run("off", false)
	for _, c := range cases {
		if a, b := maskDate(on[c.name].stream), maskDate(off[c.name].stream); !bytes.Equal(a, b) {
			t.Errorf("%s: the byte streams differ beyond Date:\n on: %q\noff: %q", c.name, firstDiff(a, b), firstDiff(b, a))
		}
	}
}

// TestE2ELoss runs curl and Python's http.client over a link that loses
// 10% of the frames and reorders some, both ways (XDP_TX replies
// included): the requests are learned, then answered by eBPF, and every
// response arrives intact, also on a keep-alive connection handed over to
// nginx mid-stream.
func TestE2ELoss(t *testing.T) {
	files := e2eFiles()
	r := newE2E(t, e2eOptions{files: files, impair: true})
	if err := r.link.SetBoth(testbed.Impairment{Loss: 0.10, Reorder: 0.05, ReorderWait: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	out := func(name string) string { return filepath.Join(dir, name) }
	script := writeTemp(t, dir, "client.py", pythonClient)
	url := r.ng.URL4
	curlAll := func() {
		got := r.curl("-w", "%{num_connects} ",
			"-o", out("1"), url("/a.txt"), "-o", out("2"), url("/m.bin"), "-o", out("3"), url("/"), "-o", out("4"), url("/a.txt"))
		if got != "1 0 0 0 " {
			t.Errorf("keep-alive: connects per request %q, want \"1 0 0 0 \"", got)
		}
		for i, f := range []string{"a.txt", "m.bin", "index.html", "a.txt"} {
			checkFile(t, out(fmt.Sprint(i+1)), files[f], "keep-alive "+f)
		}
		r.curl("-o", out("5"), url("/m.bin"))
		checkFile(t, out("5"), files["m.bin"], "m.bin")
		// handed over mid-stream, under loss: eBPF, then nginx
		got = r.curl("-w", "%{num_connects} ",
			"-o", out("6"), url("/m.bin"), "-o", out("7"), url("/big.bin"), "-o", out("8"), url("/a.txt"))
		if got != "1 0 0 " {
			t.Errorf("keep-alive with a handover: connects per request %q, want \"1 0 0 \"", got)
		}
		for i, f := range []string{"m.bin", "big.bin", "a.txt"} {
			checkFile(t, out(fmt.Sprint(i+6)), files[f], "keep-alive with a handover: "+f)
		}
	}
	// learning, under loss too. Each request is sent once a pass, so one
	// lost sample would leave it unlearned (as a request nobody repeats
	// is): a second pass may follow, as clients would ask again.
	for pass := 1; ; pass++ {
		for _, p := range []string{"/a.txt", "/m.bin", "/"} {
			r.curl("-o", out("learn"), url(p))
		}
		r.runPython(script, "learn")
		learned, all := r.learnedWithin(10*time.Second, func(rs []e2eRule) bool { return len(rs) == 10 })
		t.Logf("learning pass %d: %d of 10 requests offloaded", pass, len(learned))
		if all {
			break
		}
		if pass == 2 {
			r.waitLines(4, "GET /a.txt HTTP/1.1", "GET /m.bin HTTP/1.1", "GET / HTTP/1.1", "HEAD /a.txt HTTP/1.1", "HEAD /m.bin HTTP/1.1", "GET /a.txt HTTP/1.0")
			r.waitRules("the raw HTTP/1.0 request and Python's", func(rs []e2eRule) bool { return len(rs) == 10 })
		}
	}

	const rounds = 5
	before := r.counters()
	lost0 := r.link.Counters(testbed.ToClient).Dropped + r.link.Counters(testbed.ToServer).Dropped
	start := time.Now()
	for i := range rounds {
		t0 := time.Now()
		curlAll()
		t1 := time.Now()
		r.runPython(script, "check")
		t.Logf("round %d: curl %v, python %v", i, t1.Sub(t0).Round(time.Millisecond), time.Since(t1).Round(time.Millisecond))
	}
	d := delta(before, r.counters())
	lost := r.link.Counters(testbed.ToClient).Dropped + r.link.Counters(testbed.ToServer).Dropped - lost0
	t.Logf("%d rounds in %v, %d frames lost; counters %v", rounds, time.Since(start).Round(time.Millisecond), lost, d)
	if lost == 0 {
		t.Fatal("the link lost nothing: the test proves nothing")
	}
	// per round: curl 6, python 7; a request retransmitted after its
	// reply was lost is answered again (counted again); one handover
	if want := uint64(rounds * 13); d["answered"] < want || d["tcp_handed_over"] != rounds {
		t.Errorf("answered +%d, handed over +%d; want at least %d, %d", d["answered"], d["tcp_handed_over"], want, rounds)
	}
}

// TestE2ELostAckAfterCloseReply: a long reply that ends the connection
// (TC's segments, the last with FIN) acks the client's request only once
// the client acks the whole reply (tcp_request_acked). If that ack is lost,
// the client retransmits its request, echoing the stamp of eBPF's FIN: it
// must be acked again (not dropped as data after the FIN), or the request
// stays unacked for good, the client's FIN queues behind it and the
// client's kernel ends the connection by timeout, minutes later.
func TestE2ELostAckAfterCloseReply(t *testing.T) {
	r := newE2E(t, e2eOptions{files: e2eFiles(), impair: true})
	q := "GET /m.bin HTTP/1.1\r\nHost: " + r.ng.Addr4.String() + "\r\nConnection: close\r\n\r\n"
	r.converse(r.ng.Addr4, []string{q}, 0)
	r.waitRequests(q)
	// the replies take 300 ms to the client: time to cut the way back
	// (the client's RTO stays under 1 s)
	if err := r.link.Set(testbed.ToClient, testbed.Impairment{Delay: 300 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	c := r.dial(r.ng.Addr4)
	defer c.Close()
	before := r.counters()
	if _, err := io.WriteString(c, q); err != nil {
		t.Fatal(err)
	}
	// until eBPF has answered: the reply is on its way (not the request:
	// cut, it would not reach eBPF)
	for deadline := time.Now().Add(2 * time.Second); r.counters()["answered"] == before["answered"]; time.Sleep(2 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("eBPF did not answer the request within 2 s: counters %v", delta(before, r.counters()))
		}
	}
	// the client's acks of the reply (and its retransmissions) are lost
	lost0 := r.link.Counters(testbed.ToServer).Dropped
	if err := r.link.Set(testbed.ToServer, testbed.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	resp, err := io.ReadAll(c) // the whole reply and eBPF's FIN
	if err != nil || !bytes.HasSuffix(resp, r.files["m.bin"]) {
		t.Fatalf("read %d bytes (%v)", len(resp), err)
	}
	time.Sleep(200 * time.Millisecond)
	if r.link.Counters(testbed.ToServer).Dropped == lost0 {
		t.Fatal("none of the client's acks was lost: the test proves nothing")
	}
	r.link.Set(testbed.ToServer, testbed.Impairment{})
	r.link.Set(testbed.ToClient, testbed.Impairment{})
	// the link is whole again: the client's next retransmission of its
	// request (RTO at most 1 s here) should get it acked
	unacked := func() uint32 {
		raw, err := c.(*net.TCPConn).SyscallConn()
		if err != nil {
			t.Fatal(err)
		}
		var info *unix.TCPInfo
		raw.Control(func(fd uintptr) { info, err = unix.GetsockoptTCPInfo(int(fd), unix.IPPROTO_TCP, unix.TCP_INFO) })
		if err != nil {
			t.Fatal(err)
		}
		return info.Unacked
	}
	deadline := time.Now().Add(3 * time.Second)
	for unacked() != 0 && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
	}
	if n := unacked(); n != 0 {
		ss, _ := r.tb.Client.Run("ss", "-tnio", "dport", fmt.Sprint(testPort))
		t.Errorf("3 s after the link recovered, the client's request is still unacked (%d segment): counters %v\n%s",
			n, delta(before, r.counters()), ss)
	}
}

// TestE2EFollowRestart: when nginx stops, its listening sockets close and
// the controller returns at once with follow.ErrServerGone; a controller
// run under follow.Run (santa http --follow) waits for the new nginx,
// learns again and its rules answer.
func TestE2EFollowRestart(t *testing.T) {
	root := t.TempDir()
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"a.txt": []byte("before and after the restart\n")}
	r := newE2E(t, e2eOptions{files: files, root: root})
	r.curl(r.ng.URL4("/a.txt"))
	r.waitLines(4, "GET /a.txt HTTP/1.1")

	if err := r.ng.Stop(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-r.errc:
		r.stopped = true
		if !errors.Is(err, follow.ErrServerGone) {
			t.Fatalf("the controller ended with %v, want follow.ErrServerGone", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the controller still runs 5 s after nginx stopped")
	}

	ready := make(chan struct{}, 4)
	cfg := r.ctl.cfg
	cfg.Ready = func(Report) { ready <- struct{}{} }
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- r.tb.Server.Do(func() error {
			o := follow.Options{Follow: true, Port: testPort, Protocol: api.ProtocolTCP, Settle: 100 * time.Millisecond, Log: cfg.Log}
			return follow.Run(ctx, o, func(ctx context.Context) error {
				ctl, err := New(cfg)
				if err != nil {
					return err
				}
				return ctl.Run(ctx)
			})
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-errc; err != nil {
			t.Errorf("following controller: %v", err)
		}
	})
	select {
	case <-ready:
		t.Fatal("the following controller attached while nginx was stopped")
	case err := <-errc:
		t.Fatalf("the following controller ended while nginx was stopped: %v", err)
	case <-time.After(time.Second):
	}
	ng, err := r.tb.StartNginx(testbed.NginxOptions{Port: testPort, IPv6: true, Root: root, Files: files})
	if err != nil {
		t.Fatal(err)
	}
	r.ng = ng
	select {
	case <-ready:
	case <-time.After(15 * time.Second):
		t.Fatal("the following controller did not attach to the new nginx within 15 s")
	}
	dir := t.TempDir()
	r.curlFile(dir, "learn", "/a.txt")
	r.waitLines(4, "GET /a.txt HTTP/1.1")
	before := r.counters()["answered"]
	checkFile(t, r.curlFile(dir, "a", "/a.txt"), files["a.txt"], "after the restart")
	if r.counters()["answered"] == before {
		t.Error("after the restart the rule processor answered nothing")
	}
}

// TestE2ESantadGone: when santad is killed the controller exits without
// deleting its rules, and they keep answering from the data plane (its
// links are pinned), with what they had: here a file changed since. The
// data plane itself stops them at the end of their lease, with no santad
// to remove them; from then on nginx answers, and the next santad does
// not bring them back.
func TestE2ESantadGone(t *testing.T) {
	// not minLease: renewed with half of it left, a rule may have only 2 s
	// after the kill, too little on a slow machine for the controller to
	// end and the "stale" fetch to be answered before the lease ends
	const lease = 2 * minLease
	r, dir, killed := offloadThenKillSantad(t, lease)
	// renewed last before the kill, for lease rounded up to the second
	time.Sleep(time.Until(killed.Add(lease + time.Second + 100*time.Millisecond)))
	checkFile(t, r.curlFile(dir, "expired", "/a.txt"), fileAfter, "once the lease ended, santad still gone")
	r.restartSantad()
	checkFile(t, r.curlFile(dir, "restarted", "/a.txt"), fileAfter, "after santad restarted")
	socks, err := r.client.ListSockets()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range socks {
		if s.Rules != 0 {
			t.Errorf("the restarted santad restored %d rules of socket %v, whose leases ended", s.Rules, s.AddrPort())
		}
	}
}

// TestE2EStartedAnew: a controller that ended while santad was away (here
// killed with SIGKILL) left its rule, which the next santad restores with
// its tag and which answers with the file as it was. The next controller
// takes it over at its start, long before the rule's lease would end: it
// fetches the request's response again and replaces the rule, so the
// kernel answers the changed file at once, without learning it again.
func TestE2EStartedAnew(t *testing.T) {
	r, dir, _ := offloadThenKillSantad(t, 0)
	r.restartSantad()
	// the premise: the restored rule answers, with the old file
	checkFile(t, r.curlFile(dir, "stale", "/a.txt"), fileBefore, "after santad restarted, no controller running")

	r.startController(e2eOptions{})
	before := r.counters()["answered"]
	checkFile(t, r.curlFile(dir, "offloaded-again", "/a.txt"), fileAfter, "once the next controller started")
	if r.counters()["answered"] == before {
		t.Error("the first request after the next controller started did not come from its rule")
	}
	socks, err := r.client.ListSockets()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range socks {
		if s.Rules > 1 {
			t.Errorf("socket %v holds %d rules, want the next controller's one at most", s.AddrPort(), s.Rules)
		}
	}
}

// slowBin has nginx send /slow.bin at 2 kB/s (the rest at full speed):
// fetching it holds a controller's takeover for a second or so.
const slowBin = "map $uri $santa_test_rate { /slow.bin 2k; default 0; }\nlimit_rate $santa_test_rate;"

// TestE2EChangedDuringTakeover: a file changed while the next controller
// takes over the rules a predecessor left, after it fetched the file's
// response again, is seen: the root is watched before the takeover's
// fetches (before, from after them on: the rule answered the old file
// until re-validation). nginx sends slow.bin, whose rule is taken over
// after a.txt's, at 2 kB/s, which holds the takeover for a second or two.
func TestE2EChangedDuringTakeover(t *testing.T) {
	r := newE2E(t, e2eOptions{files: map[string][]byte{"a.txt": fileBefore, "slow.bin": bytes.Repeat([]byte{'s'}, 2500)},
		nginxHTTP: slowBin})
	dir := t.TempDir()
	r.curlFile(dir, "learn", "/a.txt")
	r.waitLines(4, "GET /a.txt HTTP/1.1") // a.txt's rule first: taken over first
	r.curlFile(dir, "slow", "/slow.bin")
	r.waitLines(4, "GET /a.txt HTTP/1.1", "GET /slow.bin HTTP/1.1")
	if err := r.sd.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.errc:
		r.stopped = true
	case <-time.After(10 * time.Second):
		t.Fatal("the controller still runs 10 s after santad was killed")
	}
	r.restartSantad()
	changed := make(chan error, 1)
	go func() {
		// during the fetches of slow.bin, after those of a.txt
		time.Sleep(700 * time.Millisecond)
		changed <- os.WriteFile(filepath.Join(r.ng.Root, "a.txt"), fileAfter, 0o644)
	}()
	start := time.Now()
	r.startController(e2eOptions{})
	if err := <-changed; err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took < time.Second {
		t.Fatalf("the takeover took %v: a.txt may have changed after it", took)
	}
	time.Sleep(300 * time.Millisecond) // the change's settle and fetch
	checkFile(t, r.curlFile(dir, "after", "/a.txt"), fileAfter, "after a change during the takeover")
}

// a.txt of offloadThenKillSantad, before and after santad was killed.
var (
	fileBefore = []byte("the version before santad went away\n")
	fileAfter  = []byte("the version after santad went away, longer\n")
)

// offloadThenKillSantad starts a rig with lease (0: the default) whose
// controller offloads GET /a.txt (fileBefore), kills santad, waits until
// the controller ended and changes a.txt to fileAfter; the rule still
// answers with fileBefore. dir is for the files curl fetches (curlFile);
// killed is when santad was killed.
func offloadThenKillSantad(t *testing.T, lease time.Duration) (r *e2eRig, dir string, killed time.Time) {
	t.Helper()
	r = newE2E(t, e2eOptions{files: map[string][]byte{"a.txt": fileBefore}, lease: lease})
	dir = t.TempDir()
	r.curlFile(dir, "learn", "/a.txt")
	r.waitLines(4, "GET /a.txt HTTP/1.1")
	before := r.counters()["answered"]
	checkFile(t, r.curlFile(dir, "offloaded", "/a.txt"), fileBefore, "offloaded")
	if r.counters()["answered"] == before {
		t.Fatal("the rule processor did not answer the learned request")
	}

	if err := r.sd.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed = time.Now()
	select {
	case err := <-r.errc:
		r.stopped = true
		t.Logf("the controller ended with: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the controller still runs 10 s after santad was killed")
	}
	if err := os.WriteFile(filepath.Join(r.ng.Root, "a.txt"), fileAfter, 0o644); err != nil {
		t.Fatal(err)
	}
	checkFile(t, r.curlFile(dir, "stale", "/a.txt"), fileBefore, "right after santad was killed")
	return r, dir, killed
}

// reloadNginx rewrites nginx's worker_processes from one count to another
// and reloads it (SIGHUP), then waits until the port has want listening
// sockets.
func reloadNginx(t *testing.T, r *e2eRig, from, to, want int) {
	t.Helper()
	conf, err := os.ReadFile(r.ng.Conf)
	if err != nil {
		t.Fatal(err)
	}
	old := fmt.Sprintf("worker_processes %d;", from)
	if !strings.Contains(string(conf), old) {
		t.Fatalf("no %q in nginx.conf", old)
	}
	if err := os.WriteFile(r.ng.Conf, []byte(strings.Replace(string(conf), old, fmt.Sprintf("worker_processes %d;", to), 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(r.ng.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		out, err := r.tb.Server.Run("ss", "-Hltn", fmt.Sprintf("sport = :%d", testPort))
		if err != nil {
			t.Fatal(err)
		}
		n := len(strings.Fields(strings.TrimSpace(out))) / 5 // State Recv-Q Send-Q Local Peer
		if n == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nginx listens on %d sockets 10 s after the reload, want %d", n, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// allAnswered fetches a.txt n times over IPv4 and n over IPv6, each on a
// connection of its own, and fails unless every one is the file and is
// answered by eBPF.
func allAnswered(t *testing.T, r *e2eRig, n int, file []byte, what string) {
	t.Helper()
	before := r.counters()
	for _, url := range []string{r.ng.URL4("/a.txt"), r.ng.URL6("/a.txt")} {
		out, err := r.tb.Client.Run("sh", "-c", fmt.Sprintf(
			`for i in $(seq %d); do curl -sS --fail --max-time 10 -g %s || echo FAILED; done`, n, url))
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.Repeat(string(file), n); out != want {
			t.Errorf("%s: %d fetches of %s: got %q, want the file %d times", what, n, url, out, n)
		}
	}
	d := delta(before, r.counters())
	if d["answered"] != uint64(2*n) || d["tcp_handed_over"] != 0 || d["pass_no_ruleset"] != 0 {
		t.Errorf("%s: %d connections: answered +%d, tcp_handed_over +%d, pass_no_ruleset +%d; want every one answered by eBPF (counters %v)",
			what, 2*n, d["answered"], d["tcp_handed_over"], d["pass_no_ruleset"], d)
	}
}

// TestE2EReloadClosesListeners: a reload of nginx with fewer workers
// (reuseport: a listening socket per worker and address) closes some of
// the port's sockets and keeps the others. Their rules went with the
// closed sockets; the controller carries on with the sockets left, their
// rules in place, rather than ending (or, with --follow, deleting every
// rule and learning again, which sent every request to nginx meanwhile
// and handed its keep-alive connections over for good).
func TestE2EReloadClosesListeners(t *testing.T) {
	files := map[string][]byte{"a.txt": []byte("answered before and after the reload\n")}
	r := newE2E(t, e2eOptions{files: files, reuseport: true, workers: 2})
	r.curl("-o", "/dev/null", r.ng.URL4("/a.txt"))
	r.curl("-o", "/dev/null", "-g", r.ng.URL6("/a.txt"))
	r.waitLines(4, "GET /a.txt HTTP/1.1")
	r.waitLines(6, "GET /a.txt HTTP/1.1")
	allAnswered(t, r, 8, files["a.txt"], "before the reload")

	reloadNginx(t, r, 2, 1, 2)
	// the controller carries on; its rules stay on the sockets left
	deadline := time.Now().Add(3 * time.Second)
	for {
		select {
		case err := <-r.errc:
			r.stopped = true
			t.Fatalf("the controller ended at the reload: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if got := r.ctl.Report().Sockets; got != 2 {
		t.Errorf("the controller counts %d sockets after the reload, want the 2 left", got)
	}
	allAnswered(t, r, 12, files["a.txt"], "after the reload")
}

// reloadWithWorkers reloads nginx (SIGHUP), with reuseport and one worker,
// with n workers, and waits until it listens on a socket per worker and
// address.
func (r *e2eRig) reloadWithWorkers(n int) {
	t := r.t
	t.Helper()
	listeners := func() int {
		out, err := r.tb.Server.Run("ss", "-Hltn", fmt.Sprintf("sport = :%d", testPort))
		if err != nil {
			t.Fatal(err)
		}
		return len(strings.Fields(strings.TrimSpace(out))) / 5 // State Recv-Q Send-Q Local Peer
	}
	if got := listeners(); got != 2 {
		t.Fatalf("nginx listens on %d sockets before the reload, want 2", got)
	}
	conf, err := os.ReadFile(r.ng.Conf)
	if err != nil {
		t.Fatal(err)
	}
	more := strings.Replace(string(conf), "worker_processes 1;", fmt.Sprintf("worker_processes %d;", n), 1)
	if more == string(conf) {
		t.Fatal("no worker_processes 1 in nginx.conf")
	}
	if err := os.WriteFile(r.ng.Conf, []byte(more), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(r.ng.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for listeners() != 2*n {
		if time.Now().After(deadline) {
			t.Fatalf("nginx listens on %d sockets 10 s after the reload, want %d", listeners(), 2*n)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestE2EReloadAddsListeners: a reload of nginx (SIGHUP) that opens more
// listening sockets on the port (here more workers with reuseport, a
// socket each per address) keeps the old ones, and connections are spread
// over old and new alike. The controller attaches to the new sockets
// within a second or so and gives them the rules of their group: every
// connection is answered by eBPF, none goes to nginx for want of a rule
// set (pass_no_ruleset) or a rule (tcp_handed_over).
func TestE2EReloadAddsListeners(t *testing.T) {
	files := map[string][]byte{"a.txt": []byte("answered on every socket of the port\n")}
	r := newE2E(t, e2eOptions{files: files, reuseport: true})
	r.curl("-o", "/dev/null", r.ng.URL4("/a.txt"))
	r.curl("-o", "/dev/null", "-g", r.ng.URL6("/a.txt"))
	r.waitLines(4, "GET /a.txt HTTP/1.1")
	r.waitLines(6, "GET /a.txt HTTP/1.1")

	r.reloadWithWorkers(2)
	// every socket of the port has a rule set holding the group's rule
	deadline := time.Now().Add(5 * time.Second)
	for {
		socks, err := r.client.ListSockets()
		if err != nil {
			t.Fatal(err)
		}
		withRule := 0
		for _, s := range socks {
			if s.Port == testPort && s.Rules == 1 {
				withRule++
			}
		}
		if withRule == 4 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after nginx opened them, %d of the port's 4 listening sockets have the controller's rule: %+v", withRule, socks)
		}
		time.Sleep(50 * time.Millisecond)
	}
	select {
	case err := <-r.errc:
		r.stopped = true
		t.Fatalf("the controller ended after the reload: %v", err)
	default:
	}

	const n = 24
	before := r.counters()
	for _, url := range []string{r.ng.URL4("/a.txt"), r.ng.URL6("/a.txt")} {
		out, err := r.tb.Client.Run("sh", "-c", fmt.Sprintf(
			`for i in $(seq %d); do curl -sS --fail --max-time 10 -g %s || echo FAILED; done`, n, url))
		if err != nil {
			t.Fatal(err)
		}
		if want := strings.Repeat(string(files["a.txt"]), n); out != want {
			t.Errorf("%d fetches of %s: got %q, want the file %d times", n, url, out, n)
		}
	}
	d := delta(before, r.counters())
	if d["answered"] != 2*n || d["tcp_handed_over"] != 0 || d["pass_no_ruleset"] != 0 {
		t.Errorf("%d connections after the reload: answered +%d, tcp_handed_over +%d, pass_no_ruleset +%d; want every one answered by eBPF (counters %v)",
			2*n, d["answered"], d["tcp_handed_over"], d["pass_no_ruleset"], d)
	}
}

// TestE2ERootSwapped: nginx's root is a symbolic link to a release
// directory, and a deploy points it at the next release atomically (a new
// link renamed over it), as deploy tools do. nginx serves the new release
// at once; so must the kernel: the controller follows the link to the new
// directory, fetches every rule again, and watches the new directory, so
// that a later change in it is seen at once too. (It resolved the link
// once at its start: the kernel served the old release until
// re-validation, up to --interval later, and later changes in the new
// release went unseen by inotify.)
func TestE2ERootSwapped(t *testing.T) {
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	v1, v2, current := filepath.Join(base, "v1"), filepath.Join(base, "v2"), filepath.Join(base, "current")
	for _, d := range []string{v1, v2} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(v1, current); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"r.txt": []byte("release one\n")}
	if err := os.WriteFile(filepath.Join(v2, "r.txt"), []byte("release two, longer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	r := newE2E(t, e2eOptions{files: files, root: current})
	dir := t.TempDir()
	get := func() string {
		b, err := os.ReadFile(r.curlFile(dir, "r", "/r.txt"))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	get()
	rules := r.waitLines(4, "GET /r.txt HTTP/1.1")
	if got := get(); got != "release one\n" {
		t.Fatalf("before the deploy: %q", got)
	}
	answered := r.counters()["answered"]
	if answered == 0 {
		t.Fatalf("the rule (%v) did not answer before the deploy", rules)
	}
	within := func(what, want string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Second)
		for {
			got := get()
			if got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: still %q 2 s later, want %q (nginx serves it at once)", what, got, want)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// the deploy: a new link renamed over the old one
	if err := os.Symlink(v2, current+".new"); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(current+".new", current); err != nil {
		t.Fatal(err)
	}
	within("after the link was swapped", "release two, longer\n")
	if err := os.WriteFile(filepath.Join(v2, "r.txt"), []byte("release two, fixed\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	within("after a file of the new release changed", "release two, fixed\n")
	// and the kernel answers again
	r.waitRules("the rule back with the new release", func(rs []e2eRule) bool {
		for _, x := range rs {
			if x.family == 4 && strings.HasSuffix(string(x.reply), "release two, fixed\n") {
				return true
			}
		}
		return false
	})
	before := r.counters()["answered"]
	if got := get(); got != "release two, fixed\n" {
		t.Errorf("after the rule came back: %q", got)
	}
	if r.counters()["answered"] == before {
		t.Error("the kernel no longer answers after the deploy")
	}
}

// TestE2ESantadRestartedAtOnce: santad killed and started again at once
// (as systemd's Restart= or an upgrade does) ends the controller's run, as
// any santad that goes away does, and its rules stay with the new santad,
// answering until their lease. Before, the run's exit dialed the new santad
// and deleted them there: every request went to nginx until the next run
// learned them again, and for good without --follow. The controller is
// meanwhile fetching slow.bin again after a change (nginx sends it at
// 2 kB/s). (That fetch held the controller's loop, so it saw santad gone
// only once the new one served; it runs off the loop now, and the
// controller may see santad gone before the new one serves.)
func TestE2ESantadRestartedAtOnce(t *testing.T) {
	slow := bytes.Repeat([]byte{'s'}, 3000)
	r := newE2E(t, e2eOptions{files: map[string][]byte{"a.txt": fileBefore, "slow.bin": slow},
		nginxHTTP: slowBin})
	dir := t.TempDir()
	r.curlFile(dir, "learn", "/a.txt")
	r.curlFile(dir, "slow", "/slow.bin")
	learned := r.waitLines(4, "GET /a.txt HTTP/1.1", "GET /slow.bin HTTP/1.1")
	if err := os.WriteFile(filepath.Join(r.ng.Root, "slow.bin"), slow, 0o644); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // settled: the fetch is under way
	if err := r.sd.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	r.restartSantad()
	select {
	case err := <-r.errc:
		r.stopped = true
		t.Logf("the controller ended with: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the controller still runs 10 s after santad was killed")
	}
	var left []e2eRule
	for _, rule := range r.rules() {
		if rule.family == 4 {
			left = append(left, rule)
		}
	}
	if len(left) == 0 || len(left) > len(learned) {
		t.Fatalf("the new santad holds %d IPv4 rules, want those the controller left (%d before slow.bin changed)", len(left), len(learned))
	}
	before := r.counters()["answered"]
	checkFile(t, r.curlFile(dir, "offloaded", "/a.txt"), fileBefore, "after the restart")
	if r.counters()["answered"] == before {
		t.Error("the rule processor did not answer /a.txt with the rule the controller left")
	}
}

// TestE2EDateWhileNginxHung: while nginx is hung (SIGSTOP) and the
// controller's fetch of a request learned meanwhile waits for it
// (--timeout 1 min), the rules' Dates are still rewritten every second:
// curl, answered by eBPF, gets a Date at most 2 s behind its clock, a
// later one each second. The fetches ran on the controller's loop, which
// rewrote no Date until the fetch gave up.
func TestE2EDateWhileNginxHung(t *testing.T) {
	r := newE2E(t, e2eOptions{files: map[string][]byte{"a.txt": fileBefore, "b.txt": fileAfter}, timeout: time.Minute})
	dir := t.TempDir()
	r.curlFile(dir, "learn", "/a.txt")
	r.waitLines(4, "GET /a.txt HTTP/1.1")
	hangNginx(t, r.ng)
	// a request no rule answers: sampled, handed to the hung nginx, and
	// learned: the controller fetches it from nginx, which does not answer
	c := r.dial(netip.AddrPortFrom(r.tb.Server.IP4, testPort))
	defer c.Close()
	if _, err := io.WriteString(c, "GET /b.txt HTTP/1.1\r\nHost: santa\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !fetchUnderWay(t, r.tb.Server); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the controller did not fetch the new request from nginx within 5 s: %+v", r.ctl.Report())
		}
	}
	before := r.counters()["answered"]
	var last time.Time
	for i := range 4 {
		if i > 0 {
			time.Sleep(time.Second)
		}
		hdr := r.curl("-D", "-", "-o", "/dev/null", r.ng.URL4("/a.txt"))
		_, value, _ := strings.Cut(hdr, "\r\nDate: ")
		date, err := time.Parse(http.TimeFormat, strings.TrimSpace(strings.SplitN(value, "\r\n", 2)[0]))
		if err != nil {
			t.Fatalf("reply %d: no Date (%v): %q", i, err, hdr)
		}
		if lag := time.Since(date); lag > 2*time.Second || lag < -time.Second {
			t.Errorf("reply %d: Date %v is %v behind the clock, nginx hung", i, date, lag.Round(time.Millisecond))
		}
		if i > 0 && !date.After(last) {
			t.Errorf("reply %d: Date %v, no later than the one a second before", i, date)
		}
		last = date
	}
	if !fetchUnderWay(t, r.tb.Server) {
		t.Fatal("the fetch from the hung nginx ended while the Dates were read")
	}
	if n := r.counters()["answered"] - before; n < 4 {
		t.Errorf("eBPF answered %d of the 4 requests", n)
	}
}
