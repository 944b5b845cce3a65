package mcctl_test

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/clients/go/santa"
)

// TestExpiryWithoutController: a value memcached expires is no longer
// answered from the kernel once it expires, although its controller was
// killed (SIGKILL leaves its rules): the rule carries the expiry.
func TestExpiryWithoutController(t *testing.T) {
	r := newRig(t)
	const key, value, ttl = "expiry:key", "short-lived", 4
	udp, conns := r.clients(false)
	if err := conns["text"].Set(key, []byte(value), 0, ttl); err != nil {
		t.Fatal(err)
	}
	set := time.Now()
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{key})
	ctl := r.startController("static", "--keys", file)
	get := func() (string, bool) {
		it, ok, err := udp.Get(key, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(it.Value), ok
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	if err := syscall.Kill(ctl.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if exited, _ := ctl.Wait(10 * time.Second); !exited {
		t.Fatal("the controller outlived SIGKILL")
	}
	answered := r.counters()["answered"]
	if v, ok := get(); !ok || v != value || r.counters()["answered"] != answered+1 {
		t.Fatalf("with the controller gone, before the expiry: GET gave %q (found %v), want %q from the kernel", v, ok, value)
	}
	// memcached's clock ticks in seconds: it drops the value within a
	// second of the ttl; the kernel must not answer with it after that
	time.Sleep(time.Until(set.Add(ttl*time.Second + 1100*time.Millisecond)))
	answered = r.counters()["answered"]
	for range 10 {
		if v, ok := get(); ok {
			t.Fatalf("%v after a set with a ttl of %d s, with its controller killed: GET found %q", time.Since(set).Round(time.Millisecond), ttl, v)
		}
	}
	if n := r.counters()["answered"] - answered; n != 0 {
		t.Errorf("the kernel answered %d GETs of the expired value", n)
	}
}

// TestRuleGoneUnderController deletes a controller's rule behind its back
// (as santad does when a value's expiry comes before the controller): the
// next rebuild of the key finds it gone, adds it again, and the controller
// carries on.
func TestRuleGoneUnderController(t *testing.T) {
	r := newRig(t)
	const key = "gone:key"
	conns, ctl, get := r.offloadOld(key)
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	socks, err := c.ListSockets()
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range socks {
		if _, err := c.DeleteTagged(santa.Cookie(s.Cookie), "santa-memcached"); err != nil {
			t.Fatal(err)
		}
	}
	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	if v := get(); v != "new" {
		t.Fatalf("after the write: GET gave %q, want new", v)
	}
	if exited, err := ctl.Wait(0); exited {
		t.Fatalf("the controller exited (%v)", err)
	}
	if !strings.Contains(ctl.Output(), "added again") {
		t.Errorf("the controller did not log the rule it added again:\n%s", ctl.Output())
	}

	// gone again, and then the value too: the removal of the rule finds it
	// gone, and the controller goes on
	for _, s := range socks {
		if _, err := c.DeleteTagged(santa.Cookie(s.Cookie), "santa-memcached"); err != nil {
			t.Fatal(err)
		}
	}
	if err := conns["text"].Delete(key); err != nil {
		t.Fatal(err)
	}
	if exited, err := ctl.Wait(1500 * time.Millisecond); exited {
		t.Fatalf("the controller exited removing a rule already gone (%v)", err)
	}
	if v := get(); !strings.HasPrefix(v, "(found false") {
		t.Errorf("after the delete: GET gave %q, want no value", v)
	}
}
