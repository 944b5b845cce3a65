package dataplane

import (
	"net"
	"net/netip"
	"os"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

// serverConn binds a UDP socket at addr in tb's server namespace with the
// SOL_SOCKET options given (bindUDP), for as long as the test runs, and
// returns it with its cookie.
func serverConn(t *testing.T, tb *testbed.Testbed, addr netip.AddrPort, sockopts ...int) (net.PacketConn, uint64) {
	t.Helper()
	var fd int
	var cookie uint64
	if err := tb.Server.Do(func() (err error) {
		fd, cookie, err = bindUDP(addr, sockopts...)
		return err
	}); err != nil {
		t.Fatalf("socket %v: %v", addr, err)
	}
	f := os.NewFile(uintptr(fd), addr.String())
	conn, err := net.FilePacketConn(f) // a dup of the same socket
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn, cookie
}

// TestReuseportGroup documents the SO_REUSEPORT semantics (docs/matching.md):
// a request matches the rules of the group member the kernel's reuseport
// hash picks for it, the member the stack would deliver it to without Santa.
//
// Sockets A and B share a port; only A has rules. Requests from N distinct
// source ports are each either answered by XDP or received by B, never
// received by A. With Santa detached, the same source ports land on A
// exactly for the requests that were answered before.
func TestReuseportGroup(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: network namespaces, XDP")
	}
	const n = 200
	tb := testbed.New(t)
	d, err := Load(Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	var att *Attachment
	if err := tb.Server.Do(func() error {
		var err error
		att, err = d.Attach(tb.Server.Dev, AttachAuto)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	detached := false
	t.Cleanup(func() {
		if !detached {
			att.Close()
		}
	})

	addr := netip.AddrPortFrom(tb.Server.IP4, 7300)
	type member struct {
		name   string
		conn   net.PacketConn
		cookie uint64
	}
	var members []*member
	for _, name := range []string{"A", "B"} {
		conn, cookie := serverConn(t, tb, addr, unix.SO_REUSEPORT)
		members = append(members, &member{name, conn, cookie})
	}
	a := members[0]
	if err := d.Bind(udpSock(a.cookie, addr), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	ids, err := d.AddRules(a.cookie, []Rule{reply("ping", "pong from A's rule")})
	if err != nil {
		t.Fatal(err)
	}

	// Every datagram a member receives, with its source port.
	type arrival struct {
		member string
		port   uint16
	}
	arrivals := make(chan arrival, 2*n)
	for _, m := range members {
		go func() {
			buf := make([]byte, 1500)
			for { // ends when the conn is closed at cleanup
				_, from, err := m.conn.ReadFrom(buf)
				if err != nil {
					return
				}
				arrivals <- arrival{m.name, uint16(from.(*net.UDPAddr).Port)}
			}
		}()
	}

	clients := make([]*net.UDPConn, n)
	ports := make([]uint16, n)
	for i := range clients {
		c, err := tb.DialUDP(addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		clients[i] = c
		ports[i] = c.LocalAddr().(*net.UDPAddr).AddrPort().Port()
	}
	if len(slices.Compact(slices.Sorted(slices.Values(ports)))) != n {
		t.Fatal("client source ports are not distinct")
	}

	// round sends "ping" from every client, one at a time, and says where
	// each went: "xdp" (the client got the rule's reply), "A" or "B".
	round := func() []string {
		where := make([]string, n)
		buf := make([]byte, 1500)
		for i, c := range clients {
			if _, err := c.Write([]byte("ping")); err != nil {
				t.Fatal(err)
			}
			// set before the reader starts, so ending it early below cannot race
			c.SetReadDeadline(time.Now().Add(2 * time.Second))
			got := make(chan string, 1)
			go func() {
				k, err := c.Read(buf)
				switch {
				case err != nil:
					got <- ""
				case string(buf[:k]) == "pong from A's rule":
					got <- "xdp"
				default:
					got <- "client got " + string(buf[:k])
				}
			}()
			select {
			case w := <-got:
				where[i] = w
			case ar := <-arrivals:
				if ar.port != ports[i] {
					t.Fatalf("client %d (port %d): %s received a datagram from port %d", i, ports[i], ar.member, ar.port)
				}
				where[i] = ar.member
				c.SetReadDeadline(time.Now()) // end the client's read
				if w := <-got; w != "" {
					t.Errorf("client %d: both %s received it and the client got a reply (%s)", i, ar.member, w)
				}
			}
			if where[i] == "" {
				t.Fatalf("client %d (port %d): neither answered nor received within 2s", i, ports[i])
			}
		}
		// nothing arrives late
		select {
		case ar := <-arrivals:
			t.Errorf("late arrival at %s from port %d", ar.member, ar.port)
		case <-time.After(100 * time.Millisecond):
		}
		return where
	}

	count := func(where []string, w string) int {
		k := 0
		for _, x := range where {
			if x == w {
				k++
			}
		}
		return k
	}

	before := reuseportCounters(t, d)
	attached := round()
	after := reuseportCounters(t, d)
	nx, nb, na := count(attached, "xdp"), count(attached, "B"), count(attached, "A")
	t.Logf("Santa attached: %d answered by A's rule, %d received by B, %d received by A", nx, nb, na)
	if na != 0 || nx+nb != n {
		t.Errorf("with Santa: %d answered, %d at B, %d at A; want every request answered or at B, none at A", nx, nb, na)
	}
	if nx == 0 || nb == 0 {
		t.Errorf("the hash sent all %d requests one way (answered %d, B %d): the test shows nothing", n, nx, nb)
	}
	if got := after["answered"] - before["answered"]; got != uint64(nx) {
		t.Errorf("answered moved by %d, want %d", got, nx)
	}
	if got := after["pass_no_ruleset"] - before["pass_no_ruleset"]; got != uint64(nb) {
		t.Errorf("pass_no_ruleset moved by %d, want %d", got, nb)
	}
	st, err := d.RuleStats(a.cookie)
	if err != nil {
		t.Fatal(err)
	}
	if st[ids[0]].Hits != uint64(nx) {
		t.Errorf("rule hits %d, want %d", st[ids[0]].Hits, nx)
	}

	if err := att.Close(); err != nil {
		t.Fatal(err)
	}
	detached = true
	plain := round()
	for i := range plain {
		want := attached[i]
		if want == "xdp" {
			want = "A"
		}
		if plain[i] != want {
			t.Errorf("client %d (port %d): with Santa %s, without it %s; want %s", i, ports[i], attached[i], plain[i], want)
		}
	}
	t.Logf("Santa detached: %d received by A, %d by B", count(plain, "A"), count(plain, "B"))
}

func reuseportCounters(t *testing.T, d *Dataplane) map[string]uint64 {
	t.Helper()
	c, err := d.Counters()
	if err != nil {
		t.Fatal(err)
	}
	return CounterNames(c)
}
