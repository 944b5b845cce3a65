package daemon_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
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

// TestRepliesInFlightSurviveRestart: long replies of socket-less TCP
// connections that their clients hold only part of when santad restarts
// are completed by the new santad. A flow names the rule of its reply by
// slot, rule set, generation and id, and the restored rules lie elsewhere
// (here: the long reply's rule came with a second add, a later generation
// than the restore gives it): before the new santad pointed the flows at
// them, eBPF found the rule gone and reset every such connection
// (tcp_reset_rule_gone; 5 of 6 here). When it pointed them there right
// after the swap, a client that retransmitted in between still found it
// gone, and with the reset lost got the reply anew at the wrong place (6 of
// 6 on CI's slower machine): the flows are now carried into the new
// santad's own table, before the swap and again after it.
func TestRepliesInFlightSurviveRestart(t *testing.T) {
	repliesInFlightAcross(t, inFlightRestart{})
}

// flowLayoutChange is the last commit whose santa_tcp_flow is laid out as
// before rule references (32 bytes, the rule by slot alone).
const flowLayoutChange = "48e38bb"

// TestUpgradeRepliesInFlight: the same across an upgrade from a santad
// whose flow table is laid out differently (built from git at
// flowLayoutChange). The new santad replaces the table; it used to start
// an empty one, and a client holding part of a long reply was then
// answered anew, the reply's first bytes where it expected the rest: 4 of
// 6 clients here got 11200 bytes that were not the reply. It now copies
// the old flows.
func TestUpgradeRepliesInFlight(t *testing.T) {
	repliesInFlightAcross(t, inFlightRestart{oldBin: buildOldSantad(t, flowLayoutChange)})
}

// buildOldSantad builds santad at commit rev from git into a temporary
// directory (skips the test without git history).
func buildOldSantad(t *testing.T, rev string) string {
	t.Helper()
	dir := t.TempDir()
	archive := exec.Command("sh", "-c", "git -C ../.. archive --format=tar "+rev+" | tar -x -C "+dir)
	if out, err := archive.CombinedOutput(); err != nil {
		t.Skipf("no git history to build santad %s from: %v %s", rev, err, out)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(dir, "bin", "santad"), "./cmd/santad")
	build.Dir = dir
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build santad %s: %v\n%s", rev, err, out)
	}
	return filepath.Join(dir, "bin", "santad")
}

// inFlightRestart is how repliesInFlightAcross restarts santad.
type inFlightRestart struct {
	oldBin string // the santad before the restart (empty: this one)
	idle   int    // connections whose short replies are all acked, first
	config string // the restarted santad's config file (empty: none)
}

// repliesInFlightAcross has six clients hold part of long replies while
// santad stops and starts again as r says, checks that each gets the whole
// reply and that eBPF found no rule of theirs gone, and returns santad.
func repliesInFlightAcross(t *testing.T, r inFlightRestart) *santadProc {
	tb, link := impairedFastRetransmits(t, testbed.ImpairOptions{Seed: 3})
	sd := newSantad(t, tb)
	newBin := sd.Bin
	if r.oldBin != "" {
		sd.Bin = r.oldBin
	}
	sd.start()
	c := sd.client()
	server := netip.AddrPortFrom(tb.Server.IP4, 7980)
	l := listenTCP(t, tb, server)
	target, err := santa.Socket(l)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bind(target, santa.SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("0123456789abcdef", 700) // 8 segments
	for _, rule := range []api.Rule{httpRule("/short", "short", false), httpRule("/long", long, false)} {
		if _, err := c.Add(target, []api.Rule{rule}); err != nil {
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
	for i := range r.idle {
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
	for range 6 {
		conns = append(conns, dial())
	}
	// half of the replies' segments arrive, then none: each client holds
	// part of its reply (or none) while santad restarts
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
	sd.Bin = newBin
	if r.config != "" {
		cfg := filepath.Join(sd.dir, "restart.yaml")
		if err := os.WriteFile(cfg, []byte(r.config), 0o644); err != nil {
			t.Fatal(err)
		}
		sd.Args = append(sd.Args, "--config", cfg)
	}
	sd.start()
	if err := link.Set(testbed.ToClient, testbed.Impairment{}); err != nil {
		t.Fatal(err)
	}
	for i, conn := range conns {
		conn.SetDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Errorf("connection %d, its reply in flight across the restart: %v", i, err)
			continue
		}
		body, err := io.ReadAll(resp.Body)
		if err != nil || len(body) != len(long) {
			t.Errorf("connection %d, its reply in flight across the restart: %d of %d bytes (%v)", i, len(body), len(long), err)
		} else if string(body) != long {
			first := 0
			for body[first] == long[first] {
				first++
			}
			t.Errorf("connection %d, its reply in flight across the restart: %d bytes that are not the reply, from byte %d on", i, len(body), first)
		}
	}
	if !regexp.MustCompile(`TCP flows carried over.* replies_in_flight=[1-9]`).MatchString(sd.Log()) {
		t.Errorf("no reply was in flight at the restart (the test needs some; the link toward the client: %+v):\n%s",
			link.Counters(testbed.ToClient), sd.Log())
	}
	metrics := sd.scrape()
	for _, gone := range []string{"tcp_reset_rule_gone", "tcp_drop_rule_gone"} {
		if line := fmt.Sprintf("santa_dataplane_events_total{event=%q} 0", gone); !strings.Contains(metrics, line) {
			t.Errorf("after the restart eBPF found the rule of a reply in flight gone: want %s", line)
		}
	}
	return sd
}
