package mcctl_test

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/integrations/mcctl"
)

// udpRig is a UDP socket of the client namespace to the tracker rig's
// memcached; drain returns the slots reported since the last call, those
// of writes with a reply and those of writes without.
type udpRig struct {
	t    *testing.T
	conn *net.UDPConn
	tr   *mcctl.Tracker
}

func newUDPRig(t *testing.T, cfg mcctl.TrackerConfig) *udpRig {
	r, tr := newTrackerRigWith(t, cfg)
	u := &udpRig{t: t, tr: tr}
	if err := r.tb.Client.Do(func() (err error) {
		u.conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(r.mc.Addr4))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { u.conn.Close() })
	return u
}

// send sends request as one datagram with request id id.
func (u *udpRig) send(id uint16, request string) {
	u.t.Helper()
	if _, err := u.conn.Write(append([]byte{byte(id >> 8), byte(id), 0, 0, 0, 1, 0, 0}, request...)); err != nil {
		u.t.Fatal(err)
	}
}

// reply reads one reply and checks its id and that it starts with want.
func (u *udpRig) reply(id uint16, want string) {
	u.t.Helper()
	u.conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	n, err := u.conn.Read(buf)
	if err != nil || n < 8 || buf[0] != byte(id>>8) || buf[1] != byte(id) || !strings.HasPrefix(string(buf[8:n]), want) {
		u.t.Fatalf("reply %q (%d bytes), %v; want id %d, %q", buf[:max(n, 0)], n, err, id, want)
	}
}

func (u *udpRig) drain() (acked, unacked map[uint32]int) {
	u.t.Helper()
	acked, unacked = map[uint32]int{}, map[uint32]int{}
	lost, err := u.tr.DrainBumps(func(slot uint32, noReply bool) {
		if noReply {
			unacked[slot]++
		} else {
			acked[slot]++
		}
	})
	if err != nil || lost {
		u.t.Fatalf("drain: lost %v, %v", lost, err)
	}
	return acked, unacked
}

// Two UDP writes from one client port with the same request id are both
// bumped by the replies: memcached may answer them in either order. The
// second used to replace the first's entry, so the first write's reply
// bumped the second key's slot, and the second reply nothing: the first
// key's rule, rebuilt between its write's arrival and memcached applying
// it, kept the old value.
func TestUDPWritesSharingAnID(t *testing.T) {
	u := newUDPRig(t, mcctl.TrackerConfig{})
	const id = 7
	u.send(id, "set shared:1 0 0 1\r\na\r\n")
	u.send(id, "set shared:2 0 0 1\r\nb\r\n")
	u.reply(id, "STORED")
	u.reply(id, "STORED")
	acked, unacked := u.drain()
	for _, key := range []string{"shared:1", "shared:2"} {
		// the write as it came in, and at least one reply after it
		if slot := mcctl.KeySlot(key); acked[slot] < 2 {
			t.Errorf("%s: slot %d reported %d times, want the write and a reply (all: %v, without a reply %v)",
				key, slot, acked[slot], acked, unacked)
		}
	}
}

// A write that finds the map of UDP writes full is bumped as one without a
// reply (the controller bumps it again once settled), and the entries older
// than a second make room: their writes are bumped likewise. The map used
// to be an LRU: a flood of UDP writes pushed out the entry of a write
// before its reply, which then bumped nothing.
func TestUDPWritesMapFull(t *testing.T) {
	var u *udpRig
	slots := map[int]uint32{}
	write := func(i int) {
		t.Helper()
		key := "full:" + string(rune('0'+i))
		slots[i] = mcctl.KeySlot(key)
		u.send(uint16(i), "set "+key+" 0 0 1\r\nv\r\n")
		u.reply(uint16(i), "STORED")
	}
	// Write 5 finds the map full of recent entries only if it comes less
	// than a second (MC_UDP_GIVE_UP_MS) after write 1: else write 1 is
	// given up to make room. A run too slow for that (a loaded machine)
	// proves nothing and starts again with a new tracker.
	var acked, unacked map[uint32]int
	for attempt := 1; ; attempt++ {
		u = newUDPRig(t, mcctl.TrackerConfig{UDPWrites: 4})
		start := time.Now()
		for i := 1; i <= 4; i++ {
			write(i)
		}
		acked, unacked = u.drain()
		for i := 1; i <= 4; i++ {
			if acked[slots[i]] != 2 {
				t.Fatalf("write %d: reported %d times, want 2 (all: %v)", i, acked[slots[i]], acked)
			}
		}
		write(5)
		took := time.Since(start)
		if took < time.Second {
			break
		}
		if attempt == 3 {
			t.Fatalf("writes 1 to 5 took %v, three times: write 5 may have found write 1 a second old", took)
		}
		t.Logf("writes 1 to 5 took %v: again, with a new tracker", took)
	}
	acked, unacked = u.drain()
	if acked[slots[5]] != 1 || unacked[slots[5]] != 1 { // as it came in; then instead of its reply
		t.Fatalf("a write into the full map: reported %v, without a reply %v; want its slot %d once each",
			acked, unacked, slots[5])
	}
	time.Sleep(1100 * time.Millisecond)
	write(6)
	acked, unacked = u.drain()
	for i := 1; i <= 4; i++ {
		if unacked[slots[i]] != 1 {
			t.Fatalf("entries a second old given up: reported without a reply %v, want slot %d (write %d) once",
				unacked, slots[i], i)
		}
	}
	if acked[slots[6]] != 2 {
		t.Fatalf("a write after room was made: reported %v, want slot %d twice", acked, slots[6])
	}
	c, err := u.tr.Counters()
	if err != nil {
		t.Fatal(err)
	}
	if c["udp_writes_unpaired"] != 5 {
		t.Fatalf("udp_writes_unpaired = %d, want 5 (the write into the full map, the 4 given up)", c["udp_writes_unpaired"])
	}
}
