package mcctl_test

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/integrations/mcctl"
)

// Writes that memcached applies and the tracker used to miss: each case
// stores or deletes "hot" in a way the tracker did not follow, and each
// must be retired by a bump that comes with memcached's reply, of hot's
// slot or of the epoch.

// expectRetired drains tr's reports and fails t unless one that a reply
// of memcached made (not an unacked one) bumped key's slot or the epoch.
func expectRetired(t *testing.T, tr *mcctl.Tracker, step, key string) {
	t.Helper()
	acked, unacked := map[uint32]int{}, map[uint32]int{}
	lost, err := tr.DrainBumps(func(slot uint32, noReply bool) {
		if noReply {
			unacked[slot]++
		} else {
			acked[slot]++
		}
	})
	if err != nil || lost {
		t.Fatalf("%s: drain: lost %v, %v", step, lost, err)
	}
	if acked[mcctl.KeySlot(key)] == 0 && acked[1] == 0 {
		t.Errorf("%s: neither %s's slot (%d) nor the epoch was bumped with the reply: reported %v, without a reply %v",
			step, key, mcctl.KeySlot(key), acked, unacked)
	}
}

// tcpExchange sends request on a new connection from the client namespace
// and reads reply lines until one starts with last.
func tcpExchange(t *testing.T, r *rig, request []byte, last string) []string {
	t.Helper()
	var c net.Conn
	if err := r.tb.Client.Do(func() (err error) {
		c, err = net.Dial("tcp", r.mc.Addr4.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write(request); err != nil {
		t.Fatal(err)
	}
	var lines []string
	rd := bufio.NewReader(c)
	for {
		line, err := rd.ReadString('\n')
		if err != nil {
			t.Fatalf("%q: replies %q, then %v; want one starting with %s", request, lines, err, last)
		}
		if lines = append(lines, line); strings.HasPrefix(line, last) {
			return lines
		}
	}
}

// A NUL ends the line memcached tokenizes, and it splits at spaces only,
// taking off one CR before the LF: "delete hot\0" deletes hot (the tracker
// bumped the slot of "hot\0"), and "set\r" is no command, so that a set in
// what the tracker took for its value ran unseen (over UDP, where no count
// of replies catches it).
func TestTrackerTokenizesAsMemcached(t *testing.T) {
	r, tr := newTrackerRig(t)
	u := &udpRig{t: t, tr: tr}
	if err := r.tb.Client.Do(func() (err error) {
		u.conn, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(r.mc.Addr4))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer u.conn.Close()

	tcpExchange(t, r, []byte("set hot 0 0 3\r\nold\r\n"), "STORED")
	u.drain()
	tcpExchange(t, r, []byte("delete hot\x00\r\n"), "DELETED")
	expectRetired(t, tr, "delete hot\\0 over TCP", "hot")

	inner := "set hot 0 0 3\r\nnew\r\n"
	u.send(7, "set\r x 0 0 "+itoa(len(inner))+"\r\n"+inner+"\r\n")
	u.reply(7, "ERROR")
	u.reply(7, "STORED")
	expectRetired(t, tr, "a set of hot after set\\r over UDP", "hot")
}

// memcached reads a TCP connection in the protocol of its first byte: on
// a text connection a request that starts with 0x80 is a line it refuses,
// and what follows is read as text. The tracker took such a request for a
// binary set: the refused line's ERROR counted as that set's reply, the
// STORED of the set of hot in its "value" as the reply to a get it read
// after it, and hot's write went unseen.
func TestTrackerKeepsTheConnectionsProtocol(t *testing.T) {
	r, tr := newTrackerRig(t)
	tcpExchange(t, r, []byte("set hot 0 0 3\r\nold\r\n"), "STORED")
	key, extras := "a\n", make([]byte, 8) // the LF ends memcached's line
	hidden := "set hot 0 0 5\r\n"         // its data block: the tracker's next request
	body := len(extras) + len(key) + len(hidden)
	request := append([]byte{0x80, 0x01, 0, byte(len(key)), byte(len(extras)), 0, 0, 0,
		byte(body >> 24), byte(body >> 16), byte(body >> 8), byte(body), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, extras...)
	request = append(request, key+hidden+"get x\r\n"...)
	if _, err := tr.DrainBumps(func(uint32, bool) {}); err != nil {
		t.Fatal(err)
	}
	if got := tcpExchange(t, r, append([]byte("version\r\n"), request...), "STORED"); len(got) != 3 {
		t.Fatalf("memcached answered %q, want VERSION, ERROR and STORED", got)
	}
	expectRetired(t, tr, "a set of hot after a line starting with 0x80", "hot")
}

// A UDP command line longer than the tracker's MC_HEAD (512 bytes: here a
// set padded with spaces, which memcached skips) is run by memcached; the
// tracker took the datagram for one without a whole command, a read.
func TestTrackerLongUDPLine(t *testing.T) {
	u := newUDPRig(t, mcctl.TrackerConfig{})
	u.send(1, "set hot 0 0 3"+strings.Repeat(" ", 600)+"\r\nnew\r\n")
	u.reply(1, "STORED")
	expectRetired(t, u.tr, "a set of hot in a 600-byte line over UDP", "hot")
}
