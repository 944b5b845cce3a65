//go:build linux

package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// Latency prober. kxdpgun measures no latency, so while it loads the
// server a light open-loop prober sends queries from the same mix over an
// ordinary UDP socket in the client namespace and times each reply.
//
// kxdpgun's XDP program on the client veth takes every reply addressed to
// a port in its own source-port range (high ports); replies to a port below
// it still reach the kernel, so the prober binds DefaultProbePort.

// DefaultProbePort is the prober's local UDP port: below kxdpgun's
// source-port range, so that its replies are not taken by kxdpgun's XDP
// program.
const DefaultProbePort = 1053

// maxProbes bounds the queries of one probe run: every one has its own
// DNS ID.
const maxProbes = 60000

// Prober sends Queries open loop at Rate per second to Target from the
// client namespace of TB and measures the round-trip time of each reply.
type Prober struct {
	TB      *testbed.Testbed
	Target  netip.AddrPort
	Port    int // local port; 0: DefaultProbePort
	Rate    int // queries per second
	Timeout time.Duration
	queries [][]byte // wire format, ID overwritten per query
}

// NewProber packs up to maxProbes queries (in kxdpgun's form: no flags,
// one question, class IN, no EDNS) from qs, in order, starting at a
// seeded offset so that the prober's mix is the case's mix.
func NewProber(tb *testbed.Testbed, target netip.AddrPort, rate int, qs []Query) (*Prober, error) {
	if len(qs) == 0 {
		return nil, errors.New("prober: no queries")
	}
	n := min(maxProbes, len(qs))
	off := probeOffset(len(qs), n)
	payloads := make([][]byte, n)
	for i := range payloads {
		q := qs[(off+i)%len(qs)]
		w, err := PlainQuery(q.Name, q.Type)
		if err != nil {
			return nil, err
		}
		payloads[i] = w
	}
	return &Prober{TB: tb, Target: target, Rate: rate, Timeout: time.Second, queries: payloads}, nil
}

// NewPayloadProber probes with UDP payloads whose first two bytes are a
// request id the server echoes in its reply (a DNS ID, a memcached UDP
// request id): up to maxProbes of them, copied, from a seeded offset.
func NewPayloadProber(tb *testbed.Testbed, target netip.AddrPort, rate int, payloads [][]byte) (*Prober, error) {
	if len(payloads) == 0 {
		return nil, errors.New("prober: no payloads")
	}
	n := min(maxProbes, len(payloads))
	off := probeOffset(len(payloads), n)
	p := &Prober{TB: tb, Target: target, Rate: rate, Timeout: time.Second}
	for i := 0; i < n; i++ {
		w := payloads[(off+i)%len(payloads)]
		if len(w) < 2 {
			return nil, fmt.Errorf("prober: payload of %d bytes has no request id", len(w))
		}
		p.queries = append(p.queries, append([]byte(nil), w...))
	}
	return p, nil
}

// probeOffset is where n probes start in a mix of total: fixed, arbitrary.
func probeOffset(total, n int) int {
	if total <= n {
		return 0
	}
	return int(2654435761 % uint64(total))
}

// PlainQuery is a query as kxdpgun sends a "NAME TYPE" line of its query
// file: ID 0, no flags, one question of class IN, nothing else.
func PlainQuery(name, qtype string) ([]byte, error) {
	t, ok := dns.StringToType[strings.ToUpper(qtype)]
	if !ok {
		return nil, fmt.Errorf("unknown query type %q", qtype)
	}
	out := []byte{0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0}
	name = dns.Fqdn(name)
	if name != "." {
		for _, l := range strings.Split(strings.TrimSuffix(name, "."), ".") {
			if l == "" || len(l) > 63 {
				return nil, fmt.Errorf("bad name %q", name)
			}
			out = append(out, byte(len(l)))
			out = append(out, l...)
		}
	}
	out = append(out, 0)
	out = binary.BigEndian.AppendUint16(out, t)
	return binary.BigEndian.AppendUint16(out, dns.ClassINET), nil
}

// ProbeResult is one probe run.
type ProbeResult struct {
	Sent, Answered int
	P50, P90, P99  time.Duration
	Max            time.Duration
}

// Run waits delay, then sends Rate queries per second for d (at most
// maxProbes queries, at most len(queries) distinct ones, cycled), and
// waits at most Timeout for the last replies. Replies that come later
// count as lost.
func (p *Prober) Run(ctx context.Context, delay, d time.Duration) (ProbeResult, error) {
	var res ProbeResult
	if p.Rate <= 0 || d <= 0 {
		return res, nil
	}
	port := p.Port
	if port == 0 {
		port = DefaultProbePort
	}
	conn, err := p.TB.Client.ListenUDP(netip.AddrPortFrom(p.TB.Client.IP4, uint16(port)))
	if err != nil {
		return res, fmt.Errorf("prober: %w", err)
	}
	defer conn.Close()
	conn.SetReadBuffer(1 << 20)

	n := min(int(float64(p.Rate)*d.Seconds()), maxProbes)
	sentAt := make([]atomic.Int64, n) // UnixNano of the send; 0: not sent
	rtt := make([]time.Duration, n)
	for i := range rtt {
		rtt[i] = -1
	}

	select {
	case <-ctx.Done():
		return res, ctx.Err()
	case <-time.After(delay):
	}
	var (
		sending  atomic.Bool
		sentN    atomic.Int64
		answered atomic.Int64
		recvDone = make(chan error, 1)
	)
	sending.Store(true)
	start := time.Now()
	end := start.Add(d)
	conn.SetReadDeadline(end.Add(time.Second + p.Timeout)) // the sender gives up 1 s late
	go func() {
		buf := make([]byte, 4096)
		for {
			m, from, err := conn.ReadFromUDPAddrPort(buf)
			now := time.Now()
			if err != nil {
				var ne net.Error
				if errors.As(err, &ne) && ne.Timeout() {
					err = nil
				}
				recvDone <- err
				return
			}
			if m < 12 || from.Port() != p.Target.Port() {
				continue
			}
			id := int(binary.BigEndian.Uint16(buf))
			if id < n && rtt[id] < 0 {
				if t := sentAt[id].Load(); t != 0 {
					rtt[id] = now.Sub(time.Unix(0, t))
					answered.Add(1)
				}
			}
			if !sending.Load() && answered.Load() >= sentN.Load() {
				recvDone <- nil // every reply is in
				return
			}
		}
	}()
	interval := time.Second / time.Duration(p.Rate)
	sent := 0
	dst := net.UDPAddrFromAddrPort(p.Target)
	for i := 0; i < n && ctx.Err() == nil; i++ {
		at := start.Add(time.Duration(i) * interval)
		if w := time.Until(at); w > 0 {
			time.Sleep(w)
		}
		if time.Now().After(end.Add(time.Second)) {
			break // far behind: the point is over
		}
		q := p.queries[i%len(p.queries)]
		binary.BigEndian.PutUint16(q, uint16(i))
		sentAt[i].Store(time.Now().UnixNano())
		if _, err := conn.WriteToUDP(q, dst); err != nil {
			sentAt[i].Store(0)
			continue // e.g. ENOBUFS: counts as lost
		}
		sent++
	}
	sentN.Store(int64(sent))
	sending.Store(false)
	if answered.Load() >= int64(sent) {
		conn.SetReadDeadline(time.Now()) // every reply is in: wake the receiver
	} else {
		conn.SetReadDeadline(time.Now().Add(p.Timeout))
	}
	if err := <-recvDone; err != nil {
		return res, fmt.Errorf("prober: %w", err)
	}
	res.Sent = sent
	var ok []time.Duration
	for i := 0; i < n; i++ {
		if rtt[i] >= 0 {
			ok = append(ok, rtt[i])
		}
	}
	res.Answered = len(ok)
	if len(ok) > 0 {
		sort.Slice(ok, func(a, b int) bool { return ok[a] < ok[b] })
		pct := func(q float64) time.Duration {
			i := int(q*float64(len(ok))+0.5) - 1
			return ok[max(0, min(i, len(ok)-1))]
		}
		res.P50, res.P90, res.P99, res.Max = pct(0.50), pct(0.90), pct(0.99), ok[len(ok)-1]
	}
	return res, nil
}
