package mcctl_test

import (
	"encoding/binary"
	"errors"
	"io"
	"net"
	"regexp"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/mcproto"
)

// A delayed flush_all (text `flush_all 2`, binary FLUSH with an expiration
// extra) empties memcached two seconds after its OK: from then on no GET is
// answered with the value from before, and the key is offloaded again once
// it is written after the flush. The tracker used to bump the epoch only as
// the request and its reply passed, the controller fetched every value again
// at once, and the kernel answered the old values for good.
func TestDelayedFlushApplies(t *testing.T) {
	binaryFlush := make([]byte, 24+4)
	binaryFlush[0], binaryFlush[1], binaryFlush[4] = 0x80, 0x08, 4 // FLUSH, 4 bytes of extras
	binary.BigEndian.PutUint32(binaryFlush[8:], 4)                 // body: the extras
	binary.BigEndian.PutUint32(binaryFlush[24:], 2)                // expiration: 2 s
	for _, c := range []struct {
		name         string
		request      []byte
		replyLen     int
		replyIsEmpty func([]byte) bool
	}{
		{"text", []byte("flush_all 2\r\n"), 4, func(b []byte) bool { return string(b) == "OK\r\n" }},
		{"binary", binaryFlush, 24, func(b []byte) bool { return b[0] == 0x81 && b[1] == 0x08 && b[6] == 0 && b[7] == 0 }},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := newRig(t)
			const key = "flush:key"
			_, ctl, get := r.offloadOld(key)
			// opened after the tracker: those before bump the epoch with every
			// segment, which would keep retiring the stale rule
			_, conns := r.clients(false)
			var raw net.Conn
			if err := r.tb.Client.Do(func() (err error) {
				raw, err = net.Dial("tcp", r.mc.Addr4.String())
				return err
			}); err != nil {
				t.Fatal(err)
			}
			defer raw.Close()
			if _, err := raw.Write(c.request); err != nil {
				t.Fatal(err)
			}
			reply := make([]byte, c.replyLen)
			raw.SetReadDeadline(time.Now().Add(2 * time.Second))
			if _, err := io.ReadFull(raw, reply); err != nil || !c.replyIsEmpty(reply) {
				t.Fatalf("delayed flush: reply %q, %v", reply, err)
			}
			flushed := time.Now()
			// memcached's own answer (over TCP) first, then the GET over UDP:
			// once memcached has applied the flush, the GET must miss too
			var applied time.Duration
			for time.Since(flushed) < 5*time.Second {
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
				t.Fatal("memcached did not apply the delayed flush within 5 s")
			}
			t.Logf("memcached applied the flush %v after its reply", applied.Round(time.Millisecond))
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
