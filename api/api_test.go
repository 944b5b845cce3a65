package api

import (
	"net/netip"
	"strings"
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

// TestDecodeNamesUnknownKey: santad's refusal of a key it does not know
// names the key and, in a nested map, where it is.
func TestDecodeNamesUnknownKey(t *testing.T) {
	rule := map[uint64]any{2: []any{map[uint64]any{1: []byte("a")}}, 4: 1}
	for want, msg := range map[string]map[any]any{
		"unknown key 24":                          {0: 1, 1: 4, 24: 1},
		`unknown key "x"`:                         {0: 1, "x": 1},
		"unknown key 12 in rules[1]":              {0: 1, 9: []any{rule, map[uint64]any{12: 1}}},
		"unknown key 7 in rules[0].conditions[0]": {0: 1, 9: []any{map[uint64]any{2: []any{map[uint64]any{7: 1}}}}},
		"unknown key 15 in daemon.interfaces[0]":  {0: 1, 16: map[uint64]any{4: []any{map[uint64]any{15: 1}}}},
		"unknown key 9 in rules[0].processors[0]": {0: 1, 9: []any{map[uint64]any{3: []any{map[uint64]any{9: 1}}}}},
	} {
		b, err := encMode.Marshal(msg)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Decode(b); err == nil || !strings.HasSuffix(err.Error(), ": "+want) {
			t.Errorf("%s: %v, want an error naming it", want, err)
		}
	}
}
