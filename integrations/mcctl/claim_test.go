package mcctl_test

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestSecondControllerWithTagRefused: a `santa memcached` started while a
// controller with its tag runs on the port refuses to start, naming the tag
// and the running one's pid, before it touches the running one's write
// tracker or rules; the running one goes on retiring and rebuilding its
// rule. (The second used to replace its tracker's pins and take its rules
// over.)
func TestSecondControllerWithTagRefused(t *testing.T) {
	r := newRig(t)
	const key = "claim:key"
	conns, first, get := r.offloadOld(key)
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{key})
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "memcached",
		"--guards", filepath.Join(r.bpffs, "guards"), "static", "--keys", file, "--duration", "3s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	want := fmt.Sprintf(`another controller (pid %d) runs with tag "santa-memcached" on UDP port %d`,
		first.PID(), r.mc.Addr4.Port())
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("a second santa memcached with the running one's tag: %v, want it refused saying %q:\n%s", err, want, out)
	}

	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if v := get(); v != "new" {
		t.Errorf("GET after a set: %q, want new", v)
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"]) // the rule rebuilt
	if v := get(); v != "new" {
		t.Errorf("GET of the rebuilt rule: %q, want new", v)
	}
	if exited, err := first.Wait(100 * time.Millisecond); exited {
		t.Fatalf("the running controller ended: %v\n%s", err, first.Output())
	}
}
