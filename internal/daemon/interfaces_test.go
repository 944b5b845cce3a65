package daemon_test

import (
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestInterfaceRemovedAndBack: the kernel detaches XDP from an interface
// that is removed. santad says so (status mode "removed", a warning) and,
// when an interface of that name is created again, attaches the rule
// processor to it (and the program to its veth peer) by itself.
func TestInterfaceRemovedAndBack(t *testing.T) {
	tb := testbed.New(t)
	veth := func(op string) {
		t.Helper()
		if err := tb.Server.Do(func() error {
			v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "santa-va"}, PeerName: "santa-vb"}
			if op == "del" {
				return netlink.LinkDel(v)
			}
			if err := netlink.LinkAdd(v); err != nil {
				return err
			}
			return netlink.LinkSetUp(v)
		}); err != nil {
			t.Fatalf("%s veth: %v", op, err)
		}
	}
	// xdp says which XDP programs santa-va and santa-vb have (0: none)
	xdp := func() (a, b uint32) {
		t.Helper()
		ids := [2]uint32{}
		for i, name := range []string{"santa-va", "santa-vb"} {
			if err := tb.Server.Do(func() error {
				l, err := netlink.LinkByName(name)
				if err == nil && l.Attrs().Xdp != nil && l.Attrs().Xdp.Attached {
					ids[i] = l.Attrs().Xdp.ProgId
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
		}
		return ids[0], ids[1]
	}
	veth("add")
	sd := newSantad(t, tb, "--interface", "santa-va")
	sd.start()
	c := sd.client()
	mode := func() string {
		t.Helper()
		info, _, err := c.Health()
		if err != nil {
			t.Fatal(err)
		}
		for _, i := range info.Interfaces {
			if i.Name == "santa-va" {
				return i.Mode
			}
		}
		t.Fatalf("santa-va is not among santad's interfaces %v", info.Interfaces)
		return ""
	}
	if a, b := xdp(); mode() != "native" || a == 0 || b == 0 {
		t.Fatalf("at start: mode %q, XDP programs %d (santa-va) and %d (its peer); want native and both", mode(), a, b)
	}
	veth("del")
	if m := mode(); m != "removed" {
		t.Errorf("after santa-va was removed: mode %q, want removed", m)
	}
	veth("add")
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, b := xdp()
		if m := mode(); m == "native" && a != 0 && b != 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("5 s after santa-va was created again: mode %q, XDP programs %d and %d; want native and both", mode(), a, b)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for _, want := range []string{"interface removed", "interface is back"} {
		if !strings.Contains(sd.Log(), want) {
			t.Errorf("santad's log does not say %q", want)
		}
	}
}
