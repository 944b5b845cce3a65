package daemon_test

import (
	"net"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
	"github.com/vishvananda/netlink"
)

// TestAddressUpdatesOverflow: santad learns of the server's addresses
// through a netlink subscription, which ends when more address events come
// than its socket holds (ENOBUFS). santad subscribes again and reads the
// addresses as they are. Here santad is stopped (SIGSTOP) through a burst
// of address events, so that its socket overflows for certain; once it has
// read what was queued, a failover address moves to another host (removed
// here) and another one arrives. A real client's requests to them must
// meet what the kernel does: the removed one is not answered (the server's
// kernel would not deliver it), the new one is.
func TestAddressUpdatesOverflow(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	const port = 7320
	target, err := santa.Socket(echoServer(t, tb, netip.AddrPortFrom(netip.IPv4Unspecified(), port)))
	if err != nil {
		t.Fatal(err)
	}
	addPingPong(t, sd.client(), target)
	serverAddr := func(last byte) (netip.AddrPort, *netlink.Addr) {
		ip := tb.Server.IP4.As4()
		ip[3] = last
		return netip.AddrPortFrom(netip.AddrFrom4(ip), port), &netlink.Addr{IPNet: &net.IPNet{IP: ip[:], Mask: net.CIDRMask(32, 32)}}
	}
	moved, movedAddr := serverAddr(77)
	arrived, arrivedAddr := serverAddr(78)
	_, busyAddr := serverAddr(79)
	addrOp := func(op func(netlink.Link, *netlink.Addr) error, a *netlink.Addr) error {
		link, err := netlink.LinkByName(tb.Server.Dev)
		if err != nil {
			return err
		}
		return op(link, a)
	}
	// waitReply sends "ping" to server until the reply is want ("": none
	// within 300 ms), for at most 5 s.
	waitReply := func(server netip.AddrPort, want, what string) {
		t.Helper()
		var got string
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); {
			if got = replyWithin(t, tb, server, "ping", 300*time.Millisecond); got == want {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatalf("%s: %v replies %q, want %q", what, server, got, want)
	}

	inServer(t, tb, func() error { return addrOp(netlink.AddrAdd, movedAddr) })
	waitReply(moved, "pong", "an address of the server")

	overflow(t, sd, "address updates", func(deadline time.Time) error {
		for i := 0; i < overflowBurst && time.Now().Before(deadline); i++ {
			if err := addrOp(netlink.AddrAdd, busyAddr); err != nil {
				return err
			}
			if err := addrOp(netlink.AddrDel, busyAddr); err != nil {
				return err
			}
		}
		return nil
	})
	// santad has then handled the updates read before the overflow, which
	// said it has no more to read; an unfixed santad never says this.
	for deadline := time.Now().Add(2 * time.Second); !strings.Contains(sd.Log(), "address updates ended") && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}

	notLocal := passedNotLocal(t, sd)
	inServer(t, tb, func() error { return addrOp(netlink.AddrDel, movedAddr) })
	inServer(t, tb, func() error { return addrOp(netlink.AddrAdd, arrivedAddr) })
	waitReply(moved, "", "removed from the server after the overflow")
	if n := passedNotLocal(t, sd); n <= notLocal {
		t.Errorf("pass_not_local %d, was %d: the requests to %v did not reach the rule processor", n, notLocal, moved)
	}
	waitReply(arrived, "pong", "added to the server after the overflow")
	if !strings.Contains(sd.Log(), "address updates ended: subscribing again") {
		t.Errorf("santad's log does not say it is subscribing again")
	}
}

// overflowBurst is how many netlink events of a kind overflow a
// subscription's socket for certain: several times what it holds.
const overflowBurst = 2000

// overflow makes santad's subscription to what ("address updates") end:
// santad is stopped (SIGSTOP) while burst, run in the server's namespace,
// makes the kernel queue more events than the subscription's socket holds
// (until deadline, 10 s away), and resumed; it then reads ENOBUFS.
func overflow(t *testing.T, sd *santadProc, what string, burst func(deadline time.Time) error) {
	t.Helper()
	pid := sd.PID()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	resume := func() { syscall.Kill(pid, syscall.SIGCONT) }
	t.Cleanup(resume)
	deadline := time.Now().Add(10 * time.Second)
	if err := sd.tb.Server.Do(func() error { return burst(deadline) }); err != nil {
		t.Fatal(err)
	}
	resume()
	overflowed := regexp.MustCompile(regexp.QuoteMeta(what) + `\W.*no buffer space available`)
	for deadline := time.Now().Add(5 * time.Second); !overflowed.MatchString(sd.Log()); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the burst did not overflow santad's subscription to %s (no ENOBUFS in its log)", what)
		}
	}
}

// replyWithin sends payload from the client namespace to server once and
// returns the reply, "" if none comes within wait.
func replyWithin(t *testing.T, tb *testbed.Testbed, server netip.AddrPort, payload string, wait time.Duration) string {
	t.Helper()
	c, err := tb.DialUDP(server)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte(payload)); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return ""
	}
	return string(buf[:n])
}

// passedNotLocal is santad's count of requests passed as not for this host.
func passedNotLocal(t *testing.T, sd *santadProc) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^santa_dataplane_events_total\{event="pass_not_local"\} (\d+)$`).FindStringSubmatch(sd.scrape())
	if m == nil {
		return 0 // not yet counted
	}
	n, err := strconv.Atoi(m[1])
	if err != nil {
		t.Fatalf("pass_not_local: %v", err)
	}
	return n
}
