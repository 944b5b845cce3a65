package dnsctl

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/miekg/dns"
)

// Question is a name and type to offload (class IN).
type Question struct {
	Name string // fully qualified, as it is sent (letter case kept)
	Type uint16
}

func (q Question) String() string { return q.Name + " " + dns.TypeToString[q.Type] }

// readName reads a domain name from a file as a question's name: fully
// qualified, in the presentation a parsed message has (miekg/dns's escapes:
// a\046b is a\.b, \065 is A), so that the question is the one clients'
// queries for it parse to (learned shapes are matched by name).
func readName(text string) (string, error) {
	buf := make([]byte, 256)
	n, err := dns.PackDomainName(dns.Fqdn(text), buf, 0, nil, false)
	if err != nil {
		return "", fmt.Errorf("%q is not a domain name: %w", text, err)
	}
	name, _, err := dns.UnpackDomainName(buf[:n], 0)
	return name, err
}

// ParseType reads a record type name (A, AAAA, TYPE65, ...).
func ParseType(s string) (uint16, error) {
	if t, ok := dns.StringToType[strings.ToUpper(s)]; ok {
		return t, nil
	}
	if n, ok := strings.CutPrefix(strings.ToUpper(s), "TYPE"); ok {
		if v, err := strconv.ParseUint(n, 10, 16); err == nil {
			return uint16(v), nil
		}
	}
	return 0, fmt.Errorf("unknown record type %q", s)
}

// ReadNames reads a list of questions: one per line, "NAME [TYPE ...]"; a
// line without types asks for defaultTypes. Blank lines and lines starting
// with # are skipped. Errors name the line.
func ReadNames(r io.Reader, source string, defaultTypes []uint16) ([]Question, error) {
	var out []Question
	seen := map[Question]bool{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		name, err := readName(fields[0])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", source, line, err)
		}
		types := defaultTypes
		if len(fields) > 1 {
			types = nil
			for _, f := range fields[1:] {
				t, err := ParseType(f)
				if err != nil {
					return nil, fmt.Errorf("%s:%d: %w", source, line, err)
				}
				types = append(types, t)
			}
		}
		for _, t := range types {
			q := Question{name, t}
			if !seen[q] {
				seen[q] = true
				out = append(out, q)
			}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	return out, nil
}

// ReadZone reads the questions a zone file answers: every (owner, type) in
// it, except the DNSSEC types a resolver never asks for by themselves (RRSIG,
// NSEC, NSEC3), with the owner in lower case. origin is the zone's origin if the file has no $ORIGIN.
// $INCLUDE is followed, as the servers do (a relative path from the
// directory of source), and $GENERATE expanded.
func ReadZone(r io.Reader, source, origin string) ([]Question, error) {
	zp := dns.NewZoneParser(r, dns.Fqdn(origin), source)
	zp.SetIncludeAllowed(true) // the operator's own zone file, as its server reads it
	var out []Question
	seen := map[Question]bool{}
	for rr, ok := zp.Next(); ok; rr, ok = zp.Next() {
		h := rr.Header()
		switch h.Rrtype {
		case dns.TypeRRSIG, dns.TypeNSEC, dns.TypeNSEC3:
			continue
		}
		name, err := readName(h.Name)
		if err != nil {
			return nil, fmt.Errorf("zone file: %w", err)
		}
		// in lower case, as clients ask: the case of a zone file's owner
		// names (WWW, $ORIGIN Example.COM.) says nothing of theirs
		q := Question{strings.ToLower(name), h.Rrtype}
		if !seen[q] {
			seen[q] = true
			out = append(out, q)
		}
	}
	if err := zp.Err(); err != nil {
		return nil, fmt.Errorf("zone file: %w", err)
	}
	return out, nil
}

// ReadTop reads a popularity list and returns its n most popular questions
// (the paper's §5.5 strategy: offload the top n a priori). Each line is
// "NAME TYPE [COUNT]": with counts the list is ranked by count (ties keep
// file order), without them the file order is the rank. Repeated questions
// add up their counts. n <= 0 means all.
func ReadTop(r io.Reader, source string, n int) ([]Question, error) {
	type ranked struct {
		q     Question
		count uint64
		first int
	}
	byQ := map[Question]*ranked{}
	var list []*ranked
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		if len(fields) < 2 || len(fields) > 3 {
			return nil, fmt.Errorf("%s:%d: want NAME TYPE [COUNT], got %d fields", source, line, len(fields))
		}
		name, err := readName(fields[0])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", source, line, err)
		}
		t, err := ParseType(fields[1])
		if err != nil {
			return nil, fmt.Errorf("%s:%d: %w", source, line, err)
		}
		count := uint64(1)
		if len(fields) == 3 {
			if count, err = strconv.ParseUint(fields[2], 10, 64); err != nil {
				return nil, fmt.Errorf("%s:%d: count %q: %v", source, line, fields[2], err)
			}
		}
		q := Question{name, t}
		if e := byQ[q]; e != nil {
			e.count += count
			continue
		}
		e := &ranked{q, count, len(list)}
		byQ[q] = e
		list = append(list, e)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", source, err)
	}
	slices.SortStableFunc(list, func(a, b *ranked) int {
		switch {
		case a.count > b.count:
			return -1
		case a.count < b.count:
			return 1
		}
		return a.first - b.first
	})
	if n > 0 && n < len(list) {
		list = list[:n]
	}
	out := make([]Question, len(list))
	for i, e := range list {
		out[i] = e.q
	}
	return out, nil
}

// openFile opens path, or standard input for "-".
func openFile(path string) (io.ReadCloser, error) {
	if path == "-" {
		return io.NopCloser(os.Stdin), nil
	}
	return os.Open(path)
}

// LoadQuestions reads questions from a names file, a zone file or a top-N
// popularity file (exactly one of them non-empty).
func LoadQuestions(namesFile, zoneFile, zoneOrigin, topFile string, top int, defaultTypes []uint16) ([]Question, error) {
	var path string
	var read func(io.Reader) ([]Question, error)
	switch {
	case namesFile != "":
		path = namesFile
		read = func(r io.Reader) ([]Question, error) { return ReadNames(r, namesFile, defaultTypes) }
	case zoneFile != "":
		path = zoneFile
		read = func(r io.Reader) ([]Question, error) { return ReadZone(r, zoneFile, zoneOrigin) }
	case topFile != "":
		path = topFile
		read = func(r io.Reader) ([]Question, error) { return ReadTop(r, topFile, top) }
	default:
		return nil, nil
	}
	f, err := openFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return read(f)
}
