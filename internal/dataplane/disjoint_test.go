package dataplane

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// The disjoint set kept up batch by batch (add, modify, delete) says what
// checking the whole rule set from scratch says, over random patterns where
// prefixes and duplicates are common.
func TestDisjointSetIncremental(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	pattern := func() []byte {
		p := make([]byte, 1+rng.IntN(4))
		for i := range p {
			p[i] = "ab"[rng.IntN(2)]
		}
		return p
	}
	rule := func(p []byte) *compiledRule {
		c, err := compileRule(Rule{Conditions: []Condition{{Offset: 3, Pattern: p}}, Processors: []Processor{put(0, "x")}, ReplyLen: 1})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	disjointFromScratch := func(rules []*compiledRule) bool {
		ps := make([][]byte, len(rules))
		for i, c := range rules {
			ps[i] = c.conds[0].Pattern
		}
		slices.SortFunc(ps, bytes.Compare)
		for i := 1; i < len(ps); i++ {
			if bytes.HasPrefix(ps[i], ps[i-1]) {
				return false
			}
		}
		return true
	}
	checks := map[bool]int{}
	for round := 0; round < 300; round++ {
		var rules []*compiledRule
		ds := newDisjointSet(nil)
		for step := 0; step < 12; step++ {
			switch op := rng.IntN(3); {
			case op == 0 || len(rules) == 0: // add a batch
				news := make([]*compiledRule, 1+rng.IntN(3))
				for i := range news {
					news[i] = rule(pattern())
				}
				rules = append(rules, news...)
				if ds == nil && step == 0 {
					ds = newDisjointSet(rules)
				} else if ds != nil {
					ps, ok := ds.sortedPatterns(news)
					if !ok || !ds.add(ps) {
						ds = nil
					}
				}
			case op == 1: // modify one rule
				i := rng.IntN(len(rules))
				old, now := rules[i], rule(pattern())
				rules[i] = now
				if ds != nil {
					dropped, _ := ds.sortedPatterns([]*compiledRule{old})
					ds.remove(dropped)
					ps, ok := ds.sortedPatterns([]*compiledRule{now})
					if !ok || !ds.add(ps) {
						ds = nil
					}
				}
			default: // delete some rules, at times all
				i := rng.IntN(len(rules))
				j := i + 1 + rng.IntN(len(rules)-i)
				if ds != nil {
					ds.removeRules(rules[i:j])
				}
				rules = slices.Delete(rules, i, j)
			}
			want := disjointFromScratch(rules)
			// the kept set never claims disjointness wrongly; it may give it up
			// for good (as the data plane does until a rebuild)
			if ds != nil && !want {
				t.Fatalf("round %d step %d: kept set says disjoint, the rules are not: %q", round, step, ds.list())
			}
			if ds != nil {
				if all, _ := ds.sortedPatterns(rules); !slices.EqualFunc(all, ds.list(), bytes.Equal) {
					t.Fatalf("round %d step %d: kept set %q, the rules' patterns %q", round, step, ds.list(), all)
				}
				checks[true]++
			} else if want {
				checks[false]++
			}
			if fresh := newDisjointSet(rules); (fresh != nil) != want && len(rules) > 0 {
				t.Fatalf("round %d step %d: newDisjointSet says %v, want %v", round, step, fresh != nil, want)
			}
		}
	}
	if checks[true] < 100 {
		t.Errorf("only %d steps kept a disjoint set: the test does not exercise it", checks[true])
	}
}

// Removing few patterns and many from a large set, and every one, leave
// what filtering the set leaves.
func TestDisjointSetRemove(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, k := range []int{1, 7, 120, 125, 1000, 1999, 2000} {
		seen := map[string]bool{}
		var rules []*compiledRule
		for len(rules) < 2000 {
			p := []byte(fmt.Sprintf("%08x", rng.Uint32()))
			if seen[string(p)] {
				continue
			}
			seen[string(p)] = true
			c, err := compileRule(Rule{Conditions: []Condition{{Offset: 3, Pattern: p}}, Processors: []Processor{put(0, "x")}, ReplyLen: 1})
			if err != nil {
				t.Fatal(err)
			}
			rules = append(rules, c)
		}
		ds := newDisjointSet(rules)
		if ds == nil {
			t.Fatal("distinct 8-byte patterns: not disjoint")
		}
		rng.Shuffle(len(rules), func(i, j int) { rules[i], rules[j] = rules[j], rules[i] })
		ds.removeRules(rules[:k])
		want, _ := ds.sortedPatterns(rules[k:])
		if got := ds.list(); !slices.EqualFunc(got, want, bytes.Equal) {
			t.Errorf("2000 patterns, %d removed: %d left, want %d", k, len(got), len(want))
		}
	}
}

// list is the set's patterns in order.
func (s *disjointSet) list() [][]byte {
	var ps [][]byte
	s.patterns.Ascend(func(p []byte) bool {
		ps = append(ps, p)
		return true
	})
	return ps
}
