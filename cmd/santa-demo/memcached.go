package main

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/integrations/mcctl"
	"github.com/santa-offload/santa/internal/mcproto"
	"github.com/santa-offload/santa/internal/testbed"
)

// mcItem is a key the demo stores in memcached, with its value.
type mcItem struct{ key, value string }

// What the demo stores in memcached: the keys it offloads, and one it
// leaves to memcached.
var (
	mcHot   = []mcItem{{"user:42", "Ada Lovelace"}, {"page:home", "<h1>Hello</h1>"}, {"visits", "100"}}
	mcOther = mcItem{"session:7f3a", "alice"}
)

// mcTimeout bounds each UDP GET: a paused memcached times out fast.
const mcTimeout = time.Second

// memcachedPart is the demo's memcached part: memcached itself, the
// controller's rules and the clients of the client namespace.
type memcachedPart struct {
	*demo
	mc     *testbed.Memcached
	udp    map[bool]*mcproto.UDPClient // GETs, by v6
	lo     *mcproto.UDPClient          // GETs on memcached's loopback address, where no rule answers
	direct map[string][]byte           // memcached's own last reply to a GET of each key
	socket map[string]uint64           // memcached's UDP sockets (rule sets), by family name
	rules  map[bool]map[string]uint64  // the controller's rule ids by v6 and key
	paused bool                        // memcached is stopped (SIGSTOP)
}

// memcached is the demo's memcached part: an unmodified memcached, the
// memcached controller of the build offloading the GETs of three keys,
// writes over TCP seen by the very next GET, memcached paused, and the
// controller stopped. The controller it starts is m.mcCtl (the caller
// stops it, also on errors); memcached stops with the testbed.
func (m *demo) memcached(verbose bool) (err error) {
	if err := m.ctx.Err(); err != nil {
		return err
	}
	p := &memcachedPart{demo: m, udp: map[bool]*mcproto.UDPClient{}, direct: map[string][]byte{},
		socket: map[string]uint64{}, rules: map[bool]map[string]uint64{false: {}, true: {}}}
	if p.mc, err = m.tb.StartMemcached(testbed.MemcachedOptions{}); err != nil {
		return err
	}
	err = m.tb.Client.Do(func() (err error) {
		for _, v6 := range []bool{false, true} {
			c, err := mcproto.DialUDP(p.addr(v6))
			if err != nil {
				return err
			}
			p.udp[v6] = c
		}
		return nil
	})
	if err == nil {
		err = m.tb.Server.Do(func() (err error) {
			p.lo, err = mcproto.DialUDP(p.mc.Loopback)
			return err
		})
	}
	defer func() {
		for _, c := range append(slices.Collect(maps.Values(p.udp)), p.lo) {
			if c != nil {
				c.Close()
			}
		}
	}()
	if err != nil {
		return err
	}

	// memcached holds the keys, written over TCP from the client namespace.
	fmt.Fprintln(m.out)
	fmt.Fprintln(m.out, "An unmodified memcached: root offloads the GETs of its hot keys with the memcached controller.")
	text, err := p.dial(mcproto.DialText)
	if err != nil {
		return err
	}
	version, err := text.Version()
	if err != nil {
		text.Close()
		return err
	}
	fmt.Fprintf(m.out, "  memcached  pid %d (%s %s) in the server namespace, TCP and UDP port %d\n",
		p.mc.PID(), testbed.MemcachedPath, version, p.mc.Addr4.Port())
	fmt.Fprintf(m.out, "             on %s, [%s] and %s\n", p.mc.Addr4.Addr(), p.mc.Addr6.Addr(), p.mc.Loopback.Addr())
	fmt.Fprintf(m.out, "A client stores four keys over TCP (%v, text protocol) from the client namespace:\n", p.mc.Addr4)
	for _, it := range append(mcHot[:len(mcHot):len(mcHot)], mcOther) {
		if err := text.Set(it.key, []byte(it.value), 0, 0); err != nil {
			text.Close()
			return fmt.Errorf("set %s over TCP: %w", it.key, err)
		}
		fmt.Fprintf(m.out, "  set %-12s 0 0 %-2d  %-14s → STORED\n", it.key, len(it.value), it.value)
	}
	// closed before the controller starts: its write tracker would not have
	// seen the connection open, and would retire every rule on its writes
	if err := text.Close(); err != nil {
		return err
	}
	fmt.Fprintln(m.out, `and reads them over UDP, "get KEY\r\n" after memcached's 8-byte frame header; memcached answers:`)
	for _, it := range append(mcHot[:len(mcHot):len(mcHot)], mcOther) {
		if err := p.get(it.key, false, it.value); err != nil {
			return err
		}
	}

	// The controller: it attaches to memcached's UDP sockets, puts its write
	// tracker on every interface, fetches the values and installs the rules.
	fmt.Fprintln(m.out)
	fmt.Fprintf(m.out, "Root offloads three of them with the memcached controller of the build, `santa memcached static`\n")
	fmt.Fprintf(m.out, "(%s stays with memcached):\n", mcOther.key)
	var keys []string
	for _, it := range mcHot {
		keys = append(keys, it.key)
	}
	keysFile, err := m.writeList("keys", keys)
	if err != nil {
		return err
	}
	if m.mcCtl, err = m.runController(verbose, "memcached", "static", "--keys", keysFile,
		"--guards", filepath.Join(bpffsDir(), "guards")); err != nil {
		return err
	}
	m.showReady(m.mcCtl)
	fmt.Fprintln(m.out, "  (It fetched each value from memcached over TCP and put a rule on each of memcached's UDP sockets;")
	fmt.Fprintln(m.out, "  its write tracker, at TC ingress and egress, retires a key's rule when a write to the key comes in")
	fmt.Fprintf(m.out, "  and again when memcached's reply goes out, and it rebuilds retired rules every %v (--refresh).)\n",
		mcctl.DefaultConfig.Interval)
	if err := p.showRules(); err != nil {
		return err
	}

	// The kernel answers, with memcached's bytes.
	fmt.Fprintln(m.out)
	fmt.Fprintln(m.out, "UDP GETs from the client namespace again (=: the kernel's reply is memcached's own above, byte for byte):")
	for _, g := range []struct {
		it mcItem
		v6 bool
	}{{mcHot[0], false}, {mcHot[1], false}, {mcHot[2], false}, {mcHot[0], true}, {mcOther, false}} {
		if err := p.get(g.it.key, g.v6, g.it.value); err != nil {
			return err
		}
	}

	if err := p.writes(); err != nil {
		return err
	}
	if err := p.pause(); err != nil {
		return err
	}
	return p.stop()
}

// addr is memcached's address in the family v6.
func (p *memcachedPart) addr(v6 bool) netip.AddrPort {
	if v6 {
		return p.mc.Addr6
	}
	return p.mc.Addr4
}

// dial opens a TCP connection to memcached from the client namespace.
func (p *memcachedPart) dial(dial func(string) (mcproto.Conn, error)) (c mcproto.Conn, err error) {
	err = p.tb.Client.Do(func() error {
		c, err = dial(p.mc.Addr4.String())
		return err
	})
	return c, err
}

// get sends a UDP GET of key from the client namespace, prints one line
// (the reply, who sent it) and checks the reply: see check. A GET nothing
// answers is an error, but for a key without a rule while memcached is
// paused.
func (p *memcachedPart) get(key string, v6 bool, want string) error {
	g, err := p.getOnce(key, v6)
	if err != nil {
		return err
	}
	fmt.Fprintln(p.out, g.line(p.direct[key]))
	if g.timedOut && p.paused && p.rules[v6][key] == 0 {
		return nil
	}
	return p.check(g, want)
}

// check checks a GET: it was answered, with the value want (never an
// older one); if the kernel answered with the value memcached last sent
// for the key, the reply has the same bytes. A reply of memcached's
// becomes the one later replies are compared with.
func (p *memcachedPart) check(g mcGet, want string) error {
	switch {
	case g.timedOut:
		return fmt.Errorf("GET %s over %s: no answer within %v", g.key, family(g.v6), mcTimeout)
	case g.value != want:
		return fmt.Errorf("GET %s over %s gave %q, want %q: a stale read", g.key, family(g.v6), g.value, want)
	case !g.kernel:
		p.direct[g.key] = g.reply
	case g.value == string(mcValue(p.direct[g.key])) && !bytes.Equal(g.reply, p.direct[g.key]):
		return fmt.Errorf("GET %s over %s: the kernel's reply %q is not memcached's %q", g.key, family(g.v6), g.reply, p.direct[g.key])
	}
	return nil
}

// mcGet is one UDP GET and who answered it.
type mcGet struct {
	key      string
	v6       bool
	reply    []byte
	value    string
	timedOut bool
	kernel   bool // answered by a rule
	by       string
	evidence string
}

// getOnce sends a UDP GET of key and works out who answered from
// santad's counters.
func (p *memcachedPart) getOnce(key string, v6 bool) (mcGet, error) {
	g := mcGet{key: key, v6: v6}
	if err := p.ctx.Err(); err != nil {
		return g, err
	}
	before, err := p.snapshot()
	if err != nil {
		return g, err
	}
	reply, gerr := p.udp[v6].Do(mcproto.GetRequest(key), mcTimeout)
	if err := p.ctx.Err(); err != nil {
		return g, err // Ctrl-C while waiting for the reply
	}
	after, err := p.snapshot()
	if err != nil {
		return g, err
	}
	switch {
	case errors.Is(gerr, os.ErrDeadlineExceeded):
		g.timedOut = true
		return g, nil
	case gerr != nil:
		return g, fmt.Errorf("GET %s over %s: %w", key, family(v6), gerr)
	}
	g.reply = reply
	items, err := mcproto.ParseValues(reply)
	if err != nil || len(items) != 1 || items[0].Key != key {
		return g, fmt.Errorf("GET %s over %s: reply %q is not one value of the key (%v)", key, family(v6), reply, err)
	}
	g.value = string(items[0].Value)
	rule := p.rules[v6][key]
	g.by, g.evidence = attribute(before, after, rule, "memcached")
	if g.kernel = strings.HasPrefix(g.by, "Santa"); g.kernel {
		g.by = "Santa"
		g.evidence = fmt.Sprintf("answered %d → %d, %s", before.c["answered"], after.c["answered"], g.evidence)
	}
	return g, nil
}

// line is how the demo shows a GET: the key, the family, the reply (quoted:
// every byte) and who sent it; "=" if the kernel sent it and it is direct,
// memcached's own last reply for the key, byte for byte.
func (g mcGet) line(direct []byte) string {
	if g.timedOut {
		return fmt.Sprintf("  get %-13s %s  no answer: timed out", g.key, family(g.v6))
	}
	same := " "
	if g.kernel && bytes.Equal(g.reply, direct) {
		same = "="
	}
	return fmt.Sprintf("  get %-13s %s  %-50s %s %s, %s", g.key, family(g.v6), strconv.Quote(string(g.reply)), same, g.by, g.evidence)
}

// mcValue is the data of a GET reply of one value ("VALUE k f n\r\nDATA\r\nEND\r\n").
func mcValue(reply []byte) []byte {
	items, err := mcproto.ParseValues(reply)
	if err != nil || len(items) != 1 {
		return nil
	}
	return items[0].Value
}

// showRules finds memcached's UDP sockets, which the controller attached
// to, and lists its rules on them: the request each answers and its
// guards.
func (p *memcachedPart) showRules() error {
	socks, err := p.c.ListSockets()
	if err != nil {
		return err
	}
	names := map[netip.AddrPort]string{p.mc.Addr4: "IPv4", p.mc.Addr6: "IPv6", p.mc.Loopback: "loopback"}
	for _, s := range socks {
		if name, ok := names[s.AddrPort()]; ok && s.Protocol == 17 {
			p.socket[name] = s.Cookie
			p.cookies = append(p.cookies, s.Cookie) // for the hit counters of snapshot
		}
	}
	if len(p.socket) != 3 {
		return fmt.Errorf("santad has %d rule sets on memcached's UDP sockets after santa memcached got ready, want 3: %v", len(p.socket), socks)
	}
	fmt.Fprintln(p.out)
	fmt.Fprintf(p.out, "Its rules (Go client ListRules on memcached's sockets %d (IPv4), %d (IPv6) and %d (loopback)):\n",
		p.socket["IPv4"], p.socket["IPv6"], p.socket["loopback"])
	ids := map[string][]string{}
	desc := map[string]string{}
	for _, fam := range []string{"IPv4", "IPv6", "loopback"} {
		rules, err := p.c.ListRules(santa.Cookie(p.socket[fam]))
		if err != nil {
			return err
		}
		for _, r := range rules {
			key, ok := mcRuleKey(r)
			if !ok {
				return fmt.Errorf("rule %d on memcached's %s socket answers no GET: %+v", r.ID, fam, r)
			}
			if fam != "loopback" {
				p.rules[fam == "IPv6"][key] = r.ID
			}
			ids[key] = append(ids[key], fmt.Sprintf("%d %s", r.ID, fam))
			var guards []string
			for _, g := range r.Guards {
				what := fmt.Sprintf("slot %d", g.Slot)
				if g.Slot == mcctl.KeySlot(key) {
					what = fmt.Sprintf("key slot %d", g.Slot)
				} else if g.Slot < 2 {
					what = "epoch"
				}
				guards = append(guards, fmt.Sprintf("%s at v%d", what, g.Version))
			}
			desc[key] = fmt.Sprintf("any request id → %d-byte reply; guards: %s", r.ReplyLen, strings.Join(guards, ", "))
		}
	}
	for _, it := range mcHot {
		if len(ids[it.key]) != 3 {
			return fmt.Errorf("santa memcached installed %d rules for %s, want one per socket (3)", len(ids[it.key]), it.key)
		}
		fmt.Fprintf(p.out, "  get %-13s rules %-30s %s\n", it.key, strings.Join(ids[it.key], ", "), desc[it.key])
	}
	fmt.Fprintln(p.out, "  (A rule answers only while its guards in santad's guard map hold the versions read before the value")
	fmt.Fprintln(p.out, "  was fetched: its key's slot, which the tracker bumps on every write of the key, and the epoch, which it")
	fmt.Fprintln(p.out, "  bumps on writes it cannot pin to a key.)")
	return nil
}

// mcRuleKey is the key whose GET a memcached rule answers, read from its
// reply (a Put of memcached's reply after the request id).
func mcRuleKey(r api.Rule) (string, bool) {
	for _, p := range r.Processors {
		if p.Kind != api.KindPut || p.ReplyOffset != 2 || len(p.Template) < mcproto.UDPHeaderLen-2 {
			continue
		}
		items, err := mcproto.ParseValues(p.Template[mcproto.UDPHeaderLen-2:])
		if err != nil || len(items) != 1 {
			return "", false
		}
		return items[0].Key, true
	}
	return "", false
}

// writes writes two offloaded keys over TCP, with the text and the binary
// protocol, and GETs each over UDP at once: the GET shows the new value.
// Then it GETs the key until the kernel answers again: the controller has
// rebuilt the rule with the new value.
func (p *memcachedPart) writes() error {
	text, err := p.dial(mcproto.DialText)
	if err != nil {
		return err
	}
	defer text.Close()
	bin, err := p.dial(mcproto.DialBinary)
	if err != nil {
		return err
	}
	defer bin.Close()
	fmt.Fprintln(p.out)
	fmt.Fprintln(p.out, "Writes over TCP from the client namespace (on new connections, which the tracker saw open), each")
	fmt.Fprintln(p.out, "followed at once by a UDP GET, which must show the new value, never the old; then GETs until the")
	fmt.Fprintln(p.out, "kernel answers again (=: memcached's own reply, byte for byte, asked on its loopback address,")
	fmt.Fprintln(p.out, "where no rule answers, right after the write):")
	for i, w := range []struct {
		key, want, what string
		write           func() (string, error)
	}{
		{"user:42", "Ada Byron", "set user:42 0 0 9  Ada Byron      (text protocol)", func() (string, error) {
			return "STORED", text.Set("user:42", []byte("Ada Byron"), 0, 0)
		}},
		{"visits", "101", "incr visits 1  (binary protocol: Increment, opcode 0x05)", func() (string, error) {
			n, err := bin.Incr("visits", 1)
			return strconv.FormatUint(n, 10), err
		}},
	} {
		if i > 0 {
			fmt.Fprintln(p.out)
		}
		if err := p.ctx.Err(); err != nil {
			return err
		}
		res, err := w.write()
		wrote := time.Now()
		if err != nil {
			return fmt.Errorf("%s over TCP: %w", w.what, err)
		}
		fmt.Fprintf(p.out, "  %s → %s\n", w.what, res)
		// the reference, also if the rule is back before the next GET
		if p.direct[w.key], err = p.lo.Do(mcproto.GetRequest(w.key), mcTimeout); err != nil {
			return fmt.Errorf("GET %s on memcached's loopback address: %w", w.key, err)
		}
		if err := p.get(w.key, false, w.want); err != nil {
			return err
		}
		passed := 0
		for {
			g, err := p.getOnce(w.key, false)
			if err != nil {
				return err
			}
			if err := p.check(g, w.want); err != nil {
				return err
			}
			if g.kernel {
				fmt.Fprintln(p.out, g.line(p.direct[w.key]))
				fmt.Fprintf(p.out, "  the rule is back with the new value %d ms after the write's reply (%d more GETs went to memcached meanwhile)\n",
					time.Since(wrote).Milliseconds(), passed)
				break
			}
			passed++
			if time.Since(wrote) > 3*time.Second {
				return fmt.Errorf("the rule for %s did not come back within 3 s of the write (%d GETs went to memcached)", w.key, passed)
			}
			time.Sleep(2 * time.Millisecond)
		}
	}
	return nil
}

// pause stops memcached and shows that the offloaded keys are still
// answered, by the kernel; the other times out.
func (p *memcachedPart) pause() error {
	pid := p.mc.PID() // ip netns exec execs memcached: its pid is memcached's
	cont := func() {
		if p.paused {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			p.paused = false
		}
	}
	defer cont()
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP memcached pid %d: %w", pid, err)
	}
	p.paused = true
	fmt.Fprintln(p.out)
	fmt.Fprintf(p.out, "memcached paused (SIGSTOP to pid %d); UDP GETs again:\n", pid)
	for _, g := range []struct {
		key, want string
		v6        bool
	}{
		{"user:42", "Ada Byron", false}, {"page:home", mcHot[1].value, false}, {"visits", "101", false},
		{"user:42", "Ada Byron", true}, {mcOther.key, mcOther.value, false},
	} {
		if err := p.get(g.key, g.v6, g.want); err != nil {
			return err
		}
	}
	cont()
	fmt.Fprintln(p.out, "memcached resumed (SIGCONT).")
	return nil
}

// stop stops the controller and shows that its rules and its write
// tracker are gone and that memcached answers the GETs again.
func (p *memcachedPart) stop() error {
	if err := p.ctx.Err(); err != nil {
		return err
	}
	if err := p.stopAndShow(p.mcCtl, "the memcached controller"); err != nil {
		return err
	}
	for fam, cookie := range p.socket {
		rules, err := p.c.ListRules(santa.Cookie(cookie))
		if !errors.Is(err, santa.ErrNotFound) {
			return fmt.Errorf("santa memcached stopped but memcached's %s socket %d still has a rule set (%d rules, %v)", fam, cookie, len(rules), err)
		}
	}
	pins := filepath.Join(bpffsDir(), fmt.Sprintf("memcached-%d", p.mc.Addr4.Port()))
	if _, err := os.Stat(pins); !os.IsNotExist(err) {
		return fmt.Errorf("santa memcached stopped but its write tracker's pins %s are still there (%v)", pins, err)
	}
	fmt.Fprintf(p.out, "  (memcached's sockets %d, %d and %d have no rule set any more (ListRules: not found), and the write\n",
		p.socket["IPv4"], p.socket["IPv6"], p.socket["loopback"])
	fmt.Fprintf(p.out, "  tracker is gone with its pins, %s.)\n", pins)
	p.rules = map[bool]map[string]uint64{false: {}, true: {}}
	fmt.Fprintln(p.out, "UDP GETs again: memcached answers them itself.")
	if err := p.get("user:42", false, "Ada Byron"); err != nil {
		return err
	}
	return p.get("visits", true, "101")
}
