package daemon_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/follow"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestStopWhileBusy stops santad (SIGTERM) three times while clients add,
// count, list and delete rules as fast as they can. santad must exit
// cleanly, every request must be either answered or cut off unanswered
// (never refused for santad's own failure), and the next santad must hold
// exactly the rules the clients were told exist; of a request cut off, all
// or none happened.
func TestStopWhileBusy(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	_, target := serverSocket(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7300))
	if _, err := sd.client().Add(target, nil); err != nil { // binds it, so that workers may name its cookie
		t.Fatal(err)
	}
	cookie := santa.Cookie(mustCookie(t, sd.client()))

	// What one worker knows at the end: the rules it was told exist, and
	// the request santad did not answer, if any.
	type known struct {
		have      map[uint64]string // id -> pattern
		cutRound  int               // an add of this round's rules was cut off (-1: none)
		cutDelete map[uint64]bool   // a delete of these ids was cut off
		requests  int
	}
	const workers, perAdd, stops = 4, 200, 3
	// results of the previous stop: the rules each worker's successor inherits
	have := make([]map[uint64]string, workers)
	for w := range have {
		have[w] = map[uint64]string{}
	}
	for stop := 0; stop < stops; stop++ {
		results := make([]known, workers)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				k := known{have: maps.Clone(have[w]), cutRound: -1}
				defer func() { results[w] = k }()
				c, err := santa.Dial(sd.Socket)
				if err != nil {
					t.Error(err)
					return
				}
				defer c.Close()
				// cut reports whether err is a request santad left unanswered
				// (it stopped); any other error fails the test
				cut := func(op string, err error) bool {
					var se *santa.Error
					if errors.As(err, &se) {
						t.Errorf("worker %d: %s refused: %v", w, op, err)
					}
					return true
				}
				tag := fmt.Sprintf("worker-%d", w)
				for round := 0; round < 100000; round++ {
					rules := make([]api.Rule, perAdd)
					for i := range rules {
						rules[i] = api.Rule{
							Conditions: []api.Condition{santa.Match(0, []byte(fmt.Sprintf("w%d-s%d-r%06d-%03d", w, stop, round, i)))},
							Processors: []api.Processor{santa.Put(0, []byte("reply"))},
							ReplyLen:   5,
							Tag:        tag,
						}
					}
					k.requests++
					ids, err := c.Add(cookie, rules)
					if err != nil && cut("add", err) {
						k.cutRound = round
						return
					}
					for i, id := range ids {
						k.have[id] = string(rules[i].Conditions[0].Pattern)
					}
					k.requests++
					if _, err := c.Stats(cookie, ids[:10]...); err != nil && cut("stats", err) {
						return
					}
					k.requests++
					if _, err := c.ListTagged(cookie, tag); err != nil && cut("list", err) {
						return
					}
					if round%2 == 1 { // delete half of what was added
						del := ids[:perAdd/2]
						k.requests++
						if err := c.Delete(cookie, del); err != nil && cut("delete", err) {
							k.cutDelete = map[uint64]bool{}
							for _, id := range del {
								k.cutDelete[id] = true
							}
							return
						}
						for _, id := range del {
							delete(k.have, id)
						}
					}
				}
				t.Errorf("worker %d: santad still answered after 100000 rounds", w)
			}()
		}
		time.Sleep(1500 * time.Millisecond)
		sd.stop(syscall.SIGTERM)
		wg.Wait()
		if t.Failed() {
			return
		}
		if log := sd.Log(); strings.Contains(log, "panic") || strings.Contains(log, "fatal error") {
			t.Fatalf("santad crashed while stopping:\n%s", log)
		}

		sd.start()
		c := sd.client()
		for w, k := range results {
			if k.requests < 8 {
				t.Errorf("worker %d made only %d requests before the stop: the test did not load santad", w, k.requests)
			}
			listed, err := c.ListTagged(cookie, fmt.Sprintf("worker-%d", w))
			if err != nil {
				t.Fatal(err)
			}
			cutAdded, cutGone := 0, 0
			for _, r := range listed {
				pattern := string(r.Conditions[0].Pattern)
				switch want, ok := k.have[r.ID]; {
				case ok && want == pattern:
				case ok:
					t.Errorf("worker %d: rule %d has pattern %q, want %q", w, r.ID, pattern, want)
				case k.cutRound >= 0 && strings.HasPrefix(pattern, fmt.Sprintf("w%d-s%d-r%06d-", w, stop, k.cutRound)):
					cutAdded++
				default:
					t.Errorf("worker %d: rule %d (%q) was never reported added, or was reported deleted", w, r.ID, pattern)
				}
			}
			listedIDs := map[uint64]bool{}
			for _, r := range listed {
				listedIDs[r.ID] = true
			}
			for id, pattern := range k.have {
				if !listedIDs[id] {
					if k.cutDelete[id] {
						cutGone++
					} else {
						t.Errorf("worker %d: rule %d (%q) was reported added and is gone", w, id, pattern)
					}
				}
			}
			if cutAdded != 0 && cutAdded != perAdd {
				t.Errorf("worker %d: %d of the %d rules of the add cut off by the stop exist", w, cutAdded, perAdd)
			}
			if cutGone != 0 && cutGone != len(k.cutDelete) {
				t.Errorf("worker %d: %d of the %d rules of the delete cut off by the stop are gone", w, cutGone, len(k.cutDelete))
			}
			t.Logf("stop %d, worker %d: %d requests, %d rules kept; the request cut off: add happened %v, delete happened %v",
				stop, w, k.requests, len(listed), cutAdded > 0, cutGone > 0)
			have[w] = map[uint64]string{}
			for _, r := range listed {
				have[w][r.ID] = string(r.Conditions[0].Pattern)
			}
		}
	}
}

// TestCleanupRefusesRunningSantad runs `santad cleanup` beside a running
// santad: it must refuse, and leave the rules, the journal and the program
// as they were; once santad is stopped it goes through.
func TestCleanupRefusesRunningSantad(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7301)
	_, target := serverSocket(t, tb, server)
	c := sd.client()
	addPingPong(t, c, target)
	err := sd.Cleanup()
	if err == nil || !strings.Contains(err.Error(), "stop it first") {
		t.Fatalf("santad cleanup beside a running santad: %v, want a refusal that says to stop it first", err)
	}
	if got := exchange(t, tb, server, "ping"); got != "pong" {
		t.Errorf("after the refused cleanup the rule answers %q, want pong", got)
	}
	sd.stop(syscall.SIGTERM)
	sd.start() // from the journal the refused cleanup left
	if rules, err := sd.client().ListRules(santa.Cookie(mustCookie(t, sd.client()))); err != nil || len(rules) != 1 {
		t.Errorf("after a restart: %d rules (%v), want the one added", len(rules), err)
	}
	sd.stop(syscall.SIGTERM)
	if err := sd.Cleanup(); err != nil {
		t.Fatalf("santad cleanup after santad stopped: %v", err)
	}
}

// TestCleanupLeavesNothing: `santad cleanup` after santad ran with a
// controller's claim (as `santa dns` leaves one when it ends) removes what
// santad and the controllers put beside its socket and in its state
// directory, the lock too; a claim a controller still holds stays.
func TestCleanupLeavesNothing(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	ended, err := follow.ClaimTag(sd.Socket, api.ProtocolUDP, 7303, "ended")
	if err != nil {
		t.Fatal(err)
	}
	ended.Release()
	running, err := follow.ClaimTag(sd.Socket, api.ProtocolUDP, 7303, "running")
	if err != nil {
		t.Fatal(err)
	}
	sd.stop(syscall.SIGTERM)
	left := func() []string {
		var paths []string
		filepath.WalkDir(sd.dir, func(path string, d os.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				paths = append(paths, strings.TrimPrefix(path, sd.dir+"/"))
			}
			return err
		})
		return paths
	}
	// and says what it removed
	said := cleanupSays(t, sd)
	for _, want := range []string{"detached the rule processor from " + tb.Server.Dev,
		"removed the journal " + filepath.Join(sd.dir, "state", "journal"), "removed the control socket " + sd.Socket,
		"removed " + filepath.Join(sd.dir, "controllers", "udp-7303-uid0-ended"),
		"removed the lock " + filepath.Join(sd.dir, "state", "santad.lock")} {
		if !slices.Contains(said, want) {
			t.Errorf("santad cleanup said %q, want a line %q", said, want)
		}
	}
	if got, want := left(), []string{"controllers/udp-7303-uid0-running"}; !slices.Equal(got, want) {
		t.Errorf("after santad cleanup beside a running controller: %q left, want %q", got, want)
	}
	running.Release()
	if got, want := cleanupSays(t, sd), []string{"removed " + filepath.Join(sd.dir, "controllers", "udp-7303-uid0-running"),
		"removed " + filepath.Join(sd.dir, "controllers")}; !slices.Equal(got, want) {
		t.Errorf("santad cleanup of the claim left: said %q, want %q", got, want)
	}
	if got := left(); len(got) != 0 {
		t.Errorf("after santad cleanup: %q left, want nothing", got)
	}
	if got := cleanupSays(t, sd); len(got) != 1 || !strings.HasPrefix(got[0], "nothing to remove: no santad state in "+filepath.Join(sd.dir, "state")) {
		t.Errorf("santad cleanup with nothing left said %q, want that there is nothing to remove", got)
	}
	if _, err := os.Stat(filepath.Join(sd.dir, "controllers")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("after santad cleanup the controllers' directory is there (%v)", err)
	}
}

// cleanupSays runs santad cleanup with sd's flags and returns the lines it prints.
func cleanupSays(t *testing.T, sd *santadProc) []string {
	t.Helper()
	argv := append([]string{"nsenter", "--net=/run/netns/" + sd.tb.Server.NS, filepath.Join(work, "santad"), "cleanup"}, sd.Args...)
	out, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatalf("santad cleanup: %v\n%s", err, out)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestFailedStartLeavesNoTrace: a start that fails after it made its state
// directory, lock and control socket (a cgroup that is not one), or after
// it pinned and wrote a journal (attaching to a bridge in native mode after
// the veth), removes what it made, the directories too: it left the state
// directory and the lock, the socket's directory and controllers/ beside
// the socket, and the bpffs directory.
func TestFailedStartLeavesNoTrace(t *testing.T) {
	tb := testbed.New(t)
	if out, err := tb.Server.Run("ip", "link", "add", "santa-br0", "up", "type", "bridge"); err != nil {
		t.Fatalf("add a bridge: %v: %s", err, out)
	}
	notCgroup := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(notCgroup, []byte("cgroup: /tmp\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sd := newSantad(t, tb)
	made := filepath.Join(sd.dir, "made")
	bpffs := filepath.Join("/sys/fs/bpf", filepath.Base(sd.dir)+"-made", "pins")
	sd.Args = append(slices.Clone(sd.Args), "--state-dir", filepath.Join(made, "state", "santad"),
		"--socket", filepath.Join(made, "run", "santa.sock"), "--bpffs", bpffs)
	for _, f := range []struct {
		want  string
		flags []string
	}{
		{"not a directory of a cgroup v2 hierarchy", []string{"--config", notCgroup}},
		{"attach native XDP to santa-br0", []string{"--interface", "santa-br0", "--xdp-mode", "native"}},
	} {
		args := sd.Args
		sd.Args = append(slices.Clone(args), f.flags...)
		err := sd.Start(context.Background())
		sd.Args = args
		if err == nil || !strings.Contains(err.Error(), f.want) {
			t.Fatalf("santad %s: %v, want an error saying %q", strings.Join(f.flags, " "), err, f.want)
		}
		for _, dir := range []string{made, filepath.Dir(bpffs)} {
			var left []string
			filepath.WalkDir(dir, func(path string, _ os.DirEntry, err error) error {
				if err == nil {
					left = append(left, path)
				}
				return nil
			})
			if len(left) > 0 {
				t.Errorf("santad %s left %q", strings.Join(f.flags, " "), left)
			}
		}
	}
}

// TestVethPeerPassOutlivesSantad: on a testbed whose client end has no XDP
// program, santad gives it dataplane.PeerPassName (else the replies its rules
// send with XDP_TX are dropped), the replies arrive while santad runs and
// after it stops, and `santad cleanup` removes the program again.
func TestVethPeerPassOutlivesSantad(t *testing.T) {
	tb := testbed.NewWith(t, testbed.Options{NoClientPass: true})
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7302)
	_, target := serverSocket(t, tb, server)
	addPingPong(t, sd.client(), target)
	if got := exchange(t, tb, server, "ping"); got != "pong" {
		t.Errorf("with santad running the client got %q, want the rule's pong", got)
	}
	info, _, err := sd.client().Health()
	if err != nil {
		t.Fatal(err)
	}
	if len(info.Interfaces) != 1 || !strings.HasPrefix(info.Interfaces[0].Peer, tb.Client.Dev+": XDP program ") ||
		!strings.HasSuffix(info.Interfaces[0].Peer, "(santa_peer_pass)") {
		t.Errorf("health's interfaces %+v, want %s with santa_peer_pass", info.Interfaces, tb.Client.Dev)
	}
	sd.stop(syscall.SIGTERM)
	if got := exchange(t, tb, server, "ping"); got != "pong" {
		t.Errorf("after santad stopped the client got %q, want the rule's pong", got)
	}
	if x, err := tb.ClientXDP(); err != nil || x.DrvID == 0 {
		t.Fatalf("client end's XDP: %+v, %v; want the peer program", x, err)
	}
	if err := sd.Cleanup(); err != nil {
		t.Fatalf("santad cleanup: %v", err)
	}
	if x, err := tb.ClientXDP(); err != nil || x.Attached != 0 {
		t.Errorf("after santad cleanup the client end has XDP %+v (%v), want none", x, err)
	}
}

// TestCleanupUnderLoad: `santad cleanup` under a steady load of requests
// that a rule answers, over a veth whose other end has santad's
// santa_peer_pass, loses none: every request is answered, by the rule until
// the rule processor is detached, by the application after. Cleanup removed
// the other end's program first, and for the ~10 ms until it detached the
// rule processor the replies it sent with XDP_TX were dropped (60 of 5000
// a second).
func TestCleanupUnderLoad(t *testing.T) {
	tb := testbed.NewWith(t, testbed.Options{NoClientPass: true})
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7304)
	conn, target := serverSocket(t, tb, server)
	// the rule and the application answer alike: "pong" and the request's
	// 8-byte sequence number
	if _, err := sd.client().Add(target, []api.Rule{{
		Conditions: []api.Condition{santa.Match(0, []byte("ping"))},
		Processors: []api.Processor{santa.Put(0, []byte("pong")), santa.Copy(4, 4, 8)},
		ReplyLen:   12, MinLen: 12, MaxLen: 12,
	}}); err != nil {
		t.Fatal(err)
	}
	go func() {
		buf := make([]byte, 64)
		for {
			n, from, err := conn.ReadFromUDPAddrPort(buf)
			if err != nil {
				return
			}
			if n == 12 {
				copy(buf, "pong")
				conn.WriteToUDPAddrPort(buf[:12], from)
			}
		}
	}()
	client, err := tb.DialUDP(server)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	roomForEveryAnswer(t, client)
	const rate, total = 5000, 5000
	got := make([]bool, total)
	done := make(chan int)
	go func() {
		received := 0
		buf := make([]byte, 64)
		for {
			client.SetReadDeadline(time.Now().Add(2 * time.Second))
			n, err := client.Read(buf)
			if err != nil {
				done <- received
				return
			}
			if seq := binary.BigEndian.Uint64(buf[4:12]); n == 12 && string(buf[:4]) == "pong" && seq < total && !got[seq] {
				got[seq] = true
				received++
			}
		}
	}()
	cleaned := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		sd.stop(syscall.SIGTERM)
		cleaned <- sd.Cleanup()
	}()
	start := time.Now()
	req := make([]byte, 12)
	copy(req, "ping")
	for i := range total {
		time.Sleep(time.Until(start.Add(time.Duration(i) * time.Second / rate)))
		binary.BigEndian.PutUint64(req[4:], uint64(i))
		if _, err := client.Write(req); err != nil {
			t.Fatal(err)
		}
	}
	if err := <-cleaned; err != nil {
		t.Fatalf("santad cleanup: %v", err)
	}
	if received := <-done; received != total {
		var lost []int
		for i, ok := range got {
			if !ok && len(lost) < 20 {
				lost = append(lost, i)
			}
		}
		t.Errorf("%d of %d requests answered across santad cleanup; first lost: %v", received, total, lost)
	}
	if x, err := tb.ClientXDP(); err != nil || x.Attached != 0 {
		t.Errorf("after santad cleanup the client end has XDP %+v (%v), want none", x, err)
	}
}

// TestSantadsShareNoBPFFS: a second santad, of another state directory and
// network namespace, given the first one's bpffs (the default
// /sys/fs/bpf/santa for both, as the state directories were made apart) is
// refused, and so is its cleanup, both leaving the first one's pins, and
// its rule answering, after it stopped too. Before, the second santad took
// the first one's pins for a predecessor's: it unpinned its links
// ("detached from an interface no longer configured") and removed its
// maps, and the first one's offload ended when it stopped.
func TestSantadsShareNoBPFFS(t *testing.T) {
	tb := testbed.New(t)
	first := newSantad(t, tb)
	first.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7305)
	_, target := serverSocket(t, tb, server)
	addPingPong(t, first.client(), target)
	pins := "/sys/fs/bpf/" + filepath.Base(first.dir)
	link := filepath.Join(pins, "links", "xdp-"+tb.Server.Dev)
	second := newSantad(t, testbed.New(t), "--bpffs", pins, "--metrics", "off")
	want := "another santad, of another state_dir, pins at " + pins
	if err := second.Start(context.Background()); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("a second santad with the first one's bpffs: %v, want an error saying %q", err, want)
	}
	if err := second.Cleanup(); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("the second santad's cleanup beside the first: %v, want an error saying %q", err, want)
	}
	if _, err := os.Stat(link); err != nil {
		t.Errorf("the first santad's XDP link pin: %v", err)
	}
	first.stop(syscall.SIGTERM)
	if got := exchange(t, tb, server, "ping"); got != "pong" {
		t.Errorf("after the first santad stopped its rule answers %q, want pong", got)
	}
}

// TestVethPeerLeftAlone: with veth_peer_pass: false santad leaves the
// other end of its veth without an XDP program.
func TestVethPeerLeftAlone(t *testing.T) {
	tb := testbed.NewWith(t, testbed.Options{NoClientPass: true})
	config := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(config, []byte("veth_peer_pass: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sd := newSantad(t, tb, "--config", config)
	sd.start()
	if x, err := tb.ClientXDP(); err != nil || x.Attached != 0 {
		t.Errorf("with veth_peer_pass: false the client end has XDP %+v (%v), want none", x, err)
	}
	out, err := sd.cli(0, "status")
	if want := "veth peer of " + tb.Server.Dev; err != nil || !strings.Contains(out, want) ||
		!strings.Contains(out, tb.Client.Dev+": no XDP program: replies sent from XDP are dropped") {
		t.Errorf("santa status: %v\n%s\nwant a line %q saying the replies are dropped", err, out, want)
	}
}

// TestBadConfigTouchesNothing: a santad whose interface does not exist or
// is the loopback interface (where requests between local addresses travel,
// which the rule processor never answers), whose metrics address cannot
// be listened on, or whose control socket's group does not exist, or whose
// control socket cannot be made (its directory, or a path too long), or
// whose cgroup is not a cgroup v2 directory, exits
// with an error that names it before it loads, pins or attaches anything.
// These used to be found only once the rule processor was attached, which
// then stayed attached, with its pins.
func TestBadConfigTouchesNothing(t *testing.T) {
	tb := testbed.New(t)
	noGroup := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(noGroup, []byte("socket_group: santa-no-such-group\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	config := func(name, yaml string) string {
		path := filepath.Join(t.TempDir(), name)
		if err := os.WriteFile(path, []byte(yaml), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, c := range []struct{ flags, want string }{
		{"--config " + config("nocgroup.yaml", "cgroup: /santa-no-such-cgroup\n"), "cgroup /santa-no-such-cgroup: no such file"},
		{"--config " + config("notcgroup.yaml", "cgroup: /tmp\n"), "cgroup /tmp: not a directory of a cgroup v2 hierarchy"},
		{"--interface santa-nope0", "interface santa-nope0"},
		{"--interface lo", "interface lo is the loopback interface"},
		{"--metrics notanaddr", "metrics address"},
		{"--config " + noGroup, `socket_group "santa-no-such-group"`},
		{"--socket /proc/santa-nope/santa.sock", "control socket: mkdir /proc/santa-nope"},
		{"--socket /tmp/" + strings.Repeat("s", 120) + ".sock", "longer than the 107 bytes of a Unix socket's path"},
	} {
		sd := newSantad(t, tb, strings.Fields(c.flags)...)
		err := sd.Start(context.Background())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("santad %s: %v, want an error naming %q", c.flags, err, c.want)
		}
		pins, _ := filepath.Glob(filepath.Join("/sys/fs/bpf", filepath.Base(sd.dir), "*"))
		if len(pins) > 0 {
			t.Errorf("santad %s left pins: %v", c.flags, pins)
		}
		if x, err := tb.ServerXDP(); err != nil || x.Attached != 0 {
			t.Errorf("santad %s left XDP on the server veth: %+v (%v)", c.flags, x, err)
		}
	}
}

// TestFailedStartLeavesHostAsItWas: a start that fails at the control
// socket, or at attaching once the rule processor is on an interface,
// leaves the interfaces and pins as they were: without santad's if none
// ran before, with the previous santad's program, pins and answering rules
// if one did. A control socket path that is a directory, or another
// santad's live socket, is refused; so is a second interface without
// native XDP (a bridge, with --xdp-mode native), after the veth's attach.
// Such starts used to leave the rule processor attached and pinned (and to
// take a live socket over from its santad, and to remove an empty
// directory in the socket's place).
func TestFailedStartLeavesHostAsItWas(t *testing.T) {
	tb := testbed.New(t)
	if out, err := tb.Server.Run("ip", "link", "add", "santa-br0", "up", "type", "bridge"); err != nil {
		t.Fatalf("add a bridge: %v: %s", err, out)
	}
	nonEmptyDir, emptyDir := t.TempDir(), t.TempDir()
	if err := os.WriteFile(filepath.Join(nonEmptyDir, "keep"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pinsOf := func(sd *santadProc) []string {
		var pins []string
		root := filepath.Join("/sys/fs/bpf", filepath.Base(sd.dir))
		filepath.WalkDir(root, func(path string, e os.DirEntry, err error) error {
			if err == nil && path != root {
				pins = append(pins, strings.TrimPrefix(path, root))
			}
			return nil
		})
		return pins
	}
	startFails := func(sd *santadProc, want string, flags ...string) {
		t.Helper()
		args := sd.Args
		sd.Args = append(append([]string(nil), args...), flags...)
		defer func() { sd.Args = args }()
		if err := sd.Start(context.Background()); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("santad %s: %v, want an error saying %q", strings.Join(flags, " "), err, want)
		}
	}
	failures := []struct {
		want  string
		flags []string
	}{
		{"exists and is not a socket", []string{"--socket", nonEmptyDir}},
		{"exists and is not a socket", []string{"--socket", emptyDir}},
		{"attach native XDP to santa-br0", []string{"--interface", "santa-br0", "--xdp-mode", "native"}},
	}

	fresh := newSantad(t, tb)
	for _, f := range failures {
		startFails(fresh, f.want, f.flags...)
		if pins := pinsOf(fresh); len(pins) > 0 {
			t.Errorf("santad %s left pins: %v", strings.Join(f.flags, " "), pins)
		}
		if x, err := tb.ServerXDP(); err != nil || x.Attached != 0 {
			t.Errorf("santad %s left XDP on the server veth: %+v (%v)", strings.Join(f.flags, " "), x, err)
		}
	}
	if _, err := os.Stat(emptyDir); err != nil {
		t.Errorf("the empty directory given as the control socket: %v, want it left in place", err)
	}

	// a previous santad's rule processor, taken over by starts that fail
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7303)
	_, target := serverSocket(t, tb, server)
	addPingPong(t, sd.client(), target)
	sd.stop(syscall.SIGTERM)
	before, err := tb.ServerXDP()
	if err != nil {
		t.Fatal(err)
	}
	pinsBefore := pinsOf(sd)
	for _, f := range failures {
		startFails(sd, f.want, f.flags...)
		if x, err := tb.ServerXDP(); err != nil || x.ID() != before.ID() {
			t.Errorf("after santad %s the server veth has XDP %+v (%v), want the previous santad's program %d",
				strings.Join(f.flags, " "), x, err, before.ID())
		}
		if pins := pinsOf(sd); !slices.Equal(pins, pinsBefore) {
			t.Errorf("after santad %s the pins are %v, want the previous santad's %v", strings.Join(f.flags, " "), pins, pinsBefore)
		}
		if got := exchange(t, tb, server, "ping"); got != "pong" {
			t.Errorf("after santad %s the rule answers %q, want pong", strings.Join(f.flags, " "), got)
		}
	}
	sd.start()
	if rules, err := sd.client().ListRules(target); err != nil || len(rules) != 1 {
		t.Errorf("santad started after the failed ones lists %d rules (%v), want the one added", len(rules), err)
	}

	// another santad's live socket, on an interface of its own
	other := newSantad(t, tb)
	other.Args = slices.Clone(other.Args)
	other.Args[slices.Index(other.Args, tb.Server.Dev)] = "santa-br0"
	startFails(other, "another process listens on it", "--socket", sd.Socket)
	if _, _, err := sd.client().Health(); err != nil {
		t.Errorf("the santad whose socket another tried to take: %v", err)
	}
	if pins := pinsOf(other); len(pins) > 0 {
		t.Errorf("santad on another's socket left pins: %v", pins)
	}
	if out, err := tb.Server.Run("ip", "link", "show", "santa-br0"); err != nil || strings.Contains(out, "xdp") {
		t.Errorf("santad on another's socket left XDP on santa-br0: %v\n%s", err, out)
	}
}

// TestBothEndsOfOneVeth: given both ends of one veth of its namespace,
// santad refuses to start, naming them and saying why, before it pins or
// attaches anything. It used to put santa_peer_pass on the second end
// while attaching to the first, and then refuse the second for having an
// XDP program (santa_peer_pass). With veth_peer_pass: false, as the
// refusal suggests, it attaches to both.
func TestBothEndsOfOneVeth(t *testing.T) {
	tb := testbed.New(t)
	for _, cmd := range [][]string{
		{"ip", "link", "add", "santa-va", "type", "veth", "peer", "name", "santa-vb"},
		{"ip", "link", "set", "santa-va", "up"},
		{"ip", "link", "set", "santa-vb", "up"},
	} {
		if out, err := tb.Server.Run(cmd[0], cmd[1:]...); err != nil {
			t.Fatalf("%v: %s", err, out)
		}
	}
	xdpOn := func(ifname string) bool {
		out, err := tb.Server.Run("ip", "link", "show", ifname)
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(out, "xdp")
	}
	onBothEnds := func(sd *santadProc) {
		sd.Args[slices.Index(sd.Args, tb.Server.Dev)] = "santa-va,santa-vb"
	}
	sd := newSantad(t, tb)
	onBothEnds(sd)
	err := sd.Start(context.Background())
	if want := "interfaces santa-va and santa-vb are the two ends of one veth"; err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("santad on both ends of a veth: %v, want an error saying %q", err, want)
	}
	if pins, _ := filepath.Glob(filepath.Join("/sys/fs/bpf", filepath.Base(sd.dir), "*")); len(pins) > 0 {
		t.Errorf("santad left pins: %v", pins)
	}
	if xdpOn("santa-va") || xdpOn("santa-vb") {
		t.Errorf("santad left an XDP program on an end of the veth")
	}

	config := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(config, []byte("veth_peer_pass: false\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sd = newSantad(t, tb, "--config", config)
	onBothEnds(sd)
	sd.start()
	if !xdpOn("santa-va") || !xdpOn("santa-vb") {
		t.Errorf("santad with veth_peer_pass: false did not attach to both ends")
	}
}

// TestInterfaceTaken: a santad whose interface already has an XDP program
// that is not its own (another santad's, without this one's pins) refuses
// to start, naming the program, before it pins or attaches anything; the
// program stays. It used to take the busy native attach for a driver
// without XDP, warn that it fell back to generic mode, fail there, and
// leave pinned maps behind.
func TestInterfaceTaken(t *testing.T) {
	tb := testbed.New(t)
	pass, err := testbed.NewXDPPass()
	if err != nil {
		t.Fatal(err)
	}
	defer pass.Close()
	if err := testbed.AttachXDPNetlink(tb.Server.NS, tb.Server.Ifindex, pass, testbed.XDPModeDriver); err != nil {
		t.Fatal(err)
	}
	defer testbed.DetachXDPNetlink(tb.Server.NS, tb.Server.Ifindex, testbed.XDPModeDriver)
	sd := newSantad(t, tb)
	err = sd.Start(context.Background())
	if want := "interface " + tb.Server.Dev + " already has XDP program"; err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("santad on an interface with an XDP program: %v, want an error saying %q", err, want)
	}
	if pins, _ := filepath.Glob(filepath.Join("/sys/fs/bpf", filepath.Base(sd.dir), "*")); len(pins) > 0 {
		t.Errorf("santad left pins: %v", pins)
	}
	if x, err := tb.ServerXDP(); err != nil || x.DrvID == 0 {
		t.Errorf("the program on the interface: %+v (%v), want it still there", x, err)
	}
}

// TestVethPeerPassLeavesSantadInItsNamespace: giving the other end of the
// veth its program must leave every santad thread in santad's network
// namespace. The thread that attached it used to move to the other end's
// namespace and end with its goroutine, but Go wedges the main thread
// instead of ending it: in about one start of four /proc/PID/ns/net then
// named the client's namespace, and `santa attach --port` found no socket
// ("no process in santad's network namespace has a UDP socket bound to
// port ..."). So santad is started ten times, each time putting the
// program there anew.
func TestVethPeerPassLeavesSantadInItsNamespace(t *testing.T) {
	tb := testbed.NewWith(t, testbed.Options{NoClientPass: true})
	serverNS, err := os.Stat("/run/netns/" + tb.Server.NS)
	if err != nil {
		t.Fatal(err)
	}
	server := netip.AddrPortFrom(tb.Server.IP4, 7810)
	prog := fmt.Sprintf("import socket,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind(('%s',%d))\n"+
		"print('ready cookie=0 rule=0',flush=True)\ntime.sleep(300)\n", server.Addr(), server.Port())
	startApp(t, tb, nobody, nil, "/usr/bin/python3", "-c", prog)
	sd := newSantad(t, tb)
	for start := 1; start <= 10; start++ {
		sd.start()
		if x, err := tb.ClientXDP(); err != nil || x.DrvID == 0 {
			t.Fatalf("start %d: the client end has XDP %+v (%v), want santa_peer_pass", start, x, err)
		}
		tasks, err := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/ns/net", sd.PID()))
		if err != nil || len(tasks) == 0 {
			t.Fatalf("start %d: santad's threads: %v %v", start, tasks, err)
		}
		for _, task := range tasks {
			if ns, err := os.Stat(task); err == nil && !os.SameFile(ns, serverNS) {
				link, _ := os.Readlink(task)
				t.Fatalf("start %d: santad thread %s is in network namespace %s, not santad's (%s)",
					start, filepath.Base(filepath.Dir(filepath.Dir(task))), link, tb.Server.NS)
			}
		}
		if socks, err := sd.client().BindPort(server.Port()); err != nil || len(socks) != 1 {
			t.Fatalf("start %d: attach --port %d: %v %+v", start, server.Port(), err, socks)
		}
		sd.stop(syscall.SIGTERM)
		if err := sd.Cleanup(); err != nil { // also removes the client end's program
			t.Fatal(err)
		}
	}
}

// TestSIGHUPIgnored: a SIGHUP (a reload elsewhere; a closed terminal)
// leaves santad serving and says in its log that it reloads nothing. It
// used to end santad at once, unlogged, like a kill, and systemd's
// Restart=on-failure does not restart a service that a SIGHUP ended.
func TestSIGHUPIgnored(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	info, _, err := c.Health()
	if err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(int(info.PID), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(sd.Log(), "SIGHUP ignored") {
		if time.Now().After(deadline) {
			t.Fatalf("no word of the SIGHUP in santad's log in 5 s:\n%s", sd.Log())
		}
		time.Sleep(10 * time.Millisecond)
	}
	if again, _, err := c.Health(); err != nil || again.PID != info.PID {
		t.Fatalf("after a SIGHUP: health %+v, %v; want santad %d serving", again, err, info.PID)
	}
}
