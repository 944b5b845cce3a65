package mcctl_test

// End-to-end tests of `santa memcached` against a real memcached in a
// testbed: santad attaches the rule processor to the server veth, the santa
// CLI runs the controller (and its write tracker) in the server namespace,
// and clients in the client namespace write over TCP (text, meta, binary)
// and UDP and read over UDP.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/link"
	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/mcctl/stalecheck"
	"github.com/santa-offload/santa/internal/mcproto"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

// bin holds santad and santa, built once for the package.
var bin string

func TestMain(m *testing.M) {
	os.Exit(testbed.MainWithSanta(m, "../..", "XDP, TC, namespaces, memcached", &bin))
}

// rig is memcached with santad attached to the server veth.
type rig struct {
	t      *testing.T
	tb     *testbed.Testbed
	mc     *testbed.Memcached
	santad *testbed.Santad
	bpffs  string
}

// newRig starts memcached, and santad with more flags (e.g. --config).
func newRig(t *testing.T, santadFlags ...string) *rig {
	return newRigWith(t, testbed.MemcachedOptions{}, santadFlags...)
}

// newRigWith is newRig with memcached started with o.
func newRigWith(t *testing.T, o testbed.MemcachedOptions, santadFlags ...string) *rig {
	tb := testbed.New(t)
	mc, err := tb.StartMemcached(o)
	if err != nil {
		t.Fatal(err)
	}
	bpffs := "/sys/fs/bpf/santa-mcctl-" + tb.ID
	sd := tb.StartSantad(t, bin, bpffs, map[string]func() string{"memcached output": mc.Log}, santadFlags...)
	return &rig{t: t, tb: tb, mc: mc, santad: sd, bpffs: bpffs}
}

// dialTCP connects to memcached's TCP port from the client namespace; the
// connection stays open until the test ends.
func (r *rig) dialTCP(t *testing.T) net.Conn {
	t.Helper()
	var c net.Conn
	if err := r.tb.Client.Do(func() (err error) {
		c, err = net.Dial("tcp", r.mc.Addr4.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// startController runs `santa memcached MODE ARGS` and waits for "ready:".
func (r *rig) startController(args ...string) *testbed.Controller {
	r.t.Helper()
	args = append([]string{"--guards", filepath.Join(r.bpffs, "guards")}, args...)
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "memcached", args...)
	c, err := testbed.StartController(context.Background(), argv, 60*time.Second, nil)
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		if err := c.Stop(20 * time.Second); err != nil {
			r.t.Error(err)
		}
		if r.t.Failed() {
			r.t.Logf("santa memcached output:\n%s", c.Output())
		}
	})
	r.t.Log(c.Ready())
	return c
}

// counters are the rule processor's counters (answered, pass reasons).
func (r *rig) counters() map[string]uint64 { _, c := r.health(); return c }

// rules is how many rules santad holds.
func (r *rig) rules() uint64 { info, _ := r.health(); return info.Rules }

// health is santad's answer to health.
func (r *rig) health() (*api.DaemonInfo, map[string]uint64) {
	r.t.Helper()
	c, err := santa.Dial(r.santad.Socket)
	if err != nil {
		r.t.Fatal(err)
	}
	defer c.Close()
	info, counters, err := c.Health()
	if err != nil {
		r.t.Fatal(err)
	}
	return info, counters
}

// client makes a UDP client and a TCP connection of each protocol in the
// client namespace; the test's cleanup closes them.
func (r *rig) clients(v6 bool) (*mcproto.UDPClient, map[string]mcproto.Conn) {
	r.t.Helper()
	if v6 {
		return r.clientsAt(r.mc.Addr6)
	}
	return r.clientsAt(r.mc.Addr4)
}

// clientsAt is clients of memcached's listener at addr.
func (r *rig) clientsAt(addr netip.AddrPort) (*mcproto.UDPClient, map[string]mcproto.Conn) {
	r.t.Helper()
	var udp *mcproto.UDPClient
	conns := map[string]mcproto.Conn{}
	err := r.tb.Client.Do(func() (err error) {
		if udp, err = mcproto.DialUDP(addr); err != nil {
			return err
		}
		for name, dial := range map[string]func(string) (mcproto.Conn, error){
			"text": mcproto.DialText, "meta": mcproto.DialMeta, "binary": mcproto.DialBinary,
		} {
			if conns[name], err = dial(addr.String()); err != nil {
				return err
			}
		}
		conns["udp"], err = mcproto.DialUDPConn(addr)
		return err
	})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() {
		udp.Close()
		for _, c := range conns {
			c.Close()
		}
	})
	return udp, conns
}

func writeKeys(t *testing.T, path string, keys []string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(strings.Join(keys, "\n")+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
}

// offloadOld stores "old" under key over TCP, runs `santa memcached static`
// for that key (with more args) and waits until the rule processor answers
// it. get is a GET of the key over UDP: its value, or what it found.
func (r *rig) offloadOld(key string, args ...string) (map[string]mcproto.Conn, *testbed.Controller, func() string) {
	r.t.Helper()
	udp, conns := r.clients(false)
	if err := conns["text"].Set(key, []byte("old"), 0, 0); err != nil {
		r.t.Fatal(err)
	}
	file := filepath.Join(r.t.TempDir(), "keys")
	writeKeys(r.t, file, []string{key})
	ctl := r.startController(append([]string{"static", "--keys", file}, args...)...)
	get := func() string {
		it, ok, err := udp.Get(key, time.Second)
		if err != nil || !ok {
			return fmt.Sprintf("(found %v, %v)", ok, err)
		}
		return string(it.Value)
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	return conns, ctl, get
}

// waitAnswered waits until the rule processor has answered more than n.
func (r *rig) waitAnswered(get func(), n uint64) uint64 {
	r.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		get()
		if a := r.counters()["answered"]; a > n {
			return a
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("the rule processor answered nothing new (counters %v)", r.counters())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestFetchFromBoundAddress: a memcached listening only on the server's
// address (-l ADDR, as one set up for clients elsewhere is) is fetched from
// there without --server: the controller fetches where memcached's UDP
// sockets are bound. It used to try 127.0.0.1 and fail once it had a key
// to fetch; it now also says at start when it cannot connect.
func TestFetchFromBoundAddress(t *testing.T) {
	r := newRigWith(t, testbed.MemcachedOptions{IPv4Only: true})
	_, ctl, get := r.offloadOld("bound:key")
	if got := get(); got != "old" {
		t.Errorf("GET of the offloaded key: %q, want old", got)
	}
	if want := "fetch_from=" + r.mc.Addr4.String(); !strings.Contains(ctl.Output(), want) {
		t.Errorf("the controller does not say %s:\n%s", want, ctl.Output())
	}
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "memcached",
		"--guards", filepath.Join(r.bpffs, "guards"), "--tag", "other", "--server", "127.0.0.1:11211",
		"adaptive", "--duration", "5s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if want := "connect to memcached at 127.0.0.1:11211"; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("a controller told to fetch where memcached is not: %v, want an error saying %q:\n%s", err, want, out)
	}
}

// TestNoUDPSocketSaysMinusU: with no UDP socket on the port (Debian's
// memcached serves no UDP unless started with -U) the controller stops at
// once, saying how to turn UDP on.
func TestNoUDPSocketSaysMinusU(t *testing.T) {
	r := newRig(t)
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "memcached",
		"--guards", filepath.Join(r.bpffs, "guards"), "--port", "11299/udp", "--tcp-port", "11211", "adaptive", "--duration", "5s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if want := "memcached serves UDP only when started with -U 11299"; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("a controller on a port without UDP sockets: %v, want an error saying %q:\n%s", err, want, out)
	}
}

// Hot GETs are answered by the kernel with memcached's exact reply; every
// kind of write, over every protocol, is seen by the next GET at once, and
// the rule comes back with the new value.
func TestOffloadAndWrites(t *testing.T) {
	r := newRig(t)
	// connections opened before the controller: the tracker did not see
	// them open, so their writes retire every rule (the epoch)
	udp, early := r.clients(false)
	var keys []string
	for i := range 8 {
		key := fmt.Sprintf("key:%02d:%s", i, strings.Repeat("x", i*3))
		keys = append(keys, key)
		if err := early["text"].Set(key, []byte(fmt.Sprintf("value-%d", i)), uint32(i*1000), 0); err != nil {
			t.Fatal(err)
		}
	}
	// memcached's own replies, before any rule exists
	direct := map[string][]byte{}
	for _, k := range keys {
		rep, err := udp.Do(mcproto.GetRequest(k), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		direct[k] = rep
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, keys)
	ctl := r.startController("static", "--keys", file)
	_, conns := r.clients(false)
	udp6, _ := r.clients(true)

	before := r.counters()["answered"]
	for _, c := range []*mcproto.UDPClient{udp, udp6} {
		for _, k := range keys {
			rep, err := c.Do(mcproto.GetRequest(k), time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(rep, direct[k]) {
				t.Errorf("%s: offloaded reply %q, memcached's %q", k, rep, direct[k])
			}
		}
	}
	if got := r.counters()["answered"] - before; got != uint64(2*len(keys)) {
		t.Fatalf("the rule processor answered %d of %d GETs", got, 2*len(keys))
	}

	// each write kind over each protocol, then an immediate GET
	key := keys[0]
	n, present := 0, true
	check := func(how string, want string, found bool) {
		t.Helper()
		it, ok, err := udp.Get(key, time.Second)
		if err != nil {
			t.Fatalf("%s: %v", how, err)
		}
		if ok != found || (found && string(it.Value) != want) {
			t.Fatalf("%s: GET gave %q (found %v), want %q (found %v)", how, it.Value, ok, want, found)
		}
	}
	for _, proto := range []string{"text", "meta", "binary", "udp"} {
		c := conns[proto]
		for _, w := range []struct {
			name  string
			write func() error
			want  string
			found bool
		}{
			{"set", func() error { return c.Set(key, []byte("10"), 7, 0) }, "10", true},
			{"incr", func() error { _, err := c.Incr(key, 5); return err }, "15", true},
			{"decr", func() error { _, err := c.Decr(key, 3); return err }, "12", true},
			{"append", func() error { return c.Append(key, []byte("a")) }, "12a", true},
			{"prepend", func() error { return c.Prepend(key, []byte("p")) }, "p12a", true},
			{"replace", func() error { return c.Replace(key, []byte("r"), 1, 0) }, "r", true},
			{"cas", func() error {
				it, err := c.Gets(key)
				if err != nil {
					return err
				}
				return c.CAS(key, []byte("c"), 1, 0, it.CAS)
			}, "c", true},
			{"touch", func() error { return c.Touch(key, 3600) }, "c", true},
			{"delete", func() error { return c.Delete(key) }, "", false},
			{"add", func() error { return c.Add(key, []byte("again"), 0, 0) }, "again", true},
		} {
			// the rule is back (answered by the kernel) before each write
			n++
			if present {
				r.waitAnswered(func() { udp.Get(key, time.Second) }, r.counters()["answered"])
			}
			present = w.found
			t.Logf("%s %s", proto, w.name)
			if err := w.write(); err != nil {
				t.Fatalf("%s %s: %v", proto, w.name, err)
			}
			check(proto+" "+w.name, w.want, w.found)
		}
	}
	// a write on a connection the tracker did not see open
	r.waitAnswered(func() { udp.Get(key, time.Second) }, r.counters()["answered"])
	if err := early["meta"].Set(key, []byte("early"), 0, 0); err != nil {
		t.Fatal(err)
	}
	check("untracked connection", "early", true)
	// flush_all retires every rule (the epoch)
	if err := conns["text"].FlushAll(); err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if _, ok, err := udp.Get(k, time.Second); err != nil || ok {
			t.Fatalf("%s after flush_all: found %v, %v", k, ok, err)
		}
	}
	t.Logf("%d writes checked; counters %v", n, r.counters())
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Log(ctl.Output())
}

// A wanted key memcached does not hold is fetched once, not every second,
// and again as soon as a write stores it; likewise a value too big for a
// datagram until a write makes it small.
func TestUnoffloadableFetchedAfterWrites(t *testing.T) {
	r := newRig(t)
	udp, conns := r.clients(false)
	absent, big := "later:absent", "later:big"
	if err := conns["text"].Set(big, bytes.Repeat([]byte("b"), 2000), 0, 0); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{absent, big})
	ctl := r.startController("static", "--keys", file, "--verbose")
	time.Sleep(3500 * time.Millisecond) // three passes over the keys without rules
	for _, key := range []string{absent, big} {
		if n := strings.Count(ctl.Output(), key+": "); n != 1 {
			t.Errorf("%s: %d fetches found nothing to offload in 3.5 s without a write, want 1:\n%s", key, n, ctl.Output())
		}
	}
	for key, value := range map[string]string{absent: "now here", big: "small now"} {
		if err := conns["meta"].Set(key, []byte(value), 0, 0); err != nil {
			t.Fatal(err)
		}
		r.waitAnswered(func() { udp.Get(key, time.Second) }, r.counters()["answered"])
		if it, ok, err := udp.Get(key, time.Second); err != nil || !ok || string(it.Value) != value {
			t.Errorf("%s after its write: %q (found %v, %v), want %q", key, it.Value, ok, err, value)
		}
	}
}

// A write that gets no reply leaves the tracker nothing to bump when
// memcached has applied it. Here the rule is rebuilt between the write's
// head (bumped at ingress) and its value (applied by memcached), so it
// holds the value from before; the controller retires it once more when
// the write has settled, and the kernel answers with the new value.
func TestWriteWithoutReplySettles(t *testing.T) {
	r := newRig(t)
	const key = "settle:key"
	// long enough for the value to be written before the head's write has
	// settled, even on a slow machine
	const settle = 5 * time.Second
	_, ctl, get := r.offloadOld(key, "--settle", settle.String())
	raw := r.dialTCP(t) // open until the end: memcached's FIN would bump the slot
	if _, err := raw.Write([]byte("set " + key + " 0 0 3 noreply\r\n")); err != nil {
		t.Fatal(err)
	}
	head := time.Now()
	time.Sleep(200 * time.Millisecond) // the controller rebuilds the rule the head retired
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	if v := get(); v != "old" {
		t.Fatalf("before the write's value: GET gave %q, want old", v)
	}
	if d := time.Since(head); d >= settle {
		t.Fatalf("the premise: the value is written within --settle %v of the head, here %v after it", settle, d)
	}
	if _, err := raw.Write([]byte("new\r\n")); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	for get() != "new" {
		if time.Since(written) > 10*time.Second {
			t.Fatalf("GET still gives the value from before a write without a reply %v after it (counters %v)",
				time.Since(written), r.counters())
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("the new value %v after the write", time.Since(written).Round(time.Millisecond))
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	if v := get(); v != "new" {
		t.Fatalf("the rule rebuilt after settling: GET gave %q, want new", v)
	}
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	out := ctl.Output()
	t.Log(out)
	if !regexp.MustCompile(`\d+ removed; [1-9]\d* slots bumped again after writes without a reply; \d+ held for a delayed flush; tracker: .*\bunacked_bumps=1\b`).MatchString(out) {
		t.Fatal("the done line does not count the write without a reply and its second bump")
	}
}

// An interface that appears after the controller started gets the write
// tracker as well: a write through it is seen, and the GET right after its
// reply is not answered with the value from before.
func TestNewInterfaceTracked(t *testing.T) {
	r := newRig(t)
	const key = "newlink:key"
	_, ctl, get := r.offloadOld(key)
	// a third namespace, joined to memcached's by a new veth pair
	// (198.19.X.0/24), routes to memcached's address through it
	x := r.tb.Server.Prefix4.Addr().As4()[2]
	ns := r.tb.ID + "-new"
	dev, peer := strings.Replace(r.tb.Server.Dev, "sv", "sw", 1), strings.Replace(r.tb.Server.Dev, "sv", "nw", 1)
	r.tb.OnClose(func() error {
		_, err := testbed.Run("", "ip", "netns", "del", ns)
		return err
	})
	for _, cmd := range [][]string{
		{"netns", "add", ns},
		{"link", "add", dev, "netns", r.tb.Server.NS, "type", "veth", "peer", "name", peer, "netns", ns},
	} {
		if out, err := testbed.Run("", "ip", cmd...); err != nil {
			t.Fatalf("ip %v: %v %s", cmd, err, out)
		}
	}
	// the tracker is on the new interface before it carries a packet
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(ctl.Output(), `msg="write tracker attached to a new interface" interface=`+dev+` up=false`) {
		if time.Now().After(deadline) {
			t.Fatalf("the controller did not put the tracker on %s:\n%s", dev, ctl.Output())
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, cmd := range [][]string{
		{"-n", r.tb.Server.NS, "addr", "add", fmt.Sprintf("198.19.%d.1/24", x), "dev", dev},
		{"-n", r.tb.Server.NS, "link", "set", dev, "up"},
		{"-n", ns, "addr", "add", fmt.Sprintf("198.19.%d.2/24", x), "dev", peer},
		{"-n", ns, "link", "set", peer, "up"},
		{"-n", ns, "route", "add", r.mc.Addr4.Addr().String(), "dev", peer, "src", fmt.Sprintf("198.19.%d.2", x)},
	} {
		if out, err := testbed.Run("", "ip", cmd...); err != nil {
			t.Fatalf("ip %v: %v %s", cmd, err, out)
		}
	}
	var conn mcproto.Conn
	if err := testbed.Do(ns, func() (err error) {
		conn, err = mcproto.DialText(r.mc.Addr4.String())
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if v := get(); v != "new" {
		t.Fatalf("GET right after a write through the new interface gave %q, want new", v)
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	if v := get(); v != "new" {
		t.Fatalf("the rebuilt rule: GET gave %q, want new", v)
	}
}

// The stale-read checker finds nothing while writers over every protocol
// race readers whose GETs the kernel answers; the kernel answers a good
// share of them, and the tracker counted every write by its key.
func TestNoStaleReads(t *testing.T) {
	r := newRig(t)
	var keys []string
	for i := range 64 {
		keys = append(keys, fmt.Sprintf("stale:%03d", i))
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, keys)
	ctl := r.startController("static", "--keys", file, "--refresh", "5ms")
	before := r.counters()
	rep, err := stalecheck.Run(context.Background(), stalecheck.Config{
		TCP: r.mc.Addr4, UDP: r.mc.Addr4, Keys: keys,
		Writers: 4, Readers: 4, Duration: 8 * time.Second, WritePause: 2 * time.Millisecond,
		Zipf: 1.2, FlushEvery: 2000, Enter: r.tb.Client.Do,
	})
	if err != nil {
		t.Fatal(err)
	}
	after := r.counters()
	t.Log(rep)
	answered := after["answered"] - before["answered"]
	t.Logf("the rule processor answered %d reads, %d went to memcached after a write retired the rule",
		answered, after["pass_invalidated"]-before["pass_invalidated"])
	if rep.Violations > 0 {
		for _, v := range rep.Stale {
			t.Error(v)
		}
		t.Fatalf("%d stale reads", rep.Violations)
	}
	if len(rep.ModelErrors) > 0 {
		t.Fatalf("checker model errors: %v", rep.ModelErrors)
	}
	if rep.Writes < 1000 || rep.Reads < 1000 {
		t.Fatalf("too little load to mean anything: %v", rep)
	}
	// how many reads find their key's rule in place depends on how fast the
	// controller rebuilds after each write: 9-27 % of the reads in 8 s runs
	// on the 2-core test machine, always tens of thousands
	if answered < 10000 {
		t.Fatalf("the kernel answered only %d of %d reads: the offload was hardly exercised", answered, rep.Reads)
	}
	for _, p := range []string{"text", "meta", "binary", "udp"} {
		if rep.PerProtocol[p] == 0 {
			t.Errorf("no acknowledged write over %s", p)
		}
	}
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	t.Log(ctl.Output())
}

// Adaptive mode offloads the key whose GETs miss most, not the one read
// rarely, and drops the rule once it stops answering.
func TestAdaptive(t *testing.T) {
	r := newRig(t)
	r.startController("adaptive", "--min-samples", "4", "--idle", "2s", "--max-rules", "10")
	udp, conns := r.clients(false)
	// as long as memcached takes: its GET is 264 bytes, the sample had 256
	hot := "hot:" + strings.Repeat("k", 246)
	for _, k := range []string{hot, "cold"} {
		if err := conns["text"].Set(k, []byte(k+"-value"), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	before := r.counters()["answered"]
	deadline := time.Now().Add(10 * time.Second)
	for i := 0; r.counters()["answered"] == before; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("the hot key was not offloaded within 10 s (counters %v)", r.counters())
		}
		for range 50 {
			if it, ok, err := udp.Get(hot, time.Second); err != nil || !ok || string(it.Value) != hot+"-value" {
				t.Fatalf("GET %s: %q %v %v", hot, it.Value, ok, err)
			}
		}
		if i%10 == 0 { // about once a second: decays below --min-samples
			udp.Get("cold", time.Second)
		}
		time.Sleep(100 * time.Millisecond)
	}
	// one rule per socket (IPv4, IPv6, loopback), for the hot key only
	if n := r.rules(); n != 3 {
		t.Fatalf("%d rules, want the hot key's 3 (one per socket)", n)
	}
	deadline = time.Now().Add(10 * time.Second)
	for r.rules() != 0 {
		if time.Now().After(deadline) {
			t.Fatalf("the idle rule was not removed within 10 s")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// An adaptive controller that restarts offloads again the keys its
// predecessor had learned: the kernel goes on answering them at once,
// with rules built from what memcached holds now.
func TestAdaptiveRestartKeepsKeys(t *testing.T) {
	r := newRig(t)
	args := []string{"adaptive", "--min-samples", "4", "--idle", "30s", "--max-rules", "10"}
	first := r.startController(args...)
	udp, conns := r.clients(false)
	const key = "restart:hot"
	if err := conns["text"].Set(key, []byte("learned"), 0, 0); err != nil {
		t.Fatal(err)
	}
	get := func() string {
		it, ok, err := udp.Get(key, time.Second)
		if err != nil || !ok {
			t.Fatalf("GET %s: found %v, %v", key, ok, err)
		}
		return string(it.Value)
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	if err := syscall.Kill(first.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if exited, _ := first.Wait(10 * time.Second); !exited {
		t.Fatal("the controller outlived SIGKILL")
	}
	// a write while no controller runs: the left rule must not answer it
	if err := conns["text"].Set(key, []byte("written meanwhile"), 0, 0); err != nil {
		t.Fatal(err)
	}

	second := r.startController(args...)
	if want := `"offloaded again the keys of the rules a predecessor left" keys=1`; !strings.Contains(second.Output(), want) {
		t.Errorf("the second controller did not log %s:\n%s", want, second.Output())
	}
	answered := r.counters()["answered"]
	if v := get(); v != "written meanwhile" || r.counters()["answered"] != answered+1 {
		t.Errorf("the first GET after the restart gave %q, from the kernel: %v; want the value written meanwhile, from the kernel",
			v, r.counters()["answered"] > answered)
	}
	r.santad.ExpectPredecessorTakenOver(t, second)
}

// With a tenth of the packets into the server lost (so TCP segments arrive
// past gaps and are sent again), the tracker keeps the request streams in
// order and the checker still finds no stale read.
func TestNoStaleReadsUnderLoss(t *testing.T) {
	r := newRig(t)
	var keys []string
	for i := range 16 {
		keys = append(keys, fmt.Sprintf("lossy:%02d", i))
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, keys)
	ctl := r.startController("static", "--keys", file, "--refresh", "5ms")
	// in front of the tracker at TC ingress of the server veth. IPv4 TCP
	// SYNs always pass: two lost in a row would outlast the clients' 2 s
	// dial timeout, and connection set-up is not what this test is about.
	loadByte := func(offset int32) asm.Instructions { // R0 = packet byte, or drop
		return asm.Instructions{
			asm.Mov.Reg(asm.R1, asm.R6),
			asm.Mov.Imm(asm.R2, offset),
			asm.Mov.Reg(asm.R3, asm.RFP),
			asm.Add.Imm(asm.R3, -8),
			asm.Mov.Imm(asm.R4, 1),
			asm.FnSkbLoadBytes.Call(),
			asm.JNE.Imm(asm.R0, 0, "drop"),
			asm.LoadMem(asm.R0, asm.RFP, -8, asm.Byte),
		}
	}
	prog := asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.FnGetPrandomU32.Call(),
		asm.Mod.Imm(asm.R0, 10),
		asm.JNE.Imm(asm.R0, 0, "pass"),
		asm.LoadMem(asm.R0, asm.R6, 16, asm.Word), // __sk_buff.protocol, network order
		asm.JNE.Imm(asm.R0, 0x0008, "drop"),       // not IPv4
	}
	prog = append(prog, loadByte(14+9)...) // IPv4 protocol
	prog = append(prog, asm.JNE.Imm(asm.R0, 6, "drop"))
	prog = append(prog, loadByte(14+20+13)...) // TCP flags (Linux sends no IP options)
	prog = append(prog,
		asm.JSet.Imm(asm.R0, 0x02, "pass"),        // SYN
		asm.Mov.Imm(asm.R0, 2).WithSymbol("drop"), // TC_ACT_SHOT
		asm.Return(),
		asm.Mov.Imm(asm.R0, -1).WithSymbol("pass"), // TCX_NEXT
		asm.Return(),
	)
	drop, err := ebpf.NewProgram(&ebpf.ProgramSpec{Type: ebpf.SchedCLS, License: "GPL", Instructions: prog})
	if err != nil {
		t.Fatal(err)
	}
	defer drop.Close()
	err = r.tb.Server.Do(func() error {
		l, err := link.AttachTCX(link.TCXOptions{Interface: r.tb.Server.Ifindex, Program: drop, Attach: ebpf.AttachTCXIngress, Anchor: link.Head()})
		if err == nil {
			t.Cleanup(func() { l.Close() })
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	// large values take several segments in flight: a lost one leaves a
	// gap. Dropping what follows a gap slows TCP's recovery down (the
	// client has no SACK for it), so a set may time out: that ends this
	// writer, not the test.
	_, conns := r.clients(false)
	bigSets := make(chan int, 1)
	go func() {
		big := bytes.Repeat([]byte("b"), 16<<10)
		n := 0
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); n++ {
			if err := conns["text"].Set("big", big, 0, 0); err != nil {
				t.Logf("large set %d: %v", n, err)
				break
			}
		}
		bigSets <- n
	}()
	rep, err := stalecheck.Run(context.Background(), stalecheck.Config{
		TCP: r.mc.Addr4, UDP: r.mc.Addr4, Keys: keys, Protocols: []string{"text", "meta", "binary"},
		Writers: 4, Readers: 2, Duration: 6 * time.Second, ReadTimeout: 50 * time.Millisecond,
		Enter: r.tb.Client.Do,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Log(rep)
	t.Logf("%d large sets", <-bigSets)
	if rep.Violations > 0 {
		for _, v := range rep.Stale {
			t.Error(v)
		}
		t.Fatalf("%d stale reads", rep.Violations)
	}
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	out := ctl.Output()
	t.Log(out)
	if rep.Writes < 100 || !strings.Contains(out, "dropped_out_of_order=") {
		t.Fatalf("the loss did not exercise the tracker's reordering path (%d writes)", rep.Writes)
	}
}

// TestFollowRestart: santa memcached --follow (static keys, no learning)
// notices at once that memcached closed its sockets, waits, and offloads
// again once a new memcached has them, with the new process's values:
// nothing of the old one is ever answered.
func TestFollowRestart(t *testing.T) {
	r := newRig(t)
	const key = "follow:key"
	conns, ctl, get := r.offloadOld(key, "--follow")

	if err := r.mc.Stop(); err != nil {
		t.Fatal(err)
	}
	if exited, err := ctl.Wait(time.Second); exited {
		t.Fatalf("with --follow the controller exited (%v) when memcached stopped:\n%s", err, ctl.Output())
	}
	mc, err := r.tb.StartMemcached(testbed.MemcachedOptions{})
	if err != nil {
		t.Fatal(err)
	}
	r.mc = mc
	if v := get(); v == "old" {
		t.Fatalf("after the restart a GET gave the old process's value")
	}
	_, conns = r.clients(false)
	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		before := r.counters()["answered"]
		v := get()
		if v == "old" {
			t.Fatalf("after the restart a GET gave the old process's value")
		}
		if v == "new" && r.counters()["answered"] > before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after the restart: GET gave %s, answered by the rule processor: %v; controller output:\n%s",
				v, r.counters()["answered"] > before, ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	if n := strings.Count(ctl.Output(), "ready:"); n != 2 {
		t.Errorf("the controller was ready %d times, want 2:\n%s", n, ctl.Output())
	}
}

// TestSantadGone: when santad goes away the controller cannot delete its
// rules and exits, but the data plane outlives santad (its pinned links) and
// the next santad restores the rules. Its write tracker must stay attached:
// a write must still retire the rule, before santad is back and after.
func TestSantadGone(t *testing.T) {
	r := newRig(t)
	const key = "santad-gone:key"
	conns, ctl, get := r.offloadOld(key)

	if err := r.santad.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if exited, _ := ctl.Wait(10 * time.Second); !exited {
		t.Fatalf("the controller still runs 10 s after santad was killed:\n%s", ctl.Output())
	}
	if out := ctl.Output(); !strings.Contains(out, "the write tracker stays attached") {
		t.Errorf("the controller did not say that its write tracker stays attached:\n%s", out)
	}
	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		for range 20 {
			if v := get(); v != "new" {
				t.Fatalf("%s: GET after the write gave %s, want new", when, v)
			}
		}
	}
	check("santad gone")
	if err := r.santad.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	check("santad back, the rule restored")
}

// TestFollowSantadRestart: santa memcached --follow outlives santad. When
// santad is killed it waits, its write tracker attached meanwhile, so a
// write still retires the rule; once a new santad answers it starts again,
// takes over the rule it could not delete (santad restored it, with its
// tag), and its rule answers with the new value.
func TestFollowSantadRestart(t *testing.T) {
	r := newRig(t)
	const key = "follow-santad:key"
	conns, ctl, get := r.offloadOld(key, "--follow")

	if err := r.santad.Stop(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := ctl.WaitOutput("santad went away", 10*time.Second); err != nil {
		t.Fatalf("with --follow, santad killed: %v", err)
	}
	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	for range 20 {
		if v := get(); v != "new" {
			t.Fatalf("santad gone: GET after the write gave %s, want new", v)
		}
	}
	if err := r.santad.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		before := r.counters()["answered"]
		if v := get(); v != "new" {
			t.Fatalf("santad back: GET gave %s, want new", v)
		}
		if r.counters()["answered"] > before && strings.Count(ctl.Output(), "ready:") == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("15 s after santad came back the rule processor does not answer the key:\n%s", ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
	// the rule of the first run, restored by santad, was superseded
	r.santad.ExpectPredecessorTakenOver(t, ctl)
}

// Two controllers with different tags on one port each keep their own
// write tracker: the first one's exit does not remove the second's, so
// after the second is killed its rules are still retired by writes. The
// tracker's pins used to depend on the port alone: the second replaced the
// first's, the first's exit unpinned them, and the killed second's rule
// answered the value from before a write.
func TestTwoTagsOnOnePort(t *testing.T) {
	r := newRig(t)
	const key = "tags:key"
	conns, first, get := r.offloadOld(key, "--tag", "first")
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{key})
	second := r.startController("static", "--keys", file, "--tag", "second")
	if err := first.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"]) // the second's rule
	if err := syscall.Kill(second.PID(), syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if exited, _ := second.Wait(10 * time.Second); !exited {
		t.Fatal("the controller outlived SIGKILL")
	}
	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	if v := get(); v != "new" {
		t.Fatalf("after a set, with the second controller killed: GET gave %q, want new", v)
	}
	// the next controller with the tag takes over the rules and the tracker
	r.startController("static", "--keys", file, "--tag", "second")
}

// TestTwoTagsKeepAnswering: with a second controller (another tag) on the
// port, a write of the first one's key is followed by the kernel answering
// its GETs again. The first one's fetch connection, opened before the
// second's tracker, was one that tracker could not follow: each fetch
// bumped the epoch, which retired every rule of both, which fetched again,
// without end (about 40 rebuilds a second, and no GET answered from the
// kernel until the second controller stopped). The epoch moves after the
// write until its bumps without a reply have settled (the set's connection
// is older than both trackers, --settle 1 s); from then on it must not.
func TestTwoTagsKeepAnswering(t *testing.T) {
	r := newRig(t)
	const key = "tags:hot"
	conns, _, get := r.offloadOld(key)
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{"tags:other"})
	r.startController("static", "--keys", file, "--tag", "second")
	guards, err := ebpf.LoadPinnedMap(filepath.Join(r.bpffs, "guards"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer guards.Close()
	epoch := func() (v uint64) {
		if err := guards.Lookup(uint32(1), &v); err != nil {
			t.Fatal(err)
		}
		return v
	}
	if err := conns["text"].Set(key, []byte("new"), 0, 0); err != nil {
		t.Fatal(err)
	}
	const still = 1500 * time.Millisecond
	last, since := epoch(), time.Now()
	for deadline := time.Now().Add(8 * time.Second); time.Since(since) < still; time.Sleep(20 * time.Millisecond) {
		if v := epoch(); v != last {
			last, since = v, time.Now()
		}
		if time.Now().After(deadline) {
			t.Fatalf("the epoch still moves 8 s after the set (version %d): the controllers retire each other's rules", last)
		}
	}
	r.waitAnswered(func() { get() }, r.counters()["answered"])
	before := r.counters()["answered"]
	for range 50 {
		if v := get(); v != "new" {
			t.Fatalf("GET after the set: %q, want new", v)
		}
	}
	if n := r.counters()["answered"] - before; n < 50 {
		t.Errorf("the kernel answered %d of 50 GETs once the epoch stood still, want all", n)
	}
}

// TestRepliesOfOneDatagram: memcached sends a UDP reply of more than 1400
// bytes, its frame header included, as two datagrams; a rule answers with
// one, so only replies of up to 1400 bytes are offloaded. Rules took
// replies of up to 1452 bytes (what an IPv6 datagram of a 1500-byte MTU
// carries): where the frame has room for it (not on this testbed's veth),
// a reply of 1401 bytes came from the kernel in one datagram.
func TestRepliesOfOneDatagram(t *testing.T) {
	r := newRig(t)
	udp, conns := r.clients(false)
	fits, over := "dgram:a", "dgram:b"
	// besides the value: frame header, "VALUE dgram:x 0 NNNN\r\n", "\r\nEND\r\n"
	const around = 8 + 22 + 7
	for key, n := range map[string]int{fits: 1400 - around, over: 1401 - around} {
		if err := conns["text"].Set(key, bytes.Repeat([]byte("v"), n), 0, 0); err != nil {
			t.Fatal(err)
		}
	}
	if it, _, err := udp.Get(fits, time.Second); err != nil || len(it.Value) != 1400-around {
		t.Fatalf("memcached's reply to GET %s: %d bytes of value, %v: not one datagram of 1400 bytes", fits, len(it.Value), err)
	}
	if _, _, err := udp.Get(over, time.Second); !errors.Is(err, mcproto.ErrMultiDatagram) {
		t.Fatalf("memcached's reply to GET %s: %v, want two datagrams (%v)", over, err, mcproto.ErrMultiDatagram)
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{fits, over})
	ctl := r.startController("static", "--keys", file, "--verbose")
	if want := "ready: 1 keys offloaded"; !strings.HasPrefix(ctl.Ready(), want) || !strings.Contains(ctl.Ready(), "(1 keys not offloaded)") {
		t.Errorf("ready line %q, want %q and 1 not offloaded (%s's reply takes two datagrams)", ctl.Ready(), want, over)
	}
	if want := over + ": the reply (1401 bytes) takes more than one datagram"; !strings.Contains(ctl.Output(), want) {
		t.Errorf("the log does not say %q:\n%s", want, ctl.Output())
	}
}

// TestGuardsOfAnotherSantad: a controller given a guard map that santad's
// rule processor does not read (another santad's: --guards left at its
// default beside a santad with another --bpffs) refuses to start, saying
// so, before it attaches its tracker. Before, it said its keys were
// offloaded, and none was ever answered: its rules carried the versions of
// the other map.
func TestGuardsOfAnotherSantad(t *testing.T) {
	r := newRig(t)
	other := r.bpffs + "-other"
	if err := os.MkdirAll(other, 0o700); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(other) })
	m, err := ebpf.NewMap(&ebpf.MapSpec{Type: ebpf.Array, KeySize: 4, ValueSize: 8, MaxEntries: 1 << 20, Flags: unix.BPF_F_MMAPABLE}) // santa_guards' shape
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	if err := m.Pin(filepath.Join(other, "guards")); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "keys")
	writeKeys(t, file, []string{"a"})
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "memcached",
		"--guards", filepath.Join(other, "guards"), "static", "--keys", file, "--duration", "5s")
	out, err := exec.Command(argv[0], argv[1:]...).CombinedOutput()
	if want := "is not the one the rule processor of santad"; err == nil || !strings.Contains(string(out), want) {
		t.Errorf("santa memcached with another map's --guards: %v, output:\n%s\nwant an error saying %q", err, out, want)
	}
	if _, err := os.Stat(filepath.Join(r.bpffs, "memcached-"+fmt.Sprint(r.mc.Addr4.Port()))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused controller's tracker pins: %v, want none", err)
	}
}
