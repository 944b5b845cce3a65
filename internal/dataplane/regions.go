package dataplane

import (
	"bytes"
	"fmt"
	"slices"
	"sort"

	"github.com/google/btree"
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
// in full at one offset, in a B-tree, none a prefix of another: then no two
// rules can match the same request, and the matcher may stop at the first
// match. Because the patterns are sorted and prefix-free, a new pattern
// conflicts with the set only if its neighbours do, so a batch of k rules is
// checked and added in O(k log n) (a million rules added 1024 at a time
// took minutes with a sort of the whole set per batch, and seconds with a
// sorted slice, whose merges moved the whole set each time).
type disjointSet struct {
	off      int
	patterns *btree.BTreeG[[]byte]
}

func lessBytes(a, b []byte) bool { return bytes.Compare(a, b) < 0 }

// newDisjointSet is the set of rules, nil if they are not disjoint.
func newDisjointSet(rules []*compiledRule) *disjointSet {
	if len(rules) == 0 {
		return nil
	}
	s := &disjointSet{off: anchorOf(rules[0]).off, patterns: btree.NewG(32, lessBytes)}
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

// add puts prefix-free ps into the set if it stays prefix-free, and says
// whether it did; the set is unchanged if not.
func (s *disjointSet) add(ps [][]byte) bool {
	for _, p := range ps {
		if s.overlaps(p) {
			return false
		}
	}
	for _, p := range ps {
		s.patterns.ReplaceOrInsert(p)
	}
	return true
}

// overlaps says whether p is a prefix of a pattern of the set or has one
// as its prefix: the set's neighbours of p are the only candidates.
func (s *disjointSet) overlaps(p []byte) bool {
	overlap := false
	s.patterns.DescendLessOrEqual(p, func(q []byte) bool {
		overlap = bytes.HasPrefix(p, q)
		return false
	})
	if !overlap {
		s.patterns.AscendGreaterOrEqual(p, func(q []byte) bool {
			overlap = bytes.HasPrefix(q, p)
			return false
		})
	}
	return overlap
}

// samePatterns says whether news[i] compares the same bytes in full at the
// set's offset as olds[i], for every i: then swapping them keeps the set.
// It saves a modify of a million-rule set taking its patterns out and in.
func (s *disjointSet) samePatterns(olds, news []*installed) bool {
	for i, o := range olds {
		p := patternAt(news[i].rule, s.off)
		if p == nil || !bytes.Equal(p, patternAt(o.rule, s.off)) {
			return false
		}
	}
	return true
}

// remove takes ps, each in the set, out of it.
func (s *disjointSet) remove(ps [][]byte) {
	for _, p := range ps {
		s.patterns.Delete(p)
	}
}

// removeRules takes the patterns of rules, each in the set, out of it.
func (s *disjointSet) removeRules(rules []*compiledRule) {
	if len(rules) == s.patterns.Len() { // all of them
		s.patterns.Clear(false)
		return
	}
	for _, c := range rules {
		s.patterns.Delete(patternAt(c, s.off))
	}
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
