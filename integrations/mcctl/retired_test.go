package mcctl

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"golang.org/x/sys/unix"
)

// retired, which checks only the rules of the slots the tracker reports
// bumped, finds the keys a check of every rule would: the tracker runs on
// UDP writes (BPF_PROG_TEST_RUN), over a guard map of santad's layout.
func TestRetiredMatchesFullScan(t *testing.T) {
	c := retiredRig(t)
	now := c.start
	put := func(key string, expires time.Time) { // with the versions of now, as refresh does
		slot := KeySlot(key)
		c.put(&entry{key: key, slot: slot, keyVersion: c.guards.version(slot),
			epochVersion: c.guards.version(epochSlot), expires: expires})
	}
	check := func(step string, want ...string) {
		t.Helper()
		got, _, err := c.retired(now)
		if err != nil {
			t.Fatal(err)
		}
		full := fullScan(c, now) // after the bumps of settled writes
		slices.Sort(want)
		if !slices.Equal(got, want) || !slices.Equal(full, want) {
			t.Fatalf("%s: retired %q, a full scan %q, want %q", step, got, full, want)
		}
		for _, k := range got {
			put(k, time.Time{})
		}
	}
	write := func(cmd string, repeat uint32) {
		t.Helper()
		if _, err := c.tracker.objs.McIngress.Run(&ebpf.RunOptions{Data: udpRequest(t, cmd), Repeat: repeat}); err != nil {
			t.Fatal(err)
		}
	}
	// p and q share a slot
	var p, q string
	seen := map[uint32]string{}
	for i := 0; p == ""; i++ {
		q = fmt.Sprintf("k%d", i)
		if p = seen[KeySlot(q)]; p == "" {
			seen[KeySlot(q)] = q
		}
	}
	for _, k := range []string{"a", "b", "c", p, q} {
		put(k, time.Time{})
	}
	put("t1", c.start.Add(1500*time.Millisecond))
	put("t2", c.start.Add(3200*time.Millisecond))

	check("nothing written")
	write("set a 0 0 1\r\nx\r\n", 1)
	check("a written", "a")
	write("delete "+p+"\r\n", 1)
	check(p+" written", p, q)
	now = c.start.Add(1400 * time.Millisecond)
	check("before t1 expires")
	now = c.start.Add(1600 * time.Millisecond)
	check("t1 expires", "t1")
	check("t1 rebuilt")
	c.drop(c.entries["b"])
	write("set b 0 0 1\r\nx\r\n", 1)
	check("b written without a rule")
	now = c.start.Add(5 * time.Second)
	write("set c 0 0 1\r\nx\r\n", 1)
	check("c written, t2 expires", "c", "t2")
	write("flush_all\r\n", 1)
	check("flush_all", "a", "c", p, q, "t1", "t2")
	// 70000 reports overflow the ring (1 MiB of 16-byte records): c's is lost
	write("set a 0 0 1\r\nx\r\n", 70000)
	write("set c 0 0 1\r\nx\r\n", 1)
	counters, err := c.tracker.Counters()
	if err != nil || counters["bumps_unreported"] == 0 {
		t.Fatalf("no bump went unreported (%v, %v)", counters, err)
	}
	check("reports lost", "a", "c")
	check("nothing written since")

	// A write without a reply retires its key's rule as it comes in, and
	// once more when it has settled (in case the rule was rebuilt from a
	// value fetched before memcached applied it); a second write pushes the
	// second bump back.
	settle := c.cfg.Settle
	write("set a 0 0 1 noreply\r\nx\r\n", 1)
	check("a written without a reply", "a")
	now = now.Add(settle / 2)
	write("delete a noreply\r\n", 1)
	check("a written again without a reply", "a")
	now = now.Add(settle - 1)
	check("the first write settled, the second not yet")
	now = now.Add(1)
	check("the second write settled", "a")
	check("settled once")
	if c.Report().Settled != 1 {
		t.Fatalf("%d slots bumped after settling, want 1", c.Report().Settled)
	}

	// A bump nobody reports (another controller's tracker shares the guard
	// map) is found by the sweep within a second's scans.
	c.guards.bump(KeySlot("c"))
	scans := int(time.Second / c.cfg.Interval)
	for i := 0; ; i++ {
		now = now.Add(c.cfg.Interval) // a scan sweeps the slots due since the last
		got, _, err := c.retired(now)
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			if !slices.Equal(got, []string{"c"}) {
				t.Fatalf("unreported bump of c's slot: retired %q", got)
			}
			t.Logf("unreported bump found in scan %d of %d", i+1, scans)
			put("c", time.Time{})
			break
		}
		if i == scans {
			t.Fatalf("an unreported bump of c's slot was not found in %d scans", scans+1)
		}
	}
	check("unreported bump rebuilt")
	c.guards.bump(epochSlot)
	check("unreported epoch bump", slices.Collect(maps.Keys(c.entries))...)

	for _, e := range c.entries {
		c.drop(e)
	}
	for _, b := range c.expiry {
		if len(b) > 0 {
			t.Errorf("expiry bucket left: %v", b)
		}
	}
	if len(c.bySlot) > 0 {
		t.Errorf("slot index left: %v", c.bySlot)
	}
}

// fullScan is what retired found before the tracker reported slots: every
// rule whose versions changed or whose value expires by now.
func fullScan(c *Controller, now time.Time) []string {
	epoch := c.guards.version(epochSlot)
	var out []string
	for k, e := range c.entries {
		if e.epochVersion != epoch || c.guards.version(e.slot) != e.keyVersion ||
			(!e.expires.IsZero() && now.After(e.expires)) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// retiredRig is a controller with a guard map and a tracker (not attached)
// for port 11211, and no rules.
func retiredRig(t *testing.T) *Controller {
	c, err := New(Config{Port: 11211, Mode: Static, Keys: []string{"a"}})
	if err != nil {
		t.Fatal(err)
	}
	dir, err := os.MkdirTemp("/sys/fs/bpf", "mcctl-test-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: guardSlots,
		Flags: unix.BPF_F_MMAPABLE})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pin := filepath.Join(dir, "guards")
	if err := m.Pin(pin); err != nil {
		t.Fatal(err)
	}
	if c.guards, err = openGuards(pin); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.guards.close() })
	if c.tracker, err = LoadTracker(TrackerConfig{TCPPorts: []uint16{11211}, UDPPorts: []uint16{11211}, Guards: c.guards.m}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.tracker.Close() })
	return c
}

// udpRequest is an Ethernet frame with cmd in a memcached UDP request to port 11211.
func udpRequest(t *testing.T, cmd string) []byte {
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolUDP,
		SrcIP: []byte{192, 0, 2, 2}, DstIP: []byte{192, 0, 2, 1}}
	udp := &layers.UDP{SrcPort: 40000, DstPort: 11211}
	udp.SetNetworkLayerForChecksum(ip)
	frame := append([]byte{0, 1, 0, 0, 0, 1, 0, 0}, cmd...) // id 1, datagram 0 of 1
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: make([]byte, 6), DstMAC: make([]byte, 6), EthernetType: layers.EthernetTypeIPv4},
		ip, udp, gopacket.Payload(frame))
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
