package daemon_test

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

const nobody = 65534

// TestClientsOffloadAsNobody runs the paper's Listing 1 through each client
// library as uid nobody: the kernel answers "Hello" even while the
// application is stopped, the application serves the rest, reads its rule's
// hits, and the rule set dies with the socket.
func TestClientsOffloadAsNobody(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	env := []string{"SANTA_SOCKET=" + sd.Socket, "PYTHONPATH=" + filepath.Join(work, "python")}
	clients := map[string][]string{
		"go":     {filepath.Join(work, "listing1-go")},
		"c":      {filepath.Join(work, "c", "listing1")},
		"python": {"/usr/bin/python3", filepath.Join(work, "python", "examples", "listing1.py")},
	}
	port := uint16(7000)
	for _, name := range []string{"c", "go", "python"} {
		port++
		t.Run(name, func(t *testing.T) {
			for _, ip := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
				server := netip.AddrPortFrom(ip, port)
				a := startApp(t, tb, nobody, env, append(clients[name], ip.String(), fmt.Sprint(port))...)
				a.cmd.Process.Signal(syscall.SIGSTOP)
				for i := 0; i < 3; i++ {
					if got := exchange(t, tb, server, "Hello"); got != "COMSYS" {
						t.Fatalf("%v: Hello got %q from a stopped app, want COMSYS from the kernel", server, got)
					}
				}
				a.cmd.Process.Signal(syscall.SIGCONT)
				if got := exchange(t, tb, server, "other"); got != "app:other" {
					t.Fatalf("%v: other got %q, want app:other", server, got)
				}
				if got := exchange(t, tb, server, "stats"); got != "hits=3" {
					t.Fatalf("%v: the app read %q through its client, want hits=3", server, got)
				}
				socks, err := sd.cli(nobody, "rules", "ls", "--json")
				if err != nil || !strings.Contains(socks, fmt.Sprint(a.Cookie)) {
					t.Fatalf("nobody does not see its own rule set %d: %v %s", a.Cookie, err, socks)
				}
				a.cmd.Process.Signal(syscall.SIGTERM)
				a.cmd.Wait()
				waitGone(t, sd, a.Cookie)
				// a new socket on the same port never sees the old rules
				if got := echoOnce(t, tb, server, "Hello"); got != "Hello" {
					t.Fatalf("%v: a new socket on the port got %q answered, want its own echo", server, got)
				}
			}
		})
	}
}

// waitGone waits until santad has dropped the closed socket's rule set.
func waitGone(t *testing.T, sd *santadProc, cookie uint64) {
	t.Helper()
	c := sd.client()
	for deadline := time.Now().Add(5 * time.Second); ; {
		socks, err := c.ListSockets()
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, s := range socks {
			found = found || s.Cookie == cookie
		}
		if !found {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("rule set of closed socket %d still listed after 5 s", cookie)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := c.ListRules(santa.Cookie(cookie)); !errors.Is(err, santa.ErrNotFound) {
		t.Fatalf("rules of closed socket %d: %v, want not found", cookie, err)
	}
}

// echoOnce binds a plain socket at server in the server namespace, sends
// payload from the client and returns what the client got back: the echo of
// this socket, unless something answered for it.
func echoOnce(t *testing.T, tb *testbed.Testbed, server netip.AddrPort, payload string) string {
	t.Helper()
	conn := echoServer(t, tb, server)
	defer conn.Close()
	return exchange(t, tb, server, payload)
}

// serverSocket binds a UDP socket at server in the server namespace (closed
// when the test ends) and returns it with the target naming it to santad.
func serverSocket(t *testing.T, tb *testbed.Testbed, server netip.AddrPort) (*net.UDPConn, santa.Target) {
	t.Helper()
	var conn *net.UDPConn
	if err := tb.Server.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(server))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	target, err := santa.Socket(conn)
	if err != nil {
		t.Fatal(err)
	}
	return conn, target
}

// echoServer binds a UDP socket at server in the server namespace that
// echoes every datagram until it is closed.
func echoServer(t *testing.T, tb *testbed.Testbed, server netip.AddrPort) *net.UDPConn {
	t.Helper()
	conn, _ := serverSocket(t, tb, server)
	go func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			conn.WriteToUDPAddrPort(buf[:n], from)
		}
	}()
	return conn
}

// boundEchoServer is echoServer with its socket bound through c: its rule
// set's cookie.
func boundEchoServer(t *testing.T, tb *testbed.Testbed, c *santa.Client, server netip.AddrPort) (*net.UDPConn, uint64) {
	t.Helper()
	conn := echoServer(t, tb, server)
	return conn, testbed.Bind(t, c, conn).Cookie
}

// TestOwnership checks what a non-root client may not do.
func TestOwnership(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	env := []string{"SANTA_SOCKET=" + sd.Socket}
	// a socket of root's, bound by root
	root := sd.client()
	var rootConn *net.UDPConn
	if err := tb.Server.Do(func() (err error) {
		rootConn, err = net.ListenUDP("udp", &net.UDPAddr{IP: tb.Server.IP4.AsSlice(), Port: 7100})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer rootConn.Close()
	rootSet := testbed.Bind(t, root, rootConn)
	rulePath := filepath.Join(sd.dir, "rules.yaml")
	writeFile(t, rulePath, "rules:\n- conditions: [{offset: 0, text: Hi}]\n  processors: [{put: {at: 0, text: Yo}}]\n  reply_len: 2\n")
	a := startApp(t, tb, nobody, env, filepath.Join(work, "listing1-go"), tb.Server.IP4.String(), "7101")

	for name, args := range map[string][]string{
		"add to root's socket":    {"rules", "add", "--socket", fmt.Sprint(rootSet.Cookie), rulePath},
		"list root's rules":       {"rules", "ls", "--socket", fmt.Sprint(rootSet.Cookie)},
		"stats of root's socket":  {"stats", "--socket", fmt.Sprint(rootSet.Cookie)},
		"detach root's socket":    {"detach", "--socket", fmt.Sprint(rootSet.Cookie)},
		"attach another's socket": {"attach", "--port", "7101/udp"},
		"attach by pid":           {"attach", "--pid", fmt.Sprint(a.cmd.Process.Pid), "--fd", "3"},
	} {
		out, err := sd.cli(nobody, args...)
		if err == nil || !strings.Contains(out, "permission denied") && !strings.Contains(out, "belongs to uid") && !strings.Contains(out, "needs root") {
			t.Errorf("%s as nobody: %v %q, want a permission error", name, err, out)
		}
	}
	// nobody's own socket: allowed, by cookie
	if out, err := sd.cli(nobody, "rules", "add", "--socket", fmt.Sprint(a.Cookie), rulePath); err != nil {
		t.Fatalf("nobody adding to its own socket: %v", err)
	} else if strings.TrimSpace(out) == "" {
		t.Fatal("rules add printed no id")
	}
	socks, err := sd.cli(nobody, "rules", "ls", "--json")
	if err != nil || strings.Contains(socks, fmt.Sprint(rootSet.Cookie)) {
		t.Fatalf("nobody's listing shows root's socket or failed: %v %s", err, socks)
	}
	// root sees both and may manage nobody's
	if out, err := sd.cli(0, "rules", "ls", "--socket", fmt.Sprint(a.Cookie)); err != nil || strings.Count(out, "\n") != 3 {
		t.Fatalf("root listing nobody's rules: %v\n%s", err, out)
	}
	if got := exchange(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7101), "Hi"); got != "Yo" {
		t.Fatalf("Hi got %q, want Yo", got)
	}
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestRestartUnderLoad restarts santad gracefully and then kills it while a
// client sends requests at a fixed rate to a socket nobody reads: every
// request must still be answered, and every rule, id, version and counter kept.
func TestRestartUnderLoad(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	server := netip.AddrPortFrom(tb.Server.IP4, 7200)
	_, target := serverSocket(t, tb, server) // never read: only the kernel answers
	// the answering rule echoes an 8-byte sequence number (whose top bits
	// its masked condition checks, and whose length its bounds fix); 2000
	// more rules, some with masks, some tagged, make the restore real work
	rules := []api.Rule{{
		Conditions: []api.Condition{santa.Match(0, []byte("Hello")), {Offset: 5, Pattern: api.Bytes{0}, Mask: api.Bytes{0xf0}}},
		Processors: []api.Processor{santa.Put(0, []byte("COMSYS")), santa.Copy(6, 5, 8)},
		ReplyLen:   14,
		MinLen:     13,
		MaxLen:     13,
	}}
	for i := 0; i < 2000; i++ {
		r := api.Rule{
			Conditions: []api.Condition{santa.Match(0, []byte(fmt.Sprintf("other-%05d", i)))},
			Processors: []api.Processor{santa.Put(0, []byte(fmt.Sprintf("reply-%05d", i)))},
			ReplyLen:   11,
		}
		if i%100 == 0 {
			r.Processors = append(r.Processors, api.Processor{Kind: api.KindCopy, ReplyOffset: 10, SrcOffset: 11, Length: 1, Mask: api.Bytes{0x0f}})
		}
		if i%3 == 0 {
			r.Tag = fmt.Sprintf("tag-%d", i%2)
		}
		rules = append(rules, r)
	}
	ids, err := c.Add(target, rules)
	if err != nil {
		t.Fatal(err)
	}
	rules[1].ID = ids[1]
	rules[1].Processors = []api.Processor{santa.Put(0, []byte("changed-one"))}
	rules[1].Tag = "retagged" // a modify sets the tag anew
	if err := c.Modify(target, rules[1:2]); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(target, ids[2:4]); err != nil {
		t.Fatal(err)
	}
	before, err := c.ListRules(target)
	if err != nil {
		t.Fatal(err)
	}
	if len(before) != 1999 {
		t.Fatalf("%d rules before the restart, want 1999", len(before))
	}
	tags := map[string]int{}
	for _, r := range before {
		tags[r.Tag]++
	}
	if want := map[string]int{"": 1332, "tag-0": 333, "tag-1": 333, "retagged": 1}; !reflect.DeepEqual(tags, want) {
		t.Fatalf("tags listed before the restart: %v, want %v", tags, want)
	}

	const rate, duration = 2000, 6 * time.Second
	total := int(rate * duration.Seconds())
	client, err := tb.DialUDP(server)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	roomForEveryAnswer(t, client)
	got := make([]bool, total)
	var received int
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // count distinct answered sequence numbers
		defer wg.Done()
		buf := make([]byte, 64)
		for {
			client.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := client.Read(buf)
			if err != nil {
				return
			}
			if n == 14 && string(buf[:6]) == "COMSYS" {
				if seq := binary.BigEndian.Uint64(buf[6:14]); seq < uint64(total) && !got[seq] {
					got[seq] = true
					received++
				}
			}
		}
	}()
	restarts := make(chan struct{})
	go func() { // graceful restart at 1.5 s, crash and restart at 3.5 s
		defer close(restarts)
		time.Sleep(1500 * time.Millisecond)
		sd.stop(syscall.SIGTERM)
		sd.start()
		time.Sleep(2 * time.Second)
		sd.stop(syscall.SIGKILL)
		sd.start()
	}()
	start := time.Now()
	req := make([]byte, 13)
	copy(req, "Hello")
	for i := 0; i < total; i++ {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
		binary.BigEndian.PutUint64(req[5:], uint64(i))
		if _, err := client.Write(req); err != nil {
			t.Fatal(err)
		}
	}
	<-restarts
	wg.Wait()
	if received != total {
		var lost []int
		for i, ok := range got {
			if !ok && len(lost) < 20 {
				lost = append(lost, i)
			}
		}
		t.Errorf("%d of %d requests answered across two santad restarts; first lost: %v", received, total, lost)
	}
	c2 := sd.client()
	cookie := mustCookie(t, c2)
	after, err := c2.ListRules(santa.Cookie(cookie))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(after, before) {
		t.Errorf("rules changed across restarts: %d before, %d after", len(before), len(after))
	}
	st, err := c2.Stats(santa.Cookie(cookie), ids[0])
	if err != nil {
		t.Fatal(err)
	}
	if st[0].Hits < uint64(total) {
		t.Errorf("the answering rule counts %d hits after the restarts, want at least %d", st[0].Hits, total)
	}
	t.Logf("%d/%d answered at %d/s across a graceful restart and a kill -9; %d rules kept with ids, versions and counters", received, total, rate, len(after))
}

// mustCookie returns the only socket's cookie.
func mustCookie(t *testing.T, c *santa.Client) uint64 {
	t.Helper()
	socks, err := c.ListSockets()
	if err != nil || len(socks) != 1 {
		t.Fatalf("want exactly one rule set: %v %v", socks, err)
	}
	return socks[0].Cookie
}

// TestMetrics scrapes the Prometheus endpoint.
func TestMetrics(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	a := startApp(t, tb, nobody, []string{"SANTA_SOCKET=" + sd.Socket}, filepath.Join(work, "listing1-go"), tb.Server.IP4.String(), "7300")
	exchange(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7300), "Hello")
	exchange(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7300), "nope")
	out, err := sd.cli(nobody, "rules", "rm", "--socket", fmt.Sprint(a.Cookie), "999999")
	if err == nil {
		t.Fatalf("removing a rule that does not exist succeeded: %s", out)
	}
	// santa top: one refresh, while requests arrive. The Hellos go on until
	// the CLI has returned, so some land inside its window however long the
	// CLI takes to start; each is written once, so the hits are counted.
	sent := make(chan struct{})
	topDone := make(chan struct{})
	hellos := 0
	go func() {
		defer close(sent)
		buf := make([]byte, 64)
		for {
			select {
			case <-topDone:
				return
			default:
			}
			c, err := tb.DialUDP(netip.AddrPortFrom(tb.Server.IP4, 7300))
			if err != nil {
				t.Errorf("dial during santa top: %v", err)
				return
			}
			if _, err := c.Write([]byte("Hello")); err != nil {
				c.Close()
				t.Errorf("Hello during santa top: %v", err)
				return
			}
			hellos++
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			c.Close()
			if got := string(buf[:n]); err != nil || got != "COMSYS" {
				t.Errorf("Hello during santa top got %q, %v", got, err)
				return
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	out, err = sd.cli(nobody, "top", "--count", "1", "--interval", "400ms", "--json")
	close(topDone)
	if err != nil {
		<-sent
		t.Fatal(err)
	}
	var frame struct {
		AnsweredPerSec float64 `json:"answered_per_sec"`
		Rules          []struct {
			Socket, ID uint64
			Hits       uint64
		} `json:"rules"`
	}
	if err := json.Unmarshal([]byte(out), &frame); err != nil || len(frame.Rules) != 1 || frame.Rules[0].ID != a.Rule || frame.AnsweredPerSec <= 0 {
		t.Fatalf("santa top --json: %v\n%s", err, out)
	}
	<-sent
	// op numbers are the client's to choose: unknown ones share one series
	conn, err := api.Dial(sd.Socket)
	if err != nil {
		t.Fatal(err)
	}
	for _, op := range []api.Op{1000, 1400, 1499} {
		if err := conn.Send(&api.Message{V: api.Version, Op: op, Seq: 1}, -1); err != nil {
			t.Fatal(err)
		}
		if m, _, err := conn.Recv(); err != nil || m.Status != api.StatusUnsupported {
			t.Fatalf("op %d: %+v %v, want unsupported", op, m, err)
		}
	}
	conn.Close()
	body := sd.scrape()
	for _, want := range []string{
		fmt.Sprintf(`santa_rule_hits_total{rule="%d",socket="%d"} %d`, a.Rule, a.Cookie, 1+hellos),
		fmt.Sprintf(`santa_dataplane_events_total{event="answered"} %d`, 1+hellos),
		`santa_dataplane_events_total{event="pass_no_match"} 1`,
		`santa_api_errors_total{op="delete",status="not found"} 1`,
		`santa_api_errors_total{op="unknown",status="unsupported"} 3`,
		`santa_rules 1`,
		`santa_sockets 1`,
		`santa_tcp_idle_closed_total 0`,
		// the HELP names every family of events it counts
		"# HELP santa_dataplane_events_total Rule processor outcomes: answered, every pass reason, miss sampling, and the TCP path's tcp_* events",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("metrics lack %q", want)
		}
	}
	if strings.Contains(body, `op="op`) {
		t.Errorf("metrics have a series per unknown op number")
	}
	if t.Failed() {
		t.Log(body)
	}
}

// TestClientLibrariesAgainstSantad runs the C and Python clients' own
// integration tests, which exercise every call of their library against
// this santad and check the answers on the wire from the client namespace.
func TestClientLibrariesAgainstSantad(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	env := []string{
		"SANTA_SOCKET=" + sd.Socket,
		"SANTA_SERVER_ADDR4=" + tb.Server.IP4.String(),
		"SANTA_SERVER_ADDR6=" + tb.Server.IP6.String(),
		"SANTA_CLIENT_NS=" + tb.Client.NS,
		"PYTHONPATH=" + filepath.Join(work, "python"),
	}
	for name, argv := range map[string][]string{
		"c": {filepath.Join(work, "c", "test_integration")},
		"python": {"/usr/bin/python3", "-m", "pytest", "-q", "-p", "no:cacheprovider",
			filepath.Join(work, "python", "tests", "integration_santad.py")},
	} {
		t.Run(name, func(t *testing.T) {
			out, err := runAs(tb, 0, env, argv[0], argv[1:]...)
			if err != nil {
				t.Fatal(err)
			}
			t.Log(out)
		})
	}
}

// startUnmodifiedServer runs, as nobody, a UDP server bound to server that
// knows nothing of Santa; it prints its socket's fd in place of a rule id
// (app.Rule).
func startUnmodifiedServer(t *testing.T, tb *testbed.Testbed, server netip.AddrPort) *app {
	prog := fmt.Sprintf("import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('%s',%d))\n"+
		"print('ready cookie=0 rule=%%d' %% s.fileno(),flush=True)\ntime.sleep(120)\n", server.Addr(), server.Port())
	return startApp(t, tb, nobody, nil, "/usr/bin/python3", "-c", prog)
}

// TestAttachUnmodifiedServer has root take over the socket of a server that
// knows nothing of Santa, by port and by pid and fd, through the CLI.
func TestAttachUnmodifiedServer(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7800)
	a := startUnmodifiedServer(t, tb, server)
	fd := a.Rule

	out, err := sd.cli(0, "attach", "--port", "7800/udp", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var socks []api.SocketInfo
	if err := json.Unmarshal([]byte(out), &socks); err != nil || len(socks) != 1 || !socks[0].Created || socks[0].PID != uint32(a.cmd.Process.Pid) {
		t.Fatalf("attach --port: %v %s", err, out)
	}
	if want := fmt.Sprintf("%q: %q", "bound", server.String()); !strings.Contains(out, want) {
		t.Errorf("attach --port --json does not say %s:\n%s", want, out)
	}
	cookie := socks[0].Cookie
	rules := filepath.Join(sd.dir, "attach.yaml")
	writeFile(t, rules, "rules:\n- conditions: [{offset: 0, text: Hello}]\n  processors: [{put: {at: 0, text: Taken}}]\n  reply_len: 5\n")
	if _, err := sd.cli(0, "rules", "add", "--socket", fmt.Sprint(cookie), rules); err != nil {
		t.Fatal(err)
	}
	if got := exchange(t, tb, server, "Hello"); got != "Taken" {
		t.Fatalf("Hello to the attached server got %q, want Taken", got)
	}
	out, err = sd.cli(0, "attach", "--pid", fmt.Sprint(a.cmd.Process.Pid), "--fd", fmt.Sprint(fd), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var again []api.SocketInfo
	if err := json.Unmarshal([]byte(out), &again); err != nil || len(again) != 1 || again[0].Cookie != cookie || again[0].Created {
		t.Fatalf("attach --pid --fd of the same socket: %v %s", err, out)
	}
	a.cmd.Process.Kill()
	a.cmd.Wait()
	waitGone(t, sd, cookie)
}

// TestAttachWithSampling: attach --sample-bytes binds with the sampling in
// the bind request itself, by pid and fd and by port, so the sockets sample
// their misses at once; a sample size santad refuses leaves no socket bound.
func TestAttachWithSampling(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7820)
	a := startUnmodifiedServer(t, tb, server)
	byPID := []string{"--pid", fmt.Sprint(a.cmd.Process.Pid), "--fd", fmt.Sprint(a.Rule)} // the fd, in place of a rule id
	byPort := []string{"--port", "7820/udp"}
	c := sd.client()
	for _, how := range [][]string{byPID, byPort} {
		out, err := sd.cli(0, append([]string{"attach", "--sample-bytes", "2000"}, how...)...)
		if err == nil || !strings.Contains(out, "at most 1472") {
			t.Errorf("attach %v --sample-bytes 2000: %v %q, want an error naming the 1472-byte limit", how, err, out)
		}
		if socks, err := c.ListSockets(); err != nil || len(socks) != 0 {
			t.Fatalf("a refused attach %v left rule sets: %+v %v", how, socks, err)
		}
	}
	for _, how := range [][]string{byPID, byPort} {
		out, err := sd.cli(0, append([]string{"attach", "--sample-bytes", "64", "--sample-rate", "100", "--json"}, how...)...)
		if err != nil {
			t.Fatalf("attach %v --sample-bytes 64: %v", how, err)
		}
		var socks []api.SocketInfo
		if err := json.Unmarshal([]byte(out), &socks); err != nil || len(socks) != 1 || !socks[0].Created {
			t.Fatalf("attach %v: %v %s", how, err, out)
		}
		waitSampled(t, c, tb, server)
		if err := c.Unbind(santa.Cookie(socks[0].Cookie)); err != nil {
			t.Fatal(err)
		}
	}
}

// waitSampled sends requests no rule answers to server until the rule
// processor counts one more miss sampled.
func waitSampled(t *testing.T, c *santa.Client, tb *testbed.Testbed, server netip.AddrPort) {
	t.Helper()
	_, before, err := c.Health()
	if err != nil {
		t.Fatal(err)
	}
	conn, err := tb.DialUDP(server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if _, err := conn.Write([]byte("no rule for this")); err != nil {
			t.Fatal(err)
		}
		if _, now, err := c.Health(); err == nil && now["miss_sampled"] > before["miss_sampled"] {
			return
		}
	}
	t.Fatalf("no miss sampled in 5 s: the attach did not set the socket's sampling")
}

// TestAttachLoopbackWarns: a server bound only to loopback is attached to,
// with a warning that its rules will never answer (its requests travel over
// lo, which santad does not attach to).
func TestAttachLoopbackWarns(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	prog := "import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('127.0.0.1',7810))\n" +
		"print('ready cookie=0 rule=0',flush=True)\ntime.sleep(120)\n"
	startApp(t, tb, nobody, nil, "/usr/bin/python3", "-c", prog)
	out, err := sd.cli(0, "attach", "--port", "7810/udp")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "127.0.0.1:7810/udp") || !strings.Contains(out, "santa: warning: "+api.LoopbackWarning) {
		t.Errorf("attach of a server bound to 127.0.0.1: %s; want the socket and the loopback warning", out)
	}
}

// TestRulesExpire: santad removes a rule when its Expires time comes (and
// not its neighbour without one), keeps a deadline across its own restart,
// and refuses a rule whose time has passed; with no santad running the data
// plane keeps to a deadline by itself.
func TestRulesExpire(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7900)
	c := sd.client()
	conn, cookie := boundEchoServer(t, tb, c, server) // what the client gets once no rule answers
	defer conn.Close()
	rule := func(ask, answer string, expires time.Time) api.Rule {
		r := api.Rule{Conditions: []api.Condition{{Pattern: api.Bytes(ask)}},
			Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes(answer)}}, ReplyLen: uint32(len(answer))}
		if !expires.IsZero() {
			r.Expires = uint64(expires.Unix())
		}
		return r
	}
	target := santa.Cookie(cookie)
	if _, err := c.Add(target, []api.Rule{rule("Past", "x", time.Now().Add(-time.Second))}); !errors.Is(err, santa.ErrInvalid) ||
		!strings.Contains(err.Error(), "which has passed") {
		t.Fatalf("a rule that expired a second ago: %v, want invalid (has passed)", err)
	}
	// Expires is in whole seconds: deadlines are second-aligned, and far
	// enough off that the steps before them fit on a slow machine (a
	// deadline of now+2s, truncated, could be 1.0 s away).
	inSeconds := func(n int64) time.Time { return time.Unix(time.Now().Unix()+n, 0) }
	soon := inSeconds(4) // 3 to 4 s from now
	if _, err := c.Add(target, []api.Rule{rule("Hello", "Taken", soon), rule("Bye", "Gone", time.Time{})}); err != nil {
		t.Fatal(err)
	}
	if got := exchange(t, tb, server, "Hello"); got != "Taken" {
		t.Fatalf("Hello before its rule expires: %q, want Taken", got)
	}
	rules, err := c.ListRules(target)
	if err != nil || len(rules) != 2 || rules[0].Expires != uint64(soon.Unix()) || rules[1].Expires != 0 {
		t.Fatalf("list rules: %+v %v; want Hello expiring at %d, Bye never", rules, err, soon.Unix())
	}
	waitRules := func(want int, by time.Time) {
		t.Helper()
		for {
			rules, err := c.ListRules(target)
			if err != nil {
				t.Fatal(err)
			}
			if len(rules) == want {
				return
			}
			if time.Now().After(by) {
				t.Fatalf("%d rules at %v, want %d", len(rules), time.Now().Format(time.TimeOnly), want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitRules(1, soon.Add(2*time.Second))
	if got := exchange(t, tb, server, "Hello"); got != "Hello" {
		t.Fatalf("Hello after its rule expired: %q, want the server's echo", got)
	}
	if got := exchange(t, tb, server, "Bye"); got != "Gone" {
		t.Fatalf("Bye (no expiry): %q, want Gone", got)
	}

	// a deadline survives santad's restart
	later := inSeconds(8) // 7 to 8 s from now: santad's restart comes first
	if _, err := c.Add(target, []api.Rule{rule("Later", "Soon gone", later)}); err != nil {
		t.Fatal(err)
	}
	sd.stop(syscall.SIGTERM)
	sd.start()
	c = sd.client()
	rules, err = c.ListRules(target)
	if err != nil || len(rules) != 2 || rules[1].Expires != uint64(later.Unix()) {
		t.Fatalf("after the restart: %+v %v; want Later still expiring at %d", rules, err, later.Unix())
	}
	waitRules(1, later.Add(2*time.Second))
	if got := exchange(t, tb, server, "Later"); got != "Later" {
		t.Fatalf("Later after its rule expired: %q, want the server's echo", got)
	}

	// with santad killed the data plane keeps to the deadline by itself
	brief := inSeconds(4)
	if _, err := c.Add(target, []api.Rule{rule("Short", "Answered", brief)}); err != nil {
		t.Fatal(err)
	}
	if got := exchange(t, tb, server, "Short"); got != "Answered" {
		t.Fatalf("Short before its rule expires: %q, want Answered", got)
	}
	sd.stop(syscall.SIGKILL)
	if got := exchange(t, tb, server, "Short"); got != "Answered" {
		t.Fatalf("Short right after santad was killed: %q, want Answered (the data plane outlives santad)", got)
	}
	// so does the TCP handover (TC), pinned like the XDP link
	for _, pin := range []string{"xdp-" + tb.Server.Dev, "xdp-" + tb.Server.Dev + "-handover"} {
		if _, err := os.Stat(filepath.Join("/sys/fs/bpf", filepath.Base(sd.dir), "links", pin)); err != nil {
			t.Errorf("santad killed, its link %s is not pinned: %v", pin, err)
		}
	}
	time.Sleep(time.Until(brief.Add(50 * time.Millisecond)))
	if got := exchange(t, tb, server, "Short"); got != "Short" {
		t.Fatalf("Short after its rule expired, no santad running: %q, want the server's echo", got)
	}
	sd.start()
	c = sd.client()

	// santa rules add --lifetime: a rule without its own expires gets one
	fixed := time.Now().Add(time.Hour).Unix()
	file := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(file, []byte(fmt.Sprintf(`rules:
  - {conditions: [{offset: 0, text: Brief}], processors: [{put: {at: 0, text: B}}], reply_len: 1}
  - {conditions: [{offset: 0, text: Fixed}], processors: [{put: {at: 0, text: F}}], reply_len: 1, expires: %d}
`, fixed)), 0o644); err != nil {
		t.Fatal(err)
	}
	socket := fmt.Sprint(cookie)
	if out, err := sd.cli(0, "rules", "add", "--socket", socket, "--lifetime", "-5s", file); err == nil ||
		!strings.Contains(out, "must not be negative") {
		t.Fatalf("--lifetime -5s: %v %s; want refused", err, out)
	}
	start := time.Now()
	if out, err := sd.cli(0, "rules", "add", "--socket", socket, "--lifetime", "1m", file); err != nil {
		t.Fatalf("rules add --lifetime 1m: %v %s", err, out)
	}
	rules, err = c.ListRules(target)
	if err != nil || len(rules) != 3 {
		t.Fatalf("after add --lifetime: %+v %v; want 3 rules", rules, err)
	}
	lo, hi := uint64(start.Add(time.Minute).Unix()), uint64(time.Now().Add(time.Minute+time.Second).Unix())
	if got := rules[1].Expires; got < lo || got > hi {
		t.Errorf("Brief expires at %d, want %d..%d (a minute from now)", got, lo, hi)
	}
	if got := rules[2].Expires; got != uint64(fixed) {
		t.Errorf("Fixed expires at %d, want its own %d", got, fixed)
	}
}

// cpuTime is the CPU time process pid uses in the next d.
func cpuTime(t *testing.T, pid int, d time.Duration) time.Duration {
	t.Helper()
	ticks := func() int {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			t.Fatal(err)
		}
		// the fields after the command's closing parenthesis: utime and stime are the 12th and 13th
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		user, _ := strconv.Atoi(f[11])
		system, _ := strconv.Atoi(f[12])
		return user + system
	}
	before := ticks()
	time.Sleep(d)
	return time.Duration(ticks()-before) * time.Second / 100 // USER_HZ
}

// TestRulesExpireFarOff: an expires time past 2^63 seconds is far off, not
// past (santad read it as a negative time and refused it as passed), and
// one just below it too (time.Unix wrapped it into the past: the rule never
// answered, and santad's expiry loop spun a CPU waiting for it): such rules
// are taken, answer, and are kept across santad's restart, santad idle.
func TestRulesExpireFarOff(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7910)
	c := sd.client()
	conn, cookie := boundEchoServer(t, tb, c, server)
	defer conn.Close()
	target := santa.Cookie(cookie)
	far := []api.Rule{
		{Conditions: []api.Condition{{Pattern: api.Bytes("Max")}}, Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("m")}},
			ReplyLen: 1, Expires: math.MaxUint64},
		{Conditions: []api.Condition{{Pattern: api.Bytes("Half")}}, Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("h")}},
			ReplyLen: 1, Expires: 1 << 63},
		{Conditions: []api.Condition{{Pattern: api.Bytes("Wrap")}}, Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("w")}},
			ReplyLen: 1, Expires: 1<<63 - 10_000_000_000},
	}
	if _, err := c.Add(target, far); err != nil {
		t.Fatalf("rules expiring at 2^64-1 and 2^63: %v, want them taken", err)
	}
	check := func(when string) {
		t.Helper()
		if got := exchange(t, tb, server, "Max"); got != "m" {
			t.Errorf("%s: Max got %q, want m from its rule", when, got)
		}
		if got := exchange(t, tb, server, "Half"); got != "h" {
			t.Errorf("%s: Half got %q, want h from its rule", when, got)
		}
		if got := exchange(t, tb, server, "Wrap"); got != "w" {
			t.Errorf("%s: Wrap got %q, want w from its rule", when, got)
		}
		if busy := cpuTime(t, sd.PID(), 2*time.Second); busy > 500*time.Millisecond {
			t.Errorf("%s: santad used %v of CPU in 2 s with nothing to do", when, busy)
		}
	}
	check("added")
	sd.stop(syscall.SIGTERM)
	sd.start()
	check("after santad's restart")
}

// roomForEveryAnswer gives conn a 16 MiB receive buffer: room for every
// answer of a load test even if its reader is slow to be scheduled (2
// CPUs, other tests running); the default holds a few hundred.
func roomForEveryAnswer(t *testing.T, conn *net.UDPConn) {
	t.Helper()
	rc, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	if cerr := rc.Control(func(fd uintptr) {
		err = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 16<<20)
	}); cerr != nil || err != nil {
		t.Fatalf("SO_RCVBUFFORCE: %v %v", cerr, err)
	}
}
