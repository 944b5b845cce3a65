package dataplane

import (
	"errors"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// A socket's rules die with it: the release hook unbinds a closed socket at
// once and posts its cookie; closing a socket without rules posts nothing.
func TestReleaseHookUnbindsClosedSocket(t *testing.T) {
	e := newEnv(t, Config{})
	_, s := fixtureAddrs(e, false, 7600)
	var bound, unrelated int
	var cookie uint64
	err := e.tb.Server.Do(func() error {
		var err error
		if bound, cookie, err = bindUDP(s); err != nil {
			return err
		}
		unrelated, _, err = bindUDP(netip.AddrPortFrom(s.Addr(), 7601))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	e.bindRules(e.known(udpSock(cookie, s)), reply("key", "K"))
	open := e.socket(netip.AddrPortFrom(s.Addr(), 7602), false)
	e.bindRules(open, reply("key", "K"))

	root, err := CgroupV2Root()
	if err != nil {
		t.Fatal(err)
	}
	hook, err := e.d.AttachReleaseHook(root)
	if err != nil {
		t.Fatal(err)
	}
	defer hook.Close()
	released, err := e.d.OpenReleased()
	if err != nil {
		t.Fatal(err)
	}
	defer released.Close()
	got := make(chan uint64, 4)
	go func() {
		for {
			c, err := released.Read()
			if err != nil {
				close(got)
				return
			}
			got <- c
		}
	}()

	gen := func() (v uint64) {
		t.Helper()
		if err := e.d.objs.SantaGens.Lookup(uint32(santaSantaLimitSANTA_GEN_SOCKETS), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	gen0 := gen()
	unix.Close(unrelated)
	unix.Close(bound)
	select {
	case c := <-got:
		if c != cookie {
			t.Fatalf("released cookie %#x, want %#x (closing a socket without rules must post nothing)", c, cookie)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no released cookie within 2 s of closing the socket")
	}
	// the program's per-CPU copies of the socket's entry expire with it
	if g := gen(); g != gen0+1 {
		t.Errorf("santa_gens[SANTA_GEN_SOCKETS] %d after the hook, want %d", g, gen0+1)
	}
	var id uint32
	if err := e.d.objs.SantaSockets.Lookup(cookie, &id); !errors.Is(err, ebpf.ErrKeyNotExist) {
		t.Errorf("closed socket's entry: lookup error %v, want ErrKeyNotExist", err)
	}
	if err := e.d.objs.SantaSockets.Lookup(open, &id); err != nil {
		t.Errorf("open socket lost its entry: %v", err)
	}
	if err := e.d.Unbind(cookie); err != nil {
		t.Fatalf("unbind after the hook removed the entry: %v", err)
	}
	if b := e.d.Bound(); !slices.Equal(b, []uint64{open}) {
		t.Errorf("bound after unbind: %#x, want only %#x", b, open)
	}
	select {
	case c := <-got:
		t.Errorf("unexpected released cookie %#x", c)
	case <-time.After(100 * time.Millisecond):
	}
	if n := e.counters()["released_dropped"]; n != 0 {
		t.Errorf("released_dropped %d", n)
	}
}
