package mcctl_test

import (
	"bufio"
	"maps"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/santa-offload/santa/integrations/mcctl"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// newTrackerRig is memcached with a write tracker of its own (no santad)
// on the server veth; the test's cleanup closes the tracker.
func newTrackerRig(t *testing.T) (*rig, *mcctl.Tracker) {
	return newTrackerRigWith(t, mcctl.TrackerConfig{})
}

// newTrackerRigWith is newTrackerRig with the tracker's sizes of cfg.
func newTrackerRigWith(t *testing.T, cfg mcctl.TrackerConfig) (*rig, *mcctl.Tracker) {
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
	t.Cleanup(func() { guards.Close() })
	cfg.TCPPorts, cfg.UDPPorts, cfg.Guards = []uint16{mc.Addr4.Port()}, []uint16{mc.Addr4.Port()}, guards
	tr, err := mcctl.LoadTracker(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { tr.Close() })
	if err := tb.Server.Do(func() error { return tr.Attach(tb.Server.Dev) }); err != nil {
		t.Fatal(err)
	}
	return &rig{t: t, tb: tb, mc: mc}, tr
}

// The tracker reports the slot of every bump to the controller: a write of
// a key, over TCP and over UDP, as it goes in and as its reply leaves; a
// flush_all as the epoch's; a write that gets no reply as such.
func TestTrackerReportsBumps(t *testing.T) {
	r, tr := newTrackerRig(t)
	tb, mc := r.tb, r.mc
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

// A get or gets is a read, found without splitting the line when its keys
// fit memcached's limit; a get whose first key is over the limit is a
// command the tracker cannot follow (a lost TCP connection, the epoch bumped
// over UDP), as before that shortcut. Each request waits for its reply, so
// the counters have seen it.
func TestTrackerClassifiesGets(t *testing.T) {
	r, tr := newTrackerRig(t)
	longest, over := strings.Repeat("k", 250), strings.Repeat("k", 251)
	var tcp net.Conn
	var udp *net.UDPConn
	if err := r.tb.Client.Do(func() (err error) {
		if tcp, err = net.Dial("tcp", r.mc.Addr4.String()); err != nil {
			return err
		}
		udp, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(r.mc.Addr4))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()
	defer udp.Close()
	reply := bufio.NewReader(tcp)
	ask := func(request, want string) {
		t.Helper()
		tcp.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := tcp.Write([]byte(request)); err != nil {
			t.Fatal(err)
		}
		line, err := reply.ReadString('\n')
		if err != nil || !strings.HasPrefix(line, want) {
			t.Fatalf("%.20q: reply %q, %v; want %q", request, line, err, want)
		}
	}
	askUDP := func(id uint16, request, want string) {
		t.Helper()
		udp.SetDeadline(time.Now().Add(5 * time.Second))
		frame := append([]byte{byte(id >> 8), byte(id), 0, 0, 0, 1, 0, 0}, request...)
		if _, err := udp.Write(frame); err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, 2048)
		n := 8
		for n == 8 { // memcached answers a gets with an empty datagram first
			var err error
			if n, err = udp.Read(buf); err != nil || n < 8 {
				t.Fatalf("udp %.20q: %d-byte reply, %v", request, n, err)
			}
		}
		if !strings.HasPrefix(string(buf[8:n]), want) {
			t.Fatalf("udp %.20q: reply %q, want %q", request, buf[8:n], want)
		}
	}
	expect := func(step string, want map[string]uint64) {
		t.Helper()
		got, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		for name, n := range want {
			if got[name] != n {
				t.Fatalf("%s: %s = %d, want %d (all: %v)", step, name, got[name], n, got)
			}
		}
	}
	ask("get a\r\n", "END")
	ask("gets a b\r\n", "END")
	ask("get "+longest+"\r\n", "END")
	ask("get\r\n", "ERROR")
	askUDP(1, "get a\r\n", "END")
	askUDP(2, "gets a b\r\n", "END")
	expect("gets within the key limit", map[string]uint64{"reads": 6, "lost_flows": 0, "epoch_writes": 0})
	askUDP(3, "get "+over+"\r\n", "CLIENT_ERROR")
	expect("a UDP get of a key over the limit", map[string]uint64{"reads": 6, "lost_flows": 0, "epoch_writes": 1})
	ask("get "+over+"\r\n", "CLIENT_ERROR")
	expect("a TCP get of a key over the limit", map[string]uint64{"reads": 6, "lost_flows": 1, "epoch_writes": 1})
}

// The tracker reads flush_all's delay as memcached does (an optional sign,
// leading zeros): a delayed flush sets the hold to its delay plus 2 s, one
// at once sets none, and a negative one that memcached cuts to 32 bits
// holds for good.
func TestTrackerReadsFlushDelays(t *testing.T) {
	r, tr := newTrackerRig(t)
	tcp := r.dialTCP(t)
	reply := bufio.NewReader(tcp)
	flush := func(arg string) time.Duration {
		t.Helper()
		tcp.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := tcp.Write([]byte("flush_all " + arg + "\r\n")); err != nil {
			t.Fatal(err)
		}
		if line, err := reply.ReadString('\n'); err != nil || line != "OK\r\n" {
			t.Fatalf("flush_all %s: reply %q, %v", arg, line, err)
		}
		hold, err := tr.FlushHold()
		if err != nil {
			t.Fatal(err)
		}
		var now unix.Timespec
		unix.ClockGettime(unix.CLOCK_MONOTONIC, &now)
		return hold - time.Duration(now.Nano())
	}
	for _, arg := range []string{"0", "-5", "+0"} {
		if left := flush(arg); left > 0 {
			t.Fatalf("flush_all %s (at once): held for %v", arg, left)
		}
	}
	for _, c := range []struct {
		arg  string
		want time.Duration // delay plus 2 s
	}{{"+3", 5 * time.Second}, {"000000000007", 9 * time.Second}} {
		if left := flush(c.arg); left > c.want || left < c.want-time.Second {
			t.Fatalf("flush_all %s: held for %v, want about %v", c.arg, left, c.want)
		}
	}
	if left := flush("-5000000000"); left < 100*365*24*time.Hour {
		t.Fatalf("flush_all -5000000000: held for %v, want for good", left)
	}
}

// A storage command whose flags, exptime or cas unique memcached cannot
// read (or an ms with too many flags) is refused without its data block,
// which memcached then reads as commands: the tracker loses the flow
// (bumping the epoch) instead of taking the block for the value, where a
// write hid unseen (before: the set of hot inside was not seen, and its
// old value was answered from the kernel until the next write of it).
// Plain numbers in range, a negative exptime and a 19-digit cas unique
// keep the flow.
func TestTrackerUnreadableStorageNumbers(t *testing.T) {
	r, tr := newTrackerRig(t)
	inner := "set hot 0 0 3\r\nnew\r\n"
	block := inner + "\r\n" // the data block, if memcached takes one
	for _, tc := range []struct {
		name, request, first string
		lost                 bool
	}{
		{"plain set", "set x 0 0 " + itoa(len(inner)) + "\r\n" + block, "STORED", false},
		{"negative exptime", "set x 0 -1 " + itoa(len(inner)) + "\r\n" + block, "STORED", false},
		{"cas of 19 digits", "cas x 0 0 " + itoa(len(inner)) + " 1234567890123456789\r\n" + block, "NOT_FOUND", false},
		{"exptime not a number", "set x 0 1.5 " + itoa(len(inner)) + "\r\n" + block, "CLIENT_ERROR", true},
		{"flags not a number", "set x abc 0 " + itoa(len(inner)) + "\r\n" + block, "CLIENT_ERROR", true},
		{"exptime past 2^31-1 (memcached 1.6.18 takes it; the tracker does not try)", "set x 0 2147483648 " + itoa(len(inner)) + "\r\n" + block, "STORED", true},
		{"cas unique not a number", "cas x 0 0 " + itoa(len(inner)) + " abc\r\n" + block, "CLIENT_ERROR", true},
		{"ms with too many flags", "ms x " + itoa(len(inner)) + strings.Repeat(" F0", 19) + "\r\n" + block, "CLIENT_ERROR", true},
	} {
		var tcp net.Conn
		if err := r.tb.Client.Do(func() (err error) {
			tcp, err = net.Dial("tcp", r.mc.Addr4.String())
			return err
		}); err != nil {
			t.Fatal(err)
		}
		before, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		tcp.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := tcp.Write([]byte(tc.request)); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(tcp).ReadString('\n')
		tcp.Close()
		if err != nil || !strings.HasPrefix(line, tc.first) {
			t.Fatalf("%s: memcached answered %q (%v), want %s first", tc.name, line, err, tc.first)
		}
		after, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		if lost := after["lost_flows"] > before["lost_flows"]; lost != tc.lost {
			t.Errorf("%s: flow lost %v, want %v (counters %v)", tc.name, lost, tc.lost, after)
		}
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
