package mcctl_test

import (
	"maps"
	"net"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/santa-offload/santa/integrations/mcctl"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// The tracker reports the slot of every bump to the controller: a write of
// a key, over TCP and over UDP, as it goes in and as its reply leaves; a
// flush_all as the epoch's; a write that gets no reply as such.
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
	unacked := map[uint32]int{} // reports of writes no reply may follow, by slot
	reported := func() map[uint32]int {
		t.Helper()
		n := map[uint32]int{}
		lost, err := tr.DrainBumps(func(slot uint32, noReply bool) {
			if noReply {
				unacked[slot]++
			} else {
				n[slot]++
			}
		})
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
	if len(unacked) > 0 {
		t.Fatalf("writes with replies reported as without: %v", unacked)
	}

	// Writes no reply may follow are reported as such: a noreply set, and
	// a set whose connection the client resets before its value (memcached
	// never replies to it).
	var raw *net.TCPConn
	if err := tb.Client.Do(func() error {
		c, err := net.Dial("tcp", mc.Addr4.String())
		raw, _ = c.(*net.TCPConn)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	awaitReports := func(step string, want map[uint32]int, wantUnacked map[uint32]int) {
		t.Helper()
		got := map[uint32]int{}
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			maps.Copy(got, reported()) // each slot is reported in one packet's pass
			if maps.Equal(got, want) && maps.Equal(unacked, wantUnacked) {
				clear(unacked)
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: reported %v and without a reply %v, want %v and %v", step, got, unacked, want, wantUnacked)
			}
		}
	}
	noreply, reset := mcctl.KeySlot("reported:noreply"), mcctl.KeySlot("reported:reset")
	if _, err := raw.Write([]byte("set reported:noreply 0 0 1 noreply\r\nv\r\n")); err != nil {
		t.Fatal(err)
	}
	awaitReports("noreply set", map[uint32]int{}, map[uint32]int{noreply: 1})
	if _, err := raw.Write([]byte("set reported:reset 0 0 1\r\n")); err != nil {
		t.Fatal(err)
	}
	awaitReports("set without its value", map[uint32]int{reset: 1}, map[uint32]int{})
	if err := raw.SetLinger(0); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	// both writes are still owed: the noreply one awaited the next reply
	awaitReports("connection reset", map[uint32]int{}, map[uint32]int{noreply: 1, reset: 1})
}
