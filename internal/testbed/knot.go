//go:build linux

package testbed

import (
	"fmt"
	"regexp"
	"strings"
)

// KnotPath and KnotcPath are Debian's locations of Knot DNS (package knot).
var (
	KnotPath  = "/usr/sbin/knotd"
	KnotcPath = "/usr/sbin/knotc"
)

// Knot is a running knotd in the server namespace of a testbed.
type Knot struct{ *DNSProcess }

// StartKnot writes o.Zone and a knot.conf under a temp dir and starts knotd
// in the server namespace, listening on the server's IPv4 and IPv6
// addresses. It returns once knotd answers an SOA query from the client
// namespace; knotd is stopped by Stop or when the testbed closes.
//
// The config keeps everything under Dir (rundir, pidfile, databases, log
// file, control socket), runs as the starting user (no "user:"), has its
// control interface only on a UNIX socket in Dir, udp-workers o.Workers,
// tcp-workers 1, background-workers 1, no modules (so no RRL), no ACLs (so
// no zone transfers or updates), no journal and no zone file sync-back.
//
// knotd pins each UDP worker thread itself (worker i to CPU i mod #CPUs),
// and has no option for it. With o.Pin every thread is re-pinned to o.CPU
// once knotd answers; without, every thread gets all CPUs back, so an
// unpinned knotd is unpinned like NSD and named.
func (tb *Testbed) StartKnot(o DNSServerOptions) (*Knot, error) {
	p, err := tb.startDNS(knotLaunch, o)
	if err != nil {
		return nil, err
	}
	return &Knot{p}, nil
}

// knotQuote quotes a string for knot.conf (YAML-like; paths in the temp dir
// have no quotes or backslashes).
func knotQuote(s string) string { return `"` + s + `"` }

var knotLaunch = dnsLaunch{
	kind:    KindKnot,
	conf:    "knot.conf",
	logFile: "knot.log",
	config: func(p *DNSProcess, o DNSServerOptions) string {
		var c strings.Builder
		fmt.Fprintf(&c, `# Written by internal/testbed for testbed %s.
server:
    rundir: %s
    pidfile: %s
    listen: [ %s, %s ]
    udp-workers: %d
    tcp-workers: 1
    background-workers: 1
    identity: ""
    version: ""
    nsid: ""
`, p.tb.ID, knotQuote(p.Dir), knotQuote(p.Dir+"/knot.pid"),
			knotQuote(fmt.Sprintf("%s@%d", p.Addr4.Addr(), o.Port)),
			knotQuote(fmt.Sprintf("%s@%d", p.Addr6.Addr(), o.Port)), o.Workers)
		for _, l := range o.Extra {
			fmt.Fprintf(&c, "    %s\n", l)
		}
		fmt.Fprintf(&c, `
log:
  - target: %s
    any: info

database:
    storage: %s

control:
    listen: %s

template:
  - id: default
    storage: %s
    zonefile-sync: -1
    zonefile-load: whole
    journal-content: none

zone:
`, knotQuote(p.LogFile), knotQuote(p.Dir), knotQuote(p.Dir+"/knot.sock"), knotQuote(p.Dir))
		for _, z := range p.zones() {
			fmt.Fprintf(&c, "  - domain: %s\n    file: %s\n", knotQuote(z.Origin), knotQuote(p.ZoneFileOf(z.Origin)))
		}
		return c.String()
	},
	check: func(p *DNSProcess) error { return runCheck(KnotcPath, "-c", p.Conf, "conf-check") },
	argv: func(p *DNSProcess, o DNSServerOptions) []string {
		return []string{KnotPath, "-c", p.Conf}
	},
	unpin: true,
	// "[example.test.] zone event 'load' failed (failed)"
	loadFailed: regexp.MustCompile(`zone event 'load' failed`),
}
