package api

import (
	"net/netip"
	"testing"
)

// TestLoopbackOnly: sockets whose requests only come over lo.
func TestLoopbackOnly(t *testing.T) {
	sock := func(addr string) SocketInfo {
		a := netip.MustParseAddr(addr)
		return SocketInfo{Address: a.AsSlice(), Port: 53}
	}
	for _, c := range []struct {
		addrs []string
		want  bool
	}{
		{[]string{"127.0.0.1"}, true},
		{[]string{"127.0.0.1", "::1"}, true},
		{[]string{"::ffff:127.0.0.1"}, true},
		{[]string{"127.0.0.1", "198.18.0.1"}, false},
		{[]string{"0.0.0.0"}, false},
		{[]string{"::"}, false},
		{nil, false},
	} {
		var socks []SocketInfo
		for _, a := range c.addrs {
			socks = append(socks, sock(a))
		}
		if got := LoopbackOnly(socks); got != c.want {
			t.Errorf("sockets bound to %v: LoopbackOnly %v, want %v", c.addrs, got, c.want)
		}
	}
}
