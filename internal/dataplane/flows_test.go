package dataplane

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/cilium/ebpf"
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

// pinnedPredecessor loads a data plane with a flow table of size flows,
// pinned as santad pins it (its flows at pin, the rest for OpenPrevious), and
// opens it as a successor's predecessor.
func pinnedPredecessor(t *testing.T, size int) (first *Dataplane, prev *Previous, pin string) {
	t.Helper()
	bpffs := mountBPFFS(t)
	pin = filepath.Join(bpffs, "tcp_flows")
	first, err := Load(Config{TCPFlows: size, FlowsPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { first.Close() })
	if err := first.PublishFlows(); err != nil {
		t.Fatal(err)
	}
	gen := filepath.Join(bpffs, "gen")
	if err := first.Pin(gen); err != nil {
		t.Fatal(err)
	}
	if prev, err = OpenPrevious(gen); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { prev.Close() })
	return first, prev, pin
}

// flowKey is the key of a flow from port, for tests.
func flowKey(port uint16) *santaBpfSockTuple {
	var k santaBpfSockTuple
	k.Ipv4.Sport = port
	return &k
}

// TestFlowsCarried: a successor has a flow table of its own and carries
// the predecessor's flows over in two passes (CarryFlows, before and after
// the swap): the second copies what the predecessor made or changed in
// between, and leaves alone what the successor's program made, changed or
// ended. A table of another size is carried over too. PublishFlows pins the
// successor's in the predecessor's place. (Before, a successor shared the
// table, and pointed its flows at the restored rules only after the swap:
// a client that retransmitted in between found its rule gone, and was
// reset, or answered anew at the wrong place.)
func TestFlowsCarried(t *testing.T) {
	first, prev, pin := pinnedPredecessor(t, 16)
	put := func(d *Dataplane, port uint16, replyEnd uint32) {
		t.Helper()
		f := santaSantaTcpFlow{ReplyEnd: replyEnd, Opts: flowOptsKnown | uint8(port), Uid: 1000 + uint32(port)}
		if err := d.objs.SantaTcpFlows.Put(flowKey(port), &f); err != nil {
			t.Fatal(err)
		}
	}
	replyEnd := func(d *Dataplane, port uint16) uint32 {
		var v santaSantaTcpFlow
		if err := d.objs.SantaTcpFlows.Lookup(flowKey(port), &v); err != nil {
			return 0
		}
		return v.ReplyEnd
	}
	put(first, 1, 100)
	put(first, 2, 200)
	put(first, 3, 300)

	next, err := Load(Config{TCPFlows: 32, FlowsPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if n := flowCount(t, next); n != 0 {
		t.Fatalf("a new data plane's flow table holds %d flows, want its own, empty", n)
	}
	carrying := func() uint32 {
		t.Helper()
		var v uint32
		if err := next.objs.SantaTcpCarrying.Lookup(uint32(0), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if carrying() != 1 {
		t.Fatal("a data plane loaded over a predecessor's flow table is not marked as carrying its flows over")
	}
	if c, err := next.CarryFlows(prev); err != nil || c.Flows != 3 {
		t.Fatalf("before the swap: %+v, %v; want 3 flows carried", c, err)
	}
	var carried santaSantaTcpFlow
	if err := next.objs.SantaTcpFlows.Lookup(flowKey(2), &carried); err != nil || carried.Opts != flowOptsKnown|2 || carried.Uid != 1002 {
		t.Errorf("a carried flow's options %#x and listener's owner %d, %v; want %#x and 1002 (santad's FIN to an idle connection is stamped with them)",
			carried.Opts, carried.Uid, err, flowOptsKnown|2)
	}
	// between the passes both programs run their tables
	put(first, 1, 101) // the predecessor moves a flow on
	put(first, 4, 400) // and makes one
	put(first, 2, 201)
	put(next, 2, 202) // which the successor moved on too
	put(first, 3, 301)
	if err := next.objs.SantaTcpFlows.Delete(flowKey(3)); err != nil { // and ended
		t.Fatal(err)
	}
	if c, err := next.CarryFlows(prev); err != nil || c.Flows != 2 {
		t.Fatalf("after the swap: %+v, %v; want 2 flows carried (1 and 4)", c, err)
	}
	for port, want := range map[uint16]uint32{1: 101, 2: 202, 3: 0, 4: 400} {
		if got := replyEnd(next, port); got != want {
			t.Errorf("flow %d: reply end %d, want %d", port, got, want)
		}
	}
	if c, err := next.CarryFlows(prev); err != nil || c.Flows != 0 {
		t.Errorf("a pass with nothing new: %+v, %v; want none carried", c, err)
	}
	if err := next.PublishFlows(); err != nil {
		t.Fatal(err)
	}
	if carrying() != 0 {
		t.Error("published, the data plane is still marked as carrying flows over: it would drop every segment")
	}
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	pinned, _ := m.Info()
	own, _ := next.objs.SantaTcpFlows.Info()
	pinnedID, _ := pinned.ID()
	ownID, _ := own.ID()
	if pinnedID != ownID {
		t.Errorf("pinned at %s: map %d, want the successor's %d", pin, pinnedID, ownID)
	}
	if _, err := os.Stat(pin + "-new"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("publishing left %s-new: %v", pin, err)
	}
}

// TestFlowsCarriedIntoSmallerTable: a successor whose table is smaller than
// the predecessor's flows takes the flows of long replies in flight first,
// then the most recently active, and in its second pass gives up an idle
// flow it carried for one of a reply in flight. (It took them in the
// table's order: most replies in flight were left behind, and their
// clients, asking again, were answered anew at the wrong place, or hung.)
func TestFlowsCarriedIntoSmallerTable(t *testing.T) {
	first, prev, pin := pinnedPredecessor(t, 64)
	put := func(port uint16, f santaSantaTcpFlow) {
		t.Helper()
		if err := first.objs.SantaTcpFlows.Put(flowKey(port), &f); err != nil {
			t.Fatal(err)
		}
	}
	has := func(d *Dataplane, port uint16) bool {
		var v santaSantaTcpFlow
		return d.objs.SantaTcpFlows.Lookup(flowKey(port), &v) == nil
	}
	// 40 idle flows (1-40: one-segment replies, and long ones all acked),
	// seen at 1000 + port; 4 long replies in flight (101-104), seen earlier
	for port := uint16(1); port <= 40; port++ {
		f := santaSantaTcpFlow{ReplyStart: 10, ReplyEnd: 20, LastAck: 10, Seen: 1000 + uint32(port)}
		if port%2 == 0 {
			f.Multi, f.LastAck = 1, 20
		}
		put(port, f)
	}
	inFlight := santaSantaTcpFlow{ReplyStart: 10, ReplyEnd: 9000, LastAck: 1000, Multi: 1, Seen: 500}
	for port := uint16(101); port <= 104; port++ {
		put(port, inFlight)
	}
	next, err := Load(Config{TCPFlows: 6, FlowsPin: pin})
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	c, err := next.CarryFlows(prev)
	if err != nil || c.Flows != 6 || c.Left != 38 || c.LeftInFlight != 0 {
		t.Errorf("before the swap: %+v, %v; want 6 flows carried, 38 left, none in flight", c, err)
	}
	for port := uint16(101); port <= 104; port++ {
		if !has(next, port) {
			t.Errorf("flow %d, its long reply in flight, not carried", port)
		}
	}
	for _, port := range []uint16{39, 40} {
		if !has(next, port) {
			t.Errorf("flow %d, the most recently active, not carried", port)
		}
	}
	// a long reply the predecessor started between the passes
	put(105, inFlight)
	c, err = next.CarryFlows(prev)
	if err != nil || c.Flows != 1 || c.LeftInFlight != 0 {
		t.Errorf("after the swap: %+v, %v; want the reply in flight carried", c, err)
	}
	if !has(next, 105) || has(next, 39) || !has(next, 40) {
		t.Errorf("after the swap: flows 105 %v, 39 %v, 40 %v; want 105 carried in place of 39, the least recently active",
			has(next, 105), has(next, 39), has(next, 40))
	}
}
