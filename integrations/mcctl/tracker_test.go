package mcctl_test

import (
	"testing"

	"github.com/cilium/ebpf"
	"github.com/santa-offload/santa/integrations/mcctl"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// The tracker reports the slot of every bump to the controller: a write of
// a key, over TCP and over UDP, as it goes in and as its reply leaves; a
// flush_all as the epoch's.
func TestTrackerReportsBumps(t *testing.T) {
	tb := testbed.New(t)
	mc, err := tb.StartMemcached(testbed.MemcachedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	guards, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1 << 20,
		Flags: unix.BPF_F_MMAPABLE})
	if err != nil {
		t.Fatal(err)
	}
	defer guards.Close()
	tr, err := mcctl.LoadTracker(mcctl.TrackerConfig{TCPPort: mc.Addr4.Port(), UDPPort: mc.Addr4.Port(), Guards: guards})
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if err := tb.Server.Do(func() error { return tr.Attach(tb.Server.Dev) }); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, tb: tb, mc: mc}
	_, conns := r.clients(false)
	reported := func() map[uint32]int {
		t.Helper()
		n := map[uint32]int{}
		lost, err := tr.DrainBumps(func(slot uint32) { n[slot]++ })
		if err != nil || lost {
			t.Fatalf("drain: lost %v, %v", lost, err)
		}
		return n
	}
	for _, proto := range []string{"text", "udp"} {
		key := "reported:" + proto
		if err := conns[proto].Set(key, []byte("v"), 0, 0); err != nil {
			t.Fatal(err)
		}
		slot := mcctl.KeySlot(key)
		if got := reported(); len(got) != 1 || got[slot] != 2 {
			t.Fatalf("%s set of %s: slots reported %v, want %d twice (in, and as the reply leaves)", proto, key, got, slot)
		}
	}
	if err := conns["text"].FlushAll(); err != nil {
		t.Fatal(err)
	}
	if got := reported(); len(got) != 1 || got[1] != 2 {
		t.Fatalf("flush_all: slots reported %v, want the epoch's (1) twice", got)
	}
}
