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

// regionFor is the longest region at the rule's anchor offset that the anchor
// covers, false if the regions have none.
func regionFor(regions []region, c *compiledRule) (region, bool) {
	a := anchorOf(c)
	best, ok := region{}, false
	for _, r := range regions {
		if r.off == a.off && r.len <= a.len && (!ok || r.len > best.len) {
			best, ok = r, true
		}
	}
	return best, ok
}

// disjointOffset reports an offset at which every rule has a condition and
// no rule's bytes compared in full there are a prefix of another's: then no
// two rules can match the same request, and the matcher may stop at the
// first match.
func disjointOffset(rules []*compiledRule) (int, bool) {
	if len(rules) == 0 {
		return 0, false
	}
	off := anchorOf(rules[0]).off
	patterns := make([][]byte, 0, len(rules))
	for _, c := range rules {
		p := patternAt(c, off)
		if p == nil {
			return 0, false
		}
		patterns = append(patterns, p)
	}
	slices.SortFunc(patterns, bytes.Compare)
	for i := 1; i < len(patterns); i++ {
		if bytes.HasPrefix(patterns[i], patterns[i-1]) {
			return 0, false
		}
	}
	return off, true
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
