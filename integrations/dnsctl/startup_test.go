package dnsctl_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/integrations/dnsctl"
	"github.com/santa-offload/santa/internal/testbed"
)

// runUntilExit runs `santa dns ARGS` in the server namespace until it
// exits by itself (it must within 30 s) and returns its output and how it
// ended: for a controller that must refuse to start.
func (r *rig) runUntilExit(args ...string) (string, error) {
	r.t.Helper()
	return r.runUntilExitIn(r.tb.Server.NS, args...)
}

// runUntilExitIn is runUntilExit in network namespace ns.
func (r *rig) runUntilExitIn(ns string, args ...string) (string, error) {
	r.t.Helper()
	argv := testbed.ControllerArgv(filepath.Join(bin, "santa"), ns, r.santad.Socket, "dns", args...)
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

// serveChangedZone has the server load its zone again with serial and
// every record passed through edit (NSD: SIGHUP; Knot: knotc zone-reload).
func (r *rig) serveChangedZone(serial string, edit func(record string) string) {
	r.t.Helper()
	r.serveChanged(r.srv.Proc().Zone, serial, edit)
}

// serveChanged is serveChangedZone for z, one of the zones the server
// serves, whose serial is 2024010101.
func (r *rig) serveChanged(z testbed.Zone, serial string, edit func(record string) string) {
	r.t.Helper()
	proc := r.srv.Proc()
	zone := z
	zone.Records = nil
	for _, rec := range z.Records {
		zone.Records = append(zone.Records, edit(strings.Replace(rec, "2024010101", serial, 1)))
	}
	f, err := os.Create(proc.ZoneFileOf(z.Origin))
	if err != nil {
		r.t.Fatal(err)
	}
	if _, err := zone.WriteTo(f); err != nil {
		r.t.Fatal(err)
	}
	f.Close()
	switch r.srv.Name() {
	case testbed.KindNSD:
		err = syscall.Kill(proc.PID(), syscall.SIGHUP)
	case testbed.KindKnot:
		var out []byte
		out, err = exec.Command(testbed.KnotcPath, "-c", proc.Conf, "zone-reload", z.Origin).CombinedOutput()
		if err != nil {
			err = fmt.Errorf("knotc zone-reload: %v: %s", err, out)
		}
	default:
		err = fmt.Errorf("no zone reload for %s", r.srv.Name())
	}
	if err != nil {
		r.t.Fatal(err)
	}
}

// TestNotifyWithoutPolling: with --poll 0 and --notify, a NOTIFY for the
// zone makes the controller check it at once: the changed answer reaches
// the rule.
func TestNotifyWithoutPolling(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www := "www." + r.zone.Origin
	const notifyAt = "127.0.0.1:5354"
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{www}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--poll", "0", "--notify", notifyAt)
	if got, kernel := r.dig(www, "A"); got != testbed.ExampleWWW4.String() || !kernel {
		t.Fatalf("before the change: %q, from the rule processor %v", got, kernel)
	}
	r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, "198.18.255.10", "198.18.255.99", 1) })
	notify := new(dns.Msg)
	notify.SetNotify(r.zone.Origin)
	deadline := time.Now().Add(10 * time.Second)
	for {
		// as a server does, NOTIFY until the new serial is seen: NSD may
		// not have loaded the zone at the first one
		err := r.tb.Server.Do(func() error { _, err := dns.Exchange(notify, notifyAt); return err })
		if err != nil {
			t.Fatalf("NOTIFY: %v", err)
		}
		time.Sleep(300 * time.Millisecond)
		got, kernel := r.dig(www, "A")
		if got == "198.18.255.99" && kernel {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("10 s of NOTIFY after the zone change: %q, from the rule processor %v; controller output:\n%s", got, kernel, ctl.Output())
		}
	}
}

// TestWrongZone: a --zone the server does not answer the SOA of (a parent
// it does not serve, a name inside its zone) fails the start with a
// message naming the zone and the server's answer, instead of being polled
// in vain (a change of the real zone would never be noticed).
func TestWrongZone(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	www := "www." + r.zone.Origin
	names := r.namesFile([]string{www}, []uint16{dns.TypeA})
	for _, c := range []struct {
		zone string
		want []string
	}{
		{"com", []string{"zone com.", "REFUSED", "--zone"}},
		{www, []string{"zone " + www, "SOA of " + r.zone.Origin, "--zone"}},
	} {
		out, err := r.runUntilExit("static", "--port", "53/udp", "--names", names, "--zone", c.zone)
		if err == nil || strings.Contains(out, "ready:") || strings.Contains(out, "done:") {
			t.Errorf("--zone %s: the controller started (%v), or printed a done line:\n%s", c.zone, err, out)
		}
		for _, want := range c.want {
			if !strings.Contains(out, want) {
				t.Errorf("--zone %s: the error does not say %q:\n%s", c.zone, want, out)
			}
		}
	}
}

// TestSerialLearnedLate: a zone's serial learned only after its answers were
// asked for (the start's SOA poll got no reply in time, as on a loaded
// host) counts as a change when it is learned, so the NOTIFY or poll that
// learns it refreshes the answers, which may be older than that serial. It
// was taken as the zone's first serial: a change made before it went
// unnoticed until the next one (TestNotifyWithoutPolling failed so once).
func TestSerialLearnedLate(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	v4, _ := r.srv.Addrs()
	var asker *dnsctl.Asker
	err := r.tb.Server.Do(func() (err error) {
		asker, err = dnsctl.NewAsker(v4, 1, time.Second, 2)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer asker.Close()
	first, second := dnsctl.PollNewZone(asker, r.zone.Origin)
	if !first {
		t.Errorf("the zone's serial learned after its answers was not taken as a change")
	}
	if second {
		t.Errorf("the same serial polled again was taken as a change")
	}
}

// TestFailedAttachLeavesNoRuleSet: a start that fails after santad made
// rule sets for the server's sockets removes them again. Left behind, a
// TCP listener's empty rule set has eBPF answer the server's TCP
// handshakes and hand each connection over. The failures: --pid and --fd
// naming the server's TCP listener (refused with a message that says so,
// and no --follow hint: --follow needs --port), and a --server address
// that cannot be asked.
func TestFailedAttachLeavesNoRuleSet(t *testing.T) {
	r := newRig(t, testbed.KindKnot, 0)
	names := r.namesFile([]string{"www." + r.zone.Origin}, []uint16{dns.TypeA})
	ss, err := exec.Command("nsenter", "--net=/run/netns/"+r.tb.Server.NS, "ss", "-Htlpn", "sport", "= :53").Output()
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`pid=(\d+),fd=(\d+)`).FindStringSubmatch(string(ss))
	if m == nil {
		t.Fatalf("no TCP listener on port 53 in ss -tlpn:\n%s", ss)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--pid", m[1], "--fd", m[2]}, "fd " + m[2] + " of pid " + m[1] + " is not a UDP socket"},
		{[]string{"--port", "53/udp", "--server", "198.19.255.77"}, "198.19.255.77"},
	} {
		out, err := r.runUntilExit(append([]string{"static", "--names", names}, c.args...)...)
		if err == nil || !strings.Contains(out, c.want) || strings.Contains(out, "--follow") {
			t.Errorf("with %v: %v, want an error with %q and no --follow hint:\n%s", c.args, err, c.want, out)
		}
		if info, _ := r.health(); info.Sockets != 0 {
			t.Errorf("with %v: santad holds %d rule sets after the controller failed", c.args, info.Sockets)
		}
	}
}

// TestOtherNamespaceRefused: santa dns run outside santad's network
// namespace, here the client's, refuses to start, saying where to run it,
// and leaves no rule set. (It asked whatever answered at the server's
// addresses there, here the server itself through the rule processor,
// elsewhere another server or nobody, and installed its answers.)
func TestOtherNamespaceRefused(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	out, err := r.runUntilExitIn(r.tb.Client.NS, "static", "--port", "53/udp", "--duration", "3s",
		"--names", r.namesFile([]string{"www." + r.zone.Origin}, []uint16{dns.TypeA}))
	if err == nil || !strings.Contains(out, "not in this one: run santa dns in it") || strings.Contains(out, "ready:") {
		t.Errorf("run in the client's network namespace: %v, want a refusal that says where to run it:\n%s", err, out)
	}
	if info, _ := r.health(); info.Sockets != 0 {
		t.Errorf("santad holds %d rule sets after the controller was refused", info.Sockets)
	}
}

// TestHangupStops: SIGHUP (the controller's terminal closed) stops the
// controller as SIGTERM does: it deletes its rules and prints its done
// line. (Go's default killed it, leaving rules that answered without
// following zone changes until their TTL ran out.)
func TestHangupStops(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{"www." + r.zone.Origin}, []uint16{dns.TypeA}))
	if err := syscall.Kill(ctl.PID(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	if exited, err := ctl.Wait(10 * time.Second); !exited || err != nil {
		t.Fatalf("after SIGHUP: exited %v (%v)", exited, err)
	}
	if !strings.Contains(ctl.Output(), "done:") {
		t.Errorf("no done line after SIGHUP:\n%s", ctl.Output())
	}
	if n := r.rules(); n != 0 {
		t.Errorf("%d rules left after SIGHUP", n)
	}
}

// TestStopBeforeReady: a stop (SIGTERM, --duration) while the controller
// still installs its first rules, here beside a hung server, is no
// failure: it prints its done line and exits 0. (It failed with "santa:
// context deadline exceeded", or "context canceled" on SIGTERM.)
func TestStopBeforeReady(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	r.hangServer()
	out, err := r.runUntilExit("static", "--port", "53/udp", "--duration", "1500ms",
		"--names", r.namesFile([]string{"www." + r.zone.Origin}, []uint16{dns.TypeA}))
	if err != nil || !strings.Contains(out, "done:") || strings.Contains(out, "ready:") || strings.Contains(out, "context") {
		t.Errorf("stopped by --duration before it was ready: %v, want a done line and no error:\n%s", err, out)
	}
}
