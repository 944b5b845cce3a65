package dataplane

import (
	"fmt"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// Socket is a socket to give a rule set: its cookie, and the transport and
// local port its requests arrive on. The rule processor looks sockets up
// only for requests to ports that have rule sets (santa_ports), so a
// request to any other port costs no socket lookup.
type Socket struct {
	Cookie   uint64
	Protocol uint8  // unix.IPPROTO_UDP, or unix.IPPROTO_TCP (a listener)
	Port     uint16 // the local port it is bound to
}

func (s Socket) check() error {
	if s.Protocol != unix.IPPROTO_UDP && s.Protocol != unix.IPPROTO_TCP {
		return fmt.Errorf("socket %#x: IP protocol %d: rule sets are for UDP (17) and TCP (6) sockets", s.Cookie, s.Protocol)
	}
	if s.Port == 0 {
		return fmt.Errorf("socket %#x: not bound to a port", s.Cookie)
	}
	return nil
}

// The sets of santa_ports (bpf/maps.h), each portWords words of port bits.
const (
	portsUDP        = int(santaSantaLimitSANTA_PORTS_UDP)
	portsTCP        = int(santaSantaLimitSANTA_PORTS_TCP)
	portsTCPSampled = int(santaSantaLimitSANTA_PORTS_TCP_SAMPLED) // data on the kernel's connections is sampled there
	portsTCPSeen    = int(santaSantaLimitSANTA_PORTS_TCP_SEEN)    // had a rule set: TC checks stamps there
	portWords       = int(santaSantaLimitSANTA_PORT_WORDS)
)

// portSets lists the sets of santa_ports a rule set of sock with sampling
// s holds its port in.
func portSets(sock Socket, s SampleOptions) []int {
	switch {
	case sock.Protocol == unix.IPPROTO_UDP:
		return []int{portsUDP}
	case s.Bytes > 0:
		return []int{portsTCP, portsTCPSampled}
	default:
		return []int{portsTCP}
	}
}

type portKey struct {
	set  int
	port uint16
}

// countPort adds delta to the rule sets that hold port in set: its bit is
// set when the first comes and cleared when the last goes. Callers hold d.mu.
func (d *Dataplane) countPort(set int, port uint16, delta int) error {
	k := portKey{set, port}
	before := d.portUsers[k]
	after := before + delta
	if (before == 0) != (after == 0) {
		if err := d.setPortBit(set, port, after != 0); err != nil {
			return err
		}
	}
	if after == 0 {
		delete(d.portUsers, k)
	} else {
		d.portUsers[k] = after
	}
	return nil
}

// countPorts is countPort for each of sets; on failure it undoes the ones done.
func (d *Dataplane) countPorts(sets []int, port uint16, delta int) error {
	for i, set := range sets {
		if err := d.countPort(set, port, delta); err != nil {
			for _, done := range sets[:i] {
				d.countPort(done, port, -delta)
			}
			return err
		}
	}
	return nil
}

func (d *Dataplane) setPortBit(set int, port uint16, on bool) error {
	bit := uint64(1) << (port % 64)
	return d.updatePortWord(set, int(port)/64, func(bits uint64) uint64 {
		if on {
			return bits | bit
		}
		return bits &^ bit
	})
}

// updatePortWord rewrites word i of set of santa_ports with f.
func (d *Dataplane) updatePortWord(set, i int, f func(uint64) uint64) error {
	key := uint32(set*portWords + i)
	var bits uint64
	if err := d.objs.SantaPorts.Lookup(key, &bits); err != nil {
		return fmt.Errorf("read santa_ports: %w", err)
	}
	if err := d.objs.SantaPorts.Update(key, f(bits), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("write santa_ports: %w", err)
	}
	return nil
}

// adoptSeenPorts ORs a predecessor's set of TCP ports that had a rule set
// (santa_ports words) into this data plane's.
func (d *Dataplane) adoptSeenPorts(words []uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, w := range words {
		if w == 0 {
			continue
		}
		if err := d.updatePortWord(portsTCPSeen, i, func(bits uint64) uint64 { return bits | w }); err != nil {
			return err
		}
	}
	return nil
}
