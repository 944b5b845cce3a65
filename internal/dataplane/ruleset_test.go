package dataplane

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"net/netip"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

func TestRuleLifecycle(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7200)
	sock := e.socket(s, false)
	ids := e.bindRules(sock, reply("key-a", "A"), reply("key-b", "B"))
	answers := func(req, want string) {
		t.Helper()
		p := request(c, s, req)
		e.expect(req, p.build(t), xdpTx, p.answer([]byte(want)).build(t), "answered")
	}
	misses := func(req string) {
		t.Helper()
		e.expect(req, request(c, s, req).build(t), xdpPass, nil, "pass_no_match")
	}
	answers("key-a", "A")
	answers("key-b", "B")

	// same offset and length: added in place, visible at once
	more, err := e.d.AddRules(sock, []Rule{reply("key-c", "C")})
	if err != nil {
		t.Fatal(err)
	}
	answers("key-c", "C")
	// a new offset needs new regions: the rule set is rebuilt, counters survive
	deep := Rule{Conditions: []Condition{cond(4, "DEEP")}, Processors: []Processor{put(0, "D")}, ReplyLen: 1}
	if _, err := e.d.AddRules(sock, []Rule{deep}); err != nil {
		t.Fatal(err)
	}
	answers("....DEEP", "D")
	answers("key-a", "A")
	stats, err := e.d.RuleStats(sock)
	if err != nil {
		t.Fatal(err)
	}
	if stats[ids[0]].Hits != 2 || stats[more[0]].Hits != 1 || stats[ids[0]].Bytes == 0 {
		t.Errorf("stats after rebuild: %+v", stats)
	}

	if err := e.d.DeleteRules(sock, []RuleID{ids[1]}); err != nil {
		t.Fatal(err)
	}
	misses("key-b")
	answers("key-a", "A")
	if err := e.d.DeleteRules(sock, []RuleID{ids[1]}); err == nil {
		t.Error("deleting a deleted rule succeeded")
	}

	// replace swaps everything at once
	if _, err := e.d.ReplaceRules(sock, []Rule{reply("key-z", "Z")}); err != nil {
		t.Fatal(err)
	}
	misses("key-a")
	misses("key-c")
	answers("key-z", "Z")
	list, _ := e.d.ListRules(sock)
	if len(list) != 1 || string(list[0].Rule.Conditions[0].Pattern) != "key-z" {
		t.Errorf("rules after replace: %+v", list)
	}

	if err := e.d.Unbind(sock); err != nil {
		t.Fatal(err)
	}
	e.expect("unbound", request(c, s, "key-z").build(t), xdpPass, nil, "pass_port_unbound")
}

// A listing in pages sees each rule once, in ID order, across deletes,
// modifies and adds between the pages.
func TestVisitRules(t *testing.T) {
	e := newEnv(t, Config{})
	_, s := fixtureAddrs(e, false, 7201)
	sock := e.socket(s, false)
	ids := e.bindRules(sock, reply("key-a", "A"), reply("key-b", "B"), reply("key-c", "C"), reply("key-d", "D"))
	expect := func(after RuleID, limit int, want ...RuleID) {
		t.Helper()
		var got []RuleID
		err := e.d.VisitRules(sock, after, func(ri RuleInfo) bool {
			got = append(got, ri.ID)
			return len(got) < limit
		})
		if err != nil || !slices.Equal(got, want) {
			t.Errorf("visit after %d, up to %d rules: %v (%v), want %v", after, limit, got, err, want)
		}
	}
	expect(0, 2, ids[:2]...)
	// between the pages: a rule of the next page goes, one of the first is modified, one is added
	if err := e.d.DeleteRules(sock, []RuleID{ids[2]}); err != nil {
		t.Fatal(err)
	}
	if err := e.d.ModifyRules(sock, []RuleUpdate{{ID: ids[0], Rule: reply("key-a", "A2")}}); err != nil {
		t.Fatal(err)
	}
	added, err := e.d.AddRules(sock, []Rule{reply("key-e", "E")})
	if err != nil {
		t.Fatal(err)
	}
	expect(ids[1], 3, ids[3], added[0])
	expect(added[0], 3)
	expect(math.MaxUint64, 3)
	expect(ids[2], 1, ids[3]) // after a deleted rule: the next one
	expect(0, 9, ids[0], ids[1], ids[3], added[0])
	if err := e.d.VisitRules(sock+1, 0, func(RuleInfo) bool { return true }); !errors.Is(err, ErrNotBound) {
		t.Errorf("visiting a socket without rule set: %v", err)
	}
}

// Rules of one socket cannot be deleted through another.
func TestDeleteOtherSocketsRule(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7201)
	a := e.socket(s, false)
	b := e.socket(netip.AddrPortFrom(s.Addr(), 7202), false)
	ids := e.bindRules(a, reply("key", "A"))
	bIDs := e.bindRules(b, reply("b1", "1"), reply("b2", "2"))
	if err := e.d.DeleteRules(b, ids); err == nil {
		t.Fatal("deleted socket A's rule through socket B")
	}
	// with B's own rules: the request is refused whole (a delete of many
	// rules looks them up in one pass, of few one by one)
	if err := e.d.DeleteRules(b, append(bIDs, ids...)); err == nil {
		t.Fatal("deleted socket A's rule through socket B, listed with B's rules")
	}
	if err := e.d.DeleteRules(b, append(ids, bIDs[0])); err == nil {
		t.Fatal("deleted socket A's rule through socket B, listed first")
	}
	if err := e.d.DeleteRules(a, []RuleID{0}); err == nil {
		t.Fatal("deleted rule 0, which no rule has")
	}
	p := request(c, s, "key")
	e.expect("still there", p.build(t), xdpTx, p.answer([]byte("A")).build(t), "answered")
	for i, key := range []string{"b1", "b2"} {
		p := request(c, netip.AddrPortFrom(s.Addr(), 7202), key)
		e.expect("B's rule still there", p.build(t), xdpTx, p.answer([]byte{'1' + byte(i)}).build(t), "answered")
	}
}

func TestInvalidRulesInstallNothing(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7203)
	sock := e.socket(s, false)
	e.bindRules(sock, reply("good", "G"))
	long := strings.Repeat("x", MaxPattern+1)
	bad := map[string]Rule{
		"no condition":        {Processors: []Processor{put(0, "x")}, ReplyLen: 1},
		"empty pattern":       {Conditions: []Condition{cond(0, "")}, Processors: []Processor{put(0, "x")}, ReplyLen: 1},
		"pattern too long":    {Conditions: []Condition{cond(0, long)}, Processors: []Processor{put(0, "x")}, ReplyLen: 1},
		"offset past window":  {Conditions: []Condition{cond(ReqWindow, "x")}, Processors: []Processor{put(0, "x")}, ReplyLen: 1},
		"negative offset":     {Conditions: []Condition{cond(-1, "x")}, Processors: []Processor{put(0, "x")}, ReplyLen: 1},
		"too many conditions": {Conditions: []Condition{cond(0, "a"), cond(1, "b"), cond(2, "c"), cond(3, "d"), cond(4, "e")}, Processors: []Processor{put(0, "x")}, ReplyLen: 1},
		"reply too long":      {Conditions: []Condition{cond(0, "x")}, Processors: []Processor{put(0, "x")}, ReplyLen: MaxTCPReply + 1},
		"zero reply":          {Conditions: []Condition{cond(0, "x")}, Processors: []Processor{put(0, "x")}, ReplyLen: 0},
		"no processor":        {Conditions: []Condition{cond(0, "x")}, ReplyLen: 1},
		"put past reply":      {Conditions: []Condition{cond(0, "x")}, Processors: []Processor{put(1, "xy")}, ReplyLen: 2},
		"copy past reply":     {Conditions: []Condition{cond(0, "x")}, Processors: []Processor{copyP(1, 0, 2)}, ReplyLen: 2},
		"copy past request":   {Conditions: []Condition{cond(0, "x")}, Processors: []Processor{copyP(0, ReqWindow-1, 2)}, ReplyLen: 2},
		"empty copy":          {Conditions: []Condition{cond(0, "x")}, Processors: []Processor{copyP(0, 0, 0)}, ReplyLen: 2},
		"unknown processor":   {Conditions: []Condition{cond(0, "x")}, Processors: []Processor{{Kind: 9}}, ReplyLen: 2},
		"too many copies": {Conditions: []Condition{cond(0, "x")}, ReplyLen: 40, Processors: func() []Processor {
			var p []Processor
			for i := 0; i < MaxCopies+1; i++ {
				p = append(p, copyP(i*4, i*2, 1))
			}
			return p
		}()},
	}
	for name, r := range bad {
		for _, op := range []string{"add", "replace"} {
			var err error
			if op == "add" {
				_, err = e.d.AddRules(sock, []Rule{reply("fine", "F"), r})
			} else {
				_, err = e.d.ReplaceRules(sock, []Rule{reply("fine", "F"), r})
			}
			if !errors.Is(err, ErrInvalidRule) {
				t.Errorf("%s (%s): error %v, want ErrInvalidRule", name, op, err)
			}
		}
	}
	list, _ := e.d.ListRules(sock)
	if len(list) != 1 {
		t.Errorf("%d rules after refused changes, want 1", len(list))
	}
	e.expect("nothing installed", request(c, s, "fine").build(t), xdpPass, nil, "pass_no_match")
	p := request(c, s, "good")
	e.expect("old rule kept", p.build(t), xdpTx, p.answer([]byte("G")).build(t), "answered")
}

// A rule's Close sets SANTA_RULE_CLOSE in its slot's flags, through add and
// modify, and is listed back as given.
func TestCloseFlagStored(t *testing.T) {
	e := newEnv(t, Config{})
	_, s := fixtureAddrs(e, false, 7204)
	sock := e.socket(s, false)
	closing := reply("bye", "B")
	closing.Close = true
	ids := e.bindRules(sock, closing, reply("stay", "S"))
	flags := func(id RuleID) uint8 {
		t.Helper()
		r, ok := e.d.byID[id]
		if !ok {
			t.Fatalf("rule %d not installed", id)
		}
		return e.d.rules.value(r.slot)[unsafe.Offsetof(santaSantaRule{}.Flags)]
	}
	if got, want := flags(ids[0]), uint8(santaSantaLimitSANTA_RULE_CLOSE); got != want {
		t.Errorf("closing rule: flags %#x, want %#x", got, want)
	}
	if got := flags(ids[1]); got != 0 {
		t.Errorf("plain rule: flags %#x, want 0", got)
	}
	list, err := e.d.ListRules(sock)
	if err != nil || len(list) != 2 || !reflect.DeepEqual(list[0].Rule, closing) || list[1].Rule.Close {
		t.Fatalf("listed %+v (%v)", list, err)
	}
	// modify turns it off and on
	if err := e.d.ModifyRules(sock, []RuleUpdate{{ID: ids[0], Rule: reply("bye", "B")}, {ID: ids[1], Rule: closing}}); err != nil {
		t.Fatal(err)
	}
	if flags(ids[0]) != 0 || flags(ids[1]) != uint8(santaSantaLimitSANTA_RULE_CLOSE) {
		t.Errorf("after modify: flags %#x and %#x", flags(ids[0]), flags(ids[1]))
	}
}

// A rule set's chain heads live in a part of the bucket table sized to its
// rules; adding rules past one per two buckets rebuilds the set into a larger
// part, and when there is no room for the rebuild's second copy the set
// stays in its part with longer chains. Every rule answers throughout.
func TestBucketRangeFollowsRuleCount(t *testing.T) {
	e := newEnv(t, Config{HashBits: 16, MaxRules: 1600})
	c, s := fixtureAddrs(e, false, 7210)
	sock := e.socket(s, false)
	key := func(i int) string { return fmt.Sprintf("key-%05d", i) }
	var rules []Rule
	add := func(from, to int) {
		t.Helper()
		batch := make([]Rule, 0, to-from)
		for i := from; i < to; i++ {
			batch = append(batch, reply(key(i), key(i)))
		}
		if _, err := e.d.AddRules(sock, batch); err != nil {
			t.Fatalf("AddRules(%d..%d): %v", from, to, err)
		}
		rules = append(rules, batch...)
	}
	// the range of the set, and every rule's bucket inside it
	rangeOf := func() bucketRange {
		t.Helper()
		rs := e.d.bySocket[sock]
		b := rs.buckets
		if b.base&b.mask != 0 || b.base|b.mask > e.d.mask {
			t.Fatalf("range %+v: not an aligned part of a table of %d buckets", b, e.d.mask+1)
		}
		for _, r := range rs.rules {
			if r.bucket&^b.mask != b.base {
				t.Fatalf("rule %d in bucket %d, outside range %+v", r.id, r.bucket, b)
			}
		}
		return b
	}
	answersAll := func() {
		t.Helper()
		for i := range rules {
			req := request(c, s, key(i))
			if v, out := e.run(req.build(t)); v != xdpTx || !bytes.Equal(out, req.answer([]byte(key(i))).build(t)) {
				t.Fatalf("%s: verdict %d, reply %x", key(i), v, out)
			}
		}
	}

	if err := e.d.Bind(e.sock(sock), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if b := rangeOf(); b.mask != minBucketRange-1 {
		t.Fatalf("empty set: range of %d buckets, want %d", b.mask+1, minBucketRange)
	}
	add(0, 300) // the first rules: a rebuild, 4 buckets per rule
	add(300, 500)
	if b := rangeOf(); b.mask != 2*minBucketRange-1 {
		t.Fatalf("500 rules: range of %d buckets, want %d", b.mask+1, 2*minBucketRange)
	}
	answersAll()
	// 1150 rules: past one per two buckets, and a rebuild would need
	// 500 + 1150 slots of 1600: the set stays where it is
	add(500, 1150)
	if b := rangeOf(); b.mask != 2*minBucketRange-1 {
		t.Fatalf("1150 rules without room to rebuild: range of %d buckets, want %d", b.mask+1, 2*minBucketRange)
	}
	answersAll()
	// after deleting 650 there is room: the next addition rebuilds into a larger range
	list, err := e.d.ListRules(sock)
	if err != nil {
		t.Fatal(err)
	}
	var del []RuleID
	for _, r := range list[500:] {
		del = append(del, r.ID)
	}
	if err := e.d.DeleteRules(sock, del); err != nil {
		t.Fatal(err)
	}
	rules = rules[:500]
	add(500, 1030)
	if b := rangeOf(); b.mask != 8*minBucketRange-1 {
		t.Fatalf("1030 rules: range of %d buckets, want %d", b.mask+1, 8*minBucketRange)
	}
	answersAll()
}

// removeAt agrees with removing the elements one by one, and leaves no
// pointer behind in the tail it cut off.
func TestRemoveAt(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for range 500 {
		n := rng.IntN(40)
		s := make([]*int, n)
		for i := range s {
			s[i] = new(int)
			*s[i] = i
		}
		var at []int
		for i := range n {
			if rng.IntN(3) == 0 {
				at = append(at, i)
			}
		}
		want := slices.Clone(s)
		for k := len(at) - 1; k >= 0; k-- {
			want = slices.Delete(want, at[k], at[k]+1)
		}
		full := s[:n:n]
		got := removeAt(s, at)
		if !slices.Equal(got, want) {
			t.Fatalf("removeAt(%d elements, %v) kept %v, want %v", n, at, deref(got), deref(want))
		}
		if tail := full[len(got):]; slices.ContainsFunc(tail, func(p *int) bool { return p != nil }) {
			t.Fatalf("removeAt(%d elements, %v) left %v in the tail", n, at, deref(tail))
		}
	}
}

func deref(s []*int) []int {
	out := make([]int, len(s))
	for i, p := range s {
		if p != nil {
			out[i] = *p
		} else {
			out[i] = -1
		}
	}
	return out
}

// TestFullSaysWhatIsFull fills the rule data memory of a data plane whose
// rule table has no room for a second copy of the rule set: the error must
// name the data memory (an add that failed in place used to fall through
// to a rebuild, whose error named the rule table), and nothing is added.
func TestFullSaysWhatIsFull(t *testing.T) {
	e := newEnv(t, Config{MaxRules: 800, DataMiB: 1})
	_, s := fixtureAddrs(e, false, 7210)
	sock := e.socket(s, false)
	e.bindRules(sock)
	template := strings.Repeat("r", 1400)
	added := 0
	for batch := 0; ; batch++ {
		rules := make([]Rule, 32)
		for i := range rules {
			rules[i] = reply(fmt.Sprintf("key-%05d", added+i), template)
		}
		_, err := e.d.AddRules(sock, rules)
		if err == nil {
			added += len(rules)
			continue
		}
		if !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), "rule data memory") {
			t.Fatalf("after %d rules: %v, want ErrFull for the rule data memory", added, err)
		}
		t.Logf("after %d rules: %v", added, err)
		break
	}
	if n := e.d.Usage().Rules; n != added {
		t.Errorf("%d rules installed, want the %d added before the failing add", n, added)
	}
}

// TestMoreRulesThanRoom: a batch of more rules than the rule table has
// free slots is refused for that, however the rules would hang in the
// rule set. They used to be placed first: a rule set of one rule, kept
// to its regions for lack of room to rebuild it, blamed the more than 16 new
// rules that share its region's bytes, and that room.
func TestMoreRulesThanRoom(t *testing.T) {
	e := newEnv(t, Config{MaxRules: 512})
	_, s := fixtureAddrs(e, false, 7211)
	sock := e.socket(s, false)
	e.bindRules(sock)
	if _, err := e.d.AddRules(sock, []Rule{reply("ping", "pong")}); err != nil {
		t.Fatal(err)
	}
	rules := make([]Rule, 600)
	for i := range rules {
		rules[i] = reply(fmt.Sprintf("k%06d", i), "v")
	}
	_, err := e.d.AddRules(sock, rules)
	if want := "rule table: 600 rules to add, 511 free of 512"; !errors.Is(err, ErrFull) || !strings.Contains(err.Error(), want) {
		t.Fatalf("adding 600 rules with 511 slots free: %v, want ErrFull saying %q", err, want)
	}
	if n := e.d.Usage().Rules; n != 1 {
		t.Errorf("%d rules installed, want the 1 from before", n)
	}
}

// Each bucket tells the program where its first rule's data lies (struct
// santa_bucket), so that a large rule set's data loads need not wait for the
// rule: after adds and deletes (chain heads among them, whose successors
// become heads) every hint names its head rule's page and first line and
// covers its template. A hint is only a hint: with every hint wrong, every
// rule still answers byte for byte.
func TestBucketHints(t *testing.T) {
	e := newEnv(t, Config{HashBits: 16, MaxRules: 4096})
	c, s := fixtureAddrs(e, false, 7220)
	sock := e.socket(s, false)
	if err := e.d.Bind(e.sock(sock), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	key := func(i int) string { return fmt.Sprintf("hinted-%05d", i) }
	var batch []Rule
	for i := range 1500 {
		// templates of 1 to 300 bytes: hints of one to four lines
		batch = append(batch, reply(key(i), strings.Repeat(key(i), 30)[:1+i%300]))
	}
	ids, err := e.d.AddRules(sock, batch)
	if err != nil {
		t.Fatal(err)
	}
	rs := e.d.bySocket[sock]
	if n := rs.buckets.mask + 1; n < uint32(santaSantaLimitSANTA_WARM_MIN_BUCKETS) {
		t.Fatalf("%d buckets: too few for the program to use the hints", n)
	}
	rng := rand.New(rand.NewPCG(5, 6))
	// the buckets whose head has a successor, by head slot
	withSuccessor := map[uint32]uint32{}
	for b := rs.buckets.base; b <= rs.buckets.base|rs.buckets.mask; b++ {
		if head := e.d.buckets.load32(b, offBucketHead); head != 0 && e.d.rules.load32(head, offRuleNext) != 0 {
			withSuccessor[head] = b
		}
	}
	var del []RuleID
	promoted := 0
	for _, i := range rng.Perm(len(ids))[:700] {
		del = append(del, ids[i])
		if _, ok := withSuccessor[e.d.byID[ids[i]].slot]; ok {
			promoted++
		}
	}
	if err := e.d.DeleteRules(sock, del); err != nil {
		t.Fatal(err)
	}
	if promoted == 0 {
		t.Fatal("no deleted rule was a chain head with a successor")
	}

	bySlot := map[uint32]*installed{}
	for _, r := range rs.rules {
		bySlot[r.slot] = r
	}
	heads := 0
	for b := rs.buckets.base; b <= rs.buckets.base|rs.buckets.mask; b++ {
		head, hint := e.d.buckets.load32(b, offBucketHead), e.d.buckets.load32(b, offBucketHint)
		if head == 0 {
			if hint != 0 {
				t.Errorf("empty bucket %d: hint %#x", b, hint)
			}
			continue
		}
		r := bySlot[head]
		if r == nil {
			t.Fatalf("bucket %d: head slot %d holds no rule of the set", b, head)
		}
		heads++
		tpl := e.d.rules.load32(head, int(unsafe.Offsetof(santaSantaRule{}.Tpl)))
		first, last := r.data.off/64, (tpl+uint32(len(r.rule.template))-1)/64
		want := r.data.page<<16 | first<<2 | min(last-first, 3)
		if hint != want {
			t.Errorf("bucket %d, rule %d (data at page %d offset %d, template %d bytes at %d): hint %#x, want %#x",
				b, r.id, r.data.page, r.data.off, len(r.rule.template), tpl, hint, want)
		}
	}
	t.Logf("%d rules left, %d chain heads; %d deleted heads had successors", len(rs.rules), heads, promoted)

	answersAll := func(what string) {
		t.Helper()
		for _, r := range rs.rules {
			i := slices.Index(ids, r.id)
			req := request(c, s, key(i))
			if v, out := e.run(req.build(t)); v != xdpTx || !bytes.Equal(out, req.answer(batch[i].Processors[0].Template).build(t)) {
				t.Fatalf("%s: %s: verdict %d, reply %x", what, key(i), v, out)
			}
		}
	}
	answersAll("true hints")
	for b := rs.buckets.base; b <= rs.buckets.base|rs.buckets.mask; b++ {
		e.d.buckets.store32(b, offBucketHint, rng.Uint32())
	}
	answersAll("random hints")
}

// Rules that share the bytes of the longest region they cover (here the 12
// bytes of their anchor; they differ only in a second condition) fill its
// bucket's chain, then spill to the buckets of the shorter regions at the
// same offset: each of them answers. When every such bucket is full, the
// next is refused with a message that says so, and nothing else changes.
func TestFullChainSpillsToShorterRegions(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7204)
	sock := e.socket(s, false)
	const shared = "cccccccccccc"
	sibling := func(i int) Rule {
		tag := fmt.Sprintf("%02d", i)
		return Rule{Conditions: []Condition{cond(0, shared), cond(len(shared), tag)},
			Processors: []Processor{put(0, "reply "+tag)}, ReplyLen: len("reply " + tag)}
	}
	// regions at offset 0 of 4, 8 and 12 bytes: room for 3 × MaxChain
	// siblings, less what the two others may share with them by chance
	rules := []Rule{reply("aaaa", "A"), reply("bbbbbbbb", "B")}
	fits := 3*MaxChain - 2
	for i := range fits {
		rules = append(rules, sibling(i))
	}
	e.bindRules(sock, rules...)
	for i := range fits {
		p := request(c, s, shared+fmt.Sprintf("%02d", i))
		e.expect(fmt.Sprintf("sibling %d", i), p.build(t), xdpTx, p.answer([]byte(fmt.Sprintf("reply %02d", i))).build(t), "answered")
	}
	e.expect("no sibling", request(c, s, shared+"xx").build(t), xdpPass, nil, "pass_no_match")
	for i := fits; ; i++ {
		_, err := e.d.AddRules(sock, []Rule{sibling(i)})
		if err == nil {
			if i >= 3*MaxChain {
				t.Fatalf("sibling %d added: more than the 3 chains of %d hold", i, MaxChain)
			}
			continue
		}
		if !errors.Is(err, ErrInvalidRule) || !strings.Contains(err.Error(), "the buckets of the 2 shorter regions it could hang on are full too") {
			t.Fatalf("sibling %d: error %v, want ErrInvalidRule naming the full shorter regions", i, err)
		}
		t.Logf("sibling %d refused: %v", i, err)
		break
	}
	p := request(c, s, "aaaa")
	e.expect("other rule", p.build(t), xdpTx, p.answer([]byte("A")).build(t), "answered")
}
