package httpctl

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// TestSecondControllerWithTagRefused: a `santa http` started while a
// controller with its tag runs on the port refuses to start, naming the tag
// and the running one's pid; the running one keeps its rule and goes on
// (the second used to take its rules over, and the first then failed with
// "no rule with id N"). A controller killed with SIGKILL holds nothing: the
// next one starts.
func TestSecondControllerWithTagRefused(t *testing.T) {
	r := newE2E(t, e2eOptions{files: map[string][]byte{"a.txt": fileBefore}})
	dir := t.TempDir()
	r.curlFile(dir, "learn", "/a.txt")
	ruleIDs := func(rs []e2eRule) []uint64 {
		var ids []uint64
		for _, x := range rs {
			ids = append(ids, x.id)
		}
		slices.Sort(ids)
		return ids
	}
	learned := ruleIDs(r.waitLines(4, "GET /a.txt HTTP/1.1"))

	santaHTTP := func(args ...string) []string {
		return testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.sd.Socket, "http",
			append([]string{"--port", strconv.Itoa(testPort), "--root", r.ng.Root}, args...)...)
	}
	argv := santaHTTP("--duration", "3s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	want := fmt.Sprintf(`another controller (pid %d) runs with tag "santa-http" on TCP port %d`, os.Getpid(), testPort)
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("a second santa http with the running one's tag: %v, want it refused saying %q:\n%s", err, want, out)
	}

	time.Sleep(2 * time.Second) // the running controller rewrites its rule's Date every second
	select {
	case err := <-r.errc:
		r.stopped = true
		t.Fatalf("the running controller ended: %v", err)
	default:
	}
	if now := ruleIDs(r.rules()); !slices.Equal(now, learned) {
		t.Errorf("the running controller's rules are now %v, were %v", now, learned)
	}
	before := r.counters()["answered"]
	checkFile(t, r.curlFile(dir, "offloaded", "/a.txt"), fileBefore, "after the second controller was refused")
	if r.counters()["answered"] == before {
		t.Error("the running controller's rule no longer answers")
	}
	r.stopController()

	killed, err := testbed.StartController(context.Background(), santaHTTP(), 20*time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(killed.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if exited, _ := killed.Wait(10 * time.Second); !exited {
		t.Fatal("the controller outlived SIGKILL")
	}
	next, err := testbed.StartController(context.Background(), santaHTTP(), 20*time.Second, nil)
	if err != nil {
		t.Fatalf("after a controller with the tag was killed, the next one: %v", err)
	}
	if err := next.Stop(10 * time.Second); err != nil {
		t.Error(err)
	}
}
