package daemon_test

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// A veth pair tests create beside the testbed's, in the server namespace.
const vethA, vethB = "santa-va", "santa-vb"

// createVeth creates vethA (with ifindex index; 0: any) and its peer vethB,
// up, in the calling thread's network namespace.
func createVeth(index int) error {
	v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: vethA, Index: index}, PeerName: vethB}
	if err := netlink.LinkAdd(v); err != nil {
		return err
	}
	return netlink.LinkSetUp(v)
}

// removeVeth removes vethA, and vethB with it.
func removeVeth() error {
	return netlink.LinkDel(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: vethA}})
}

// inServer runs f in the server namespace, failing t if it fails.
func inServer(t *testing.T, tb *testbed.Testbed, f func() error) {
	t.Helper()
	if err := tb.Server.Do(f); err != nil {
		t.Fatal(err)
	}
}

// vethXDP says which XDP programs vethA and vethB have (0: none).
func vethXDP(t *testing.T, tb *testbed.Testbed) (a, b uint32) {
	t.Helper()
	ids := [2]uint32{}
	for i, name := range []string{vethA, vethB} {
		inServer(t, tb, func() error {
			l, err := netlink.LinkByName(name)
			if err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
				ids[i] = l.Attrs().Xdp.ProgId
			}
			return err
		})
	}
	return ids[0], ids[1]
}

// interfaceMode is what santad's status says of interface name.
func interfaceMode(t *testing.T, c *santa.Client, name string) string {
	t.Helper()
	info, _, err := c.Health()
	if err != nil {
		t.Fatal(err)
	}
	for _, i := range info.Interfaces {
		if i.Name == name {
			return i.Mode
		}
	}
	t.Fatalf("%s is not among santad's interfaces %v", name, info.Interfaces)
	return ""
}

// santadOnVethA creates vethA and its peer, and starts santad on vethA
// with the rule processor attached.
func santadOnVethA(t *testing.T, tb *testbed.Testbed) (*santadProc, *santa.Client) {
	t.Helper()
	inServer(t, tb, func() error { return createVeth(0) })
	sd := newSantad(t, tb, "--interface", vethA)
	sd.start()
	c := sd.client()
	waitVethAttached(t, tb, c, "start")
	return sd, c
}

// waitVethAttached waits up to 5 s after what for status to say vethA is
// attached in native mode and for vethA and vethB to carry XDP programs.
// Status must never say so before vethA carries one.
func waitVethAttached(t *testing.T, tb *testbed.Testbed, c *santa.Client, what string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		m := interfaceMode(t, c, vethA)
		a, b := vethXDP(t, tb)
		if m == "native" && a == 0 {
			t.Fatalf("%s: status says %s is attached (native), but it has no XDP program", what, vethA)
		}
		if m == "native" && b != 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after %s: mode %q, XDP programs %d (%s) and %d (its peer); want native and both", what, m, a, vethA, b)
		}
	}
}

// TestInterfaceRemovedAndBack: the kernel detaches XDP from an interface
// that is removed. santad says so (status mode "removed", a warning) and,
// when an interface of that name is created again, attaches the rule
// processor to it (and the program to its veth peer) by itself.
func TestInterfaceRemovedAndBack(t *testing.T) {
	tb := testbed.New(t)
	sd, c := santadOnVethA(t, tb)
	inServer(t, tb, removeVeth)
	if m := interfaceMode(t, c, vethA); m != "removed" {
		t.Errorf("after %s was removed: mode %q, want removed", vethA, m)
	}
	inServer(t, tb, func() error { return createVeth(0) })
	waitVethAttached(t, tb, c, vethA+" was created again")
	for _, want := range []string{"interface removed", "interface is back"} {
		if !strings.Contains(sd.Log(), want) {
			t.Errorf("santad's log does not say %q", want)
		}
	}
}

// TestInterfaceMovedToOtherNamespace: an interface moved to another
// network namespace keeps santad's XDP link as far as the kernel is
// concerned (it is not removed), so santad detaches the rule processor from
// it itself (status mode "removed", a warning), and attaches it to a new
// interface of that name in its own namespace.
func TestInterfaceMovedToOtherNamespace(t *testing.T) {
	tb := testbed.New(t)
	sd, c := santadOnVethA(t, tb)
	moveToClient := func(name string) {
		t.Helper()
		if out, err := tb.Server.Run("ip", "link", "set", name, "netns", tb.Client.NS); err != nil {
			t.Fatalf("move %s to the client namespace: %v\n%s", name, err, out)
		}
	}
	xdpProgram := func(side testbed.Side, name string) uint32 {
		t.Helper()
		var prog uint32
		if err := side.Do(func() error {
			l, err := netlink.LinkByName(name)
			if err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
				prog = l.Attrs().Xdp.ProgId
			}
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return prog
	}
	moveToClient(vethA)
	if m := interfaceMode(t, c, vethA); m != "removed" {
		t.Errorf("after %s moved to another namespace: mode %q, want removed", vethA, m)
	}
	// neither it nor its other end, left behind, keeps a program of santad's
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		moved, peer := xdpProgram(tb.Client, vethA), xdpProgram(tb.Server, vethB)
		if moved == 0 && peer == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after %s moved to another namespace: XDP programs %d (%s) and %d (its peer); want none",
				vethA, moved, vethA, peer)
		}
	}
	moveToClient(vethB) // a new pair takes both names
	inServer(t, tb, func() error { return createVeth(0) })
	waitVethAttached(t, tb, c, vethA+" was created anew after the old one moved away")
	for _, want := range []string{"interface left santad's network namespace", "interface is back"} {
		if !strings.Contains(sd.Log(), want) {
			t.Errorf("santad's log does not say %q", want)
		}
	}
}

// TestInterfaceRecreatedSameIndex: an interface removed and created again
// may get its old ifindex (`ip link add ... index N`, or the kernel handing
// out a freed index again). It is still another interface, without the rule
// processor: status says removed once the old one is gone, and santad
// attaches to the new one, whether it saw the removal before the new
// interface appeared or not.
func TestInterfaceRecreatedSameIndex(t *testing.T) {
	tb := testbed.New(t)
	inServer(t, tb, func() error { return createVeth(0) })
	var index int
	inServer(t, tb, func() error {
		l, err := netlink.LinkByName(vethA)
		if err == nil {
			index = l.Attrs().Index
		}
		return err
	})
	recreate := func() error { return createVeth(index) }
	sd := newSantad(t, tb, "--interface", vethA)
	sd.start()
	c := sd.client()
	waitVethAttached(t, tb, c, "start")

	inServer(t, tb, removeVeth)
	if m := interfaceMode(t, c, vethA); m != "removed" {
		t.Errorf("after %s was removed: mode %q, want removed", vethA, m)
	}
	inServer(t, tb, recreate)
	waitVethAttached(t, tb, c, vethA+" was created again with its ifindex")

	inServer(t, tb, func() error { return errors.Join(removeVeth(), recreate()) })
	waitVethAttached(t, tb, c, vethA+" was removed and at once created again with its ifindex")
}

// TestInterfaceRenamed: santad attaches by name, so an interface renamed
// loses the rule processor (status mode "removed", a warning) and its
// requests reach the application; renamed back, it gets it again.
func TestInterfaceRenamed(t *testing.T) {
	tb := testbed.New(t)
	renamed := "santa-vx"
	rename := func(from, to string) {
		t.Helper()
		if err := tb.Server.Do(func() error {
			l, err := netlink.LinkByName(from)
			if err != nil {
				return err
			}
			// only a down interface can be renamed
			return errors.Join(netlink.LinkSetDown(l), netlink.LinkSetName(l, to), netlink.LinkSetUp(l))
		}); err != nil {
			t.Fatalf("rename %s to %s: %v", from, to, err)
		}
	}
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7303)
	target, err := santa.Socket(echoServer(t, tb, server))
	if err != nil {
		t.Fatal(err)
	}
	addPingPong(t, sd.client(), target)
	c := sd.client()
	mode := func() string {
		t.Helper()
		info, _, err := c.Health()
		if err != nil || len(info.Interfaces) != 1 || info.Interfaces[0].Name != tb.Server.Dev {
			t.Fatalf("health: %+v, %v; want the one interface %s", info, err, tb.Server.Dev)
		}
		return info.Interfaces[0].Mode
	}
	answered := func() uint64 {
		t.Helper()
		_, counters, err := c.Health()
		if err != nil {
			t.Fatal(err)
		}
		return counters["answered"]
	}
	// within a few seconds of a change, santad has followed it
	eventually := func(what string, ok func() bool) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); !ok(); time.Sleep(50 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("5 s after %s: mode %q", what, mode())
			}
		}
	}
	if m := mode(); m != "native" {
		t.Fatalf("at start: mode %q, want native", m)
	}

	rename(tb.Server.Dev, renamed)
	eventually("the rename", func() bool { return mode() == "removed" })
	if x, err := tb.ServerXDP(); err != nil || x.Attached != 0 {
		t.Errorf("renamed interface has XDP %+v (%v), want none", x, err)
	}
	before := answered()
	if got := exchange(t, tb, server, "ping"); got != "ping" {
		t.Errorf("while renamed the client got %q, want the application's echo", got)
	}
	if n := answered() - before; n != 0 {
		t.Errorf("while renamed the rule processor answered %d requests", n)
	}

	rename(renamed, tb.Server.Dev)
	eventually("the rename back", func() bool { return mode() == "native" })
	if got := exchange(t, tb, server, "ping"); got != "pong" {
		t.Errorf("renamed back, the client got %q, want the rule's pong", got)
	}
	for _, want := range []string{"interface renamed", "interface is back"} {
		if !strings.Contains(sd.Log(), want) {
			t.Errorf("santad's log does not say %q", want)
		}
	}
}

// TestInterfaceRenamedWhileBusy: santad's interface watcher may be busy
// (here attaching to santa-va, created again) when another interface it
// attached to is renamed. Status must not call that interface removed while
// the renamed one still carries the rule processor: santad lets go of it
// before it answers (TestInterfaceRenamed checked the XDP program right
// after status said removed, and failed once in CI).
func TestInterfaceRenamedWhileBusy(t *testing.T) {
	tb := testbed.New(t)
	inServer(t, tb, func() error { return createVeth(0) })
	sd := newSantad(t, tb, "--interface", vethA)
	sd.start()
	c := sd.client()
	mode := func() string { return interfaceMode(t, c, tb.Server.Dev) }
	if m := mode(); m != "native" {
		t.Fatalf("at start: mode %q, want native", m)
	}

	// the server's interface is renamed while santad attaches to santa-va,
	// created again, which takes it tens of milliseconds (taking the
	// interface down first, the slow part of a rename, narrows the rename
	// to less than that)
	if err := tb.Server.Do(func() error {
		server, err := netlink.LinkByName(tb.Server.Dev)
		if err != nil {
			return err
		}
		if err := netlink.LinkSetDown(server); err != nil {
			return err
		}
		if err := errors.Join(removeVeth(), createVeth(0)); err != nil {
			return err
		}
		return errors.Join(netlink.LinkSetName(server, "santa-vx"), netlink.LinkSetUp(server))
	}); err != nil {
		t.Fatal(err)
	}
	m := mode()
	x, err := tb.ServerXDP()
	if err != nil {
		t.Fatal(err)
	}
	if m == "removed" && x.Attached != 0 {
		t.Errorf("status says %s is removed, but the interface renamed from it still has XDP %+v", tb.Server.Dev, x)
	}
	for deadline := time.Now().Add(5 * time.Second); mode() != "removed"; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("5 s after the rename: mode %q, want removed", mode())
		}
	}
	if x, err := tb.ServerXDP(); err != nil || x.Attached != 0 {
		t.Errorf("renamed interface has XDP %+v (%v), want none", x, err)
	}
}

// TestInterfaceUpdatesOverflow: santad learns of interface changes through
// a netlink subscription, which ends when more link events come than its
// socket holds (ENOBUFS). santad subscribes again, catches up with the
// changes it missed and follows the later ones. Here santad is stopped
// (SIGSTOP) through a burst of link events, so that its socket overflows
// for certain; vethA is removed and created again after the burst, so
// santad can only learn of that by looking.
func TestInterfaceUpdatesOverflow(t *testing.T) {
	tb := testbed.New(t)
	sd, c := santadOnVethA(t, tb)

	// each MTU change is a link event of about a kilobyte
	overflow(t, sd, "interface updates", func(deadline time.Time) error {
		busy := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "santa-bx"}, PeerName: "santa-by"}
		if err := netlink.LinkAdd(busy); err != nil {
			return err
		}
		defer netlink.LinkDel(busy)
		for i := 0; i < overflowBurst && time.Now().Before(deadline); i++ {
			if err := netlink.LinkSetMTU(busy, 1280+i%2); err != nil {
				return err
			}
		}
		return errors.Join(removeVeth(), createVeth(0))
	})
	waitVethAttached(t, tb, c, vethA+" was removed and created again while santad's subscription overflowed")

	inServer(t, tb, func() error { return errors.Join(removeVeth(), createVeth(0)) })
	waitVethAttached(t, tb, c, vethA+" was removed and created again after the overflow")
	if !strings.Contains(sd.Log(), "subscribing again") {
		t.Errorf("santad's log does not say it is subscribing again")
	}
}
