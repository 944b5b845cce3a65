package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/testbed"
)

// dnsShape is the query shape the controller installs up front: dig's
// (RD and AD set, EDNS with UDP size 1232, an 8-byte client cookie).
const dnsShape = "rd,ad,edns=1232,cookie"

// controller is a controller of the santa CLI of the build (`santa dns
// static` against NSD, `santa memcached static` against memcached) that
// root runs in the server namespace.
type controller struct {
	*testbed.Controller
	seen int // bytes of its output already shown
}

// startController writes the names file and runs the DNS controller, and
// waits for its "ready:" line: by then its rules are installed.
func (m *demo) startController(verbose bool) (*controller, error) {
	var names []string
	for _, q := range offload {
		names = append(names, q.name+" "+q.qtype)
	}
	fmt.Fprintln(m.out)
	fmt.Fprintln(m.out, "Root offloads two of NSD's names with the DNS controller of the build, `santa dns static`:")
	namesFile, err := m.writeList("names", names)
	if err != nil {
		return nil, err
	}
	return m.runController(verbose, "dns", "static", "--port", "53/udp", "--names", namesFile, "--shape", dnsShape)
}

// writeList writes lines to the file name in the demo's directory and
// shows it (`cat`); it returns the file's path.
func (m *demo) writeList(name string, lines []string) (string, error) {
	path := filepath.Join(m.dir, name)
	if err := os.WriteFile(path, []byte(strings.Join(lines, "\n")+"\n"), 0o644); err != nil {
		return "", err
	}
	fmt.Fprintf(m.out, "  $ cat %s\n", path)
	for _, l := range lines {
		fmt.Fprintf(m.out, "  %s\n", l)
	}
	return path, nil
}

// runController shows the command line of `santa KIND ARGS` (with
// --verbose if verbose) as root runs it in the server namespace, runs it
// and waits for its "ready:" line: by then its first rules are installed.
func (m *demo) runController(verbose bool, kind string, args ...string) (*controller, error) {
	if verbose {
		args = append(args, "--verbose")
	}
	argv := testbed.ControllerArgv(m.bins.santa, m.tb.Server.NS, m.santad.Socket, kind, args...)
	fmt.Fprintf(m.out, "  $ %s \\\n        %s\n", strings.Join(argv[:5], " "), strings.Join(argv[5:], " "))

	var onLine func(string)
	if verbose {
		onLine = func(l string) { fmt.Fprintln(os.Stderr, l) }
	}
	if err := m.ctx.Err(); err != nil {
		return nil, err
	}
	c, err := testbed.StartController(m.ctx, argv, 60*time.Second, onLine)
	if err != nil {
		return nil, err
	}
	return &controller{Controller: c}, nil
}

// showReady prints the controller's ready line and its log so far (the
// sockets it attached to, what it probed or installed).
func (m *demo) showReady(c *controller) {
	fmt.Fprintf(m.out, "  %s\n", c.Ready())
	m.showLog(c)
}

// showLog prints the controller's log lines not shown yet.
func (m *demo) showLog(c *controller) {
	for _, l := range c.newLog() {
		fmt.Fprintf(m.out, "  log: %s\n", l)
	}
}

// stopAndShow stops the controller as an operator does, with SIGTERM
// (what says who it is, e.g. "the DNS controller"), and shows its "done:"
// line and its last log lines. The controller deletes its rules before it
// exits.
func (m *demo) stopAndShow(c *controller, what string) error {
	fmt.Fprintln(m.out)
	fmt.Fprintf(m.out, "Root stops %s (SIGTERM to pid %d); it deletes its rules:\n", what, c.PID())
	if err := c.stop(); err != nil {
		return err
	}
	done := c.line("done:")
	if done == "" {
		return fmt.Errorf("%s exited without its done line:\n%s", what, tail(c.Output(), 20))
	}
	fmt.Fprintf(m.out, "  %s\n", done)
	m.showLog(c)
	return nil
}

// stop stops the controller (see Controller.Stop).
func (c *controller) stop() error { return c.Stop(20 * time.Second) }

// line is the controller's first stdout line starting with prefix.
func (c *controller) line(prefix string) string {
	for _, l := range strings.Split(c.Output(), "\n") {
		if strings.HasPrefix(l, prefix) {
			return l
		}
	}
	return ""
}

// newLog returns the log lines (info and above) written since the last
// call, shortened for the reader: no time stamp, no INFO level, the
// message unquoted.
func (c *controller) newLog() []string {
	fresh := c.Output()[c.seen:]
	c.seen += len(fresh)
	var out []string
	for _, l := range strings.Split(strings.TrimSuffix(fresh, "\n"), "\n") {
		if l == "" || strings.HasPrefix(l, "ready:") || strings.HasPrefix(l, "done:") ||
			strings.Contains(l, " level=DEBUG ") {
			continue
		}
		out = append(out, logLine(l))
	}
	return out
}

// logLine shortens a line of slog's text format: "time=T level=INFO
// msg="probed the server" server=..." becomes "probed the server: server=...".
func logLine(l string) string {
	if t, rest, ok := strings.Cut(l, " "); ok && strings.HasPrefix(t, "time=") {
		l = rest
	}
	l = strings.TrimPrefix(l, "level=INFO ")
	rest, ok := strings.CutPrefix(l, "msg=")
	if !ok {
		return l
	}
	msg, attrs, _ := strings.Cut(rest, " ")
	if q, err := strconv.QuotedPrefix(rest); err == nil {
		msg, _ = strconv.Unquote(q)
		attrs = strings.TrimPrefix(rest[len(q):], " ")
	}
	if attrs == "" {
		return msg
	}
	return msg + ": " + attrs
}

// ruleQuestion is the question a controller's rule answers, read from its
// reply (a Put of the server's reply after the ID).
func ruleQuestion(r api.Rule) (question, bool) {
	for _, p := range r.Processors {
		if p.Kind != api.KindPut || p.ReplyOffset != 2 {
			continue
		}
		var msg dns.Msg
		if err := msg.Unpack(append([]byte{0, 0}, p.Template...)); err != nil || len(msg.Question) != 1 {
			return question{}, false
		}
		q := msg.Question[0]
		return question{strings.TrimSuffix(q.Name, "."), dns.TypeToString[q.Qtype]}, true
	}
	return question{}, false
}

// openParts names the parts of a DNS rule's query that its conditions leave
// open (any value matches): the ID, flag bits, the EDNS UDP size and a
// cookie option's bytes. It rebuilds the query from the conditions.
func openParts(r api.Rule) []string {
	n := int(r.MinLen)
	if n < 12 || r.MaxLen != r.MinLen {
		return nil
	}
	wire, mask := make([]byte, n), make([]byte, n)
	for _, c := range r.Conditions {
		for i, b := range c.Pattern {
			if o := int(c.Offset) + i; o < n {
				m := byte(0xff)
				if len(c.Mask) > i {
					m = c.Mask[i]
				}
				wire[o], mask[o] = b, mask[o]|m
			}
		}
	}
	open := func(from, to int) bool {
		for _, m := range mask[from:to] {
			if m != 0 {
				return false
			}
		}
		return true
	}
	var out []string
	if open(0, 2) {
		out = append(out, "ID")
	}
	flags := uint16(mask[2])<<8 | uint16(mask[3])
	var fl []string
	for _, f := range []struct {
		bit  uint16
		name string
	}{{1 << 8, "RD"}, {1 << 5, "AD"}, {1 << 4, "CD"}} {
		if flags&f.bit == 0 {
			fl = append(fl, f.name)
		}
	}
	if len(fl) > 0 {
		out = append(out, "flags "+strings.Join(fl, " "))
	}
	off := 12 // the question name, then type and class
	for off < n && wire[off] != 0 {
		off += 1 + int(wire[off])
	}
	opt := off + 5
	if opt+11 > n || wire[opt] != 0 || wire[opt+1] != 0 || wire[opt+2] != byte(dns.TypeOPT) {
		return out
	}
	if open(opt+3, opt+5) {
		out = append(out, "UDP size")
	}
	for o := opt + 11; o+4 <= n; {
		code, l := int(wire[o])<<8|int(wire[o+1]), int(wire[o+2])<<8|int(wire[o+3])
		if o+4+l > n {
			break
		}
		if code == dns.EDNS0COOKIE && open(o+4, o+4+l) {
			out = append(out, "cookie")
		}
		o += 4 + l
	}
	return out
}
