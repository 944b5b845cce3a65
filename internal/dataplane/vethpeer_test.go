package dataplane

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/santa-offload/santa/internal/testbed"
)

// A veth's XDP_TX frames reach the other end only if that end has a native
// XDP program (shared/notes/kernel-findings.md): without one they are
// counted as sent and dropped. On a testbed whose client end has none,
// attaching the rule processor to the server end gives the client end
// PeerPassName, in the client's network namespace, so a client there gets
// the rule's reply; detaching removes it again. A program already there is
// left alone.
func TestVethPeerGetsPass(t *testing.T) {
	requireRoot(t)
	tb := testbed.NewWith(t, testbed.Options{NoClientPass: true})
	d, err := Load(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	clientProg := func() (string, uint32) {
		t.Helper()
		x, err := tb.ClientXDP()
		if err != nil {
			t.Fatal(err)
		}
		if x.DrvID == 0 {
			return "", 0
		}
		name, err := programName(x.DrvID)
		if err != nil {
			t.Fatal(err)
		}
		return name, x.DrvID
	}
	if name, _ := clientProg(); name != "" {
		t.Fatalf("the client end has XDP program %q before the test", name)
	}
	attach := func() *Attachment {
		t.Helper()
		var att *Attachment
		if err := tb.Server.Do(func() (err error) {
			att, err = d.Attach(tb.Server.Dev, AttachNative)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return att
	}
	att := attach()
	attached := true
	t.Cleanup(func() {
		if attached {
			att.Close()
		}
	})
	name, id := clientProg()
	if name != PeerPassName {
		t.Fatalf("after Attach the client end has XDP program %q, want %q", name, PeerPassName)
	}
	checkPeerXDP(t, att, fmt.Sprintf("%s: XDP program %d (%s)", tb.Client.Dev, id, PeerPassName))

	addr := netip.AddrPortFrom(tb.Server.IP4, 7301)
	_, cookie := serverConn(t, tb, addr)
	if err := d.Bind(udpSock(cookie, addr), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := d.AddRules(cookie, []Rule{reply("ping", "pong from XDP")}); err != nil {
		t.Fatal(err)
	}
	c, err := tb.DialUDP(addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 100)
	n, err := c.Read(buf)
	if err != nil || string(buf[:n]) != "pong from XDP" {
		t.Fatalf("client got %q, %v; want the rule's reply", buf[:n], err)
	}

	// someone removes it: PeerXDP says the replies are lost
	if err := tb.Server.Do(func() error { return RemovePeerPass(att.Ifindex()) }); err != nil {
		t.Fatal(err)
	}
	checkPeerXDP(t, att, tb.Client.Dev+": no XDP program: replies sent from XDP are dropped")
	if err := att.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	attached = false
	if name, _ := clientProg(); name != "" {
		t.Fatalf("after Close the client end still has XDP program %q", name)
	}
	// a program of the client's own is neither replaced nor removed
	if err := tb.AttachClientPass(); err != nil {
		t.Fatal(err)
	}
	_, own := clientProg()
	att = attach()
	attached = true
	if _, now := clientProg(); now != own {
		t.Fatalf("Attach replaced the client end's own XDP program %d by %d", own, now)
	}
	ownName, _ := clientProg()
	checkPeerXDP(t, att, fmt.Sprintf("%s: XDP program %d (%s)", tb.Client.Dev, own, ownName))
	if err := att.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	attached = false
	if _, now := clientProg(); now != own {
		t.Fatalf("Close removed the client end's own XDP program %d (now %d)", own, now)
	}
}

// Both ends of a veth in one namespace: the other end gets PeerPassName
// there, and loses it on detach.
func TestVethPeerInSameNamespace(t *testing.T) {
	requireRoot(t)
	tb := testbed.New(t)
	d, err := Load(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	peerProg := func() (name string) {
		t.Helper()
		if err := tb.Server.Do(func() error {
			l, err := netlink.LinkByName("santa-vb")
			if err != nil || l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached {
				return err
			}
			name, err = programName(l.Attrs().Xdp.ProgId)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return name
	}
	var att *Attachment
	if err := tb.Server.Do(func() error {
		veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "santa-va"}, PeerName: "santa-vb"}
		if err := netlink.LinkAdd(veth); err != nil {
			return err
		}
		att, err = d.Attach("santa-va", AttachNative)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	if name := peerProg(); name != PeerPassName {
		t.Errorf("after Attach the other end has XDP program %q, want %q", name, PeerPassName)
	}
	if peer, err := att.PeerXDP(); err != nil || !strings.HasPrefix(peer, "santa-vb: XDP program ") || !strings.HasSuffix(peer, "("+PeerPassName+")") {
		t.Errorf("PeerXDP: %q, %v; want santa-vb's %s", peer, err, PeerPassName)
	}
	if err := att.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if name := peerProg(); name != "" {
		t.Errorf("after Close the other end has XDP program %q, want none", name)
	}
}

// checkPeerXDP checks what att says of its veth's other end.
func checkPeerXDP(t *testing.T, att *Attachment, want string) {
	t.Helper()
	if got, err := att.PeerXDP(); err != nil || got != want {
		t.Errorf("PeerXDP: %q, %v; want %q", got, err, want)
	}
}
