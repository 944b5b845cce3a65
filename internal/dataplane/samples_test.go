package dataplane

import (
	"bytes"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// Misses are sampled per rule set, cut to the configured length, and no
// faster than the configured rate per CPU.
func TestMissSamples(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7100)
	sampled := e.socket(s, false)
	e.bindRules(sampled, reply("Hello", "COMSYS"))
	if err := e.d.SetSampling(sampled, SampleOptions{Bytes: 8, PerSecond: 3}); err != nil {
		t.Fatal(err)
	}
	quiet := e.socket(netip.AddrPortFrom(s.Addr(), 7101), false) // has rules but sampling off
	e.bindRules(quiet, reply("Hello", "COMSYS"))

	ms, err := e.d.OpenMissSamples()
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()

	// one CPU, so one per-CPU budget applies
	err = e.tb.Server.Do(func() error {
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return err
		}
		for i := 0; i < 5; i++ {
			for _, dst := range []uint16{7100, 7101} {
				frame := request(c, netip.AddrPortFrom(s.Addr(), dst), fmt.Sprintf("miss-request-%d", i)).build(t)
				if v, _, err := e.d.Program().Test(frame); err != nil || v != xdpPass {
					return fmt.Errorf("miss %d: verdict %d, %v", i, v, err)
				}
			}
		}
		// a hit is never sampled
		if v, _, err := e.d.Program().Test(request(c, s, "Hello").build(t)); err != nil || v != xdpTx {
			return fmt.Errorf("hit: verdict %d, %v", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	var got []MissSample
	done := make(chan struct{})
	go func() {
		defer close(done)
		for len(got) < 4 {
			m, err := ms.Read()
			if err != nil {
				return
			}
			got = append(got, m)
		}
	}()
	select {
	case <-done:
	case <-time.After(500 * time.Millisecond):
		ms.Close()
		<-done
	}
	if len(got) != 3 {
		t.Fatalf("got %d samples, want 3 (the rate limit)", len(got))
	}
	for i, m := range got {
		want := []byte(fmt.Sprintf("miss-request-%d", i))
		if m.Cookie != sampled || m.Family != 4 || m.Len != len(want) || !bytes.Equal(m.Payload, want[:8]) {
			t.Errorf("sample %d: %+v, want cookie %#x, len %d, payload %q", i, m, sampled, len(want), want[:8])
		}
	}
	cnt := e.counters()
	if cnt["miss_sampled"] != 3 || cnt["miss_sample_limited"] != 2 {
		t.Errorf("miss_sampled %d, miss_sample_limited %d; want 3 and 2", cnt["miss_sampled"], cnt["miss_sample_limited"])
	}
}
