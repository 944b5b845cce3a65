package daemon_test

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

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
	time.Sleep(200 * time.Millisecond) // santad sees the hang-up
	for _, n := range miss(watcher, 1, "the watcher alone") {
		if n != 1 {
			t.Errorf("the watcher alone got a %d-byte sample, want 1", n)
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
