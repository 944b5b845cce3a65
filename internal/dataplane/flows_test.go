package dataplane

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/netip"
	"path/filepath"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// flowCount is the number of entries in the TCP flow table.
func flowCount(t *testing.T, d *Dataplane) int {
	t.Helper()
	var k santaBpfSockTuple
	var v santaSantaTcpFlow
	n := 0
	it := d.objs.SantaTcpFlows.Iterate()
	for it.Next(&k, &v) {
		n++
	}
	if err := it.Err(); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestTCPFlowTable runs real clients against a flow table of four: each
// connection eBPF answers holds an entry; a fifth connection finds the table
// full and its requests go to the kernel with an intact stream; a client's
// FIN frees its connection's entry, and the next connection is eBPF's again.
func TestTCPFlowTable(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{TCPFlows: 4})
	addr := netip.AddrPortFrom(tb.Server.IP4, 8080)
	srv := startTCPServer(t, tb, addr)
	if err := d.Bind(srv.sock(), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	hot, bye := httpGet("/hot", ""), httpGet("/bye", "Connection: close\r\n")
	hotReply, byeReply := httpReply("from eBPF", ""), httpReply("bye", "Connection: close\r\n")
	if _, err := d.AddRules(srv.cookie, []Rule{
		{Conditions: []Condition{cond(0, hot)}, Processors: []Processor{put(0, hotReply)},
			ReplyLen: len(hotReply), MinLen: len(hot), MaxLen: len(hot)},
		{Conditions: []Condition{cond(0, bye)}, Processors: []Processor{put(0, byeReply)},
			ReplyLen: len(byeReply), MinLen: len(bye), MaxLen: len(bye), Close: true},
	}); err != nil {
		t.Fatal(err)
	}
	type conn struct {
		c net.Conn
		r *bufio.Reader
	}
	dial := func() conn {
		c := dialFromClient(t, tb, addr)
		return conn{c, bufio.NewReader(c)}
	}
	ask := func(c conn, what string, want string) {
		t.Helper()
		req := hot
		if want == byeReply {
			req = bye
		}
		io.WriteString(c.c, req)
		if got := readReply(t, c.c, c.r); got != want {
			t.Fatalf("%s: %q, want %q", what, got, want)
		}
	}
	before := counterNames(t, d)
	var conns []conn
	for i := 0; i < 4; i++ {
		c := dial()
		ask(c, fmt.Sprintf("connection %d", i), hotReply)
		conns = append(conns, c)
	}
	if n := flowCount(t, d); n != 4 {
		t.Fatalf("%d flows after four connections, want 4", n)
	}
	full := dial()
	kernelReply := httpReply("kernel GET /hot HTTP/1.1", "")
	ask(full, "fifth connection, table full", kernelReply)
	ask(full, "fifth connection, after the handover", kernelReply)
	if s := srv.Streams(); len(s) != 1 || s[0] != hot+hot {
		t.Fatalf("server streams %q, want one: %q", s, hot+hot)
	}

	waitFlows := func(want int, after string) {
		t.Helper()
		deadline := time.Now().Add(3 * time.Second)
		for flowCount(t, d) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%d flows 3 s after %s, want %d", flowCount(t, d), after, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	conns[0].c.Close()
	waitFlows(3, "a client closed")
	// a reply that ends the connection: the client's FIN frees its entry too
	closing := dial()
	ask(closing, "a reply with Connection: close", byeReply)
	if _, err := closing.r.ReadByte(); err != io.EOF {
		t.Fatalf("after the close reply: %v, want EOF", err)
	}
	closing.c.Close()
	waitFlows(3, "a Connection: close reply")
	ask(dial(), "a connection after one closed", hotReply)
	for i, c := range conns[1:] {
		ask(c, fmt.Sprintf("connection %d again", i+1), hotReply)
	}
	after := counterNames(t, d)
	for name, want := range map[string]uint64{"tcp_pass_flows_full": 1, "tcp_handed_over": 1, "answered": 4 + 1 + 1 + 3} {
		if got := after[name] - before[name]; got != want {
			t.Errorf("%s: +%d, want +%d", name, got, want)
		}
	}
}

// TestSweepFlows: santad's sweep deletes the flows idle for longer than a
// client's retransmissions can be apart, across the 32-bit wrap of the unit.
func TestSweepFlows(t *testing.T) {
	d, err := Load(Config{TCPFlows: 16})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	for _, now := range []uint64{1 << 20, 1<<32 + 5} {
		seen := map[byte]uint32{1: uint32(now), 2: uint32(now) - flowIdleUnits, 3: uint32(now) - flowIdleUnits - 1, 4: uint32(now) - 1000}
		for port, s := range seen {
			var k santaBpfSockTuple
			k.Ipv4.Sport = uint16(port)
			if err := d.objs.SantaTcpFlows.Put(&k, &santaSantaTcpFlow{Seen: s}); err != nil {
				t.Fatal(err)
			}
		}
		if err := d.sweepFlows(now); err != nil {
			t.Fatal(err)
		}
		for port := range seen {
			var k santaBpfSockTuple
			k.Ipv4.Sport = uint16(port)
			var v santaSantaTcpFlow
			kept := d.objs.SantaTcpFlows.Lookup(&k, &v) == nil
			if want := port <= 2; kept != want {
				t.Errorf("now %d: flow seen at %d kept: %v, want %v", now, seen[port], kept, want)
			}
			d.objs.SantaTcpFlows.Delete(&k)
		}
	}
}

// TestFlowsPinned: a successor shares the pinned flow table, entries and
// all; one of another size is replaced, not refused.
func TestFlowsPinned(t *testing.T) {
	pin := filepath.Join(mountBPFFS(t), "tcp_flows")
	first, err := Load(Config{TCPFlows: 16, FlowsPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Close()
	var k santaBpfSockTuple
	k.Ipv4.Sport = 80
	if err := first.objs.SantaTcpFlows.Put(&k, &santaSantaTcpFlow{ReplyEnd: 1234}); err != nil {
		t.Fatal(err)
	}
	next, err := Load(Config{TCPFlows: 16, FlowsPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	var v santaSantaTcpFlow
	if err := next.objs.SantaTcpFlows.Lookup(&k, &v); err != nil || v.ReplyEnd != 1234 {
		t.Fatalf("successor's flow: %+v, %v; want reply end 1234", v, err)
	}
	bigger, err := Load(Config{TCPFlows: 32, FlowsPin: pin})
	if err != nil {
		t.Fatalf("a pinned flow table of another size: %v", err)
	}
	defer bigger.Close()
	if n := flowCount(t, bigger); n != 0 || bigger.objs.SantaTcpFlows.MaxEntries() != 32 {
		t.Fatalf("replacement: %d flows, %d entries; want a new table of 32", n, bigger.objs.SantaTcpFlows.MaxEntries())
	}
}
