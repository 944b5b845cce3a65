//go:build linux

// Package testbed builds the two-namespace veth testbed that Santa's
// integration tests, the demo and the benchmarks run on.
//
//	client netns (…-cli)                server netns (…-srv)
//	┌──────────────────────┐            ┌──────────────────────┐
//	│ lo                   │            │ lo                   │
//	│ cv<pid>n<n>  ────────┼── veth ────┼──── sv<pid>n<n>      │
//	│ 198.18.X.2/24        │            │ 198.18.X.1/24        │
//	│ 2001:2:0:X::2/64     │            │ 2001:2:0:X::1/64     │
//	│ xdp_pass (native)    │            │ (Santa's XDP here)   │
//	└──────────────────────┘            └──────────────────────┘
//
// Addresses come from the benchmarking ranges 198.18.0.0/15 and
// 2001:2::/48. Neighbour entries are static both ways, IPv6 addresses are
// added with nodad and router solicitations are off, so the link carries no
// ARP/ND noise.
//
// The client veth carries an xdp_pass program: on veth, a frame sent with
// XDP_TX from the server side is only delivered if the peer has an XDP
// program (see shared/notes/kernel-findings.md).
//
// Everything here needs root. Every testbed has unique namespace and
// interface names, so tests can run in parallel.
package testbed

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
)

// Side is one end of the testbed.
type Side struct {
	Role    string           // "server" or "client"
	NS      string           // network namespace name (under /run/netns)
	Dev     string           // the veth interface in NS
	Ifindex int              // ifindex of Dev inside NS
	MAC     net.HardwareAddr // MAC of Dev
	IP4     netip.Addr       // 198.18.X.1 (server) / .2 (client)
	IP6     netip.Addr       // 2001:2:0:X::1 / ::2
	Prefix4 netip.Prefix     // 198.18.X.0/24
	Prefix6 netip.Prefix     // 2001:2:0:X::/64
}

// Do runs f on a locked OS thread inside this side's namespace (see Do).
func (s Side) Do(f func() error) error { return Do(s.NS, f) }

// Run runs a command inside this side's namespace and returns its combined
// output (see Run).
func (s Side) Run(name string, args ...string) (string, error) { return Run(s.NS, name, args...) }

// Options configure Create. The zero value is the normal testbed.
type Options struct {
	// Net is X in 198.18.X.0/24 and 2001:2:0:X::/64 (1..255). 0 picks one
	// from a per-process counter. Namespaces are separate, so testbeds may
	// share X; it only makes packet dumps easier to tell apart.
	Net int
	// Queues is the number of rx/tx queues of each veth end (0: 1). With
	// one queue there is one NAPI instance per end and kxdpgun runs one
	// thread, which keeps the measurement placement simple.
	Queues int
	// NoClientPass leaves the client veth without the xdp_pass program
	// (XDP_TX replies from the server side are then lost).
	NoClientPass bool
	// Logf, if set, receives a line per setup step.
	Logf func(format string, args ...any)
}

// Testbed is a pair of namespaces joined by a veth pair.
type Testbed struct {
	ID     string // "santa-<pid>-<n>", the prefix of both namespace names
	Server Side
	Client Side

	logf func(string, ...any)

	mu       sync.Mutex
	pass     *ebpf.Program
	cleanups []func() error
	closed   bool
}

var instance atomic.Int32

// New creates a testbed for a test and removes it with t.Cleanup. It fails
// the test when not running as root or when setup fails.
func New(t testing.TB) *Testbed {
	return NewWith(t, Options{})
}

// NewWith is New with options.
func NewWith(t testing.TB, o Options) *Testbed {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatal("testbed: needs root (network namespaces, XDP): run the tests as root")
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	tb, err := Create(o)
	if err != nil {
		t.Fatalf("testbed: %v", err)
	}
	t.Cleanup(func() {
		if err := tb.Close(); err != nil {
			t.Errorf("testbed close: %v", err)
		}
	})
	return tb
}

// Create builds a testbed outside of a test (benchmarks, demo). The caller
// must call Close, also on failure paths; on error Create cleans up itself.
func Create(o Options) (tb *Testbed, err error) {
	n := int(instance.Add(1))
	if o.Net == 0 {
		o.Net = 1 + (os.Getpid()*7+n-1)%250
	}
	if o.Net < 1 || o.Net > 255 {
		return nil, fmt.Errorf("testbed: Net %d out of range 1..255", o.Net)
	}
	logf := o.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	pid := os.Getpid()
	tb = &Testbed{ID: fmt.Sprintf("santa-%d-%d", pid, n), logf: logf}
	x := o.Net
	p4 := netip.MustParsePrefix(fmt.Sprintf("198.18.%d.0/24", x))
	p6 := netip.MustParsePrefix(fmt.Sprintf("2001:2:0:%x::/64", x))
	tb.Server = Side{
		Role: "server", NS: tb.ID + "-srv", Dev: fmt.Sprintf("sv%dn%d", pid, n),
		MAC:     net.HardwareAddr{0x02, 0x5a, 0x00, byte(n), byte(x), 0x01},
		IP4:     netip.MustParseAddr(fmt.Sprintf("198.18.%d.1", x)),
		IP6:     netip.MustParseAddr(fmt.Sprintf("2001:2:0:%x::1", x)),
		Prefix4: p4, Prefix6: p6,
	}
	tb.Client = Side{
		Role: "client", NS: tb.ID + "-cli", Dev: fmt.Sprintf("cv%dn%d", pid, n),
		MAC:     net.HardwareAddr{0x02, 0x5a, 0x00, byte(n), byte(x), 0x02},
		IP4:     netip.MustParseAddr(fmt.Sprintf("198.18.%d.2", x)),
		IP6:     netip.MustParseAddr(fmt.Sprintf("2001:2:0:%x::2", x)),
		Prefix4: p4, Prefix6: p6,
	}
	if len(tb.Server.Dev) > 15 {
		return nil, fmt.Errorf("testbed: interface name %q too long", tb.Server.Dev)
	}
	defer func() {
		if err != nil {
			if cerr := tb.Close(); cerr != nil {
				logf("testbed: cleanup after failed setup: %v", cerr)
			}
			tb = nil
		}
	}()
	if o.Queues <= 0 {
		o.Queues = 1
	}
	if err := tb.setup(o.Queues, !o.NoClientPass); err != nil {
		return tb, fmt.Errorf("testbed %s: %w", tb.ID, err)
	}
	logf("testbed %s: server %s %s/%s, client %s %s/%s", tb.ID,
		tb.Server.Dev, tb.Server.IP4, tb.Server.IP6, tb.Client.Dev, tb.Client.IP4, tb.Client.IP6)
	return tb, nil
}

func (tb *Testbed) setup(queues int, clientPass bool) error {
	s, c := &tb.Server, &tb.Client
	for _, ns := range []string{s.NS, c.NS} {
		if _, err := Run("", "ip", "netns", "add", ns); err != nil {
			return err
		}
		ns := ns
		tb.addCleanup(func() error {
			_, err := Run("", "ip", "netns", "del", ns)
			return err
		})
	}
	q := strconv.Itoa(queues)
	if _, err := Run("", "ip", "link", "add", s.Dev, "address", s.MAC.String(), "netns", s.NS,
		"numtxqueues", q, "numrxqueues", q,
		"type", "veth", "peer", "name", c.Dev, "address", c.MAC.String(), "netns", c.NS,
		"numtxqueues", q, "numrxqueues", q); err != nil {
		return err
	}
	// Deleting one end removes both; do it before the namespaces go, so no
	// interface outlives a namespace kept alive by a stray socket.
	tb.addCleanup(func() error {
		if !nsExists(s.NS) {
			return nil
		}
		out, err := Run("", "ip", "-n", s.NS, "link", "del", s.Dev)
		if err != nil && strings.Contains(out, "Cannot find device") {
			return nil
		}
		return err
	})

	for _, side := range []*Side{s, c} {
		peer := c
		if side == c {
			peer = s
		}
		if err := side.setUp(peer); err != nil {
			return err
		}
	}

	if clientPass {
		prog, err := NewXDPPass()
		if err != nil {
			return fmt.Errorf("load xdp_pass: %w", err)
		}
		tb.pass = prog
		tb.addCleanup(prog.Close)
		if err := tb.AttachClientPass(); err != nil {
			return err
		}
	}
	return nil
}

// AttachClientPass (re)attaches the xdp_pass program to the client veth in
// native mode, replacing whatever XDP program is there (kxdpgun leaves its
// own behind when it exits). The program is attached through netlink, not
// a bpf_link, so tools like kxdpgun can replace it.
func (tb *Testbed) AttachClientPass() error {
	tb.mu.Lock()
	prog := tb.pass
	tb.mu.Unlock()
	if prog == nil {
		p, err := NewXDPPass()
		if err != nil {
			return fmt.Errorf("load xdp_pass: %w", err)
		}
		tb.mu.Lock()
		tb.pass = p
		tb.mu.Unlock()
		tb.addCleanup(p.Close)
		prog = p
	}
	// A generic-mode program (some tools fall back to it) would block the
	// native attach; remove it first.
	_ = DetachXDPNetlink(tb.Client.NS, tb.Client.Ifindex, XDPModeGeneric)
	if err := AttachXDPNetlink(tb.Client.NS, tb.Client.Ifindex, prog, XDPModeDriver); err != nil {
		return fmt.Errorf("attach xdp_pass to %s: %w", tb.Client.Dev, err)
	}
	return nil
}

// ServerXDP returns the XDP programs attached to the server veth.
func (tb *Testbed) ServerXDP() (XDPInfo, error) { return QueryXDP(tb.Server.NS, tb.Server.Ifindex) }

// ClientXDP returns the XDP programs attached to the client veth.
func (tb *Testbed) ClientXDP() (XDPInfo, error) { return QueryXDP(tb.Client.NS, tb.Client.Ifindex) }

// OnClose registers f to run when the testbed is closed, before the
// namespaces are removed. Cleanups run last-registered first.
func (tb *Testbed) OnClose(f func() error) { tb.addCleanup(f) }

func (tb *Testbed) addCleanup(f func() error) {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	tb.cleanups = append(tb.cleanups, f)
}

// Close stops everything registered with the testbed (servers, programs)
// and removes the veth pair and both namespaces. It is safe to call more
// than once.
func (tb *Testbed) Close() error {
	tb.mu.Lock()
	if tb.closed {
		tb.mu.Unlock()
		return nil
	}
	tb.closed = true
	cs := tb.cleanups
	tb.cleanups = nil
	tb.mu.Unlock()

	var errs []error
	for i := len(cs) - 1; i >= 0; i-- {
		if err := cs[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemoveStale deletes namespaces left behind by testbeds of processes that
// no longer exist (names santa-<pid>-<n>-srv/-cli with a dead pid), e.g.
// after a test binary was killed. It returns the names it removed.
func RemoveStale() ([]string, error) {
	ents, err := os.ReadDir(NetnsDir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var removed []string
	var errs []error
	for _, e := range ents {
		name := e.Name()
		f := strings.Split(name, "-")
		if len(f) != 4 || f[0] != "santa" || (f[3] != "srv" && f[3] != "cli") {
			continue
		}
		pid, err := strconv.Atoi(f[1])
		if err != nil || pid <= 0 {
			continue
		}
		if syscall.Kill(pid, 0) == nil || pid == os.Getpid() {
			continue // owner alive
		}
		if _, err := Run("", "ip", "netns", "del", name); err != nil {
			errs = append(errs, err)
			continue
		}
		removed = append(removed, name)
	}
	return removed, errors.Join(errs...)
}

// waitFor polls cond every step until it returns true or timeout passes.
func waitFor(timeout, step time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(timeout)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(step)
	}
}

// setUp brings one end of the veth pair up with its addresses, quiet IPv6
// (no DAD, no router solicitations, no RAs) and permanent neighbour entries
// for peer, and notes its ifindex.
func (side *Side) setUp(peer *Side) error {
	err := side.Do(func() error {
		for _, kv := range [][2]string{
			{"net/ipv6/conf/" + side.Dev + "/accept_dad", "0"},
			{"net/ipv6/conf/" + side.Dev + "/router_solicitations", "0"},
			{"net/ipv6/conf/" + side.Dev + "/accept_ra", "0"},
			{"net/ipv6/conf/" + side.Dev + "/disable_ipv6", "0"},
		} {
			if err := os.WriteFile(filepath.Join("/proc/sys", kv[0]), []byte(kv[1]), 0); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("sysctl in %s: %w", side.NS, err)
	}
	cmds := [][]string{
		{"addr", "add", side.IP4.String() + "/24", "dev", side.Dev},
		{"addr", "add", side.IP6.String() + "/64", "dev", side.Dev, "nodad"},
		{"link", "set", "lo", "up"},
		{"link", "set", side.Dev, "up"},
		{"neigh", "replace", peer.IP4.String(), "lladdr", peer.MAC.String(), "dev", side.Dev, "nud", "permanent"},
		{"neigh", "replace", peer.IP6.String(), "lladdr", peer.MAC.String(), "dev", side.Dev, "nud", "permanent"},
	}
	for _, args := range cmds {
		if _, err := Run("", "ip", append([]string{"-n", side.NS}, args...)...); err != nil {
			return err
		}
	}
	err = side.Do(func() error {
		ifi, err := net.InterfaceByName(side.Dev)
		if err != nil {
			return err
		}
		side.Ifindex = ifi.Index
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", side.NS, err)
	}
	return nil
}

// WaitClosesAnswered fails t unless, within 5 s, no TCP socket of side s is
// left in LAST_ACK: the peer answered every close s's sockets made after
// the peer's FIN.
func (s Side) WaitClosesAnswered(t testing.TB) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		out, err := s.Run("ss", "-Htn", "state", "last-ack")
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(out) == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("a close was not answered: %s", out)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
