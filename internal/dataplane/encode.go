package dataplane

import "unsafe"

// encodeInto writes v's bytes as the kernel lays them out into dst and
// returns how many. bpf2go's types carry structs.HostLayout and spell out
// their padding, so on the little-endian hosts the bpfel object runs on their
// memory image is the kernel's layout (encode_test.go checks it against
// encoding/binary, which would cost ~1 µs per rule here).
func encodeInto[T santaSantaRule | santaSantaRuleset](dst []byte, v *T) int {
	return copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(v)), unsafe.Sizeof(*v)))
}
