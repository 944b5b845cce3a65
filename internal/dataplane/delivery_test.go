package dataplane

import (
	"bytes"
	"encoding/hex"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The rule processor must answer only requests the kernel would deliver to
// the socket that owns the rules, and must never send a reply from (or to) an
// address that cannot be a unicast host address. bpf_sk_lookup_udp does no
// routing, so a socket bound to a wildcard address is "found" for any
// destination address; these cases are left to the rule processor.
// FuzzRuleProcessor found these (its oracle's classes bad-address, local-src,
// nonlocal-dst and ipv4-header-csum); this test pins them down.
func TestAnswersOnlyWhatTheKernelWouldDeliver(t *testing.T) {
	requireRoot(t)
	e := newEnv(t, Config{})
	const port = 7300
	// a dual-stack wildcard socket, as a DNS server typically binds
	e.bindRules(e.socket(netip.AddrPortFrom(netip.IPv6Unspecified(), port), false), reply("Hello", "COMSYS"))
	c4, s4 := fixtureAddrs(e, false, port)
	c6, s6 := fixtureAddrs(e, true, port)
	sub := s4.Addr().As4()
	sub[3] = 255
	other4 := s4.Addr().As4()
	other4[3] = 77
	other6 := s6.Addr().As16()
	other6[15] = 0x77

	// sanity: the normal request is answered
	for _, cs := range [][2]netip.AddrPort{{c4, s4}, {c6, s6}} {
		req := request(cs[0], cs[1], "Hello")
		e.expect("local "+cs[1].String(), req.build(t), xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
	}

	mustPass := func(t *testing.T, frame []byte) {
		t.Helper()
		got, out := e.run(frame)
		if got != xdpPass {
			t.Errorf("verdict %d, want XDP_PASS (%d); reply sent:\n%s", got, xdpPass, hex.EncodeToString(out))
		} else if !bytes.Equal(out, frame) {
			t.Errorf("passed frame was modified")
		}
	}
	addr := func(s string) netip.Addr { return netip.MustParseAddr(s) }

	// Destinations that are not a unicast address of this host. For a
	// non-local unicast address the kernel would forward or drop the packet
	// (ip_route_input: not RTN_LOCAL); for broadcast and multicast it would
	// deliver it, but the reply would carry a broadcast/multicast source
	// address. Either way the request must be passed.
	t.Run("nonlocal-dst", func(t *testing.T) {
		for _, dst := range []netip.Addr{
			netip.AddrFrom4(other4),  // another host on the link (router, bridge, promiscuous NIC)
			addr("192.0.2.53"),       // a host elsewhere: transit traffic on a router
			addr("255.255.255.255"),  // limited broadcast
			netip.AddrFrom4(sub),     // subnet broadcast
			addr("224.0.0.251"),      // multicast (mDNS) in a unicast frame
			addr("127.0.0.1"),        // loopback, on a real interface: martian destination
			netip.AddrFrom16(other6), // another IPv6 host
			addr("ff02::1"),          // IPv6 multicast in a unicast frame
			addr("::1"),              // IPv6 loopback on a real interface
		} {
			t.Run(dst.String(), func(t *testing.T) {
				src := c4
				if dst.Is6() {
					src = c6
				}
				mustPass(t, request(src, netip.AddrPortFrom(dst, port), "Hello").build(t))
			})
		}
	})

	// Sources the kernel drops as martians (ip_route_input_slow /
	// fib_validate_source, ipv6_rcv): a reply to them would go to a
	// broadcast, multicast or loopback address.
	t.Run("martian-src", func(t *testing.T) {
		for _, src := range []netip.Addr{
			addr("255.255.255.255"),
			netip.AddrFrom4(sub),
			addr("224.0.0.1"),
			addr("127.0.0.1"),
			addr("0.0.0.0"),
			addr("ff02::1"),
			addr("::1"),
			addr("::"),
			s4.Addr(), // this host's own addresses (santa_local_addrs, behind its filter)
			s6.Addr(),
		} {
			t.Run(src.String(), func(t *testing.T) {
				dst := s4
				if src.Is6() {
					dst = s6
				}
				mustPass(t, request(netip.AddrPortFrom(src, 40000), dst, "Hello").build(t))
			})
		}
	})

	// Each CPU keeps its recent answers of santa_local_addrs, valid while
	// its santa_gens word has not moved. A destination whose filter slot
	// another address keeps counted (a collision, made here by counting it
	// by hand) is looked up past the filter: once it becomes an address of
	// this host it must be answered, and once it no longer is, no cached
	// answer may say it still is. The thread is pinned to one CPU, so the
	// runs after each change meet the answer cached before it.
	t.Run("changed-address", func(t *testing.T) {
		x := netip.AddrFrom4(other4)
		key := santaSantaLocalAddr{Ifindex: 1, Family: 4} // BPF_PROG_RUN's loopback
		copy(key.Addr[:], x.AsSlice())
		if err := e.d.countLocalAddr(key, 1); err != nil {
			t.Fatal(err)
		}
		defer e.d.countLocalAddr(key, -1)
		frame := request(c4, netip.AddrPortFrom(x, port), "Hello").build(t)
		err := e.tb.Server.Do(func() error {
			var cpus, one unix.CPUSet
			if err := unix.SchedGetaffinity(0, &cpus); err != nil {
				return err
			}
			one.Set(0)
			if err := unix.SchedSetaffinity(0, &one); err != nil {
				return err
			}
			defer unix.SchedSetaffinity(0, &cpus)
			run := func() uint32 {
				opts := ebpf.RunOptions{Data: frame, DataOut: make([]byte, len(frame)+4096), Repeat: 1}
				ret, err := e.d.Program().Run(&opts)
				if err != nil {
					t.Fatal(err)
				}
				return ret
			}
			// the watcher applies a change within milliseconds
			waitFor := func(want uint32, what string) {
				deadline := time.Now().Add(5 * time.Second)
				for run() != want {
					if time.Now().After(deadline) {
						t.Fatalf("%s: verdict still not %d after 5 s", what, want)
					}
					time.Sleep(10 * time.Millisecond)
				}
			}
			link, err := netlink.LinkByName(e.tb.Server.Dev)
			if err != nil {
				return err
			}
			a := &netlink.Addr{IPNet: &net.IPNet{IP: x.AsSlice(), Mask: net.CIDRMask(32, 32)}}
			if run() != xdpPass {
				t.Errorf("%s answered before it was an address of this host", x)
			}
			if err := netlink.AddrAdd(link, a); err != nil {
				return err
			}
			waitFor(xdpTx, "address added")
			if err := netlink.AddrDel(link, a); err != nil {
				return err
			}
			waitFor(xdpPass, "address removed")
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	})

	// A socket bound to one address is found for that address whether or
	// not it is one of this host's (IP_FREEBIND, or an address removed since
	// the bind: a failover address moved to another host); the kernel
	// delivers nothing to it then.
	t.Run("specific-socket-address-removed", func(t *testing.T) {
		x := netip.AddrFrom4(other4)
		a := &netlink.Addr{IPNet: &net.IPNet{IP: x.AsSlice(), Mask: net.CIDRMask(32, 32)}}
		addrOp := func(op func(netlink.Link, *netlink.Addr) error) {
			t.Helper()
			if err := e.tb.Server.Do(func() error {
				link, err := netlink.LinkByName(e.tb.Server.Dev)
				if err != nil {
					return err
				}
				return op(link, a)
			}); err != nil {
				t.Fatal(err)
			}
		}
		addrOp(netlink.AddrAdd)
		bound := netip.AddrPortFrom(x, port+1)
		e.bindRules(e.socket(bound, false), reply("Hello", "BOUND"))
		req := request(c4, bound, "Hello")
		waitVerdict := func(want uint32, what string) {
			t.Helper()
			for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
				if got, _ := e.run(req.build(t)); got == want {
					return
				}
				if time.Now().After(deadline) {
					t.Fatalf("%s: verdict still not %d after 5 s", what, want)
				}
			}
		}
		waitVerdict(xdpTx, "bound to an address of this host")
		addrOp(netlink.AddrDel)
		waitVerdict(xdpPass, "its address removed")
		e.expect("bound to an address removed", req.build(t), xdpPass, nil, "pass_not_local")
	})

	// A unicast frame for another MAC (a promiscuous interface, a bridge
	// port, a switch flooding) is dropped by the kernel (PACKET_OTHERHOST).
	// BPF_PROG_RUN on the server veth, not the loopback, to have a MAC.
	t.Run("other-host-mac", func(t *testing.T) {
		var stop func()
		if err := e.tb.Server.Do(func() (err error) {
			stop, err = e.d.WatchLocalAddresses(e.tb.Server.Ifindex)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		defer stop()
		onVeth := func(dstMAC net.HardwareAddr) (uint32, []byte) {
			req := request(c4, s4, "Hello")
			req.srcMAC, req.dstMAC = e.tb.Client.MAC, dstMAC
			frame := req.build(t)
			var ret uint32
			out := make([]byte, len(frame)+4096)
			if err := e.tb.Server.Do(func() (err error) {
				opts := ebpf.RunOptions{Data: frame, DataOut: out, Repeat: 1,
					Context: xdpMd{DataEnd: uint32(len(frame)), IngressIfindex: uint32(e.tb.Server.Ifindex)}}
				ret, err = e.d.Program().Run(&opts)
				out = opts.DataOut
				return err
			}); err != nil {
				t.Fatal(err)
			}
			return ret, out
		}
		before := e.counters()
		if got, _ := onVeth(e.tb.Server.MAC); got != xdpTx {
			after := e.counters()
			for name, n := range after {
				if n != before[name] {
					t.Logf("%s +%d", name, n-before[name])
				}
			}
			t.Fatalf("to the veth's MAC %s: verdict %d, want XDP_TX", e.tb.Server.MAC, got)
		}
		before = e.counters()
		other := net.HardwareAddr{0x02, 0, 0, 0, 0xbb, 0xbb}
		if got, out := onVeth(other); got != xdpPass {
			t.Errorf("to another host's MAC %s: verdict %d, want XDP_PASS; sent:\n%s", other, got, hex.EncodeToString(out))
		}
		if n := e.counters()["pass_other_host"] - before["pass_other_host"]; n != 1 {
			t.Errorf("pass_other_host +%d, want +1", n)
		}
	})

	// A socket whose cookie was never asked for has no rule set: the
	// request is the socket's (pass_no_ruleset), not nobody's.
	t.Run("socket-without-cookie", func(t *testing.T) {
		const other = port + 2
		e.bindRules(e.socket(netip.AddrPortFrom(netip.IPv4Unspecified(), other), true), reply("Hello", "COMSYS"))
		var fd int
		if err := e.tb.Server.Do(func() (err error) {
			if fd, err = unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0); err != nil {
				return err
			}
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEPORT, 1); err != nil {
				return err
			}
			return unix.Bind(fd, &unix.SockaddrInet4{Port: other, Addr: s4.Addr().As4()}) // more specific than the wildcard
		}); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fd)
		e.expect("to a socket without a cookie", request(c4, netip.AddrPortFrom(s4.Addr(), other), "Hello").build(t),
			xdpPass, nil, "pass_no_ruleset")
	})

	// The kernel drops an IPv4 packet whose header checksum is wrong
	// (ip_rcv_core). With the UDP checksum absent (0, allowed over IPv4)
	// nothing else protects the addresses: a corrupted source address gets
	// the answer.
	t.Run("ipv4-header-csum", func(t *testing.T) {
		for _, udpSum := range []string{"valid", "absent"} {
			t.Run(udpSum, func(t *testing.T) {
				frame := request(c4, s4, "Hello").build(t)
				if udpSum == "absent" {
					frame[14+20+6], frame[14+20+7] = 0, 0
				}
				frame[14+8]-- // TTL 63: the header checksum no longer fits
				mustPass(t, frame)
			})
		}
	})
}

// xdpMd is struct xdp_md, BPF_PROG_RUN's context for XDP.
type xdpMd struct {
	Data, DataEnd, DataMeta, IngressIfindex, RxQueueIndex, EgressIfindex uint32
}
