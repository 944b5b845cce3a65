package dataplane

import "encoding/binary"

// Twins of bpf/matcher.h: the region hash and the bucket of (rule set,
// region, hash).

const (
	regionHashBasis = 0xcbf29ce484222325
	regionHashPrime = 0x9e3779b97f4a7c15
)

// regionHashStep is region_hash_step: eight bytes, little-endian, into h.
func regionHashStep(h, word uint64) uint64 {
	h = (h ^ word) * regionHashPrime
	return h ^ h>>32
}

// regionHash is the matcher's 32-bit hash of a region's bytes: a step per
// whole 8-byte word, one more for the 0-7 bytes left, and the high half of
// that last product.
func regionHash(b []byte) uint32 {
	h := uint64(regionHashBasis)
	for ; len(b) >= 8; b = b[8:] {
		h = regionHashStep(h, binary.LittleEndian.Uint64(b))
	}
	var tail [8]byte
	copy(tail[:], b)
	return uint32(regionHashStep(h, binary.LittleEndian.Uint64(tail[:])) >> 32)
}

// region is a window of the payload the matcher hashes once per packet.
type region struct{ off, len int }

// bucketRange is a rule set's part of the bucket table: 2^k buckets at a
// multiple of 2^k. A set's chain heads then share a few pages instead of
// spreading over the whole table, which in the data plane is the difference
// between a TLB and cache hit and a page walk and a miss per request.
type bucketRange struct{ base, mask uint32 }

// minBucketRange is the smallest part: one 4 KiB page of chain heads.
const minBucketRange = 1024

// bucketRangeFor is the part of a table of tableMask+1 buckets for rule set
// id with n rules: four buckets per rule, a power of two from one page up to
// the whole table, at a place the seed and id pick. With few rules per
// bucket most buckets of other regions a request is looked up in are empty:
// a rule there would cost a miss to rule out (a benchmark run at 1 M DNS
// rules, a rule per bucket: 1.7 µs of XDP per request; one per four: 1.4-1.6).
func bucketRangeFor(seed, tableMask, id uint32, n int) bucketRange {
	size := uint32(minBucketRange)
	for size <= tableMask && int(size) < 4*n {
		size <<= 1
	}
	mask := min(size-1, tableMask)
	return bucketRange{base: mix32(seed^id*0x9E3779B1) & tableMask &^ mask, mask: mask}
}

// holds says whether n rules still suit the range: up to one rule per two
// buckets, or any number once it is the whole table (chains stay bounded by
// MaxChain either way; this only keeps them short).
func (b bucketRange) holds(n int, tableMask uint32) bool {
	return 2*n <= int(b.mask)+1 || b.mask == tableMask
}

func bucketOf(seed uint32, b bucketRange, ruleset uint32, r region, hash uint32) uint32 {
	x := mix32(hash ^ seed ^ (ruleset * 0x9E3779B1) ^ ((uint32(r.off)<<16 | uint32(r.len)) * 0x85EBCA6B))
	return b.base | x&b.mask
}

// mix32 is the finaliser of bucket_of in bpf/matcher.h.
func mix32(x uint32) uint32 {
	x ^= x >> 16
	x *= 0x7FEB352D
	x ^= x >> 15
	x *= 0x846CA68B
	x ^= x >> 16
	return x
}
