package follow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
)

// freePort is a loopback port no socket of the protocol uses right now.
func freePort(t *testing.T, protocol uint32) uint16 {
	t.Helper()
	if protocol == api.ProtocolTCP {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		return uint16(l.Addr().(*net.TCPAddr).Port)
	}
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	return uint16(c.LocalAddr().(*net.UDPAddr).Port)
}

// A UDP socket bound to the port, or a TCP socket listening on it, ends
// the wait; a TCP socket that is only bound does not.
func TestWaitForPort(t *testing.T) {
	udpPort := freePort(t, api.ProtocolUDP)
	tcpPort := freePort(t, api.ProtocolTCP)
	tcp, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Close(tcp)
	if err := syscall.Bind(tcp, &syscall.SockaddrInet4{Port: int(tcpPort), Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		protocol uint32
		port     uint16
		open     func() error // makes the port's server socket
	}{
		{api.ProtocolUDP, udpPort, func() error {
			c, err := net.ListenPacket("udp6", fmt.Sprintf("[::1]:%d", udpPort))
			if err == nil {
				t.Cleanup(func() { c.Close() })
			}
			return err
		}},
		{api.ProtocolTCP, tcpPort, func() error { return syscall.Listen(tcp, 1) }},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 600*time.Millisecond)
		err := WaitForPort(ctx, tc.port, tc.protocol)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("protocol %d, port %d without a server socket: %v, want the deadline", tc.protocol, tc.port, err)
		}

		opened := make(chan error, 1)
		go func() {
			time.Sleep(300 * time.Millisecond)
			opened <- tc.open()
		}()
		ctx, cancel = context.WithTimeout(context.Background(), 10*time.Second)
		start := time.Now()
		err = WaitForPort(ctx, tc.port, tc.protocol)
		cancel()
		if err := <-opened; err != nil {
			t.Fatal(err)
		}
		if err != nil || time.Since(start) < 250*time.Millisecond {
			t.Errorf("protocol %d, port %d: waited %v: %v", tc.protocol, tc.port, time.Since(start), err)
		}
	}
}

func TestRun(t *testing.T) {
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	c, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	port := uint16(c.LocalAddr().(*net.UDPAddr).Port)
	o := Options{Port: port, Protocol: api.ProtocolUDP, Settle: 10 * time.Millisecond, Log: log}
	gone := fmt.Errorf("%w (socket 7)", ErrServerGone)
	notFound := fmt.Errorf("attach: %w", &santa.Error{Op: api.OpBind, Status: api.StatusNotFound, Message: "no socket"})
	other := errors.New("santad went away")

	for _, tc := range []struct {
		name    string
		follow  bool
		results []error // what run returns, call by call
		want    error
		calls   int
	}{
		{"once, fine", false, []error{nil}, nil, 1},
		{"once, gone", false, []error{gone}, ErrServerGone, 1},
		{"once, other", false, []error{other}, other, 1},
		{"follow: gone, not found while starting, then fine", true, []error{gone, notFound, nil}, nil, 3},
		{"follow: gone, then another failure", true, []error{gone, other}, other, 2},
	} {
		calls := 0
		o.Follow = tc.follow
		err := Run(context.Background(), o, func(context.Context) error {
			calls++
			return tc.results[calls-1]
		})
		if calls != tc.calls || !errors.Is(err, tc.want) || (tc.want == nil) != (err == nil) {
			t.Errorf("%s: %d calls, %v; want %d calls, %v", tc.name, calls, err, tc.calls, tc.want)
		}
		if !tc.follow && Gone(err) && !strings.Contains(err.Error(), "--follow") {
			t.Errorf("%s: %q does not mention --follow", tc.name, err)
		}
	}

	// a cancelled context ends the wait for the server
	ctx, cancel := context.WithCancel(context.Background())
	o = Options{Follow: true, Port: freePort(t, api.ProtocolUDP), Protocol: api.ProtocolUDP, Log: log}
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, func(context.Context) error { return gone }) }()
	time.Sleep(300 * time.Millisecond)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run ended with %v after ctx ended, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return within 5 s after ctx ended")
	}
}
