package mcctl_test

import (
	"encoding/binary"
	"errors"
	"io"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/mcproto"
)

// A delayed flush_all (text `flush_all 2`, binary FLUSH with an expiration
// extra, and a UDP datagram whose second command is `flush_all 2`) empties
// memcached two seconds after its OK: from then on no GET is answered with
// the value from before, and the key is offloaded again once it is written
// after the flush. The tracker used to bump the epoch only as the request
// and its reply passed, the controller fetched every value again at once,
// and the kernel answered the old values for good; it then saw the delay
// only in the first command of a UDP datagram.
func TestDelayedFlushApplies(t *testing.T) {
	binaryFlush := make([]byte, 24+4)
	binaryFlush[0], binaryFlush[1], binaryFlush[4] = 0x80, 0x08, 4 // FLUSH, 4 bytes of extras
	binary.BigEndian.PutUint32(binaryFlush[8:], 4)                 // body: the extras
	binary.BigEndian.PutUint32(binaryFlush[24:], 2)                // expiration: 2 s
	overTCP := func(request []byte, replyLen int, replyIsOK func([]byte) bool) func(*testing.T, *rig) {
		return func(t *testing.T, r *rig) {
			// opened after the tracker: those before bump the epoch with
			// every segment, which would keep retiring the stale rule
			raw := r.dialTCP(t)
			if _, err := raw.Write(request); err != nil {
				t.Fatal(err)
			}
			reply := make([]byte, replyLen)
			raw.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.ReadFull(raw, reply); err != nil || !replyIsOK(reply) {
				t.Fatalf("delayed flush: reply %q, %v", reply, err)
			}
		}
	}
	for _, c := range []struct {
		name  string
		flush func(*testing.T, *rig)
	}{
		{"text", overTCP([]byte("flush_all 2\r\n"), 4, func(b []byte) bool { return string(b) == "OK\r\n" })},
		{"binary", overTCP(binaryFlush, 24, func(b []byte) bool { return b[0] == 0x81 && b[1] == 0x08 && b[6] == 0 && b[7] == 0 })},
		{"udp second command", func(t *testing.T, r *rig) {
			udp, _ := r.clients(false)
			// the first command asks for no reply: the datagram's one reply is the flush's
			reply, err := udp.Do([]byte("verbosity 0 noreply\r\nflush_all 2\r\n"), 2*time.Second)
			if err != nil || string(reply) != "OK\r\n" {
				t.Fatalf("delayed flush: reply %q, %v", reply, err)
			}
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			const key = "flush:key"
			_, ctl, get := r.offloadOld(key)
			_, conns := r.clients(false)
			c.flush(t, r)
			flushed := time.Now()
			expectFlushApplied(t, r, conns, get, flushed, 5*time.Second)
			// written after the flush applied: offloaded again
			if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
				t.Fatal(err)
			}
			r.waitAnswered(func() { get() }, r.counters()["answered"])
			if v := get(); v != "new" {
				t.Fatalf("the rule after the flush: GET gave %q, want new", v)
			}
			if err := ctl.Stop(20 * time.Second); err != nil {
				t.Fatal(err)
			}
			out := ctl.Output()
			t.Log(out)
			if !regexp.MustCompile(`tracker: .*\bdelayed_flushes=1\b`).MatchString(out) {
				t.Fatal("the done line does not count the delayed flush")
			}
		})
	}
}

// expectFlushApplied polls, until within after flushed, memcached over TCP
// and then the rule processor over UDP: once memcached no longer holds the
// key, a GET must not give the value from before the flush ("old"); and
// memcached must have applied the flush by then.
func expectFlushApplied(t *testing.T, r *rig, conns map[string]mcproto.Conn, get func() string, flushed time.Time, within time.Duration) {
	t.Helper()
	const key = "flush:key"
	var applied time.Duration
	for time.Since(flushed) < within {
		_, err := conns["text"].Gets(key)
		gone := errors.Is(err, mcproto.ErrCacheMiss)
		if err != nil && !gone {
			t.Fatal(err)
		}
		if gone && applied == 0 {
			applied = time.Since(flushed)
		}
		if v := get(); gone && v == "old" {
			t.Fatalf("%v after the delayed flush, memcached applied it, and a GET gave the value from before (counters %v)",
				time.Since(flushed).Round(time.Millisecond), r.counters())
		}
		time.Sleep(20 * time.Millisecond)
	}
	if applied == 0 {
		t.Fatalf("memcached did not apply the delayed flush within %v", within)
	}
	t.Logf("memcached applied the flush %v after its reply", applied.Round(time.Millisecond))
}

// A delayed flush seen by one controller's tracker still holds for the
// next controller: the hold is pinned with the tracker and outlives a
// clean exit while the flush is pending. The next controller used to start
// with an empty hold and offload the values the flush was about to empty.
func TestDelayedFlushAcrossRestart(t *testing.T) {
	r := newRig(t)
	const key = "flush:key"
	_, first, get := r.offloadOld(key)
	raw := r.dialTCP(t)
	// 10 s: the restart (a stop, a start that loads the tracker) must end
	// before memcached applies the flush, on a slow machine too
	if _, err := raw.Write([]byte("flush_all 10\r\n")); err != nil {
		t.Fatal(err)
	}
	reply := make([]byte, 4)
	raw.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(raw, reply); err != nil || string(reply) != "OK\r\n" {
		t.Fatalf("flush_all 10: reply %q, %v", reply, err)
	}
	flushed := time.Now()
	if err := first.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{key})
	r.startController("static", "--keys", file)
	if time.Since(flushed) > 8*time.Second {
		t.Fatalf("the restart took %v: the flush may have applied before it", time.Since(flushed))
	}
	_, conns := r.clients(false) // seen open by the new tracker: they do not bump the epoch
	expectFlushApplied(t, r, conns, get, flushed, 13*time.Second)
}
