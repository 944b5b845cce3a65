package dataplane

import (
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// mmapArray is a BPF_F_MMAPABLE array mapped into user space: values are
// written in place and published with single aligned 32-bit atomic stores,
// so the rule processor never sees half of an update.
type mmapArray struct {
	mem     []byte
	stride  int    // value size rounded up to 8, as the kernel lays the array out
	entries uint32 // values in the array
}

// mapArray maps m for reading and writing, or (a predecessor's) for reading only.
func mapArray(m *ebpf.Map, writable bool) (*mmapArray, error) {
	stride := (int(m.ValueSize()) + 7) &^ 7
	size := stride * int(m.MaxEntries())
	page := unix.Getpagesize()
	size = (size + page - 1) &^ (page - 1)
	prot := unix.PROT_READ
	if writable {
		prot |= unix.PROT_WRITE
	}
	mem, err := unix.Mmap(m.FD(), 0, size, prot, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("mmap map %s: %w", m, err)
	}
	return &mmapArray{mem: mem, stride: stride, entries: m.MaxEntries()}, nil
}

func (a *mmapArray) value(i uint32) []byte {
	off := int(i) * a.stride
	return a.mem[off : off+a.stride]
}

func (a *mmapArray) store32(i uint32, fieldOff int, v uint32) {
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&a.mem[int(i)*a.stride+fieldOff])), v)
}

func (a *mmapArray) load32(i uint32, fieldOff int) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&a.mem[int(i)*a.stride+fieldOff])))
}

func (a *mmapArray) add64(i uint32, fieldOff int, delta uint64) {
	atomic.AddUint64((*uint64)(unsafe.Pointer(&a.mem[int(i)*a.stride+fieldOff])), delta)
}

func (a *mmapArray) close() error {
	if a == nil || a.mem == nil {
		return nil
	}
	err := unix.Munmap(a.mem)
	a.mem = nil
	return err
}
