//go:build linux

package bench

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

func TestMedian(t *testing.T) {
	ss := []Sample{
		{RepliesPPS: 3, UsPerReply: 1.0, Replies: 10, Attempts: 1},
		{RepliesPPS: 1, UsPerReply: 3.0, Replies: 30, Attempts: 2},
		{RepliesPPS: 2, UsPerReply: 2.0, Replies: 20, Attempts: 1},
	}
	m, lo, hi := median(ss)
	if m.RepliesPPS != 2 || m.UsPerReply != 2 || m.Replies != 20 || lo != 1 || hi != 3 || m.Attempts != 4 {
		t.Fatalf("median %+v lo %v hi %v", m, lo, hi)
	}
	m, _, _ = median(ss[:2])
	if m.RepliesPPS != 2 || m.Replies != 20 {
		t.Fatalf("even median %+v", m)
	}
}

func TestUpdateMarkdown(t *testing.T) {
	p := filepath.Join(t.TempDir(), "b.md")
	if err := UpdateMarkdown(p, "## UDP\n\nfirst\n"); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(p); string(b) != "# Benchmarks\n\n## UDP\n\nfirst\n" {
		t.Fatalf("created: %q", b)
	}
	os.WriteFile(p, []byte("# Benchmarks\n\nintro\n\n## UDP\n\nold\n### sub\nold\n\n## TCP\n\ntcp stays\n"), 0o644)
	if err := UpdateMarkdown(p, "## UDP\n\nnew\n"); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(p)
	want := "# Benchmarks\n\nintro\n\n## UDP\n\nnew\n\n## TCP\n\ntcp stays\n"
	if string(b) != want {
		t.Fatalf("replaced:\n%q\nwant\n%q", b, want)
	}
	os.WriteFile(p, []byte("# Benchmarks\n\n## TCP\n\ntcp\n"), 0o644)
	UpdateMarkdown(p, "## UDP\n\nnew\n")
	b, _ = os.ReadFile(p)
	if string(b) != "# Benchmarks\n\n## TCP\n\ntcp\n\n## UDP\n\nnew\n" {
		t.Fatalf("appended: %q", b)
	}
}

// The whole harness on the smallest possible sweep: one rate, one
// repetition, NSD and the reflector. It checks the pipeline, not figures.
func TestHarnessSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: run the tests as root")
	}
	if _, err := os.Stat(KxdpgunPath); err != nil {
		t.Fatal("kxdpgun not installed: run scripts/install-deps.sh (Debian knot-dnsutils)")
	}
	if testing.Short() {
		t.Skip("short")
	}
	cfg := Config{
		Cases:     []Responder{&NSDOnly{}, &Reflector{Port: 53}},
		Rates:     []int{20000},
		Duration:  time.Second,
		Reps:      1,
		Names:     100,
		Placement: testbed.DefaultPlacement,
		Logf: func(f string, a ...any) {
			t.Logf(f, a...)
		},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Cases {
		if c.Error != "" {
			t.Fatalf("%s: %s", c.Name, c.Error)
		}
		sp := c.Sat()
		if sp == nil || sp.Median.Replies == 0 || sp.Median.ServerBusy <= 0 {
			t.Fatalf("%s: no result: %+v", c.Name, sp)
		}
		if c.Name == CaseReflector && (sp.Median.ProgID == 0 || sp.Median.BPFRunCnt == 0 || sp.Median.ProgName != "reflector") {
			t.Errorf("reflector: no BPF stats: %+v", sp.Median)
		}
		if c.Name == CaseNSD && sp.Median.ProgID != 0 {
			t.Errorf("nsd: unexpected program %d", sp.Median.ProgID)
		}
	}
	dir := t.TempDir()
	files, _, err := rep.WriteFiles(dir, "udp")
	if err != nil || len(files) < 2 {
		t.Fatalf("write files %v %v", files, err)
	}
	md := rep.Markdown("udp")
	for _, s := range []string{"## UDP", "| nsd |", "| reflector |", "At saturation", "At the knee"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
}
