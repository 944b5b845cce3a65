package mcctl

import (
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
