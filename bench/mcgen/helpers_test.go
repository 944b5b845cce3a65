//go:build linux

package mcgen

import (
	"bytes"
	"context"
	"fmt"
	"net/netip"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// memcachedPath is Debian's memcached (package memcached).
const memcachedPath = "/usr/bin/memcached"

const mcPort = 11211

// serverRcvbuf is the receive buffer of memcached's UDP sockets in the
// tests (SetUDPRcvbuf): live frames arrive as page-sized skbs, so the
// default would hold only 50 datagrams.
const serverRcvbuf = RcvbufForLiveFrames

// startMemcached runs memcached in the server namespace, UDP only, on both
// server addresses, one worker thread, pinned to cpu (-1: not pinned), with
// the receive buffers of its UDP sockets raised to serverRcvbuf. It
// fails the test (does not skip) when memcached is not installed. It is
// stopped at the end of the test.
func startMemcached(t *testing.T, tb *testbed.Testbed, cpu int) int {
	t.Helper()
	if _, err := os.Stat(memcachedPath); err != nil {
		t.Fatalf("%s missing: install Debian package memcached (apt-get install -y memcached): %v", memcachedPath, err)
	}
	listen := fmt.Sprintf("%s,[%s]", tb.Server.IP4, tb.Server.IP6)
	ctx, cancel := context.WithCancel(context.Background())
	cmd := testbed.Command(ctx, tb.Server.NS, memcachedPath,
		"-U", strconv.Itoa(mcPort), "-p", "0", "-l", listen, "-u", "memcache", "-t", "1", "-m", "64")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = 3 * time.Second
	if err := cmd.Start(); err != nil {
		cancel()
		t.Fatalf("start memcached: %v", err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	t.Cleanup(func() {
		cancel() // kills the process we started (ip netns exec execs memcached)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Errorf("memcached pid %d did not exit", cmd.Process.Pid)
		}
	})
	// Ready when it answers a UDP "version" on both addresses.
	for _, a := range []netip.Addr{tb.Server.IP4, tb.Server.IP6} {
		deadline := time.Now().Add(5 * time.Second)
		for {
			if _, err := mcRequest(tb, a, append(appendHeader(nil, 1), "version\r\n"...)); err == nil {
				break
			}
			select {
			case <-done:
				t.Fatalf("memcached exited: %s", out.String())
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("memcached on %s not answering: %s", a, out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if n, err := SetUDPRcvbuf(cmd.Process.Pid, serverRcvbuf); err != nil || n == 0 {
		t.Fatalf("raise memcached's UDP receive buffers: %d sockets, %v", n, err)
	}
	if cpu >= 0 {
		if err := testbed.PinProcess(cmd.Process.Pid, cpu); err != nil {
			t.Fatalf("pin memcached: %v", err)
		}
	}
	return cmd.Process.Pid
}

// mcRequest sends one memcached UDP datagram from the client namespace and
// returns the reply datagram.
func mcRequest(tb *testbed.Testbed, a netip.Addr, req []byte) ([]byte, error) {
	c, err := tb.DialUDP(netip.AddrPortFrom(a, mcPort))
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if _, err := c.Write(req); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 2048)
	n, err := c.Read(buf)
	if err != nil {
		return nil, err
	}
	return buf[:n], nil
}
