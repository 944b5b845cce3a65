package daemon_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/rulefile"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestListInPages lists a rule set in pages while it changes, by tag, and
// deletes by tag.
func TestListInPages(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	target := udpTarget(t, tb, 7410)
	var rules []api.Rule
	for i := 0; i < 30; i++ {
		r := rule(fmt.Sprintf("page-%02d", i), 0, "r")
		r.Tag = []string{"a", "b", ""}[i%3]
		rules = append(rules, r)
	}
	ids, err := c.Add(target, rules)
	if err != nil {
		t.Fatal(err)
	}

	// page by page; between the first two pages a rule not listed yet goes
	// and one is added: every rule that stays is listed once, in id order
	first, more, err := c.ListPage(target, "", 0, 7)
	if err != nil || len(first) != 7 || !more {
		t.Fatalf("first page: %d rules, more %v, %v; want 7 and more", len(first), more, err)
	}
	if err := c.Delete(target, ids[20:21]); err != nil {
		t.Fatal(err)
	}
	added, err := c.Add(target, []api.Rule{rule("page-late", 0, "r")})
	if err != nil {
		t.Fatal(err)
	}
	listed := first
	for after := first[len(first)-1].ID; more; after = listed[len(listed)-1].ID {
		var page []api.Rule
		if page, more, err = c.ListPage(target, "", after, 7); err != nil {
			t.Fatal(err)
		}
		listed = append(listed, page...)
	}
	want := append(slices.Concat(ids[:20], ids[21:]), added...)
	if got := idsOf(listed); !slices.Equal(got, want) {
		t.Errorf("listed in pages of 7: %v, want %v", got, want)
	}

	// by tag: only those rules; more only if another with the tag follows
	tagged, more, err := c.ListPage(target, "a", 0, 10)
	if err != nil || len(tagged) != 10 || more {
		t.Errorf("10 rules tagged a, pages of 10: %d listed, more %v, %v", len(tagged), more, err)
	}
	for _, r := range tagged {
		if r.Tag != "a" {
			t.Errorf("rule %d tagged %q listed for tag a", r.ID, r.Tag)
		}
	}
	if all, err := c.ListTagged(target, "b"); err != nil || len(all) != 10 {
		t.Errorf("ListTagged(b): %d rules, %v; want 10", len(all), err)
	}

	// delete by tag: all of them at once, none again
	gone, err := c.DeleteTagged(target, "b")
	if err != nil || len(gone) != 10 {
		t.Fatalf("delete tag b: %v, %v; want 10 ids", gone, err)
	}
	if again, err := c.DeleteTagged(target, "b"); err != nil || len(again) != 0 {
		t.Errorf("delete tag b again: %v, %v; want none and no error", again, err)
	}
	checkRules(t, c, target, 30-1+1-10)

	// a delete names ids or a tag, not both
	conn, err := api.Dial(sd.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	cookie := mustCookie(t, c)
	if err := conn.Send(&api.Message{V: api.Version, Op: api.OpDelete, Seq: 1, Socket: cookie, IDs: ids[:1], Tag: "a"}, -1); err != nil {
		t.Fatal(err)
	}
	if m, _, err := conn.Recv(); err != nil || m.Status != api.StatusInvalid || !strings.Contains(m.Error, "not both") {
		t.Errorf("delete with ids and a tag: %+v %v, want invalid", m, err)
	}
	checkRules(t, c, target, 20)

	// the CLI: ls --tag "" lists the untagged rules, those rm --tag "" removes
	all, err := c.ListRules(target)
	if err != nil {
		t.Fatal(err)
	}
	var untagged []uint64
	for _, r := range all {
		if r.Tag == "" {
			untagged = append(untagged, r.ID)
		}
	}
	out, err := sd.cli(0, "rules", "ls", "--socket", fmt.Sprint(cookie), "--tag", "", "--json")
	var listedUntagged rulefile.File
	if err != nil || json.Unmarshal([]byte(out), &listedUntagged) != nil {
		t.Fatalf("santa rules ls --tag \"\": %v\n%s", err, out)
	}
	var cliIDs []uint64
	for _, r := range listedUntagged.Rules {
		cliIDs = append(cliIDs, r.ID)
	}
	if len(untagged) != 10 || !slices.Equal(cliIDs, untagged) {
		t.Errorf("santa rules ls --tag \"\" listed %v, want the untagged %v", cliIDs, untagged)
	}
	if out, err := sd.cli(0, "rules", "rm", "--socket", fmt.Sprint(cookie), "--tag", ""); err != nil {
		t.Fatalf("santa rules rm --tag \"\": %v\n%s", err, out)
	}
	left, err := c.ListRules(target)
	if err != nil || len(left) != 10 || slices.ContainsFunc(left, func(r api.Rule) bool { return r.Tag != "a" }) {
		t.Errorf("after rm --tag \"\": %d rules left (%v), want the 10 tagged a", len(left), err)
	}
}

// TestListBeyondTheFrame: a rule set whose listing exceeds the protocol's
// frame limit (256 MiB) is listed in pages, and a request for it whole gets
// an error that says so; santad compacts its journal into records within the
// limit too, and a restart restores every rule. The rules' overlapping puts
// (64 each, the most a rule may have) make their listing large while the
// data plane stores one template.
func TestListBeyondTheFrame(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	target := udpTarget(t, tb, 7411)
	const nRules, nPuts = 3000, 64 // 3000 × 64 × 1472 bytes ≈ 283 MB listed
	template := bytes.Repeat([]byte{'x'}, 1472)
	var ids []uint64
	for batch := 0; batch < 4; batch++ {
		var rules []api.Rule
		for i := 0; i < nRules/4; i++ {
			r := rule(fmt.Sprintf("huge-%d-%03d", batch, i), 0, string(template))
			r.Processors = slices.Repeat(r.Processors, nPuts)
			rules = append(rules, r)
		}
		more, err := c.Add(target, rules)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, more...)
	}

	if _, _, err := c.ListPage(target, "", 0, 0); !errors.Is(err, santa.ErrInvalid) || !strings.Contains(err.Error(), "frame limit") {
		t.Errorf("listing %d rules of %d puts in one response: %v, want an invalid error naming the frame limit", nRules, nPuts, err)
	}
	check := func(c *santa.Client, when string) {
		t.Helper()
		rules, err := c.ListRules(target)
		if err != nil {
			t.Fatalf("%s: %v", when, err)
		}
		if got := idsOf(rules); !slices.Equal(got, ids) {
			t.Fatalf("%s: listed %d rules, want %d with the ids they got", when, len(got), len(ids))
		}
		for _, r := range rules {
			if len(r.Processors) != nPuts {
				t.Fatalf("%s: rule %d listed with %d processors, want %d", when, r.ID, len(r.Processors), nPuts)
			}
		}
	}
	check(c, "listed in pages")
	sd.stop(syscall.SIGTERM)
	sd.start()
	check(sd.client(), "after a restart")
}

func idsOf(rules []api.Rule) []uint64 {
	ids := make([]uint64, len(rules))
	for i, r := range rules {
		ids[i] = r.ID
	}
	return ids
}
