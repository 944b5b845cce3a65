package daemon_test

import (
	"fmt"
	"net/netip"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestSocketHitsNeverFall: a socket's answered requests and their reply
// bytes, as santa_socket_hits_total, santa_socket_reply_bytes_total,
// list_sockets and `santa rules ls` give them, only grow while it is bound,
// however its rules go (delete, delete by tag, modify, expiry, replace,
// expiry while no santad runs) and across santad restarts; an unbind starts
// them anew.
func TestSocketHitsNeverFall(t *testing.T) {
	tb := testbed.New(t)
	sd := newSantad(t, tb)
	sd.start()
	c := sd.client()
	server := netip.AddrPortFrom(tb.Server.IP4, 7950)
	conn, cookie := boundEchoServer(t, tb, c, server)
	defer conn.Close()
	target := santa.Cookie(cookie)
	rule := func(ask, answer, tag string) api.Rule {
		return api.Rule{Conditions: []api.Condition{santa.Match(0, []byte(ask))},
			Processors: []api.Processor{santa.Put(0, []byte(answer))}, ReplyLen: uint32(len(answer)), Tag: tag}
	}
	// Ethernet, IPv4 and UDP headers of each reply frame
	const replyHeaders = 14 + 20 + 8
	answered, replied := 0, 0
	ask := func(req, want string) {
		t.Helper()
		if got := exchange(t, tb, server, req); got != want {
			t.Fatalf("%s: got %q, want %q", req, got, want)
		}
		if req != want { // not the echo server's
			answered++
			replied += replyHeaders + len(want)
		}
	}
	metric := func(after, name string) int {
		t.Helper()
		re := regexp.MustCompile(fmt.Sprintf(`(?m)^%s\{[^}]*socket="%d"\} (\d+)$`, name, cookie))
		m := re.FindStringSubmatch(sd.scrape())
		if m == nil {
			t.Fatalf("after %s: no %s of socket %d", after, name, cookie)
		}
		v, _ := strconv.Atoi(m[1])
		return v
	}
	// the socket's hits and reply bytes, as the metrics, list_sockets and
	// the CLI give them, are those of all the requests answered so far
	check := func(after string) {
		t.Helper()
		if hits := metric(after, "santa_socket_hits_total"); hits != answered {
			t.Errorf("after %s: santa_socket_hits_total %d, want %d", after, hits, answered)
		}
		if bytes := metric(after, "santa_socket_reply_bytes_total"); bytes != replied {
			t.Errorf("after %s: santa_socket_reply_bytes_total %d, want %d", after, bytes, replied)
		}
		socks, err := sd.client().ListSockets()
		if err != nil || len(socks) != 1 {
			t.Fatalf("after %s: list sockets: %+v %v", after, socks, err)
		}
		if socks[0].Hits != uint64(answered) || socks[0].ReplyBytes != uint64(replied) {
			t.Errorf("after %s: list_sockets hits %d, reply bytes %d, want %d and %d", after,
				socks[0].Hits, socks[0].ReplyBytes, answered, replied)
		}
		out, err := sd.cli(0, "rules", "ls")
		if row := fmt.Sprintf(" %d %d\n", answered, replied); err != nil || !strings.Contains(strings.Join(strings.Fields(out), " ")+"\n", row) {
			t.Errorf("after %s: santa rules ls does not end its row with hits and reply bytes %q: %v\n%s", after, row, err, out)
		}
	}

	// Expires is in whole seconds: now+2s, truncated, could leave 1.0 s for
	// the add and the answers below; 3 to 4 s is room on a slow machine
	expiring := rule("Brief", "B", "")
	expiring.Expires = uint64(time.Now().Unix() + 4)
	ids, err := c.Add(target, []api.Rule{rule("One", "1", ""), rule("Two", "2", ""), rule("Tagged", "T", "gone"), expiring})
	if err != nil {
		t.Fatal(err)
	}
	for _, req := range []string{"One", "Two", "Two", "Tagged", "Brief"} {
		ask(req, map[string]string{"One": "1", "Two": "2", "Tagged": "T", "Brief": "B"}[req])
	}
	check("answers")
	if err := c.Delete(target, ids[:1]); err != nil {
		t.Fatal(err)
	}
	check("a delete")
	if _, err := c.DeleteTagged(target, "gone"); err != nil {
		t.Fatal(err)
	}
	check("a delete by tag")
	changed := rule("Two", "II", "")
	changed.ID = ids[1]
	if err := c.Modify(target, []api.Rule{changed}); err != nil {
		t.Fatal(err)
	}
	ask("Two", "II")
	check("a modify")
	for deadline := time.Unix(int64(expiring.Expires), 0).Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if rules, err := c.ListRules(target); err != nil || len(rules) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the expiring rule is still there 5 s after its time")
		}
	}
	check("an expiry")
	if _, err := c.Replace(target, []api.Rule{rule("Three", "3", "")}); err != nil {
		t.Fatal(err)
	}
	check("a replace")
	ask("Three", "3")
	check("an answer of the replacing rule")
	if _, err := c.Replace(target, []api.Rule{rule("Four", "4", "")}); err != nil {
		t.Fatal(err)
	}
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		sd.stop(sig)
		sd.start()
		check(fmt.Sprintf("a restart after %v", sig))
		ask("Four", "4")
	}
	check("answers after the restarts")
	// a rule whose time comes while no santad runs
	c = sd.client()
	brief := rule("Short", "S", "")
	brief.Expires = uint64(time.Now().Unix() + 4) // 3 to 4 s: the add and an answer come first
	if _, err := c.Add(target, []api.Rule{brief}); err != nil {
		t.Fatal(err)
	}
	ask("Short", "S")
	sd.stop(syscall.SIGKILL)
	time.Sleep(time.Until(time.Unix(int64(brief.Expires), 0).Add(50 * time.Millisecond)))
	sd.start()
	check("a rule expired while no santad ran")
	sd.stop(syscall.SIGTERM)
	sd.start()
	check("one more restart")

	c = sd.client()
	if err := c.Unbind(target); err != nil {
		t.Fatal(err)
	}
	testbed.Bind(t, c, conn)
	answered, replied = 0, 0
	check("an unbind and a bind")
}
