package mcctl

import (
	"slices"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
)

// A connection's state starts at memcached's SYN-ACK, with the client's
// next byte the one it acks (BPF_PROG_TEST_RUN of the tracker's programs;
// a write is bumped when the tracker parses it and again at its reply).
// A SYN-ACK sent again, after a request was parsed, leaves the state: the
// write's reply bumps its key (a fresh state took the reply for one
// without a request and bumped the epoch). A SYN-ACK of a new connection
// on the 4-tuple ends the old one's state, whose owed write is bumped.
func TestTrackerStateStartsAtSynAck(t *testing.T) {
	c := retiredRig(t)
	run := func(prog *ebpf.Program, frame []byte) {
		t.Helper()
		if _, err := prog.Run(&ebpf.RunOptions{Data: frame}); err != nil {
			t.Fatal(err)
		}
	}
	synAck := func(seq, ack uint32) { run(c.tracker.objs.McEgress, tcpSegment(t, false, seq, ack, "")) }
	request := func(seq, ack uint32, data string) { run(c.tracker.objs.McIngress, tcpSegment(t, true, seq, ack, data)) }
	reply := func(seq, ack uint32, data string) { run(c.tracker.objs.McEgress, tcpSegment(t, false, seq, ack, data)) }
	bumped := func(step string, want ...uint32) {
		t.Helper()
		var got []uint32
		if _, err := c.tracker.DrainBumps(func(slot uint32, unacked bool) {
			if unacked {
				t.Errorf("%s: slot %d bumped unacked", step, slot)
			}
			got = append(got, slot)
		}); err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, want) {
			t.Errorf("%s: bumped slots %v, want %v (epoch %d)", step, got, want, epochSlot)
		}
	}

	const set = "set k 0 0 1\r\nv\r\n"
	synAck(1000, 5001)
	request(5001, 1001, set)
	synAck(1000, 5001) // sent again
	reply(1001, 5001+uint32(len(set)), "STORED\r\n")
	bumped("a write and its reply, a SYN-ACK sent again between them", KeySlot("k"), KeySlot("k"))

	const next = "set n 0 0 1\r\nv\r\n"
	request(5001+uint32(len(set)), 1009, next)
	synAck(70000, 90001) // a new connection on the 4-tuple
	bumped("a write, then a new connection on the 4-tuple", KeySlot("n"), KeySlot("n"))
	request(90001, 70001, set)
	reply(70001, 90001+uint32(len(set)), "STORED\r\n")
	bumped("a write and its reply on the new connection", KeySlot("k"), KeySlot("k"))

	counters, err := c.tracker.Counters()
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"uncounted_flows", "untracked_segments", "dropped_out_of_order", "lost_flows"} {
		if counters[name] != 0 {
			t.Errorf("%s: %d, want 0 (counters %v)", name, counters[name], counters)
		}
	}
}

// tcpSegment is an Ethernet frame with a TCP segment with data (none: a
// SYN-ACK) between a client (192.0.2.2:40000) and memcached (192.0.2.1:11211).
func tcpSegment(t *testing.T, toServer bool, seq, ack uint32, data string) []byte {
	client, server := []byte{192, 0, 2, 2}, []byte{192, 0, 2, 1}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP, SrcIP: server, DstIP: client}
	tcp := &layers.TCP{SrcPort: 11211, DstPort: 40000, Seq: seq, Ack: ack, ACK: true, SYN: data == "", Window: 65535}
	if toServer {
		ip.SrcIP, ip.DstIP = client, server
		tcp.SrcPort, tcp.DstPort = tcp.DstPort, tcp.SrcPort
	}
	tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true},
		&layers.Ethernet{SrcMAC: make([]byte, 6), DstMAC: make([]byte, 6), EthernetType: layers.EthernetTypeIPv4},
		ip, tcp, gopacket.Payload(data))
	if err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}
