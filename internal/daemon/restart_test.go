package daemon_test

import (
	"net/netip"
	"slices"
	"syscall"
	"testing"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestRuleIDsNotReusedAfterRestart: the id of a deleted rule is never given
// out again, also after santad restarts (once with the deleting record in
// the journal, once after a compaction dropped it) or is killed, so a
// client holding a stale id cannot touch another rule.
func TestRuleIDsNotReusedAfterRestart(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	conn, cookie := boundEchoServer(t, tb, sd.client(), netip.AddrPortFrom(tb.Server.IP4, 7950))
	defer conn.Close()
	target := santa.Cookie(cookie)
	addOne := func(c *santa.Client, pattern string) uint64 {
		t.Helper()
		ids, err := c.Add(target, []api.Rule{rule(pattern, 0, "x")})
		if err != nil {
			t.Fatal(err)
		}
		return ids[0]
	}
	c := sd.client()
	var last uint64
	for _, p := range []string{"a", "b", "c"} {
		last = addOne(c, p)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGTERM, syscall.SIGKILL} {
		if err := c.Delete(target, []uint64{last}); err != nil {
			t.Fatal(err)
		}
		sd.stop(sig)
		sd.start()
		c = sd.client()
		id := addOne(c, "after "+sig.String())
		if id <= last {
			t.Fatalf("after deleting rule %d (the newest) and a restart (%v), a new rule got id %d: ids are reused", last, sig, id)
		}
		last = id
	}
	if ids := ruleIDs(t, c, target); !slices.IsSorted(ids) || len(ids) != 3 {
		t.Fatalf("rules %v, want the first two and the last one added", ids)
	}
}
