package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func TestMain(m *testing.M) {
	os.Exit(runTests(m))
}

// runTests builds santad and the santa CLI into a temp dir on PATH, where
// the demo finds them when they are not next to its executable (the test
// binary's directory has neither).
func runTests(m *testing.M) int {
	dir, err := os.MkdirTemp("", "santa-demo-test-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(dir)
	for _, c := range []string{"santad", "santa"} {
		cmd := exec.Command("go", "build", "-buildvcs=false", "-o", filepath.Join(dir, c), "../"+c)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "build %s: %v\n%s", c, err, out)
			return 1
		}
	}
	os.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return m.Run()
}

// TestDemo runs the whole demo and checks what it tells the reader.
func TestDemo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and runs santad")
	}
	if err := preflight(); err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	if err := run(context.Background(), &out, false); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	s := out.String()
	t.Log("\n" + s)
	for _, want := range []string{
		"XDP rule processor on",
		"taken over by santad for root (Client.BindPort(53)",
		"from      Santa, in the kernel (XDP)             │  NSD (no rule matched, passed on)",
		"rule 1 hits 0 → 1",
		"rule 2 hits 0 → 1",
		"mail.example.test A    IPv4  no answer: timed out",
		"mail.example.test A    IPv6  no answer: timed out",
		"txt.example.test TXT   IPv6  TXT \"hello from the testbed\" (TTL 300)  Santa, rule 4 hits 0 → 1",
		"ready cookie=",
		"(app paused: SIGSTOP to pid",
		`"Hello"  → "COMSYS"      Santa, in the kernel (XDP), rule 5 hits 0 → 1`,
		`"other"  → "app:other"   the app (no rule matched, passed on)`,
		`"stats"  → "hits=1"      the app (no rule matched, passed on)`,
		"  65534  ",
		`@0="Hello"`,
		"Cleaned up",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(s, "unclear") {
		t.Error("the demo could not tell who answered a request")
	}
	if _, err := os.Stat(bpffsPrefix + fmt.Sprint(os.Getpid())); !os.IsNotExist(err) {
		t.Errorf("santad's pins are still there after the demo (stat: %v)", err)
	}
}

// A cancelled context stops the demo early, and it still cleans up.
func TestDemoInterrupted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and runs santad")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, false); err == nil {
		t.Fatalf("cancelled demo returned no error:\n%s", out.String())
	}
	if strings.Contains(out.String(), "Cleaned up") {
		t.Errorf("cancelled demo claims it ran:\n%s", out.String())
	}
}

func TestParseDig(t *testing.T) {
	out := "www.example.test.\t300\tIN\tA\t198.18.255.10\ntxt.example.test. 300 IN TXT \"a b\"\n;; Query time: 0 msec\n"
	if got, want := parseDig(out), `A 198.18.255.10 (TTL 300); TXT "a b" (TTL 300)`; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := parseDig(""); got != "(empty answer section)" {
		t.Errorf("empty: %q", got)
	}
}

func TestAttribute(t *testing.T) {
	snap := func(answered, nomatch, hits uint64) snapshot {
		return snapshot{c: map[string]uint64{"answered": answered, "pass_no_match": nomatch},
			hits: map[uint64]uint64{7: hits}}
	}
	if by, ev := attribute(snap(1, 1, 1), snap(2, 1, 2), 7, "NSD"); !strings.HasPrefix(by, "Santa") || ev != "rule 7 hits 1 → 2" {
		t.Errorf("rule hit: %q %q", by, ev)
	}
	if by, ev := attribute(snap(1, 1, 1), snap(1, 2, 1), 0, "the app"); by != "the app (no rule matched, passed on)" || ev != "pass_no_match 1 → 2" {
		t.Errorf("no rule: %q %q", by, ev)
	}
	if by, _ := attribute(snap(1, 1, 1), snap(2, 1, 1), 7, "NSD"); by != "unclear" {
		t.Errorf("answered by another rule: %q", by)
	}
}

func TestFindBinary(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "santa-demo-test-tool")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir)
	if got, err := findBinary("santa-demo-test-tool"); err != nil || got != p {
		t.Errorf("on PATH: %q, %v", got, err)
	}
	_, err := findBinary("santa-demo-no-such-tool")
	if err == nil || !strings.Contains(err.Error(), "make build") {
		t.Errorf("missing: %v", err)
	}
}

func TestFindPythonClient(t *testing.T) {
	dir, err := findPythonClient()
	if err != nil {
		t.Fatal(err)
	}
	if !isFile(filepath.Join(dir, "examples", "listing1.py")) {
		t.Errorf("%s has no examples/listing1.py", dir)
	}
}
