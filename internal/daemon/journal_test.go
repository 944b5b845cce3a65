package daemon

import (
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
)

func testRule(id uint64, version uint32, pattern string) api.Rule {
	return api.Rule{ID: id, Version: version, ReplyLen: 1,
		Conditions: []api.Condition{{Pattern: api.Bytes(pattern)}},
		Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("r")}}}
}

func TestJournalReplay(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	sock := api.SocketInfo{Cookie: 7, Family: 4, Protocol: 17, Address: api.Bytes{198, 18, 0, 1}, Port: 53, Owner: 1000}
	other := api.SocketInfo{Cookie: 9, Family: 6, Protocol: 17, Port: 53}
	records := []*api.Message{
		{Op: api.OpBind, Sockets: []api.SocketInfo{sock}},
		{Op: api.OpAdd, Socket: 7, Rules: []api.Rule{testRule(1, 1, "a"), testRule(2, 1, "b"), testRule(3, 1, "c")}},
		{Op: api.OpModify, Socket: 7, Rules: []api.Rule{testRule(2, 2, "B")}},
		{Op: api.OpDelete, Socket: 7, IDs: []uint64{1}, Stats: []api.RuleStats{{Hits: 3, Bytes: 30}}},
		{Op: api.OpBind, Sockets: []api.SocketInfo{sock}}, // a bind without the total of rules gone keeps it
		{Op: api.OpBind, Sockets: []api.SocketInfo{other}, SampleBytes: 64, SampleRate: 10},
		{Op: api.OpAdd, Socket: 9, Rules: []api.Rule{testRule(4, 1, "d")}},
		{Op: api.OpReplace, Socket: 9, Rules: []api.Rule{testRule(5, 1, "e")}},
		{Op: api.OpBind, Sockets: []api.SocketInfo{{Cookie: 11, Port: 1}}},
		{Op: api.OpUnbind, Socket: 11},
	}
	j, err := writeJournal(path, records[:2])
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range records[2:] {
		if err := j.append(m); err != nil {
			t.Fatal(err)
		}
	}
	j.close()
	// a crash in the middle of writing a record leaves a torn tail
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write([]byte{40, 0, 0, 0, 1, 2, 3, 4, 0xa1})
	f.Close()

	got, torn, err := readJournal(path)
	if err != nil {
		t.Fatal(err)
	}
	if torn.bytes != 9 {
		t.Errorf("torn tail of %d bytes dropped, want 9", torn.bytes)
	}
	if len(got) != len(records) {
		t.Fatalf("read %d records, want %d (the torn tail dropped)", len(got), len(records))
	}
	sets, lastID, err := replay(got)
	if err != nil {
		t.Fatal(err)
	}
	if lastID != 5 {
		t.Errorf("largest rule id replayed as %d, want 5", lastID)
	}
	if len(sets) != 2 {
		t.Fatalf("%d rule sets replayed, want 2", len(sets))
	}
	want := map[uint64][]uint64{7: {2, 3}, 9: {5}}
	for cookie, ids := range want {
		infos, _ := sets[cookie].ruleInfos(time.Now())
		var gotIDs []uint64
		for _, ri := range infos {
			gotIDs = append(gotIDs, uint64(ri.ID))
		}
		if !reflect.DeepEqual(gotIDs, ids) {
			t.Errorf("socket %d: ids %v, want %v", cookie, gotIDs, ids)
		}
	}
	infos, _ := sets[7].ruleInfos(time.Now())
	if r := infos[0]; r.Version != 2 || string(r.Rule.Conditions[0].Pattern) != "B" {
		t.Errorf("modified rule replayed as version %d %q", r.Version, r.Rule.Conditions[0].Pattern)
	}
	if g := sets[7].gone; g.Hits != 3 || g.Bytes != 30 {
		t.Errorf("hits and bytes of socket 7's rules gone replayed as %+v, want 3 and 30", g)
	}
	if s := sets[9].sample; s.Bytes != 64 || s.PerSecond != 10 {
		t.Errorf("sampling replayed as %+v", s)
	}
	if !reflect.DeepEqual(sets[7].info, sock) {
		t.Errorf("socket info replayed as %+v", sets[7].info)
	}

	// a compacted journal keeps the largest id given out, whose rule may be gone
	sets, lastID, err = replay([]*api.Message{idMark(9), records[0], records[1]})
	if err != nil || lastID != 9 || len(sets) != 1 {
		t.Errorf("journal with an id mark of 9: largest id %d, %d rule sets (%v), want 9 and 1", lastID, len(sets), err)
	}

	// rules a non-root caller added to a rule set root bound are charged to it
	rootBound := api.SocketInfo{Cookie: 13, Port: 7030}
	sets, _, err = replay([]*api.Message{
		{Op: api.OpBind, Sockets: []api.SocketInfo{rootBound}},
		{Op: api.OpAdd, Socket: 13, Rules: []api.Rule{testRule(6, 1, "f"), testRule(7, 1, "g")}, Daemon: &api.DaemonInfo{UID: 1000}},
		{Op: api.OpAdd, Socket: 13, Rules: []api.Rule{testRule(8, 1, "h")}},
		{Op: api.OpModify, Socket: 13, Rules: []api.Rule{testRule(7, 2, "G")}}, // by root: charged to no one now
	})
	if err != nil {
		t.Fatal(err)
	}
	for id, want := range map[uint64]uint32{6: 1000, 7: 0, 8: 0} {
		if got := sets[13].chargedUID(id); got != want {
			t.Errorf("rule %d on a rule set root bound replayed as charged to uid %d, want %d", id, got, want)
		}
	}

	// a record for a socket never bound is corruption, not a torn tail
	if _, _, err := replay([]*api.Message{{Op: api.OpAdd, Socket: 5}}); err == nil {
		t.Error("replay accepted an add for an unbound socket")
	}
}

// TestJournalDamage: a bad last record is a torn tail, dropped; a bad
// record that more data follows is damage, refused with where it is and
// what follows it.
func TestJournalDamage(t *testing.T) {
	path := filepath.Join(t.TempDir(), "journal")
	records := []*api.Message{
		{Op: api.OpBind, Sockets: []api.SocketInfo{{Cookie: 7, Port: 53}}},
		{Op: api.OpAdd, Socket: 7, Rules: []api.Rule{testRule(1, 1, "a")}},
		{Op: api.OpAdd, Socket: 7, Rules: []api.Rule{testRule(2, 1, "b")}},
		{Op: api.OpAdd, Socket: 7, Rules: []api.Rule{testRule(3, 1, "c")}},
	}
	j, err := writeJournal(path, records)
	if err != nil {
		t.Fatal(err)
	}
	j.close()
	good, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// record offsets, from their length fields
	var offsets []int64
	for off := int64(0); off < int64(len(good)); off += 8 + int64(binary.LittleEndian.Uint32(good[off:])) {
		offsets = append(offsets, off)
	}
	damage := func(at int64, b byte) {
		t.Helper()
		bad := slices.Clone(good)
		bad[at] ^= b
		if err := os.WriteFile(path, bad, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	damage(int64(len(good))-1, 0xff) // in the last record's body
	got, torn, err := readJournal(path)
	if err != nil || len(got) != 3 || torn.offset != offsets[3] {
		t.Errorf("last record damaged: %d records, torn tail at %d (%v), want 3 and a torn tail at %d", len(got), torn.offset, err, offsets[3])
	}

	for name, tc := range map[string]struct {
		at     int64
		intact int
	}{
		"checksum": {offsets[1] + 12, 2}, // in the body: the length still finds the records after it
		"length":   {offsets[1] + 3, 0},  // the length past the frame limit: nothing after it can be found
	} {
		damage(tc.at, 0x80)
		_, _, err := readJournal(path)
		var damaged *damagedJournal
		if !errors.As(err, &damaged) {
			t.Errorf("%s of record 1 damaged: %v, want a damaged journal", name, err)
			continue
		}
		if damaged.record != 1 || damaged.offset != offsets[1] || damaged.following != int64(len(good))-offsets[1] ||
			damaged.intactRecords != tc.intact {
			t.Errorf("%s of record 1 damaged: %+v, want record 1 at %d, %d bytes and %d intact records following",
				name, damaged, offsets[1], int64(len(good))-offsets[1], tc.intact)
		}
		if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, "mv ") {
			t.Errorf("%s of record 1 damaged: %q names neither the file nor what to do", name, msg)
		}
	}
}

func TestConfig(t *testing.T) {
	c, err := LoadConfig("../../dist/santad.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	def := DefaultConfig()
	c.Interfaces = nil
	if !reflect.DeepEqual(c, def) {
		t.Errorf("dist/santad.yaml differs from the defaults it documents:\n%+v\n%+v", c, def)
	}
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	for content, want := range map[string]string{
		"quota:\n  rule: 5\n": "field rule not found",
		"xdp_mode: turbo\n":   "xdp_mode",
		"socket_mode: rw\n":   "socket_mode",
		"log_format: xml\n":   "log_format",
	} {
		os.WriteFile(bad, []byte(content), 0o644)
		c, err := LoadConfig(bad)
		if err == nil {
			err = c.Validate()
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %q: %v, want an error about %s", content, err, want)
		}
	}
}

// TestJournalOvergrownOnlyWithSupersededRecords: a journal that only grew
// (binds and adds) is written again as it is by a compaction, so it is not
// compacted however long it gets; once a record may have made earlier ones
// obsolete, it is compacted past twice its compacted size plus compactAt.
func TestJournalOvergrownOnlyWithSupersededRecords(t *testing.T) {
	for _, op := range []api.Op{api.OpModify, api.OpDelete, api.OpReplace, api.OpUnbind} {
		j, err := writeJournal(filepath.Join(t.TempDir(), "journal"), []*api.Message{{Op: api.OpBind, Sockets: []api.SocketInfo{{Cookie: 7}}}})
		if err != nil {
			t.Fatal(err)
		}
		big := testRule(1, 1, strings.Repeat("q", 1<<20))
		for i := 0; j.appended <= 2*j.base+compactAt; i++ {
			big.ID = uint64(i + 1)
			if err := j.append(&api.Message{Op: api.OpAdd, Socket: 7, Rules: []api.Rule{big}}); err != nil {
				t.Fatal(err)
			}
		}
		if j.overgrown() {
			t.Fatalf("after %d bytes of adds only: overgrown; want not (nothing to drop)", j.appended)
		}
		if err := j.append(&api.Message{Op: op, Socket: 7, IDs: []uint64{1}, Rules: []api.Rule{testRule(1, 2, "a")}}); err != nil {
			t.Fatal(err)
		}
		if !j.overgrown() {
			t.Errorf("after %d bytes of adds and a %s: not overgrown; want overgrown", j.appended, op)
		}
		j.close()
	}
}
