//go:build linux

package testbed

import (
	"fmt"
	"regexp"
	"strings"
	"time"
)

// NSDPath and NSDCheckconfPath are Debian's locations of NSD.
var (
	NSDPath          = "/usr/sbin/nsd"
	NSDCheckconfPath = "/usr/sbin/nsd-checkconf"
)

// NSDOptions configure StartNSD. The zero value serves ExampleZone(0) on
// port 53 of both server addresses with one server process, unpinned.
type NSDOptions struct {
	Zone        *Zone         // nil: tb.ExampleZone(0)
	MoreZones   []Zone        // served besides Zone
	Port        int           // 0: 53
	ServerCount int           // 0: 1
	Pin         bool          // pin every NSD process to CPU
	CPU         int           // the CPU for Pin
	Extra       []string      // extra lines for the "server:" clause
	Wildcard    bool          // listen on the wildcard addresses, not the server's two
	Timeout     time.Duration // to wait for the first answer; 0: 10 s + 1 s per 20 k records
}

// NSD is a running NSD in the server namespace of a testbed. Dir, Conf,
// Addr4, Addr6, Zone, PID, PIDs, Log and Stop come from DNSProcess.
type NSD struct{ *DNSProcess }

// StartNSD writes a zone and config under a temp dir and starts NSD in the
// server namespace, listening on the server's IPv4 and IPv6 addresses. It
// returns once NSD answers an SOA query from the client namespace. NSD is
// stopped by Stop or when the testbed closes.
//
// The config turns response rate limiting off (Debian's NSD has it on by
// default), has no remote control, no chroot and no user switch (the temp
// dir stays readable), and keeps everything under Dir. With Pin it sets
// cpu-affinity, starts NSD under taskset and re-pins every process once it
// answers.
func (tb *Testbed) StartNSD(o NSDOptions) (*NSD, error) {
	p, err := tb.startDNS(nsdLaunch, DNSServerOptions{
		Zone: o.Zone, MoreZones: o.MoreZones, Port: o.Port, Workers: o.ServerCount,
		Pin: o.Pin, CPU: o.CPU, Extra: o.Extra, Timeout: o.Timeout, Wildcard: o.Wildcard,
	})
	if err != nil {
		return nil, err
	}
	return &NSD{p}, nil
}

var nsdLaunch = dnsLaunch{
	kind:    KindNSD,
	conf:    "nsd.conf",
	logFile: "nsd.log",
	config: func(p *DNSProcess, o DNSServerOptions) string {
		dir := p.Dir
		addrs := fmt.Sprintf("\tip-address: %s\n\tip-address: %s\n", p.Addr4.Addr(), p.Addr6.Addr())
		if o.Wildcard {
			addrs = "" // NSD's default: every address
		}
		var conf strings.Builder
		fmt.Fprintf(&conf, `# Written by internal/testbed for testbed %s.
server:
%s	port: %d
	server-count: %d
	username: ""
	chroot: ""
	zonesdir: "%s"
	database: ""
	zonelistfile: "%s/zone.list"
	xfrdfile: "%s/xfrd.state"
	xfrdir: "%s"
	pidfile: "%s/nsd.pid"
	logfile: "%s"
	verbosity: 1
	hide-version: yes
	reuseport: no
	rrl-ratelimit: 0
	rrl-whitelist-ratelimit: 0
	round-robin: no
`, p.tb.ID, addrs, o.Port, o.Workers, dir, dir, dir, dir, dir, p.LogFile)
		if o.Pin {
			fmt.Fprintf(&conf, "\tcpu-affinity: %d\n", o.CPU)
		}
		for _, l := range o.Extra {
			fmt.Fprintf(&conf, "\t%s\n", l)
		}
		conf.WriteString(`
remote-control:
	control-enable: no
`)
		for _, z := range p.zones() {
			fmt.Fprintf(&conf, `
zone:
	name: "%s"
	zonefile: "%s"
`, z.Origin, p.ZoneFileOf(z.Origin))
		}
		return conf.String()
	},
	check: func(p *DNSProcess) error { return runCheck(NSDCheckconfPath, p.Conf) },
	argv: func(p *DNSProcess, o DNSServerOptions) []string {
		return []string{NSDPath, "-d", "-c", p.Conf}
	},
	// "zone example.test. file /tmp/…/example.test.zone read with 1 errors"
	loadFailed: regexp.MustCompile(`read with [1-9][0-9]* errors`),
}
