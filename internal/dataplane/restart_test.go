package dataplane

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime"
	"testing"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"github.com/cilium/ebpf/link"
	"golang.org/x/sys/unix"
)

// mountBPFFS mounts a bpffs of the test's own on a temporary directory.
func mountBPFFS(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		t.Fatalf("mount bpffs: %v", err)
	}
	t.Cleanup(func() { unix.Unmount(dir, unix.MNT_DETACH) })
	return dir
}

// A restarted data plane takes over from its pinned predecessor: the same
// rules with the same IDs and versions, the statistics counted so far (also
// those carried over by rebuilds and modifies), and the XDP link swapped to
// its program without detaching.
func TestRestartTakesOver(t *testing.T) {
	e := newEnv(t, Config{})
	a := e.d
	c, s := fixtureAddrs(e, false, 7620)
	sock := e.socket(s, false)
	ids := e.bindRules(sock, reply("key-a", "A"), reply("key-b", "B"), reply("key-c", "C"))
	answers := func(d *Dataplane, req, want string) {
		t.Helper()
		p := request(c, s, req)
		var verdict uint32
		var out []byte
		err := e.tb.Server.Do(func() error {
			var err error
			verdict, out, err = d.Program().Test(p.build(t))
			return err
		})
		if err != nil || verdict != xdpTx || string(out) != string(p.answer([]byte(want)).build(t)) {
			t.Fatalf("%s: verdict %d, error %v, reply %x; want the answer %q", req, verdict, err, out, want)
		}
	}
	answers(a, "key-a", "A")
	answers(a, "key-a", "A")
	answers(a, "key-b", "B")
	if err := a.ModifyRules(sock, []RuleUpdate{{ids[1], reply("key-b", "B2")}}); err != nil {
		t.Fatal(err)
	}
	answers(a, "key-b", "B2")
	// with a mask and length bounds, which the successor must restore too
	deep := Rule{Conditions: []Condition{cond(4, "DEEP"), masked(8, "\x40", "\xf0")}, ReplyLen: 2,
		Processors: []Processor{put(0, "D"), copyMasked(1, 8, "\x0f")}, MinLen: 9, MaxLen: 16}
	if _, err := a.AddRules(sock, []Rule{deep}); err != nil { // a rebuild
		t.Fatal(err)
	}
	answers(a, "key-a", "A")
	answers(a, "....DEEP\x4f", "D\x0f")
	wantStats, _ := a.RuleStats(sock)
	wantRules, _ := a.ListRules(sock)

	bpffs := mountBPFFS(t)
	gen := filepath.Join(bpffs, "gen1")
	linkPin := filepath.Join(bpffs, "xdp-link")
	if err := a.Pin(gen); err != nil {
		t.Fatal(err)
	}
	var attA *Attachment
	err := e.tb.Server.Do(func() (err error) {
		attA, err = a.AttachPinned(e.tb.Server.Dev, AttachAuto, linkPin)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	linkA := pinnedLinkInfo(t, linkPin)
	if progA := programID(t, a); linkA.Program != progA {
		t.Fatalf("pinned link runs program %d, want A's %d", linkA.Program, progA)
	}
	if err := attA.Release(); err != nil {
		t.Fatal(err)
	}

	b, err := Load(Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	watchLoopbackAddresses(t, e.tb, b)
	prev, err := OpenPrevious(gen)
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close()
	if !prev.Alive(sock) || prev.Alive(sock+1) {
		t.Errorf("Alive(bound socket) %v, Alive(other) %v", prev.Alive(sock), prev.Alive(sock+1))
	}
	base, err := prev.RuleStats()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(base, wantStats) {
		t.Errorf("previous rule stats %+v, want %+v", base, wantStats)
	}
	if err := b.Bind(e.sock(sock), SampleOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := b.RestoreRules(sock, wantRules); err != nil {
		t.Fatal(err)
	}
	b.CarryStats(base)
	if got, _ := b.ListRules(sock); !reflect.DeepEqual(got, wantRules) {
		t.Errorf("restored rules %+v, want %+v", got, wantRules)
	}
	if got, _ := b.RuleStats(sock); !reflect.DeepEqual(got, wantStats) {
		t.Errorf("restored stats %+v, want %+v", got, wantStats)
	}
	answers(b, "key-a", "A")
	answers(b, "key-b", "B2")
	answers(b, "....DEEP\x45", "D\x05")
	if got, _ := b.RuleStats(sock); got[ids[0]].Hits != wantStats[ids[0]].Hits+1 {
		t.Errorf("rule %d counted %d hits after the restore, want %d", ids[0], got[ids[0]].Hits, wantStats[ids[0]].Hits+1)
	}
	more, err := b.AddRules(sock, []Rule{reply("key-z", "Z")})
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range wantRules {
		if more[0] <= r.ID {
			t.Errorf("new rule got ID %d, not above restored ID %d", more[0], r.ID)
		}
	}
	if err := b.RestoreRules(sock, wantRules[:1]); err == nil {
		t.Error("restoring an ID that is installed already succeeded")
	}

	var attB *Attachment
	err = e.tb.Server.Do(func() (err error) {
		attB, err = b.AttachPinned(e.tb.Server.Dev, AttachAuto, linkPin)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	linkB := pinnedLinkInfo(t, linkPin)
	progB := programID(t, b)
	if linkB.ID != linkA.ID || linkB.Program != progB || attB.Native != attA.Native {
		t.Errorf("after the swap: link %d running program %d (native %v); want link %d running B's program %d (native %v)",
			linkB.ID, linkB.Program, attB.Native, linkA.ID, progB, attA.Native)
	}
	if xdp, err := e.tb.ServerXDP(); err != nil || xdp.ID() != uint32(progB) {
		t.Errorf("interface runs XDP program %d (%v), want B's %d", xdp.ID(), err, progB)
	}

	if err := Unpin(gen); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(gen); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s after Unpin: %v", gen, err)
	}
	// Close detaches but leaves the pin, which the next AttachPinned replaces
	if err := attB.Close(); err != nil {
		t.Fatal(err)
	}
	if xdp, err := e.tb.ServerXDP(); err != nil || xdp.ID() != 0 {
		t.Errorf("interface runs XDP program %d (%v) after Close", xdp.ID(), err)
	}
	err = e.tb.Server.Do(func() (err error) {
		attB, err = b.AttachPinned(e.tb.Server.Dev, AttachAuto, linkPin)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if l := pinnedLinkInfo(t, linkPin); l.ID == linkA.ID || l.Program != progB {
		t.Errorf("after Close and AttachPinned: link %d running program %d; want a new link running %d", l.ID, l.Program, progB)
	}
	if err := attB.Detach(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(linkPin); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("link pin after Detach: %v", err)
	}
	if xdp, err := e.tb.ServerXDP(); err != nil || xdp.ID() != 0 {
		t.Errorf("interface runs XDP program %d (%v) after Detach", xdp.ID(), err)
	}
}

func pinnedLinkInfo(t *testing.T, path string) *link.Info {
	t.Helper()
	l, err := link.LoadPinnedLink(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	info, err := l.Info()
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func programID(t *testing.T, d *Dataplane) ebpf.ProgramID {
	t.Helper()
	info, err := d.Program().Info()
	if err != nil {
		t.Fatal(err)
	}
	id, _ := info.ID()
	return id
}

// A santad killed right after a modify leaves the rule's old version linked
// (retireGrace) beside the new one, which already carries the old counts:
// its successor counts them once.
func TestPreviousCountsModifiedRuleOnce(t *testing.T) {
	e := newEnv(t, Config{})
	c, s := fixtureAddrs(e, false, 7622)
	sock := e.socket(s, false)
	ids := e.bindRules(sock, reply("key", "K"))
	gen := filepath.Join(mountBPFFS(t), "gen")
	if err := e.d.Pin(gen); err != nil {
		t.Fatal(err)
	}
	p := request(c, s, "key")
	for range 2 {
		e.expect("key -> K", p.build(t), xdpTx, p.answer([]byte("K")).build(t), "answered")
	}
	want, err := e.d.RuleStats(sock)
	if err != nil || want[ids[0]].Hits != 2 {
		t.Fatalf("rule stats %+v (error %v), want 2 hits", want, err)
	}
	// the lock keeps the old version linked, as a kill would
	for version := 2; ; version++ {
		if err := e.d.ModifyRules(sock, []RuleUpdate{{ids[0], reply("key", fmt.Sprint("K", version))}}); err != nil {
			t.Fatal(err)
		}
		e.d.mu.Lock()
		if len(e.d.retiring) > 0 {
			break
		}
		e.d.mu.Unlock() // reaped before the lock (a slow machine): again
		if version == 20 {
			t.Fatal("the old version was reaped before every check")
		}
	}
	prev, err := OpenPrevious(gen)
	if err != nil {
		e.d.mu.Unlock()
		t.Fatal(err)
	}
	defer prev.Close()
	stats, err := prev.RuleStats()
	e.d.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(stats, want) {
		t.Errorf("previous rule stats %+v, want %+v", stats, want)
	}
}

// A predecessor pinned by another layout is refused for statistics, not misread.
func TestPreviousOfAnotherLayout(t *testing.T) {
	e := newEnv(t, Config{})
	_, s := fixtureAddrs(e, false, 7621)
	sock := e.socket(s, false)
	e.bindRules(sock, reply("key", "K"))
	gen := filepath.Join(mountBPFFS(t), "gen")
	if err := e.d.Pin(gen); err != nil {
		t.Fatal(err)
	}
	// a version before santa_rule_base
	base, moved := filepath.Join(gen, "santa_rule_base"), filepath.Join(gen, "moved")
	if err := os.Rename(base, moved); err != nil {
		t.Fatal(err)
	}
	prev, err := OpenPrevious(gen)
	if err != nil {
		t.Fatal(err)
	}
	defer prev.Close()
	if !prev.Alive(sock) {
		t.Error("bound socket not alive")
	}
	if _, err := prev.RuleStats(); err == nil {
		t.Error("rule stats of a predecessor without santa_rule_base")
	}
	if err := os.Rename(moved, base); err != nil {
		t.Fatal(err)
	}
	if _, err := prev.RuleStats(); err != nil {
		t.Fatal(err)
	}

	// a rule of the same size with two fields swapped
	spec, err := loadSanta()
	if err != nil {
		t.Fatal(err)
	}
	rules := spec.Maps["santa_rules"].Copy()
	rule := btf.Copy(rules.Value).(*btf.Struct)
	var order, priority *btf.Member
	for i := range rule.Members {
		switch rule.Members[i].Name {
		case "order":
			order = &rule.Members[i]
		case "priority":
			priority = &rule.Members[i]
		}
	}
	order.Name, priority.Name = priority.Name, order.Name
	rules.Value, rules.MaxEntries = rule, 16
	m, err := ebpf.NewMap(rules)
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := os.Remove(filepath.Join(gen, "santa_rules")); err != nil {
		t.Fatal(err)
	}
	if err := m.Pin(filepath.Join(gen, "santa_rules")); err != nil {
		t.Fatal(err)
	}
	if _, err := prev.RuleStats(); !errors.Is(err, errLayout) {
		t.Errorf("rule stats of a predecessor with another rule layout: %v, want errLayout", err)
	}
}

// EnsureBPFFS mounts bpffs at /sys/fs/bpf when a path below it is not on
// one yet (here in a mount namespace of the test's own), and refuses paths
// elsewhere.
func TestEnsureBPFFS(t *testing.T) {
	requireRoot(t)
	errc := make(chan error)
	go func() {
		// the thread never leaves its private mount namespace: it stays
		// locked and exits with the goroutine
		runtime.LockOSThread()
		errc <- func() error {
			if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
				return err
			}
			if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
				return err
			}
			if ok, _ := onBPFFS(bpffsRoot); ok {
				if err := unix.Unmount(bpffsRoot, unix.MNT_DETACH); err != nil {
					return err
				}
			}
			if err := EnsureBPFFS(filepath.Join(bpffsRoot, "santa", "gen1")); err != nil {
				return err
			}
			if ok, err := onBPFFS(bpffsRoot); !ok {
				return fmt.Errorf("no bpffs at %s after EnsureBPFFS (%v)", bpffsRoot, err)
			}
			if err := EnsureBPFFS(filepath.Join(bpffsRoot, "santa")); err != nil {
				return fmt.Errorf("second call: %w", err)
			}
			if err := EnsureBPFFS(t.TempDir()); err == nil {
				return errors.New("a path outside /sys/fs/bpf was accepted")
			}
			return nil
		}()
	}()
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
}
