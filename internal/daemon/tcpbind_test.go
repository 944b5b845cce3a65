package daemon_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// listenTCP opens a plain TCP listener in the server namespace (Go would
// listen with MPTCP by default, which santad refuses).
func listenTCP(t *testing.T, tb *testbed.Testbed, addr netip.AddrPort) *net.TCPListener {
	t.Helper()
	var l net.Listener
	if err := tb.Server.Do(func() (err error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false)
		l, err = lc.Listen(context.Background(), "tcp", addr.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.(*net.TCPListener)
}

// httpRule answers a GET of path with a fixed response.
func httpRule(path, body string, close bool) api.Rule {
	resp := fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
	return api.Rule{
		Conditions: []api.Condition{santa.Match(0, []byte("GET "+path+" HTTP/1.1\r\n"))},
		Processors: []api.Processor{santa.Put(0, []byte(resp))},
		ReplyLen:   uint32(len(resp)),
		Close:      close,
	}
}

// TestTCPListener binds listening TCP sockets by passing their fd: their
// rule sets take rules with and without close, keep them across a restart,
// and show as TCP; TCP sockets that do not listen are refused, and so is
// close on a UDP socket's rules.
func TestTCPListener(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()

	l := listenTCP(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7900))
	target, err := santa.Socket(l)
	if err != nil {
		t.Fatal(err)
	}
	info, err := c.Bind(target, santa.SampleOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if info.Protocol != api.ProtocolTCP || info.Family != 4 || info.Port != 7900 || !info.Created || info.Cookie == 0 {
		t.Fatalf("bind of a TCP listener: %+v", info)
	}
	rules := []api.Rule{httpRule("/bye", "bye", true), httpRule("/stay", "stay", false)}
	ids, err := c.Add(target, rules)
	if err != nil {
		t.Fatalf("rules, one with close, for a TCP listener: %v", err)
	}
	// modify turns close on and off
	on, off := httpRule("/stay", "stay", true), httpRule("/bye", "bye", false)
	on.ID, off.ID = ids[1], ids[0]
	if err := c.Modify(santa.Cookie(info.Cookie), []api.Rule{on, off}); err != nil {
		t.Fatalf("modify close of a TCP listener's rules: %v", err)
	}
	check := func(when string) {
		t.Helper()
		got, err := c.ListRules(santa.Cookie(info.Cookie))
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].Close || !got[1].Close || got[0].Version != 2 || got[1].Version != 2 {
			t.Fatalf("%s: rules %+v, want close off on the first and on on the second", when, got)
		}
		socks, err := c.ListSockets()
		if err != nil || len(socks) != 1 || socks[0].Protocol != api.ProtocolTCP || socks[0].Rules != 2 {
			t.Fatalf("%s: sockets %+v (%v), want the TCP listener with 2 rules", when, socks, err)
		}
	}
	check("before the restart")

	// the CLI shows the protocol and close, and round-trips close in rule files
	out, err := sd.cli(0, "rules", "ls")
	if err != nil || !strings.Contains(out, fmt.Sprintf("%v:7900/tcp", tb.Server.IP4)) {
		t.Errorf("rules ls does not show the TCP listener as /tcp: %v\n%s", err, out)
	}
	if out, err = sd.cli(0, "rules", "ls", "--socket", fmt.Sprint(info.Cookie)); err != nil || strings.Count(out, " close") != 1 {
		t.Errorf("rules ls --socket shows close %d times, want once: %v\n%s", strings.Count(out, " close"), err, out)
	}
	if out, err = sd.cli(0, "rules", "ls", "--socket", fmt.Sprint(info.Cookie), "--json"); err != nil || strings.Count(out, `"close": true`) != 1 {
		t.Errorf("rules ls --json: %v\n%s", err, out)
	}
	file := filepath.Join(sd.dir, "tcp.yaml")
	writeFile(t, file, "rules:\n- conditions: [{offset: 0, text: \"GET /file\"}]\n  processors: [{put: {at: 0, text: x}}]\n  reply_len: 1\n  close: true\n")
	if _, err := sd.cli(0, "rules", "add", "--socket", fmt.Sprint(info.Cookie), "--tag", "from a file", file); err != nil {
		t.Fatalf("rule file with close for a TCP listener: %v", err)
	}
	fileRules, err := c.ListRules(santa.Cookie(info.Cookie))
	if err != nil || len(fileRules) != 3 || !fileRules[2].Close || fileRules[2].Tag != "from a file" {
		t.Fatalf("rule file's rule: %+v (%v), want close and the tag", fileRules, err)
	}
	if out, err = sd.cli(0, "rules", "ls", "--socket", fmt.Sprint(info.Cookie)); err != nil || strings.Count(out, "from a file") != 1 {
		t.Errorf("rules ls --socket shows the tag %d times, want once: %v\n%s", strings.Count(out, "from a file"), err, out)
	}
	if out, err = sd.cli(0, "rules", "ls", "--socket", fmt.Sprint(info.Cookie), "--tag", "from a file"); err != nil ||
		strings.Count(out, "\n") != 2 || !strings.Contains(out, "from a file") {
		t.Errorf("rules ls --tag: want a header and the one tagged rule: %v\n%s", err, out)
	}
	if out, err = sd.cli(0, "rules", "rm", "--socket", fmt.Sprint(info.Cookie), "--tag", "from a file"); err != nil || !strings.Contains(out, "removed 1 rules") {
		t.Fatalf("rules rm --tag: %v\n%s", err, out)
	}
	if out, err = sd.cli(0, "rules", "rm", "--socket", fmt.Sprint(info.Cookie), "--tag", "from a file"); err != nil || !strings.Contains(out, "no rules tagged") {
		t.Errorf("rules rm --tag again: %v\n%s", err, out)
	}

	// the protocol and close survive a restart (journal and compaction),
	// and the restarted santad pins its own TCP flow table in place of the
	// predecessor's (whose flows it carried over)
	bpffs := filepath.Join("/sys/fs/bpf", filepath.Base(sd.dir))
	flowTable := func() ebpf.MapID {
		t.Helper()
		m, err := ebpf.LoadPinnedMap(filepath.Join(bpffs, "tcp_flows"), nil)
		if err != nil {
			t.Fatalf("pinned TCP flow table: %v", err)
		}
		defer m.Close()
		info, err := m.Info()
		if err != nil {
			t.Fatal(err)
		}
		id, _ := info.ID()
		xdp, err := link.LoadPinnedLink(filepath.Join(bpffs, "links", "xdp-"+tb.Server.Dev), nil)
		if err != nil {
			t.Fatalf("pinned XDP link: %v", err)
		}
		defer xdp.Close()
		li, err := xdp.Info()
		if err != nil {
			t.Fatal(err)
		}
		prog, err := ebpf.NewProgramFromID(li.Program)
		if err != nil {
			t.Fatal(err)
		}
		defer prog.Close()
		pi, err := prog.Info()
		if err != nil {
			t.Fatal(err)
		}
		if maps, _ := pi.MapIDs(); !slices.Contains(maps, id) {
			t.Errorf("the pinned TCP flow table (map %d) is not the attached rule processor's (maps %v)", id, maps)
		}
		return id
	}
	flows := flowTable()
	sd.stop(syscall.SIGTERM)
	sd.start()
	c = sd.client()
	check("after a restart")
	if got := flowTable(); got == flows {
		t.Errorf("TCP flow table after a restart: the predecessor's (map %d), want the successor's own", got)
	}

	// IPv6 listeners too; binding again is idempotent
	l6 := listenTCP(t, tb, netip.AddrPortFrom(tb.Server.IP6, 7900))
	t6, _ := santa.Socket(l6)
	if i6, err := c.Bind(t6, santa.SampleOptions{}); err != nil || i6.Family != 6 || i6.Protocol != api.ProtocolTCP {
		t.Errorf("bind of an IPv6 TCP listener: %+v, %v", i6, err)
	}
	if again, err := c.Bind(target, santa.SampleOptions{}); err != nil || again.Created || again.Cookie != info.Cookie {
		t.Errorf("binding the listener again: %+v, %v", again, err)
	}

	// TCP sockets that do not listen: bound only, a connection's two ends
	bound := -1
	if err := tb.Server.Do(func() (err error) {
		if bound, err = unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0); err != nil {
			return err
		}
		return unix.Bind(bound, &unix.SockaddrInet4{Port: 7902, Addr: tb.Server.IP4.As4()})
	}); err != nil {
		t.Fatal(err)
	}
	defer unix.Close(bound)
	var dialed net.Conn
	if err := tb.Server.Do(func() (err error) {
		dialed, err = net.Dial("tcp", l.Addr().String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer dialed.Close()
	accepted, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	notListening := map[string]santa.Target{"a bound TCP socket": santa.FD(bound)}
	for name, conn := range map[string]net.Conn{"a connected TCP socket": dialed, "an accepted TCP connection": accepted} {
		if notListening[name], err = santa.Socket(conn.(*net.TCPConn)); err != nil {
			t.Fatal(err)
		}
	}
	for name, tg := range notListening {
		_, err := c.Bind(tg, santa.SampleOptions{})
		if !errors.Is(err, santa.ErrInvalid) || !strings.Contains(err.Error(), "TCP socket is not listening: rules bind to the listening socket") {
			t.Errorf("bind of %s: %v, want invalid: not listening", name, err)
		}
		if _, err := c.Add(tg, rules); !errors.Is(err, santa.ErrInvalid) {
			t.Errorf("rules for %s: %v, want invalid", name, err)
		}
	}
	// Go's default listener is MPTCP where the kernel has it: refused, saying so
	var mp net.Listener
	if err := tb.Server.Do(func() (err error) {
		mp, err = net.Listen("tcp", netip.AddrPortFrom(tb.Server.IP4, 7903).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer mp.Close()
	mpt, _ := santa.Socket(mp.(*net.TCPListener))
	var proto int
	if rc, err := mp.(*net.TCPListener).SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { proto, _ = unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL) })
	}
	if _, err := c.Bind(mpt, santa.SampleOptions{}); proto == unix.IPPROTO_MPTCP && (!errors.Is(err, santa.ErrInvalid) || !strings.Contains(err.Error(), "MPTCP")) {
		t.Errorf("bind of an MPTCP listener: %v, want invalid naming MPTCP", err)
	}

	// close on a UDP socket's rules: refused, and nothing installed
	udp := listenUDP(t, tb, 7904)
	ut, _ := santa.Socket(udp)
	if _, err := c.Add(ut, []api.Rule{rule("a", 0, "A")}); err != nil {
		t.Fatal(err)
	}
	closing := rule("b", 0, "B")
	closing.Close = true
	for op, do := range map[string]func() error{
		"add":     func() error { _, err := c.Add(ut, []api.Rule{rule("c", 0, "C"), closing}); return err },
		"replace": func() error { _, err := c.Replace(ut, []api.Rule{closing}); return err },
		"modify": func() error {
			r := closing
			r.ID = ruleIDs(t, c, ut)[0]
			return c.Modify(ut, []api.Rule{r})
		},
	} {
		err := do()
		if !errors.Is(err, santa.ErrInvalid) || !strings.Contains(err.Error(), "close ends a TCP connection") {
			t.Errorf("%s of a rule with close to a UDP socket: %v, want invalid", op, err)
		}
		if got := ruleIDs(t, c, ut); len(got) != 1 {
			t.Errorf("%s refused, but the UDP socket has %d rules", op, len(got))
		}
	}
	if rs, _ := c.ListRules(ut); len(rs) != 1 || rs[0].Close || rs[0].Version != 1 {
		t.Errorf("the UDP socket's rule changed: %+v", rs)
	}
}

// TestAttachTCPServer has root take over the listening socket of an
// unmodified TCP server, by pid and fd and by port, through the CLI; its
// rule set dies with the socket.
func TestAttachTCPServer(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7910)
	prog := fmt.Sprintf("import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_STREAM)\ns.bind(('%s',%d))\ns.listen()\n"+
		"c=socket.create_connection(('%s',%d))\n"+ // a connection on the port, which attach must leave alone
		"print('ready cookie=0 rule=%%d' %% s.fileno(),flush=True)\ntime.sleep(120)\n",
		server.Addr(), server.Port(), server.Addr(), server.Port())
	a := startApp(t, tb, nobody, nil, "/usr/bin/python3", "-c", prog)
	fd := a.Rule // the program prints its listener's fd in place of a rule id

	out, err := sd.cli(0, "attach", "--pid", fmt.Sprint(a.cmd.Process.Pid), "--fd", fmt.Sprint(fd), "--json")
	if err != nil {
		t.Fatal(err)
	}
	var socks []api.SocketInfo
	if err := json.Unmarshal([]byte(out), &socks); err != nil || len(socks) != 1 || !socks[0].Created ||
		socks[0].Protocol != api.ProtocolTCP || socks[0].AddrPort() != server || socks[0].PID != uint32(a.cmd.Process.Pid) {
		t.Fatalf("attach --pid --fd of a TCP listener: %v %s", err, out)
	}
	cookie := socks[0].Cookie
	// the table shows it as tcp
	if out, err := sd.cli(0, "attach", "--pid", fmt.Sprint(a.cmd.Process.Pid), "--fd", fmt.Sprint(fd)); err != nil ||
		!strings.Contains(out, server.String()+"/tcp") {
		t.Errorf("attach table does not show %v/tcp: %v\n%s", server, err, out)
	}
	// by port: the same socket, not the connection's ends
	out, err = sd.cli(0, "attach", "--port", "7910/tcp", "--json")
	if err != nil {
		t.Fatal(err)
	}
	var again []api.SocketInfo
	if err := json.Unmarshal([]byte(out), &again); err != nil || len(again) != 1 || again[0].Cookie != cookie || again[0].Created {
		t.Fatalf("attach --port 7910/tcp: %v %s", err, out)
	}
	// the Go client's bind by port
	c := sd.client()
	if byPort, err := c.BindPortProtocol(7910, api.ProtocolTCP, santa.SampleOptions{}); err != nil || len(byPort) != 1 || byPort[0].Cookie != cookie {
		t.Errorf("BindPortProtocol(7910, TCP): %+v, %v", byPort, err)
	}
	if _, err := c.BindPort(7910); !errors.Is(err, santa.ErrNotFound) {
		t.Errorf("BindPort(7910) with only TCP sockets on it: %v, want not found", err)
	}
	if _, err := c.BindPortProtocol(7910, 132, santa.SampleOptions{}); !errors.Is(err, santa.ErrInvalid) {
		t.Errorf("bind by port with protocol 132: %v, want invalid", err)
	}
	if out, err := sd.cli(0, "attach", "--port", "7911/tcp"); err == nil || !strings.Contains(out, "TCP socket listening on") {
		t.Errorf("attach --port of a port nobody listens on: %v %s", err, out)
	}
	closing := filepath.Join(sd.dir, "close.yaml")
	writeFile(t, closing, "rules:\n- conditions: [{offset: 0, text: \"GET / \"}]\n  processors: [{put: {at: 0, text: \"HTTP/1.0 204 No Content\\r\\n\\r\\n\"}}]\n  reply_len: 27\n  close: true\n")
	if _, err := sd.cli(0, "rules", "add", "--socket", fmt.Sprint(cookie), closing); err != nil {
		t.Fatalf("a rule with close for the attached TCP listener: %v", err)
	}
	if again, err := c.BindPID(a.cmd.Process.Pid, int(fd), santa.SampleOptions{}); err != nil || again.Cookie != cookie || again.Protocol != api.ProtocolTCP {
		t.Errorf("BindPID of the listener: %+v, %v", again, err)
	}
	a.cmd.Process.Kill()
	a.cmd.Wait()
	waitGone(t, sd, cookie)
}

// TestJournalCompactsWhileRunning modifies one rule with a 10 kB reply over
// and over (as `santa http` refreshes Date): the journal is compacted while
// santad runs, so it stays small, and a restart still has the last version.
func TestJournalCompactsWhileRunning(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	l := listenTCP(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7901))
	info := testbed.Bind(t, c, l)
	target := santa.Cookie(info.Cookie)
	body := strings.Repeat("x", 10000)
	ids, err := c.Add(target, []api.Rule{httpRule("/page", body, false)})
	if err != nil {
		t.Fatal(err)
	}
	const n = 6000 // 60 MB of modifications
	for i := 0; i < n; i++ {
		r := httpRule("/page", fmt.Sprintf("%05d", i)+body[5:], false)
		r.ID = ids[0]
		if err := c.Modify(target, []api.Rule{r}); err != nil {
			t.Fatal(err)
		}
	}
	st, err := os.Stat(filepath.Join(sd.dir, "state", "journal"))
	if err != nil {
		t.Fatal(err)
	}
	const bound = 48 << 20 // compaction starts at twice the compacted size plus 16 MiB
	if st.Size() > bound {
		t.Fatalf("journal is %d bytes after %d modifications of a 10 kB rule; compaction keeps it under %d",
			st.Size(), n, bound)
	}
	sd.stop(syscall.SIGTERM)
	sd.start()
	rules, err := sd.client().ListRules(santa.Cookie(info.Cookie))
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != 1 || !strings.Contains(string(rules[0].Processors[0].Template), fmt.Sprintf("%05d", n-1)) {
		t.Fatalf("after a restart, santad does not have the last version of the rule")
	}
}

// TestKernelDataNotSampledForAnotherUsersListener: data on a connection the
// kernel owns is sampled for the listener a lookup finds on its port, which
// need not be the one that accepted it. Root's server accepted a
// connection and closed its listener; uid nobody then listened on the
// port (both with SO_REUSEADDR, as Go's and most servers' listeners are)
// and subscribed to its samples: it got the requests of root's
// connection, Authorization header and all. Only a listener of the
// connection's own user gets them now.
func TestKernelDataNotSampledForAnotherUsersListener(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7950)
	l := listenTCP(t, tb, server)
	var conn net.Conn
	if err := tb.Client.Do(func() (err error) {
		conn, err = net.Dial("tcp", server.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	accepted, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer accepted.Close()
	l.Close() // root's connection goes on without its listener
	prog := `import socket, sys, santa
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("0.0.0.0", int(sys.argv[2])))
l.listen(8)
c = santa.Client(sys.argv[1])
c.bind(l)
samples = c.subscribe(l, 200, 1000)
print("ready cookie=0 rule=0", flush=True)
for s in samples:
    print("sample", s.data, flush=True)`
	a := startApp(t, tb, nobody, []string{"PYTHONPATH=" + filepath.Join(work, "python")},
		"/usr/bin/python3", "-c", prog, sd.Socket, fmt.Sprint(server.Port()))
	buf := make([]byte, 256)
	for i := 0; i < 3; i++ {
		req := fmt.Sprintf("GET /%d HTTP/1.1\r\nAuthorization: Bearer root-secret\r\n\r\n", i)
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		if _, err := io.ReadAtLeast(accepted, buf, len(req)); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(500 * time.Millisecond) // samples reach the subscriber within milliseconds
	if out := a.out.String(); strings.Contains(out, "sample") {
		t.Errorf("nobody's listener got samples of root's connection:\n%s", out)
	}
}
