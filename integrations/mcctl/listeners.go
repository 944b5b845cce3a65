package mcctl

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"

	"github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/internal/sockets"
	"golang.org/x/sys/unix"
)

// memcachedPorts finds memcached, the processes of this network namespace
// that hold a UDP socket bound to udpPort, and returns the ports of every
// socket they serve on (their -l, -p and -U), TCP and UDP: the write
// tracker must watch them all, since a write through any of them changes
// what the rules answer. memcached opens its listeners only at start, so
// they are looked for once. bound are the addresses of its sockets on
// udpPort.
func memcachedPorts(udpPort uint16) (tcp, udp []uint16, bound []netip.Addr, err error) {
	byPID, err := sockets.ListenersInNamespace()
	if err != nil {
		return nil, nil, nil, fmt.Errorf("find memcached's listeners: %w", err)
	}
	servesUDPPort := func(l sockets.Listener) bool {
		return l.Protocol == unix.IPPROTO_UDP && l.Local.Port() == udpPort
	}
	tcpPorts, udpPorts := map[uint16]bool{}, map[uint16]bool{}
	for _, listeners := range byPID {
		if !slices.ContainsFunc(listeners, servesUDPPort) {
			continue
		}
		for _, l := range listeners {
			if l.Protocol == unix.IPPROTO_TCP {
				tcpPorts[l.Local.Port()] = true
			} else {
				udpPorts[l.Local.Port()] = true
			}
			if servesUDPPort(l) {
				bound = append(bound, l.Local.Addr().Unmap())
			}
		}
	}
	if len(udpPorts) == 0 {
		return nil, nil, nil, fmt.Errorf("%w: no process in this network namespace has a UDP socket bound to port %d "+
			"(memcached serves UDP only when started with -U %d: it is off by default)", follow.ErrNoServer, udpPort, udpPort)
	}
	return slices.Sorted(maps.Keys(tcpPorts)), slices.Sorted(maps.Keys(udpPorts)), bound, nil
}
