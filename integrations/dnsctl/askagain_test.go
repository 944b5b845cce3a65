package dnsctl_test

import (
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/santa-offload/santa/internal/testbed"
)

// waitKernelAnswer waits at most timeout for the rule processor to answer
// name/qtype with an answer containing want.
func (r *rig) waitKernelAnswer(name, qtype, want string, timeout time.Duration, ctl *testbed.Controller) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		got, kernel := r.dig(name, qtype)
		if strings.Contains(got, want) && kernel {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s %s after %v: %q, from the rule processor %v (%d rules); controller output:\n%s",
				name, qtype, timeout, got, kernel, r.rules(), ctl.Output())
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// waitNoRules waits at most timeout for santad to hold no rule.
func (r *rig) waitNoRules(timeout time.Duration, ctl *testbed.Controller) {
	r.t.Helper()
	deadline := time.Now().Add(timeout)
	for r.rules() != 0 {
		if time.Now().After(deadline) {
			r.t.Fatalf("%d rules after %v; controller output:\n%s", r.rules(), timeout, ctl.Output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// longTXT is TXT data of about 1450 bytes: more than the EDNS size of the
// tests' shape (1232), so the server truncates its answer.
var longTXT = strings.TrimSpace(strings.Repeat(`"`+strings.Repeat("x", 240)+`" `, 6))

// answeredAgain is what the controller logs when questions it could not
// offload are offloaded after all.
const answeredAgain = "the server answers questions that were not offloaded in a way that can be"

// TestRemovedQuestionBackAfterZoneFix: a given question whose answer
// becomes too long for its shape (Knot truncates it) loses its rule; once
// the zone is fixed (a new serial, knotc zone-reload) the controller asks
// for it again and installs its rule again.
func TestRemovedQuestionBackAfterZoneFix(t *testing.T) {
	r := newRig(t, testbed.KindKnot, 0)
	txt := "txt." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{txt}, []uint16{dns.TypeTXT}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--poll", "200ms")
	r.waitKernelAnswer(txt, "TXT", "hello", 0, ctl)

	r.serveChangedZone("2024010102", func(rec string) string {
		return strings.Replace(rec, `"hello from the testbed"`, longTXT, 1)
	})
	r.waitNoRules(10*time.Second, ctl)
	if !strings.Contains(ctl.Output(), "truncated") {
		t.Errorf("the controller does not say the answer was truncated:\n%s", ctl.Output())
	}

	r.serveChangedZone("2024010103", func(rec string) string { return rec })
	r.waitKernelAnswer(txt, "TXT", "hello", 10*time.Second, ctl)
	if n := r.rules(); n != 2 { // one shape, on the IPv4 and the IPv6 socket
		t.Errorf("%d rules once the zone is fixed, want 2", n)
	}
	if !strings.Contains(ctl.Output(), answeredAgain) {
		t.Errorf("the controller does not say the question is back:\n%s", ctl.Output())
	}
}

// TestRemovedQuestionBackAfterServerStall: a given question whose answer
// could not be refreshed within its TTL (the server stopped) loses its
// rule, and gets it back once the server answers again.
func TestRemovedQuestionBackAfterServerStall(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0, "short 4 IN A 198.18.255.77")
	short := "short." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{short}, []uint16{dns.TypeA}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--poll", "0")
	r.waitKernelAnswer(short, "A", "198.18.255.77", 0, ctl)
	pids, err := r.srv.PIDs()
	if err != nil {
		t.Fatal(err)
	}
	stopped := true
	resume := func() {
		for _, p := range pids {
			syscall.Kill(p, syscall.SIGCONT)
		}
		stopped = false
	}
	defer func() {
		if stopped {
			resume()
		}
	}()
	for _, p := range pids {
		syscall.Kill(p, syscall.SIGSTOP)
	}
	time.Sleep(6 * time.Second)
	if n := r.rules(); n != 0 {
		t.Errorf("%d rules after 6 s with the server stopped and a TTL of 4 s", n)
	}
	resume()
	r.waitKernelAnswer(short, "A", "198.18.255.77", 15*time.Second, ctl)
	for _, want := range []string{"answers not refreshed in time", answeredAgain} {
		if !strings.Contains(ctl.Output(), want) {
			t.Errorf("the controller does not say %q:\n%s", want, ctl.Output())
		}
	}
}

// TestRefusedAtStartBackOnZoneChange: a given question whose answer cannot
// be offloaded when the controller starts (Knot truncates it) is asked
// again, and at once when its zone changes: long before its backoff would
// ask.
func TestRefusedAtStartBackOnZoneChange(t *testing.T) {
	r := newRig(t, testbed.KindKnot, 0, "long IN TXT "+longTXT)
	long := "long." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{long}, []uint16{dns.TypeTXT}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--poll", "200ms", "--verbose")
	if want := "(2 questions not offloaded)"; !strings.Contains(ctl.Ready(), want) { // on the IPv4 and the IPv6 socket
		t.Errorf("ready line %q, want %q", ctl.Ready(), want)
	}
	// asked again after 1, 2 and 4 s: the next ask is 8 s away
	if err := ctl.WaitOutput("next_ask_in=8s", 15*time.Second); err != nil {
		t.Fatal(err)
	}
	// the rule must be back before the backoff would ask: 8 s after the
	// line, less a second for the time it took to see it
	backoffAsks := time.Now().Add(7 * time.Second)
	r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, longTXT, `"short now"`, 1) })
	r.waitKernelAnswer(long, "TXT", "short now", time.Until(backoffAsks), ctl)
	if !strings.Contains(ctl.Output(), `"zone changed"`) {
		t.Errorf("the controller does not say the zone changed:\n%s", ctl.Output())
	}
	if n := r.rules(); n != 2 {
		t.Errorf("%d rules once the answer fits, want 2", n)
	}
	if err := ctl.Stop(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	if want := "done: installed 2, refreshed 0, changed 0, removed 2 rules, 0 gone with their sockets; 0 questions not offloaded yet, asked again"; !strings.Contains(ctl.Output(), want) {
		t.Errorf("the controller does not say %q:\n%s", want, ctl.Output())
	}
}

// TestRefusedAfterFollowRestartBackLater: with --follow, a given question
// that the restarted server answers in a way that cannot be offloaded (NSD
// truncates it) is asked again, without polling or NOTIFY after 1, 2, 4,
// ... s, and offloaded once its answer fits.
func TestRefusedAfterFollowRestartBackLater(t *testing.T) {
	r := newRig(t, testbed.KindNSD, 0)
	txt := "txt." + r.zone.Origin
	ctl := r.startController("static", "--port", "53/udp", "--names", r.namesFile([]string{txt}, []uint16{dns.TypeTXT}),
		"--shape", "rd,ad,edns", "--learn-shapes=false", "--poll", "0", "--follow")
	r.waitKernelAnswer(txt, "TXT", "hello", 0, ctl)

	zone := r.srv.Proc().Zone
	if err := r.srv.Stop(); err != nil {
		t.Fatal(err)
	}
	var records []string
	for _, rec := range zone.Records {
		records = append(records, strings.Replace(rec, `"hello from the testbed"`, longTXT, 1))
	}
	zone.Records = records
	srv, err := r.tb.StartDNSServer(testbed.KindNSD, testbed.DNSServerOptions{Zone: &zone})
	if err != nil {
		t.Fatal(err)
	}
	r.srv = srv
	// the second ready line: both sockets' queries refused
	if err := ctl.WaitOutput("(2 questions not offloaded)", 15*time.Second); err != nil {
		t.Fatal(err)
	}
	r.serveChangedZone("2024010102", func(rec string) string { return strings.Replace(rec, longTXT, `"hello again"`, 1) })
	r.waitKernelAnswer(txt, "TXT", "hello again", 10*time.Second, ctl)
}
