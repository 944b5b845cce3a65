package main

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"github.com/santa-offload/santa/internal/dataplane"
)

// TestDemo runs the whole demo and checks what it tells the reader.
func TestDemo(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and attaches XDP")
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
		"from      Santa, in the kernel (XDP)             │  NSD (no rule matched, passed on)",
		"rule 1 hits 0 → 1",
		"rule 2 hits 0 → 1",
		"mail.example.test A    IPv4  no answer: timed out",
		"mail.example.test A    IPv6  no answer: timed out",
		"txt.example.test TXT   IPv6  TXT \"hello from the testbed\" (TTL 300)  Santa, rule 4 hits 0 → 1",
		"Cleaned up",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q", want)
		}
	}
	if strings.Contains(s, "unclear") {
		t.Error("the demo could not tell who answered a query")
	}
}

// A cancelled context stops the demo early, and it still cleans up.
func TestDemoInterrupted(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: the demo builds network namespaces and attaches XDP")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out bytes.Buffer
	if err := run(ctx, &out, false); err == nil {
		t.Fatalf("cancelled demo returned no error:\n%s", out.String())
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
			hits: map[dataplane.RuleID]uint64{7: hits}}
	}
	if by, ev := attribute(snap(1, 1, 1), snap(2, 1, 2), 7); !strings.HasPrefix(by, "Santa") || ev != "rule 7 hits 1 → 2" {
		t.Errorf("rule hit: %q %q", by, ev)
	}
	if by, ev := attribute(snap(1, 1, 1), snap(1, 2, 1), 0); !strings.HasPrefix(by, "NSD") || ev != "pass_no_match 1 → 2" {
		t.Errorf("no rule: %q %q", by, ev)
	}
	if by, _ := attribute(snap(1, 1, 1), snap(2, 1, 1), 7); by != "unclear" {
		t.Errorf("answered by another rule: %q", by)
	}
}
