//go:build linux

package testbed

import (
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/mcproto"
	"golang.org/x/sys/unix"
)

// TestMemcached starts memcached pinned with two worker threads, asks for
// its version over TCP and UDP on both addresses and stops it.
func TestMemcached(t *testing.T) {
	tb := New(t)
	start := time.Now()
	m, err := tb.StartMemcached(MemcachedOptions{Port: 11311, Threads: 2, Pin: true, CPU: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("memcached pid %d answers after %v", m.PID(), time.Since(start).Round(time.Millisecond))
	if m.Addr4 != netip.AddrPortFrom(tb.Server.IP4, 11311) || m.Addr6 != netip.AddrPortFrom(tb.Server.IP6, 11311) {
		t.Errorf("addresses %v %v", m.Addr4, m.Addr6)
	}
	for _, a := range []netip.AddrPort{m.Addr4, m.Addr6} {
		err := tb.Client.Do(func() error {
			tcp, err := mcproto.DialText(a.String())
			if err != nil {
				return err
			}
			defer tcp.Close()
			udp, err := mcproto.DialUDP(a)
			if err != nil {
				return err
			}
			defer udp.Close()
			v, err := tcp.Version()
			if err != nil || !strings.HasPrefix(v, "1.") {
				t.Errorf("TCP version via %v: %q, %v", a, v, err)
			}
			reply, err := udp.Do([]byte("version\r\n"), time.Second)
			if err != nil || !strings.HasPrefix(string(reply), "VERSION 1.") {
				t.Errorf("UDP version via %v: %q, %v", a, reply, err)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// The loopback listener serves clients in the server namespace.
	err = tb.Server.Do(func() error {
		c, err := mcproto.DialText(m.Loopback.String())
		if err != nil {
			return err
		}
		defer c.Close()
		_, err = c.Version()
		return err
	})
	if err != nil {
		t.Errorf("version via %v: %v", m.Loopback, err)
	}

	tids, err := m.Threads()
	if err != nil {
		t.Fatal(err)
	}
	// main, 2 workers and helpers (LRU crawler and maintainer, hash
	// expansion, …)
	if len(tids) < 3 {
		t.Errorf("threads %v: want at least main and 2 workers", tids)
	}
	for _, tid := range tids {
		var set unix.CPUSet
		if err := unix.SchedGetaffinity(tid, &set); err != nil {
			t.Fatal(err)
		}
		if set.Count() != 1 || !set.IsSet(0) {
			t.Errorf("thread %d may run on %d CPUs, want only cpu0", tid, set.Count())
		}
	}

	pid := m.PID()
	start = time.Now()
	if err := m.Stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	t.Logf("memcached stopped in %v", time.Since(start).Round(time.Millisecond))
	if left := running([]int{pid}); len(left) > 0 {
		t.Errorf("memcached %d still running after Stop", pid)
	}
	if _, err := m.Threads(); err == nil {
		t.Error("Threads after Stop is not an error")
	}
	if err := m.Stop(); err != nil {
		t.Errorf("second Stop: %v", err)
	}
	t.Logf("memcached output: %q", m.Log())
}

// TestMemcachedStartFails: a memcached that exits at once (a bad flag) is
// reported with its own message, without waiting for the timeout.
func TestMemcachedStartFails(t *testing.T) {
	tb := New(t)
	start := time.Now()
	_, err := tb.StartMemcached(MemcachedOptions{Extra: []string{"--no-such-flag"}, Timeout: 30 * time.Second})
	if err == nil || !strings.Contains(err.Error(), "exited") || !strings.Contains(err.Error(), "no-such-flag") {
		t.Fatalf("err %v, want an exit with memcached's complaint", err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("failure took %v", d)
	}
	t.Log(err)
}
