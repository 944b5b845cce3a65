package mcctl

import (
	"net/netip"
	"testing"

	"github.com/santa-offload/santa/api"
)

// TestSocketDefault: without a socket of its own the controller talks to
// santad at $SANTA_SOCKET, as every santa command does, else at the default.
// It used to take the default even with $SANTA_SOCKET set, so `santa
// memcached` alone of the commands missed a santad whose socket was given
// that way.
func TestSocketDefault(t *testing.T) {
	for _, c := range []struct{ env, flag, want string }{
		{"/run/elsewhere/santa.sock", "", "/run/elsewhere/santa.sock"},
		{"", "", api.DefaultSocket},
		{"/run/elsewhere/santa.sock", "/tmp/given.sock", "/tmp/given.sock"},
	} {
		t.Setenv("SANTA_SOCKET", c.env)
		ctl, err := New(Config{Socket: c.flag, Port: 11211, Mode: Static, Keys: []string{"a"}})
		if err != nil {
			t.Fatal(err)
		}
		if ctl.cfg.Socket != c.want {
			t.Errorf("SANTA_SOCKET=%q, socket %q: the controller dials %q, want %q", c.env, c.flag, ctl.cfg.Socket, c.want)
		}
	}
}

// TestFetchAddress: values are fetched where memcached's UDP sockets are
// bound (memcached -l binds TCP there too), over loopback if one is bound
// to loopback or the wildcard address.
func TestFetchAddress(t *testing.T) {
	for _, c := range []struct {
		bound []string
		want  string
	}{
		{[]string{"0.0.0.0"}, "127.0.0.1"},
		{[]string{"::"}, "::1"},
		{[]string{"::", "0.0.0.0"}, "127.0.0.1"},
		{[]string{"10.1.2.3", "127.0.0.1"}, "127.0.0.1"},
		{[]string{"10.1.2.3"}, "10.1.2.3"},
		{[]string{"2001:db8::5", "10.1.2.3"}, "10.1.2.3"},
		{[]string{"2001:db8::5"}, "2001:db8::5"},
		{[]string{"::1"}, "::1"},
	} {
		var addrs []netip.Addr
		for _, a := range c.bound {
			addrs = append(addrs, netip.MustParseAddr(a))
		}
		if got := fetchAddress(addrs); got.String() != c.want {
			t.Errorf("sockets bound to %v: fetch from %v, want %s", c.bound, got, c.want)
		}
	}
}
