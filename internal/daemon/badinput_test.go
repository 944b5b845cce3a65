package daemon_test

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
	"golang.org/x/sys/unix"
)

func rule(pattern string, offset int, reply string) api.Rule {
	return api.Rule{
		Conditions: []api.Condition{santa.Match(offset, []byte(pattern))},
		Processors: []api.Processor{santa.Put(0, []byte(reply))},
		ReplyLen:   uint32(len(reply)),
	}
}

// TestBadInput sends every kind of invalid request: each gets a clear
// error of the right status and installs nothing.
func TestBadInput(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	target := udpTarget(t, tb, 7400)
	good := []api.Rule{rule("one", 0, "1"), rule("two", 0, "2")}
	if _, err := c.Add(target, good); err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("x", 1025)
	invalid := map[string]api.Rule{
		"pattern longer than 1024 bytes": rule(long, 0, "r"),
		"condition beyond the MTU":       rule("abcde", 1470, "r"),
		"empty pattern":                  rule("", 0, "r"),
		"reply longer than the MTU":      {Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1473},
		"zero reply length":              {Conditions: good[0].Conditions, Processors: good[0].Processors},
		"copy outside the request":       {Conditions: good[0].Conditions, Processors: []api.Processor{santa.Copy(0, 1470, 8)}, ReplyLen: 8},
		"copy of zero bytes":             {Conditions: good[0].Conditions, Processors: []api.Processor{santa.Copy(0, 0, 0)}, ReplyLen: 8},
		"put past the reply's end":       {Conditions: good[0].Conditions, Processors: []api.Processor{santa.Put(5, []byte("abcd"))}, ReplyLen: 6},
		"unknown processor kind":         {Conditions: good[0].Conditions, Processors: []api.Processor{{Kind: 7, Length: 1}}, ReplyLen: 6},
		"no conditions":                  {Processors: good[0].Processors, ReplyLen: 1},
		"no processors":                  {Conditions: good[0].Conditions, ReplyLen: 1},
		"five conditions": {Conditions: []api.Condition{santa.Match(0, []byte("a")), santa.Match(1, []byte("b")),
			santa.Match(2, []byte("c")), santa.Match(3, []byte("d")), santa.Match(4, []byte("e"))}, Processors: good[0].Processors, ReplyLen: 1},
		"mask longer than its pattern": {Conditions: []api.Condition{{Pattern: api.Bytes("a"), Mask: api.Bytes{0xff, 0xff}}},
			Processors: good[0].Processors, ReplyLen: 1},
		"pattern bits outside its mask": {Conditions: []api.Condition{{Pattern: api.Bytes("ab"), Mask: api.Bytes{0xff, 0x0f}}},
			Processors: good[0].Processors, ReplyLen: 1},
		"no fully compared first byte": {Conditions: []api.Condition{{Pattern: api.Bytes{1}, Mask: api.Bytes{0x0f}}},
			Processors: good[0].Processors, ReplyLen: 1},
		"masked copy of 9 bytes": {Conditions: good[0].Conditions, ReplyLen: 9,
			Processors: []api.Processor{{Kind: api.KindCopy, Length: 9, Mask: api.Bytes("\x01\x01\x01\x01\x01\x01\x01\x01\x01")}}},
		"max length below a condition": {Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1, MaxLen: 2},
		"min length above max length":  {Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1, MinLen: 9, MaxLen: 8},
		"close on a UDP socket":        {Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1, Close: true},
		"65 processors":                {Conditions: good[0].Conditions, Processors: slices.Repeat(good[0].Processors, 65), ReplyLen: 1},
		"tag of 65 bytes":              {Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1, Tag: strings.Repeat("t", 65)},
		"tag with a newline":           {Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1, Tag: "santa\ndns"},
		"tag not UTF-8":                {Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1, Tag: "santa\xffdns"},
		"put with a length": {Conditions: good[0].Conditions, ReplyLen: 1,
			Processors: []api.Processor{{Kind: api.KindPut, Template: api.Bytes("x"), SrcOffset: 3, Length: 1}}},
		"copy with a template": {Conditions: good[0].Conditions, ReplyLen: 1,
			Processors: []api.Processor{{Kind: api.KindCopy, Length: 1, Template: api.Bytes("x")}}},
	}
	for name, r := range invalid {
		// the invalid rule comes last in a batch of valid ones: none may stay
		batch := []api.Rule{rule("fresh-a", 0, "a"), rule("fresh-b", 0, "b"), r}
		for op, do := range map[string]func() error{
			"add":     func() error { _, err := c.Add(target, batch); return err },
			"replace": func() error { _, err := c.Replace(target, batch); return err },
		} {
			err := do()
			if !errors.Is(err, santa.ErrInvalid) {
				t.Errorf("%s (%s): %v, want an invalid-rule error", name, op, err)
				continue
			}
			if !strings.Contains(err.Error(), "rule 2") {
				t.Errorf("%s (%s): error %q does not say which rule", name, op, err)
			}
			checkRules(t, c, target, 2)
		}
	}
	ids := ruleIDs(t, c, target)
	for name, tc := range map[string]struct {
		do   func() error
		want error
	}{
		"modify an unknown id": {func() error {
			r := rule("x", 0, "y")
			r.ID = 424242
			return c.Modify(target, []api.Rule{r})
		}, santa.ErrNotFound},
		"modify without an id": {func() error { return c.Modify(target, []api.Rule{rule("x", 0, "y")}) }, santa.ErrInvalid},
		"modify into an invalid rule": {func() error {
			r := rule(long, 0, "y")
			r.ID = ids[0]
			return c.Modify(target, []api.Rule{r})
		}, santa.ErrInvalid},
		"delete a known and an unknown id": {func() error { return c.Delete(target, []uint64{ids[0], 424242}) }, santa.ErrNotFound},
		"delete an id twice":               {func() error { return c.Delete(target, []uint64{ids[0], ids[0]}) }, santa.ErrInvalid},
		"stats of an unknown id":           {func() error { _, err := c.Stats(target, 424242); return err }, santa.ErrNotFound},
		"stats of an id twice":             {func() error { _, err := c.Stats(target, ids[0], ids[0]); return err }, santa.ErrInvalid},
		"rules of an unknown cookie":       {func() error { _, err := c.ListRules(santa.Cookie(1)); return err }, santa.ErrNotFound},
	} {
		if err := tc.do(); !errors.Is(err, tc.want) {
			t.Errorf("%s: %v, want %v", name, err, tc.want)
		}
		checkRules(t, c, target, 2)
	}
	if rules, _ := c.ListRules(target); len(rules) == 2 && rules[0].Version != 1 {
		t.Errorf("a refused modify changed the rule's version to %d", rules[0].Version)
	}

	// an IPv6 header is 20 bytes longer: so is the reply limit shorter
	var conn6 *net.UDPConn
	if err := tb.Server.Do(func() (err error) {
		conn6, err = net.ListenUDP("udp6", &net.UDPAddr{IP: tb.Server.IP6.AsSlice(), Port: 7401})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn6.Close()
	v6, _ := santa.Socket(conn6)
	big := api.Rule{Conditions: good[0].Conditions, Processors: good[0].Processors, ReplyLen: 1460}
	if _, err := c.Add(v6, []api.Rule{big}); !errors.Is(err, santa.ErrInvalid) || !strings.Contains(err.Error(), "1452") {
		t.Errorf("a 1460-byte reply for an IPv6 socket: %v, want invalid naming the 1452-byte limit", err)
	}
	// the limit named is the socket's, not the TCP one the data plane knows
	zero := api.Rule{Conditions: good[0].Conditions, Processors: good[0].Processors}
	for family, tc := range map[string]struct {
		target santa.Target
		limit  string
	}{"IPv4": {target, "between 1 and 1472"}, "IPv6": {v6, "between 1 and 1452"}} {
		if _, err := c.Add(tc.target, []api.Rule{zero}); !errors.Is(err, santa.ErrInvalid) || !strings.Contains(err.Error(), tc.limit) {
			t.Errorf("a zero reply length on a UDP %s socket: %v, want invalid saying %s", family, err, tc.limit)
		}
	}

	// sockets santad must refuse
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	tcp, err := unix.Socket(unix.AF_INET, unix.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(tcp)
	unbound, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(unbound)
	for name, fd := range map[string]int{"a pipe": int(r.Fd()), "a TCP socket that does not listen": tcp, "an unbound UDP socket": unbound} {
		if _, err := c.Add(santa.FD(fd), good); !errors.Is(err, santa.ErrInvalid) {
			t.Errorf("rules for %s: %v, want invalid", name, err)
		}
	}
}

// TestRefusedAddBindsNothing: an add or replace with a passed fd binds the
// socket only if it succeeds; refused as invalid, or (for a user) over
// the quota, it leaves no rule set behind.
func TestRefusedAddBindsNothing(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb, "--config", configFile(t, "quota:\n  rules: 1\n"))
	sd.start()
	c := sd.client()
	target := udpTarget(t, tb, 7420)
	beyond := rule("ABCDE", 1470, "r") // past the bytes the matcher sees
	if _, err := c.Add(target, []api.Rule{beyond}); !errors.Is(err, santa.ErrInvalid) {
		t.Fatalf("an invalid add: %v, want invalid", err)
	}
	if _, err := c.Replace(target, []api.Rule{beyond}); !errors.Is(err, santa.ErrInvalid) {
		t.Fatalf("an invalid replace: %v, want invalid", err)
	}
	if socks, err := c.ListSockets(); err != nil || len(socks) != 0 {
		t.Fatalf("refused requests left rule sets: %+v %v", socks, err)
	}
	// as a user: refused as invalid, then over the quota, then accepted
	prog := fmt.Sprintf(`import socket, santa
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind(("%s", 7421))
c = santa.Client()
def rule(p, at=0):
    return santa.Rule(conditions=[santa.Condition(at, p)], processors=[santa.Put(0, b"r")], reply_len=1)
for rules in ([rule(b"ABCDE", 1470)], [rule(b"a"), rule(b"b")]):
    try:
        c.add(s, rules)
        print("added")
    except santa.Error as e:
        print(e.status.name, len(c.list_sockets()))
c.add(s, [rule(b"a")])
print("OK", len(c.list_sockets()))
`, tb.Server.IP4)
	out, err := runAs(tb, nobody, []string{"SANTA_SOCKET=" + sd.Socket, "PYTHONPATH=" + filepath.Join(work, "python")}, "/usr/bin/python3", "-c", prog)
	if want := "INVALID 0\nQUOTA 0\nOK 1\n"; err != nil || out != want {
		t.Fatalf("refused adds as uid %d: %v\n%s\nwant the status and no rule sets after each refusal:\n%s", nobody, err, out, want)
	}
}

func listenUDP(t *testing.T, tb *testbed.Testbed, port int) *net.UDPConn {
	t.Helper()
	var conn *net.UDPConn
	if err := tb.Server.Do(func() (err error) {
		conn, err = net.ListenUDP("udp", &net.UDPAddr{IP: tb.Server.IP4.AsSlice(), Port: port})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// udpTarget is a UDP socket of the test's on port, named for santad.
func udpTarget(t *testing.T, tb *testbed.Testbed, port int) santa.Target {
	t.Helper()
	target, err := santa.Socket(listenUDP(t, tb, port))
	if err != nil {
		t.Fatal(err)
	}
	return target
}

func ruleIDs(t *testing.T, c *santa.Client, target santa.Target) []uint64 {
	t.Helper()
	rules, err := c.ListRules(target)
	if err != nil {
		t.Fatal(err)
	}
	return idsOf(rules)
}

func checkRules(t *testing.T, c *santa.Client, target santa.Target, want int) {
	t.Helper()
	rules, err := c.ListRules(target)
	if err != nil {
		t.Fatal(err)
	}
	info, _, err := c.Health()
	if err != nil {
		t.Fatal(err)
	}
	if len(rules) != want || info.Rules != uint64(want) {
		t.Fatalf("%d rules listed, %d in the data plane, want %d: a refused request changed something", len(rules), info.Rules, want)
	}
}

// TestMalformedRequests speaks the protocol by hand: broken messages get a
// malformed, version or unsupported status and the connection goes on.
func TestMalformedRequests(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	conn, err := api.Dial(sd.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	raw := func(body []byte) *api.Message {
		t.Helper()
		frame := binary.BigEndian.AppendUint32(nil, uint32(len(body)))
		if _, err := conn.Unix().Write(append(frame, body...)); err != nil {
			t.Fatal(err)
		}
		m, _, err := conn.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	for name, tc := range map[string]struct {
		body []byte
		want api.Status
	}{
		"not CBOR":        {[]byte{0xff, 0x00}, api.StatusMalformed},
		"unknown key":     {[]byte{0xa2, 0x00, 0x01, 0x18, 0xff, 0x01}, api.StatusMalformed},
		"version 2":       {mustEncode(t, &api.Message{V: 2, Op: api.OpHealth, Seq: 1}), api.StatusVersion},
		"unknown op":      {mustEncode(t, &api.Message{V: 1, Op: 99, Seq: 1}), api.StatusUnsupported},
		"no target":       {mustEncode(t, &api.Message{V: 1, Op: api.OpAdd, Seq: 1}), api.StatusInvalid},
		"port on add":     {mustEncode(t, &api.Message{V: 1, Op: api.OpAdd, Seq: 1, Port: 53}), api.StatusInvalid},
		"bind by nothing": {mustEncode(t, &api.Message{V: 1, Op: api.OpBind, Seq: 1}), api.StatusInvalid},
		"protocol on add": {mustEncode(t, &api.Message{V: 1, Op: api.OpAdd, Seq: 1, Socket: 1, Protocol: api.ProtocolTCP}), api.StatusInvalid},
		"protocol without a port": {mustEncode(t, &api.Message{V: 1, Op: api.OpBind, Seq: 1, PID: 1, FD: 3, Protocol: api.ProtocolTCP}),
			api.StatusInvalid},
		"bind by port, protocol 132": {mustEncode(t, &api.Message{V: 1, Op: api.OpBind, Seq: 1, Port: 53, Protocol: 132}), api.StatusInvalid},
		"sample event":               {mustEncode(t, &api.Message{V: 1, Op: api.OpSample, Seq: 1}), api.StatusInvalid},
		"limit on stats":             {mustEncode(t, &api.Message{V: 1, Op: api.OpStats, Seq: 1, Socket: 1, Limit: 5}), api.StatusInvalid},
		"after on delete":            {mustEncode(t, &api.Message{V: 1, Op: api.OpDelete, Seq: 1, Socket: 1, After: 5}), api.StatusInvalid},
		"tag on add":                 {mustEncode(t, &api.Message{V: 1, Op: api.OpAdd, Seq: 1, Socket: 1, Tag: "t"}), api.StatusInvalid},
		"more in a request":          {mustEncode(t, &api.Message{V: 1, Op: api.OpListRules, Seq: 1, Socket: 1, More: true}), api.StatusInvalid},
		"status in a request":        {mustEncode(t, &api.Message{V: 1, Op: api.OpHealth, Seq: 1, Status: api.StatusInternal}), api.StatusInvalid},
		"counters in a request":      {mustEncode(t, &api.Message{V: 1, Op: api.OpHealth, Seq: 1, Counters: map[string]uint64{"answered": 1}}), api.StatusInvalid},
		"rules on delete":            {mustEncode(t, &api.Message{V: 1, Op: api.OpDelete, Seq: 1, Socket: 1, Rules: []api.Rule{{ReplyLen: 1}}}), api.StatusInvalid},
		"ids on list_rules":          {mustEncode(t, &api.Message{V: 1, Op: api.OpListRules, Seq: 1, Socket: 1, IDs: []uint64{1}}), api.StatusInvalid},
		"ids on unbind":              {mustEncode(t, &api.Message{V: 1, Op: api.OpUnbind, Seq: 1, Socket: 1, IDs: []uint64{1}}), api.StatusInvalid},
		"sample_bytes on add":        {mustEncode(t, &api.Message{V: 1, Op: api.OpAdd, Seq: 1, Socket: 1, SampleBytes: 64}), api.StatusInvalid},
		"socket on list_sockets":     {mustEncode(t, &api.Message{V: 1, Op: api.OpListSockets, Seq: 1, Socket: 1}), api.StatusInvalid},
	} {
		m := raw(tc.body)
		if m.Status != tc.want || m.Error == "" {
			t.Errorf("%s: status %s %q, want %s with a message", name, m.Status, m.Error, tc.want)
		}
	}
	// protocol.md: santad names the key it does not know
	if m := raw([]byte{0xa2, 0x00, 0x01, 0x18, 0xff, 0x01}); !strings.Contains(m.Error, "unknown key 255") {
		t.Errorf("a request with key 255: %q, want an error naming the key", m.Error)
	}
	// protocol.md: ... and echoes the op and seq the frame's first bytes name
	unknownKey := []byte{0xa4, 0x00, 0x01, 0x01, byte(api.OpAdd), 0x02, 0x1b, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x05, 0x18, 0xff, 0x01}
	if m := raw(unknownKey); m.Status != api.StatusMalformed || m.Op != api.OpAdd || m.Seq != 1<<40|5 {
		t.Errorf("an add with seq 2^40+5 and key 255: %s op %s seq %d, want malformed op add seq %d", m.Status, m.Op, m.Seq, uint64(1<<40|5))
	}
	if m := raw(mustEncode(t, &api.Message{V: 1, Op: api.OpHealth, Seq: 7})); m.Status != api.StatusOK || m.Seq != 7 || m.Daemon == nil {
		t.Fatalf("health after bad requests: %+v", m)
	}
}

// TestBindSocketMustAgree: a bind that passes an fd and names a socket
// cookie too is refused unless the two agree, as every other request is
// (docs/protocol.md "Targets"); a bind by pid and fd, or port, takes no
// cookie. It bound the passed socket and ignored the cookie.
func TestBindSocketMustAgree(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	udp, _ := serverSocket(t, tb, netip.AddrPortFrom(tb.Server.IP4, 7304))
	f, err := udp.File()
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	conn, err := api.Dial(sd.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	for _, tc := range []struct {
		name string
		req  *api.Message
		fd   int
	}{
		{"a passed fd and another cookie", &api.Message{V: 1, Op: api.OpBind, Seq: 1, Socket: 12345}, int(f.Fd())},
		{"pid, fd and a cookie", &api.Message{V: 1, Op: api.OpBind, Seq: 2, PID: uint32(os.Getpid()), FD: uint32(f.Fd()), Socket: 12345}, -1},
		{"port and a cookie", &api.Message{V: 1, Op: api.OpBind, Seq: 3, Port: 7304, Socket: 12345}, -1},
	} {
		if err := conn.Send(tc.req, tc.fd); err != nil {
			t.Fatal(err)
		}
		m, _, err := conn.Recv()
		if err != nil {
			t.Fatal(err)
		}
		if m.Status != api.StatusInvalid {
			t.Errorf("bind with %s: status %s %q, want invalid", tc.name, m.Status, m.Error)
		}
	}
	if socks, err := sd.client().ListSockets(); err != nil || len(socks) != 0 {
		t.Errorf("after the refused binds: %+v (%v), want no rule set", socks, err)
	}
}

func mustEncode(t *testing.T, m *api.Message) []byte {
	t.Helper()
	b, err := api.Encode(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestQuota runs the CLI as uid nobody against a small quota.
func TestQuota(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb, "--config", configFile(t, "quota:\n  rules: 3\n  template_bytes: 1000\n"))
	sd.start()
	a := startApp(t, tb, nobody, []string{"SANTA_SOCKET=" + sd.Socket}, filepath.Join(work, "listing1-go"), tb.Server.IP4.String(), "7500")
	three := filepath.Join(sd.dir, "three.yaml")
	writeFile(t, three, "rules:\n"+strings.Repeat("- conditions: [{offset: 0, hex: '0102'}]\n  processors: [{put: {at: 0, text: ok}}]\n  reply_len: 2\n", 3))
	big := filepath.Join(sd.dir, "big.json")
	writeFile(t, big, fmt.Sprintf(`{"rules": [{"conditions": [{"offset": 0, "text": "big"}], "processors": [{"put": {"at": 0, "text": "x"}}], "reply_len": 1200}]}`))
	// santad keeps every put: overlapping ones count with all their bytes
	overlapping := filepath.Join(sd.dir, "overlapping.json")
	put := fmt.Sprintf(`{"put": {"at": 0, "text": "%s"}}`, strings.Repeat("x", 40))
	writeFile(t, overlapping, fmt.Sprintf(`{"rules": [{"conditions": [{"offset": 0, "text": "over"}], "processors": [%s], "reply_len": 40}]}`,
		strings.Repeat(put+",", 29)+put))
	for name, file := range map[string]string{"a fourth rule": three, "1200 reply bytes": big, "30 puts of 40 bytes at one place": overlapping} {
		out, err := sd.cli(nobody, "rules", "add", "--socket", fmt.Sprint(a.Cookie), file)
		if err == nil || !strings.Contains(out, "quota") {
			t.Errorf("%s over the quota: %v %q, want a quota error", name, err, out)
		}
	}
	status, err := sd.cli(nobody, "status")
	if err != nil || !strings.Contains(status, "rules 1 of 3") {
		t.Fatalf("status after refused adds: %v\n%s", err, status)
	}
	// root has no quota
	if _, err := sd.cli(0, "rules", "add", "--socket", fmt.Sprint(a.Cookie), big); err != nil {
		t.Fatalf("root adding over nobody's quota: %v", err)
	}
}

// TestRuleSetsFull: binding more sockets than dataplane.max_rulesets is
// refused as full, telling the operator what to raise, and binds nothing.
func TestRuleSetsFull(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb, "--config", configFile(t, "dataplane:\n  max_rulesets: 2\n"))
	sd.start()
	c := sd.client()
	for port := 7430; port < 7432; port++ {
		if _, err := c.Bind(udpTarget(t, tb, port), santa.SampleOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	third := udpTarget(t, tb, 7432)
	if _, err := c.Bind(third, santa.SampleOptions{}); !errors.Is(err, santa.ErrFull) || !strings.Contains(err.Error(), "dataplane.max_rulesets") {
		t.Errorf("a third rule set of 2: %v, want full naming dataplane.max_rulesets", err)
	}
	if _, err := c.Add(third, []api.Rule{rule("a", 0, "b")}); !errors.Is(err, santa.ErrFull) {
		t.Errorf("rules for a third socket of 2: %v, want full", err)
	}
	if socks, err := c.ListSockets(); err != nil || len(socks) != 2 {
		t.Errorf("after refusals: %d rule sets (%v), want 2", len(socks), err)
	}
}

// TestBindNamesPassedSocket: a bind that passes a socket and names another
// cookie is refused, as every other request that does (docs/protocol.md,
// "Targets"); santad used to bind the passed socket and ignore the name.
func TestBindNamesPassedSocket(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	udp := listenUDP(t, tb, 7980)
	cookie, err := unix.GetsockoptUint64(sockFD(t, udp), unix.SOL_SOCKET, unix.SO_COOKIE)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := api.Dial(sd.Socket)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	bind := func(named uint64) *api.Message {
		t.Helper()
		if err := conn.Send(&api.Message{V: api.Version, Op: api.OpBind, Seq: 1, Socket: named}, sockFD(t, udp)); err != nil {
			t.Fatal(err)
		}
		m, _, err := conn.Recv()
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	if m := bind(cookie + 1); m.Status != api.StatusInvalid || !strings.Contains(m.Error, fmt.Sprintf("the request names %d", cookie+1)) {
		t.Fatalf("bind of socket %d naming %d: %s %q, want invalid", cookie, cookie+1, m.Status, m.Error)
	}
	if socks, err := sd.client().ListSockets(); err != nil || len(socks) != 0 {
		t.Fatalf("after the refused bind: rule sets %+v (%v), want none", socks, err)
	}
	if m := bind(cookie); m.Status != api.StatusOK || len(m.Sockets) != 1 || m.Sockets[0].Cookie != cookie {
		t.Fatalf("bind of socket %d naming it: %s %q %+v", cookie, m.Status, m.Error, m.Sockets)
	}
}

// sockFD is the fd of conn, for passing it by hand.
func sockFD(t *testing.T, conn *net.UDPConn) int {
	t.Helper()
	raw, err := conn.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var fd int
	if err := raw.Control(func(f uintptr) { fd = int(f) }); err != nil {
		t.Fatal(err)
	}
	return fd
}
