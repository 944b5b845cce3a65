package reflector

import (
	"bytes"
	"net/netip"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// The reflector on the server veth sends a client's datagram back with
// addresses and ports swapped, so a connected client socket receives its own
// payload from the server's address; other ports pass to the stack.
func TestReflector(t *testing.T) {
	tb := testbed.New(t)
	// Datagrams from a local socket carry only a partial UDP checksum (the
	// pseudo-header sum) when the veth offloads it; the bare reflector does
	// not touch checksums, so the client would drop the reflection as
	// corrupt. Make the client's stack compute full checksums (kxdpgun, the
	// benchmark's generator, always does).
	if _, err := tb.Client.Run("ethtool", "-K", tb.Client.Dev, "tx", "off"); err != nil {
		t.Fatal(err)
	}
	r, err := Load(53)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := tb.Server.Do(func() error { return r.Attach(tb.Server.Ifindex) }); err != nil {
		t.Fatal(err)
	}
	xi, err := tb.ServerXDP()
	if err != nil || xi.ID() == 0 {
		t.Fatalf("server XDP: %+v %v", xi, err)
	}

	for _, srv := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
		c, err := tb.DialUDP(netip.AddrPortFrom(srv, 53))
		if err != nil {
			t.Fatal(err)
		}
		msg := []byte("reflect me via " + srv.String())
		c.Write(msg)
		c.SetReadDeadline(time.Now().Add(2 * time.Second))
		buf := make([]byte, 1500)
		n, err := c.Read(buf)
		c.Close()
		if err != nil {
			t.Fatalf("%s: no reflection: %v", srv, err)
		}
		if !bytes.Equal(buf[:n], msg) {
			t.Fatalf("%s: got %q", srv, buf[:n])
		}
	}
	if n, err := r.Reflected(); err != nil || n != 2 {
		t.Errorf("reflected counter %d %v, want 2", n, err)
	}

	// Another port is passed: the server's socket receives it.
	ln, err := tb.Server.ListenUDP(netip.AddrPortFrom(tb.Server.IP4, 5353))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := tb.DialUDP(netip.AddrPortFrom(tb.Server.IP4, 5353))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte("to the stack"))
	ln.SetReadDeadline(time.Now().Add(2 * time.Second))
	buf := make([]byte, 1500)
	n, err := ln.Read(buf)
	if err != nil || string(buf[:n]) != "to the stack" {
		t.Fatalf("passed datagram: %q %v", buf[:n], err)
	}

	if err := r.Detach(); err != nil {
		t.Fatal(err)
	}
	if xi, _ := tb.ServerXDP(); xi.ID() != 0 {
		t.Errorf("program still attached after Detach: %+v", xi)
	}
}
