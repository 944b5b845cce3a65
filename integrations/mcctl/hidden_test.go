package mcctl_test

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/integrations/mcctl"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
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
	c := r.dialTCP(t)
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

// UDP datagrams to memcached that come in fragments, or after many IPv6
// extension headers: the kernel reassembles them and takes any number of
// extension headers, so memcached runs their commands. The tracker read a
// first fragment as the whole datagram (a set whose line was in the second
// fragment, or a second command there, went unseen) and passed over a
// datagram with more than 4 extension headers.
func TestTrackerUDPFragmentsAndExtensionHeaders(t *testing.T) {
	r, tr := newTrackerRig(t)
	var udp4, udp6 *net.UDPConn
	var raw4, raw6 int
	if err := r.tb.Client.Do(func() (err error) {
		if udp4, err = net.ListenUDP("udp", &net.UDPAddr{IP: r.tb.Client.IP4.AsSlice()}); err != nil {
			return err
		}
		if udp6, err = net.ListenUDP("udp", &net.UDPAddr{IP: r.tb.Client.IP6.AsSlice()}); err != nil {
			return err
		}
		// IPPROTO_RAW: the packets carry their own IP headers
		if raw4, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW); err != nil {
			return err
		}
		raw6, err = unix.Socket(unix.AF_INET6, unix.SOCK_RAW, unix.IPPROTO_RAW)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer udp4.Close()
	defer udp6.Close()
	defer unix.Close(raw4)
	defer unix.Close(raw6)

	send := func(v6 bool, packets ...[]byte) {
		t.Helper()
		for _, p := range packets {
			var err error
			if v6 {
				err = unix.Sendto(raw6, p, 0, &unix.SockaddrInet6{Addr: r.mc.Addr6.Addr().As16()})
			} else {
				err = unix.Sendto(raw4, p, 0, &unix.SockaddrInet4{Addr: r.mc.Addr4.Addr().As4()})
			}
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	replies := func(v6 bool, want ...string) {
		t.Helper()
		c := udp4
		if v6 {
			c = udp6
		}
		buf := make([]byte, 2048)
		for _, w := range want {
			c.SetReadDeadline(time.Now().Add(5 * time.Second))
			n, err := c.Read(buf)
			if err != nil || n < 8 || !strings.HasPrefix(string(buf[8:n]), w) {
				t.Fatalf("reply %q, %v; want %q", buf[:max(n, 0)], err, w)
			}
		}
	}
	datagram := func(v6 bool, commands string) []byte {
		c, src, dst := udp4, r.tb.Client.IP4, r.mc.Addr4
		if v6 {
			c, src, dst = udp6, r.tb.Client.IP6, r.mc.Addr6
		}
		return udpDatagram(src, dst.Addr(), uint16(c.LocalAddr().(*net.UDPAddr).Port), dst.Port(),
			append([]byte{0, 9, 0, 0, 0, 1, 0, 0}, commands...))
	}
	set := "set hot 0 0 3\r\nnew\r\n"
	first := "set x 0 0 16\r\n0123456789abcdef\r\n" // 8 + 8 + 32 bytes: a fragment boundary after it

	tcpExchange(t, r, []byte("set hot 0 0 3\r\nold\r\n"), "STORED")
	tr.DrainBumps(func(uint32, bool) {})
	d := datagram(false, set)
	send(false, ipv4Fragment(r.tb.Client.IP4, r.mc.Addr4.Addr(), 1, 0, d[:16], true),
		ipv4Fragment(r.tb.Client.IP4, r.mc.Addr4.Addr(), 1, 16, d[16:], false))
	replies(false, "STORED")
	expectRetired(t, tr, "IPv4, a set after the first fragment", "hot")

	d = datagram(false, first+set)
	send(false, ipv4Fragment(r.tb.Client.IP4, r.mc.Addr4.Addr(), 2, 0, d[:16+len(first)], true),
		ipv4Fragment(r.tb.Client.IP4, r.mc.Addr4.Addr(), 2, 16+len(first), d[16+len(first):], false))
	replies(false, "STORED", "STORED")
	expectRetired(t, tr, "IPv4, a set second in the datagram, in the second fragment", "hot")

	d = datagram(true, set)
	send(true, ipv6Packet(r.tb.Client.IP6, r.mc.Addr6.Addr(), []extHeader{ipv6Fragment(0, true)}, d[:16]),
		ipv6Packet(r.tb.Client.IP6, r.mc.Addr6.Addr(), []extHeader{ipv6Fragment(16, false)}, d[16:]))
	replies(true, "STORED")
	expectRetired(t, tr, "IPv6, a set after the first fragment", "hot")

	// a first fragment without the request id is dropped: no reply could be told apart
	d = datagram(false, set)
	send(false, ipv4Fragment(r.tb.Client.IP4, r.mc.Addr4.Addr(), 3, 0, d[:8], true),
		ipv4Fragment(r.tb.Client.IP4, r.mc.Addr4.Addr(), 3, 8, d[8:], false))
	udp4.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
	if n, err := udp4.Read(make([]byte, 2048)); err == nil {
		t.Errorf("a datagram whose first fragment holds only the UDP header: a %d-byte reply, want none", n)
	}

	send(true, ipv6Packet(r.tb.Client.IP6, r.mc.Addr6.Addr(), slices.Repeat([]extHeader{destOpts}, 9), datagram(true, set)))
	replies(true, "STORED")
	expectRetired(t, tr, "IPv6, a set after 9 destination options headers", "hot")
}

// udpDatagram is a UDP header and payload with the checksum of src and dst.
func udpDatagram(src, dst netip.Addr, sport, dport uint16, payload []byte) []byte {
	d := binary.BigEndian.AppendUint16(nil, sport)
	d = binary.BigEndian.AppendUint16(d, dport)
	d = binary.BigEndian.AppendUint16(d, uint16(8+len(payload)))
	d = append(append(d, 0, 0), payload...)
	binary.BigEndian.PutUint16(d[6:], l4Checksum(src, dst, unix.IPPROTO_UDP, d))
	return d
}

// ipv4Fragment is an IPv4 packet of protocol UDP carrying bytes [at,
// at+len(part)) of a datagram (at a multiple of 8); the kernel fills in
// its length and checksum.
func ipv4Fragment(src, dst netip.Addr, id uint16, at int, part []byte, more bool) []byte {
	flags := uint16(at / 8)
	if more {
		flags |= 0x2000
	}
	h := []byte{0x45, 0, 0, 0, byte(id >> 8), byte(id), byte(flags >> 8), byte(flags), 64, 17, 0, 0}
	return append(append(append(h, src.AsSlice()...), dst.AsSlice()...), part...)
}

// extHeader is an IPv6 extension header: its type, and its bytes after
// the next header's type.
type extHeader struct {
	kind byte
	rest []byte
}

// destOpts is an empty destination options header (PadN).
var destOpts = extHeader{60, []byte{0, 1, 4, 0, 0, 0, 0}}

// ipv6Fragment is the fragment header of bytes [at, at+n) of a datagram
// (at a multiple of 8).
func ipv6Fragment(at int, more bool) extHeader {
	off := uint16(at)
	if more {
		off |= 1
	}
	return extHeader{44, []byte{0, byte(off >> 8), byte(off), 0, 0, 0, 7}}
}

// ipv6Packet is an IPv6 packet with extension headers hdrs and then a UDP
// payload.
func ipv6Packet(src, dst netip.Addr, hdrs []extHeader, payload []byte) []byte {
	next := byte(17)
	for i := len(hdrs) - 1; i >= 0; i-- {
		payload = append(append([]byte{next}, hdrs[i].rest...), payload...)
		next = hdrs[i].kind
	}
	h := []byte{0x60, 0, 0, 0, byte(len(payload) >> 8), byte(len(payload)), next, 64}
	return append(append(append(h, src.AsSlice()...), dst.AsSlice()...), payload...)
}

// memcached -B ascii reads every connection as text, even one whose first
// byte is the binary magic: the controller asks memcached, and its tracker
// then reads such a request as a line too. Before, a set hidden in what
// the tracker took for a binary set's value went unseen, and the kernel
// answered the old value.
func TestTextOnlyMemcached(t *testing.T) {
	r := newRigWith(t, testbed.MemcachedOptions{Extra: []string{"-B", "ascii"}})
	_, _, get := r.offloadOld("hot")
	key, extras := "a\n", make([]byte, 8)
	hidden := "set hot 0 0 5\r\n"
	body := len(extras) + len(key) + len(hidden)
	request := append([]byte{0x80, 0x01, 0, byte(len(key)), byte(len(extras)), 0, 0, 0,
		byte(body >> 24), byte(body >> 16), byte(body >> 8), byte(body), 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}, extras...)
	request = append(request, key+hidden+"get x\r\n"...)
	if got := tcpExchange(t, r, request, "STORED"); len(got) != 2 {
		t.Fatalf("memcached answered %q, want ERROR and STORED", got)
	}
	if got := get(); got != "get x" {
		t.Errorf("GET of hot after a set memcached stored: %q, want %q", got, "get x")
	}
}

// A byte a client sends as TCP urgent data (MSG_OOB) is not in the stream
// memcached reads (no SO_OOBINLINE). The tracker read it: here "set x 0 0
// 4" with an urgent "0" is a set of 40 bytes to it, of 4 to memcached,
// which then ran the noreply set of hot that the tracker took for x's
// value, and the kernel answered hot's old value for good.
func TestTrackerUrgentData(t *testing.T) {
	r := newRig(t)
	_, _, get := r.offloadOld("hot")
	c := r.dialTCP(t)
	raw, err := c.(*net.TCPConn).SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	for _, part := range []struct {
		b     string
		flags int
	}{{"set x 0 0 4", 0}, {"0", unix.MSG_OOB}, {"\r\nABCD\r\nset hot 0 0 10 noreply\r\nhiddenval1\r\n", 0}} {
		var serr error
		if err := raw.Write(func(fd uintptr) bool {
			serr = unix.Send(int(fd), []byte(part.b), part.flags)
			return true
		}); err != nil || serr != nil {
			t.Fatal(err, serr)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "STORED\r\n" {
		t.Fatalf("memcached answered %q, %v; want STORED", line, err)
	}
	if got := tcpExchange(t, r, []byte("get hot\r\n"), "END"); len(got) < 2 || got[1] != "hiddenval1\r\n" {
		t.Fatalf("memcached holds %q for hot, want hiddenval1", got)
	}
	deadline := time.Now().Add(3 * time.Second) // the noreply write is settled within --settle
	for got := get(); got != "hiddenval1"; got = get() {
		if time.Now().After(deadline) {
			t.Fatalf("GET of hot: %q, want hiddenval1", got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
