package dataplane

import (
	"bytes"
	"encoding/hex"
	"net"
	"net/netip"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

// XDP verdicts.
const (
	xdpDrop = 1
	xdpPass = 2
	xdpTx   = 3
)

var (
	clientMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x02}
	serverMAC = net.HardwareAddr{0x02, 0, 0, 0, 0, 0x01}
)

// udpPacket describes a frame for a fixture; build turns it into bytes with
// correct checksums computed by gopacket, independently of the code under test.
type udpPacket struct {
	src, dst   netip.AddrPort
	srcMAC     net.HardwareAddr
	dstMAC     net.HardwareAddr
	tagged     bool // an 802.1Q tag of VLAN vlan (0: a priority tag)
	vlan       uint16
	payload    []byte
	reply      bool // header fields as the rule processor writes them
	ipv4Opts   bool // add an IPv4 option
	moreFrags  bool // IPv4 MF flag
	hopByHop   bool // IPv6 hop-by-hop extension header
	udpLenFix  int  // added to the UDP length field
	partialSum bool // checksum field in the partial form of a local sender
	badSum     bool // corrupt the UDP checksum
}

func (p udpPacket) build(t testing.TB) []byte {
	t.Helper()
	srcMAC, dstMAC := p.srcMAC, p.dstMAC
	if srcMAC == nil {
		srcMAC, dstMAC = clientMAC, serverMAC
		if p.reply {
			srcMAC, dstMAC = serverMAC, clientMAC
		}
	}
	var stack []gopacket.SerializableLayer
	eth := &layers.Ethernet{SrcMAC: srcMAC, DstMAC: dstMAC}
	stack = append(stack, eth)
	etherType := layers.EthernetTypeIPv4
	if p.src.Addr().Is6() {
		etherType = layers.EthernetTypeIPv6
	}
	if p.tagged {
		eth.EthernetType = layers.EthernetTypeDot1Q
		stack = append(stack, &layers.Dot1Q{VLANIdentifier: p.vlan, Type: etherType})
	} else {
		eth.EthernetType = etherType
	}
	udp := &layers.UDP{SrcPort: layers.UDPPort(p.src.Port()), DstPort: layers.UDPPort(p.dst.Port())}
	if p.src.Addr().Is4() {
		ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
			SrcIP: p.src.Addr().AsSlice(), DstIP: p.dst.Addr().AsSlice()}
		if p.reply {
			ip.Flags = layers.IPv4DontFragment
		} else {
			ip.Id, ip.TOS = 0x1234, 0x10
		}
		if p.moreFrags {
			ip.Flags |= layers.IPv4MoreFragments
		}
		if p.ipv4Opts {
			ip.Options = []layers.IPv4Option{{OptionType: 1}, {OptionType: 1}, {OptionType: 1}, {OptionType: 0}}
		}
		stack = append(stack, ip)
		udp.SetNetworkLayerForChecksum(ip)
	} else {
		ip := &layers.IPv6{Version: 6, HopLimit: 64, NextHeader: layers.IPProtocolUDP,
			SrcIP: p.src.Addr().AsSlice(), DstIP: p.dst.Addr().AsSlice()}
		if !p.reply {
			ip.TrafficClass, ip.FlowLabel = 0x10, 0x12345
		}
		if p.hopByHop {
			ip.HopByHop = &layers.IPv6HopByHop{}
			ip.HopByHop.Options = []*layers.IPv6HopByHopOption{{OptionType: 1, OptionLength: 4, OptionData: []byte{0, 0, 0, 0}}}
			ip.NextHeader = layers.IPProtocolIPv6HopByHop
		}
		stack = append(stack, ip)
		udp.SetNetworkLayerForChecksum(ip)
	}
	stack = append(stack, udp, gopacket.Payload(p.payload))
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, stack...); err != nil {
		t.Fatal(err)
	}
	b := buf.Bytes()
	// drop gopacket's padding to the 60-byte Ethernet minimum: the frame ends with the payload
	l4 := 14 + 20
	if p.tagged {
		l4 += 4
	}
	if p.src.Addr().Is6() {
		l4 += 20
		if p.hopByHop {
			l4 += 8
		}
	} else if p.ipv4Opts {
		l4 += 4
	}
	b = b[:l4+8+len(p.payload)]
	if p.udpLenFix != 0 {
		n := int(b[l4+4])<<8 | int(b[l4+5]) + p.udpLenFix
		b[l4+4], b[l4+5] = byte(n>>8), byte(n)
	}
	if p.partialSum {
		sum := pseudoSum(p.src.Addr(), p.dst.Addr(), len(p.payload)+8)
		b[l4+6], b[l4+7] = byte(sum>>8), byte(sum)
	}
	if p.badSum {
		b[l4+6] ^= 0x5a
	}
	return b
}

// pseudoSum is the folded (not inverted) pseudo-header sum a local sender
// leaves in the checksum field of a CHECKSUM_PARTIAL packet.
func pseudoSum(src, dst netip.Addr, l4len int) uint16 {
	var sum uint32
	for _, a := range [][]byte{src.AsSlice(), dst.AsSlice()} {
		for i := 0; i < len(a); i += 2 {
			sum += uint32(a[i])<<8 | uint32(a[i+1])
		}
	}
	sum += 17 + uint32(l4len)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return uint16(sum)
}

// env is a loaded rule processor and sockets in the server namespace of a testbed.
type env struct {
	t     testing.TB
	tb    *testbed.Testbed
	d     *Dataplane
	socks map[uint64]Socket // made by socket, by cookie
}

func newEnv(t testing.TB, cfg Config) *env {
	tb := testbed.New(t)
	d, err := Load(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	watchLoopbackAddresses(t, tb, d)
	return &env{t, tb, d, map[uint64]Socket{}}
}

// watchLoopbackAddresses keeps d's local addresses for the server
// namespace's loopback (ifindex 1), where BPF_PROG_RUN delivers: an answer
// needs its destination to be one.
func watchLoopbackAddresses(t testing.TB, tb *testbed.Testbed, d *Dataplane) {
	t.Helper()
	err := tb.Server.Do(func() error {
		stop, err := d.WatchLocalAddresses(1)
		if err == nil {
			t.Cleanup(stop)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
}

// socket binds a UDP socket in the server namespace and returns its cookie.
func (e *env) socket(addr netip.AddrPort, reuseport bool) uint64 {
	e.t.Helper()
	var cookie uint64
	err := e.tb.Server.Do(func() error {
		var opts []int
		if reuseport {
			opts = append(opts, unix.SO_REUSEPORT)
		}
		fd, c, err := bindUDP(addr, opts...)
		if err == nil {
			e.t.Cleanup(func() { unix.Close(fd) })
		}
		cookie = c
		return err
	})
	if err != nil {
		e.t.Fatalf("socket %v: %v", addr, err)
	}
	e.socks[cookie] = udpSock(cookie, addr)
	return cookie
}

// sock is the Socket of a socket made by socket.
func (e *env) sock(cookie uint64) Socket {
	e.t.Helper()
	s, ok := e.socks[cookie]
	if !ok {
		e.t.Fatalf("socket %#x was not made by env.socket", cookie)
	}
	return s
}

// portInSet reports whether santa_ports' set holds port.
func portInSet(t *testing.T, d *Dataplane, set int, port uint16) bool {
	t.Helper()
	var word uint64
	if err := d.objs.SantaPorts.Lookup(uint32(set*portWords+int(port)/64), &word); err != nil {
		t.Fatal(err)
	}
	return word&(1<<(port%64)) != 0
}

// known records a socket made elsewhere than by socket, for bindRules, and
// returns its cookie.
func (e *env) known(s Socket) uint64 {
	e.socks[s.Cookie] = s
	return s.Cookie
}

// udpSock is the Socket of the UDP socket with cookie, bound to addr.
func udpSock(cookie uint64, addr netip.AddrPort) Socket {
	return Socket{Cookie: cookie, Protocol: unix.IPPROTO_UDP, Port: addr.Port()}
}

// bindUDP binds a UDP socket in the calling thread's namespace, with the
// SOL_SOCKET options given switched on (SO_REUSEPORT, SO_REUSEADDR), and asks
// for its cookie (which also makes the kernel assign one). An unspecified
// IPv6 address binds dual stack.
func bindUDP(addr netip.AddrPort, sockopts ...int) (int, uint64, error) {
	family := unix.AF_INET
	if addr.Addr().Is6() {
		family = unix.AF_INET6
	}
	fd, err := unix.Socket(family, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, 0, err
	}
	for _, opt := range sockopts {
		if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, opt, 1); err != nil {
			unix.Close(fd)
			return -1, 0, err
		}
	}
	var sa unix.Sockaddr
	if addr.Addr().Is4() {
		sa = &unix.SockaddrInet4{Port: int(addr.Port()), Addr: addr.Addr().As4()}
	} else {
		sa = &unix.SockaddrInet6{Port: int(addr.Port()), Addr: addr.Addr().As16()}
	}
	if err := unix.Bind(fd, sa); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	cookie, err := unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, cookie, nil
}

// bindRules gives the socket a rule set with these rules.
func (e *env) bindRules(cookie uint64, rules ...Rule) []RuleID {
	e.t.Helper()
	if err := e.d.Bind(e.sock(cookie), SampleOptions{}); err != nil {
		e.t.Fatal(err)
	}
	if len(rules) == 0 {
		return nil
	}
	ids, err := e.d.AddRules(cookie, rules)
	if err != nil {
		e.t.Fatal(err)
	}
	return ids
}

// run passes frame through the rule processor in the server namespace.
func (e *env) run(frame []byte) (uint32, []byte) {
	e.t.Helper()
	var ret uint32
	var out []byte
	err := e.tb.Server.Do(func() error {
		opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+4096), Repeat: 1}
		var err error
		ret, err = e.d.Program().Run(&opts)
		out = opts.DataOut
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return ret, out
}

func (e *env) counters() map[string]uint64 {
	c, err := e.d.Counters()
	if err != nil {
		e.t.Fatal(err)
	}
	return CounterNames(c)
}

// expect runs frame and checks the verdict, the output frame and which counter moved.
func (e *env) expect(name string, frame []byte, verdict uint32, want []byte, counter string) {
	e.t.Helper()
	before := e.counters()
	got, out := e.run(frame)
	after := e.counters()
	if got != verdict {
		e.t.Errorf("%s: verdict %d, want %d", name, got, verdict)
	}
	if verdict == xdpPass && !bytes.Equal(out, frame) {
		e.t.Errorf("%s: passed frame was modified:\n got %s\nwant %s", name, hex.EncodeToString(out), hex.EncodeToString(frame))
	}
	if want != nil && !bytes.Equal(out, want) {
		e.t.Errorf("%s: output frame\n got %s\nwant %s", name, hex.EncodeToString(out), hex.EncodeToString(want))
	}
	if after[counter] != before[counter]+1 {
		e.t.Errorf("%s: counter %s went from %d to %d, want +1", name, counter, before[counter], after[counter])
	}
}
