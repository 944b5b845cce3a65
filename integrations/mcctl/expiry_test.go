package mcctl_test

import (
	"bufio"
	"fmt"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestExpiryWithoutController: a value memcached expires is no longer
// answered from the kernel once memcached says it is gone, although its
// controller was killed (SIGKILL leaves its rules): the rule carries the
// expiry. memcached's clock ticks once a second at the phase of its start,
// so a value with t seconds left as of its fetch expires up to a second
// sooner; memcached is started 0.7 s into a second, and the keys are
// fetched at phases spread over a second. A rule answered until the whole
// second before t ran out, up to a second after memcached's miss.
func TestExpiryWithoutController(t *testing.T) {
	r := newRig(t)
	if err := r.mc.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Until(time.Now().Truncate(time.Second).Add(1700 * time.Millisecond)))
	mc, err := r.tb.StartMemcached(testbed.MemcachedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.mc = mc
	const value, ttl = "short-lived", 4
	udp, conns := r.clients(false)
	var keys []string
	for i := range 10 {
		keys = append(keys, fmt.Sprintf("expiry:key:%d", i))
	}
	for _, k := range keys {
		if err := conns["text"].Set(k, []byte("lasting"), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, keys)
	ctl := r.startController("static", "--keys", file)
	// each write is fetched again within --refresh: the fetches' phases
	// follow the writes'
	for _, k := range keys {
		if err := conns["text"].Set(k, []byte(value), 0, ttl); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	get := func(key string) (string, bool) {
		it, ok, err := udp.Get(key, time.Second)
		if err != nil {
			t.Fatal(err)
		}
		return string(it.Value), ok
	}
	for _, k := range keys {
		r.waitAnswered(func() { get(k) }, r.counters()["answered"])
	}
	if err := syscall.Kill(ctl.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if exited, _ := ctl.Wait(10 * time.Second); !exited {
		t.Fatal("the controller outlived SIGKILL")
	}
	answered := r.counters()["answered"]
	if v, ok := get(keys[len(keys)-1]); !ok || v != value || r.counters()["answered"] != answered+1 {
		t.Fatalf("with the controller gone, before the expiry: GET gave %q (found %v), want %q from the kernel", v, ok, value)
	}
	// the moment memcached says a key is gone, the kernel must say so too
	tcp := r.dialTCP(t)
	replies := bufio.NewReader(tcp)
	deadline := time.Now().Add(2 * ttl * time.Second)
	for len(keys) > 0 && time.Now().Before(deadline) {
		k := keys[0]
		if _, err := fmt.Fprintf(tcp, "mg %s\r\n", k); err != nil {
			t.Fatal(err)
		}
		line, err := replies.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		if line == "HD\r\n" {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		if v, ok := get(k); ok {
			t.Errorf("%s: memcached says %q, and then a GET found %q", k, strings.TrimSpace(line), v)
		}
		keys = keys[1:]
	}
	if len(keys) > 0 {
		t.Fatalf("memcached still holds %q %v after its set with a ttl of %d s", keys, 2*ttl*time.Second, ttl)
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
