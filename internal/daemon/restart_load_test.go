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
	tb, _ := testbed.NewImpaired(t, testbed.Options{}, testbed.ImpairOptions{Seed: 7,
		ToClient: testbed.Impairment{Loss: 0.03, Reorder: 0.05}, ToServer: testbed.Impairment{Loss: 0.01, Reorder: 0.02}})
	for _, side := range []testbed.Side{tb.Client, tb.Server} {
		if _, err := side.Run("sysctl", "-q", "-w", "net.ipv4.tcp_rto_min_us=10000", "net.ipv4.tcp_rto_max_ms=1000"); err != nil {
			t.Fatal(err)
		}
	}
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	server := netip.AddrPortFrom(tb.Server.IP4, 7982)
	l := listenTCP(t, tb, server)
	bodies := map[string]string{}
	var rules []api.Rule
	mk := func(n int) string {
		b := make([]byte, n)
		for i := range b {
			b[i] = "0123456789abcdefghijklmnopqrstuvwxyz"[(i*7+n)%36]
		}
		return string(b)
	}
	for _, p := range []struct {
		path  string
		n     int
		close bool
	}{{"/s", 5, false}, {"/m", 5000, false}, {"/l", 9000, false}, {"/x", 14000, false},
		{"/sc", 7, true}, {"/lc", 9000, true}, {"/xc", 13000, true}} {
		bodies[p.path] = mk(p.n)
		rules = append(rules, httpRule(p.path, bodies[p.path], p.close))
	}
	// the kernel's answers (handed over): the same bodies
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
	var ok, wrong, failed, bytes atomic.Int64
	var mu sync.Mutex
	var errs []string
	note := func(s string) {
		mu.Lock()
		if len(errs) < 40 {
			errs = append(errs, s)
		}
		mu.Unlock()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	keep := []string{"/s", "/m", "/l", "/x"}
	closing := []string{"/sc", "/lc", "/xc"}
	for w := range 24 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				var conn net.Conn
				if err := tb.Client.Do(func() (err error) {
					conn, err = net.Dial("tcp", server.String())
					return err
				}); err != nil {
					failed.Add(1)
					note(fmt.Sprintf("dial: %v", err))
					time.Sleep(100 * time.Millisecond)
					continue
				}
				br := bufio.NewReader(conn)
				var paths []string
				if w%3 == 0 {
					paths = []string{closing[(w+i)%3]}
				} else {
					for j := range 5 {
						paths = append(paths, keep[(w+i+j)%4])
					}
				}
				for _, path := range paths {
					conn.SetDeadline(time.Now().Add(15 * time.Second))
					if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path); err != nil {
						failed.Add(1)
						note(fmt.Sprintf("%s write: %v", path, err))
						break
					}
					resp, err := http.ReadResponse(br, nil)
					if err != nil {
						failed.Add(1)
						note(fmt.Sprintf("%s %s: %v", time.Now().Format("15:04:05.000"), path, err))
						break
					}
					body, err := io.ReadAll(resp.Body)
					if err != nil {
						failed.Add(1)
						note(fmt.Sprintf("%s %s body: %d bytes, %v", time.Now().Format("15:04:05.000"), path, len(body), err))
						break
					}
					bytes.Add(int64(len(body)))
					if string(body) != bodies[path] {
						wrong.Add(1)
						note(fmt.Sprintf("%s %s: %d bytes not the reply", time.Now().Format("15:04:05.000"), path, len(body)))
						break
					}
					ok.Add(1)
				}
				conn.Close()
			}
		}()
	}
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
	close(stop)
	wg.Wait()
	metrics := sd.scrape()
	t.Logf("restarts %d: ok %d, wrong %d, failed %d, body bytes %d", restarts, ok.Load(), wrong.Load(), failed.Load(), bytes.Load())
	for _, e := range errs {
		t.Log(e)
	}
	for _, l := range regexp.MustCompile(`(?m)^.*(carried over|too small|could not carry).*$`).FindAllString(sd.Log(), -1) {
		t.Log(l)
	}
	for _, l := range regexp.MustCompile(`(?m)^santa_dataplane_events_total\{event="tcp_[a-z_]*"\} [1-9].*$`).FindAllString(metrics, -1) {
		t.Log(l)
	}
	if wrong.Load() > 0 || failed.Load() > 0 {
		t.Errorf("%d wrong replies, %d failed", wrong.Load(), failed.Load())
	}
}
