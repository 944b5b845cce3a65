package mcctl

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/vishvananda/netlink"
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

// ofSantad refuses a guard map that the rule processor of santad at socket
// does not read: another santad's (--guards left at its default beside a
// santad with another --bpffs). Its tracker would bump slots santad never
// reads, and its rules, whose versions it read there, would never answer,
// while it said they were offloaded. The rule processor is found on the
// interfaces santad attached to in this network namespace; with none there
// is nothing to compare with.
func (g *guardMap) ofSantad(socket string) error {
	c, err := santa.Dial(socket)
	if err != nil {
		return err
	}
	defer c.Close()
	info, _, err := c.Health()
	if err != nil {
		return err
	}
	mi, err := g.m.Info()
	if err != nil {
		return err
	}
	id, ok := mi.ID()
	if !ok {
		return nil
	}
	for _, iface := range info.Interfaces {
		l, err := netlink.LinkByName(iface.Name)
		if err != nil || l.Attrs().Xdp == nil || !l.Attrs().Xdp.Attached {
			continue
		}
		p, err := ebpf.NewProgramFromID(ebpf.ProgramID(l.Attrs().Xdp.ProgId))
		if err != nil {
			continue
		}
		pi, err := p.Info()
		p.Close()
		if err != nil {
			continue
		}
		if ids, ok := pi.MapIDs(); ok {
			if slices.Contains(ids, id) {
				return nil
			}
			return fmt.Errorf("the guard map --guards names (map %d) is not the one the rule processor of santad at %s reads (on %s): give --guards <santad's --bpffs>/guards", id, socket, iface.Name)
		}
	}
	return nil
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
