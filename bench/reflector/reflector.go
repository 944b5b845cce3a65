// Package reflector is a bare XDP reflector: every UDP datagram for one port
// is sent straight back (MAC, IP and port swapped, XDP_TX), with no parsing
// beyond the headers. On the veth testbed it is the physical limit any XDP
// responder can reach; the UDP benchmark uses it as a baseline.
package reflector

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel reflector bpf/reflector.c

import (
	"fmt"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
)

// Reflector is a loaded reflector program.
type Reflector struct {
	objs reflectorObjects
	link link.Link
}

// Load loads the reflector for UDP destination port port (0: every port).
func Load(port uint16) (*Reflector, error) {
	spec, err := loadReflector()
	if err != nil {
		return nil, err
	}
	v, ok := spec.Variables["reflect_port"]
	if !ok {
		return nil, fmt.Errorf("reflector: no reflect_port variable")
	}
	if err := v.Set(port); err != nil {
		return nil, fmt.Errorf("reflector: set port: %w", err)
	}
	r := &Reflector{}
	if err := spec.LoadAndAssign(&r.objs, nil); err != nil {
		return nil, fmt.Errorf("reflector: load: %w", err)
	}
	return r, nil
}

// Program is the XDP program.
func (r *Reflector) Program() *ebpf.Program { return r.objs.Reflector }

// Attach attaches the program in native mode to interface ifindex with a
// bpf_link. The caller must be in the interface's network namespace (use
// testbed.Do). Detach or Close removes it.
func (r *Reflector) Attach(ifindex int) error {
	if r.link != nil {
		return fmt.Errorf("reflector: already attached")
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: r.objs.Reflector, Interface: ifindex, Flags: link.XDPDriverMode})
	if err != nil {
		return fmt.Errorf("reflector: attach to ifindex %d: %w", ifindex, err)
	}
	r.link = l
	return nil
}

// Detach removes the attachment, if any.
func (r *Reflector) Detach() error {
	if r.link == nil {
		return nil
	}
	err := r.link.Close()
	r.link = nil
	return err
}

// Reflected is the number of packets reflected so far (all CPUs).
func (r *Reflector) Reflected() (uint64, error) {
	var per []uint64
	if err := r.objs.Reflected.Lookup(uint32(0), &per); err != nil {
		return 0, err
	}
	var sum uint64
	for _, v := range per {
		sum += v
	}
	return sum, nil
}

// Close detaches and unloads.
func (r *Reflector) Close() error {
	err := r.Detach()
	if cerr := r.objs.Close(); err == nil {
		err = cerr
	}
	return err
}
