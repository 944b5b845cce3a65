package dataplane

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/testbed"
)

// Misses are sampled per rule set, cut to the configured length, and no
// faster than the configured rate per CPU.
func TestMissSamples(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7100)
	sampled := e.socket(s, false)
	e.bindRules(sampled, reply("Hello", "COMSYS"))
	if err := e.d.SetSampling(sampled, SampleOptions{Bytes: 8, PerSecond: 3}); err != nil {
		t.Fatal(err)
	}
	quiet := e.socket(netip.AddrPortFrom(s.Addr(), 7101), false) // has rules but sampling off
	e.bindRules(quiet, reply("Hello", "COMSYS"))

	ms, err := e.d.OpenMissSamples()
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()

	// one CPU, so one per-CPU budget applies
	err = e.tb.Server.Do(func() error {
		var set unix.CPUSet
		set.Set(0)
		if err := unix.SchedSetaffinity(0, &set); err != nil {
			return err
		}
		for i := 0; i < 5; i++ {
			for _, dst := range []uint16{7100, 7101} {
				frame := request(c, netip.AddrPortFrom(s.Addr(), dst), fmt.Sprintf("miss-request-%d", i)).build(t)
				if v, _, err := e.d.Program().Test(frame); err != nil || v != xdpPass {
					return fmt.Errorf("miss %d: verdict %d, %v", i, v, err)
				}
			}
		}
		// a hit is never sampled
		if v, _, err := e.d.Program().Test(request(c, s, "Hello").build(t)); err != nil || v != xdpTx {
			return fmt.Errorf("hit: verdict %d, %v", v, err)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	got := readSamples(ms, 3)
	if len(got) != 3 {
		t.Fatalf("got %d samples, want 3 (the rate limit)", len(got))
	}
	for i, m := range got {
		want := []byte(fmt.Sprintf("miss-request-%d", i))
		if m.Cookie != sampled || m.Family != 4 || m.Len != len(want) || !bytes.Equal(m.Payload, want[:8]) {
			t.Errorf("sample %d: %+v, want cookie %#x, len %d, payload %q", i, m, sampled, len(want), want[:8])
		}
	}
	cnt := e.counters()
	if cnt["miss_sampled"] != 3 || cnt["miss_sample_limited"] != 2 {
		t.Errorf("miss_sampled %d, miss_sample_limited %d; want 3 and 2", cnt["miss_sampled"], cnt["miss_sample_limited"])
	}
}

// Data on a connection the kernel owns is a miss sample for its listener's
// rule set, only on a port whose rule set takes samples (santa_ports'
// SANTA_PORTS_TCP_SAMPLED set, kept by Bind, SetSampling and Unbind): a
// kernel connection to any other port is neither sampled nor looked up.
func TestKernelDataSampledOnSampledPorts(t *testing.T) {
	tb := testbed.New(t)
	d := loadAttached(t, tb, Config{})
	sampledAddr := netip.AddrPortFrom(tb.Server.IP4, 8081)
	plainAddr := netip.AddrPortFrom(tb.Server.IP4, 8082)
	sampled := startTCPServer(t, tb, sampledAddr)
	startTCPServer(t, tb, plainAddr)
	if err := d.Bind(sampled.sock(), SampleOptions{Bytes: 64, PerSecond: 1000}); err != nil {
		t.Fatal(err)
	}
	ms, err := d.OpenMissSamples()
	if err != nil {
		t.Fatal(err)
	}
	defer ms.Close()
	exchange := func(c net.Conn, r *bufio.Reader, path string) {
		t.Helper()
		io.WriteString(c, httpGet(path, ""))
		if got, want := readReply(t, c, r), httpReply("kernel GET "+path+" HTTP/1.1", ""); got != want {
			t.Fatalf("%s: %q, want %q", path, got, want)
		}
	}
	wantPorts := func(port uint16, tcp, sampledSet bool) {
		t.Helper()
		if got := portInSet(t, d, portsTCP, port); got != tcp {
			t.Errorf("port %d in the TCP set: %v, want %v", port, got, tcp)
		}
		if got := portInSet(t, d, portsTCPSampled, port); got != sampledSet {
			t.Errorf("port %d in the sampled TCP set: %v, want %v", port, got, sampledSet)
		}
	}
	wantPorts(sampledAddr.Port(), true, true)
	wantPorts(plainAddr.Port(), false, false)

	// the kernel's own connection to a port without a rule set
	plain := dialFromClient(t, tb, plainAddr)
	plainR := bufio.NewReader(plain)
	exchange(plain, plainR, "/plain")
	// eBPF answers the handshake; the first request (no rule) hands the
	// connection over, and the second arrives on a connection the kernel owns
	c := dialFromClient(t, tb, sampledAddr)
	r := bufio.NewReader(c)
	exchange(c, r, "/first")
	exchange(c, r, "/second")
	exchange(plain, plainR, "/plain-again")
	// sampling off: the port leaves the sampled set, not the TCP one
	if err := d.SetSampling(sampled.cookie, SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	wantPorts(sampledAddr.Port(), true, false)
	exchange(c, r, "/third")

	want := []string{httpGet("/first", ""), httpGet("/second", "")}
	var got []string
	for _, m := range readSamples(ms, len(want)) {
		if m.Cookie != sampled.cookie {
			got = append(got, fmt.Sprintf("cookie %#x: %q", m.Cookie, m.Payload))
			continue
		}
		got = append(got, string(m.Payload))
	}
	if !slices.Equal(got, want) {
		t.Errorf("samples %q, want %q (the socket-less miss, then the kernel-owned one)", got, want)
	}
	cnt := counterNames(t, d)
	if cnt["tcp_handed_over"] != 1 || cnt["tcp_pass_kernel_socket"] == 0 || cnt["pass_port_unbound"] == 0 {
		t.Errorf("tcp_handed_over %d, tcp_pass_kernel_socket %d, pass_port_unbound %d; want 1, some and some",
			cnt["tcp_handed_over"], cnt["tcp_pass_kernel_socket"], cnt["pass_port_unbound"])
	}
	if err := d.Unbind(sampled.cookie); err != nil {
		t.Fatal(err)
	}
	wantPorts(sampledAddr.Port(), false, false)
	// socket-less connections outlive the rule set: TC still checks stamps there
	if !portInSet(t, d, portsTCPSeen, sampledAddr.Port()) || portInSet(t, d, portsTCPSeen, plainAddr.Port()) {
		t.Errorf("TCP ports seen with a rule set: %d %v, %d %v; want true, false", sampledAddr.Port(),
			portInSet(t, d, portsTCPSeen, sampledAddr.Port()), plainAddr.Port(), portInSet(t, d, portsTCPSeen, plainAddr.Port()))
	}
}

// readSamples reads ms until want samples have come (at most 5 s), then
// for 300 ms more, so that one too many shows; it closes ms. (Read looks
// at the ring every 100 ms: how soon the samples come depends on the
// machine's load.)
func readSamples(ms *MissSamples, want int) []MissSample {
	samples := make(chan MissSample)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := ms.Read()
			if err != nil {
				return
			}
			samples <- m
		}
	}()
	var got []MissSample
	timeout := time.After(5 * time.Second)
wait:
	for {
		select {
		case m := <-samples:
			got = append(got, m)
			if len(got) == want {
				timeout = time.After(300 * time.Millisecond) // for one too many
			}
		case <-timeout:
			break wait
		}
	}
	ms.Close()
	for {
		select {
		case m := <-samples: // a Read that returned as ms closed
			got = append(got, m)
		case <-done:
			return got
		}
	}
}
