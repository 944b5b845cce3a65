package dnsnames

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"os"
)

// DefaultZipfS is the usual Zipf exponent for DNS query popularity: query
// counts per name in resolver and authoritative traces fall off close to
// 1/rank (measured exponents are mostly between 0.8 and 1.2).
const DefaultZipfS = 1.0

// ZipfQueries returns count query names drawn from names so that names[i]
// is asked with probability ∝ 1/(i+1)^s: names[0] is the most popular
// (TopListNames is in rank order). s = 0 is uniform; use DefaultZipfS
// unless measuring skew itself.
//
// The counts are apportioned exactly rather than sampled (systematic
// sampling with one random offset): every name gets floor or ceil of its
// expected count count·p_i, and the counts sum to count. The list is then
// shuffled (seeded), so the order is random but the mix has no sampling
// noise, and runs with the same seed are identical. The strings share
// names' memory.
func ZipfQueries(names []string, count int, s float64, seed int64) []string {
	if len(names) == 0 || count <= 0 {
		return nil
	}
	r := newRNG(seed, 0x7a697066)
	total := 0.0
	for i := range names {
		total += math.Pow(float64(i+1), -s)
	}
	out := make([]string, 0, count)
	u := r.float()
	cum, prev := 0.0, 0
	for i, name := range names {
		cum += math.Pow(float64(i+1), -s)
		next := int(math.Floor(float64(count)*cum/total + u))
		if i == len(names)-1 || next > count {
			next = count // rounding: the last name closes the sum
		}
		for ; prev < next; prev++ {
			out = append(out, name)
		}
	}
	shuffle(r, out)
	return out
}

// Permutation returns a seeded random permutation of 0..n-1, e.g. an order
// for WriteQueries.
func Permutation(n int, seed int64) []int {
	p := make([]int, n)
	for i := range p {
		p[i] = i
	}
	shuffle(newRNG(seed, 0x7065726d), p)
	return p
}

func shuffle[T any](r *rng, s []T) {
	for i := len(s) - 1; i > 0; i-- {
		j := r.intn(i + 1)
		s[i], s[j] = s[j], s[i]
	}
}

// WriteQueries writes a kxdpgun query file (`man kxdpgun`, "Queries file
// format"): one line "name type" per query, in the given order (indexes
// into names; nil: as listed). qtype is written as given, so "A E" adds
// kxdpgun's EDNS flag and "A D" EDNS with DO. kxdpgun sends the lines in
// order and starts again at the end.
func WriteQueries(w io.Writer, names []string, qtype string, order []int) error {
	bw := bufio.NewWriterSize(w, 1<<16)
	suffix := " " + qtype + "\n"
	if order == nil {
		for _, n := range names {
			bw.WriteString(n)
			bw.WriteString(suffix)
		}
	} else {
		for _, i := range order {
			if i < 0 || i >= len(names) {
				return fmt.Errorf("dnsnames: order index %d out of range (%d names)", i, len(names))
			}
			bw.WriteString(names[i])
			bw.WriteString(suffix)
		}
	}
	return bw.Flush()
}

// WriteQueryFile is WriteQueries to a new file at path.
func WriteQueryFile(path string, names []string, qtype string, order []int) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if err := WriteQueries(f, names, qtype, order); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
