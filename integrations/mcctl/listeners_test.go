package mcctl_test

import (
	"context"
	"fmt"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/integrations/mcctl/stalecheck"
	"github.com/santa-offload/santa/internal/testbed"
)

// otherPort is a second listener of memcached's, TCP and UDP (memcached's
// -l ADDR:PORT binds both, with -U), besides the offloaded port 11211.
const otherPort = 11311

// newTwoListenerRig is a rig whose memcached also listens on otherPort.
func newTwoListenerRig(t *testing.T) (*rig, netip.AddrPort) {
	r := newRigWith(t, testbed.MemcachedOptions{Extra: []string{"-l", fmt.Sprintf("0.0.0.0:%d", otherPort)}})
	return r, netip.AddrPortFrom(r.mc.Addr4.Addr(), otherPort)
}

// TestWritesThroughEveryListener: memcached listens on a second port. A
// write acknowledged through it, over every protocol, is seen by the next
// GET through the offloaded port, and the rule comes back with the new
// value. The tracker used to watch only the offloaded UDP port and
// --tcp-port, so the kernel went on answering the old value.
func TestWritesThroughEveryListener(t *testing.T) {
	r, other := newTwoListenerRig(t)
	const key = "listener:key"
	_, ctl, get := r.offloadOld(key)
	_, conns := r.clientsAt(other)
	for _, proto := range []string{"text", "meta", "binary", "udp"} {
		value := "new-" + proto
		if err := conns[proto].Set(key, []byte(value), 0, 0); err != nil {
			t.Fatalf("set over %s through %v: %v", proto, other, err)
		}
		if got := get(); got != value {
			t.Fatalf("after a set over %s through %v was acknowledged, a GET through %v gave %q, want %q (counters %v)",
				proto, other, r.mc.Addr4, got, value, r.counters())
		}
		r.waitAnswered(func() { get() }, r.counters()["answered"])
		if got := get(); got != value {
			t.Fatalf("the rule rebuilt after a set over %s answered %q, want %q", proto, got, value)
		}
	}
	if want := fmt.Sprintf("tcp_ports=\"[11211 %d]\"", otherPort); !strings.Contains(ctl.Output(), want) {
		t.Errorf("the controller does not say %s:\n%s", want, ctl.Output())
	}
}

// TestNoStaleReadsThroughAnotherListener: the stale-read checker's writers
// use memcached's second port (text, meta, binary), its readers the
// offloaded one: no read gives a value older than an acknowledged write.
func TestNoStaleReadsThroughAnotherListener(t *testing.T) {
	r, other := newTwoListenerRig(t)
	_, conns := r.clients(false)
	var keys []string
	for i := range 16 {
		keys = append(keys, fmt.Sprintf("stale:%02d", i))
		// present, so offloaded at start: the checker's first writes go
		// through the other listener
		if err := conns["text"].Set(keys[i], []byte("before"), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, keys)
	r.startController("static", "--keys", file, "--refresh", "5ms")
	before := r.counters()["answered"]
	rep, err := stalecheck.Run(context.Background(), stalecheck.Config{
		TCP: other, UDP: r.mc.Addr4, Keys: keys, Protocols: []string{"text", "meta", "binary"},
		Writers: 2, Readers: 2, Duration: 4 * time.Second, WritePause: 2 * time.Millisecond,
		Enter: r.tb.Client.Do,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(rep)
	if rep.Violations > 0 {
		for _, v := range rep.Stale[:min(5, len(rep.Stale))] {
			t.Error(v)
		}
		t.Fatalf("%d stale reads", rep.Violations)
	}
	if len(rep.ModelErrors) > 0 {
		t.Fatalf("checker model errors: %v", rep.ModelErrors)
	}
	if answered := r.counters()["answered"] - before; rep.Writes < 100 || answered < 1000 {
		t.Fatalf("too little load to mean anything: %d reads answered by the kernel, %v", answered, rep)
	}
}
