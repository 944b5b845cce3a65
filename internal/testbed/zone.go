//go:build linux

package testbed

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"net/netip"
	"strconv"
	"strings"
)

// ZoneOrigin is the zone the testbed's servers serve by default.
const ZoneOrigin = "example.test."

// Zone is a zone file to serve: a fixed set of records plus, optionally,
// Generated synthetic names (see GenName) and a list of Names (see
// NamesZone).
type Zone struct {
	Origin    string   // e.g. "example.test."
	Records   []string // zone file lines, relative to Origin; SOA and NS included
	Generated int      // adds GenName(0..Generated-1) with an A record each
	// Names are absolute, distinct names under Origin; Names[i] gets the A
	// record NameAddr4(i) and, with NamesAAAA, the AAAA record NameAddr6(i).
	Names     []string
	NamesAAAA bool
	// TTL is the zone's default TTL ($TTL) in seconds; 0: 300.
	TTL int
	// Signed serves the zone signed with DNSSEC (NSEC, one ECDSA P-256
	// key-signing and one zone-signing key, made by BIND's dnssec-keygen
	// and dnssec-signzone), as a pre-signed zone file.
	Signed bool
	// NSEC3 signs it with NSEC3 (no salt, no extra iterations) instead.
	NSEC3 bool
}

// ExampleZone is example.test. with SOA, NS, glue, a few A/AAAA/TXT/MX/CNAME
// records, a name with three A records, a delegation, a wildcard, a TXT
// record of over 500 bytes and generated extra names. The server's
// addresses are those of tb's server side.
func (tb *Testbed) ExampleZone(generated int) Zone {
	return ExampleZone(tb.Server.IP4, tb.Server.IP6, generated)
}

// ExampleZone builds the example zone for a name server at ip4/ip6.
func ExampleZone(ip4, ip6 netip.Addr, generated int) Zone {
	return Zone{
		Origin: ZoneOrigin,
		Records: []string{
			"@     IN SOA  ns1 hostmaster 2024010101 3600 900 604800 300",
			"@     IN NS   ns1",
			"ns1   IN A    " + ip4.String(),
			"ns1   IN AAAA " + ip6.String(),
			"@     IN A    198.18.255.1",
			"@     IN MX   10 mail",
			"www   IN A    198.18.255.10",
			"www   IN AAAA 2001:2:0:ff::10",
			"mail  IN A    198.18.255.25",
			"mail  IN AAAA 2001:2:0:ff::25",
			`txt   IN TXT  "hello from the testbed"`,
			`www   IN TXT  "v=spf1 -all"`,
			"alias IN CNAME www",
			// a round-robin name: servers may rotate its three records
			"rr    IN A    198.18.255.31",
			"rr    IN A    198.18.255.32",
			"rr    IN A    198.18.255.33",
			// a delegation (referrals, with glue), a wildcard, and an
			// answer too long for 512 bytes (truncated without EDNS)
			"sub   IN NS   ns1.sub",
			"sub   IN NS   ns2.sub",
			"ns1.sub IN A  198.18.255.53",
			"ns2.sub IN A  198.18.255.54",
			"*.wild IN A   198.18.255.44",
			`big   IN TXT  "` + strings.Repeat("0123456789", 25) + `" "` + strings.Repeat("abcdefghij", 25) + `"`,
		},
		Generated: generated,
	}
}

// Well-known answers of ExampleZone, for tests.
var (
	ExampleWWW4 = netip.MustParseAddr("198.18.255.10")
	ExampleWWW6 = netip.MustParseAddr("2001:2:0:ff::10")
)

// NamesNS is the name server name of NamesZone (in the root zone itself;
// no generated top-list name ends in ".testbed.").
const NamesNS = "ns1.testbed."

// NamesZone is a root zone (origin ".") with SOA, NS (NamesNS with glue
// ip4/ip6) and one A record per name: names[i] has NameAddr4(i). The names
// must be distinct absolute names, e.g. from dnsnames.TopListNames. Set
// NamesAAAA on the result to add AAAA records NameAddr6(i).
func NamesZone(names []string, ip4, ip6 netip.Addr) Zone {
	return Zone{
		Origin: ".",
		Records: []string{
			"@ IN SOA " + NamesNS + " hostmaster.testbed. 2024010101 3600 900 604800 300",
			"@ IN NS " + NamesNS,
			NamesNS + " IN A " + ip4.String(),
			NamesNS + " IN AAAA " + ip6.String(),
		},
		Names: names,
	}
}

// NamesZone is NamesZone for tb's server addresses.
func (tb *Testbed) NamesZone(names []string) Zone {
	return NamesZone(names, tb.Server.IP4, tb.Server.IP6)
}

// NameAddr4 is the A record of Names[i] of a zone: 198.18.0.0 + i, wrapping
// in 198.18.0.0/15 (every 131072 names).
func NameAddr4(i int) netip.Addr {
	v := uint32(198)<<24 + uint32(18)<<16 + uint32(i)&(1<<17-1)
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// NameAddr6 is the AAAA record of Names[i]: 2001:2:0:ffff::/64 + i.
func NameAddr6(i int) netip.Addr {
	b := [16]byte{0x20, 0x01, 0x00, 0x02, 0x00, 0x00, 0xff, 0xff}
	binary.BigEndian.PutUint64(b[8:], uint64(i))
	return netip.AddrFrom16(b)
}

// GenName is the i-th generated name of a zone: "h<i>.<origin>".
func GenName(origin string, i int) string { return "h" + strconv.Itoa(i) + "." + origin }

// GenAddr is the A record of the i-th generated name: 198.19.0.0 + i
// (wrapping in 198.19.0.0/16).
func GenAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
}

// RecordCount is the number of records (lines) of the zone.
func (z Zone) RecordCount() int {
	n := len(z.Records) + z.Generated + len(z.Names)
	if z.NamesAAAA {
		n += len(z.Names)
	}
	return n
}

// WriteTo writes the zone file. It streams: a million names take no memory
// beyond the names themselves.
func (z Zone) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	cw := &countWriter{w: bw}
	ttl := z.TTL
	if ttl <= 0 {
		ttl = 300
	}
	fmt.Fprintf(cw, "$ORIGIN %s\n$TTL %d\n", z.Origin, ttl)
	for _, r := range z.Records {
		fmt.Fprintln(cw, r)
	}
	line := make([]byte, 0, 128)
	for i := 0; i < z.Generated && cw.err == nil; i++ {
		line = append(line[:0], 'h')
		line = strconv.AppendInt(line, int64(i), 10)
		line = append(line, " IN A "...)
		line = GenAddr(i).AppendTo(line)
		line = append(line, '\n')
		cw.Write(line)
	}
	for i, name := range z.Names {
		if cw.err != nil {
			break
		}
		line = append(line[:0], name...)
		line = append(line, " IN A "...)
		line = NameAddr4(i).AppendTo(line)
		line = append(line, '\n')
		if z.NamesAAAA {
			line = append(line, name...)
			line = append(line, " IN AAAA "...)
			line = NameAddr6(i).AppendTo(line)
			line = append(line, '\n')
		}
		cw.Write(line)
	}
	if err := bw.Flush(); err != nil && cw.err == nil {
		return cw.n, err
	}
	return cw.n, cw.err
}

type countWriter struct {
	w   io.Writer
	n   int64
	err error
}

func (c *countWriter) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	c.err = err
	return n, err
}
