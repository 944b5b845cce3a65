//go:build linux

package testbed

import (
	"bytes"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

func TestTestbedUDPEcho(t *testing.T) {
	tb := New(t)

	if tb.Server.Ifindex == 0 || tb.Client.Ifindex == 0 {
		t.Fatalf("ifindex not set: %+v %+v", tb.Server, tb.Client)
	}
	xi, err := tb.ClientXDP()
	if err != nil {
		t.Fatal(err)
	}
	if xi.DrvID == 0 {
		t.Fatalf("client veth has no native XDP program: %+v", xi)
	}
	if si, err := tb.ServerXDP(); err != nil || si.ID() != 0 {
		t.Fatalf("server veth should have no XDP program: %+v %v", si, err)
	}

	for _, srv := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
		addr := netip.AddrPortFrom(srv, 7007)
		ln, err := tb.Server.ListenUDP(addr)
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			buf := make([]byte, 2048)
			for {
				n, from, err := ln.ReadFromUDPAddrPort(buf)
				if err != nil {
					return
				}
				ln.WriteToUDPAddrPort(buf[:n], from)
			}
		}()
		c, err := tb.DialUDP(addr)
		if err != nil {
			ln.Close()
			t.Fatal(err)
		}
		for i := 0; i < 10; i++ {
			msg := []byte("ping " + srv.String() + " " + string(rune('0'+i)))
			if _, err := c.Write(msg); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			buf := make([]byte, 2048)
			n, err := c.Read(buf)
			if err != nil {
				t.Fatalf("echo via %s: %v", srv, err)
			}
			if !bytes.Equal(buf[:n], msg) {
				t.Fatalf("echo via %s: got %q want %q", srv, buf[:n], msg)
			}
		}
		local := c.LocalAddr().(*net.UDPAddr).AddrPort().Addr()
		want := tb.Client.IP4
		if srv.Is6() {
			want = tb.Client.IP6
		}
		if local != want {
			t.Errorf("client source address %s, want %s", local, want)
		}
		c.Close()
		ln.Close()
	}

	// The host namespace must not see the testbed's interfaces.
	if _, err := net.InterfaceByName(tb.Server.Dev); err == nil {
		t.Errorf("%s visible in the host namespace", tb.Server.Dev)
	}
	// Neighbour entries are static: no ARP needed.
	out, err := tb.Server.Run("ip", "neigh", "show", "dev", tb.Server.Dev)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "PERMANENT") {
		t.Errorf("no permanent neighbour entries: %s", out)
	}
}

func TestTestbedCloseRemovesEverything(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: run the tests as root")
	}
	tb, err := Create(Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	nsd, err := tb.StartNSD(NSDOptions{})
	if err != nil {
		tb.Close()
		t.Fatal(err)
	}
	pid := nsd.PID()
	dir := nsd.Dir
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if err := tb.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for _, ns := range []string{tb.Server.NS, tb.Client.NS} {
		if nsExists(ns) {
			t.Errorf("namespace %s still exists", ns)
		}
	}
	if unix.Kill(pid, 0) == nil {
		t.Errorf("nsd %d still running", pid)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Errorf("nsd dir %s still exists", dir)
	}
	if th, _ := NAPIThreads(tb.Server.Dev); len(th) != 0 {
		t.Errorf("napi threads of %s left: %v", tb.Server.Dev, th)
	}
}

func TestNSD(t *testing.T) {
	tb := New(t)
	z := tb.ExampleZone(100)
	nsd, err := tb.StartNSD(NSDOptions{Zone: &z})
	if err != nil {
		t.Fatal(err)
	}

	// dig from the client namespace, both address families.
	for _, srv := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
		out, err := tb.Client.Run("dig", "+short", "+time=2", "+tries=2", "@"+srv.String(), "www."+ZoneOrigin, "A")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) != ExampleWWW4.String() {
			t.Errorf("dig @%s www A: %q, want %s", srv, out, ExampleWWW4)
		}
	}

	// miekg/dns through the helper.
	r, err := tb.Query(nsd.Addr6, "www."+ZoneOrigin, dns.TypeAAAA)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 || r.Answer[0].(*dns.AAAA).AAAA.String() != ExampleWWW6.String() {
		t.Errorf("www AAAA: %v", r.Answer)
	}
	r, err = tb.Query(nsd.Addr4, GenName(ZoneOrigin, 42), dns.TypeA)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.Answer) != 1 || r.Answer[0].(*dns.A).A.String() != GenAddr(42).String() {
		t.Errorf("h42 A: %v", r.Answer)
	}
	r, err = tb.Query(nsd.Addr4, "nonexistent."+ZoneOrigin, dns.TypeA)
	if err != nil {
		t.Fatal(err)
	}
	if r.Rcode != dns.RcodeNameError {
		t.Errorf("nonexistent: rcode %s", dns.RcodeToString[r.Rcode])
	}

	// Rate limiting is off: a burst of identical queries all get answers.
	c, err := tb.DialUDP(nsd.Addr4)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion("www."+ZoneOrigin, dns.TypeA)
	const burst = 500
	got := 0
	buf := make([]byte, 1500)
	for i := 0; i < burst; i++ {
		m.Id = uint16(i)
		b, _ := m.Pack()
		c.Write(b)
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err == nil {
			got++
		}
	}
	if got != burst {
		t.Errorf("%d of %d queries answered (rate limiting on?)", got, burst)
	}

	pids, err := nsd.PIDs()
	if err != nil || len(pids) < 2 {
		t.Errorf("nsd pids %v %v", pids, err)
	}
}

func TestPlacement(t *testing.T) {
	if n, _ := os.ReadDir("/sys/devices/system/cpu"); countCPUs(n) < 2 {
		t.Fatal("needs 2 CPUs (the measurement placement pins server and client apart)")
	}
	tb := New(t)
	if err := tb.Place(DefaultPlacement); err != nil {
		t.Fatal(err)
	}
	for _, x := range []struct {
		s   Side
		cpu int
	}{{tb.Server, 1}, {tb.Client, 0}} {
		th, err := NAPIThreads(x.s.Dev)
		if err != nil || len(th) == 0 {
			t.Fatalf("napi threads of %s: %v %v", x.s.Dev, th, err)
		}
		for _, pid := range th {
			var set unix.CPUSet
			if err := unix.SchedGetaffinity(pid, &set); err != nil {
				t.Fatal(err)
			}
			if set.Count() != 1 || !set.IsSet(x.cpu) {
				t.Errorf("napi thread %d of %s not pinned to cpu%d", pid, x.s.Dev, x.cpu)
			}
		}
	}
	out, err := tb.Client.Run("ethtool", "-k", tb.Client.Dev)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "tcp-segmentation-offload: off") {
		t.Errorf("TSO still on on client veth:\n%s", out)
	}

	// Traffic through the pinned NAPI threads: their run time grows.
	srvNAPI, _ := tb.ServerNAPIThreads()
	before, err := RunTimes(srvNAPI...)
	if err != nil {
		t.Fatal(err)
	}
	s0, err := ReadCPUStat()
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tb.Server.ListenUDP(netip.AddrPortFrom(tb.Server.IP4, 7008))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := tb.DialUDP(netip.AddrPortFrom(tb.Server.IP4, 7008))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// 2000 frames through the server's NAPI thread: batches of 50, each
	// sent once the thread has taken the last (the veth ring holds 256
	// frames; a busy CPU may still drop some, which are sent again).
	// RxPackets counts the frames the thread has taken off the ring.
	rx := func() uint64 {
		t.Helper()
		st, err := tb.Server.Stats()
		if err != nil {
			t.Fatal(err)
		}
		return st.RxPackets
	}
	base := rx()
	for deadline, want := time.Now().Add(20*time.Second), base; rx()-base < 2000; {
		if time.Now().After(deadline) {
			t.Fatalf("server veth rx %d packets in 20 s, want 2000", rx()-base)
		}
		for i := 0; i < 50; i++ {
			c.Write([]byte("x"))
		}
		want += 50
		for caught := time.Now().Add(2 * time.Second); rx() < want && time.Now().Before(caught); {
			time.Sleep(time.Millisecond)
		}
		want = min(want, rx()) // frames dropped: the next batch is waited for on its own
	}
	time.Sleep(100 * time.Millisecond)
	after, _ := RunTimes(srvNAPI...)
	s1, _ := ReadCPUStat()
	if after <= before {
		t.Errorf("server napi thread did not run (%v -> %v)", before, after)
	}
	u, err := s1.Usage(s0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if u.Wall <= 0 || u.Busy > u.Wall {
		t.Errorf("bad usage %+v", u)
	}
	st, err := tb.Server.Stats()
	if err != nil {
		t.Fatal(err)
	}
	if st.RxPackets < 2000 {
		t.Errorf("server veth rx %d packets, want >= 2000", st.RxPackets)
	}
}

func countCPUs(ents []os.DirEntry) int {
	n := 0
	for _, e := range ents {
		name := e.Name()
		if strings.HasPrefix(name, "cpu") && len(name) > 3 && name[3] >= '0' && name[3] <= '9' {
			n++
		}
	}
	return n
}

func TestDoRestoresNamespace(t *testing.T) {
	tb := New(t)
	self := func() string {
		s, _ := os.Readlink("/proc/thread-self/ns/net")
		return s
	}
	var inside string
	if err := tb.Server.Do(func() error { inside = self(); return nil }); err != nil {
		t.Fatal(err)
	}
	host, _ := os.Readlink("/proc/1/ns/net")
	if inside == host || inside == "" {
		t.Fatalf("Do did not switch namespace (%s)", inside)
	}
	for i := 0; i < 50; i++ { // any thread we land on is back in ours
		if s := self(); s == inside {
			t.Fatalf("thread left in the testbed namespace")
		}
	}
}
