package mcctl_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestNoRoomInSantad: with more wanted keys than santad has room for, the
// controller offloads those that fit, says how many wait, goes on without
// trying them again while santad stays full, and installs the waiting keys
// as room comes free.
func TestNoRoomInSantad(t *testing.T) {
	// memcached has 3 sockets: the third key's rule fits on the first
	// socket, not on the second, and must be taken off the first again
	const maxRules = 7
	r := newRig(t, "--config", santadConfig(t, fmt.Sprintf("dataplane:\n  max_rules: %d\n", maxRules)))
	udp, conns := r.clients(false)
	keys := make([]string, 10)
	for i := range keys {
		keys[i] = fmt.Sprintf("room:%02d", i)
		if err := conns["text"].Set(keys[i], []byte("value of "+keys[i]), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, keys)
	ctl := r.startController("static", "--keys", file)

	var offloaded, rules, sockets int
	if _, err := fmt.Sscanf(ctl.Ready(), "ready: %d keys offloaded, %d rules on %d sockets", &offloaded, &rules, &sockets); err != nil || sockets == 0 {
		t.Fatalf("ready line %q: %v", ctl.Ready(), err)
	}
	fit := maxRules / sockets
	if offloaded != fit || rules != fit*sockets || r.rules() != uint64(rules) {
		t.Errorf("%d keys offloaded with %d rules on %d sockets, santad holds %d rules; want the %d keys that fit in %d rules",
			offloaded, rules, sockets, r.rules(), fit, maxRules)
	}
	if want := fmt.Sprintf("%d keys wait for room in santad", len(keys)-fit); !strings.Contains(ctl.Ready(), want) {
		t.Errorf("ready line %q does not say %q", ctl.Ready(), want)
	}
	if !strings.Contains(ctl.Output(), "raise santad's dataplane.max_rules") {
		t.Errorf("the log does not pass on santad's reason:\n%s", ctl.Output())
	}
	// fromKernel lists the keys the rule processor answers, each GET
	// checked for its value
	fromKernel := func() []string {
		var out []string
		for _, key := range keys {
			answered := r.counters()["answered"]
			it, ok, err := udp.Get(key, time.Second)
			if err != nil || !ok || string(it.Value) != "value of "+key {
				t.Fatalf("GET %s: %q (found %v, %v)", key, it.Value, ok, err)
			}
			if r.counters()["answered"] > answered {
				out = append(out, key)
			}
		}
		return out
	}
	if got := fromKernel(); !slices.Equal(got, keys[:fit]) {
		t.Fatalf("the kernel answers %v, want the first %d keys", got, fit)
	}
	// while santad stays full, the waiting keys are not tried again
	refusedAdds := func() int { return strings.Count(r.santad.Log(), `msg="request refused" op=add`) }
	before := refusedAdds()
	time.Sleep(2500 * time.Millisecond)
	if n := refusedAdds(); n != before {
		t.Errorf("santad refused %d more adds while it had no room", n-before)
	}

	// room comes free: two offloaded values are deleted, their rules go,
	// and the next two keys that waited take their place
	for _, key := range keys[:2] {
		if err := conns["text"].Delete(key); err != nil {
			t.Fatal(err)
		}
	}
	keys = keys[2:]
	deadline := time.Now().Add(5 * time.Second)
	for got := fromKernel(); !slices.Equal(got, keys[:fit]); got = fromKernel() {
		if time.Now().After(deadline) {
			t.Fatalf("after deleting 2 offloaded values, the kernel answers %v, want %v", got, keys[:fit])
		}
		time.Sleep(100 * time.Millisecond)
	}
	if exited, err := ctl.Wait(0); exited {
		t.Fatalf("the controller exited (%v)", err)
	}
}

// TestNoRoomForGrownValues: writes grow the offloaded values past santad's
// data memory. The rules whose rebuilt values do not fit go, their keys
// wait for room, the controller goes on, and no GET sees an old value.
func TestNoRoomForGrownValues(t *testing.T) {
	r := newRig(t, "--config", santadConfig(t, "dataplane:\n  data_mib: 1\n"))
	udp, conns := r.clients(false)
	keys := make([]string, 2000)
	value := func(key string, size int) []byte {
		return append([]byte(key+":"), bytes.Repeat([]byte{'x'}, size)...)
	}
	for i := range keys {
		keys[i] = fmt.Sprintf("grow:%04d", i)
		if err := conns["text"].Set(keys[i], value(keys[i], 10), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, keys)
	ctl := r.startController("static", "--keys", file)
	if !strings.Contains(ctl.Ready(), fmt.Sprintf("ready: %d keys offloaded", len(keys))) {
		t.Fatalf("ready line %q: want all %d keys offloaded", ctl.Ready(), len(keys))
	}
	// 2000 keys × 150 bytes × every socket: more than 1 MiB (a reply grows
	// the request's frame by less than its headroom: XDP can send it)
	for _, key := range keys {
		if err := conns["text"].Set(key, value(key, 150), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := ctl.WaitOutput("santad refused rebuilt rules", 10*time.Second); err != nil {
		t.Fatal(err)
	}
	// the rebuilt and the re-added rules answer once the writes settle
	deadline := time.Now().Add(5 * time.Second)
	for {
		answered := r.counters()["answered"]
		for _, key := range keys {
			it, ok, err := udp.Get(key, time.Second)
			if err != nil || !ok || !bytes.Equal(it.Value, value(key, 150)) {
				t.Fatalf("GET %s after it grew: %q (found %v, %v)", key, it.Value, ok, err)
			}
		}
		if r.counters()["answered"] > answered {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the kernel answers none of the grown values (counters %v)", r.counters())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if exited, err := ctl.Wait(0); exited {
		t.Fatalf("the controller exited (%v)", err)
	}
}

// santadConfig writes santad's config file.
func santadConfig(t *testing.T, yaml string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}
