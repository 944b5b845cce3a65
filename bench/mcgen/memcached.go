package mcgen

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"sort"
)

// Memcached UDP: every datagram starts with an 8-byte frame header
// (request id, sequence number, total datagrams in this message, reserved;
// all big endian), followed by the text protocol.
const MemcachedHeaderLen = 8

// Key sizes of the paper's Facebook USR workload (Atikoglu et al.,
// SIGMETRICS 2012): keys of 16 and 21 bytes, about half each.
const (
	KeyLenShort = 16
	KeyLenLong  = 21
)

const keyAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// Keys returns n distinct memcached keys, alternately 16 and 21 bytes long
// before shuffling (so n/2 of each, rounded), made of [a-z0-9]. The same n
// and seed give the same keys in the same order.
func Keys(n int, seed int64) []string {
	if n <= 0 {
		return nil
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6d656d6361636865))
	seen := make(map[string]struct{}, n)
	keys := make([]string, 0, n)
	buf := make([]byte, KeyLenLong)
	for len(keys) < n {
		l := KeyLenShort
		if len(keys)%2 == 1 {
			l = KeyLenLong
		}
		for i := range buf[:l] {
			buf[i] = keyAlphabet[rng.IntN(len(keyAlphabet))]
		}
		k := string(buf[:l])
		if _, dup := seen[k]; dup {
			continue
		}
		seen[k] = struct{}{}
		keys = append(keys, k)
	}
	rng.Shuffle(len(keys), func(i, j int) { keys[i], keys[j] = keys[j], keys[i] })
	return keys
}

// GetPayloads returns n memcached UDP GET payloads ("get <key>\r\n" behind
// the 8-byte frame header: request id i mod 65536, sequence 0, total 1,
// reserved 0), with keys drawn Zipf-like over keys: keys[r] (rank r, from
// 0) is drawn with probability proportional to 1/(r+1)^zipfS. zipfS 0 is
// uniform; s≈0.99 is a Facebook-like skew. Deterministic for a given seed.
// It panics if zipfS is negative or not finite.
func GetPayloads(keys []string, n int, zipfS float64, seed int64) [][]byte {
	return MixPayloads(keys, n, zipfS, 0, nil, seed)
}

// MixPayloads is GetPayloads with a share of writes: each request is,
// with probability setShare, a SET of its key to value (SetPayload)
// instead of a GET. setShare 0 gives GetPayloads' requests exactly.
func MixPayloads(keys []string, n int, zipfS, setShare float64, value []byte, seed int64) [][]byte {
	if len(keys) == 0 || n <= 0 {
		return nil
	}
	if zipfS < 0 || math.IsNaN(zipfS) || math.IsInf(zipfS, 0) {
		panic(fmt.Sprintf("mcgen: zipf exponent %v", zipfS))
	}
	if !(setShare >= 0 && setShare <= 1) {
		panic(fmt.Sprintf("mcgen: set share %v", setShare))
	}
	z := NewZipf(len(keys), zipfS)
	rng := rand.New(rand.NewPCG(uint64(seed), 0x7a697066))
	sets := rand.New(rand.NewPCG(uint64(seed), 0x736574))
	out := make([][]byte, n)
	for i := range out {
		key := keys[z.Draw(rng)]
		if setShare > 0 && sets.Float64() < setShare {
			out[i] = SetPayload(uint16(i), key, value)
		} else {
			out[i] = GetPayload(uint16(i), key)
		}
	}
	return out
}

// GetPayload is one memcached UDP GET request for key with request id id.
func GetPayload(id uint16, key string) []byte {
	p := make([]byte, 0, MemcachedHeaderLen+len("get \r\n")+len(key))
	p = appendHeader(p, id)
	p = append(p, "get "...)
	p = append(p, key...)
	return append(p, "\r\n"...)
}

// SetPayload is one memcached UDP SET request ("set <key> 0 0 <len>\r\n
// <value>\r\n", flags 0, no expiry); it must fit in one datagram.
func SetPayload(id uint16, key string, value []byte) []byte {
	p := appendHeader(nil, id)
	p = fmt.Appendf(p, "set %s 0 0 %d\r\n", key, len(value))
	p = append(p, value...)
	return append(p, "\r\n"...)
}

func appendHeader(p []byte, id uint16) []byte {
	var h [MemcachedHeaderLen]byte
	binary.BigEndian.PutUint16(h[0:], id)
	binary.BigEndian.PutUint16(h[4:], 1) // total datagrams
	return append(p, h[:]...)
}

// Zipf draws ranks 0..n-1 with P(r) ∝ 1/(r+1)^s for any s ≥ 0
// (math/rand's Zipf needs s > 1).
type Zipf struct {
	cdf []float64
}

// NewZipf prepares a Zipf distribution over n ranks with exponent s.
func NewZipf(n int, s float64) *Zipf {
	cdf := make([]float64, n)
	var t float64
	for r := range cdf {
		t += math.Pow(float64(r+1), -s)
		cdf[r] = t
	}
	for r := range cdf {
		cdf[r] /= t
	}
	return &Zipf{cdf: cdf}
}

// P is the probability of rank r.
func (z *Zipf) P(r int) float64 {
	if r == 0 {
		return z.cdf[0]
	}
	return z.cdf[r] - z.cdf[r-1]
}

// Draw returns a rank.
func (z *Zipf) Draw(rng *rand.Rand) int {
	u := rng.Float64()
	r := sort.SearchFloat64s(z.cdf, u)
	if r >= len(z.cdf) {
		r = len(z.cdf) - 1
	}
	return r
}
