package daemon_test

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestIdleCloseBySantad: santad with dataplane.tcp_idle_close 10s closes a
// socket-less keep-alive connection left idle (a client without TCP
// keepalives): the client reads the end of the stream within two sweeps
// after those 10 s, its close is answered, and the metric counts it. The
// data plane's own test (TestIdleConnectionClosed) ages the flow instead.
func TestIdleCloseBySantad(t *testing.T) {
	tb := testbed.New(t)
	config := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(config, []byte("dataplane:\n  tcp_idle_close: 10s\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sd := newSantad(t, tb, "--config", config)
	sd.start()
	c := sd.client()
	server := netip.AddrPortFrom(tb.Server.IP4, 7981)
	target, err := santa.Socket(listenTCP(t, tb, server))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Bind(target, santa.SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Add(target, []api.Rule{httpRule("/short", "short", false)}); err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	if err := tb.Client.Do(func() (err error) {
		// no keepalive probes: each would keep the connection
		conn, err = (&net.Dialer{KeepAlive: -1}).Dial("tcp", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /short HTTP/1.1\r\nHost: x\r\n\r\n")
	r := bufio.NewReader(conn)
	resp, err := http.ReadResponse(r, nil)
	if err != nil {
		t.Fatal(err)
	}
	io.ReadAll(resp.Body)
	// 10 s are two stamp units; the sweep runs every unit and closes a
	// flow idle for more than two: 17–35 s from the answer
	start := time.Now()
	conn.SetReadDeadline(start.Add(45 * time.Second))
	if _, err := r.ReadByte(); err != io.EOF {
		t.Fatalf("idle connection after %v: %v; want the end of the stream", time.Since(start).Round(time.Second), err)
	}
	t.Logf("closed %v after the answer", time.Since(start).Round(100*time.Millisecond))
	conn.Close()
	tb.Client.WaitClosesAnswered(t)
	if body := sd.scrape(); !strings.Contains(body, "santa_tcp_idle_closed_total 1\n") {
		t.Errorf("metrics do not count the connection closed:\n%s", body)
	}
}
