package dnsctl_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// runUntilExit runs `santa dns ARGS` in the server namespace until it
// exits by itself (it must within 30 s) and returns its output and how it
// ended: for a controller that must refuse to start.
func (r *rig) runUntilExit(args ...string) (string, error) {
	r.t.Helper()
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), r.tb.Server.NS, r.santad.Socket, "dns", args...)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, argv[0], argv[1:]...).CombinedOutput()
	if ctx.Err() != nil {
		r.t.Fatalf("santa dns %v did not exit within 30 s:\n%s", args, out)
	}
	return string(out), err
}

// TestBadNotifyAddress: an address --notify cannot listen on fails the
// start before the controller attaches or installs anything: no rule ever
// answers, and there is no ready line.
func TestBadNotifyAddress(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	out, err := r.runUntilExit("static", "--port", "53/udp", "--names", r.namesFile([]string{"www." + r.zone.Origin}, []uint16{dns.TypeA}),
		"--notify", "garbage")
	if err == nil || !strings.Contains(out, "listen for NOTIFY on garbage") {
		t.Errorf("with --notify garbage: %v, want an error naming the address:\n%s", err, out)
	}
	for _, never := range []string{"ready:", "msg=attached", "msg=installed"} {
		if strings.Contains(out, never) {
			t.Errorf("with --notify garbage the controller printed %q before it failed:\n%s", never, out)
		}
	}
}
