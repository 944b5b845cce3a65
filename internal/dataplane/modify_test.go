package dataplane

import (
	"errors"
	"fmt"
	"net/netip"
	"reflect"
	"testing"
	"time"
)

// A modified rule answers with its new version at once, and keeps its ID,
// its statistics and its place in the order of rules; its version counts up.
func TestModifyRules(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7610)
	sock := e.socket(s, false)
	// both match "abc": the one added first wins
	ids := e.bindRules(sock, reply("abc", "X"), reply("ab", "Y"), reply("other", "O"))
	answers := func(req, want string) {
		t.Helper()
		p := request(c, s, req)
		e.expect(req+" -> "+want, p.build(t), xdpTx, p.answer([]byte(want)).build(t), "answered")
	}
	stats := func(id RuleID, hits uint64) {
		t.Helper()
		st, err := e.d.RuleStats(sock)
		if err != nil {
			t.Fatal(err)
		}
		if st[id].Hits != hits {
			t.Errorf("rule %d: %d hits, want %d (all: %+v)", id, st[id].Hits, hits, st)
		}
	}
	version := func(id RuleID, want uint32) {
		t.Helper()
		list, err := e.d.ListRules(sock)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range list {
			if r.ID == id {
				if r.Version != want {
					t.Errorf("rule %d: version %d, want %d", id, r.Version, want)
				}
				return
			}
		}
		t.Errorf("rule %d not listed: %+v", id, list)
	}
	answers("abc", "X")
	answers("abc", "X")
	version(ids[0], 1)

	// in place: same region
	if err := e.d.ModifyRules(sock, []RuleUpdate{{ids[0], reply("abc", "X2")}}); err != nil {
		t.Fatal(err)
	}
	answers("abc", "X2") // still before "ab"
	stats(ids[0], 3)
	version(ids[0], 2)

	// a condition at a new offset: the rule set is rebuilt
	deep := Rule{Conditions: []Condition{cond(4, "DEEP")}, Processors: []Processor{put(0, "D")}, ReplyLen: 1}
	if err := e.d.ModifyRules(sock, []RuleUpdate{{ids[2], deep}, {ids[0], reply("abc", "X3")}}); err != nil {
		t.Fatal(err)
	}
	answers("....DEEP", "D")
	answers("abc", "X3")
	e.expect("old version gone", request(c, s, "other").build(t), xdpPass, nil, "pass_no_match")
	stats(ids[0], 4)
	stats(ids[2], 1)
	version(ids[0], 3)
	version(ids[2], 2)
	list, _ := e.d.ListRules(sock)
	if len(list) != 3 || list[0].ID != ids[0] || list[1].ID != ids[1] || list[2].ID != ids[2] {
		t.Errorf("rules after modify: %+v", list)
	}
}

// A modify naming a rule the socket does not have, or an invalid rule,
// changes nothing, not even the valid updates next to it.
func TestModifyRefusedChangesNothing(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7611)
	sock := e.socket(s, false)
	other := e.socket(netip.AddrPortFrom(s.Addr(), 7612), false)
	ids := e.bindRules(sock, reply("key", "A"))
	otherIDs := e.bindRules(other, reply("key", "B"))
	before, _ := e.d.ListRules(sock)

	bad := map[string][]RuleUpdate{
		"unknown id":        {{ids[0], reply("key", "new")}, {ids[0] + 1000, reply("key", "x")}},
		"other socket's id": {{ids[0], reply("key", "new")}, {otherIDs[0], reply("key", "x")}},
		"same id twice":     {{ids[0], reply("key", "new")}, {ids[0], reply("key", "x")}},
		"invalid rule":      {{ids[0], reply("key", "new")}, {ids[0], Rule{Conditions: []Condition{cond(0, "key")}}}},
	}
	for name, updates := range bad {
		err := e.d.ModifyRules(sock, updates)
		if err == nil {
			t.Errorf("%s: accepted", name)
		}
		if name == "invalid rule" && !errors.Is(err, ErrInvalidRule) {
			t.Errorf("%s: error %v, want ErrInvalidRule", name, err)
		}
	}
	if after, _ := e.d.ListRules(sock); !reflect.DeepEqual(after, before) {
		t.Errorf("rules after refused modifies: %+v, want %+v", after, before)
	}
	p := request(c, s, "key")
	e.expect("unchanged", p.build(t), xdpTx, p.answer([]byte("A")).build(t), "answered")
	st, _ := e.d.RuleStats(sock)
	if st[ids[0]].Hits != 1 {
		t.Errorf("stats after refused modifies: %+v", st)
	}
	if err := e.d.ModifyRules(other, []RuleUpdate{{ids[0], reply("key", "x")}}); err == nil {
		t.Error("modified socket A's rule through socket B")
	}
}

// While a rule is modified over and over, in place and by rebuilds, every
// request for it is answered: by the old or the new version, never neither.
func TestModifyNeverNeither(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7613)
	sock := e.socket(s, false)
	ids := e.bindRules(sock, reply("kkey", "R000"))
	const versions = 60
	req := request(c, s, "kkey")
	frame := req.build(t)
	valid := map[string]bool{}
	for v := 0; v < versions; v++ {
		valid[string(req.answer([]byte(fmt.Sprintf("R%03d", v))).build(t))] = true
	}

	done := make(chan struct{})
	result := make(chan error, 1)
	go func() {
		runs := 0
		defer func() { t.Logf("%d requests while modifying", runs) }()
		for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); runs++ {
			select {
			case <-done:
				result <- nil
				return
			default:
			}
			var verdict uint32
			var out []byte
			err := e.tb.Server.Do(func() error {
				var err error
				verdict, out, err = e.d.Program().Test(frame)
				return err
			})
			if err != nil || verdict != xdpTx || !valid[string(out)] {
				result <- fmt.Errorf("request %d: verdict %d, error %v, reply %x", runs, verdict, err, out)
				return
			}
		}
		result <- errors.New("modifications did not finish within 30 s")
	}()
	for v := 1; v < versions; v++ {
		r := reply("kkey", fmt.Sprintf("R%03d", v))
		if v%4 >= 2 { // anchored at offset 1: on a change of anchor the rule set is rebuilt
			r.Conditions = []Condition{cond(1, "key"), cond(0, "k")}
		}
		if err := e.d.ModifyRules(sock, []RuleUpdate{{ids[0], r}}); err != nil {
			close(done)
			t.Fatalf("version %d: %v", v, err)
		}
		time.Sleep(time.Millisecond)
	}
	close(done)
	if err := <-result; err != nil {
		t.Fatal(err)
	}
	p := request(c, s, "kkey")
	e.expect("last version", p.build(t), xdpTx, p.answer([]byte(fmt.Sprintf("R%03d", versions-1))).build(t), "answered")
}

// A rule deleted right after a modify does not answer in its old version,
// which stays linked for a while for packets in flight.
func TestDeleteAfterModify(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7614)
	sock := e.socket(s, false)
	ids := e.bindRules(sock, reply("key", "A"))
	if err := e.d.ModifyRules(sock, []RuleUpdate{{ids[0], reply("key", "B")}}); err != nil {
		t.Fatal(err)
	}
	if err := e.d.DeleteRules(sock, ids); err != nil {
		t.Fatal(err)
	}
	p := request(c, s, "key")
	e.expect("deleted", p.build(t), xdpPass, p.build(t), "pass_no_match")
}
