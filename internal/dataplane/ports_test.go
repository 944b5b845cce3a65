package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

// santa_ports holds a port while any rule set of its transport is bound to
// a socket on it: two rule sets on one port (IPv4 and IPv6) keep it until
// the last goes, and a TCP rule set does not open the UDP port.
func TestPortSets(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7710)
	c6, s6 := fixtureAddrs(e, true, 7710)
	v4, v6 := e.socket(s, false), e.socket(s6, false)
	e.bindRules(v4, reply("Hello", "COMSYS"))
	e.bindRules(v6, reply("Hello", "COMSYS"))
	srv := startTCPServer(t, e.tb, netip.AddrPortFrom(s.Addr(), 7711))
	if err := e.d.Bind(srv.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		set  int
		port uint16
		want bool
	}{{portsUDP, 7710, true}, {portsTCP, 7710, false}, {portsUDP, 7711, false}, {portsTCP, 7711, true},
		{portsTCPSampled, 7711, false}} {
		if got := portInSet(t, e.d, p.set, p.port); got != p.want {
			t.Errorf("set %d, port %d: %v, want %v", p.set, p.port, got, p.want)
		}
	}
	if err := e.d.Unbind(v4); err != nil {
		t.Fatal(err)
	}
	e.expect("IPv4 unbound, IPv6 bound", request(c, s, "Hello").build(t), xdpPass, nil, "pass_no_ruleset")
	req6 := request(c6, s6, "Hello")
	e.expect("IPv6 still answered", req6.build(t), xdpTx, req6.answer([]byte("COMSYS")).build(t), "answered")
	if err := e.d.Unbind(v6); err != nil {
		t.Fatal(err)
	}
	e.expect("both unbound", req6.build(t), xdpPass, nil, "pass_port_unbound")
	if portInSet(t, e.d, portsUDP, 7710) {
		t.Error("port 7710 still in the UDP set with no rule set on it")
	}
	if err := e.d.Bind(Socket{Cookie: v4, Protocol: unix.IPPROTO_UDP}, SampleOptions{}); err == nil {
		t.Error("a socket without a port was bound")
	}
}

// A socket-less connection outlives its listener's rule set: once the
// rule set is gone, XDP passes its next request without a lookup
// (pass_port_unbound), and TC, for which the port stays in the set of TCP
// ports that had a rule set, still hands the connection to the listener,
// which serves it with an intact stream. So does a successor that takes
// over from the pinned data plane as santad does (its stamp keys and that
// set of ports, the flows it carries over) after the rule set went: for a
// connection eBPF answered a request on, and for one it only shook hands
// with (no flow entry).
func TestSocketlessOutlivesRuleSet(t *testing.T) {
	for _, successor := range []bool{false, true} {
		t.Run(map[bool]string{false: "unbound", true: "successor"}[successor], func(t *testing.T) {
			tb := testbed.New(t)
			bpffs := mountBPFFS(t)
			cfg := Config{FlowsPin: filepath.Join(bpffs, "tcp_flows")}
			d, detach := loadAttachedUntil(t, tb, cfg)
			addr := netip.AddrPortFrom(tb.Server.IP4, 8083)
			srv := startTCPServer(t, tb, addr)
			if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
				t.Fatal(err)
			}
			hot, hotReply := httpGet("/hot", ""), httpReply("from eBPF", "")
			if _, err := d.AddRules(srv.cookie, []Rule{{Conditions: []Condition{cond(0, hot)}, Processors: []Processor{put(0, hotReply)},
				ReplyLen: len(hotReply), MinLen: len(hot), MaxLen: len(hot)}}); err != nil {
				t.Fatal(err)
			}
			answered := dialFromClient(t, tb, addr)
			r := bufio.NewReader(answered)
			io.WriteString(answered, hot)
			if got := readReply(t, answered, r); got != hotReply {
				t.Fatalf("from eBPF: %q, want %q", got, hotReply)
			}
			conns := map[string]net.Conn{"answered": answered}
			readers := map[string]*bufio.Reader{"answered": r}
			if successor {
				shaken := dialFromClient(t, tb, addr)
				conns["handshake only"], readers["handshake only"] = shaken, bufio.NewReader(shaken)
				gen := filepath.Join(bpffs, "gen")
				if err := d.Pin(gen); err != nil {
					t.Fatal(err)
				}
				prev, err := OpenPrevious(gen)
				if err != nil {
					t.Fatal(err)
				}
				detach()
				d.Close()
				d, _ = loadAttachedUntil(t, tb, cfg)
				_, carryErr := d.CarryFlows(prev)
				if err := errors.Join(d.AdoptSocketless(prev), carryErr, d.PublishFlows(), prev.Close(), Unpin(gen)); err != nil {
					t.Fatal(err)
				}
			} else if err := d.Unbind(srv.cookie); err != nil {
				t.Fatal(err)
			}
			for name, c := range conns {
				before := counterNames(t, d)
				io.WriteString(c, hot)
				if got, want := readReply(t, c, readers[name]), httpReply("kernel GET /hot HTTP/1.1", ""); got != want {
					t.Fatalf("%s, after the rule set went: %q, want %q", name, got, want)
				}
				after := counterNames(t, d)
				for _, counter := range []string{"pass_port_unbound", "tcp_handed_over"} {
					if after[counter] == before[counter] {
						t.Errorf("%s: %s did not move", name, counter)
					}
				}
			}
			if s := srv.Streams(); len(s) != len(conns) || s[0] != hot {
				t.Errorf("the listener's streams %q, want %d: %q", s, len(conns), hot)
			}
		})
	}
}

// loadAttachedUntil is loadAttached, with a function that detaches the
// data plane from the server veth before the test ends.
func loadAttachedUntil(t testing.TB, tb *testbed.Testbed, cfg Config) (*Dataplane, func()) {
	t.Helper()
	d, att := loadAttachment(t, tb, cfg)
	return d, func() { att.Close() }
}

// loadAttachment loads a data plane and attaches it to the server veth
// until the test ends.
func loadAttachment(t testing.TB, tb *testbed.Testbed, cfg Config) (*Dataplane, *Attachment) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces, XDP, TC")
	}
	d, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	var att *Attachment
	if err := tb.Server.Do(func() (err error) {
		att, err = d.Attach(tb.Server.Dev, AttachAuto)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { att.Close() })
	return d, att
}

// An sk_lookup program in the namespace may deliver a request to a socket
// bound to another port (as Cloudflare's tubular does): santa_ports cannot
// know, so with one attached every port's requests are looked up, and a
// steered request is answered by its socket's rules.
func TestSkLookupSteers(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7720) // what clients ask
	bound := netip.AddrPortFrom(s.Addr(), 7721)
	var fd int
	var cookie uint64
	if err := e.tb.Server.Do(func() (err error) {
		fd, cookie, err = bindUDP(bound)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	e.bindRules(e.known(udpSock(cookie, bound)), reply("Hello", "COMSYS"))
	req := request(c, s, "Hello")
	e.expect("no sk_lookup program", req.build(t), xdpPass, nil, "pass_port_unbound")

	steer := steerPort(t, e.tb, s.Port(), fd)
	e.expect("steered by sk_lookup", req.build(t), xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
	steer.Close()
	e.expect("sk_lookup program gone", req.build(t), xdpPass, nil, "pass_port_unbound")
}

// steerPort attaches an sk_lookup program to tb's server namespace that
// delivers every request to port to the socket fd, until closed.
func steerPort(t *testing.T, tb *testbed.Testbed, port uint16, fd int) link.Link {
	t.Helper()
	target, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.SockMap, KeySize: 4, ValueSize: 8, MaxEntries: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer target.Close()
	if err := target.Put(uint32(0), uint64(fd)); err != nil {
		t.Fatalf("put the socket in a sockmap: %v", err)
	}
	const localPort = 60 // offsetof(struct bpf_sk_lookup, local_port)
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Type: ebpf.SkLookup, AttachType: ebpf.AttachSkLookup, License: "GPL",
		Instructions: asm.Instructions{
			asm.Mov.Reg(asm.R6, asm.R1),
			asm.LoadMem(asm.R2, asm.R6, localPort, asm.Word),
			asm.JNE.Imm(asm.R2, int32(port), "pass"),
			asm.StoreImm(asm.RFP, -4, 0, asm.Word),
			asm.Mov.Reg(asm.R2, asm.RFP),
			asm.Add.Imm(asm.R2, -4),
			asm.LoadMapPtr(asm.R1, target.FD()),
			asm.FnMapLookupElem.Call(),
			asm.JEq.Imm(asm.R0, 0, "pass"),
			asm.Mov.Reg(asm.R7, asm.R0),
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Reg(asm.R2, asm.R7),
			asm.Mov.Imm(asm.R3, 0),
			asm.FnSkAssign.Call(),
			asm.Mov.Reg(asm.R1, asm.R7),
			asm.FnSkRelease.Call(),
			asm.Mov.Imm(asm.R0, 1).WithSymbol("pass"), // SK_PASS
			asm.Return(),
		},
	})
	if err != nil {
		t.Fatalf("load the sk_lookup program: %v", err)
	}
	defer prog.Close()
	ns, err := os.Open(filepath.Join(testbed.NetnsDir, tb.Server.NS))
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	l, err := link.AttachNetNs(int(ns.Fd()), prog)
	if err != nil {
		t.Fatalf("attach sk_lookup: %v", err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// BenchmarkPassOtherPorts measures what the rule processor costs the host's
// other traffic (docs/matching.md "Binding"), on ports without rule sets:
// a data segment of one of the kernel's own TCP connections (with the
// timestamps Linux sends), at XDP and at the TC hook, and a UDP datagram to
// a socket, at XDP; in BPF_PROG_RUN ns per packet.
func BenchmarkPassOtherPorts(b *testing.B) {
	tb := testbed.New(b)
	d := loadAttached(b, tb, Config{})
	tcpAddr := netip.AddrPortFrom(tb.Server.IP4, 8082)
	startTCPServer(b, tb, tcpAddr)
	conn := dialFromClient(b, tb, tcpAddr)
	client := netip.MustParseAddrPort(conn.LocalAddr().String())
	udpAddr := netip.AddrPortFrom(tb.Server.IP4, 443)
	var fd int
	if err := tb.Server.Do(func() (err error) {
		fd, _, err = bindUDP(udpAddr)
		return err
	}); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { unix.Close(fd) })
	nop := layers.TCPOption{OptionType: layers.TCPOptionKindNop}
	tcpData := tcpFrame(b, client, tcpAddr, &layers.TCP{ACK: true, PSH: true, Seq: 1000, Ack: 2000, Window: 500,
		Options: []layers.TCPOption{nop, nop, tsOption(777, 888)}}, httpGet("/x", ""))
	udp := request(netip.AddrPortFrom(tb.Client.IP4, 5555), udpAddr, strings.Repeat("q", 40)).build(b)
	for _, f := range []struct {
		name  string
		prog  *ebpf.Program
		frame []byte
		pass  uint32
	}{
		{"xdp-kernel-tcp-data", d.Program(), tcpData, xdpPass},
		{"tc-kernel-tcp-data", d.objs.SantaHandover, tcpData, 0}, // TC_ACT_OK
		{"xdp-udp", d.Program(), udp, xdpPass},
	} {
		b.Run(f.name, func(b *testing.B) {
			if err := tb.Server.Do(func() error {
				verdict, per, err := f.prog.Benchmark(f.frame, b.N, nil)
				if err == nil && verdict != f.pass {
					err = fmt.Errorf("verdict %d, want %d", verdict, f.pass)
				}
				b.ReportMetric(float64(per.Nanoseconds()), "ns/packet")
				return err
			}); err != nil {
				b.Fatal(err)
			}
		})
	}
}
