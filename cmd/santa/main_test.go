package main

import (
	"bytes"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/santa-offload/santa/api"
)

// TestDocsNameEveryFlag checks that every flag of every command is named
// in the docs (docs/cli.md's command table, or the controllers' pages).
func TestDocsNameEveryFlag(t *testing.T) {
	var docs strings.Builder
	for _, page := range []string{"cli.md", "dns.md", "http.md", "memcached.md"} {
		b, err := os.ReadFile(filepath.Join("../../docs", page))
		if err != nil {
			t.Fatal(err)
		}
		docs.Write(b)
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Name != "help" && !strings.Contains(docs.String(), "--"+f.Name) {
				t.Errorf("%s: --%s is in no doc (docs/cli.md, dns.md, http.md, memcached.md)", c.CommandPath(), f.Name)
			}
		})
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(newRoot(env{}))
}

// TestHelp runs --help of every command: each must explain itself.
func TestHelp(t *testing.T) {
	var walk func(c *cobra.Command, path []string)
	n := 0
	walk = func(c *cobra.Command, path []string) {
		for _, sub := range c.Commands() {
			if sub.Hidden || sub.Name() == "help" || sub.Name() == "completion" {
				continue
			}
			walk(sub, append(path, sub.Name()))
		}
		var out bytes.Buffer
		root := newRoot(env{stdout: &out, stderr: &out, stdin: strings.NewReader("")})
		root.SetArgs(append(path[1:], "--help"))
		if err := root.Execute(); err != nil {
			t.Errorf("%s --help: %v", strings.Join(path, " "), err)
		}
		if c.Short == "" || !strings.Contains(out.String(), "Usage:") {
			t.Errorf("%s --help explains nothing:\n%s", strings.Join(path, " "), out.String())
		}
		n++
	}
	walk(newRoot(env{}), []string{"santa"})
	if n < 12 {
		t.Errorf("only %d commands found", n)
	}
}

// TestErrorsSayWhatToDo checks messages of refusals that need no santad.
func TestErrorsSayWhatToDo(t *testing.T) {
	noRules := filepath.Join(t.TempDir(), "NORULES")
	if err := os.WriteFile(noRules, []byte("rules: []\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for args, want := range map[string]string{
		"rules rm --socket 1 abc":                      "not a rule id",
		"rules rm --socket 1":                          "give rule ids or --tag",
		"rules rm --socket 1 --tag x 7":                "give rule ids or --tag",
		"rules ls --tag x":                             "give --socket too",
		"rules add --socket 1 --tag a\x01b FILE":       "control character",
		"attach --port 53/sctp":                        "only udp and tcp",
		"attach --port 0":                              "from 1 to 65535",
		"attach --port 53 --sample-rate 10":            "--sample-rate needs --sample-bytes",
		"rules add FILE":                               `required flag(s) "socket"`,
		"top --interval 0":                             "--interval 0s: must be positive",
		"top --count -1":                               "--count -1: must not be negative",
		"top -n -2":                                    "--rules -2: must not be negative",
		"rules add --socket 1 -":                       "the rule file is empty",
		"rules add --socket 1 NORULES":                 "NORULES holds no rules",
		"rules modify --socket 1 NORULES":              "NORULES holds no rules",
		"status --socket-path /nonexistent/santa.s":    "is santad running?",
		"http --root /tmp --port 80/udp":               "nginx's HTTP is TCP",
		"http --root /etc/hostname":                    "not a directory",
		"http --root /tmp --max-rules 0":               `--max-rules "0": must be more than 0`,
		"http --root /tmp --settle 0s":                 `--settle "0s": must be more than 0`,
		"memcached adaptive --idle 0":                  `--idle "0s": must be more than 0`,
		"memcached top --keys - --count 0":             `--count "0": must be more than 0`,
		"http --root /tmp --duration -1s":              "--duration -1s: must be 0",
		"dns static --names - --zone-file x --port 53": "not both",
		"dns static --names - --pid 7":                 "--pid needs --fd",
		"dns static --names - --origin example.com":    "--origin is for --zone-file",
		"dns static --zone-file x --types A":           "--types is for --names",
		"dns static --names - --port 53 --parallel 0":  `--parallel "0": must be more than 0`,
		"http --root /tmp --tag=":                      `--tag "": must not be empty (default santa-http)`,
		"dns static --names - --port 53 --tag=":        `--tag "": must not be empty (default santa-dns)`,
		"memcached static --keys /etc/hostname --guards /nonexistent/guards --socket-path /nonexistent/santa.s": "is santad running? One with another --bpffs has it at <its --bpffs>/guards: give that with --guards",
		"dns static --names - --port 53 --max-rules 0":                                                          `--max-rules "0": must be more than 0`,
		"dns top --queries - --port 53 --sample-rate 0":                                                         `--sample-rate "0": must be more than 0`,
		"dns adaptive --port 53 --min-samples 0":                                                                `--min-samples "0": must be more than 0`,
		"dns adaptive --port 53 --interval 0":                                                                   `--interval "0s": must be more than 0`,
		"dns adaptive --port 53 --idle 0":                                                                       `--idle "0s": must be more than 0`,
		"dns adaptive --port 53 --max-rules -1":                                                                 `--max-rules "-1": must be more than 0 (default 100000)`,
		"dns static --names - --port 53 --parallel -1":                                                          `--parallel "-1": must be more than 0`,
		"dns static --names - --port 53 --parallel 1025":                                                        `--parallel 1025: at most 1024`,
		"dns static --names - --port 53 --timeout -1s":                                                          `--timeout "-1s": must be more than 0`,
		"dns adaptive --port 53 --interval -1s":                                                                 `--interval "-1s": must be more than 0`,
		"dns adaptive --port 53 --idle -1m":                                                                     `--idle "-1m0s": must be more than 0`,
		"dns static --names - --port 53 --quiet-after -1s":                                                      `--quiet-after "-1s": must be more than 0`,
		"dns static --names - --port 53 --poll -1s":                                                             `--poll "-1s": must be 0 (no polling) or more (default 1s)`,
		"dns static --names - --pid -1 --fd 3":                                                                  `--pid -1: want a process id, from 1`,
		"dns static --names - --pid 7 --fd -1":                                                                  `--fd -1: want an fd number, from 0`,
		"dns static --names - --port 53 --sample-rate -1":                                                       `--sample-rate "-1": want a whole number from 0 to 4294967295 (default 5000)`,
		"dns adaptive --port 53 --min-samples x":                                                                `--min-samples "x": want a whole number from 0 to 18446744073709551615 (default 4)`,
		"dns adaptive --port 53 --server 127.0.0.1:53":                                                          `--server "127.0.0.1:53": want an IP address`,
		"dns static --names - --port 53 --poll 1":                                                               `--poll "1": want a duration such as 500ms, 2s or 1m (default 1s)`,
	} {
		var out bytes.Buffer
		root := newRoot(env{stdout: &out, stderr: &out, stdin: strings.NewReader("")})
		root.SetArgs(strings.Fields(strings.ReplaceAll(args, "NORULES", noRules)))
		err := root.Execute()
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("santa %s: %v, want an error saying %q", args, err, want)
		}
	}
}

// TestParsePort checks the port forms attach takes, and that the UDP
// controllers' --port refuses tcp.
func TestParsePort(t *testing.T) {
	for in, want := range map[string]struct {
		port  uint16
		proto uint32
	}{"53": {53, api.ProtocolUDP}, "53/udp": {53, api.ProtocolUDP}, "53/UDP": {53, api.ProtocolUDP}, "80/tcp": {80, api.ProtocolTCP}, "65535/tcp": {65535, api.ProtocolTCP}} {
		if p, proto, err := parsePortProto(in); err != nil || p != want.port || proto != want.proto {
			t.Errorf("parsePortProto(%q) = %d, %d, %v; want %d, %d", in, p, proto, err, want.port, want.proto)
		}
	}
	for _, bad := range []string{"0/tcp", "65536/tcp", "x/udp", "53/sctp", "53/"} {
		if _, _, err := parsePortProto(bad); err == nil {
			t.Errorf("parsePortProto(%q): no error", bad)
		}
	}
	if p, err := parsePort("53/udp"); err != nil || p != 53 {
		t.Errorf("parsePort(53/udp) = %d, %v", p, err)
	}
	if _, err := parsePort("53/tcp"); err == nil || !strings.Contains(err.Error(), "only udp") {
		t.Errorf("parsePort(53/tcp): %v, want only udp", err)
	}
}

// TestReadKeys: a key listed twice is one key, at its first place, with
// its counts added up: top --count N used to offload fewer than N keys.
func TestReadKeys(t *testing.T) {
	for content, want := range map[string]string{
		"a 1\nb 5\na 7\nc 2\n": "a b c",
		"x\ny\nx\n# x\nz\n":    "x y z",
		"a 3\nb 2\nb 2\n":      "b a",
	} {
		file := filepath.Join(t.TempDir(), "keys")
		if err := os.WriteFile(file, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		keys, err := readKeys(file)
		if got := strings.Join(keys, " "); err != nil || got != want {
			t.Errorf("readKeys of %q = %q, %v; want %q", content, got, err, want)
		}
	}
}

// TestReadKeysWithSpace: a key with a space is refused with the line's
// form, not only "not a number".
func TestReadKeysWithSpace(t *testing.T) {
	file := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(file, []byte("good\nbad key\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := readKeys(file)
	if err == nil || !strings.Contains(err.Error(), ":2: ") || !strings.Contains(err.Error(), "a memcached key has no spaces") {
		t.Errorf("readKeys of a key with a space: %v", err)
	}
}

// TestMatches checks how rules ls shows conditions, masks, length bounds and guards.
func TestMatches(t *testing.T) {
	for want, r := range map[string]api.Rule{
		`@0="Hello"`: {Conditions: []api.Condition{{Pattern: api.Bytes("Hello")}}},
		`@2="\x00\x80"/0fc0 @4="www" len=21`: {Conditions: []api.Condition{
			{Offset: 2, Pattern: api.Bytes{0, 0x80}, Mask: api.Bytes{0x0f, 0xc0}}, {Offset: 4, Pattern: api.Bytes("www")}},
			MinLen: 21, MaxLen: 21},
		`@0="a" len>=3`:          {Conditions: []api.Condition{{Pattern: api.Bytes("a")}}, MinLen: 3},
		`@0="a" len>=3 len<=512`: {Conditions: []api.Condition{{Pattern: api.Bytes("a")}}, MinLen: 3, MaxLen: 512},
		`@0="a" len<=512`:        {Conditions: []api.Condition{{Pattern: api.Bytes("a")}}, MaxLen: 512},
		`@0="a" len=16 guard=7@3 guard=0@4294967297`: {Conditions: []api.Condition{{Pattern: api.Bytes("a")}}, MinLen: 16, MaxLen: 16,
			Guards: []api.Guard{{Slot: 7, Version: 3}, {Slot: 0, Version: 1<<32 + 1}}},
		`@0="GET / " close`: {Conditions: []api.Condition{{Pattern: api.Bytes("GET / ")}}, Close: true},
	} {
		if got := matches(r); got != want {
			t.Errorf("matches(%+v) = %s, want %s", r, got, want)
		}
	}
}

// TestControllerThatNeverStarted: a controller that cannot reach santad
// fails saying so, and prints no done line (it has nothing to report):
// santa http and santa dns alike.
func TestControllerThatNeverStarted(t *testing.T) {
	names := filepath.Join(t.TempDir(), "names")
	if err := os.WriteFile(names, []byte("www.example.com\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"http", "--root", t.TempDir()},
		{"dns", "static", "--port", "53/udp", "--names", names},
	} {
		var stdout, stderr bytes.Buffer
		root := newRoot(env{stdout: &stdout, stderr: &stderr, stdin: strings.NewReader("")})
		root.SetArgs(append(args, "--socket-path", "/nonexistent/santa.s", "--duration", "1s"))
		if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "is santad running?") {
			t.Errorf("santa %s without santad: %v", args[0], err)
		}
		if strings.Contains(stdout.String(), "done:") {
			t.Errorf("santa %s: a done line from a controller that never started:\n%s", args[0], stdout.String())
		}
	}
}

// TestHangupIgnoredUnderNohup: a controller started with SIGHUP ignored
// (nohup) leaves it ignored and runs on when its terminal closes; without
// nohup a SIGHUP stops it (the dnsctl test TestHangupStops).
func TestHangupIgnoredUnderNohup(t *testing.T) {
	signal.Ignore(syscall.SIGHUP)
	defer signal.Reset(syscall.SIGHUP)
	ctx, stop := controllerContext(0)
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
		t.Fatal("a SIGHUP ignored at the start (nohup) stopped the controller")
	case <-time.After(300 * time.Millisecond):
	}
}
