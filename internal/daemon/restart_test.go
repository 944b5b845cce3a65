package daemon_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
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

// TestDamagedJournalRefused: a journal with a bad record that more records
// follow makes santad refuse to start, saying where the damage is and what
// to do, and leave the journal as it is (a santad that read up to the damage
// would drop the rules recorded after it and compact the evidence away); the
// rules keep answering, and with the journal moved aside santad starts.
func TestDamagedJournalRefused(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7951)
	c := sd.client()
	conn, cookie := boundEchoServer(t, tb, c, server)
	defer conn.Close()
	for i := range 3 { // a record each, after the bind's
		if _, err := c.Add(santa.Cookie(cookie), []api.Rule{rule(fmt.Sprintf("ask %d", i), 0, fmt.Sprintf("answer %d", i))}); err != nil {
			t.Fatal(err)
		}
	}
	sd.stop(syscall.SIGTERM)

	path := filepath.Join(sd.dir, "state", "journal")
	journal, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	second := 8 + int(binary.LittleEndian.Uint32(journal)) // the first add, after the bind
	journal[second+12] ^= 0x01
	if err := os.WriteFile(path, journal, 0o644); err != nil {
		t.Fatal(err)
	}
	err = sd.Start(context.Background())
	for _, want := range []string{"journal " + path + " is damaged", fmt.Sprintf("record 1 at byte %d", second),
		fmt.Sprintf("%d bytes follow it, 2 more records read intact", len(journal)-second), "mv " + path} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Fatalf("santad with a damaged journal: %v, want a refusal to start saying %q", err, want)
		}
	}
	if !strings.Contains(sd.Log(), "level=ERROR msg=\"journal damaged") {
		t.Errorf("no error in santad's log:\n%s", sd.Log())
	}
	if after, err := os.ReadFile(path); err != nil || !bytes.Equal(after, journal) {
		t.Fatalf("santad changed the damaged journal (%v): it must keep it for the operator", err)
	}
	for i := range 3 {
		if got, want := exchange(t, tb, server, fmt.Sprintf("ask %d", i)), fmt.Sprintf("answer %d", i); got != want {
			t.Fatalf("with no santad running: %q, want %q from the rule left by the first santad", got, want)
		}
	}

	if err := os.Rename(path, path+".damaged"); err != nil {
		t.Fatal(err)
	}
	sd.start()
	if rules, err := sd.client().ListRules(santa.Cookie(cookie)); err == nil {
		t.Fatalf("santad started without a journal still has socket %d's rule set: %d rules", cookie, len(rules))
	}
}

// TestEventCountersCarried: santa_dataplane_events_total does not fall
// when santad restarts (gracefully or killed): a new santad adds its
// predecessor's counts, by name, to its own. It used to start at zero.
func TestEventCountersCarried(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7952)
	conn, cookie := boundEchoServer(t, tb, sd.client(), server)
	defer conn.Close()
	addPingPong(t, sd.client(), santa.Cookie(cookie))
	answered := func() int {
		t.Helper()
		for _, l := range strings.Split(sd.scrape(), "\n") {
			var n int
			if _, err := fmt.Sscanf(l, `santa_dataplane_events_total{event="answered"} %d`, &n); err == nil {
				return n
			}
		}
		t.Fatal("no answered counter in the metrics")
		return 0
	}
	want := 0
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		for range 5 {
			if got := exchange(t, tb, server, "ping"); got != "pong" {
				t.Fatalf("ping: %q", got)
			}
		}
		want += 5
		if n := answered(); n != want {
			t.Fatalf("before a restart (%v): answered %d, want %d", sig, n, want)
		}
		sd.stop(sig)
		sd.start()
		if n := answered(); n != want {
			t.Fatalf("after a restart (%v): answered %d, want the %d before it", sig, n, want)
		}
	}
}

// TestCompactionLeftoversRemoved: santad killed while it compacts the
// journal leaves the new journal it was writing (.journal-*, as large as
// the journal, in /run: memory). The next santad removes it, and so does
// santad cleanup; they used to stay for good, one more per such kill.
func TestCompactionLeftoversRemoved(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7952)
	conn, cookie := boundEchoServer(t, tb, sd.client(), server)
	defer conn.Close()
	if _, err := sd.client().Add(santa.Cookie(cookie), []api.Rule{rule("ask", 0, "answer")}); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(sd.dir, "state")
	// what a kill mid-compaction leaves: racing a real one is left to chance
	leave := func() string {
		t.Helper()
		name := filepath.Join(state, ".journal-4711")
		if err := os.WriteFile(name, bytes.Repeat([]byte{1}, 1<<20), 0o600); err != nil {
			t.Fatal(err)
		}
		return name
	}
	sd.stop(syscall.SIGKILL)
	left := leave()
	sd.start()
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("santad started beside %s, an unfinished compaction's file, and left it (%v)", left, err)
	}
	if !strings.Contains(sd.Log(), "removed the files of journal compactions") {
		t.Errorf("santad's log does not say it removed %s", left)
	}
	if got := exchange(t, tb, server, "ask"); got != "answer" {
		t.Fatalf("after the restart: %q, want the rule's answer", got)
	}
	sd.stop(syscall.SIGKILL)
	left = leave()
	if err := sd.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(left); !os.IsNotExist(err) {
		t.Fatalf("santad cleanup left %s (%v)", left, err)
	}
}

// TestJournalFull: a change santad cannot journal for want of room is
// refused, and undone if it can be (an add), or reported as made but not
// recorded (a replace, which a restart undoes); once there is room again,
// santad records changes again and a restart finds an intact journal. A
// failed write used to stick in the journal's writer: santad refused every
// later change until restarted.
func TestJournalFull(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	state := filepath.Join(sd.dir, "state")
	if err := os.Mkdir(state, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", state, "tmpfs", 0, "size=64k"); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		sd.stop(syscall.SIGKILL) // before its state goes
		unix.Unmount(state, 0)
	})
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7953)
	c := sd.client()
	conn, cookie := boundEchoServer(t, tb, c, server)
	defer conn.Close()
	target := santa.Cookie(cookie)
	big := strings.Repeat("x", 1000)
	var ids []uint64
	var err error
	for i := 0; err == nil; i++ {
		if i == 1000 {
			t.Fatal("1000 rules of 1 kB in a journal on 64 kB")
		}
		var added []uint64
		if added, err = c.Add(target, []api.Rule{rule(fmt.Sprintf("ask %d", i), 0, big)}); err == nil {
			ids = append(ids, added...)
		}
	}
	if !errors.Is(err, santa.ErrInternal) || !strings.Contains(err.Error(), "no space left on device") ||
		!strings.Contains(err.Error(), "made none") || strings.Contains(err.Error(), ".journal-") {
		t.Fatalf("add on a full state directory: %v, want an internal error saying no space is left on the journal's file, and that santad made no change", err)
	}
	if got := ruleIDs(t, c, target); len(got) != len(ids) {
		t.Fatalf("%d rules after the refused add, want the %d added before", len(got), len(ids))
	}
	// a replace cannot be undone: the old rules are gone from the data plane
	if _, err := c.Replace(target, []api.Rule{rule("new 1", 0, big), rule("new 2", 0, big)}); err == nil ||
		!strings.Contains(err.Error(), "made the change but could not record it") || !strings.Contains(err.Error(), "a restart of santad would undo it") {
		t.Fatalf("replace on a full state directory: %v, want an error saying the rules are replaced but a restart would undo it", err)
	}
	if got := ruleIDs(t, c, target); len(got) != 2 {
		t.Fatalf("%d rules after the replace that could not be recorded, want its 2", len(got))
	}
	if err := unix.Mount("tmpfs", state, "tmpfs", unix.MS_REMOUNT, "size=4m"); err != nil {
		t.Fatal(err)
	}
	added, err := c.Add(target, []api.Rule{rule("after", 0, "room again")})
	if err != nil {
		t.Fatalf("add once there is room again: %v", err)
	}
	sd.stop(syscall.SIGTERM)
	sd.start()
	if got := ruleIDs(t, sd.client(), target); len(got) != len(ids)+1 || got[len(got)-1] != added[0] {
		t.Fatalf("after a restart: rules %v, want the %d added before the disk was full (the replace was not recorded) and %d", got, len(ids), added[0])
	}
	if got := exchange(t, tb, server, "after"); got != "room again" {
		t.Fatalf("after a restart: %q, want the answer of the rule added once there was room", got)
	}
}
