package dnsnames

import (
	"bytes"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/miekg/dns"
)

func TestTopListNamesDeterministic(t *testing.T) {
	a := TopListNames(5000, 42)
	b := TopListNames(5000, 42)
	if !slices.Equal(a, b) {
		t.Fatal("same seed, different lists")
	}
	if p := TopListNames(1000, 42); !slices.Equal(p, a[:1000]) {
		t.Error("a shorter list is not a prefix of a longer one")
	}
	c := TopListNames(5000, 43)
	same := 0
	for i := range a {
		if a[i] == c[i] {
			same++
		}
	}
	if same > 50 {
		t.Errorf("seeds 42 and 43 share %d of 5000 positions", same)
	}
	// Pin the sequence: a change of the generator changes every benchmark
	// that uses it, so it must be deliberate (update these then).
	if a[0] != "resfayyg-hiers.com." || a[1] != "gadgrinomuce.gov." || a[4999] != "votl.ru." {
		t.Errorf("generator output changed: %q %q ... %q", a[0], a[1], a[4999])
	}
	if len(TopListNames(0, 1)) != 0 {
		t.Error("n=0 not empty")
	}
}

// validName checks what the servers and kxdpgun need: absolute, lower-case
// LDH labels of 1–63 characters, no leading or trailing hyphen, at most 253
// characters.
func validName(t *testing.T, n string) bool {
	t.Helper()
	if !dns.IsFqdn(n) {
		t.Errorf("%q not fully qualified", n)
		return false
	}
	if _, ok := dns.IsDomainName(n); !ok {
		t.Errorf("%q: not a domain name", n)
		return false
	}
	if len(n)-1 > 253 {
		t.Errorf("%q: longer than 253", n)
		return false
	}
	if dns.CanonicalName(n) != n {
		t.Errorf("%q: not lower case", n)
		return false
	}
	for _, l := range dns.SplitDomainName(n) {
		if len(l) < 1 || len(l) > 63 {
			t.Errorf("%q: label %q length %d", n, l, len(l))
			return false
		}
		if l[0] == '-' || l[len(l)-1] == '-' {
			t.Errorf("%q: label %q starts or ends with a hyphen", n, l)
			return false
		}
		if len(l) >= 4 && l[2:4] == "--" && !strings.HasPrefix(l, "xn--") {
			t.Errorf("%q: label %q has -- in positions 3-4 (reserved)", n, l)
			return false
		}
		for i := 0; i < len(l); i++ {
			c := l[i]
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				t.Errorf("%q: label %q has %q", n, l, c)
				return false
			}
		}
	}
	return true
}

// split returns a name's subdomain labels, registrable label and public
// suffix, using the generator's tables.
func split(n string) (sub []string, label, suffix string, ok bool) {
	labels := dns.SplitDomainName(n)
	known := func(s string) bool {
		if slices.Contains(tlds.items, s) {
			return true
		}
		for _, w := range suffixes {
			if slices.Contains(w.items, s) {
				return true
			}
		}
		return false
	}
	for k := 2; k >= 1; k-- { // longest suffix first
		if len(labels) <= k {
			continue
		}
		s := strings.Join(labels[len(labels)-k:], ".")
		if known(s) {
			return labels[:len(labels)-k-1], labels[len(labels)-k-1], s, true
		}
	}
	return nil, "", "", false
}

func TestTopListNamesShape(t *testing.T) {
	const n = 100000
	names := TopListNames(n, 1)
	if len(names) != n {
		t.Fatalf("%d names", len(names))
	}
	seen := map[string]bool{}
	var (
		bases, subs, www, twoLevel, com, couk, idn, hyphen, digit int
		lenSum, short, long30                                     int
		maxLen                                                    int
	)
	lenHist := map[int]int{}
	for _, name := range names {
		if seen[name] {
			t.Fatalf("duplicate %q", name)
		}
		seen[name] = true
		if !validName(t, name) {
			t.FailNow()
		}
		sub, label, suffix, ok := split(name)
		if !ok {
			t.Fatalf("%q: no known suffix", name)
		}
		if len(sub) > 0 {
			subs++
			if sub[0] == "www" {
				www++
			}
			if len(sub) == 2 {
				twoLevel++
			}
			continue
		}
		bases++
		if suffix == "com" {
			com++
		}
		if suffix == "co.uk" {
			couk++
		}
		if strings.HasPrefix(label, "xn--") {
			idn++
		}
		if strings.Contains(label, "-") && !strings.HasPrefix(label, "xn--") {
			hyphen++
		}
		if strings.ContainsAny(label, "0123456789") && !strings.HasPrefix(label, "xn--") {
			digit++
		}
		lenSum += len(label)
		lenHist[len(label)]++
		if len(label) <= 2 {
			short++
		}
		if len(label) > 30 {
			long30++
		}
		maxLen = max(maxLen, len(label))
	}
	frac := func(a, b int) float64 { return float64(a) / float64(b) }
	mean := frac(lenSum, bases)
	mode := 0
	for l, c := range lenHist {
		if c > lenHist[mode] {
			mode = l
		}
	}
	t.Logf("bases %d subdomains %.3f (www %.3f, two-level %.3f) com %.3f co.uk %.4f idn %.4f hyphen %.3f digit %.3f",
		bases, frac(subs, n), frac(www, subs), frac(twoLevel, subs), frac(com, bases), frac(couk, bases),
		frac(idn, bases), frac(hyphen, bases), frac(digit, bases))
	t.Logf("registrable label length: mean %.2f mode %d max %d, <=2 %.4f, >30 %.4f", mean, mode, maxLen, frac(short, bases), frac(long30, bases))

	check := func(what string, got, lo, hi float64) {
		t.Helper()
		if got < lo || got > hi {
			t.Errorf("%s = %.4f, want %.4f..%.4f", what, got, lo, hi)
		}
	}
	check("mean registrable label length", mean, 9.5, 12)
	check("mode of the length", float64(mode), 7, 9)
	check("max length", float64(maxLen), 40, 63)
	check("share of 1–2 character labels", frac(short, bases), 0.001, 0.01)
	check("share longer than 30", frac(long30, bases), 0.004, 0.02)
	check("subdomain share", frac(subs, n), 0.27, 0.33)
	check("www share of subdomains", frac(www, subs), 0.15, 0.35)
	check("two-level share of subdomains", frac(twoLevel, subs), 0.15, 0.25)
	check("com share", frac(com, bases), 0.46, 0.54)
	check("co.uk share", frac(couk, bases), 0.01, 0.02)
	check("IDN share", frac(idn, bases), 0.003, 0.012)
	check("hyphen share", frac(hyphen, bases), 0.07, 0.12)
	check("digit share", frac(digit, bases), 0.06, 0.12)
}

func TestPunycode(t *testing.T) {
	for in, want := range map[string]string{
		"münchen":   "mnchen-3ya",
		"bücher":    "bcher-kva",
		"пример":    "e1afmkfd",
		"испытание": "80akhbyknj4f",
		"例え":        "r8jz45g",
	} {
		if got, ok := punycode(in); !ok || got != want {
			t.Errorf("punycode(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestZipfQueries(t *testing.T) {
	names := TopListNames(1000, 3)
	const count = 100000
	q := ZipfQueries(names, count, DefaultZipfS, 7)
	if len(q) != count {
		t.Fatalf("%d queries, want %d", len(q), count)
	}
	if !slices.Equal(q, ZipfQueries(names, count, DefaultZipfS, 7)) {
		t.Error("same seed, different query lists")
	}
	got := map[string]int{}
	for _, n := range q {
		got[n]++
	}
	h := 0.0
	for i := range names {
		h += 1 / float64(i+1)
	}
	for i, n := range names {
		want := count / float64(i+1) / h
		if math.Abs(float64(got[n])-want) > 1 {
			t.Fatalf("name %d asked %d times, want %.1f", i, got[n], want)
		}
	}
	// Shuffled: the most popular name is not bunched at the start.
	first := 0
	for _, n := range q[:1000] {
		if n == names[0] {
			first++
		}
	}
	if want := 1000 / h; math.Abs(float64(first)-want) > 5*math.Sqrt(want) {
		t.Errorf("names[0] is %d of the first 1000 queries, expected about %.0f", first, want)
	}

	u := ZipfQueries(names, 2500, 0, 1) // s = 0: uniform
	cu := map[string]int{}
	for _, n := range u {
		cu[n]++
	}
	for _, n := range names {
		if c := cu[n]; c < 2 || c > 3 {
			t.Fatalf("uniform: %q asked %d times, want 2 or 3", n, c)
		}
	}
	if ZipfQueries(nil, 10, 1, 1) != nil || ZipfQueries(names, 0, 1, 1) != nil {
		t.Error("empty input gives queries")
	}
}

func TestWriteQueries(t *testing.T) {
	names := []string{"a.com.", "b.net.", "c.org."}
	var b bytes.Buffer
	if err := WriteQueries(&b, names, "A", nil); err != nil {
		t.Fatal(err)
	}
	if b.String() != "a.com. A\nb.net. A\nc.org. A\n" {
		t.Errorf("got %q", b.String())
	}
	b.Reset()
	if err := WriteQueries(&b, names, "AAAA", []int{2, 0, 2}); err != nil {
		t.Fatal(err)
	}
	if b.String() != "c.org. AAAA\na.com. AAAA\nc.org. AAAA\n" {
		t.Errorf("got %q", b.String())
	}
	if err := WriteQueries(&b, names, "A", []int{3}); err == nil {
		t.Error("out-of-range order index accepted")
	}
	p := Permutation(100, 5)
	s := slices.Clone(p)
	slices.Sort(s)
	for i := range s {
		if s[i] != i {
			t.Fatalf("not a permutation: %v", p)
		}
	}
	if slices.IsSorted(p) || !slices.Equal(p, Permutation(100, 5)) {
		t.Error("permutation sorted or not deterministic")
	}
}
