package dataplane

// Twins of bpf/matcher.h: FNV-1a 32 and the bucket of (rule set, region, hash).

const (
	fnv32Basis = 2166136261
	fnv32Prime = 16777619
)

func fnv1a32(b []byte) uint32 {
	h := uint32(fnv32Basis)
	for _, c := range b {
		h ^= uint32(c)
		h *= fnv32Prime
	}
	return h
}

// region is a window of the payload the matcher hashes once per packet.
type region struct{ off, len int }

func bucketOf(seed, mask, ruleset uint32, r region, hash uint32) uint32 {
	x := hash ^ seed ^ (ruleset * 0x9E3779B1) ^ ((uint32(r.off)<<16 | uint32(r.len)) * 0x85EBCA6B)
	x ^= x >> 16
	x *= 0x7FEB352D
	x ^= x >> 15
	x *= 0x846CA68B
	x ^= x >> 16
	return x & mask
}
