package daemon_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestRepliesInFlightSurviveSmallerFlowTable: a santad restarted with a
// dataplane.tcp_flows smaller than the flows its predecessor holds, yet
// larger than the replies in flight, carries those replies over. Idle
// flows (replies all acked) may go: the connection's next request starts a
// new one, or goes to the kernel. A flow of a reply in flight must not:
// without it a client's retransmitted request is answered anew, the
// reply's first bytes where the client expects the rest.
func TestRepliesInFlightSurviveSmallerFlowTable(t *testing.T) {
	const idle, inFlight, size = 40, 6, 12
	tb, link := testbed.NewImpaired(t, testbed.Options{}, testbed.ImpairOptions{Seed: 3})
	for _, side := range []testbed.Side{tb.Client, tb.Server} {
		if _, err := side.Run("sysctl", "-q", "-w", "net.ipv4.tcp_rto_min_us=10000", "net.ipv4.tcp_rto_max_ms=1000"); err != nil {
			t.Fatal(err)
		}
	}
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	server := netip.AddrPortFrom(tb.Server.IP4, 7981)
	l := listenTCP(t, tb, server)
	target, err := santa.Socket(l)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bind(target, santa.SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("0123456789abcdef", 700) // 8 segments
	for _, r := range []api.Rule{httpRule("/short", "short", false), httpRule("/long", long, false)} {
		if _, err := c.Add(target, []api.Rule{r}); err != nil {
			t.Fatal(err)
		}
	}
	dial := func() net.Conn {
		var conn net.Conn
		if err := tb.Client.Do(func() (err error) {
			conn, err = net.Dial("tcp", server.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
	// idle flows first: each connection's short reply all acked
	for i := range idle {
		conn := dial()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(conn, "GET /short HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("idle connection %d: %v", i, err)
		}
		io.ReadAll(resp.Body)
	}
	var conns []net.Conn
	for range inFlight {
		conns = append(conns, dial())
	}
	if err := link.Set(testbed.ToClient, testbed.Impairment{Loss: 0.5}); err != nil {
		t.Fatal(err)
	}
	for _, conn := range conns {
		if _, err := io.WriteString(conn, "GET /long HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(time.Millisecond)
	if err := link.Set(testbed.ToClient, testbed.Impairment{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	sd.stop(syscall.SIGTERM)
	cfg := filepath.Join(sd.dir, "small.yaml")
	if err := os.WriteFile(cfg, []byte(fmt.Sprintf("dataplane:\n  tcp_flows: %d\n", size)), 0o644); err != nil {
		t.Fatal(err)
	}
	sd.Args = append(sd.Args, "--config", cfg)
	sd.start()
	if err := link.Set(testbed.ToClient, testbed.Impairment{}); err != nil {
		t.Fatal(err)
	}
	bad := 0
	for i, conn := range conns {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Errorf("connection %d, its reply in flight across the restart: %v", i, err)
			bad++
			continue
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || len(body) != len(long) {
			t.Errorf("connection %d, its reply in flight across the restart: %d of %d bytes (%v)", i, len(body), len(long), err)
			bad++
		} else if string(body) != long {
			first := 0
			for body[first] == long[first] {
				first++
			}
			t.Errorf("connection %d, its reply in flight across the restart: %d bytes that are not the reply, from byte %d on", i, len(body), first)
			bad++
		}
	}
	if bad > 0 {
		t.Logf("%d of %d replies in flight broken", bad, inFlight)
	}
	if !regexp.MustCompile(`TCP flows carried over.* replies_in_flight=[1-9]`).MatchString(sd.Log()) {
		t.Errorf("no reply was in flight at the restart (the test needs some):\n%s", sd.Log())
	}
	// every idle flow but the most recent size-inFlight left behind, and said so
	if want := fmt.Sprintf(`flows_left=%d replies_in_flight_left=0 size=%d`, idle+inFlight-size, size); !strings.Contains(sd.Log(), want) {
		t.Errorf("no warning of the flows the smaller table left behind (%s):\n%s", want, sd.Log())
	}
	metrics := sd.scrape()
	for _, gone := range []string{"tcp_reset_rule_gone", "tcp_drop_rule_gone"} {
		if line := fmt.Sprintf("santa_dataplane_events_total{event=%q} 0", gone); !strings.Contains(metrics, line) {
			t.Errorf("after the restart eBPF found the rule of a reply in flight gone: want %s", line)
		}
	}
}
