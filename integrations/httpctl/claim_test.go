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

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
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

	argv := r.santaHTTP("--duration", "3s")
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

	r.kill(r.startCLI())
	next, err := testbed.StartController(context.Background(), r.santaHTTP(), 20*time.Second, nil)
	if err != nil {
		t.Fatalf("after a controller with the tag was killed, the next one: %v", err)
	}
	if err := next.Stop(10 * time.Second); err != nil {
		t.Error(err)
	}
}

// santaHTTP is the command line of a `santa http` on nginx's port and root
// in the server namespace, with args.
func (r *e2eRig) santaHTTP(args ...string) []string {
	return testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.sd.Socket, "http",
		append([]string{"--port", strconv.Itoa(testPort), "--root", r.ng.Root}, args...)...)
}

// startCLI starts a `santa http` and waits until it is ready.
func (r *e2eRig) startCLI() *testbed.Controller {
	r.t.Helper()
	ctl, err := testbed.StartController(context.Background(), r.santaHTTP(), 20*time.Second, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	return ctl
}

// kill kills controller killed with SIGKILL: it leaves the rule sets its
// attach made bound.
func (r *e2eRig) kill(killed *testbed.Controller) {
	r.t.Helper()
	if err := syscall.Kill(killed.PID(), syscall.SIGKILL); err != nil {
		r.t.Fatal(err)
	}
	if exited, _ := killed.Wait(10 * time.Second); !exited {
		r.t.Fatal("the controller outlived SIGKILL")
	}
}

// TestPredecessorsRuleSetsUnbound: a controller killed with SIGKILL leaves
// the rule sets its attach made: nginx's IPv4 listener's (another program
// bound the IPv6 listener first), and those of the two listeners a reload
// of nginx opened. Left empty, they have eBPF answer every handshake on
// the listeners and hand each connection over to nginx. The next
// controller with the tag on the port takes them over and unbinds them on
// exit, and leaves the other program's alone. (It left them bound for
// good: santad told only the killed controller's binds that they made
// them.)
func TestPredecessorsRuleSetsUnbound(t *testing.T) {
	r := newE2E(t, e2eOptions{files: map[string][]byte{"a.txt": fileBefore}, reuseport: true})
	r.stopController()
	other, err := r.client.BindPortProtocol(testPort, api.ProtocolTCP, santa.SampleOptions{})
	if err != nil || len(other) != 2 {
		t.Fatalf("the other program's bind: %+v (%v), want nginx's 2 listeners", other, err)
	}
	otherCookie := uint64(0)
	for _, s := range other {
		if s.AddrPort().Addr().Is6() {
			otherCookie = s.Cookie
		} else if err := r.client.Unbind(santa.Cookie(s.Cookie)); err != nil {
			t.Fatal(err)
		}
	}
	killed := r.startCLI()
	r.reloadWithWorkers(2)
	for deadline := time.Now().Add(5 * time.Second); strings.Count(killed.Output(), "attached to a new listening socket") < 2; {
		if time.Now().After(deadline) {
			t.Fatalf("the controller did not attach to the 2 listeners of the reload within 5 s:\n%s", killed.Output())
		}
		time.Sleep(50 * time.Millisecond)
	}
	r.kill(killed)
	if socks, err := r.client.ListSockets(); err != nil || len(socks) != 4 {
		t.Fatalf("rule sets after the controller was killed: %+v (%v), want nginx's 4", socks, err)
	}
	dir := t.TempDir()
	before := r.counters()
	checkFile(t, r.curlFile(dir, "empty", "/a.txt"), fileBefore, "with empty rule sets on the IPv4 listeners")
	if d := delta(before, r.counters()); d["tcp_syn_answered"] != 1 || d["tcp_handed_over"] != 1 || d["answered"] != 0 {
		t.Errorf("a connection to listeners with an empty rule set: counters %v, want tcp_syn_answered +1, tcp_handed_over +1", d)
	}

	argv := r.santaHTTP("--duration", "2s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"taking over the rule sets a predecessor made" tag=santa-http rule_sets=3`) {
		t.Errorf("the next controller: %v, want it to take over 3 rule sets:\n%s", err, out)
	}
	socks, err := r.client.ListSockets()
	if err != nil || len(socks) != 1 || socks[0].Cookie != otherCookie {
		t.Errorf("rule sets after the next controller stopped: %+v (%v), want the other program's only (socket %d)", socks, err, otherCookie)
	}
	before = r.counters()
	checkFile(t, r.curlFile(dir, "unbound", "/a.txt"), fileBefore, "after the next controller stopped")
	if d := delta(before, r.counters()); d["tcp_syn_answered"] != 0 {
		t.Errorf("a connection to nginx after the next controller stopped: counters %v, want no handshake answered by eBPF", d)
	}
}
