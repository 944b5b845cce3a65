// Package sketch finds the heavy hitters of a stream of keys: the hot
// questions or keys a controller offloads.
package sketch

import (
	"container/heap"
	"sort"
)

// Sketch finds the heavy hitters of a stream of keys in bounded memory: the
// Space-Saving algorithm (Metwally et al., 2005). It keeps k counters; a new
// key takes over the smallest one and inherits its count as its error, so a
// key's true count lies in [count-err, count]. Every key with a true count
// above N/k is guaranteed to hold a counter. Decay halves all counts, so the
// sketch follows what is hot now rather than what was hot once.
type Sketch struct {
	k       int
	byKey   map[string]*counter
	byCount counterHeap // min-heap on count
}

type counter struct {
	key        string
	count, err uint64
	index      int // in the heap
}

// New keeps k counters.
func New(k int) *Sketch {
	return &Sketch{k: max(k, 1), byKey: make(map[string]*counter, k)}
}

// Add counts one occurrence of key.
func (s *Sketch) Add(key string) {
	if c := s.byKey[key]; c != nil {
		c.count++
		heap.Fix(&s.byCount, c.index)
		return
	}
	if len(s.byCount) < s.k {
		c := &counter{key: key, count: 1}
		s.byKey[key] = c
		heap.Push(&s.byCount, c)
		return
	}
	c := s.byCount[0]
	delete(s.byKey, c.key)
	c.key, c.err = key, c.count
	c.count++
	s.byKey[key] = c
	heap.Fix(&s.byCount, 0)
}

// Hot returns the keys whose guaranteed count (count - err) is at least
// min, hottest first.
func (s *Sketch) Hot(min uint64) []string {
	var hot []*counter
	for _, c := range s.byCount {
		if c.count-c.err >= min {
			hot = append(hot, c)
		}
	}
	sort.Slice(hot, func(i, j int) bool { return hot[i].count-hot[i].err > hot[j].count-hot[j].err })
	keys := make([]string, len(hot))
	for i, c := range hot {
		keys[i] = c.key
	}
	return keys
}

// Forget drops key (e.g. once it is offloaded: its misses stop anyway).
func (s *Sketch) Forget(key string) {
	if c := s.byKey[key]; c != nil {
		delete(s.byKey, key)
		heap.Remove(&s.byCount, c.index)
	}
}

// Has reports whether key holds a counter.
func (s *Sketch) Has(key string) bool { return s.byKey[key] != nil }

// Decay halves every count and error, dropping counters that reach zero.
func (s *Sketch) Decay() {
	kept := s.byCount[:0]
	for _, c := range s.byCount {
		c.count /= 2
		c.err /= 2
		if c.count == 0 {
			delete(s.byKey, c.key)
			continue
		}
		c.index = len(kept)
		kept = append(kept, c)
	}
	s.byCount = kept
	heap.Init(&s.byCount)
}

type counterHeap []*counter

func (h counterHeap) Len() int           { return len(h) }
func (h counterHeap) Less(i, j int) bool { return h[i].count < h[j].count }
func (h counterHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}
func (h *counterHeap) Push(x any) {
	c := x.(*counter)
	c.index = len(*h)
	*h = append(*h, c)
}
func (h *counterHeap) Pop() any {
	old := *h
	c := old[len(old)-1]
	*h = old[:len(old)-1]
	return c
}
