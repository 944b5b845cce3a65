//go:build linux

package bench

import (
	"context"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

func TestParseWrk(t *testing.T) {
	out := `Running 1s test @ http://127.0.0.1:18081/
  1 threads and 2 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     1.95ms    1.02ms   9.23ms   85.67%
    Req/Sec     0.89k    94.46     0.98k    81.82%
  Latency Distribution
     50%  464.00us
     75%    2.16ms
     90%    3.02ms
     99%    1.20s
  977 requests in 1.10s, 8.14MB read
  Socket errors: connect 1, read 2, write 3, timeout 4
  Non-2xx or 3xx responses: 5
Requests/sec:    887.36
Transfer/sec:      7.39MB
`
	r, err := ParseWrk(out)
	if err != nil {
		t.Fatal(err)
	}
	want := WrkResult{Requests: 977, Seconds: 1.1, ReqPerSec: 887.36, Non2xx: 5, Connect: 1, Read: 2, Write: 3, Timeouts: 4,
		LatAvg: 1950 * time.Microsecond, LatMax: 9230 * time.Microsecond}
	got := r
	got.Percentile = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if r.Percentile[50] != 464*time.Microsecond || r.Percentile[90] != 3020*time.Microsecond || r.Percentile[99] != 1200*time.Millisecond {
		t.Errorf("percentiles %v", r.Percentile)
	}
	if r.Errors() != 15 {
		t.Errorf("errors %d", r.Errors())
	}
	if _, err := ParseWrk("unable to connect to 198.18.1.1:80 Connection refused\n"); err == nil {
		t.Error("no error for wrk's failure")
	}
}

func TestHeaderOrders(t *testing.T) {
	one := "GET /a HTTP/1.1\r\nHost: h\r\n\r\n"
	if got := headerOrders(one); !slices.Equal(got, []string{one}) {
		t.Errorf("one header: %q", got)
	}
	two := "GET /a HTTP/1.1\r\nConnection: close\r\nHost: h\r\n\r\n"
	want := []string{two, "GET /a HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"}
	if got := headerOrders(two); !slices.Equal(got, want) {
		t.Errorf("two headers: %q", got)
	}
}

// The HTTP benchmark end to end on a 1-byte file (a reply the eBPF TCP
// path sends from XDP on this testbed): nginx alone and Santa with `santa
// http`, keep-alive and Connection: close, one short repetition each. It
// checks the pipeline (wrk, nginx, santad, the controller's learning, the
// counters, the report), not figures.
func TestHTTPHarnessSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: run the tests as root")
	}
	for _, p := range []string{WrkPath, testbed.NginxPath} {
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("%s missing: run scripts/install-deps.sh (Debian wrk, nginx)", p)
		}
	}
	if testing.Short() {
		t.Skip("short")
	}
	bin := t.TempDir()
	if err := testbed.GoBuild(bin, "..", "./cmd/santad", "./cmd/santa"); err != nil {
		t.Fatal(err)
	}
	sizes := []int{1}
	cases, err := SelectCases(PlanHTTP(sizes, 4, 8), "nginx-ka-1,santa-ka-1,santa-close-1", func(c HTTPCase) string { return c.Name })
	if err != nil {
		t.Fatal(err)
	}
	cfg := HTTPConfig{
		Config: Config{
			Duration:  time.Second,
			Reps:      1,
			Placement: testbed.DefaultPlacement,
			Logf:      func(f string, a ...any) { t.Logf(f, a...) },
		},
		Sizes: sizes, KeepAliveConns: 4, CloseConns: 8, Warmup: 10 * time.Second,
		Cases: cases, Bin: bin,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := RunHTTP(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 3 {
		t.Fatalf("%d cases measured", len(rep.Cases))
	}
	for _, c := range rep.Cases {
		sp := saturation(t, c)
		m, meta := sp.Median, rep.Meta[c.Name]
		if m.Sent != m.Replies || m.RepliesPPS < 1000 || m.LatP50Us <= 0 || m.LatP99Us < m.LatP50Us || m.UsPerReply <= 0 {
			t.Errorf("%s: %d of %d requests answered, %.0f/s, p50 %.0f p99 %.0f µs, %.2f µs/request", c.Name, m.Replies, m.Sent, m.RepliesPPS, m.LatP50Us, m.LatP99Us, m.UsPerReply)
		}
		if meta.Response < 200 || !strings.HasPrefix(meta.Request, "GET /p1.bin HTTP/1.1\r\n") {
			t.Errorf("%s: request %q, response of %d bytes", c.Name, meta.Request, meta.Response)
		}
		switch meta.Server {
		case HTTPNginx:
			if m.ProgID != 0 || m.XDPAnswered != 0 {
				t.Errorf("%s: program %d, %d answered in eBPF", c.Name, m.ProgID, m.XDPAnswered)
			}
		case HTTPSanta:
			if len(meta.Offload) != len(meta.Variants) || !strings.HasPrefix(meta.Offload[0], "offloaded ") {
				t.Errorf("%s: controller decided %q on %d requests", c.Name, meta.Offload, len(meta.Variants))
			}
			// A 238-byte reply fits the XDP frame: eBPF answers everything.
			if m.ProgID == 0 || m.XDPShare < 0.95 {
				t.Errorf("%s: program %d, %.0f%% answered in eBPF", c.Name, m.ProgID, 100*m.XDPShare)
			}
			if cnt := rep.Counters[c.Name]; cnt["answered"] == 0 || cnt["tcp_syn_answered"] == 0 || rep.Requests[c.Name] == 0 {
				t.Errorf("%s: counters %v, %d requests", c.Name, cnt, rep.Requests[c.Name])
			}
			if !strings.HasPrefix(rep.Done[c.Name], "installed ") {
				t.Errorf("%s: controller reported %q", c.Name, rep.Done[c.Name])
			}
		}
	}
	if v := rep.Meta["santa-close-1"].Variants; len(v) != 2 {
		t.Errorf("santa-close-1: %d variants of wrk's request, want both header orders", len(v))
	}
	dir := t.TempDir()
	files, warns, err := rep.WriteFiles(dir, "http")
	if len(warns) > 0 {
		t.Errorf("plots: %v", warns)
	}
	if err != nil || len(files) < 2 {
		t.Fatalf("write files %v %v", files, err)
	}
	// A run of one connection mode's cases plots that mode alone.
	closeOnly := *rep
	closeOnly.Cases = slices.DeleteFunc(slices.Clone(rep.Cases), func(c CaseResult) bool { return c.Name != "santa-close-1" })
	if _, warns, err := closeOnly.WriteFiles(t.TempDir(), "http"); err != nil || len(warns) > 0 {
		t.Errorf("plots of santa-close-1 alone: %v %v", warns, err)
	}
	md := rep.Markdown("http")
	for _, s := range []string{"## HTTP", "### Keep-alive", "| 1 B |", "| santa-ka-1 |", "### The data path in the Santa cases", "`santa-close-1`: installed"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
}
