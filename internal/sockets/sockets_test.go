//go:build linux

package sockets

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

// helperEnv makes the test binary act as the target process: it opens the
// sockets described in the variable, prints their cookies as JSON and waits
// for its stdin to close.
const helperEnv = "SANTA_SOCKETS_TEST_HELPER"

func TestMain(m *testing.M) {
	if spec := os.Getenv(helperEnv); spec != "" {
		if err := helper(spec); err != nil {
			fmt.Fprintln(os.Stderr, "helper:", err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

type helperReport struct {
	Cookies map[string]uint64 // by label
}

// helper binds, in its namespace, with ip4/ip6/port taken from spec:
//
//	v4     UDP ip4:port            (also held through a second fd)
//	v6     UDP [ip6]:port
//	other  UDP ip4:port+1
//	conn   UDP, connected to peer4:port (ephemeral local port)
//	tcp4   TCP listener on ip4:port
//	tcp6   TCP listener on [ip6]:port
//	tcpcli TCP connection to tcp4 (ephemeral local port)
//	tcpacc its accepted end (local port: port)
//	tcpbnd TCP socket bound to ip4:port+2, not listening
//	mptcp  Go's default listener on ip4:port+3: MPTCP where the kernel has it
//	       (mptcp_proto reports its SO_PROTOCOL)
func helper(spec string) error {
	var ip4, ip6, peer4 string
	var port int
	if _, err := fmt.Sscanf(spec, "%s %s %s %d", &ip4, &ip6, &peer4, &port); err != nil {
		return fmt.Errorf("spec %q: %w", spec, err)
	}
	rep := helperReport{Cookies: map[string]uint64{}}
	var keep []any
	udp := func(label, addr string) error {
		c, err := net.ListenPacket("udp", addr)
		if err != nil {
			return err
		}
		keep = append(keep, c)
		return cookieOf(label, c.(*net.UDPConn), rep.Cookies)
	}
	if err := udp("v4", net.JoinHostPort(ip4, fmt.Sprint(port))); err != nil {
		return err
	}
	if err := udp("v6", net.JoinHostPort(ip6, fmt.Sprint(port))); err != nil {
		return err
	}
	if err := udp("other", net.JoinHostPort(ip4, fmt.Sprint(port+1))); err != nil {
		return err
	}
	// a second fd for the v4 socket
	f, err := keep[0].(*net.UDPConn).File()
	if err != nil {
		return err
	}
	keep = append(keep, f)
	cc, err := net.Dial("udp", net.JoinHostPort(peer4, fmt.Sprint(port)))
	if err != nil {
		return err
	}
	keep = append(keep, cc)
	if err := cookieOf("conn", cc.(*net.UDPConn), rep.Cookies); err != nil {
		return err
	}
	tcp := func(label, addr string) (net.Listener, error) {
		var lc net.ListenConfig
		lc.SetMultipathTCP(false) // Go listens with MPTCP by default
		l, err := lc.Listen(context.Background(), "tcp", addr)
		if err != nil {
			return nil, err
		}
		keep = append(keep, l)
		return l, cookieOf(label, l.(*net.TCPListener), rep.Cookies)
	}
	l, err := tcp("tcp4", net.JoinHostPort(ip4, fmt.Sprint(port)))
	if err != nil {
		return err
	}
	if _, err := tcp("tcp6", net.JoinHostPort(ip6, fmt.Sprint(port))); err != nil {
		return err
	}
	cli, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return err
	}
	acc, err := l.Accept() // the only accept: later connections wait in the queue
	if err != nil {
		return err
	}
	keep = append(keep, cli, acc)
	if err := cookieOf("tcpcli", cli.(*net.TCPConn), rep.Cookies); err != nil {
		return err
	}
	if err := cookieOf("tcpacc", acc.(*net.TCPConn), rep.Cookies); err != nil {
		return err
	}
	bnd, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	sa := &unix.SockaddrInet4{Port: port + 2, Addr: netip.MustParseAddr(ip4).As4()}
	if err := unix.Bind(bnd, sa); err != nil {
		return err
	}
	if rep.Cookies["tcpbnd"], err = unix.GetsockoptUint64(bnd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
		return err
	}
	mp, err := net.Listen("tcp", net.JoinHostPort(ip4, fmt.Sprint(port+3)))
	if err != nil {
		return err
	}
	keep = append(keep, mp)
	if err := cookieOf("mptcp", mp.(*net.TCPListener), rep.Cookies); err != nil {
		return err
	}
	if rc, err := mp.(*net.TCPListener).SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			p, _ := unix.GetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_PROTOCOL)
			rep.Cookies["mptcp_proto"] = uint64(p)
		})
	}
	if err := json.NewEncoder(os.Stdout).Encode(rep); err != nil {
		return err
	}
	_, _ = io.Copy(io.Discard, os.Stdin)
	_ = keep
	return nil
}

func cookieOf(label string, c syscall.Conn, into map[string]uint64) error {
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var cerr error
	if err := rc.Control(func(fd uintptr) {
		into[label], cerr = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
	}); err != nil {
		return err
	}
	return cerr
}

// startHelper runs the helper in the server namespace and returns its pid
// and the cookies it reported. It is stopped at the end of the test.
func startHelper(t *testing.T, tb *testbed.Testbed, port int) (int, map[string]uint64) {
	t.Helper()
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("ip", "netns", "exec", tb.Server.NS, exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("%s=%s %s %s %d", helperEnv, tb.Server.IP4, tb.Server.IP6, tb.Client.IP4, port))
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	_, stdout := testbed.StartPiped(t, cmd)
	type result struct {
		rep helperReport
		err error
	}
	ch := make(chan result, 1)
	go func() {
		var r result
		if !stdout.Scan() {
			r.err = fmt.Errorf("read helper report: %v", stdout.Err())
		} else {
			r.err = json.Unmarshal(stdout.Bytes(), &r.rep)
		}
		ch <- r
	}()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		// `ip netns exec` execs the command: the pid is the helper's.
		return cmd.Process.Pid, r.rep.Cookies
	case <-time.After(10 * time.Second):
		t.Fatal("helper did not report within 10s")
	}
	return 0, nil
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root (network namespaces, pidfd_getfd on another process)")
	}
}

func TestFindUDPSockets(t *testing.T) {
	requireRoot(t)
	tb := testbed.New(t)
	const port = 5300
	pid, cookies := startHelper(t, tb, port)
	v4 := netip.AddrPortFrom(tb.Server.IP4, port)
	v6 := netip.AddrPortFrom(tb.Server.IP6, port)
	other := netip.AddrPortFrom(tb.Server.IP4, port+1)

	check := func(name string, got []Socket, want map[netip.AddrPort]uint64) {
		t.Helper()
		gotm := map[netip.AddrPort]uint64{}
		for _, s := range got {
			if _, dup := gotm[s.Local]; dup {
				t.Errorf("%s: %v returned twice", name, s.Local)
			}
			gotm[s.Local] = s.Cookie
			if s.FD < 0 || s.Inode == 0 {
				t.Errorf("%s: %+v: bad fd or inode", name, s)
			}
		}
		if len(gotm) != len(want) {
			t.Errorf("%s: got %v, want %v", name, gotm, want)
		}
		for a, c := range want {
			if gotm[a] != c {
				t.Errorf("%s: %v: cookie %#x, want %#x (all: %v)", name, a, gotm[a], c, gotm)
			}
		}
	}

	got, err := FindUDPSockets(pid, port)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseAll(got)
	check("port", got, map[netip.AddrPort]uint64{v4: cookies["v4"], v6: cookies["v6"]})
	if !slices.IsSortedFunc(got, func(a, b Socket) int { return a.Local.Compare(b.Local) }) {
		t.Errorf("not sorted by address: %+v", got)
	}

	all, err := FindUDPSockets(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseAll(all)
	check("any port", all, map[netip.AddrPort]uint64{v4: cookies["v4"], v6: cookies["v6"], other: cookies["other"]})
	for _, s := range all {
		if s.Cookie == cookies["conn"] {
			t.Errorf("connected socket %v reported", s.Local)
		}
	}

	none, err := FindUDPSockets(pid, port+2)
	if err != nil || len(none) != 0 {
		t.Errorf("unused port: %v, %v; want none and no error", none, err)
	}

	// The duplicate is the helper's socket itself: a datagram sent to its
	// address can be read from our fd.
	for _, s := range got {
		if s.Local != v4 {
			continue
		}
		c, err := tb.DialUDP(v4)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("through the duplicate")); err != nil {
			t.Fatal(err)
		}
		fds := []unix.PollFd{{Fd: int32(s.FD), Events: unix.POLLIN}}
		if n, err := unix.Poll(fds, 2000); err != nil || n != 1 {
			t.Fatalf("poll on duplicated fd: n=%d err=%v", n, err)
		}
		buf := make([]byte, 64)
		n, _, err := unix.Recvfrom(s.FD, buf, unix.MSG_DONTWAIT)
		if err != nil || string(buf[:n]) != "through the duplicate" {
			t.Errorf("read from duplicated fd: %q, %v", buf[:n], err)
		}
	}

	if _, err := FindUDPSockets(0, 53); err == nil {
		t.Error("pid 0: no error")
	}
	if _, err := FindUDPSockets(1<<30, 53); err == nil {
		t.Error("pid that does not exist: no error")
	}
}

func TestFindTCPListeners(t *testing.T) {
	requireRoot(t)
	tb := testbed.New(t)
	const port = 5310
	pid, cookies := startHelper(t, tb, port)
	v4 := netip.AddrPortFrom(tb.Server.IP4, port)
	v6 := netip.AddrPortFrom(tb.Server.IP6, port)
	want := map[netip.AddrPort]uint64{v4: cookies["tcp4"], v6: cookies["tcp6"]}

	for _, p := range []uint16{port, 0} {
		got, err := FindTCPListeners(pid, p)
		if err != nil {
			t.Fatal(err)
		}
		defer CloseAll(got)
		gotm := map[netip.AddrPort]uint64{}
		for _, s := range got {
			if _, dup := gotm[s.Local]; dup {
				t.Errorf("port %d: %v returned twice", p, s.Local)
			}
			gotm[s.Local] = s.Cookie
			if n, err := unix.GetsockoptInt(s.FD, unix.SOL_SOCKET, unix.SO_ACCEPTCONN); err != nil || n != 1 {
				t.Errorf("port %d: %v: SO_ACCEPTCONN %d, %v: not a listener", p, s.Local, n, err)
			}
		}
		if !reflect.DeepEqual(gotm, want) {
			t.Errorf("port %d: got %v, want %v (tcp connection ends %#x %#x, bound %#x)",
				p, gotm, want, cookies["tcpcli"], cookies["tcpacc"], cookies["tcpbnd"])
		}
		if !slices.IsSortedFunc(got, func(a, b Socket) int { return a.Local.Compare(b.Local) }) {
			t.Errorf("not sorted by address: %+v", got)
		}
		if p != port {
			continue
		}
		// The duplicate is the helper's listener itself (which accepts no
		// more): a connection from the client namespace is accepted through it.
		for _, s := range got {
			if s.Local != v4 {
				continue
			}
			var c net.Conn
			if err := tb.Client.Do(func() (err error) {
				c, err = net.DialTimeout("tcp", v4.String(), 2*time.Second)
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			fds := []unix.PollFd{{Fd: int32(s.FD), Events: unix.POLLIN}}
			if n, err := unix.Poll(fds, 2000); err != nil || n != 1 {
				t.Fatalf("poll on duplicated listener: n=%d err=%v", n, err)
			}
			nfd, _, err := unix.Accept4(s.FD, unix.SOCK_CLOEXEC|unix.SOCK_NONBLOCK)
			if err != nil {
				t.Fatalf("accept on duplicated listener: %v", err)
			}
			unix.Close(nfd)
		}
	}

	// bound but not listening, and UDP sockets on the port: none
	if none, err := FindTCPListeners(pid, port+2); err != nil || len(none) != 0 {
		t.Errorf("bound, not listening: %v, %v; want none and no error", none, err)
	}
	if none, err := FindTCPListeners(pid, port+1); err != nil || len(none) != 0 {
		t.Errorf("UDP only: %v, %v; want none and no error", none, err)
	}
	// an MPTCP listener is no TCP socket santad can bind: its fd is not the
	// TCP socket the kernel looks up
	mp, err := FindTCPListeners(pid, port+3)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseAll(mp)
	if cookies["mptcp_proto"] == unix.IPPROTO_MPTCP && len(mp) != 0 {
		t.Errorf("MPTCP listener reported: %+v", mp)
	} else if cookies["mptcp_proto"] == unix.IPPROTO_TCP && (len(mp) != 1 || mp[0].Cookie != cookies["mptcp"]) {
		t.Errorf("no MPTCP in this kernel: the plain TCP listener should be found: %+v", mp)
	}
	udp, err := FindUDPSockets(pid, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer CloseAll(udp)
	for _, s := range udp {
		for _, l := range []string{"tcp4", "tcp6", "tcpcli", "tcpacc", "tcpbnd"} {
			if s.Cookie == cookies[l] {
				t.Errorf("FindUDPSockets reports TCP socket %s (%v)", l, s.Local)
			}
		}
	}
	if _, err := FindTCPListeners(0, 80); err == nil {
		t.Error("pid 0: no error")
	}
	if _, err := FindTCPListeners(1<<30, 80); err == nil {
		t.Error("pid that does not exist: no error")
	}
}

func TestParseProcAddr(t *testing.T) {
	// The kernel prints each 32-bit address word as a host-order number.
	proc := func(a netip.Addr, port uint16) string {
		b := a.AsSlice()
		var s strings.Builder
		for i := 0; i < len(b); i += 4 {
			fmt.Fprintf(&s, "%08X", binary.NativeEndian.Uint32(b[i:]))
		}
		return fmt.Sprintf("%s:%04X", s.String(), port)
	}
	for _, want := range []netip.AddrPort{
		netip.MustParseAddrPort("127.0.0.1:53"),
		netip.MustParseAddrPort("198.18.7.1:65535"),
		netip.MustParseAddrPort("0.0.0.0:0"),
		netip.MustParseAddrPort("[2001:2:0:7::1]:53"),
		netip.MustParseAddrPort("[::]:5353"),
	} {
		got, err := parseProcAddr(proc(want.Addr(), want.Port()))
		if err != nil || got != want {
			t.Errorf("%s: got %v, %v", proc(want.Addr(), want.Port()), got, err)
		}
	}
	if binary.NativeEndian.Uint16([]byte{1, 0}) == 1 { // little endian: literal lines
		e, err := parseProcLine("  795: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 123456 2 0000000000000000 0")
		if err != nil || e.local != netip.MustParseAddrPort("127.0.0.1:53") || e.inode != 123456 || e.remote.Port() != 0 || e.state != 7 {
			t.Errorf("parse udp line: %+v, %v", e, err)
		}
		e, err = parseProcLine("   0: 00000000:0050 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0")
		if err != nil || e.local != netip.MustParseAddrPort("0.0.0.0:80") || e.inode != 4242 || e.state != tcpListen {
			t.Errorf("parse tcp line: %+v, %v", e, err)
		}
	}
	if _, err := parseProcLine("   0: 00000000:0050 00000000:0000 XY 00000000:00000000 00:00000000 00000000     0        0 4242"); err == nil {
		t.Error("bad state: no error")
	}
	for _, bad := range []string{"", "0100007F", "0100007F:", "XX00007F:0035", "01007F:0035", "0100007F:10000"} {
		if _, err := parseProcAddr(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}
