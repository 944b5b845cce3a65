package dataplane

import (
	"testing"
	"time"
)

// A rule stops matching at its Expires time by the data plane's own clock,
// with nobody removing it (counted as pass_expired); another matching rule
// then answers, and a later Expires (a renewed lease) makes it answer again.
func TestExpires(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7720)
	cookie := e.socket(s, false)
	// two seconds ahead: at least one whole second to see it answer first
	expires := uint64(time.Now().Unix() + 2)
	lease := func(at uint64) Rule {
		return Rule{Conditions: []Condition{cond(0, "q")}, Processors: []Processor{put(0, "LEASED")}, ReplyLen: 6, Expires: at}
	}
	ids := e.bindRules(cookie, lease(expires),
		Rule{Conditions: []Condition{cond(0, "q")}, Processors: []Processor{put(0, "KEPT")}, ReplyLen: 4, Priority: 1})
	req := request(c, s, "q")
	e.expect("before expires", req.build(t), xdpTx, req.answer([]byte("LEASED")).build(t), "answered")

	time.Sleep(time.Until(time.Unix(int64(expires), 0)) + 20*time.Millisecond) // the clock is a jiffy coarse
	e.expect("expired, the other rule answers", req.build(t), xdpTx, req.answer([]byte("KEPT")).build(t), "answered")
	if err := e.d.DeleteRules(cookie, ids[1:]); err != nil {
		t.Fatal(err)
	}
	e.expect("expired, alone", req.build(t), xdpPass, nil, "pass_expired")

	if err := e.d.ModifyRules(cookie, []RuleUpdate{{ID: ids[0], Rule: lease(uint64(time.Now().Unix() + 60))}}); err != nil {
		t.Fatal(err)
	}
	e.expect("renewed", req.build(t), xdpTx, req.answer([]byte("LEASED")).build(t), "answered")
	infos, err := e.d.ListRules(cookie)
	if err != nil || len(infos) != 1 || infos[0].Rule.Expires == 0 {
		t.Fatalf("ListRules = %+v, %v: want the renewed rule with its Expires", infos, err)
	}
}
