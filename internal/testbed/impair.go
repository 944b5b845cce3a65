//go:build linux

package testbed

import (
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// An impaired testbed has a third namespace between client and server, in
// which a forwarder of this process (AF_PACKET sockets, one goroutine pair
// per direction) passes every Ethernet frame to the other side, dropping,
// delaying, reordering and duplicating frames as configured:
//
//	client netns          middle netns (…-mid)                server netns
//	┌─────────────┐       ┌─────────────────────────────┐     ┌──────────────┐
//	│ cv<pid>n<n> ┼─veth──┼ mc<pid>n<n>     ms<pid>n<n> ┼─veth┼ sv<pid>n<n>  │
//	│ 198.18.X.2  │       │  (no addresses, no IPv6)    │     │ 198.18.X.1   │
//	│ xdp_pass    │       │ xdp_pass          xdp_pass  │     │ (Santa's XDP)│
//	└─────────────┘       │     └── Go forwarder ──┘    │     └──────────────┘
//	                      └─────────────────────────────┘
//
// Unlike a netem qdisc on the server veth (not available on the test
// machines anyway), the forwarder also sees the frames an XDP program on
// the server veth sends with XDP_TX, which never pass a qdisc.
//
// Client and server keep their interface names, MACs, addresses and
// static neighbour entries: the middle forwards L2 frames unchanged, so the
// two ends see each other exactly as in the normal testbed. GRO, GSO, TSO
// and tx checksum offload are off on all four veth ends, so every frame is
// one packet of at most MTU size with its checksums filled in (a frame
// copied through user space keeps no "checksum to be done" mark).
//
// xdp_pass is attached to both middle interfaces: a frame sent with
// XDP_TX on a veth is only delivered if its peer has NAPI enabled, i.e. an
// XDP program (or GRO, which is off here). Without it on ms<pid>n<n>,
// XDP_TX replies of the server would be lost (TestImpairXDPTX shows it).

// Impairment is what the forwarder does to the unicast frames of one
// direction. The zero value forwards every frame at once, unchanged.
//
// Multicast and broadcast frames are forwarded at once and never impaired
// (counted as Multicast, not as Received): on this link they are only the
// MLD reports the ends send at random times for a second or two after
// their interfaces come up, and impairing them would make the counters and
// the random decisions depend on that timing.
type Impairment struct {
	// Loss is the probability that a frame is dropped.
	Loss float64
	// Reorder is the probability that a frame is held back and sent right
	// after the next frame of the same direction (or after ReorderWait if
	// no next frame comes). At most one frame is held at a time.
	Reorder float64
	// ReorderWait is the longest a held frame waits; 0: 10 ms.
	ReorderWait time.Duration
	// Delay is added to every frame.
	Delay time.Duration
	// Jitter adds a uniformly random amount in [-Jitter, +Jitter] to Delay
	// (not below 0). As with netem, frames can then overtake each other.
	Jitter time.Duration
	// Duplicate is the probability that a frame is sent twice (back to
	// back).
	Duplicate float64
}

func (i Impairment) validate() error {
	for _, p := range []struct {
		name string
		v    float64
	}{{"Loss", i.Loss}, {"Reorder", i.Reorder}, {"Duplicate", i.Duplicate}} {
		if p.v < 0 || p.v > 1 || p.v != p.v {
			return fmt.Errorf("impairment: %s %v not a probability", p.name, p.v)
		}
	}
	if i.Delay < 0 || i.Jitter < 0 || i.ReorderWait < 0 {
		return errors.New("impairment: negative duration")
	}
	return nil
}

// Direction is one direction of the impaired link.
type Direction int

const (
	ToServer Direction = iota // frames from the client to the server
	ToClient                  // frames from the server to the client
)

func (d Direction) String() string {
	switch d {
	case ToServer:
		return "to-server"
	case ToClient:
		return "to-client"
	}
	return "Direction(" + strconv.Itoa(int(d)) + ")"
}

// ImpairOptions configure the middle of an impaired testbed.
type ImpairOptions struct {
	ToServer, ToClient Impairment // the impairment of each direction (changeable with Link.Set)
	// Seed seeds the random decisions (each direction has its own
	// generator seeded from it), so a run is reproducible for the same
	// sequence of frames. 0: 1.
	Seed int64
	// QueueLimit is the most frames one direction holds (delayed or
	// waiting to be processed); beyond it frames are dropped and counted
	// as Overflow. 0: 65536.
	QueueLimit int
}

// LinkCounters count the frames of one direction of an impaired link.
type LinkCounters struct {
	Received   uint64 // unicast frames read from the sending side
	Forwarded  uint64 // unicast frames written to the other side (duplicates included)
	Dropped    uint64 // frames dropped by Loss
	Reordered  uint64 // frames held back by Reorder
	Duplicated uint64 // frames sent twice by Duplicate
	// Overflow are frames dropped because QueueLimit was reached;
	// SocketDrops are frames the kernel dropped because the forwarder did
	// not read them in time (PACKET_STATISTICS); SendErrors are frames
	// the kernel refused to send.
	Overflow, SocketDrops, SendErrors uint64
	// CsumNotReady are frames read without their checksums filled in
	// (the sender has tx checksum offload on again): forwarded as they
	// are, the receiver drops them.
	CsumNotReady uint64
	// Multicast are multicast and broadcast frames, forwarded as they
	// came (see Impairment).
	Multicast uint64
	// MaxFrame is the largest frame read, in bytes with the Ethernet
	// header (1514 at most with MTU 1500 and no offloads; 1518 with an
	// 802.1Q tag).
	MaxFrame uint64
}

// Link is the middle namespace of an impaired testbed and its forwarder.
type Link struct {
	NS            string // the middle namespace (…-mid)
	ServerDev     string // the middle's veth facing the server (ms<pid>n<n>), peer of tb.Server.Dev
	ClientDev     string // the middle's veth facing the client (mc<pid>n<n>), peer of tb.Client.Dev
	ServerIfindex int    // ifindex of ServerDev in NS
	ClientIfindex int    // ifindex of ClientDev in NS

	pass       *ebpf.Program
	queueLimit int
	files      []*os.File // the two packet sockets
	dirs       [2]*linkDir
	wg         sync.WaitGroup
	stop       chan struct{}
	closeOnce  sync.Once
	closeErr   error

	statsMu     sync.Mutex
	closed      bool
	socketDrops [2]uint64 // PACKET_STATISTICS drops so far
}

// NewImpaired creates a testbed whose client and server are joined
// through an impairing middle namespace (see Impairment), for a test, and
// removes it with t.Cleanup (the forwarder first). It fails the test when
// not running as root or when setup fails.
func NewImpaired(t testing.TB, o Options, io ImpairOptions) (*Testbed, *Link) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("testbed: needs root (network namespaces, XDP): run the tests as root")
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	tb, l, err := CreateImpaired(o, io)
	if err != nil {
		t.Fatalf("testbed: %v", err)
	}
	t.Cleanup(func() {
		if err := tb.Close(); err != nil {
			t.Errorf("testbed close: %v", err)
		}
	})
	return tb, l
}

// CreateImpaired builds an impaired testbed outside of a test. The caller
// must call tb.Close, which also stops the forwarder and removes the
// middle namespace; on error CreateImpaired cleans up itself. It first
// removes middle namespaces left behind by dead processes.
func CreateImpaired(o Options, io ImpairOptions) (*Testbed, *Link, error) {
	if err := io.ToServer.validate(); err != nil {
		return nil, nil, err
	}
	if err := io.ToClient.validate(); err != nil {
		return nil, nil, err
	}
	if _, err := removeStaleMiddles(); err != nil && o.Logf != nil {
		o.Logf("testbed: removing stale middle namespaces: %v", err)
	}
	tb, err := Create(o)
	if err != nil {
		return nil, nil, err
	}
	l, err := tb.insertMiddle(o, io)
	if err != nil {
		if cerr := tb.Close(); cerr != nil {
			tb.logf("testbed: cleanup after failed setup: %v", cerr)
		}
		return nil, nil, fmt.Errorf("testbed %s: middle: %w", tb.ID, err)
	}
	tb.logf("testbed %s: impaired through %s (%s, %s)", tb.ID, l.NS, l.ClientDev, l.ServerDev)
	return tb, l, nil
}

// insertMiddle replaces the testbed's veth pair by two pairs through a
// middle namespace and starts the forwarder.
func (tb *Testbed) insertMiddle(o Options, io ImpairOptions) (*Link, error) {
	s, c := &tb.Server, &tb.Client
	suffix := strings.TrimPrefix(s.Dev, "sv") // sv<pid>n<n>
	l := &Link{
		NS:         tb.ID + "-mid",
		ServerDev:  "ms" + suffix,
		ClientDev:  "mc" + suffix,
		stop:       make(chan struct{}),
		queueLimit: io.QueueLimit,
	}
	if l.queueLimit <= 0 {
		l.queueLimit = 65536
	}
	if _, err := Run("", "ip", "netns", "add", l.NS); err != nil {
		return nil, err
	}
	tb.addCleanup(func() error {
		_, err := Run("", "ip", "netns", "del", l.NS)
		return err
	})
	// Nothing in the middle has IPv6 (no link-local address, no MLD or
	// ND), and nothing has an IPv4 address: the kernel neither sends nor
	// answers anything there.
	err := Do(l.NS, func() error {
		for _, k := range []string{"all", "default"} {
			if err := os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("sysctl in %s: %w", l.NS, err)
	}
	// Deleting a middle end removes its peer too; do it before the
	// namespaces go (see setup).
	for _, dev := range []string{l.ServerDev, l.ClientDev} {
		dev := dev
		tb.addCleanup(func() error {
			if !nsExists(l.NS) {
				return nil
			}
			out, err := Run("", "ip", "-n", l.NS, "link", "del", dev)
			if err != nil && strings.Contains(out, "Cannot find device") {
				return nil
			}
			return err
		})
	}

	// Replace the direct pair by one pair per side.
	if _, err := Run("", "ip", "-n", s.NS, "link", "del", s.Dev); err != nil {
		return nil, err
	}
	q := strconv.Itoa(max(o.Queues, 1))
	for _, p := range []struct {
		side *Side
		mid  string
		mac  net.HardwareAddr
	}{
		{s, l.ServerDev, net.HardwareAddr{0x02, 0x5a, 0x00, s.MAC[3], s.MAC[4], 0x03}},
		{c, l.ClientDev, net.HardwareAddr{0x02, 0x5a, 0x00, s.MAC[3], s.MAC[4], 0x04}},
	} {
		if _, err := Run("", "ip", "link", "add", p.side.Dev, "address", p.side.MAC.String(), "netns", p.side.NS,
			"numtxqueues", q, "numrxqueues", q,
			"type", "veth", "peer", "name", p.mid, "address", p.mac.String(), "netns", l.NS,
			"numtxqueues", q, "numrxqueues", q); err != nil {
			return nil, err
		}
	}

	// Client and server ends: as in setup, plus no offloads.
	for _, side := range []*Side{s, c} {
		peer := c
		if side == c {
			peer = s
		}
		if err := side.setUp(peer); err != nil {
			return nil, err
		}
		if _, err := side.Run("ethtool", "-K", side.Dev, "gro", "off", "gso", "off", "tso", "off", "tx", "off"); err != nil {
			return nil, err
		}
	}
	if !o.NoClientPass {
		if err := tb.AttachClientPass(); err != nil {
			return nil, err
		}
	}

	// Middle ends: no offloads, xdp_pass, up.
	for _, dev := range []string{l.ServerDev, l.ClientDev} {
		if _, err := Run(l.NS, "ethtool", "-K", dev, "gro", "off", "gso", "off", "tso", "off", "tx", "off"); err != nil {
			return nil, err
		}
		if _, err := Run("", "ip", "-n", l.NS, "link", "set", dev, "up"); err != nil {
			return nil, err
		}
	}
	err = Do(l.NS, func() error {
		for _, x := range []struct {
			dev string
			idx *int
		}{{l.ServerDev, &l.ServerIfindex}, {l.ClientDev, &l.ClientIfindex}} {
			ifi, err := net.InterfaceByName(x.dev)
			if err != nil {
				return err
			}
			*x.idx = ifi.Index
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", l.NS, err)
	}
	prog, err := NewXDPPass()
	if err != nil {
		return nil, fmt.Errorf("load xdp_pass: %w", err)
	}
	l.pass = prog
	tb.addCleanup(prog.Close)
	if err := l.AttachPass(); err != nil {
		return nil, err
	}

	if err := l.start(io); err != nil {
		return nil, err
	}
	tb.addCleanup(l.Close)
	return l, nil
}

// AttachPass (re)attaches xdp_pass to both middle interfaces in native
// mode (through netlink, like AttachClientPass).
func (l *Link) AttachPass() error {
	for _, x := range []struct {
		dev string
		idx int
	}{{l.ServerDev, l.ServerIfindex}, {l.ClientDev, l.ClientIfindex}} {
		if err := AttachXDPNetlink(l.NS, x.idx, l.pass, XDPModeDriver); err != nil {
			return fmt.Errorf("attach xdp_pass to %s: %w", x.dev, err)
		}
	}
	return nil
}

// Do runs f inside the middle namespace (see Do).
func (l *Link) Do(f func() error) error { return Do(l.NS, f) }

// Run runs a command inside the middle namespace (e.g. tcpdump).
func (l *Link) Run(name string, args ...string) (string, error) { return Run(l.NS, name, args...) }

// Set changes the impairment of one direction; it applies to the frames
// read from then on.
func (l *Link) Set(d Direction, imp Impairment) error {
	if err := imp.validate(); err != nil {
		return err
	}
	l.dirs[d].imp.Store(&imp)
	return nil
}

// SetBoth changes the impairment of both directions.
func (l *Link) SetBoth(imp Impairment) error {
	if err := l.Set(ToServer, imp); err != nil {
		return err
	}
	return l.Set(ToClient, imp)
}

// SetLoss changes only the loss probability of both directions.
func (l *Link) SetLoss(p float64) error {
	for _, d := range []Direction{ToServer, ToClient} {
		imp := l.Impairment(d)
		imp.Loss = p
		if err := l.Set(d, imp); err != nil {
			return err
		}
	}
	return nil
}

// Impairment returns the current impairment of one direction.
func (l *Link) Impairment(d Direction) Impairment { return *l.dirs[d].imp.Load() }

// Counters returns the counters of one direction so far.
func (l *Link) Counters(d Direction) LinkCounters {
	x := l.dirs[d]
	c := LinkCounters{
		Received:     x.received.Load(),
		Forwarded:    x.forwarded.Load(),
		Dropped:      x.dropped.Load(),
		Reordered:    x.reordered.Load(),
		Duplicated:   x.duplicated.Load(),
		Overflow:     x.overflow.Load(),
		SendErrors:   x.sendErrors.Load(),
		CsumNotReady: x.csumNotReady.Load(),
		Multicast:    x.multicast.Load(),
		MaxFrame:     x.maxFrame.Load(),
	}
	l.statsMu.Lock()
	defer l.statsMu.Unlock()
	if !l.closed {
		// PACKET_STATISTICS resets on every read: keep the sum.
		_ = x.in.Control(func(fd uintptr) {
			if st, err := unix.GetsockoptTpacketStats(int(fd), unix.SOL_PACKET, unix.PACKET_STATISTICS); err == nil {
				l.socketDrops[d] += uint64(st.Drops)
			}
		})
	}
	c.SocketDrops = l.socketDrops[d]
	return c
}

// Close stops the forwarder and closes its sockets; frames are no longer
// forwarded. Safe to call more than once; the testbed calls it on Close.
func (l *Link) Close() error {
	l.closeOnce.Do(func() {
		close(l.stop)
		l.statsMu.Lock()
		l.closed = true
		l.statsMu.Unlock()
		for _, f := range l.files {
			if err := f.Close(); err != nil {
				l.closeErr = errors.Join(l.closeErr, err)
			}
		}
		done := make(chan struct{})
		go func() { l.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			l.closeErr = errors.Join(l.closeErr, errors.New("impaired link: forwarder did not stop within 5 s"))
		}
	})
	return l.closeErr
}

// --- forwarder ---

// linkDir is one direction: a reader goroutine reads frames from in and
// hands them to a pump goroutine, which applies the impairment (all
// random decisions are its own, so they are reproducible) and writes the
// frames to out when they are due.
type linkDir struct {
	in, out   syscall.RawConn // the packet sockets of the receiving and the sending side
	imp       atomic.Pointer[Impairment]
	rng       *rand.Rand
	ch        chan []byte
	limit     int
	received  atomic.Uint64
	forwarded atomic.Uint64
	dropped   atomic.Uint64
	reordered atomic.Uint64
	// duplicated … csumNotReady: see LinkCounters.
	duplicated, overflow, sendErrors, csumNotReady, multicast, maxFrame atomic.Uint64
}

// OpenPacket opens an AF_PACKET raw socket bound to ifindex that receives
// only the frames arriving on it (not the ones sent from it) with their
// auxiliary data. Call inside the interface's namespace.
func OpenPacket(ifindex int) (*os.File, error) {
	// Protocol 0 until bind: no frames of other interfaces are queued.
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_NONBLOCK|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("packet socket: %w", err)
	}
	for _, o := range []struct {
		level, opt, v int
	}{
		{unix.SOL_PACKET, unix.PACKET_IGNORE_OUTGOING, 1},
		{unix.SOL_PACKET, unix.PACKET_AUXDATA, 1},
		{unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8 << 20},
		{unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, 8 << 20},
	} {
		if err := unix.SetsockoptInt(fd, o.level, o.opt, o.v); err != nil {
			unix.Close(fd)
			return nil, fmt.Errorf("packet socket option %d/%d: %w", o.level, o.opt, err)
		}
	}
	all := htons(unix.ETH_P_ALL)
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: all, Ifindex: ifindex}); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("packet socket bind to ifindex %d: %w", ifindex, err)
	}
	return os.NewFile(uintptr(fd), fmt.Sprintf("packet:%d", ifindex)), nil
}

// sizeofTpacketAuxdata is sizeof(struct tpacket_auxdata).
const sizeofTpacketAuxdata = 20

func htons(v uint16) uint16 { return v<<8 | v>>8 }

func (l *Link) start(io ImpairOptions) error {
	var rc [2]syscall.RawConn // of ServerDev, ClientDev
	err := Do(l.NS, func() error {
		for i, idx := range []int{l.ServerIfindex, l.ClientIfindex} {
			f, err := OpenPacket(idx)
			if err != nil {
				return err
			}
			l.files = append(l.files, f)
			if rc[i], err = f.SyscallConn(); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		for _, f := range l.files {
			f.Close()
		}
		l.files = nil
		return err
	}
	seed := io.Seed
	if seed == 0 {
		seed = 1
	}
	for d, x := range []struct {
		in, out syscall.RawConn
		imp     Impairment
	}{
		ToServer: {rc[1], rc[0], io.ToServer},
		ToClient: {rc[0], rc[1], io.ToClient},
	} {
		ld := &linkDir{
			in: x.in, out: x.out,
			rng:   rand.New(rand.NewSource(seed*2 + int64(d))),
			ch:    make(chan []byte, 4096),
			limit: l.queueLimit,
		}
		imp := x.imp
		ld.imp.Store(&imp)
		l.dirs[d] = ld
	}
	for _, ld := range l.dirs {
		l.wg.Add(2)
		go func() { defer l.wg.Done(); ld.read() }()
		go func() { defer l.wg.Done(); ld.pump(l.stop) }()
	}
	return nil
}

// read reads frames until the socket is closed.
func (x *linkDir) read() {
	defer close(x.ch)
	buf := make([]byte, 65536)
	oob := make([]byte, unix.CmsgSpace(sizeofTpacketAuxdata))
	for {
		var n, oobn int
		var rerr error
		err := x.in.Read(func(fd uintptr) bool {
			n, oobn, _, _, rerr = unix.Recvmsg(int(fd), buf, oob, 0)
			return rerr != unix.EAGAIN
		})
		if err != nil {
			return // closed
		}
		if rerr != nil {
			continue
		}
		f, csumNotReady := withVLAN(buf[:n], oob[:oobn])
		if len(f) >= 6 && f[0]&1 != 0 { // group bit of the destination MAC
			x.multicast.Add(1)
			if !x.write(f) {
				x.multicast.Add(^uint64(0))
			}
			continue
		}
		x.received.Add(1)
		if csumNotReady {
			x.csumNotReady.Add(1)
		}
		if l := uint64(len(f)); l > x.maxFrame.Load() {
			x.maxFrame.Store(l) // only this goroutine stores
		}
		select {
		case x.ch <- f:
		default:
			x.overflow.Add(1)
		}
	}
}

// withVLAN returns a copy of frame with the 802.1Q tag the kernel moved
// into the auxiliary data put back in place, and whether the frame's
// checksum was not filled in.
func withVLAN(frame, oob []byte) ([]byte, bool) {
	var aux *unix.TpacketAuxdata
	if msgs, err := unix.ParseSocketControlMessage(oob); err == nil {
		for _, m := range msgs {
			if m.Header.Level == unix.SOL_PACKET && m.Header.Type == unix.PACKET_AUXDATA && len(m.Data) >= sizeofTpacketAuxdata {
				aux = &unix.TpacketAuxdata{
					Status:    binary.NativeEndian.Uint32(m.Data[0:]),
					Vlan_tci:  binary.NativeEndian.Uint16(m.Data[16:]),
					Vlan_tpid: binary.NativeEndian.Uint16(m.Data[18:]),
				}
			}
		}
	}
	if aux == nil || aux.Status&unix.TP_STATUS_VLAN_VALID == 0 || len(frame) < 12 {
		return append([]byte(nil), frame...), aux != nil && aux.Status&unix.TP_STATUS_CSUMNOTREADY != 0
	}
	tpid := uint16(unix.ETH_P_8021Q)
	if aux.Status&unix.TP_STATUS_VLAN_TPID_VALID != 0 {
		tpid = aux.Vlan_tpid
	}
	f := make([]byte, 0, len(frame)+4)
	f = append(f, frame[:12]...)
	f = binary.BigEndian.AppendUint16(f, tpid)
	f = binary.BigEndian.AppendUint16(f, aux.Vlan_tci)
	f = append(f, frame[12:]...)
	return f, aux.Status&unix.TP_STATUS_CSUMNOTREADY != 0
}

// pending is a frame waiting to be sent, copies times.
type pending struct {
	b      []byte
	copies int
	due    time.Time
	seq    uint64
}

type pendingHeap []*pending

func (h pendingHeap) Len() int { return len(h) }
func (h pendingHeap) Less(i, j int) bool {
	if !h[i].due.Equal(h[j].due) {
		return h[i].due.Before(h[j].due)
	}
	return h[i].seq < h[j].seq
}
func (h pendingHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *pendingHeap) Push(x any)   { *h = append(*h, x.(*pending)) }
func (h *pendingHeap) Pop() any {
	old := *h
	p := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return p
}

// pump applies the impairment to the frames from the reader and sends
// them when due, until stop is closed or the reader ends.
func (x *linkDir) pump(stop <-chan struct{}) {
	var (
		q        pendingHeap
		held     *pending
		heldTill time.Time
		seq      uint64
	)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		now := time.Now()
		for q.Len() > 0 && !q[0].due.After(now) {
			x.send(heap.Pop(&q).(*pending))
			if held != nil {
				x.send(held) // after the frame that overtook it
				held = nil
			}
		}
		if held != nil && !heldTill.After(now) {
			x.send(held)
			held = nil
		}
		var wake time.Time
		if q.Len() > 0 {
			wake = q[0].due
		}
		if held != nil && (wake.IsZero() || heldTill.Before(wake)) {
			wake = heldTill
		}
		var tc <-chan time.Time
		if !wake.IsZero() {
			timer.Reset(time.Until(wake))
			tc = timer.C
		}
		select {
		case <-stop:
			return
		case <-tc:
		case b, ok := <-x.ch:
			if !ok {
				return
			}
			now = time.Now()
			imp := x.imp.Load()
			if imp.Loss > 0 && x.rng.Float64() < imp.Loss {
				x.dropped.Add(1)
				continue
			}
			p := &pending{b: b, copies: 1, due: now.Add(imp.Delay), seq: seq}
			seq++
			if imp.Jitter > 0 {
				p.due = p.due.Add(time.Duration(x.rng.Int63n(2*int64(imp.Jitter)+1)) - imp.Jitter)
				if p.due.Before(now) {
					p.due = now
				}
			}
			if imp.Duplicate > 0 && x.rng.Float64() < imp.Duplicate {
				p.copies = 2
				x.duplicated.Add(1)
			}
			if held == nil && imp.Reorder > 0 && x.rng.Float64() < imp.Reorder {
				held = p
				wait := imp.ReorderWait
				if wait == 0 {
					wait = 10 * time.Millisecond
				}
				heldTill = p.due.Add(wait)
				x.reordered.Add(1)
				continue
			}
			if q.Len() >= x.limit {
				x.overflow.Add(1)
				continue
			}
			heap.Push(&q, p)
		}
	}
}

// send writes p's frame to the other side, p.copies times. Forwarded is
// counted before the write, so it is never behind what the receiver got.
func (x *linkDir) send(p *pending) {
	for i := 0; i < p.copies; i++ {
		x.forwarded.Add(1)
		if !x.write(p.b) {
			x.forwarded.Add(^uint64(0))
		}
	}
}

// write sends one frame to the other side; a failure is counted.
func (x *linkDir) write(b []byte) bool {
	var werr error
	err := x.out.Write(func(fd uintptr) bool {
		_, werr = unix.Write(int(fd), b)
		return werr != unix.EAGAIN
	})
	if err != nil || werr != nil {
		x.sendErrors.Add(1)
		return false
	}
	return true
}

// removeStaleMiddles deletes middle namespaces (santa-<pid>-<n>-mid) of
// processes that no longer exist. RemoveStale removes their client and
// server namespaces.
func removeStaleMiddles() ([]string, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		f := strings.Split(e.Name(), "-")
		if len(f) != 4 || f[0] != "santa" || f[3] != "mid" {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 || pid == os.Getpid() || syscall.Kill(pid, 0) == nil {
			continue
		}
		if _, err := Run("", "ip", "netns", "del", e.Name()); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, e.Name())
	}
	return removed, errors.Join(errs...)
}
