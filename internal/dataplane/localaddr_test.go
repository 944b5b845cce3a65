package dataplane

import (
	"bytes"
	"log/slog"
	"net"
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// TestLocalAddressesAfterUpdatesOverflow: the rule processor learns of the
// host's addresses through a netlink subscription, which the kernel ends
// when more address events come than its socket holds (ENOBUFS). The
// tracker subscribes again and syncs santa_local_addrs with the addresses
// as they are. Here its reader is stalled in-process through a burst of
// address events, so that its socket overflows for certain, and the
// addresses that matter change only once that subscription has ended: a
// failover address moves to another host (removed here) and another one
// arrives. Only a sync after subscribing again can learn of them.
func TestLocalAddressesAfterUpdatesOverflow(t *testing.T) {
	requireRoot(t)
	logged := &lockedBuffer{}
	defaultLog := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(logged, nil)))
	t.Cleanup(func() { slog.SetDefault(defaultLog) })
	e := newEnv(t, Config{})
	const port = 7310
	e.bindRules(e.socket(netip.AddrPortFrom(netip.IPv6Unspecified(), port), false), reply("Hello", "COMSYS"))
	c4, s4 := fixtureAddrs(e, false, port)
	hostAddr := func(last byte) *netlink.Addr {
		ip := s4.Addr().As4()
		ip[3] = last
		return &netlink.Addr{IPNet: &net.IPNet{IP: ip[:], Mask: net.CIDRMask(32, 32)}}
	}
	moved, arrived, busy := hostAddr(77), hostAddr(78), hostAddr(79)
	addrOp := func(op func(netlink.Link, *netlink.Addr) error, a *netlink.Addr) error {
		return e.tb.Server.Do(func() error {
			link, err := netlink.LinkByName(e.tb.Server.Dev)
			if err != nil {
				return err
			}
			return op(link, a)
		})
	}
	requestTo := func(a *netlink.Addr) udpPacket {
		dst, _ := netip.AddrFromSlice(a.IP)
		return request(c4, netip.AddrPortFrom(dst, port), "Hello")
	}
	waitVerdict := func(a *netlink.Addr, want uint32, what string) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			if got, _ := e.run(requestTo(a).build(t)); got == want {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: verdict still not %d after 5 s", what, want)
			}
		}
	}
	waitLogged := func(text string, within time.Duration) bool {
		for deadline := time.Now().Add(within); !strings.Contains(logged.String(), text); time.Sleep(10 * time.Millisecond) {
			if time.Now().After(deadline) {
				return false
			}
		}
		return true
	}

	if err := addrOp(netlink.AddrAdd, moved); err != nil {
		t.Fatal(err)
	}
	waitVerdict(moved, xdpTx, "an address of this host")

	// The tracker takes localMu to count an address it adds; holding it
	// stalls the tracker at the burst's first address while the kernel
	// keeps queueing events on the subscription's socket.
	const burst = 2000
	err := func() error {
		e.d.localMu.Lock()
		defer e.d.localMu.Unlock()
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; i < burst && time.Now().Before(deadline); i++ {
			if err := addrOp(netlink.AddrAdd, busy); err != nil {
				return err
			}
			if err := addrOp(netlink.AddrDel, busy); err != nil {
				return err
			}
		}
		return nil
	}()
	if err != nil {
		t.Fatal(err)
	}
	if !waitLogged("no buffer space available", 5*time.Second) {
		t.Fatalf("%d address events did not overflow the subscription (no ENOBUFS in the log):\n%s", 2*burst, logged)
	}
	// The tracker has then handled the updates read before the overflow,
	// which said it has no more to read; an unfixed one never says this.
	waitLogged("subscribing again", 2*time.Second)

	if err := addrOp(netlink.AddrDel, moved); err != nil {
		t.Fatal(err)
	}
	if err := addrOp(netlink.AddrAdd, arrived); err != nil {
		t.Fatal(err)
	}
	waitVerdict(moved, xdpPass, "address removed after the overflow")
	e.expect("address removed after the overflow", requestTo(moved).build(t), xdpPass, nil, "pass_not_local")
	waitVerdict(arrived, xdpTx, "address added after the overflow")
	req := requestTo(arrived)
	e.expect("address added after the overflow", req.build(t), xdpTx, req.answer([]byte("COMSYS")).build(t), "answered")
	if !strings.Contains(logged.String(), "address updates ended: subscribing again") {
		t.Errorf("the log does not say the tracker subscribes again:\n%s", logged)
	}
}

// lockedBuffer is a bytes.Buffer that the test reads while others log to it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}
