package stalecheck_test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/integrations/mcctl/stalecheck"
	"github.com/santa-offload/santa/internal/mcproto"
	"github.com/santa-offload/santa/internal/testbed"
)

func startMemcached(t *testing.T) (*testbed.Testbed, *testbed.Memcached) {
	t.Helper()
	tb := testbed.New(t)
	m, err := tb.StartMemcached(testbed.MemcachedOptions{Threads: 2})
	if err != nil {
		t.Fatal(err)
	}
	return tb, m
}

func keys(n int) []string {
	k := make([]string, n)
	for i := range k {
		k[i] = fmt.Sprintf("stalecheck:%03d", i)
	}
	return k
}

// checkClean fails the test unless the run saw no violation and no
// error of any kind.
func checkClean(t *testing.T, rep stalecheck.Report, err error) {
	t.Helper()
	t.Log(rep)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range rep.Stale {
		t.Error(v)
	}
	// A UDP GET may go unanswered (a datagram dropped on a busy host, as
	// seen under CI load: 4 of 3626): not judged, and no staleness; a few
	// are let be, when every error kept is such a timeout.
	timeouts := 0
	for _, e := range rep.Errors {
		if strings.Contains(e, "i/o timeout") {
			timeouts++
		}
	}
	fewTimeouts := timeouts == len(rep.Errors) && int(rep.ReadErrors) <= len(rep.Errors) && rep.ReadErrors*100 <= rep.Reads
	if rep.Violations > 0 || len(rep.ModelErrors) > 0 || rep.WriteErrors > 0 || (rep.ReadErrors > 0 && !fewTimeouts) {
		t.Errorf("violations %d, model errors %q, write errors %d, read errors %d: %q",
			rep.Violations, rep.ModelErrors, rep.WriteErrors, rep.ReadErrors, rep.Errors)
	}
	if rep.Reads == 0 || rep.Writes == 0 || rep.Current+rep.Ahead != rep.Reads || rep.Hits+rep.Misses != rep.Reads {
		t.Errorf("counts do not add up: %+v", rep)
	}
}

// TestMemcachedHasNoStaleReads: Debian's memcached alone, written over
// every protocol with every op, is never stale.
func TestMemcachedHasNoStaleReads(t *testing.T) {
	tb, m := startMemcached(t)
	t.Run("ipv4", func(t *testing.T) {
		rep, err := stalecheck.Run(context.Background(), stalecheck.Config{
			TCP: m.Addr4, UDP: m.Addr4, Keys: keys(64), Writers: 4, Readers: 4,
			Duration: 3 * time.Second, FlushEvery: 200, Zipf: 1.1, Enter: tb.Client.Do,
		})
		checkClean(t, rep, err)
		for _, op := range stalecheck.AllOps {
			if rep.PerOp[op] == 0 {
				t.Errorf("no acknowledged %s: %v", op, rep.PerOp)
			}
		}
		for _, p := range stalecheck.AllProtocols {
			if rep.PerProtocol[p] == 0 {
				t.Errorf("no write over %s: %v", p, rep.PerProtocol)
			}
		}
		t.Logf("per op %v, per protocol %v", rep.PerOp, rep.PerProtocol)
	})
	t.Run("ipv6/maxops", func(t *testing.T) {
		const maxOps = 2000
		k := keys(16)
		rep, err := stalecheck.Run(context.Background(), stalecheck.Config{
			TCP: m.Addr6, UDP: m.Addr6, Keys: k, Writers: 2, Readers: 2,
			Duration: time.Minute, MaxOps: maxOps, WritePause: 100 * time.Microsecond, Enter: tb.Client.Do,
		})
		checkClean(t, rep, err)
		// The final pass reads every key once more.
		if n := rep.Writes + rep.Reads; n > maxOps+uint64(len(k)) || n < maxOps/2 {
			t.Errorf("%d reads and writes with MaxOps %d", n, maxOps)
		}
		if rep.Elapsed > 30*time.Second {
			t.Errorf("MaxOps did not stop the run: %v", rep.Elapsed)
		}
	})
	t.Run("ops", func(t *testing.T) {
		// Each op alone: the writers fill in what it needs (add
		// alternates with delete, incr gets numbers from set, …).
		for _, op := range stalecheck.AllOps {
			rep, err := stalecheck.Run(context.Background(), stalecheck.Config{
				TCP: m.Addr4, UDP: m.Addr4, Keys: keys(4), Ops: []string{op}, FlushEvery: 10,
				MaxOps: 400, Enter: tb.Client.Do,
			})
			checkClean(t, rep, err)
			if rep.PerOp[op] == 0 {
				t.Errorf("Ops {%s}: none acknowledged: %v", op, rep.PerOp)
			}
		}
	})
}

// proxy forwards memcached UDP requests from 127.0.0.1 in the client
// namespace to memcached and passes the replies back, except that GETs
// are answered by get(request, forward) for the test's faults.
func proxy(t *testing.T, tb *testbed.Testbed, upstream netip.AddrPort, get func(req []byte, forward func() []byte) []byte) netip.AddrPort {
	t.Helper()
	var l *net.UDPConn
	var up *mcproto.UDPClient
	err := tb.Client.Do(func() (err error) {
		if l, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)}); err != nil {
			return err
		}
		up, err = mcproto.DialUDP(upstream)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	t.Cleanup(func() {
		l.Close()
		<-done
		up.Close()
	})
	go func() {
		defer close(done)
		buf := make([]byte, 65536)
		for {
			n, from, err := l.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			f, err := mcproto.DecodeUDP(buf[:n])
			if err != nil {
				continue
			}
			req := bytes.Clone(f.Payload)
			forward := func() []byte {
				reply, err := up.Do(req, time.Second)
				if err != nil {
					return nil
				}
				return reply
			}
			var reply []byte
			if bytes.HasPrefix(req, []byte("get ")) {
				reply = get(req, forward)
			} else {
				reply = forward()
			}
			if reply != nil {
				l.WriteToUDPAddrPort(mcproto.EncodeUDP(f.ReqID, reply), from)
			}
		}
	}()
	return l.LocalAddr().(*net.UDPAddr).AddrPort()
}

// TestFindsStaleReads: a checker that cannot fail is no checker. Behind a
// proxy that caches GET replies forever it must report stale reads, each
// pointing at an older write; behind one that answers a value nobody
// wrote, reads of no write; behind a faithful proxy, nothing.
func TestFindsStaleReads(t *testing.T) {
	tb, m := startMemcached(t)
	run := func(t *testing.T, get func(req []byte, forward func() []byte) []byte) stalecheck.Report {
		t.Helper()
		rep, err := stalecheck.Run(context.Background(), stalecheck.Config{
			TCP: m.Addr4, UDP: proxy(t, tb, m.Addr4, get), Keys: keys(8), Writers: 2, Readers: 2,
			Duration: time.Second, WritePause: time.Millisecond, Enter: tb.Client.Do,
		})
		if err != nil {
			t.Fatal(err)
		}
		return rep
	}

	t.Run("faithful", func(t *testing.T) {
		rep := run(t, func(_ []byte, forward func() []byte) []byte { return forward() })
		checkClean(t, rep, nil)
	})

	t.Run("cache", func(t *testing.T) {
		cache := map[string][]byte{} // used by the proxy goroutine only
		rep := run(t, func(req []byte, forward func() []byte) []byte {
			if r, ok := cache[string(req)]; ok {
				return r
			}
			r := forward()
			cache[string(req)] = r
			return r
		})
		t.Log(rep)
		if rep.Violations == 0 || len(rep.Stale) == 0 {
			t.Fatalf("a cache that is never invalidated went unnoticed: %v", rep)
		}
		for _, v := range rep.Stale {
			// The cached reply may be a miss: then the older write is a delete.
			if v.Source == nil || v.Source.Index >= v.Acked.Index || v.Acked.Acked.After(v.Sent) ||
				v.Source.State.Present != v.Read.Present ||
				!bytes.Equal(bytes.TrimRight(v.Read.Value, " "), v.Source.State.Value) {
				t.Errorf("violation does not point at an older write: %v (%+v)", v, v)
			}
		}
		t.Logf("first violation: %v", rep.Stale[0])
	})

	t.Run("garbage", func(t *testing.T) {
		rep := run(t, func(req []byte, _ func() []byte) []byte {
			key := strings.TrimSpace(strings.TrimPrefix(string(req), "get "))
			return fmt.Appendf(nil, "VALUE %s 0 5\r\nbogus\r\nEND\r\n", key)
		})
		t.Log(rep)
		if rep.Violations == 0 || rep.Violations != rep.Reads {
			t.Fatalf("%d of %d reads of a value nobody wrote reported", rep.Violations, rep.Reads)
		}
		if v := rep.Stale[0]; v.Source != nil || !strings.Contains(v.String(), "no write ever made that state") {
			t.Errorf("garbage read attributed to a write: %v", v)
		}
	})
}

func TestConfigErrors(t *testing.T) {
	udp := netip.MustParseAddrPort("127.0.0.1:11211")
	for name, cfg := range map[string]stalecheck.Config{
		"no keys":        {UDP: udp, TCP: udp},
		"space in key":   {UDP: udp, TCP: udp, Keys: []string{"a b"}},
		"long key":       {UDP: udp, TCP: udp, Keys: []string{strings.Repeat("k", 251)}},
		"duplicate key":  {UDP: udp, TCP: udp, Keys: []string{"a", "a"}},
		"unknown op":     {UDP: udp, TCP: udp, Keys: []string{"a"}, Ops: []string{"gat"}},
		"unknown proto":  {UDP: udp, TCP: udp, Keys: []string{"a"}, Protocols: []string{"http"}},
		"no ops":         {UDP: udp, TCP: udp, Keys: []string{"a"}, Ops: []string{}},
		"no UDP address": {TCP: udp, Keys: []string{"a"}},
		"no TCP address": {UDP: udp, Keys: []string{"a"}, Protocols: []string{"udp", "meta"}},
	} {
		if _, err := stalecheck.Run(context.Background(), cfg); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}
