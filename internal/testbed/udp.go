//go:build linux

package testbed

import (
	"net"
	"net/netip"
)

// ListenUDP opens a UDP socket bound to addr inside this side's namespace.
// The socket can be used from any goroutine.
func (s Side) ListenUDP(addr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := s.Do(func() error {
		var err error
		c, err = net.ListenUDP("udp", net.UDPAddrFromAddrPort(addr))
		return err
	})
	return c, err
}

// DialUDP opens a UDP socket in this side's namespace connected to raddr.
func (s Side) DialUDP(raddr netip.AddrPort) (*net.UDPConn, error) {
	var c *net.UDPConn
	err := s.Do(func() error {
		var err error
		c, err = net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(raddr))
		return err
	})
	return c, err
}

// DialUDP opens a UDP socket in the client namespace connected to raddr
// (usually an address of the server side).
func (tb *Testbed) DialUDP(raddr netip.AddrPort) (*net.UDPConn, error) {
	return tb.Client.DialUDP(raddr)
}
