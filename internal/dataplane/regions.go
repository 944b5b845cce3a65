package dataplane

import (
	"bytes"
	"fmt"
	"slices"
	"sort"
)

// anchorOf is the window of rule c's anchor condition the matcher can hash:
// bytes the condition compares in full.
func anchorOf(c *compiledRule) region {
	return region{c.conds[c.anchor].Offset, min(c.anchorLen, MaxRegionLen)}
}

// deriveRegions picks at most MaxRegions regions for a set of rules (paper
// §2.2, refined): every anchor offset gets a region of the shortest anchor
// length there, so every rule has a region to hang on; the remaining budget
// adds longer regions at the same offsets, at quantiles of the anchor
// lengths, so that rules sharing a short prefix still land in different
// buckets. Regions at one offset are nested prefixes, hashed in one pass.
func deriveRegions(rules []*compiledRule) ([]region, error) {
	lengths := map[int][]int{} // offset -> anchor lengths, one per rule
	for _, c := range rules {
		a := anchorOf(c)
		lengths[a.off] = append(lengths[a.off], a.len)
	}
	offsets := make([]int, 0, len(lengths))
	for off := range lengths {
		offsets = append(offsets, off)
	}
	sort.Ints(offsets)
	if len(offsets) > MaxRegions {
		return nil, invalid("the rules' conditions start at %d different offsets (%v); a rule set can hash at most %d",
			len(offsets), offsets, MaxRegions)
	}
	// share the budget out: one region per offset, the rest in turn to
	// offsets that have more distinct lengths than regions
	budget := map[int]int{}
	distinct := map[int][]int{}
	for _, off := range offsets {
		l := lengths[off]
		sort.Ints(l)
		distinct[off] = slices.Compact(slices.Clone(l))
		budget[off] = 1
	}
	for spare := MaxRegions - len(offsets); spare > 0; {
		gave := false
		for _, off := range offsets {
			if spare > 0 && budget[off] < len(distinct[off]) {
				budget[off]++
				spare--
				gave = true
			}
		}
		if !gave {
			break
		}
	}
	var regions []region
	for _, off := range offsets {
		l, k := lengths[off], budget[off]
		picked := []int{l[0]}
		for j := 1; j < k; j++ {
			picked = append(picked, l[j*len(l)/k])
		}
		if k == len(distinct[off]) {
			picked = distinct[off]
		}
		slices.Sort(picked)
		for _, n := range slices.Compact(picked) {
			regions = append(regions, region{off, n})
		}
	}
	return regions, nil
}

// regionsFor lists the regions a rule with anchor a may hang on, longest
// first: those at the anchor's offset that it covers. The longest spreads
// rules best; a shorter one takes the rule when its bucket there is full
// (many rules that share the longest region's bytes, e.g. one DNS name
// asked for in many types and shapes, when the region ends before the type).
func regionsFor(regions []region, a region) []region {
	var out []region
	for _, r := range regions {
		if r.off == a.off && r.len <= a.len {
			out = append(out, r)
		}
	}
	slices.SortFunc(out, func(x, y region) int { return y.len - x.len })
	return out
}

// disjointSet holds, for a disjoint rule set, the bytes every rule compares
// in full at one offset, sorted, none a prefix of another: then no two rules
// can match the same request, and the matcher may stop at the first match.
// Because the patterns are sorted and prefix-free, a new pattern conflicts
// with the set only if its neighbours do, so a batch of k rules is checked
// in O(k log n) and merged in O(n) instead of sorting the whole set again
// (a million rules added 1024 at a time took minutes that way).
type disjointSet struct {
	off      int
	patterns [][]byte
}

// newDisjointSet is the set of rules, nil if they are not disjoint.
func newDisjointSet(rules []*compiledRule) *disjointSet {
	if len(rules) == 0 {
		return nil
	}
	s := &disjointSet{off: anchorOf(rules[0]).off}
	ps, ok := s.sortedPatterns(rules)
	if !ok || !s.add(ps) {
		return nil
	}
	return s
}

// sortedPatterns is what rules compare in full at the set's offset, sorted;
// false if a rule compares nothing there or one pattern is a prefix of another.
func (s *disjointSet) sortedPatterns(rules []*compiledRule) ([][]byte, bool) {
	ps := make([][]byte, 0, len(rules))
	for _, c := range rules {
		p := patternAt(c, s.off)
		if p == nil {
			return nil, false
		}
		ps = append(ps, p)
	}
	slices.SortFunc(ps, bytes.Compare)
	for i := 1; i < len(ps); i++ {
		if bytes.HasPrefix(ps[i], ps[i-1]) {
			return nil, false
		}
	}
	return ps, true
}

// add merges sorted, prefix-free ps into the set if it stays prefix-free,
// and says whether it did; the set is unchanged if not.
func (s *disjointSet) add(ps [][]byte) bool {
	at := make([]int, len(ps)) // where each goes among the patterns already there
	for j, p := range ps {
		i, _ := slices.BinarySearchFunc(s.patterns, p, bytes.Compare)
		if i > 0 && bytes.HasPrefix(p, s.patterns[i-1]) || i < len(s.patterns) && bytes.HasPrefix(s.patterns[i], p) {
			return false
		}
		at[j] = i
	}
	// merge from the back, in place, moving the runs between insertions whole
	n := len(s.patterns)
	s.patterns = slices.Grow(s.patterns, len(ps))[:n+len(ps)]
	end := n
	for j := len(ps) - 1; j >= 0; j-- {
		copy(s.patterns[at[j]+j+1:end+j+1], s.patterns[at[j]:end])
		s.patterns[at[j]+j] = ps[j]
		end = at[j]
	}
	return true
}

// samePatterns says whether news[i] compares the same bytes in full at the
// set's offset as olds[i], for every i: then swapping them keeps the set.
// It saves a modify of a million-rule set moving the set's patterns twice.
func (s *disjointSet) samePatterns(olds, news []*installed) bool {
	for i, o := range olds {
		p := patternAt(news[i].rule, s.off)
		if p == nil || !bytes.Equal(p, patternAt(o.rule, s.off)) {
			return false
		}
	}
	return true
}

// remove takes sorted ps, each in the set, out of it.
func (s *disjointSet) remove(ps [][]byte) {
	at := make([]int, 0, len(ps))
	if len(ps)*manyRules < len(s.patterns) {
		for _, p := range ps {
			if i, ok := slices.BinarySearchFunc(s.patterns, p, bytes.Compare); ok {
				at = append(at, i)
			}
		}
	} else { // many: one merge of the two sorted lists
		j := 0
		for i, p := range s.patterns {
			for j < len(ps) && bytes.Compare(ps[j], p) < 0 {
				j++
			}
			if j < len(ps) && bytes.Equal(ps[j], p) {
				at = append(at, i)
				j++
			}
		}
	}
	s.patterns = removeAt(s.patterns, at)
}

// removeRules takes the patterns of rules, each in the set, out of it.
func (s *disjointSet) removeRules(rules []*compiledRule) {
	if len(rules) == len(s.patterns) { // all of them: no sorting needed
		s.patterns = nil
		return
	}
	ps, _ := s.sortedPatterns(rules)
	s.remove(ps)
}

// patternAt is the longest run of bytes at off that rule c compares in
// full, nil if none.
func patternAt(c *compiledRule, off int) []byte {
	var p []byte
	for _, cond := range c.conds {
		if n := fullLen(cond); cond.Offset == off && n > len(p) {
			p = cond.Pattern[:n]
		}
	}
	return p
}

func (r region) String() string { return fmt.Sprintf("[%d,+%d)", r.off, r.len) }
