package mcctl

import (
	"errors"
	"fmt"
	"os"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// guardMap is santad's pinned guard map, mapped into the controller: it
// reads a key's version before fetching its value, checks the versions of
// its rules to find those a write retired, and bumps the slots of writes
// that got no reply once they have settled.
type guardMap struct {
	m   *ebpf.Map
	mem []byte
}

func openGuards(pin string) (*guardMap, error) {
	m, err := ebpf.LoadPinnedMap(pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("no guard map at %s: is santad running? One with another --bpffs has it at <its --bpffs>/guards: give that with --guards", pin)
	}
	if err != nil {
		return nil, fmt.Errorf("open guard map %s: %w", pin, err)
	}
	if m.Type() != ebpf.Array || m.KeySize() != 4 || m.ValueSize() != 8 || m.MaxEntries() != guardSlots {
		m.Close()
		return nil, fmt.Errorf("%s is not a guard map of this version (%v, %d slots)", pin, m.Type(), m.MaxEntries())
	}
	mem, err := unix.Mmap(m.FD(), 0, int(guardSlots)*8, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		m.Close()
		return nil, fmt.Errorf("map guard map %s: %w", pin, err)
	}
	return &guardMap{m: m, mem: mem}, nil
}

// version is slot's current version.
func (g *guardMap) version(slot uint32) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&g.mem[uint64(slot)*8])))
}

// bump retires every rule guarded by slot's current version, as the
// tracker's bumps do (atomically: they may bump it at the same time).
func (g *guardMap) bump(slot uint32) {
	atomic.AddUint64((*uint64)(unsafe.Pointer(&g.mem[uint64(slot)*8])), 1)
}

func (g *guardMap) close() error {
	return errors.Join(unix.Munmap(g.mem), g.m.Close())
}
