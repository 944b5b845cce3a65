package dataplane

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

// tcpServer is a kernel TCP server in the server namespace: it answers
// every request (up to "\r\n\r\n") with "kernel <request line>" and records
// each accepted connection's byte stream.
type tcpServer struct {
	ln      net.Listener
	cookie  uint64
	port    uint16
	mu      sync.Mutex
	streams []*bytes.Buffer
}

func startTCPServer(t testing.TB, tb *testbed.Testbed, addr netip.AddrPort) *tcpServer {
	t.Helper()
	return startTCPServerOf(t, tb, addr, 0)
}

// nobody is the uid of another user's servers.
const nobody = 65534

// startTCPServerOf starts a tcpServer whose listener user uid owns (its
// sk_uid: the socket is made with that fsuid), as that user's server's
// would be.
func startTCPServerOf(t testing.TB, tb *testbed.Testbed, addr netip.AddrPort, uid int) *tcpServer {
	t.Helper()
	return startTCPServerOn(t, tb, addr, uid, "")
}

// startTCPServerOn is startTCPServerOf with the listener bound to interface
// device (SO_BINDTODEVICE) unless it is "".
func startTCPServerOn(t testing.TB, tb *testbed.Testbed, addr netip.AddrPort, uid int, device string) *tcpServer {
	t.Helper()
	srv, err := listenTCP(tb, addr, uid, device)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.ln.Close() })
	go srv.serve()
	return srv
}

// listenTCP makes startTCPServerOn's listener (with Go's SO_REUSEADDR).
func listenTCP(tb *testbed.Testbed, addr netip.AddrPort, uid int, device string) (*tcpServer, error) {
	srv := &tcpServer{port: addr.Port()}
	err := tb.Server.Do(func() error {
		// the calling thread's alone: Do locks it
		prev, err := unix.SetfsuidRetUid(uid)
		if err != nil {
			return err
		}
		defer unix.Setfsuid(prev)
		lc := net.ListenConfig{}
		if device != "" {
			lc.Control = func(_, _ string, c syscall.RawConn) error {
				var serr error
				err := c.Control(func(fd uintptr) { serr = unix.BindToDevice(int(fd), device) })
				return errors.Join(err, serr)
			}
		}
		lc.SetMultipathTCP(false) // the kernel's lookup finds plain TCP listeners
		ln, err := lc.Listen(context.Background(), "tcp", addr.String())
		if err != nil {
			return err
		}
		srv.ln = ln
		raw, err := ln.(*net.TCPListener).SyscallConn()
		if err != nil {
			return err
		}
		return errors.Join(raw.Control(func(fd uintptr) {
			srv.cookie, err = unix.GetsockoptUint64(int(fd), unix.SOL_SOCKET, unix.SO_COOKIE)
		}), err)
	})
	if err != nil && srv.ln != nil {
		srv.ln.Close()
	}
	return srv, err
}

func (s *tcpServer) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		stream := &bytes.Buffer{}
		s.mu.Lock()
		s.streams = append(s.streams, stream)
		s.mu.Unlock()
		go func() {
			defer c.Close()
			r := bufio.NewReader(io.TeeReader(c, &lockedWriter{&s.mu, stream}))
			for {
				line, err := r.ReadString('\n')
				if err != nil {
					return
				}
				for {
					h, err := r.ReadString('\n')
					if err != nil {
						return
					}
					if h == "\r\n" {
						break
					}
				}
				body := "kernel " + strings.TrimSpace(line)
				fmt.Fprintf(c, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
			}
		}()
	}
}

// sock is the listener's Socket, to bind.
func (s *tcpServer) sock() Socket {
	return Socket{Cookie: s.cookie, Protocol: unix.IPPROTO_TCP, Port: s.port}
}

// Streams returns the byte streams of the connections accepted so far.
func (s *tcpServer) Streams() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, b := range s.streams {
		out = append(out, b.String())
	}
	return out
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *bytes.Buffer
}

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func httpGet(path string, extra string) string {
	return "GET " + path + " HTTP/1.1\r\nHost: santa\r\n" + extra + "\r\n"
}

// exactRule answers exactly req (the whole payload) with reply, ending the
// connection if close.
func exactRule(req, reply string, close bool) Rule {
	return Rule{Conditions: []Condition{cond(0, req)}, Processors: []Processor{put(0, reply)},
		ReplyLen: len(reply), MinLen: len(req), MaxLen: len(req), Close: close}
}

func httpReply(body string, extra string) string {
	return fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n%s\r\n%s", len(body), extra, body)
}

// readReply reads one HTTP reply with a Content-Length from r.
func readReply(t *testing.T, c net.Conn, r *bufio.Reader) string {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var head strings.Builder
	n := 0
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("read reply: %v (so far %q)", err, head.String())
		}
		head.WriteString(line)
		if line == "\r\n" {
			break
		}
		fmt.Sscanf(line, "Content-Length: %d", &n)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		t.Fatalf("read body: %v", err)
	}
	return head.String() + string(body)
}

// echoRule answers "GET /echo?id=XXXX" with a reply of about 1100 bytes
// that copies the id and, masked, the low bits of its first byte: too long
// to grow a veth frame to, so TC sends it. echo gives, for an id, the
// request and the reply the rule makes for it.
func echoRule() (rule Rule, echo func(id string) (req, reply string)) {
	const prefix, suffix = "GET /echo?id=", " HTTP/1.1\r\nHost: santa\r\n\r\n"
	template := httpReply("id=____ nibble=X "+strings.Repeat("copied by TC ", 80), "")
	idAt, nibbleAt := strings.Index(template, "____"), strings.Index(template, "X ")
	reqLen := len(prefix) + 4 + len(suffix)
	rule = Rule{Conditions: []Condition{cond(0, prefix), cond(len(prefix)+4, suffix)},
		Processors: []Processor{put(0, template), Processor{Kind: Copy, ReplyOffset: idAt, SrcOffset: len(prefix), Length: 4},
			copyMasked(nibbleAt, len(prefix), "\x0f")},
		ReplyLen: len(template), MinLen: reqLen, MaxLen: reqLen}
	return rule, func(id string) (string, string) {
		reply := []byte(template)
		copy(reply[idAt:], id)
		reply[nibbleAt] = 'X'&0xf0 | id[0]&0x0f
		return prefix + id + suffix, string(reply)
	}
}

// dialFromClient connects from the client namespace.
func dialFromClient(t testing.TB, tb *testbed.Testbed, addr netip.AddrPort) net.Conn {
	t.Helper()
	var c net.Conn
	err := tb.Client.Do(func() error {
		// TestTCPSocketlessLoss loses 15 % each way: a handshake fails
		// 28 % of the time and is retried every second (linear timeouts),
		// so 5 s failed one run in about 15; 30 s is 0.28^30
		d := net.Dialer{Timeout: 30 * time.Second}
		d.SetMultipathTCP(false)
		var err error
		c, err = d.Dial("tcp", addr.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// loadAttached loads the rule processor (sized by cfg) and attaches it to tb's server veth
// (XDP and the TC hook), for as long as the test runs.
func loadAttached(t testing.TB, tb *testbed.Testbed, cfg Config) *Dataplane {
	t.Helper()
	d, _ := loadAttachedUntil(t, tb, cfg)
	return d
}

// TestTCPSocketless runs real kernel TCP clients against a listener with
// rules: eBPF answers the handshake and matching requests, a request that
// matches no rule hands the connection to the kernel, which then serves it
// with an intact byte stream; a rule with Close ends the connection. It
// runs again with the server veth's checksum offload off, where the kernel
// completes the checksums of the segments TC sends (checksumOffloadOff).
func TestTCPSocketless(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	for _, c := range familiesWithChecksumOffloadOff(tb) {
		ip := c.ip
		if c.offloadOff {
			checksumOffloadOff(t, tb)
		}
		t.Run(c.name, func(t *testing.T) {
			addr := netip.AddrPortFrom(ip, 8080)
			srv := startTCPServer(t, tb, addr)
			if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
				t.Fatal(err)
			}
			hot, bye := httpGet("/hot", ""), httpGet("/bye", "Connection: close\r\n")
			// one segment: sent by XDP, or by TC when the frame has no room for it
			hotReply, byeReply := httpReply(strings.Repeat("from eBPF ", 100), ""), httpReply("bye from eBPF", "Connection: close\r\n")
			big, bigClose := httpGet("/big", ""), httpGet("/big", "Connection: close\r\n")
			bigBody := strings.Repeat("0123456789abcdef", 1000)[:10000] // 7 segments
			bigReply, bigCloseReply := httpReply(bigBody, ""), httpReply(bigBody[:3000], "Connection: close\r\n")
			echo, echoed := echoRule() // one segment with copies, sent by TC
			rules := []Rule{
				exactRule(big, bigReply, false),
				exactRule(bigClose, bigCloseReply, true),
				exactRule(hot, hotReply, false),
				exactRule(bye, byeReply, true),
				echo,
			}
			if _, err := d.AddRules(srv.cookie, rules); err != nil {
				t.Fatal(err)
			}
			before := counterNames(t, d)
			mss := 1460 - 12 // timestamps on every segment
			if ip.Is6() {
				mss = 1440 - 12
			}
			segments := func(reply string) int { return (len(reply) + mss - 1) / mss }

			// keep-alive: three answers from eBPF, then a miss hands over
			c := dialFromClient(t, tb, addr)
			r := bufio.NewReader(c)
			for i := 0; i < 3; i++ {
				io.WriteString(c, hot)
				if got := readReply(t, c, r); got != hotReply {
					t.Fatalf("reply %d: %q, want %q", i, got, hotReply)
				}
				io.WriteString(c, big) // ten segments, sent by TC
				if got := readReply(t, c, r); got != bigReply {
					t.Fatalf("long reply %d: %d bytes, want %d", i, len(got), len(bigReply))
				}
				req, want := echoed(fmt.Sprintf("%c%03d", 'a'+i*7, i))
				io.WriteString(c, req)
				if got := readReply(t, c, r); got != want {
					t.Fatalf("reply with copies %d: %.40q, want %.40q", i, got, want)
				}
			}
			cold := httpGet("/cold", "")
			flows := flowCount(t, d)
			io.WriteString(c, cold)
			if got, want := readReply(t, c, r), httpReply("kernel GET /cold HTTP/1.1", ""); got != want {
				t.Fatalf("after handover: %q, want %q", got, want)
			}
			if n := flowCount(t, d); n != flows-1 { // not left to the sweep
				t.Errorf("%d flows after the handover, want %d: the connection's flow stays", n, flows-1)
			}
			io.WriteString(c, hot) // the kernel owns the connection now
			if got, want := readReply(t, c, r), httpReply("kernel GET /hot HTTP/1.1", ""); got != want {
				t.Fatalf("hot request after handover: %q, want %q", got, want)
			}
			if s := srv.Streams(); len(s) != 1 || s[0] != cold+hot {
				t.Fatalf("server streams %q, want one: %q", s, cold+hot)
			}

			// Connection: close, answered by eBPF
			c2 := dialFromClient(t, tb, addr)
			r2 := bufio.NewReader(c2)
			io.WriteString(c2, hot)
			if got := readReply(t, c2, r2); got != hotReply {
				t.Fatalf("second connection: %q", got)
			}
			io.WriteString(c2, bye)
			if got := readReply(t, c2, r2); got != byeReply {
				t.Fatalf("close reply: %q", got)
			}
			c2.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := r2.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("after the close reply: read %d, %v; want EOF", n, err)
			}
			c2.Close()

			// a long reply that ends the connection
			c3 := dialFromClient(t, tb, addr)
			r3 := bufio.NewReader(c3)
			io.WriteString(c3, bigClose)
			if got := readReply(t, c3, r3); got != bigCloseReply {
				t.Fatalf("long close reply: %d bytes, want %d", len(got), len(bigCloseReply))
			}
			c2, r2 = c3, r3
			c2.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := r2.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("after the close reply: read %d, %v; want EOF", n, err)
			}
			c2.Close()

			// the client's FIN after eBPF's: the kernel's socket leaves FIN_WAIT
			time.Sleep(200 * time.Millisecond)
			after := counterNames(t, d)
			for name, want := range map[string]uint64{
				"tcp_syn_answered": 3, "answered": 12, "tcp_handed_over": 1, "tcp_fin_answered": 2, "pass_no_room": 0,
				"tcp_long_reply":    4,
				"tcp_segments_sent": uint64(3*segments(bigReply)+segments(bigCloseReply)) + after["tcp_xdp_no_room"] - before["tcp_xdp_no_room"],
				"tcp_emit_failed":   0,
			} {
				if got := after[name] - before[name]; got != want {
					t.Errorf("%s: +%d, want +%d (counters %v)", name, got, want, after)
				}
			}
			if got := after["tcp_handover_failed"] - before["tcp_handover_failed"]; got != 0 {
				t.Errorf("tcp_handover_failed +%d", got)
			}
			if got := after["tcp_xdp_no_room"] - before["tcp_xdp_no_room"]; got < 3 {
				t.Errorf("tcp_xdp_no_room +%d, want at least the 3 replies with copies", got)
			}
			if len(srv.Streams()) != 1 {
				t.Errorf("the kernel accepted %d connections, want 1", len(srv.Streams()))
			}
			if err := d.Unbind(srv.cookie); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// TestTCPSocketlessSmallMTU: behind a server interface with a 1400-byte MTU
// (the client's is 1500), the client learns the MSS that MTU allows from
// eBPF's SYN-ACK, and a long reply arrives whole in segments of 1220 bytes
// (1208 of payload besides the timestamps), the largest stamped size below it.
func TestTCPSocketlessSmallMTU(t *testing.T) {
	tb := testbed.New(t)
	if out, err := tb.Server.Run("ip", "link", "set", tb.Server.Dev, "mtu", "1400"); err != nil {
		t.Fatalf("lower the server MTU: %v: %s", err, out)
	}
	d := loadAttached(t, tb, Config{})
	addr := netip.AddrPortFrom(tb.Server.IP4, 8080)
	srv := startTCPServer(t, tb, addr)
	big := httpGet("/big", "")
	bigReply := httpReply(strings.Repeat("0123456789abcdef", 600), "")
	if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddRules(srv.cookie, []Rule{exactRule(big, bigReply, false)}); err != nil {
		t.Fatal(err)
	}
	before := counterNames(t, d)
	c := dialFromClient(t, tb, addr)
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var mss int
	raw.Control(func(fd uintptr) { mss, err = unix.GetsockoptInt(int(fd), unix.IPPROTO_TCP, unix.TCP_MAXSEG) })
	if err != nil || mss != 1400-40-12 { // the announced MSS less the timestamp option
		t.Errorf("client's MSS %d (%v), want %d", mss, err, 1400-40-12)
	}
	io.WriteString(c, big)
	if got := readReply(t, c, bufio.NewReader(c)); got != bigReply {
		t.Fatalf("long reply: %d bytes, want %d", len(got), len(bigReply))
	}
	after := counterNames(t, d)
	want := uint64((len(bigReply) + 1207) / 1208)
	if got := after["tcp_segments_sent"] - before["tcp_segments_sent"]; got != want {
		t.Errorf("tcp_segments_sent +%d, want +%d (segments of 1208 bytes)", got, want)
	}
}

func counterNames(t *testing.T, d *Dataplane) map[string]uint64 {
	t.Helper()
	c, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return CounterNames(c)
}

// TestTCPSocketlessLoss runs the same exchanges over a link that loses and
// reorders frames both ways (XDP_TX replies included): every reply still
// arrives whole, through the clients' retransmissions and eBPF's resends.
func TestTCPSocketlessLoss(t *testing.T) {
	tb, link := testbed.NewImpaired(t, testbed.Options{}, testbed.ImpairOptions{Seed: 7})
	// short retransmission timeouts keep the test's duration bounded
	for _, side := range []testbed.Side{tb.Client, tb.Server} {
		if _, err := side.Run("sysctl", "-q", "-w", "net.ipv4.tcp_rto_min_us=10000",
			"net.ipv4.tcp_rto_max_ms=1000", "net.ipv4.tcp_syn_linear_timeouts=20"); err != nil {
			t.Fatal(err)
		}
	}
	d := loadAttached(t, tb, Config{})
	addr := netip.AddrPortFrom(tb.Server.IP4, 8080)
	srv := startTCPServer(t, tb, addr)
	if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	hot, big, bigClose := httpGet("/hot", ""), httpGet("/big", ""), httpGet("/big", "Connection: close\r\n")
	body := strings.Repeat("0123456789abcdef", 625)
	hotReply, bigReply, bigCloseReply := httpReply("from eBPF", ""), httpReply(body, ""),
		httpReply(body[:5000], "Connection: close\r\n")
	echo, echoed := echoRule() // a lost reply with copies: the client's retransmitted request rebuilds it
	if _, err := d.AddRules(srv.cookie, []Rule{exactRule(hot, hotReply, false), exactRule(big, bigReply, false),
		exactRule(bigClose, bigCloseReply, true), echo}); err != nil {
		t.Fatal(err)
	}
	if err := link.SetBoth(testbed.Impairment{Loss: 0.15, Reorder: 0.05, ReorderWait: time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	before := counterNames(t, d)
	const rounds = 20
	for i := 0; i < rounds; i++ {
		c := dialFromClient(t, tb, addr)
		r := bufio.NewReader(c)
		echoReq, echoReply := echoed(fmt.Sprintf("r%03d", i))
		for _, x := range []struct{ req, want string }{
			{hot, hotReply}, {big, bigReply}, {echoReq, echoReply}, {hot, hotReply},
			{httpGet("/cold", ""), httpReply("kernel GET /cold HTTP/1.1", "")},
			{big, httpReply("kernel GET /big HTTP/1.1", "")},
		} {
			io.WriteString(c, x.req)
			if got := readReply(t, c, r); got != x.want {
				t.Fatalf("round %d, %q: got %d bytes %.60q, want %d bytes (counters %v)", i, x.req, len(got), got, len(x.want), counterNames(t, d))
			}
		}
		c.Close()
		c2 := dialFromClient(t, tb, addr)
		r2 := bufio.NewReader(c2)
		io.WriteString(c2, bigClose)
		if got := readReply(t, c2, r2); got != bigCloseReply {
			t.Fatalf("round %d, close: got %d bytes, want %d", i, len(got), len(bigCloseReply))
		}
		c2.SetReadDeadline(time.Now().Add(10 * time.Second))
		if _, err := r2.Read(make([]byte, 1)); err != io.EOF {
			t.Fatalf("round %d: after the close reply: %v, want EOF", i, err)
		}
		c2.Close()
	}
	after := counterNames(t, d)
	lost := link.Counters(testbed.ToClient).Dropped + link.Counters(testbed.ToServer).Dropped
	t.Logf("frames lost: %d; eBPF resends %d, handovers %d, long replies %d, repeated acks for replies with copies %d", lost,
		after["tcp_resend"]-before["tcp_resend"], after["tcp_handed_over"]-before["tcp_handed_over"],
		after["tcp_long_reply"]-before["tcp_long_reply"], after["tcp_drop_resend_copies"]-before["tcp_drop_resend_copies"])
	if lost == 0 {
		t.Fatal("the link lost nothing: the test proves nothing")
	}
	if got := after["tcp_handed_over"] - before["tcp_handed_over"]; got < rounds {
		t.Errorf("%d handovers, want at least %d", got, rounds)
	}
	if s := srv.Streams(); len(s) != rounds {
		t.Errorf("the kernel accepted %d connections, want %d", len(s), rounds)
	}
	for i, s := range srv.Streams() {
		if want := httpGet("/cold", "") + big; s != want {
			t.Errorf("connection %d: the server read %q, want %q", i, s, want)
		}
	}
}

// answeringHot attaches a data plane to tb whose TCP listener at 8080 has
// one rule: reply answers exactly hot.
func answeringHot(t *testing.T, tb *testbed.Testbed) (d *Dataplane, addr netip.AddrPort, hot, reply string) {
	t.Helper()
	d = loadAttached(t, tb, Config{})
	addr = netip.AddrPortFrom(tb.Server.IP4, 8080)
	srv := startTCPServer(t, tb, addr)
	hot, reply = httpGet("/hot", ""), httpReply("from eBPF", "")
	if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddRules(srv.cookie, []Rule{exactRule(hot, reply, false)}); err != nil {
		t.Fatal(err)
	}
	return d, addr, hot, reply
}

// TestTCPKeepalive leaves a socket-less connection idle while the client's
// keepalive probes (every second, 2 unanswered ones kill it) run for 12 s,
// across a stamp unit (8.6 s): eBPF answers every one (the flow of the
// request it answered knows the client's next byte; an answer only after an
// idle unit let such a client drop the connection), the connection
// survives, and its next request is answered by eBPF.
func TestTCPKeepalive(t *testing.T) {
	tb := testbed.New(t)
	d, addr, hot, reply := answeringHot(t, tb)
	c := dialFromClient(t, tb, addr)
	tc := c.(*net.TCPConn)
	if err := tc.SetKeepAliveConfig(net.KeepAliveConfig{Enable: true, Idle: time.Second,
		Interval: time.Second, Count: 2}); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(c)
	io.WriteString(c, hot)
	if got := readReply(t, c, r); got != reply {
		t.Fatalf("first reply %q", got)
	}
	before := counterNames(t, d)
	time.Sleep(12 * time.Second) // longer than a stamp unit
	io.WriteString(c, hot)
	if got := readReply(t, c, r); got != reply {
		t.Fatalf("after 12 s idle: %q", got)
	}
	after := counterNames(t, d)
	if after["tcp_keepalive_answered"] < before["tcp_keepalive_answered"]+8 || after["answered"] != before["answered"]+1 ||
		after["tcp_handed_over"] != before["tcp_handed_over"] {
		t.Fatalf("keepalive answered +%d, answered +%d, handed over +%d; want a probe a second (at least 8), 1, 0",
			after["tcp_keepalive_answered"]-before["tcp_keepalive_answered"], after["answered"]-before["answered"],
			after["tcp_handed_over"]-before["tcp_handed_over"])
	}
}

// In every stamp epoch, the first (the first 37 minutes after boot)
// included, the current and the next epoch have keys: socket-less TCP works
// on a machine that has just booted. (e-1 wrapped around in epoch 0 and no
// key was written: every connection went to the kernel.)
func TestStampKeysEveryEpoch(t *testing.T) {
	e := newEnv(t, Config{})
	for _, epoch := range []uint64{0, 1, 5, 1 << 40} {
		if err := e.d.fillStampKeysAt(epoch); err != nil {
			t.Fatal(err)
		}
		for _, want := range []uint64{epoch, epoch + 1} {
			var k StampKey
			if err := e.d.objs.SantaTcpKeys.Lookup(uint32(want%stampKeySlots), &k); err != nil {
				t.Fatal(err)
			}
			if k.EpochPlus1 != want+1 || k.K0 == 0 && k.K1 == 0 {
				t.Errorf("in epoch %d: the slot of epoch %d holds epoch %d's key (%x %x); want its own", epoch, want, k.EpochPlus1-1, k.K0, k.K1)
			}
		}
	}
}

// TestCloseEndsTCPUpkeep checks that Close returns only once the stamp key
// rotation and the flow sweep have ended. (The goroutine once read its stop
// channel from the Dataplane, which Close sets to nil: one that was busy
// when Close came never stopped, and logged "bad file descriptor" every
// stamp unit for the rest of the process.)
func TestCloseEndsTCPUpkeep(t *testing.T) {
	for i := 0; i < 5; i++ {
		d, err := Load(Config{})
		if err != nil {
			t.Fatal(err)
		}
		if err := d.Close(); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 1<<20)
		if stacks := string(buf[:runtime.Stack(buf, true)]); strings.Contains(stacks, "startTCPUpkeep.func") {
			t.Fatalf("after Close, an upkeep goroutine still runs:\n%s", stacks)
		}
	}
}

// TestTCPSynOnAStaleFlow: a real client that opens a connection on the
// 4-tuple of a flow eBPF still keeps (one whose end it never saw) gets a
// challenge ACK for its SYN, answers it with a RST at the ACK's ack, which
// ends the flow, and its SYN sent again is answered: the connection is made
// and its request answered by eBPF.
func TestTCPSynOnAStaleFlow(t *testing.T) {
	tb := testbed.New(t)
	d, addr, hot, reply := answeringHot(t, tb)
	client := netip.AddrPortFrom(tb.Client.IP4, 40100)
	// the key as bpf_sock_tuple holds it: addresses and ports in network order
	var k santaBpfSockTuple
	ca, sa := client.Addr().As4(), addr.Addr().As4()
	k.Ipv4.Saddr, k.Ipv4.Daddr = binary.NativeEndian.Uint32(ca[:]), binary.NativeEndian.Uint32(sa[:])
	k.Ipv4.Sport = binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, client.Port()))
	k.Ipv4.Dport = binary.NativeEndian.Uint16(binary.BigEndian.AppendUint16(nil, addr.Port()))
	if err := d.objs.SantaTcpFlows.Put(&k, &santaSantaTcpFlow{ReqSeq: 100, ReqEnd: 200, ReplyStart: 300,
		ReplyEnd: 400, Seen: uint32(nowUnit(t))}); err != nil {
		t.Fatal(err)
	}
	before := counterNames(t, d)
	var c net.Conn
	err := tb.Client.Do(func() error {
		dialer := net.Dialer{Timeout: 10 * time.Second, LocalAddr: net.TCPAddrFromAddrPort(client)}
		dialer.SetMultipathTCP(false)
		var err error
		c, err = dialer.Dial("tcp", addr.String())
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	io.WriteString(c, hot)
	if got := readReply(t, c, bufio.NewReader(c)); got != reply {
		t.Fatalf("reply %q, want %q", got, reply)
	}
	after := counterNames(t, d)
	if after["tcp_syn_challenged"] != before["tcp_syn_challenged"]+1 || after["tcp_rst_consumed"] != before["tcp_rst_consumed"]+1 ||
		after["answered"] != before["answered"]+1 {
		t.Fatalf("SYN challenged +%d, RST consumed +%d, answered +%d; want 1 each",
			after["tcp_syn_challenged"]-before["tcp_syn_challenged"], after["tcp_rst_consumed"]-before["tcp_rst_consumed"],
			after["answered"]-before["answered"])
	}
}

// TestSocketlessConnectionOfAnotherUser: a socket-less connection proves
// itself only to a listener of the user whose listener answered it. Root's
// server answered a connection and closed its listener; uid nobody then
// listened on the port with a rule for the same request: eBPF answered the
// connection's next request with nobody's reply. Now that request is
// refused (tcp_pass_bad_stamp) and the kernel resets the connection, as it
// resets any ACK its listener gets. A listener of the same user that takes
// the port again keeps that user's connections.
func TestSocketlessConnectionOfAnotherUser(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	addr := netip.AddrPortFrom(tb.Server.IP4, 8080)
	hot := httpGet("/hot", "")
	serve := func(uid int, reply string) *tcpServer {
		srv := startTCPServerOf(t, tb, addr, uid)
		if err := d.Bind(srv.sock(), SampleOptions{Bytes: 64, PerSecond: 1000}); err != nil {
			t.Fatal(err)
		}
		if _, err := d.AddRules(srv.cookie, []Rule{exactRule(hot, reply, false)}); err != nil {
			t.Fatal(err)
		}
		return srv
	}
	leave := func(srv *tcpServer) {
		if err := d.Unbind(srv.cookie); err != nil {
			t.Fatal(err)
		}
		srv.ln.Close()
	}
	ask := func(c net.Conn, r *bufio.Reader, want string) {
		t.Helper()
		io.WriteString(c, hot)
		if got := readReply(t, c, r); got != want {
			t.Fatalf("reply %q, want %q", got, want)
		}
	}
	rootReply, nobodyReply := httpReply("root's", ""), httpReply("nobody's", "")
	root := serve(0, rootReply)
	rootConn := dialFromClient(t, tb, addr)
	rootR := bufio.NewReader(rootConn)
	ask(rootConn, rootR, rootReply)
	leave(root)

	other := serve(nobody, nobodyReply)
	before := counterNames(t, d)
	io.WriteString(rootConn, hot)
	rootConn.SetReadDeadline(time.Now().Add(5 * time.Second))
	if line, err := rootR.ReadString('\n'); !errors.Is(err, unix.ECONNRESET) {
		t.Errorf("root's connection, on nobody's listener: read %q, %v; want a reset", line, err)
	}
	after := counterNames(t, d)
	for _, c := range []string{"answered", "miss_sampled", "tcp_handed_over", "tcp_handover_failed"} {
		if after[c] != before[c] {
			t.Errorf("root's connection, on nobody's listener: %s +%d, want +0", c, after[c]-before[c])
		}
	}
	if after["tcp_pass_bad_stamp"] == before["tcp_pass_bad_stamp"] {
		t.Error("root's connection's request was not refused (tcp_pass_bad_stamp)")
	}

	// nobody's own connections are answered, and kept by its next listener
	nobodyConn := dialFromClient(t, tb, addr)
	nobodyR := bufio.NewReader(nobodyConn)
	ask(nobodyConn, nobodyR, nobodyReply)
	leave(other)
	again := httpReply("nobody's again", "")
	serve(nobody, again)
	ask(nobodyConn, nobodyR, again)
}

// TestIdleConnectionClosed: a keep-alive connection eBPF answered, idle for
// longer than Config.TCPIdleClose, is closed with eBPF's FIN, as a server's
// keep-alive timeout would: the client reads the end of the stream (before,
// nothing came, and a request after its stamps expired was reset), its
// close is answered from the FIN's stamp (the flow went with the FIN), and
// its socket ends (no LAST_ACK left). The FIN's stamp is of the listener's
// owner, kept with the flow: a listener of uid nobody's too.
func TestIdleConnectionClosed(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	hot, reply := httpGet("/hot", ""), httpReply("from eBPF", "")
	for _, c := range []struct {
		ip  netip.Addr
		uid int // the listener's owner, which the FIN's stamp covers
	}{{tb.Server.IP4, 0}, {tb.Server.IP6, 0}, {tb.Server.IP4, nobody}} {
		ip := c.ip
		t.Run(fmt.Sprintf("%s/uid%d", map[bool]string{true: "IPv4", false: "IPv6"}[ip.Is4()], c.uid), func(t *testing.T) {
			addr := netip.AddrPortFrom(ip, 8080)
			srv := startTCPServerOf(t, tb, addr, c.uid)
			if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
				t.Fatal(err)
			}
			if _, err := d.AddRules(srv.cookie, []Rule{exactRule(hot, reply, false)}); err != nil {
				t.Fatal(err)
			}
			c := dialFromClient(t, tb, addr)
			r := bufio.NewReader(c)
			io.WriteString(c, hot)
			if got := readReply(t, c, r); got != reply {
				t.Fatalf("reply %q, want %q", got, reply)
			}
			// the connection's flow, as if last answered TCPIdleClose ago
			unit, err := stampUnit()
			if err != nil {
				t.Fatal(err)
			}
			var k santaBpfSockTuple
			var f santaSantaTcpFlow
			it := d.objs.SantaTcpFlows.Iterate()
			if !it.Next(&k, &f) || f.Opts&flowOptsKnown == 0 {
				t.Fatalf("no flow with the connection's options after its answer: %v %+v", it.Err(), f)
			}
			f.Seen = uint32(unit) - d.idleCloseUnits() - 1
			if err := d.objs.SantaTcpFlows.Put(&k, &f); err != nil {
				t.Fatal(err)
			}
			before, closedBefore := counterNames(t, d), d.IdleClosed()
			if err := d.sweepFlows(unit); err != nil {
				t.Fatal(err)
			}
			if n := d.IdleClosed() - closedBefore; n != 1 {
				t.Errorf("IdleClosed +%d, want +1", n)
			}
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			if n, err := r.Read(make([]byte, 1)); err != io.EOF {
				t.Fatalf("idle connection: read %d bytes, %v; want the end of the stream", n, err)
			}
			if n := flowCount(t, d); n != 0 {
				t.Errorf("%d flows after the FIN, want 0", n)
			}
			c.Close()
			tb.Client.WaitClosesAnswered(t)
			after := counterNames(t, d)
			if n := after["tcp_pass_bad_stamp"] - before["tcp_pass_bad_stamp"]; n != 0 {
				t.Errorf("%d segments echoing the FIN's stamp were refused (tcp_pass_bad_stamp)", n)
			}
			if after["tcp_fin_answered"] == before["tcp_fin_answered"] {
				t.Error("the client's FIN was not answered by eBPF (tcp_fin_answered)")
			}
		})
	}
}

// idleSessionScript is a python-requests session that fetches its URL
// twice, the second time after a line on stdin: urllib3 reuses a pooled
// connection unless it sees it closed.
const idleSessionScript = `import sys, requests
s = requests.Session()
r = s.get(sys.argv[1], timeout=5)
print(r.status_code, r.text, flush=True)
sys.stdin.readline()
r = s.get(sys.argv[1], timeout=5)
print(r.status_code, r.text, flush=True)
`

// TestIdleSessionSurvives is the client of the report that led to
// Config.TCPIdleClose: a python-requests session whose pooled connection
// eBPF served and then closed as idle fetches again on a new connection,
// answered by eBPF, without an error (before, past the stamps' validity, a
// ConnectionError).
func TestIdleSessionSurvives(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	addr := netip.AddrPortFrom(tb.Server.IP4, 8080)
	srv := startTCPServer(t, tb, addr)
	if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	reply := httpReply("from eBPF", "")
	line := "GET /py HTTP/1.1\r\n" // python-requests' other header lines are its own
	if _, err := d.AddRules(srv.cookie, []Rule{{Conditions: []Condition{cond(0, line)},
		Processors: []Processor{put(0, reply)}, ReplyLen: len(reply)}}); err != nil {
		t.Fatal(err)
	}
	cmd := testbed.Command(context.Background(), tb.Client.NS, "/usr/bin/python3", "-c", idleSessionScript, "http://"+addr.String()+"/py")
	var stderr testbed.LockedBuffer
	cmd.Stderr = &stderr
	stdin, out := testbed.StartPiped(t, cmd)
	next := func(what string) string {
		t.Helper()
		if !out.Scan() {
			t.Fatalf("%s: the session printed nothing: %s", what, stderr.String())
		}
		return out.Text()
	}
	if got := next("first fetch"); got != "200 from eBPF" {
		t.Fatalf("first fetch: %q", got)
	}
	unit, err := stampUnit()
	if err != nil {
		t.Fatal(err)
	}
	var k santaBpfSockTuple
	var f santaSantaTcpFlow
	if it := d.objs.SantaTcpFlows.Iterate(); !it.Next(&k, &f) {
		t.Fatalf("no flow after the first fetch: %v", it.Err())
	}
	f.Seen = uint32(unit) - d.idleCloseUnits() - 1
	if err := d.objs.SantaTcpFlows.Put(&k, &f); err != nil {
		t.Fatal(err)
	}
	before := counterNames(t, d)
	if err := d.sweepFlows(unit); err != nil {
		t.Fatal(err)
	}
	// the FIN on its way; urllib3 looks at the pooled connection when it takes it
	deadline := time.Now().Add(5 * time.Second)
	for counterNames(t, d)["tcp_ack_consumed"] == before["tcp_ack_consumed"] {
		if time.Now().After(deadline) {
			t.Fatal("the client did not ack eBPF's FIN")
		}
		time.Sleep(10 * time.Millisecond)
	}
	io.WriteString(stdin, "\n")
	if got := next("fetch after the idle close"); got != "200 from eBPF" {
		t.Fatalf("fetch after the idle close: %q (%s)", got, stderr.String())
	}
	if after := counterNames(t, d); after["tcp_syn_answered"] != before["tcp_syn_answered"]+1 {
		t.Errorf("SYNs answered %d → %d: want the second fetch on a new connection", before["tcp_syn_answered"], after["tcp_syn_answered"])
	}
}

// familiesWithChecksumOffloadOff are the server's IPv4 and IPv6 addresses,
// each twice: as the testbed has it, then with checksumOffloadOff.
func familiesWithChecksumOffloadOff(tb *testbed.Testbed) []struct {
	name       string
	ip         netip.Addr
	offloadOff bool
} {
	return []struct {
		name       string
		ip         netip.Addr
		offloadOff bool
	}{
		{"IPv4", tb.Server.IP4, false}, {"IPv6", tb.Server.IP6, false},
		{"IPv4/checksum-offload-off", tb.Server.IP4, true}, {"IPv6/checksum-offload-off", tb.Server.IP6, true},
	}
}

// checksumOffloadOff turns the server veth's transmit checksum offload off.
// A request from the client's stack comes with CHECKSUM_PARTIAL and keeps it
// when TC rewrites it into a reply: with the offload on, the client's
// kernel takes such a reply unchecked; with it off, the server's kernel
// completes the checksum from what TC wrote in the field, and the client's
// kernel checks it (a wrong checksum: the reply is dropped, never delivered).
func checksumOffloadOff(t *testing.T, tb *testbed.Testbed) {
	t.Helper()
	if out, err := tb.Server.Run("ethtool", "-K", tb.Server.Dev, "tx", "off"); err != nil {
		t.Fatalf("ethtool -K %s tx off: %v: %s", tb.Server.Dev, err, out)
	}
}

// TestTCPHalfCloseUnderLoss: clients that close their side right after the
// request (nc -N, shutdown(SHUT_WR)) over a link that loses replies. Their
// FIN reaches eBPF before its reply reaches them; a FIN-ACK then, at the
// client's ack inside the reply, ended the stream before the reply when
// the reply was lost and acked the request: the client read nothing.
func TestTCPHalfCloseUnderLoss(t *testing.T) {
	tb, link := testbed.NewImpaired(t, testbed.Options{}, testbed.ImpairOptions{Seed: 11})
	// the client's FIN comes again after its retransmission timeout
	if _, err := tb.Client.Run("sysctl", "-q", "-w", "net.ipv4.tcp_rto_min_us=10000"); err != nil {
		t.Fatal(err)
	}
	d, addr, hot, reply := answeringHot(t, tb)
	if err := link.Set(testbed.ToClient, testbed.Impairment{Loss: 0.3}); err != nil {
		t.Fatal(err)
	}
	before := counterNames(t, d)
	for i := 0; i < 20; i++ {
		c := dialFromClient(t, tb, addr)
		io.WriteString(c, hot)
		if err := c.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		got, err := io.ReadAll(c)
		if err != nil || string(got) != reply {
			t.Fatalf("connection %d: read %q (%v), want the reply then EOF (counters %v)", i, got, err, counterNames(t, d))
		}
		c.Close()
	}
	if lost := link.Counters(testbed.ToClient).Dropped; lost == 0 {
		t.Fatal("the link lost nothing: the test proves nothing")
	}
	after := counterNames(t, d)
	t.Logf("FINs dropped during a reply: %d", after["tcp_drop_fin_in_reply"]-before["tcp_drop_fin_in_reply"])
}

// TestRuleSetGoneDuringAReply: a client holds part of a long reply (a
// program at its ingress drops the last segment) when the rule set goes.
// Its retransmitted request, which XDP now passes, must not be handed over:
// the kernel's socket, made at the client's ack, sent the application's
// reply after the part of eBPF's the client held, one stream of both. The
// client is reset instead.
func TestRuleSetGoneDuringAReply(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	addr := netip.AddrPortFrom(tb.Server.IP4, 8080)
	srv := startTCPServer(t, tb, addr)
	if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	long, reply := httpGet("/long", ""), httpReply(strings.Repeat("o", 3000), "")
	if _, err := d.AddRules(srv.cookie, []Rule{exactRule(long, reply, false)}); err != nil {
		t.Fatal(err)
	}
	// segments of 1448, 1448 and 145 bytes: drop IPv4 packets of 197
	drop, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: asm.Instructions{
		asm.LoadMem(asm.R2, asm.R1, 76, asm.Word), // skb->data
		asm.LoadMem(asm.R3, asm.R1, 80, asm.Word), // skb->data_end
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, 18),
		asm.JGT.Reg(asm.R4, asm.R3, "next"),
		asm.LoadMem(asm.R5, asm.R2, 16, asm.Half), // the IP total length
		asm.JNE.Imm(asm.R5, 0xc500, "next"),
		asm.Mov.Imm(asm.R0, 2), // TCX_DROP
		asm.Return(),
		asm.Mov.Imm(asm.R0, -1).WithSymbol("next"), // TCX_NEXT
		asm.Return(),
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer drop.Close()
	if err := tb.Client.Do(func() error {
		l, err := link.AttachTCX(link.TCXOptions{Interface: tb.Client.Ifindex, Program: drop, Attach: ebpf.AttachTCXIngress})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	c := dialFromClient(t, tb, addr)
	io.WriteString(c, long)
	time.Sleep(300 * time.Millisecond)
	if err := d.Unbind(srv.cookie); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	got, err := io.ReadAll(c)
	if !errors.Is(err, unix.ECONNRESET) || string(got) != reply[:2*1448] {
		t.Fatalf("read %d bytes (%q at the end), %v; want eBPF's first two segments and a reset",
			len(got), got[max(0, len(got)-60):], err)
	}
	if s := srv.Streams(); len(s) != 0 {
		t.Errorf("the listener accepted %q", s)
	}
}

// TestTCPListenerUnderBridge: the kernel looks a segment that came in on a
// bridge's port up on the bridge, where a listener bound to the port gets
// nothing and one bound to the bridge is there. Uid nobody's listener,
// bound to the server's interface before it became the port of bridge hb0
// (as santad allows only before), had its rules answer on the port: the
// handshake and requests that the kernel gives root's listener bound to
// hb0 on the same port. Now they go to the kernel (pass_under_master).
// Nobody's listener bound to no interface cannot sit beside root's, which
// is why the program looks for no such one (docs/matching.md "Binding").
func TestTCPListenerUnderBridge(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	addr := netip.AddrPortFrom(tb.Server.IP4, 8085)
	nobodys := startTCPServerOn(t, tb, addr, nobody, tb.Server.Dev)
	request, reply := httpGet("/", ""), httpReply("nobody's rule", "")
	if err := d.Bind(nobodys.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddRules(nobodys.cookie, []Rule{exactRule(request, reply, false)}); err != nil {
		t.Fatal(err)
	}
	get := func() string {
		t.Helper()
		c := dialFromClient(t, tb, addr)
		defer c.Close()
		io.WriteString(c, request)
		return readReply(t, c, bufio.NewReader(c))
	}
	if got := get(); got != reply {
		t.Fatalf("before the bridge: %q, want nobody's rule's answer", got)
	}
	for _, args := range [][]string{
		{"link", "add", "hb0", "address", tb.Server.MAC.String(), "type", "bridge"},
		{"link", "set", tb.Server.Dev, "master", "hb0"},
		{"addr", "flush", "dev", tb.Server.Dev},
		{"addr", "add", tb.Server.IP4.String() + "/24", "dev", "hb0"},
		{"link", "set", "hb0", "up"},
	} {
		if out, err := tb.Server.Run("ip", args...); err != nil {
			t.Fatal(err, out)
		}
	}
	if unbound, err := listenTCP(tb, netip.AddrPortFrom(netip.IPv4Unspecified(), 8086), nobody, ""); err != nil {
		t.Fatal(err)
	} else {
		defer unbound.ln.Close()
	}
	if roots, err := listenTCP(tb, netip.AddrPortFrom(netip.IPv4Unspecified(), 8086), 0, "hb0"); !errors.Is(err, unix.EADDRINUSE) {
		if err == nil {
			roots.ln.Close()
		}
		t.Fatalf("root's listener bound to hb0 beside nobody's bound to none: %v, want EADDRINUSE (the program does not look for such a one)", err)
	}
	startTCPServerOn(t, tb, netip.AddrPortFrom(netip.IPv4Unspecified(), 8085), 0, "hb0")
	before := counterNames(t, d)
	if got, want := get(), httpReply("kernel GET / HTTP/1.1", ""); got != want {
		t.Errorf("on the bridge's port: %q, want root's listener's answer %q", got, want)
	}
	if after := counterNames(t, d); after["pass_under_master"] == before["pass_under_master"] {
		t.Errorf("pass_under_master did not move: %v", after)
	}
}
