//go:build linux

package testbed

import (
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/santa-offload/santa/internal/dnsnames"
	"golang.org/x/sys/unix"
)

// running reports the pids of ps that are still alive (zombies count as
// gone).
func running(ps []int) []int {
	var alive []int
	for _, p := range ps {
		if unix.Kill(p, 0) == nil && !isZombie(p) {
			alive = append(alive, p)
		}
	}
	return alive
}

// query asks s for name/qtype over the given family and returns the answer.
func query(t *testing.T, tb *Testbed, s DNSServer, v6 bool, name string, qtype uint16) *dns.Msg {
	t.Helper()
	a4, a6 := s.Addrs()
	a := a4
	if v6 {
		a = a6
	}
	r, err := tb.Query(a, name, qtype)
	if err != nil {
		t.Fatalf("%s: %s %s via %v: %v", s.Name(), name, dns.TypeToString[qtype], a, err)
	}
	return r
}

// onlyAddr returns the single A or AAAA of an answer section.
func onlyAddr(r *dns.Msg) (netip.Addr, error) {
	var got []netip.Addr
	for _, rr := range r.Answer {
		switch rr := rr.(type) {
		case *dns.A:
			a, _ := netip.AddrFromSlice(rr.A.To4())
			got = append(got, a)
		case *dns.AAAA:
			a, _ := netip.AddrFromSlice(rr.AAAA)
			got = append(got, a)
		}
	}
	if r.Rcode != dns.RcodeSuccess || len(got) != 1 {
		return netip.Addr{}, fmt.Errorf("rcode %s, addresses %v", dns.RcodeToString[r.Rcode], got)
	}
	return got[0], nil
}

// stopAndCheck stops s and checks that none of its processes and not its
// directory are left.
func stopAndCheck(t *testing.T, s DNSServer) {
	t.Helper()
	pids, err := s.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Stop(); err != nil {
		t.Errorf("%s stop: %v", s.Name(), err)
	}
	t.Logf("%s stopped in %v", s.Name(), time.Since(start).Round(time.Millisecond))
	if left := running(pids); len(left) > 0 {
		t.Errorf("%s: processes %v still running after Stop", s.Name(), left)
	}
	if _, err := os.Stat(s.Proc().Dir); err == nil {
		t.Errorf("%s: dir %s left", s.Name(), s.Proc().Dir)
	}
	if _, err := s.PIDs(); err == nil {
		t.Errorf("%s: PIDs after Stop is not an error", s.Name())
	}
	if err := s.Stop(); err != nil {
		t.Errorf("%s: second Stop: %v", s.Name(), err)
	}
}

// TestDNSServers starts each server kind with the example zone and with
// 10 k top-list names, checks their answers over IPv4 and IPv6 and that
// they stop cleanly.
func TestDNSServers(t *testing.T) {
	tb := New(t)
	names := dnsnames.TopListNames(10000, 1)
	for _, kind := range DNSServerKinds {
		t.Run(kind, func(t *testing.T) {
			start := time.Now()
			s, err := tb.StartDNSServer(kind, DNSServerOptions{})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s pid %d answers after %v", kind, s.PID(), time.Since(start).Round(time.Millisecond))
			if s.Name() != kind {
				t.Errorf("Name %q", s.Name())
			}
			if a4, a6 := s.Addrs(); a4 != netip.AddrPortFrom(tb.Server.IP4, 53) || a6 != netip.AddrPortFrom(tb.Server.IP6, 53) {
				t.Errorf("Addrs %v %v", a4, a6)
			}
			for _, v6 := range []bool{false, true} {
				if a, err := onlyAddr(query(t, tb, s, v6, "www."+ZoneOrigin, dns.TypeA)); err != nil || a != ExampleWWW4 {
					t.Errorf("www A (v6 %v): %v %v, want %v", v6, a, err, ExampleWWW4)
				}
				if a, err := onlyAddr(query(t, tb, s, v6, "www."+ZoneOrigin, dns.TypeAAAA)); err != nil || a != ExampleWWW6 {
					t.Errorf("www AAAA (v6 %v): %v %v, want %v", v6, a, err, ExampleWWW6)
				}
			}
			if r := query(t, tb, s, false, "nonexistent."+ZoneOrigin, dns.TypeA); r.Rcode != dns.RcodeNameError || !r.Authoritative {
				t.Errorf("nonexistent: rcode %s aa %v", dns.RcodeToString[r.Rcode], r.Authoritative)
			}
			// Authoritative only: no recursion for names outside the zone.
			if r := query(t, tb, s, false, "example.com.", dns.TypeA); r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
				t.Errorf("answer outside the zone: %v", r.Answer)
			}
			// Rate limiting is off: a burst of identical queries is answered.
			burst(t, tb, s, "www."+ZoneOrigin, 300)
			if s.Log() == "" {
				t.Errorf("%s: empty log", kind)
			}
			stopAndCheck(t, s)

			// The top-list zone, with AAAA records, pinned to the last CPU.
			z := tb.NamesZone(names)
			z.NamesAAAA = true
			cpu := runtime.NumCPU() - 1
			start = time.Now()
			s, err = tb.StartDNSServer(kind, DNSServerOptions{Zone: &z, Pin: true, CPU: cpu})
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("%s with %d names answers after %v", kind, len(names), time.Since(start).Round(time.Millisecond))
			tids, err := s.Proc().Threads()
			if err != nil || len(tids) == 0 {
				t.Fatalf("threads %v %v", tids, err)
			}
			for _, tid := range tids {
				var set unix.CPUSet
				if err := unix.SchedGetaffinity(tid, &set); err != nil {
					t.Fatal(err)
				}
				if set.Count() != 1 || !set.IsSet(cpu) {
					t.Errorf("%s thread %d not pinned to cpu%d", kind, tid, cpu)
				}
			}
			for i := 0; i < len(names); i += 97 {
				if a, err := onlyAddr(query(t, tb, s, i%2 == 1, names[i], dns.TypeA)); err != nil || a != NameAddr4(i) {
					t.Fatalf("%s A: %v %v, want %v", names[i], a, err, NameAddr4(i))
				}
				if a, err := onlyAddr(query(t, tb, s, i%2 == 0, names[i], dns.TypeAAAA)); err != nil || a != NameAddr6(i) {
					t.Fatalf("%s AAAA: %v %v, want %v", names[i], a, err, NameAddr6(i))
				}
			}
			if r := query(t, tb, s, false, "not-in-the-list-zz.com.", dns.TypeA); r.Rcode != dns.RcodeNameError {
				t.Errorf("name not in the list: rcode %s", dns.RcodeToString[r.Rcode])
			}
			stopAndCheck(t, s)
		})
	}
}

// burst sends n identical queries back to back and wants every answer.
func burst(t *testing.T, tb *Testbed, s DNSServer, name string, n int) {
	t.Helper()
	a4, _ := s.Addrs()
	c, err := tb.DialUDP(a4)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	got := 0
	buf := make([]byte, 1500)
	for i := 0; i < n; i++ {
		m.Id = uint16(i)
		b, _ := m.Pack()
		c.Write(b)
		c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := c.Read(buf); err == nil {
			got++
		}
	}
	if got != n {
		t.Errorf("%s: %d of %d queries answered (rate limiting on?)", s.Name(), got, n)
	}
}

// TestDNSServersCloseStopsAll runs all three at once on different ports
// and checks that closing the testbed stops them all.
func TestDNSServersCloseStopsAll(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: run the tests as root")
	}
	tb, err := Create(Options{Logf: t.Logf})
	if err != nil {
		t.Fatal(err)
	}
	defer tb.Close()
	var pids []int
	var dirs []string
	for i, kind := range DNSServerKinds {
		s, err := tb.StartDNSServer(kind, DNSServerOptions{Port: 5300 + i, Workers: 2})
		if err != nil {
			t.Fatal(err)
		}
		if a4, _ := s.Addrs(); a4.Port() != uint16(5300+i) {
			t.Errorf("%s port %d", kind, a4.Port())
		}
		if a, err := onlyAddr(query(t, tb, s, true, "www."+ZoneOrigin, dns.TypeA)); err != nil || a != ExampleWWW4 {
			t.Errorf("%s www A: %v %v", kind, a, err)
		}
		p, err := s.PIDs()
		if err != nil {
			t.Fatal(err)
		}
		pids = append(pids, p...)
		dirs = append(dirs, s.Proc().Dir)
	}
	if err := tb.Close(); err != nil {
		t.Fatal(err)
	}
	if left := running(pids); len(left) > 0 {
		t.Errorf("processes %v still running after Close", left)
	}
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("dir %s left", d)
		}
	}
}

// TestDNSServerBadConfig: a config the checker rejects fails the start
// with the checker's message, and leaves nothing behind.
func TestDNSServerBadConfig(t *testing.T) {
	tb := New(t)
	for kind, extra := range map[string]string{
		KindNSD:  "no-such-option: 1",
		KindKnot: "no-such-option: 1",
		KindBIND: "no-such-option 1;",
	} {
		s, err := tb.StartDNSServer(kind, DNSServerOptions{Extra: []string{extra}})
		if s != nil {
			t.Errorf("%s: failed start returned a non-nil server", kind)
		}
		if err == nil {
			t.Fatalf("%s started with %q", kind, extra)
		}
		if !strings.Contains(err.Error(), "no-such-option") && !strings.Contains(err.Error(), "no such") {
			t.Errorf("%s: error without the checker's message: %v", kind, err)
		}
		t.Logf("%s: %v", kind, err)
	}
	bad := tb.ExampleZone(0)
	bad.Records = append(bad.Records, "broken IN A 300.1.2.3")
	for _, kind := range []string{KindBIND, KindNSD, KindKnot} {
		start := time.Now()
		if _, err := tb.StartDNSServer(kind, DNSServerOptions{Zone: &bad}); err == nil {
			t.Errorf("%s started with a broken zone", kind)
		} else if !strings.Contains(err.Error(), "300.1.2.3") && !strings.Contains(err.Error(), "invalid IPv4") {
			t.Errorf("%s broken zone: error does not say what is wrong: %v", kind, err)
		} else if d := time.Since(start); d > 5*time.Second {
			t.Errorf("%s broken zone: took %v to fail", kind, d)
		} else {
			t.Logf("%s broken zone: %v", kind, err)
		}
	}
	if _, err := tb.StartDNSServer("powerdns", DNSServerOptions{}); err == nil {
		t.Error("unknown kind accepted")
	}
}
