package daemon_test

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/santa-offload/santa/api"
	santa "github.com/santa-offload/santa/clients/go/santa"
	"github.com/santa-offload/santa/internal/testbed"
)

// TestRestartTooSmall: a santad restarted with less room than its journal's
// rules need refuses to start and says what to raise; the rules it could
// not take over keep answering, and a santad with room again restores them
// all.
func TestRestartTooSmall(t *testing.T) {
	tb := testbed.New(t)
	small := filepath.Join(t.TempDir(), "small.yaml") // made first: it outlives santad's cleanup
	if err := os.WriteFile(small, []byte("dataplane:\n  max_rules: 5\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	sd := newSantad(t, tb)
	sd.start()
	server := netip.AddrPortFrom(tb.Server.IP4, 7901)
	c := sd.client()
	conn, cookie := boundEchoServer(t, tb, c, server)
	defer conn.Close()
	var rules []api.Rule
	for i := range 10 {
		rules = append(rules, rule(fmt.Sprintf("ask %d", i), 0, fmt.Sprintf("answer %d", i)))
	}
	if _, err := c.Add(santa.Cookie(cookie), rules); err != nil {
		t.Fatal(err)
	}
	sd.stop(syscall.SIGTERM)

	args := slices.Clone(sd.Args)
	sd.Args = append(sd.Args, "--config", small)
	err := sd.Start(context.Background())
	if err == nil || !strings.Contains(err.Error(), "raise santad's dataplane.max_rules") {
		t.Fatalf("santad with max_rules 5 and 10 rules in its journal: %v, want a refusal to start that names max_rules", err)
	}
	t.Logf("santad refused: %v", err)
	for i := range 10 {
		if got, want := exchange(t, tb, server, fmt.Sprintf("ask %d", i)), fmt.Sprintf("answer %d", i); got != want {
			t.Fatalf("with no santad running: %q, want %q from the rule left by the first santad", got, want)
		}
	}

	sd.Args = args
	sd.start()
	got, err := sd.client().ListRules(santa.Cookie(cookie))
	if err != nil || len(got) != 10 {
		t.Fatalf("santad with room again holds %d rules (%v), want all 10", len(got), err)
	}
}
