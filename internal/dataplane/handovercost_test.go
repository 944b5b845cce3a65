package dataplane

import (
	"fmt"
	"net/netip"
	"testing"

	"github.com/gopacket/gopacket/layers"
)

// BenchmarkHandoverHook measures the TC hook's run time (BPF_PROG_RUN, ns
// per segment) on a port with a rule set (docs/tcp.md "Cost"): a data
// segment with timestamps of one of the kernel's own connections (made
// before the rule set, so the kernel answered its handshake) whose echo is
// in a stamp's time window or out of it (the kernel's TSval starts at a
// random offset: 47 in 64 of its connections echo out of it), and a
// request of a socket-less connection that no rule matches, which the hook
// hands over (bpf_sk_assign_tcp_reqsk refuses BPF_PROG_RUN's skb, so the
// handover itself is left out).
func BenchmarkHandoverHook(b *testing.B) {
	e := newEnv(b, Config{})
	addr := netip.AddrPortFrom(e.tb.Server.IP4, 8081)
	srv := startTCPServer(b, e.tb, addr)
	kernelConn := dialFromClient(b, e.tb, addr)
	e.bindRules(e.known(srv.sock()), exactRule(httpGet("/", ""), httpReply("hi", ""), false))
	client := netip.MustParseAddrPort(kernelConn.LocalAddr().String())
	nop := layers.TCPOption{OptionType: layers.TCPOptionKindNop}
	unit, err := stampUnit()
	if err != nil {
		b.Fatal(err)
	}
	kernelData := func(echoUnit uint64) []byte {
		return tcpFrame(b, client, addr, &layers.TCP{ACK: true, PSH: true, Seq: 1000, Ack: 2000, Window: 500,
			Options: []layers.TCPOption{nop, nop, tsOption(777, uint32(echoUnit&63)<<26|888)}}, httpGet("/x", ""))
	}
	conn := connect(e, netip.AddrPortFrom(e.tb.Client.IP4, 40001), addr, 1460)
	socketless := conn.segment(0, 0, httpGet("/other", ""))
	for _, f := range []struct {
		name  string
		frame []byte
	}{
		{"kernel-conn-echo-in-window", kernelData(unit)},
		{"kernel-conn-echo-out-of-window", kernelData(unit + 32)},
		{"socketless-conn", socketless},
	} {
		b.Run(f.name, func(b *testing.B) {
			if err := e.tb.Server.Do(func() error {
				verdict, per, err := e.d.objs.SantaHandover.Benchmark(f.frame, b.N, nil)
				if err == nil && verdict != 0 { // TC_ACT_OK
					err = fmt.Errorf("verdict %d, want TC_ACT_OK", verdict)
				}
				b.ReportMetric(float64(per.Nanoseconds()), "ns/segment")
				return err
			}); err != nil {
				b.Fatal(err)
			}
		})
	}
}
