package follow

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

var bin string // santad and santa, built by TestMain

func TestMain(m *testing.M) {
	if socket := os.Getenv(holdClaimEnv); socket != "" {
		os.Exit(holdClaim(socket))
	}
	os.Exit(testbed.MainWithSanta(m, "../..", "XDP, namespaces", &bin))
}

// countingClient is a santad client that counts its requests.
type countingClient struct {
	c                    *santa.Client
	adds, deletes, lists int
}

func (cc *countingClient) Add(t santa.Target, rules []api.Rule) ([]uint64, error) {
	cc.adds++
	return cc.c.Add(t, rules)
}

func (cc *countingClient) Delete(t santa.Target, ids []uint64) error {
	cc.deletes++
	return cc.c.Delete(t, ids)
}

func (cc *countingClient) ListPage(t santa.Target, tag string, after uint64, limit uint32) ([]api.Rule, bool, error) {
	cc.lists++
	return cc.c.ListPage(t, tag, after, limit)
}

// bound is a UDP socket of a testbed's server namespace with a rule set.
type bound struct {
	tb     *testbed.Testbed
	santad string // its control socket
	cc     *countingClient
	conn   *net.UDPConn
	cookie uint64
}

// boundSocket starts santad with room for maxRules rules and binds a UDP
// socket of the server namespace through it.
func boundSocket(t *testing.T, maxRules int) bound {
	tb := testbed.New(t)
	config := filepath.Join(t.TempDir(), "santad.yaml")
	if err := os.WriteFile(config, fmt.Appendf(nil, "dataplane:\n  max_rules: %d\n", maxRules), 0o644); err != nil {
		t.Fatal(err)
	}
	sd := tb.StartSantad(t, bin, "/sys/fs/bpf/santa-follow-"+tb.ID, nil, "--config", config)
	var conn *net.UDPConn
	if err := tb.Server.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", &net.UDPAddr{IP: tb.Server.IP4.AsSlice(), Port: 7200})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	c, err := santa.Dial(sd.Socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return bound{tb, sd.Socket, &countingClient{c: c}, conn, testbed.Bind(t, c, conn).Cookie}
}

// held lists the ids of the rules santad holds for socket cookie.
func held(t *testing.T, cc *countingClient, cookie uint64) []uint64 {
	t.Helper()
	rules, err := cc.c.ListTagged(santa.Cookie(cookie), "fitting")
	if err != nil {
		t.Fatal(err)
	}
	var ids []uint64
	for _, r := range rules {
		ids = append(ids, r.ID)
	}
	slices.Sort(ids)
	return ids
}

// AddFitting adds the rules that fit, in order, leaves out those santad
// refuses for what they are, and stops at the first it has no room for;
// DeleteRules deletes rules of which some are gone. Both in a few
// requests, not one per rule.
func TestFittingOnSantad(t *testing.T) {
	const maxRules, offered = 100, 300
	b := boundSocket(t, maxRules)
	cc, conn, cookie := b.cc, b.conn, b.cookie
	expired := map[int]bool{17: true, 64: true, 250: true} // santad refuses them: invalid
	rules := make([]api.Rule, offered)
	for k := range rules {
		rules[k] = api.Rule{Conditions: []api.Condition{santa.Match(0, fmt.Appendf(nil, "request %03d", k))},
			Processors: []api.Processor{santa.Put(0, []byte("reply"))}, ReplyLen: 5, Tag: "fitting"}
		if expired[k] {
			rules[k].Expires = 1
		}
	}
	var refused []int
	ids, err := AddFitting(cc, []uint64{cookie}, rules, nil, func(k int, err error) {
		if !errors.Is(err, santa.ErrInvalid) {
			t.Errorf("rule %d refused with %v, want invalid", k, err)
		}
		refused = append(refused, k)
	})
	if !NoRoom(err) {
		t.Fatalf("AddFitting: %v, want santad's no room", err)
	}
	// rules 0..101 but 17 and 64 fill the 100 slots; 102 finds no room
	if !slices.Equal(refused, []int{17, 64}) {
		t.Errorf("refused %v, want [17 64]", refused)
	}
	var added []uint64
	for k, got := range ids {
		fits := k < maxRules+2 && !expired[k]
		if (got != nil) != fits {
			t.Errorf("rule %d: ids %v, added %v; want added %v", k, got, got != nil, fits)
		}
		added = append(added, got...)
	}
	slices.Sort(added)
	if got := held(t, cc, cookie); !slices.Equal(got, added) {
		t.Errorf("santad holds rules %v, want %v", got, added)
	}
	// one rule at a time would take a request per rule: 103
	if cc.adds > 50 {
		t.Errorf("%d add requests for %d rules", cc.adds, offered)
	}
	t.Logf("AddFitting: %d add requests for %d rules", cc.adds, offered)

	// some rules are gone already (santad expires rules itself)
	gone := []uint64{added[3], added[50], added[51], added[99]}
	if err := cc.c.Delete(santa.Cookie(cookie), gone); err != nil {
		t.Fatal(err)
	}
	if err := DeleteRules(cc, cookie, added); err != nil {
		t.Fatalf("DeleteRules: %v", err)
	}
	if got := held(t, cc, cookie); len(got) != 0 {
		t.Errorf("santad still holds rules %v", got)
	}
	if cc.deletes > 50 {
		t.Errorf("%d delete requests for %d rules, %d of them gone", cc.deletes, len(added), len(gone))
	}
	t.Logf("DeleteRules: %d delete requests for %d rules, %d of them gone", cc.deletes, len(added), len(gone))
	if err := DeleteRules(cc, cookie, gone[:1]); err != nil {
		t.Errorf("DeleteRules of one rule already gone: %v", err)
	}
	if deletes := cc.deletes; DeleteRules(cc, cookie, nil) != nil || cc.deletes != deletes {
		t.Errorf("DeleteRules of no rules asked santad %d times", cc.deletes-deletes)
	}

	// every rule is gone with its socket: one delete tells, one list says
	// why, and nothing more is asked
	ten, err := AddEverywhere(cc, []uint64{cookie}, rules[100:110], nil)
	if err != nil {
		t.Fatal(err)
	}
	added = slices.Concat(ten...)
	conn.Close()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, _, err := cc.c.ListPage(santa.Cookie(cookie), "", 0, 1)
		if errors.Is(err, santa.ErrNotFound) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("santad kept the rule set of the closed socket: %v", err)
		}
	}
	cc.deletes, cc.lists = 0, 0
	if err := DeleteRules(cc, cookie, added); err != nil {
		t.Fatalf("DeleteRules of a closed socket's rules: %v", err)
	}
	if cc.deletes != 1 || cc.lists != 1 {
		t.Errorf("DeleteRules of %d rules of a closed socket: %d delete and %d list requests, want 1 and 1",
			len(added), cc.deletes, cc.lists)
	}
}

// Room says nothing went while santad's usage stays as it was at the
// refusal, or grows, and how many rules fit once rules went.
func TestRoomFreed(t *testing.T) {
	const maxRules = 10
	b := boundSocket(t, maxRules)
	cc, cookie := b.cc, b.cookie
	rule := func(k int) api.Rule {
		return api.Rule{Conditions: []api.Condition{santa.Match(0, fmt.Appendf(nil, "request %d", k))},
			Processors: []api.Processor{santa.Put(0, []byte("reply"))}, ReplyLen: 5}
	}
	var rules []api.Rule
	for k := range maxRules - 1 {
		rules = append(rules, rule(k))
	}
	ids, err := cc.c.Add(santa.Cookie(cookie), rules)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cc.c.Add(santa.Cookie(cookie), []api.Rule{rule(100), rule(101)}); !NoRoom(err) {
		t.Fatalf("add past santad's room: %v, want no room", err)
	}
	var room Room
	if err := room.Refused(cc.c); err != nil {
		t.Fatal(err)
	}
	freed := func(want int) {
		t.Helper()
		if free, err := room.Freed(cc.c); err != nil || free != want {
			t.Errorf("Freed: %d (%v), want %d", free, err, want)
		}
	}
	freed(0) // the one rule of room left was there at the refusal
	if _, err := cc.c.Add(santa.Cookie(cookie), []api.Rule{rule(102)}); err != nil {
		t.Fatal(err)
	}
	freed(0)
	if err := cc.c.Delete(santa.Cookie(cookie), ids[:3]); err != nil {
		t.Fatal(err)
	}
	freed(3)
	freed(0) // nothing went since the last look
}

// TestRunWaitsForSantad: a controller started before santad ends, saying
// that --follow would wait; with --follow it waits, and starts once santad
// answers (it ended with "connect to santad ...: no such file or
// directory", as without).
func TestRunWaitsForSantad(t *testing.T) {
	tb := testbed.New(t)
	sd := unstartedSantad(t, tb)
	run := func(context.Context) error {
		c, err := santa.Dial(sd.Socket)
		if err != nil {
			return err
		}
		defer c.Close()
		_, _, err = c.Health()
		return err
	}
	o := Options{Socket: sd.Socket, Port: 7300, Protocol: api.ProtocolUDP, Log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Run(ctx, o, run); !errors.Is(err, syscall.ENOENT) || !strings.Contains(err.Error(), "--follow") {
		t.Fatalf("without --follow and santad: %v; want the connect error and a word on --follow", err)
	}
	o.Follow = true
	done := make(chan error, 1)
	go func() { done <- Run(ctx, o, run) }()
	select {
	case err := <-done:
		t.Fatalf("with --follow, Run ended before santad started: %v", err)
	case <-time.After(time.Second): // Run polls every 250 ms: it had four looks
	}
	if err := sd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("with --follow, once santad answered: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("with --follow, Run did not start once santad answered")
	}
}

// unstartedSantad is a santad for tb's server, not started yet, stopped
// and cleaned up after the test.
func unstartedSantad(t *testing.T, tb *testbed.Testbed) *testbed.Santad {
	sd := testbed.NewSantad(filepath.Join(bin, "santad"), tb.Server.NS, t.TempDir(), "/sys/fs/bpf/santa-follow-"+tb.ID,
		"--interface", tb.Server.Dev)
	t.Cleanup(func() {
		if err := errors.Join(sd.Stop(syscall.SIGTERM), sd.Cleanup()); err != nil {
			t.Error(err)
		}
	})
	return sd
}

// A Watcher's SetRate changes how many misses santad samples for the
// socket, down and up again, with the samples flowing throughout: the
// rate of the replaced subscription no longer counts once it is gone.
func TestWatcherSetRate(t *testing.T) {
	b := boundSocket(t, 10)
	sampled := map[string]*atomic.Int64{"fast": {}, "slow": {}, "fast again": {}}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	w, err := NewWatcher(ctx, b.santad, []uint64{b.cookie}, santa.SampleOptions{Bytes: 16, Rate: 1000},
		func(got uint64, s santa.Sample) {
			phase, _, _ := strings.Cut(string(s.Data), "/")
			if n := sampled[phase]; got == b.cookie && n != nil {
				n.Add(1)
			}
		})
	if err != nil {
		t.Fatal(err)
	}
	var client *net.UDPConn
	if err := b.tb.Client.Do(func() (err error) {
		client, err = net.DialUDP("udp", nil, b.conn.LocalAddr().(*net.UDPAddr))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	// misses sends 300 misses of the phase over about 1.5 s (two of each
	// CPU's one-second budget windows at most) and returns how many of
	// them were sampled, once santad's 100-ms drains have passed them on.
	misses := func(phase string) int64 {
		for i := range 300 {
			if _, err := client.Write(fmt.Appendf(nil, "%s/%d", phase, i)); err != nil {
				t.Fatal(err)
			}
			time.Sleep(5 * time.Millisecond)
		}
		time.Sleep(500 * time.Millisecond)
		return sampled[phase].Load()
	}
	if n := misses("fast"); n < 290 {
		t.Fatalf("at 1000 samples per second and CPU, %d of 300 misses sampled, want (nearly) all", n)
	}
	if err := w.SetRate(5); err != nil {
		t.Fatal(err)
	}
	// 5 per second and CPU, two windows, two CPUs at most; the old
	// subscription's 1000 applies until santad sees it closed
	time.Sleep(200 * time.Millisecond)
	if n := misses("slow"); n < 1 || n > 20 {
		t.Errorf("at 5 samples per second and CPU, %d of 300 misses sampled over 1.5 s, want 1 to 20", n)
	}
	if err := w.SetRate(1000); err != nil {
		t.Fatal(err)
	}
	if n := misses("fast again"); n < 290 {
		t.Errorf("back at 1000 samples per second and CPU, %d of 300 misses sampled, want (nearly) all", n)
	}
	select {
	case err := <-w.Ended():
		t.Fatalf("a subscription ended: %v", err)
	default:
	}
	cancel()
	if err := w.SetRate(5); err == nil {
		t.Error("SetRate after the watch's context ended: no error")
	}
}

// KeepRules: a run that ends while its santad still serves deletes its rules
// (false); so does a run cancelled (ctx ended: the controller was told to
// stop). A run whose santad went away, and one whose santad was replaced by
// another process meanwhile (systemd's restart, an upgrade), leaves them
// (true): deleting them there would take the offload from the new santad.
func TestKeepRules(t *testing.T) {
	tb := testbed.New(t)
	sd := unstartedSantad(t, tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := sd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := santa.Dial(sd.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	pid := SantadPID(c)
	if pid == 0 {
		t.Fatal("santad does not answer Health")
	}
	if KeepRules(ctx, c, pid) {
		t.Error("santad still serves: the rules must be deleted")
	}
	cancelled, stop := context.WithCancel(ctx)
	stop()
	if KeepRules(cancelled, c, pid) {
		t.Error("the run was cancelled: the rules must be deleted")
	}
	if err := sd.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if !KeepRules(ctx, c, pid) {
		t.Error("santad is gone: the rules must stay for the next santad")
	}
	if err := sd.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if got := SantadPID(c); got == 0 || got == pid {
		t.Fatalf("after the restart the client reached santad %d, want the new one (not %d)", got, pid)
	}
	if !KeepRules(ctx, c, pid) {
		t.Error("another santad serves now: the rules must stay with it")
	}
	if KeepRules(cancelled, c, pid) {
		t.Error("the run was cancelled: the rules must be deleted even at the new santad")
	}
}
