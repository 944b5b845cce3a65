package daemon_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"github.com/santa-offload/santa/api"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// TestAcceptFailuresBackOff runs santad out of fds with idle connections:
// accept then fails (EMFILE) until one closes, and santad must wait between
// tries rather than spin a CPU and flood its log; once the connections
// close, it serves clients again.
func TestAcceptFailuresBackOff(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	pid := strconv.Itoa(sd.PID())
	fds, err := os.ReadDir("/proc/" + pid + "/fd")
	if err != nil {
		t.Fatal(err)
	}
	limit := strconv.Itoa(len(fds) + 4)
	if out, err := exec.Command("prlimit", "--pid", pid, "--nofile="+limit+":"+limit).CombinedOutput(); err != nil {
		t.Fatalf("prlimit: %v: %s", err, out)
	}
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 20 { // the ones santad cannot accept wait in the listen backlog
		c, err := net.Dial("unix", sd.Socket)
		if err != nil {
			t.Fatal(err)
		}
		idle = append(idle, c)
	}
	time.Sleep(2 * time.Second)
	if n := strings.Count(sd.Log(), "accept failed"); n == 0 || n > 20 {
		t.Errorf("santad logged %d failed accepts in 2 s out of fds, want a few (it retries with pauses)", n)
	}
	for _, c := range idle {
		c.Close()
	}
	idle = nil
	if _, err := sd.cli(0, "status"); err != nil {
		t.Errorf("santad does not serve clients again once the idle connections closed: %v", err)
	}
}

// TestConnectionQuota: a non-root uid holds at most quota.connections
// control connections; the next is refused with quota, and root and other
// uids are still served.
func TestConnectionQuota(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb, "--config", configFile(t, "quota:\n  connections: 5\n"))
	sd.start()
	// uid nobody holds five idle connections
	hold := `import socket, sys, time
conns = [socket.socket(socket.AF_UNIX) for _ in range(5)]
for c in conns:
    c.connect(sys.argv[1])
print("holding", flush=True)
time.sleep(600)`
	holder := exec.Command("nsenter", asUser(tb, nobody, "/usr/bin/python3", "-c", hold, sd.Socket)[1:]...)
	out, err := holder.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	defer holder.Wait()
	defer holder.Process.Kill()
	if line, err := bufio.NewReader(out).ReadString('\n'); err != nil || line != "holding\n" {
		t.Fatalf("holder: %q %v", line, err)
	}
	// each client says why: santad answers before it closes the connection
	env := []string{"SANTA_SOCKET=" + sd.Socket, "PYTHONPATH=" + filepath.Join(work, "python")}
	for name, argv := range map[string][]string{
		"cli":    {filepath.Join(work, "santa"), "--socket-path", sd.Socket, "status"},
		"go":     {filepath.Join(work, "listing1-go"), tb.Server.IP4.String(), "7950"},
		"c":      {filepath.Join(work, "c", "listing1"), tb.Server.IP4.String(), "7951"},
		"python": {"/usr/bin/python3", filepath.Join(work, "python", "examples", "listing1.py"), tb.Server.IP4.String(), "7952"},
	} {
		if out, err := runAs(tb, nobody, env, argv[0], argv[1:]...); err == nil || !strings.Contains(out, "quota.connections") {
			t.Errorf("%s: a sixth connection of nobody: %v %q, want refused naming quota.connections", name, err, out)
		}
	}
	if _, err := sd.cli(0, "status"); err != nil {
		t.Errorf("root beside nobody's connections: %v", err)
	}
	if _, err := sd.cli(nobody+1, "status"); err != nil {
		t.Errorf("another uid beside nobody's connections: %v", err)
	}
	holder.Process.Kill()
	holder.Wait()
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, err := sd.cli(nobody, "status")
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("nobody once its connections closed: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestRequestMemoryQuota: santad bounds the memory a non-root uid's
// requests hold (quota.request_bytes), before it allocates it: a frame
// longer than that, and a short frame that would decode to more (a rule
// array of tiny maps: over 40 times its size), are refused with quota, and
// the connection goes on. root has no such bound.
func TestRequestMemoryQuota(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb, "--config", configFile(t, "quota:\n  request_bytes: 1048576\n"))
	sd.start()
	const rules = 100000 // of 3 bytes each, {5: 1}: 300 kB that decode to 13.6 MB
	tiny := binary.BigEndian.AppendUint32(
		[]byte{0xa5, 0x00, 0x01, 0x01, byte(api.OpAdd), 0x02, 0x01, 0x05, 0x01, 0x09, 0x9a}, rules)
	tiny = append(tiny, bytes.Repeat([]byte{0xa1, 0x05, 0x01}, rules)...)
	long := mustEncode(t, &api.Message{V: 1, Op: api.OpHealth, Seq: 2, Error: strings.Repeat("x", 2<<20)})
	health := mustEncode(t, &api.Message{V: 1, Op: api.OpHealth, Seq: 3})
	frames := filepath.Join(sd.dir, "frames")
	for i, body := range [][]byte{tiny, long, health} {
		if err := os.WriteFile(filepath.Join(frames+strconv.Itoa(i)), body, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	// sends each file as a frame on one connection and prints santad's answers
	send := `import socket, struct, sys
from santa.transport import recv_message
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
for path in sys.argv[2:]:
    body = open(path, "rb").read()
    s.sendall(struct.pack(">I", len(body)) + body)
    m, _ = recv_message(s)
    print(int(m.status), m.seq, m.error or "-")`
	args := []string{"-c", send, sd.Socket, frames + "0", frames + "1", frames + "2"}
	env := []string{"PYTHONPATH=" + filepath.Join(work, "python")}
	out, err := runAs(tb, nobody, env, "/usr/bin/python3", args...)
	if err != nil {
		t.Fatal(err)
	}
	answers := strings.Split(strings.TrimSpace(out), "\n")
	// each refusal echoes the seq of the frame it did not decode
	quota := func(seq int) string { return fmt.Sprintf("%d %d ", api.StatusQuota, seq) }
	if len(answers) != 3 || !strings.HasPrefix(answers[0], quota(1)) || !strings.Contains(answers[0], "quota.request_bytes") ||
		!strings.HasPrefix(answers[1], quota(2)) || !strings.Contains(answers[1], "quota.request_bytes") || answers[2] != "0 3 -" {
		t.Errorf("as nobody: 300 kB decoding to 13.6 MB, a 2 MB frame, then health, answered\n%s\nwant quota (seq 1, then 2, naming quota.request_bytes), then ok (seq 3)", out)
	}
	if out, err := runAs(tb, 0, env, "/usr/bin/python3", args...); err != nil || strings.Contains(out, "request_bytes") {
		t.Errorf("as root: %v\n%s\nwant the frames decoded (root has no such bound)", err, out)
	}
}

// TestUserPorts: with user_ports set, a non-root uid gets rule sets only
// for its sockets on those ports (the rule processor answers before the
// host's firewall, which may close the others); root may still attach a
// socket on any port.
func TestUserPorts(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb, "--config", configFile(t, "user_ports: [7460/udp, 7470-7479/tcp]\n"))
	sd.start()
	env := []string{"SANTA_SOCKET=" + sd.Socket, "PYTHONPATH=" + filepath.Join(work, "python")}
	ip := tb.Server.IP4.String()
	for name, argv := range map[string][]string{
		"go":     {filepath.Join(work, "listing1-go"), ip, "7461"},
		"c":      {filepath.Join(work, "c", "listing1"), ip, "7461"},
		"python": {"/usr/bin/python3", filepath.Join(work, "python", "examples", "listing1.py"), ip, "7461"},
	} {
		if out, err := runAs(tb, nobody, env, argv[0], argv[1:]...); err == nil || !strings.Contains(out, "user_ports") {
			t.Errorf("%s: nobody's socket on 7461/udp: %v %q, want refused naming user_ports", name, err, out)
		}
	}
	a := startApp(t, tb, nobody, env, filepath.Join(work, "listing1-go"), ip, "7460")
	if got := exchange(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7460), "Hello"); got != "COMSYS" {
		t.Errorf("nobody's rule on 7460/udp, among user_ports: %q, want COMSYS", got)
	}
	a.cmd.Process.Kill()
	// root attaches nobody's socket outside user_ports; nobody then binds
	// it (bind returns the rule set it has) and adds its rule
	prog := `import socket, sys, time, santa
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((sys.argv[1], 7461))
print("bound", flush=True)
sys.stdin.readline()
with santa.Client() as c:
    print("created" if c.bind(s).created else "existing", c.add(s, [santa.Rule(conditions=[santa.Condition(0, b"Hi")],
        processors=[santa.Put(0, b"Yo")], reply_len=2)]), flush=True)
time.sleep(60)`
	app := exec.Command("nsenter", asUser(tb, nobody, "/usr/bin/python3", "-c", prog, ip)[1:]...)
	app.Env = append(os.Environ(), env...)
	stdin, err := app.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := app.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := app.Start(); err != nil {
		t.Fatal(err)
	}
	defer app.Wait()
	defer app.Process.Kill()
	lines := bufio.NewReader(stdout)
	if line, err := lines.ReadString('\n'); line != "bound\n" {
		t.Fatalf("nobody's server: %q %v", line, err)
	}
	if out, err := sd.cli(0, "attach", "--port", "7461/udp"); err != nil {
		t.Errorf("root attaching a socket on 7461/udp, outside user_ports: %v %s", err, out)
	}
	stdin.Write([]byte("go\n"))
	if line, err := lines.ReadString('\n'); !strings.HasPrefix(line, "existing [") {
		t.Errorf("nobody binding and adding to the socket root attached: %q %v, want the existing rule set and a rule id", line, err)
	}
	if got := exchange(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7461), "Hi"); got != "Yo" {
		t.Errorf("nobody's rule on the socket root attached: %q, want Yo", got)
	}
}

// TestSocketOfAnotherNetns: santad refuses a socket of another network
// namespace than its own, whose requests never reach its interfaces: one
// uid nobody bound to port 53 in a user and network namespace of its own,
// passed by nobody or attached by root.
func TestSocketOfAnotherNetns(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	prog := `import os, socket, sys, time, santa
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("0.0.0.0", 53))
try:
    with santa.Client(sys.argv[1]) as c:
        c.bind(s)
    print("bound", flush=True)
except santa.Error as e:
    print("refused", int(e.status), e, flush=True)
print("ready cookie=0 rule=%d" % s.fileno(), flush=True)
time.sleep(120)`
	a := startApp(t, tb, nobody, []string{"PYTHONPATH=" + filepath.Join(work, "python")},
		"unshare", "--user", "--map-root-user", "--net", "/usr/bin/python3", "-c", prog, sd.Socket)
	if out := a.out.String(); !strings.Contains(out, fmt.Sprintf("refused %d ", api.StatusInvalid)) || !strings.Contains(out, "another network namespace") {
		t.Errorf("nobody passing its socket of another network namespace: %q, want invalid naming the namespace", out)
	}
	out, err := sd.cli(0, "attach", "--pid", fmt.Sprint(a.cmd.Process.Pid), "--fd", fmt.Sprint(a.Rule))
	if err == nil || !strings.Contains(out, "another network namespace") {
		t.Errorf("root attaching a socket of another network namespace: %v %q, want refused naming the namespace", err, out)
	}
	if out, err := sd.cli(0, "rules", "ls", "--json"); err != nil || strings.TrimSpace(out) != "[]" {
		t.Errorf("rule sets: %v %s, want none", err, out)
	}
}

// TestSocketModeDeniedSaysWhy: a user whom socket_mode and socket_group
// keep out of santad's socket is told so by every client, not asked
// whether santad runs (it does).
func TestSocketModeDeniedSaysWhy(t *testing.T) {
	tb := testbed.New(t)
	config := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(config, []byte("socket_mode: \"0660\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sd := newSantad(t, tb, "--config", config)
	sd.start()
	env := []string{"SANTA_SOCKET=" + sd.Socket, "PYTHONPATH=" + filepath.Join(work, "python")}
	for name, argv := range map[string][]string{
		"cli":    {filepath.Join(work, "santa"), "--socket-path", sd.Socket, "status"},
		"go":     {filepath.Join(work, "listing1-go"), tb.Server.IP4.String(), "7954"},
		"c":      {filepath.Join(work, "c", "listing1"), tb.Server.IP4.String(), "7955"},
		"python": {"/usr/bin/python3", filepath.Join(work, "python", "examples", "listing1.py"), tb.Server.IP4.String(), "7956"},
	} {
		out, err := runAs(tb, nobody, env, argv[0], argv[1:]...)
		if err == nil || !strings.Contains(out, "socket_mode and socket_group decide who may connect") || strings.Contains(out, "is santad running") {
			t.Errorf("%s: nobody kept out by socket_mode 0660: %v %q, want told that socket_mode and socket_group decide", name, err, out)
		}
	}
	if _, err := sd.cli(0, "status"); err != nil {
		t.Errorf("root: %v", err)
	}
}

// TestSocketBoundToBridgePort: santad refuses a socket bound
// (SO_BINDTODEVICE) to its interface when that interface is a bridge port.
// The rule processor looks sockets up on the port a request arrives on,
// before the bridge takes it: it found nobody's socket bound to the port,
// and nobody's rules answered requests the kernel delivers to root's socket
// bound to the bridge on the same port (sockets bound to different
// interfaces may share a port, whoever their users).
func TestSocketBoundToBridgePort(t *testing.T) {
	tb := testbed.New(t)
	makeBridgePort(t, tb)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7150)
	rootEcho(t, tb, server.Port(), false)
	prog := `import socket, sys, time, santa
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, sys.argv[2].encode())
s.bind(("0.0.0.0", int(sys.argv[3])))
rule = santa.Rule(conditions=[santa.Condition(offset=0, pattern=b"Hello")],
                  processors=[santa.Put(reply_offset=0, template=b"nobody")], reply_len=6)
try:
    with santa.Client(sys.argv[1]) as c:
        c.add(s, [rule])
    print("added", flush=True)
except santa.Error as e:
    print("refused", int(e.status), e, flush=True)
print("ready cookie=0 rule=0", flush=True)
time.sleep(120)`
	a := startApp(t, tb, nobody, []string{"PYTHONPATH=" + filepath.Join(work, "python")},
		"/usr/bin/python3", "-c", prog, sd.Socket, tb.Server.Dev, fmt.Sprint(server.Port()))
	if out := a.out.String(); !strings.Contains(out, fmt.Sprintf("refused %d ", api.StatusInvalid)) || !strings.Contains(out, "a port of hb0") {
		t.Errorf("nobody passing its socket bound to the bridge port: %q, want invalid naming the bridge", out)
	}
	if got := exchange(t, tb, server, "Hello"); got != "root:Hello" {
		t.Errorf("Hello to root's socket bound to the bridge: %q, want root's own answer", got)
	}
}

// makeBridgePort makes the server's interface a port of bridge hb0, which
// takes its MAC and IPv4 address.
func makeBridgePort(t *testing.T, tb *testbed.Testbed) {
	t.Helper()
	ip := func(args ...string) {
		t.Helper()
		if out, err := tb.Server.Run("ip", args...); err != nil {
			t.Fatal(err, out)
		}
	}
	ip("link", "add", "hb0", "address", tb.Server.MAC.String(), "type", "bridge")
	ip("link", "set", tb.Server.Dev, "master", "hb0")
	ip("addr", "flush", "dev", tb.Server.Dev)
	ip("addr", "add", tb.Server.IP4.String()+"/24", "dev", "hb0")
	ip("link", "set", "hb0", "up")
}

// rootEcho runs root's UDP server on port of every IPv4 address, bound to
// bridge hb0 (SO_BINDTODEVICE), with SO_REUSEADDR if reuseAddr: it echoes
// each datagram prefixed with "root:" until the test ends.
func rootEcho(t *testing.T, tb *testbed.Testbed, port uint16, reuseAddr bool) {
	t.Helper()
	var conn *net.UDPConn
	if err := tb.Server.Do(func() error {
		lc := net.ListenConfig{Control: func(_, _ string, c syscall.RawConn) error {
			var serr error
			err := c.Control(func(fd uintptr) {
				serr = unix.BindToDevice(int(fd), "hb0")
				if serr == nil && reuseAddr {
					serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_REUSEADDR, 1)
				}
			})
			return errors.Join(err, serr)
		}}
		pc, err := lc.ListenPacket(context.Background(), "udp4", fmt.Sprintf("0.0.0.0:%d", port))
		if err == nil {
			conn = pc.(*net.UDPConn)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	go func() {
		buf := make([]byte, 2048)
		for {
			n, peer, err := conn.ReadFromUDP(buf)
			if err != nil {
				return
			}
			conn.WriteToUDP(append([]byte("root:"), buf[:n]...), peer)
		}
	}()
}

// TestReuseAddrSocketUnderBridge: on a bridge port, uid nobody's socket
// bound to no interface but with SO_REUSEADDR shares its port with root's
// socket bound to the bridge (SO_REUSEADDR too), which the kernel prefers:
// the rule processor, whose socket lookup on the port finds only nobody's,
// answered root's requests with nobody's rules. It now passes them
// (pass_under_master), also once nobody has cleared SO_REUSEADDR (the
// sockets still share the port), and still answers for nobody's socket
// that shares its port with none. A socket bound to the interface before
// it became a port, which the kernel then no longer delivers to, is not
// answered for either, and santa attach --port says why it refuses it.
func TestReuseAddrSocketUnderBridge(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	prog := `import os, socket, sys, time, santa
def sock(port, reuse, device):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    if reuse:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if device:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, device.encode())
    s.bind(("0.0.0.0", port))
    return s
socks = {"reuse": sock(7160, True, ""), "plain": sock(7161, False, ""), "bound": sock(7162, False, sys.argv[2])}
with santa.Client(sys.argv[1]) as c:
    for name, s in socks.items():
        c.add(s, [santa.Rule(conditions=[santa.Condition(offset=0, pattern=b"Hello")],
                             processors=[santa.Put(reply_offset=0, template=name.encode())], reply_len=len(name))])
print("ready cookie=0 rule=0", flush=True)
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
socks["reuse"].setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 0)  # root's shares the port all the same
print("cleared", flush=True)
time.sleep(120)`
	dir, err := os.MkdirTemp(work, "bridge-") // one nobody may look into
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	os.Chmod(dir, 0o755)
	rootBound := filepath.Join(dir, "root-bound")
	a := startApp(t, tb, nobody, []string{"PYTHONPATH=" + filepath.Join(work, "python")},
		"/usr/bin/python3", "-c", prog, sd.Socket, tb.Server.Dev, rootBound)
	makeBridgePort(t, tb)
	rootEcho(t, tb, 7160, true)
	if err := os.WriteFile(rootBound, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(a.out.String(), "cleared"); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("nobody's program did not clear SO_REUSEADDR:\n%s", a.out.String())
		}
	}
	at := func(port uint16) netip.AddrPort { return netip.AddrPortFrom(tb.Server.IP4, port) }
	if got := exchange(t, tb, at(7160), "Hello"); got != "root:Hello" {
		t.Errorf("Hello to port 7160, where the kernel delivers to root's socket bound to the bridge: %q, want root's own answer", got)
	}
	if got := exchange(t, tb, at(7161), "Hello"); got != "plain" {
		t.Errorf("Hello to nobody's socket without SO_REUSEADDR: %q, want its rule's answer", got)
	}
	if got := exchangeOnce(tb, at(7162), "Hello"); got != "" {
		t.Errorf("Hello to port 7162, whose only socket is bound to the bridge's port: %q, want no answer", got)
	}
	if _, c, err := sd.client().Health(); err != nil || c["pass_under_master"] < 2 {
		t.Errorf("pass_under_master %d (%v), want a pass for each request nobody's rules matched at 7160 and 7162", c["pass_under_master"], err)
	}
	if out, err := sd.cli(0, "attach", "--port", "7162/udp"); err == nil || !strings.Contains(out, "is refused") || !strings.Contains(out, "a port of hb0") {
		t.Errorf("santa attach --port 7162/udp: %v %q, want it refused saying the socket is bound to a port of hb0", err, out)
	}
}
