package mcctl_test

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/santa-offload/santa/internal/mcproto"
)

// TestGivenInterfacesTrackLoopback: with --interface naming only the
// server's veth, a write from memcached's own host, which reaches it over
// lo as the controller's fetches do, still retires the rule: the tracker
// goes on lo too. It used to go on the named interfaces alone, and the
// kernel went on answering the value from before the write.
func TestGivenInterfacesTrackLoopback(t *testing.T) {
	r := newRig(t)
	const key = "loopback:key"
	_, ctl, get := r.offloadOld(key, "--interface", r.tb.Server.Dev)
	if want := `"write tracker attached" interfaces="[` + r.tb.Server.Dev + ` lo]"`; !strings.Contains(ctl.Output(), want) {
		t.Errorf("the controller did not log %s:\n%s", want, ctl.Output())
	}
	var local mcproto.Conn
	if err := r.tb.Server.Do(func() (err error) {
		local, err = mcproto.DialText(netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), r.mc.Addr4.Port()).String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer local.Close()
	if err := local.Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if v := get(); v != "new" {
			t.Fatalf("GET after a set over loopback: %q, want new", v)
		}
	}
}
