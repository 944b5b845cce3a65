//go:build linux

package testbed

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// NamedPath, NamedCheckconfPath and NamedCheckzonePath are Debian's
// locations of BIND 9 (package bind9, bind9-utils).
var (
	NamedPath          = "/usr/sbin/named"
	NamedCheckconfPath = "/usr/bin/named-checkconf"
	NamedCheckzonePath = "/usr/bin/named-checkzone"
)

// BIND is a running named in the server namespace of a testbed.
type BIND struct{ *DNSProcess }

// StartBIND writes o.Zone and a named.conf under a temp dir and starts
// named in the server namespace (foreground, -n o.Workers -U o.Workers),
// listening on the server's IPv4 and IPv6 addresses. It returns once named
// answers an SOA query from the client namespace; named is stopped by Stop
// or when the testbed closes.
//
// The config is authoritative only (recursion no, no DNSSEC validation, no
// empty zones), has no control channel (controls { }; rndc cannot reach
// it, nothing listens on 953), no zone transfers, updates or NOTIFY, no
// rate limiting (BIND has none unless configured), logs to a file in Dir
// and keeps every file under Dir. named runs as the starting user (no -u)
// without chroot. It has no CPU affinity option: with o.Pin it starts
// under taskset and every thread is re-pinned once it answers.
func (tb *Testbed) StartBIND(o DNSServerOptions) (*BIND, error) {
	p, err := tb.startDNS(bindLaunch, o)
	if err != nil {
		return nil, err
	}
	return &BIND{p}, nil
}

// bindQuote quotes a string for named.conf.
func bindQuote(s string) string { return strconv.Quote(s) }

var bindLaunch = dnsLaunch{
	kind:    KindBIND,
	conf:    "named.conf",
	logFile: "named.log",
	config: func(p *DNSProcess, o DNSServerOptions) string {
		q := bindQuote
		var c strings.Builder
		fmt.Fprintf(&c, `// Written by internal/testbed for testbed %s.
options {
	directory %s;
	pid-file %s;
	lock-file %s;
	session-keyfile %s;
	managed-keys-directory %s;
	dump-file %s;
	statistics-file %s;
	memstatistics-file %s;
	listen-on port %d { %s; };
	listen-on-v6 port %d { %s; };
	automatic-interface-scan no;
	recursion no;
	allow-query { any; };
	allow-transfer { none; };
	allow-update { none; };
	notify no;
	dnssec-validation no;
	empty-zones-enable no;
	version none;
	hostname none;
	server-id none;
	querylog no;
	geoip-directory none;
`, p.tb.ID, q(p.Dir), q(p.Dir+"/named.pid"), q(p.Dir+"/named.lock"), q(p.Dir+"/session.key"), q(p.Dir),
			q(p.Dir+"/named_dump.db"), q(p.Dir+"/named.stats"), q(p.Dir+"/named.memstats"),
			o.Port, p.Addr4.Addr(), o.Port, p.Addr6.Addr())
		for _, l := range o.Extra {
			fmt.Fprintf(&c, "\t%s\n", l)
		}
		fmt.Fprintf(&c, `};

controls { };

logging {
	channel testbed {
		file %s;
		severity info;
		print-time yes;
		print-severity yes;
		print-category yes;
	};
	category default { testbed; };
	category unmatched { testbed; };
};
`, q(p.LogFile))
		for _, z := range p.zones() {
			fmt.Fprintf(&c, "\nzone %s {\n\ttype primary;\n\tfile %s;\n};\n", q(z.Origin), q(p.ZoneFileOf(z.Origin)))
		}
		return c.String()
	},
	check: func(p *DNSProcess) error {
		if err := runCheck(NamedCheckconfPath, p.Conf); err != nil {
			return err
		}
		// Integrity checks as named's own, except the sibling glue check,
		// which takes 3/4 of the time (15 s for a million names).
		return runCheck(NamedCheckzonePath, "-i", "full-sibling", p.Zone.Origin, p.ZoneFile)
	},
	argv: func(p *DNSProcess, o DNSServerOptions) []string {
		n := strconv.Itoa(o.Workers)
		return []string{NamedPath, "-f", "-c", p.Conf, "-n", n, "-U", n}
	},
	// "zone example.test/IN: not loaded due to errors."
	loadFailed: regexp.MustCompile(`not loaded due to errors`),
}
