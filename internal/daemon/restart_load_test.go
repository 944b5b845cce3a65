package daemon_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestRepliesAcrossRestartsUnderLoss: 24 clients fetch long (5-14 kB) and
// short replies over keep-alive and close through a lossy, reordering link
// (10 ms RTO) while santad restarts 8 times (SIGTERM, SIGKILL); every body
// must be byte-exact. Before the new program dropped segments until the
// flows were carried over (tcp_drop_carrying), 3-6 replies in ~50 000 (11
// restarts) were other bytes, each at a restart whose second CarryFlows
// pass copied a reply in flight: from the XDP swap until that pass the new
// program ran on a stale or missing flow, and answered a retransmitted
// request anew at the client's ack.
func TestRepliesAcrossRestartsUnderLoss(t *testing.T) {
	tb, _ := impairedFastRetransmits(t, testbed.ImpairOptions{Seed: 7,
		ToClient: testbed.Impairment{Loss: 0.03, Reorder: 0.05}, ToServer: testbed.Impairment{Loss: 0.01, Reorder: 0.02}})
	sd := newSantad(t, tb)
	sd.start()
	load := startHTTPLoad(t, tb, sd.client(), netip.AddrPortFrom(tb.Server.IP4, 7982), nil)
	restarts := 0
	deadline := time.Now().Add(20 * time.Second)
	for i := 0; time.Now().Before(deadline) && i < 8; i++ {
		time.Sleep(1500 * time.Millisecond)
		sig := syscall.SIGTERM
		if i%2 == 1 {
			sig = syscall.SIGKILL
		}
		sd.stop(sig)
		time.Sleep(20 * time.Millisecond)
		sd.start()
		restarts++
	}
	time.Sleep(2 * time.Second)
	load.end(t, sd, fmt.Sprintf("restarts %d", restarts))
}

// impairedFastRetransmits is a testbed whose link impair shapes, with TCP's
// retransmission timeout 10 ms to 1 s on both sides (replies in flight
// are asked for again within the moments a test looks at).
func impairedFastRetransmits(t *testing.T, impair testbed.ImpairOptions) (*testbed.Testbed, *testbed.Link) {
	tb, link := testbed.NewImpaired(t, testbed.Options{}, impair)
	for _, side := range []testbed.Side{tb.Client, tb.Server} {
		if _, err := side.Run("sysctl", "-q", "-w", "net.ipv4.tcp_rto_min_us=10000", "net.ipv4.tcp_rto_max_ms=1000"); err != nil {
			t.Fatal(err)
		}
	}
	return tb, link
}

// httpLoad is 24 clients fetching seven offloaded responses (5 B to 14 kB,
// keep-alive and Connection: close) from a listener whose kernel answers
// (after a handover) carry the same bodies, checking every body.
type httpLoad struct {
	target santa.Target // the listener
	// excused says a request from since to now may fail (nil: none may)
	excused                              func(since, now time.Time) bool
	ok, wrong, failed, forgiven, bodyLen atomic.Int64
	mu                                   sync.Mutex
	notes                                []string
	stop                                 chan struct{}
	wg                                   sync.WaitGroup
}

// startHTTPLoad binds a listener at server with the seven rules and starts
// the clients.
func startHTTPLoad(t *testing.T, tb *testbed.Testbed, c *santa.Client, server netip.AddrPort,
	excused func(since, now time.Time) bool) *httpLoad {
	l := listenTCP(t, tb, server)
	bodies := map[string]string{}
	var rules []api.Rule
	for _, p := range []struct {
		path  string
		n     int
		close bool
	}{{"/s", 5, false}, {"/m", 5000, false}, {"/l", 9000, false}, {"/x", 14000, false},
		{"/sc", 7, true}, {"/lc", 9000, true}, {"/xc", 13000, true}} {
		b := make([]byte, p.n)
		for i := range b {
			b[i] = "0123456789abcdefghijklmnopqrstuvwxyz"[(i*7+p.n)%36]
		}
		bodies[p.path] = string(b)
		rules = append(rules, httpRule(p.path, bodies[p.path], p.close))
	}
	go http.Serve(l, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, bodies[r.URL.Path])
	}))
	target, err := santa.Socket(l)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bind(target, santa.SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Add(target, rules); err != nil {
		t.Fatal(err)
	}
	h := &httpLoad{target: target, excused: excused, stop: make(chan struct{})}
	keep := []string{"/s", "/m", "/l", "/x"}
	closing := []string{"/sc", "/lc", "/xc"}
	for w := range 24 {
		h.wg.Add(1)
		go func() {
			defer h.wg.Done()
			for i := 0; i < 100000; i++ {
				select {
				case <-h.stop:
					return
				default:
				}
				var conn net.Conn
				since := time.Now()
				if err := tb.Client.Do(func() (err error) {
					conn, err = net.Dial("tcp", server.String())
					return err
				}); err != nil {
					h.bad(&h.failed, since, fmt.Sprintf("dial: %v", err))
					time.Sleep(100 * time.Millisecond)
					continue
				}
				paths := []string{closing[(w+i)%3]}
				if w%3 != 0 {
					paths = nil
					for j := range 5 {
						paths = append(paths, keep[(w+i+j)%4])
					}
				}
				h.fetch(conn, paths, bodies)
				conn.Close()
			}
		}()
	}
	return h
}

// fetch asks for paths in turn on conn, until one fails.
func (h *httpLoad) fetch(conn net.Conn, paths []string, bodies map[string]string) {
	br := bufio.NewReader(conn)
	for _, path := range paths {
		since := time.Now()
		at := func() string {
			return time.Now().Format("15:04:05.000") + " (sent " + since.Format("15:04:05.000") + ") " + path
		}
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
			h.bad(&h.failed, since, fmt.Sprintf("%s write: %v", at(), err))
			return
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			h.bad(&h.failed, since, fmt.Sprintf("%s: %v", at(), err))
			return
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			h.bad(&h.failed, since, fmt.Sprintf("%s body: %d bytes, %v", at(), len(body), err))
			return
		}
		h.bodyLen.Add(int64(len(body)))
		if string(body) != bodies[path] {
			h.bad(&h.wrong, since, fmt.Sprintf("%s: %d bytes not the reply", at(), len(body)))
			return
		}
		h.ok.Add(1)
	}
}

// bad counts a request sent at since that failed (or forgives it).
func (h *httpLoad) bad(counter *atomic.Int64, since time.Time, what string) {
	if h.excused != nil && h.excused(since, time.Now()) {
		h.forgiven.Add(1)
		what = "(excused) " + what
	} else {
		counter.Add(1)
	}
	h.note(what)
}

// note keeps the first 60 of what went wrong, for the log.
func (h *httpLoad) note(what string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if len(h.notes) < 60 {
		h.notes = append(h.notes, what)
	}
}

// end stops the clients, logs what they saw with santad's flow carry-over
// lines and TCP counters, and fails the test on a wrong or failed reply.
func (h *httpLoad) end(t *testing.T, sd *santadProc, what string) {
	t.Helper()
	close(h.stop)
	h.wg.Wait()
	t.Logf("%s: ok %d, wrong %d, failed %d, excused %d, body bytes %d", what, h.ok.Load(), h.wrong.Load(), h.failed.Load(),
		h.forgiven.Load(), h.bodyLen.Load())
	for _, n := range h.notes {
		t.Log(n)
	}
	for _, l := range regexp.MustCompile(`(?m)^.*(level=WARN|level=ERROR|carried over|too small|could not|santad started).*$`).FindAllString(sd.Log(), -1) {
		t.Log(l)
	}
	for _, l := range regexp.MustCompile(`(?m)^santa_dataplane_events_total\{event="tcp_[a-z_]*"\} [1-9].*$`).FindAllString(sd.scrape(), -1) {
		t.Log(l)
	}
	if h.wrong.Load() > 0 || h.failed.Load() > 0 {
		t.Errorf("%d wrong replies, %d failed", h.wrong.Load(), h.failed.Load())
	}
}
