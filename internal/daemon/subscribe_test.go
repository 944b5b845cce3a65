package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// TestBindSamplingNeedsRate: a bind that turns sampling on without a rate
// would take no sample (the rule processor allows 0 a second), silently; it
// is refused, as a subscribe without one is, and binds nothing.
func TestBindSamplingNeedsRate(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	conn, target := serverSocket(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7911))
	defer conn.Close()
	c := sd.client()
	if _, err := c.Bind(target, santa.SampleOptions{Bytes: 64}); !errors.Is(err, santa.ErrInvalid) || !strings.Contains(err.Error(), "sample_rate") {
		t.Fatalf("bind with sample bytes and no rate: %v, want invalid naming sample_rate", err)
	}
	if socks, err := c.ListSockets(); err != nil || len(socks) != 0 {
		t.Fatalf("after the refused bind: %+v (%v), want no rule set", socks, err)
	}
}

// TestSubscribersWidestSampling: a socket with several subscribers is
// sampled as widely as any of them asks (most bytes, highest rate), so a
// subscriber that only watches the socket (1 byte, once a second, as the
// controllers' watch-only mode) does not thin out a learner's samples,
// whichever subscribed last. When the learner leaves, the sampling narrows
// to the watcher's.
func TestSubscribersWidestSampling(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7910)
	c := sd.client()
	conn, cookie := boundEchoServer(t, tb, c, server)
	defer conn.Close()

	type stream struct {
		mu      sync.Mutex
		lengths []int
		cancel  context.CancelFunc
		done    chan struct{}
	}
	subscribe := func(opts santa.SampleOptions) *stream {
		sub, err := santa.Subscribe(sd.Socket, santa.Cookie(cookie), opts)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		s := &stream{cancel: cancel, done: make(chan struct{})}
		go func() {
			defer close(s.done)
			sub.Each(ctx, func(smp santa.Sample) {
				s.mu.Lock()
				s.lengths = append(s.lengths, len(smp.Data))
				s.mu.Unlock()
			})
		}()
		t.Cleanup(func() { s.cancel(); <-s.done })
		return s
	}
	got := func(s *stream) []int {
		s.mu.Lock()
		defer s.mu.Unlock()
		return append([]int(nil), s.lengths...)
	}
	// send misses until s has want samples more (at most 5 s)
	miss := func(s *stream, want int, what string) []int {
		t.Helper()
		before := len(got(s))
		deadline := time.Now().Add(5 * time.Second)
		for i := 0; len(got(s)) < before+want; i++ {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d samples in 5 s, want %d", what, len(got(s))-before, want)
			}
			exchange(t, tb, server, fmt.Sprintf("miss %d %s", i, strings.Repeat("x", 100)))
		}
		return got(s)[before:]
	}

	learner := subscribe(santa.SampleOptions{Bytes: 64, Rate: 1000})
	watcher := subscribe(santa.SampleOptions{Bytes: 1, Rate: 1}) // after the learner
	for _, n := range miss(learner, 20, "the learner, with a watcher subscribed after it") {
		if n != 64 {
			t.Fatalf("the learner got a %d-byte sample, want 64 (the watcher narrowed the sampling)", n)
		}
	}
	for deadline := time.Now().Add(2 * time.Second); len(got(watcher)) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // its stream runs on its own connection and goroutine
	}
	if n := got(watcher); len(n) == 0 || n[0] != 64 {
		t.Errorf("the watcher got samples of %v bytes, want the socket's widest sampling (64)", n)
	}

	learner.cancel()
	<-learner.done
	// santad sees the hang-up in its own time, and samples taken before
	// that may still be on their way: misses until a 1-byte sample comes
	// (at most 5 s), then the next must be 1 byte too
	for deadline := time.Now().Add(5 * time.Second); ; {
		s := miss(watcher, 1, "the watcher alone")
		if s[len(s)-1] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the watcher alone still got %d-byte samples 5 s after the learner left, want 1", s[len(s)-1])
		}
	}
	for _, n := range miss(watcher, 1, "the watcher alone, sampling narrowed") {
		if n != 1 {
			t.Errorf("the watcher alone got a %d-byte sample after a 1-byte one, want 1", n)
		}
	}

	// santad stops cleanly while a subscriber streams (its stream, ended
	// by the stop, used to restore the sampling in the closed data plane:
	// a panic and exit status 2)
	subscribe(santa.SampleOptions{Bytes: 64, Rate: 1000})
	miss(watcher, 1, "with a second subscriber")
	stopped := make(chan struct{})
	misses := make(chan struct{})
	go func() { // misses while santad stops: samples stream as it does
		defer close(misses)
		for i := 0; i < 20000; i++ {
			select {
			case <-stopped:
				return
			default:
			}
			exchangeOnce(tb, server, fmt.Sprintf("late miss %d", i))
		}
	}()
	time.Sleep(100 * time.Millisecond)
	sd.stop(syscall.SIGTERM)
	close(stopped)
	<-misses
	if strings.Contains(sd.Log(), "panic") {
		t.Errorf("santad panicked on SIGTERM:\n%s", sd.Log())
	}
}

// TestStuckSubscriberLetGo: a subscriber that never reads its samples (its
// socket buffer full, santad's write to it blocked) loses its stream when
// its socket closes, at once, and otherwise once a write has waited 10 s
// (sampleWriteTimeout): santad closes the connection. Its stream used to
// hold a goroutine and up to 1024 queued samples until the client hung up,
// its socket long gone.
func TestStuckSubscriberLetGo(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	// stuck subscribes to a socket's samples, reads the answer and no more
	stuck := func(cookie uint64) *api.Conn {
		conn, err := api.Dial(sd.Socket)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		if err := conn.Send(&api.Message{V: api.Version, Op: api.OpSubscribe, Seq: 1, Socket: cookie,
			SampleBytes: 1472, SampleRate: 100000}, -1); err != nil {
			t.Fatal(err)
		}
		if resp, _, err := conn.Recv(); err != nil || resp.Status != api.StatusOK {
			t.Fatalf("subscribe: %+v %v", resp, err)
		}
		return conn
	}
	// fill sends misses until santad's writes to conn fill its buffer
	fill := func(conn *api.Conn, server netip.AddrPort) {
		t.Helper()
		client, err := tb.DialUDP(server)
		if err != nil {
			t.Fatal(err)
		}
		defer client.Close()
		miss := []byte(strings.Repeat("m", 1400))
		for deadline := time.Now().Add(10 * time.Second); unread(t, conn) < 150<<10; {
			if time.Now().After(deadline) {
				t.Fatalf("%d bytes of samples unread after 10 s of misses, want the buffer full", unread(t, conn))
			}
			for i := 0; i < 100; i++ {
				client.Write(miss)
			}
			time.Sleep(20 * time.Millisecond)
		}
		for i := 0; i < 500; i++ { // more than the buffer holds: santad's write blocks
			client.Write(miss)
		}
		time.Sleep(300 * time.Millisecond) // santad reads the sample ring every 100 ms
	}

	closing, closingCookie := boundEchoServer(t, tb, c, netip.AddrPortFrom(tb.Server.IP4, 7920))
	open, openCookie := boundEchoServer(t, tb, c, netip.AddrPortFrom(tb.Server.IP4, 7921))
	defer open.Close()
	onClosing, onOpen := stuck(closingCookie), stuck(openCookie)
	fill(onClosing, netip.AddrPortFrom(tb.Server.IP4, 7920))
	fill(onOpen, netip.AddrPortFrom(tb.Server.IP4, 7921))
	t0 := time.Now()
	closing.Close()
	if !hungUp(t, onClosing, 3*time.Second) {
		t.Errorf("santad kept the stuck stream of a closed socket's subscriber for 3 s")
	}
	if !hungUp(t, onOpen, 15*time.Second-time.Since(t0)) {
		t.Errorf("santad kept a stuck subscriber's stream for 15 s")
	} else if waited := time.Since(t0); waited < 5*time.Second {
		t.Errorf("santad ended a stuck subscriber's stream after %v, want 10 s", waited)
	}
	for deadline := time.Now().Add(2 * time.Second); !strings.Contains(sd.Log(), "subscriber read no samples") &&
		time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond) // the log comes through a pipe
	}
	if !strings.Contains(sd.Log(), "subscriber read no samples for 10s") {
		t.Errorf("santad's log does not say why it ended the stream")
	}
	if _, _, err := c.Health(); err != nil {
		t.Error(err)
	}
}

// unread is how many bytes conn has received and not read.
func unread(t *testing.T, conn *api.Conn) int {
	raw, err := conn.Unix().SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var n int
	raw.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.SIOCINQ) })
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// hungUp says whether santad closes its end of conn within d (conn's
// unread bytes stay unread).
func hungUp(t *testing.T, conn *api.Conn, d time.Duration) bool {
	raw, err := conn.Unix().SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var events int16
	deadline := time.Now().Add(d)
	raw.Control(func(fd uintptr) {
		fds := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLRDHUP}}
		for { // a signal to the Go runtime (preemption) interrupts poll: poll again for the rest
			_, err = unix.Poll(fds, int(max(time.Until(deadline), 0).Milliseconds()))
			if err != unix.EINTR {
				break
			}
		}
		if err == nil {
			events = fds[0].Revents
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	return events&unix.POLLRDHUP != 0
}
