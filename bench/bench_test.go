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

// A point is measured again when others' work or the hypervisor's steal
// passes its limit; the figures of a throttled VM point (busy 0.58 s,
// steal 0.65 s of a 4.1 s window) must not pass as clean.
func TestDisturbance(t *testing.T) {
	for _, c := range []struct {
		name      string
		s         Sample
		disturbed bool
	}{
		{"quiet", Sample{WindowSec: 4, Foreign: 0.02, StealSec: 0.04}, false},
		{"others' work", Sample{WindowSec: 4, Foreign: 0.12, StealSec: 0.04}, true},
		{"throttled VM", Sample{WindowSec: 4.1, Foreign: 0, StealSec: 0.65}, true},
		{"steal at the limit", Sample{WindowSec: 4, StealSec: 0.12}, false},
		{"no window", Sample{Foreign: 0.05}, false},
	} {
		if got := disturbance(c.s, maxForeign) > 1; got != c.disturbed {
			t.Errorf("%s: disturbed %v, want %v (disturbance %.2f)", c.name, got, c.disturbed, disturbance(c.s, maxForeign))
		}
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
		sp := saturation(t, c)
		if c.Name == CaseReflector && (sp.Median.ProgID == 0 || sp.Median.BPFRunCnt == 0 || sp.Median.ProgName != "reflector") {
			t.Errorf("reflector: no BPF stats: %+v", sp.Median)
		}
		if c.Name == CaseNSD && sp.Median.ProgID != 0 {
			t.Errorf("nsd: unexpected program %d", sp.Median.ProgID)
		}
	}
	dir := t.TempDir()
	files, warns, err := rep.WriteFiles(dir, "udp")
	if len(warns) > 0 {
		t.Errorf("plots: %v", warns)
	}
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

// The DNS harness end to end on a tiny zone: NSD alone, and NSD with
// santad and `santa dns top` offloading the top 100 of a Zipf mix, one
// rate, one repetition, with the latency prober. It checks the pipeline
// (santad, the controller, the answer counter, the prober, the report),
// not figures.
func TestDNSHarnessSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: run the tests as root")
	}
	if _, err := os.Stat(KxdpgunPath); err != nil {
		t.Fatal("kxdpgun not installed: run scripts/install-deps.sh (Debian knot-dnsutils)")
	}
	if testing.Short() {
		t.Skip("short")
	}
	bin := t.TempDir()
	if err := testbed.GoBuild(bin, "..", "./cmd/santad", "./cmd/santa"); err != nil {
		t.Fatal(err)
	}
	const names = 2000
	plan := PlanDNS([]string{testbed.KindNSD}, nil, []int{100}, nil, names)
	var cases []DNSCase
	for _, c := range plan {
		if c.Name == "nsd" || c.Name == "nsd-zipf-100" {
			cases = append(cases, c)
		}
	}
	if len(cases) != 2 {
		t.Fatalf("plan %+v", plan)
	}
	cfg := DNSConfig{
		Config: Config{
			Rates:     []int{30000},
			Duration:  2 * time.Second,
			Reps:      1,
			Placement: testbed.DefaultPlacement,
			ProbeRate: 500,
			Logf:      func(f string, a ...any) { t.Logf(f, a...) },
		},
		ServerRates: []int{30000},
		Names:       names,
		MixQueries:  10000,
		ZipfS:       1,
		Seed:        1,
		TTL:         3600,
		Cases:       cases,
		Bin:         bin,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	rep, err := RunDNS(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rep.Cases {
		sp := saturation(t, c)
		m := sp.Median
		if !proberAnswered(m) || m.LatP50Us <= 0 || m.LatP99Us < m.LatP50Us {
			t.Errorf("%s: prober: %d/%d answered, p50 %.0f p99 %.0f µs", c.Name, m.ProbeAnswered, m.ProbeSent, m.LatP50Us, m.LatP99Us)
		}
		switch c.Name {
		case "nsd":
			if m.ProgID != 0 || m.XDPAnswered != 0 {
				t.Errorf("nsd: program %d, %d answered in XDP", m.ProgID, m.XDPAnswered)
			}
		case "nsd-zipf-100":
			// the top 100 of 2000 names get 58 % of a Zipf (s = 1) mix
			if m.ProgID == 0 || m.XDPShare < 0.45 || m.XDPShare > 0.75 {
				t.Errorf("nsd-zipf-100: program %d, %.0f%% answered in XDP, want about 58%%", m.ProgID, 100*m.XDPShare)
			}
		}
	}
	dir := t.TempDir()
	files, warns, err := rep.WriteFiles(dir, "dns")
	if len(warns) > 0 {
		t.Errorf("plots: %v", warns)
	}
	if err != nil || len(files) < 2 {
		t.Fatalf("write files %v %v", files, err)
	}
	md := rep.Markdown("dns")
	for _, s := range []string{"## DNS", "### (a)", "### (c)", "| nsd-zipf-100 |", "santa dns top --count 100"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
}

// proberAnswered says whether the latency prober sent and got its answers:
// nine in ten, or half in a point the harness marked disturbed (others'
// work kept the server CPU busy, and the server dropped queries).
func proberAnswered(m Sample) bool {
	if m.Disturbed {
		return m.ProbeSent > 0 && m.ProbeAnswered >= m.ProbeSent/2
	}
	return m.ProbeSent > 0 && m.ProbeAnswered >= m.ProbeSent*9/10
}

// saturation is the case's saturation point; it fails the test if the case
// failed or measured nothing.
func saturation(t *testing.T, c CaseResult) *Point {
	t.Helper()
	if c.Error != "" {
		t.Fatalf("%s: %s", c.Name, c.Error)
	}
	sp := c.Sat()
	// The bare reflector's ~0.1 µs per reply can add up to less than one
	// /proc/stat tick (10 ms) of server CPU in a short window: its work is
	// measured by its BPF run-time statistics instead.
	measured := sp != nil && (sp.Median.ServerBusy > 0 || c.Name == CaseReflector && sp.Median.BPFRunCnt > 0)
	if sp == nil || sp.Median.Replies == 0 || !measured {
		t.Fatalf("%s: no result: %+v", c.Name, sp)
	}
	return sp
}

// The memcached benchmark end to end on a small key set: memcached alone,
// the reflector and the top 100 keys offloaded under the mixed workload
// (SETs included), with mcgen's load and the prober; the report renders.
func TestMCHarnessSmoke(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("needs root: run the tests as root")
	}
	bin := t.TempDir()
	if err := testbed.GoBuild(bin, "..", "./cmd/santad", "./cmd/santa"); err != nil {
		t.Fatal(err)
	}
	const keys = 5000
	cases, err := SelectCases(PlanMC([]int{100}, keys), "memcached,reflector,santa-top-100", func(c MCCase) string { return c.Name })
	if err != nil {
		t.Fatal(err)
	}
	cfg := MCConfig{
		Config: Config{
			Rates:     []int{40000},
			Duration:  2 * time.Second,
			Reps:      1,
			Placement: testbed.DefaultPlacement,
			ProbeRate: 500,
			Logf:      func(f string, a ...any) { t.Logf(f, a...) },
		},
		ServerRates: []int{30000},
		Keys:        keys,
		MixRequests: 20000,
		ZipfS:       0.99,
		SetShare:    0.002,
		Seed:        1,
		Refresh:     5 * time.Millisecond,
		Cases:       cases,
		Bin:         bin,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	rep, err := RunMemcached(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Cases) != 3 {
		t.Fatalf("%d cases measured", len(rep.Cases))
	}
	for _, c := range rep.Cases {
		sp := saturation(t, c)
		m, meta := sp.Median, rep.Meta[c.Name]
		if ratio(m.Replies, m.Sent) < 0.95 {
			t.Errorf("%s: %d of %d requests answered at %d/s", c.Name, m.Replies, m.Sent, sp.OfferedQPS)
		}
		switch c.Name {
		case "memcached":
			if m.ProgID != 0 || m.XDPAnswered != 0 {
				t.Errorf("memcached: program %d, %d answered in XDP", m.ProgID, m.XDPAnswered)
			}
		case "reflector":
			if m.ProgID == 0 || m.ProbeSent != 0 {
				t.Errorf("reflector: program %d, %d probes", m.ProgID, m.ProbeSent)
			}
		case "santa-top-100":
			// The top 100 of 5000 keys get about 60 % of a Zipf (0.99) mix;
			// SETs retire rules for a few ms each.
			if meta.Offloaded < 0.5 || meta.Offloaded > 0.7 || m.XDPShare < meta.Offloaded-0.15 || m.XDPShare > meta.Offloaded+0.02 {
				t.Errorf("santa-top-100: %.0f%% of the mix offloaded, %.0f%% answered in XDP", 100*meta.Offloaded, 100*m.XDPShare)
			}
			if !strings.HasPrefix(rep.Done[c.Name], "100 keys offloaded,") || strings.Contains(rep.Done[c.Name], " 0 rebuilt,") {
				t.Errorf("santa-top-100: controller reported %q, want 100 keys offloaded and some rebuilt after SETs", rep.Done[c.Name])
			}
		}
		if c.Name != "reflector" && (!proberAnswered(m) || m.LatP50Us <= 0) {
			t.Errorf("%s: prober: %d/%d answered, p50 %.0f µs", c.Name, m.ProbeAnswered, m.ProbeSent, m.LatP50Us)
		}
	}
	dir := t.TempDir()
	files, warns, err := rep.WriteFiles(dir, "memcached")
	if len(warns) > 0 {
		t.Errorf("plots: %v", warns)
	}
	if err != nil || len(files) < 2 {
		t.Fatalf("write files %v %v", files, err)
	}
	md := rep.Markdown("memcached")
	for _, s := range []string{"## memcached", "| santa-top-100 |", "× reflector", "`santa-top-100`: 100 keys offloaded"} {
		if !strings.Contains(md, s) {
			t.Errorf("markdown lacks %q", s)
		}
	}
}
