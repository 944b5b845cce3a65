package mcctl_test

import (
	"bufio"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// tcpForger is a TCP connection to memcached from the client namespace,
// with a raw socket to send segments its stack did not (forged ones, or
// its own bytes again), and a capture of the client's interface that
// tells what its stack sent.
type tcpForger struct {
	t            *testing.T
	r            *rig
	c            net.Conn
	rd           *bufio.Reader
	capture, raw int
}

func newTCPForger(t *testing.T, r *rig) *tcpForger {
	f := &tcpForger{t: t, r: r}
	if err := r.tb.Client.Do(func() (err error) {
		if f.capture, err = unix.Socket(unix.AF_PACKET, unix.SOCK_DGRAM|unix.SOCK_NONBLOCK, int(htons(unix.ETH_P_ALL))); err != nil {
			return err
		}
		if err := unix.Bind(f.capture, &unix.SockaddrLinklayer{Protocol: htons(unix.ETH_P_ALL), Ifindex: r.tb.Client.Ifindex}); err != nil {
			return err
		}
		if f.raw, err = unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW); err != nil {
			return err
		}
		f.c, err = net.Dial("tcp", r.mc.Addr4.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		unix.Close(f.capture)
		unix.Close(f.raw)
		f.c.Close()
	})
	f.rd = bufio.NewReader(f.c)
	return f
}

// ask sends request, reads memcached's reply line and returns the TCP
// header (with options) the request left with; the request must fit in
// a segment.
func (f *tcpForger) ask(request string) (header []byte, reply string) {
	f.t.Helper()
	buf := make([]byte, 2048)
	for { // what the capture holds from before
		if _, _, err := unix.Recvfrom(f.capture, buf, 0); err != nil {
			break
		}
	}
	reply = f.send(request)
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
		n, _, err := unix.Recvfrom(f.capture, buf, 0)
		if err == unix.EAGAIN {
			time.Sleep(time.Millisecond)
			continue
		}
		if err != nil {
			f.t.Fatalf("capture %q: %v", request, err)
		}
		ip := buf[:n]
		if n < 40 || ip[0]>>4 != 4 || ip[9] != unix.IPPROTO_TCP {
			continue
		}
		l4 := ip[int(ip[0]&15)*4:]
		if binary.BigEndian.Uint16(l4[2:]) == f.r.mc.Addr4.Port() && string(l4[int(l4[12]>>4)*4:]) == request {
			return append([]byte(nil), l4[:int(l4[12]>>4)*4]...), reply
		}
	}
	f.t.Fatalf("the segment of %q was not captured", request)
	return nil, ""
}

// send writes request on the connection and reads memcached's reply line.
func (f *tcpForger) send(request string) string {
	f.t.Helper()
	f.c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := f.c.Write([]byte(request)); err != nil {
		f.t.Fatal(err)
	}
	line, err := f.rd.ReadString('\n')
	if err != nil {
		f.t.Fatalf("%q: reply %q, %v", request, line, err)
	}
	return line
}

// inject sends a segment of the connection with header (its checksum
// computed unless badChecksum) and payload from the client's address.
func (f *tcpForger) inject(header []byte, payload string, badChecksum bool) {
	f.t.Helper()
	seg := append(append([]byte(nil), header...), payload...)
	binary.BigEndian.PutUint16(seg[16:], 0)
	sum := l4Checksum(f.r.tb.Client.IP4, f.r.mc.Addr4.Addr(), unix.IPPROTO_TCP, seg)
	if badChecksum {
		sum ^= 0xffff
	}
	binary.BigEndian.PutUint16(seg[16:], sum)
	// the kernel fills in the IP header's length, id and checksum
	packet := append([]byte{0x45, 0, 0, 0, 0, 0, 0x40, 0, 64, unix.IPPROTO_TCP, 0, 0}, f.r.tb.Client.IP4.AsSlice()...)
	packet = append(append(packet, f.r.mc.Addr4.Addr().AsSlice()...), seg...)
	if err := unix.Sendto(f.raw, packet, 0, &unix.SockaddrInet4{Addr: f.r.mc.Addr4.Addr().As4()}); err != nil {
		f.t.Fatal(err)
	}
}

// after is header with its sequence number moved past its own payload of n bytes.
func after(header []byte, n int) []byte {
	h := append([]byte(nil), header...)
	binary.BigEndian.PutUint32(h[4:], binary.BigEndian.Uint32(h[4:])+uint32(n))
	return h
}

// tsval is the offset of the timestamp option's TSval in header.
func tsval(t *testing.T, header []byte) int {
	for i := 20; i+1 < len(header); {
		switch header[i] {
		case 0: // end of options
			i = len(header)
		case 1: // no-op
			i++
		case 8:
			return i + 2
		default:
			i += max(int(header[i+1]), 2)
		}
	}
	t.Fatalf("no timestamp option in % x", header)
	return 0
}

// A TCP segment the kernel drops never reaches memcached, but the tracker,
// in front of the kernel, parsed it, and the client's own bytes sent
// after it at its sequence numbers passed for a retransmission of what
// it had parsed: a forged "get hotabc" stood for the "delete hot"
// memcached got in its place, and the kernel answered the deleted value.
// The kernel drops such a segment for a wrong checksum (checked where the
// device leaves it to the kernel, here the server veth with its receive
// offload off), an ACK of data it has not sent, an old timestamp (PAWS),
// or no ACK flag. The tracker drops one with a wrong checksum before it
// parses it; for the others, it finds the client's bytes differ from
// those parsed (or cannot tell, as they end inside the forged segment),
// and gives the connection up: its writes bump the epoch.
func TestTrackerForgedSegments(t *testing.T) {
	for _, tc := range []struct {
		name        string
		payload     string // the forged segment's
		badChecksum bool
		forge       func(t *testing.T, header []byte)
	}{
		{"wrong checksum", "get hotabc\r\n", true, func(*testing.T, []byte) {}},
		{"ACK of unsent data", "get hotabc\r\n", false, func(_ *testing.T, h []byte) {
			binary.BigEndian.PutUint32(h[8:], binary.BigEndian.Uint32(h[8:])+1<<20)
		}},
		{"old timestamp", "get h\r\n", false, func(t *testing.T, h []byte) {
			at := tsval(t, h)
			binary.BigEndian.PutUint32(h[at:], binary.BigEndian.Uint32(h[at:])-1<<20)
		}},
		{"no ACK flag", "get hotabcdef\r\n", false, func(_ *testing.T, h []byte) { h[13] &^= 0x10 }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t)
			if tc.badChecksum {
				if out, err := r.tb.Server.Run("ethtool", "-K", r.tb.Server.Dev, "rx", "off"); err != nil {
					t.Fatalf("ethtool: %v: %s", err, out)
				}
			}
			_, _, get := r.offloadOld("hot")
			f := newTCPForger(t, r)
			header, _ := f.ask("version\r\n")
			forged := after(header, len("version\r\n"))
			tc.forge(t, forged)
			f.inject(forged, tc.payload, tc.badChecksum)
			deleteSeen(t, f, get)
		})
	}
}

// A SYN on an established connection: the kernel answers it with a
// challenge ACK and drops it, and the connection goes on. The tracker
// started the connection's state anew at every SYN, so after a forged one
// below the connection's sequence numbers every honest segment was past a
// gap and dropped: the connection hung. Its state starts at memcached's
// SYN-ACK now, and the delete after the forged SYN is seen.
func TestTrackerForgedSYN(t *testing.T) {
	r := newRig(t)
	_, _, get := r.offloadOld("hot")
	f := newTCPForger(t, r)
	header, _ := f.ask("version\r\n")
	syn := after(header, -1<<20)
	syn[13] = 0x02                         // SYN alone
	binary.BigEndian.PutUint32(syn[8:], 0) // no ACK
	f.inject(syn, "", false)
	deleteSeen(t, f, get)
}

// deleteSeen deletes hot over f's connection after a forged segment was
// injected on it, and wants no GET of hot answered with its old value by
// the kernel afterwards. memcached answers DELETED only if it read no
// forged bytes before (else it answers the forged request first).
func deleteSeen(t *testing.T, f *tcpForger, get func() string) {
	t.Helper()
	time.Sleep(50 * time.Millisecond)
	if line := f.send("delete hot\r\n"); line != "DELETED\r\n" {
		t.Fatalf("delete hot: %q; want DELETED (the kernel took the forged segment)", line)
	}
	for range 3 {
		if got := get(); got == "old" {
			t.Fatalf("GET of hot after memcached deleted it: %q from the kernel", got)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// The client's own bytes sent again pass the tracker's check, also two
// segments in one (a retransmission may join them) and one of them alone;
// other bytes at parsed sequence numbers, or a segment that starts inside
// a parsed one, lose the connection.
func TestTrackerChecksResentBytes(t *testing.T) {
	r, tr := newTrackerRig(t)
	for _, tc := range []struct {
		name    string
		resend  func(f *tcpForger, first, second []byte)
		counter string // the one the resend bumps; none: the connection stays tracked
	}{
		{"two segments in one", func(f *tcpForger, first, _ []byte) { f.inject(first, "version\r\nget a\r\n", false) }, ""},
		{"the second", func(f *tcpForger, _, second []byte) { f.inject(second, "get a\r\n", false) }, ""},
		{"other bytes", func(f *tcpForger, _, second []byte) { f.inject(second, "get b\r\n", false) }, "resent_differ"},
		{"from inside a segment", func(f *tcpForger, first, _ []byte) { f.inject(after(first, 1), "ersion\r\n", false) }, "resent_unchecked"},
	} {
		was, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		f := newTCPForger(t, r)
		first, _ := f.ask("version\r\n")
		second, _ := f.ask("get a\r\n")
		tc.resend(f, first, second)
		// the kernel takes none of the resent bytes: memcached answers this get alone
		if line := f.send("get c\r\n"); line != "END\r\n" {
			t.Fatalf("%s: get c: %q, want END", tc.name, line)
		}
		now, err := tr.Counters()
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range []string{"resent_differ", "resent_unchecked", "lost_flows"} {
			want := uint64(0)
			if tc.counter != "" && (name == tc.counter || name == "lost_flows") {
				want = 1
			}
			if got := now[name] - was[name]; got != want {
				t.Errorf("%s: %s went up by %d, want %d (counters %v)", tc.name, name, got, want, now)
			}
		}
	}
}

// l4Checksum is the TCP or UDP checksum of segment (its checksum field
// zero) from src to dst.
func l4Checksum(src, dst netip.Addr, proto byte, segment []byte) uint16 {
	// the pseudo-header's sum, the same for IPv4's layout and IPv6's
	pseudo := append(append(src.AsSlice(), dst.AsSlice()...), 0, proto, byte(len(segment)>>8), byte(len(segment)))
	var sum uint32
	for _, b := range [][]byte{pseudo, segment} {
		for i := 0; i < len(b); i += 2 {
			w := uint32(b[i]) << 8
			if i+1 < len(b) {
				w |= uint32(b[i+1])
			}
			sum += w
		}
	}
	for sum > 0xffff {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}

func htons(v uint16) uint16 { return v<<8 | v>>8 }
