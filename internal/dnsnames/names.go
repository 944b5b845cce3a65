// Package dnsnames generates realistic synthetic domain-name lists and query
// lists for benchmarks: TopListNames imitates the shape of public top lists
// (Tranco, Alexa/Umbrella top 1M), ZipfQueries draws a skewed query mix
// from such a list and WriteQueries writes kxdpgun query files. Everything
// is deterministic for a given seed and independent of the Go release (the
// generator is math/rand/v2's PCG, whose output is specified, and all
// derived draws are computed here).
//
// The package is pure Go and needs no privileges; internal/testbed serves
// the lists (testbed.NamesZone).
package dnsnames

import (
	"math/bits"
	"math/rand/v2"
	"sort"
	"strconv"
	"strings"
	"unicode/utf8"
)

// The shape of TopListNames, with where the numbers come from. All figures
// are approximate, rounded values in line with published statistics of the
// Tranco and Alexa top-1M lists (TLD breakdowns and label-length histograms
// as shown on tranco-list.eu and in Le Pochat et al., "Tranco", NDSS 2019,
// and Scheitle et al., "A Long Way to the Top", IMC 2018). They are not
// fitted to one list snapshot; they only make the synthetic names look and
// hash like real ones.
//
//   - Registrable label (the label left of the public suffix, "example"
//     in www.example.co.uk): length histogram slenPerMille below; mode 8,
//     mean ≈ 10.7, 1 to 63 characters (1–2 character labels are rare,
//     0.4 %; 0.9 % are longer than 30 and 0.2 % longer than 40).
//     Composition: letters in English-like syllables; 9 % contain a hyphen
//     (two or three words; 10 % of labels of 5 or more characters); 9 %
//     contain digits (mostly a 1–3 digit suffix, "games24", or prefix,
//     "24news"); 0.5 % are all digits ("163", "360"); 0.7 % are IDNs,
//     valid punycode "xn--…" of Cyrillic or accented Latin words.
//   - TLD (of registrable domains): tldTable below, 117 TLDs; com 50 %,
//     then org 5, net 4, ru 3, de 3, uk 2 (mostly co.uk), jp, br (com.br),
//     io, fr, in, it, pl, au, edu, nl, cn, ... and a tail of about 100
//     TLDs of 0.05–0.4 % each. Country TLDs that register under second
//     levels get those in the proportions of suffixTable (co.uk, com.br,
//     com.au, co.jp, ...).
//   - Subdomains: 30 % of all names are a subdomain of an earlier
//     registrable domain of the list (Tranco's default list holds
//     registrable domains only; Umbrella's is mostly full host names; 30 %
//     is in between). Earlier (more popular) domains get more subdomains:
//     the parent is domain floor(k·v²) of the k so far, v uniform, so in a
//     1 M list the top domain has about 300 subdomains, the 100th about
//     40. Of the subdomains 60 % use a common first label (subTable: www
//     28 % of the weight, m, api, cdn, mail, static, app, img, ...; www.
//     ends up the first label of ≈ 19 % of subdomains, as a parent has it
//     only once), 20 % are two levels deep ("static.eu.", "api.v2.": the
//     a.b.example.com shape) and 20 % have a generated label ("cdn3",
//     "edge12", "portal").
//
// Names are distinct, lower case, absolute (trailing dot), LDH only, with
// labels of at most 63 and names of at most 253 characters.
//
// The list is in rank order: a name's subdomains come after it, and a
// longer list has every shorter list with the same seed as its prefix.
const (
	subShare    = 0.30
	subCommon   = 0.60 // of subdomains: common first label
	subTwoLevel = 0.20 // of subdomains: common.qualifier.parent
	hyphenShare = 0.10
	digitShare  = 0.08
	numberShare = 0.005
	idnShare    = 0.007
)

// slenPerMille is the length histogram of registrable labels (‰, index =
// length; normalized when used). Lengths 31–63 follow in slenTail.
var slenPerMille = [...]float64{
	0, 0.3, 4, 18, 45, 68, 88, 98, 100, 95, // 0–9
	88, 78, 67, 56, 46, 38, 31, 25, 20, 16, // 10–19
	13, 10, 8, 6.5, 5.2, 4.2, 3.4, 2.7, 2.2, 1.8, // 20–29
	1.5, // 30
}

// slenTail: 31–35 1 ‰ each, 36–40 0.5 ‰, 41–63 0.08 ‰.
func slenTail(l int) float64 {
	switch {
	case l <= 35:
		return 1
	case l <= 40:
		return 0.5
	default:
		return 0.08
	}
}

// tldTable: approximate per-cent share of registrable domains per TLD.
const tldTable = `
com 48 org 5.3 net 4.2 ru 3.2 de 2.9 uk 1.9 jp 1.4 br 1.3 io 1.1 fr 1.1
in 1.0 it 0.9 pl 0.9 au 0.9 edu 0.9 nl 0.8 cn 0.8 info 0.7 ir 0.6 es 0.6
ca 0.6 co 0.6 gov 0.5 eu 0.4 ch 0.4 cz 0.4 me 0.4 xyz 0.4 us 0.4 kr 0.4
ua 0.4 vn 0.4 tr 0.4 be 0.3 se 0.3 at 0.3 gr 0.3 tw 0.3 mx 0.3 id 0.3
ro 0.3 tv 0.3 dk 0.2 no 0.2 hu 0.2 ar 0.2 za 0.2 cl 0.2 fi 0.2 pt 0.2
sk 0.2 ie 0.2 il 0.2 nz 0.2 sg 0.2 my 0.2 kz 0.2 by 0.2 app 0.2 dev 0.2
ai 0.2 top 0.2 online 0.2 site 0.2 biz 0.2 xn--p1ai 0.2 cc 0.15 pk 0.15
bd 0.1 ng 0.1 ph 0.1 th 0.1 lt 0.1 lv 0.1 ee 0.1 si 0.1 hr 0.1 rs 0.1
bg 0.1 club 0.1 shop 0.1 store 0.1 tech 0.1 live 0.1 pe 0.1 ve 0.05
ec 0.05 uy 0.05 eg 0.05 sa 0.05 ae 0.05 ma 0.05 ke 0.05 lk 0.05 np 0.05
ly 0.05 to 0.05 gg 0.05 fm 0.05 la 0.05 sh 0.05 ws 0.05 pro 0.05
mobi 0.05 asia 0.05 news 0.05 blog 0.05 cloud 0.05 space 0.05
website 0.05 one 0.05 link 0.05 is 0.05 lu 0.05 am 0.05 ge 0.05 md 0.05
`

// suffixTable: second-level public suffixes of country TLDs, per cent of
// that TLD's registrable domains ("uk=5" is directly under .uk).
const suffixTable = `
uk: co.uk=78 org.uk=8 ac.uk=5 gov.uk=4 uk=5
jp: co.jp=45 ne.jp=8 or.jp=5 ac.jp=6 go.jp=3 jp=33
br: com.br=85 gov.br=7 org.br=4 net.br=2 edu.br=2
au: com.au=80 org.au=7 edu.au=5 gov.au=5 net.au=3
cn: cn=55 com.cn=30 edu.cn=8 gov.cn=7
kr: co.kr=55 kr=25 or.kr=7 go.kr=6 ac.kr=7
tw: com.tw=55 tw=30 edu.tw=10 gov.tw=5
tr: com.tr=70 gov.tr=10 edu.tr=10 org.tr=5 tr=5
mx: com.mx=65 mx=25 gob.mx=10
ar: com.ar=80 gob.ar=10 ar=10
za: co.za=88 org.za=6 ac.za=6
id: co.id=45 id=20 ac.id=15 go.id=15 or.id=5
nz: co.nz=70 nz=15 org.nz=8 govt.nz=7
in: in=70 co.in=18 gov.in=8 ac.in=4
il: co.il=75 org.il=10 ac.il=10 gov.il=5
ua: com.ua=45 ua=35 gov.ua=10 org.ua=10
th: co.th=60 ac.th=20 go.th=15 or.th=5
my: com.my=65 my=30 gov.my=5
sg: com.sg=55 sg=40 gov.sg=5
vn: vn=50 com.vn=40 edu.vn=5 gov.vn=5
pk: com.pk=60 pk=20 gov.pk=10 edu.pk=10
bd: com.bd=50 gov.bd=35 edu.bd=15
ng: com.ng=60 gov.ng=25 ng=15
ph: com.ph=55 ph=30 gov.ph=15
pe: com.pe=50 pe=35 gob.pe=15
eg: com.eg=60 gov.eg=25 edu.eg=15
sa: com.sa=60 gov.sa=25 edu.sa=15
ke: co.ke=70 go.ke=15 ac.ke=15
lk: lk=50 gov.lk=25 ac.lk=25
np: com.np=60 gov.np=25 edu.np=15
es: es=95 com.es=5
pl: pl=92 com.pl=8
ru: ru=96 com.ru=2 msk.ru=2
`

// subTable: first labels of subdomains, relative weights.
const subTable = `
www 28 m 5 api 4 cdn 4 mail 4 static 3 app 3 img 2 images 2 blog 2 shop 2
support 2 help 2 docs 2 dev 1.5 news 1.5 login 1.5 my 1.5 media 1.5
assets 1.5 en 1.5 accounts 1 auth 1 portal 1 webmail 1 smtp 1 ns1 1 ns2 1
status 1 video 1 de 1 fr 1 es 0.8 edge 0.8 secure 0.8 store 0.8 cloud 0.8
forum 0.8 ads 0.8 mx 0.5 ftp 0.5 vpn 0.5 admin 0.5 jp 0.5 cn 0.5 s3 0.5
ws 0.5 beta 0.5 test 0.5 staging 0.5 wiki 0.5 community 0.5 careers 0.5
go 0.5 link 0.5 click 0.5 email 0.5 track 0.5 analytics 0.5 metrics 0.5
search 0.5 download 0.5 update 0.5 mobile 0.5 maps 0.3 files 0.3 push 0.3
gateway 0.3 graph 0.3 connect 0.3 sso 0.3 id 0.3 pay 0.3 checkout 0.3
music 0.3 tv 0.3 live 0.3 amp 0.3 autodiscover 0.3 cpanel 0.3 remote 0.3
`

// qualTable: second labels of two-level subdomains (first.qual.parent).
const qualTable = `
eu 3 us 3 asia 1 us-east-1 1 eu-west-1 1 ap-southeast-1 0.5 prod 2 stage 1
edge 1 cdn 2 img 1 int 1 corp 1 global 1 v2 1 www 1 mobile 1 de 1 uk 1
fr 1 br 0.5 in 0.5 jp 0.5 s1 1 s2 1 srv 1 cloud 1 origin 1 api 2 static 1
`

// Syllable parts for letter labels, weighted roughly by English letter and
// cluster frequency.
const (
	onsetTable = `
t 9 n 6.7 s 6.3 r 6 d 4.3 l 4 h 3 c 2.8 m 2.4 w 2.4 f 2.2 g 2 p 1.9 b 1.5
v 1 k 0.8 j 0.15 x 0.15 q 0.1 z 0.1 th 1.5 st 1 tr 0.8 ch 0.8 pr 0.6
sh 0.6 br 0.5 gr 0.5 cl 0.4 pl 0.4 bl 0.3 fl 0.3 sp 0.3 sm 0.2 kr 0.1
`
	vowelTable = `
e 12.7 a 8.2 o 7.5 i 7 u 2.8 y 1 ea 0.5 oo 0.5 ou 0.5 ai 0.4 ie 0.3 io 0.3
`
	codaTable = `
n 3 r 3 s 3 t 2 l 2 m 1.5 d 1 y 0.8 ng 0.6 ck 0.5 k 0.5 p 0.5 nt 0.5
st 0.4 x 0.3 rt 0.3
`
)

// TopListNames returns n distinct absolute domain names shaped like a
// public top list (see the comment on the shape above), in rank order.
// The same seed gives the same list; TopListNames(m, seed) is a prefix of
// TopListNames(n, seed) for m < n.
func TopListNames(n int, seed int64) []string {
	g := newGen(seed)
	out := make([]string, 0, n)
	for len(out) < n {
		out = append(out, g.next())
	}
	return out
}

type gen struct {
	r     *rng
	seen  map[string]struct{}
	bases []string // registrable domains so far, without the final dot
}

func newGen(seed int64) *gen {
	return &gen{r: newRNG(seed, 0x746f706c697374), seen: map[string]struct{}{}}
}

// next returns the next distinct name.
func (g *gen) next() string {
	for {
		base := len(g.bases) == 0 || g.r.float() >= subShare
		var name string
		if base {
			name = g.registrable()
		} else {
			name = g.subdomain()
		}
		if len(name) > 254 { // 253 characters plus the root dot
			continue
		}
		if _, dup := g.seen[name]; dup {
			continue
		}
		g.seen[name] = struct{}{}
		if base {
			g.bases = append(g.bases, name[:len(name)-1])
		}
		return name
	}
}

// registrable makes a new registrable domain "label.suffix.".
func (g *gen) registrable() string {
	tld := tlds.pick(g.r)
	suffix := tld
	if s, ok := suffixes[tld]; ok {
		suffix = s.pick(g.r)
	}
	return g.registrableLabel(tld) + "." + suffix + "."
}

// subdomain makes a subdomain of an earlier registrable domain, preferring
// earlier (more popular) ones.
func (g *gen) subdomain() string {
	v := g.r.float()
	parent := g.bases[int(float64(len(g.bases))*v*v)]
	u := g.r.float()
	switch {
	case u < subCommon:
		return subs.pick(g.r) + "." + parent + "."
	case u < subCommon+subTwoLevel:
		first, qual := subs.pick(g.r), quals.pick(g.r)
		if first == qual { // no "www.www."
			qual = "v2"
		}
		return first + "." + qual + "." + parent + "."
	default:
		return g.hostLabel() + "." + parent + "."
	}
}

// hostLabel is a generated subdomain label: a short word, often with a
// number ("cdn3", "edge12", "portal").
func (g *gen) hostLabel() string {
	l := 2 + g.r.intn(9) // 2–10
	w := g.word(l)
	if g.r.float() < 0.4 {
		w += strconv.Itoa(g.r.intn(100))
	}
	return w
}

// registrableLabel draws one registrable label for a TLD.
func (g *gen) registrableLabel(tld string) string {
	l := slens.pick(g.r)
	u := g.r.float()
	switch {
	case u < idnShare:
		if s, ok := g.idnLabel(tld); ok {
			return s
		}
	case u < idnShare+numberShare:
		if l > 6 {
			l = 2 + g.r.intn(5)
		}
		b := make([]byte, l)
		for i := range b {
			b[i] = byte('0' + g.r.intn(10))
		}
		return string(b)
	}
	if l <= 3 {
		// Short labels: acronyms, mostly letters.
		b := make([]byte, l)
		for i := range b {
			if g.r.float() < 0.1 {
				b[i] = byte('0' + g.r.intn(10))
			} else {
				b[i] = byte('a' + g.r.intn(26))
			}
		}
		return string(b)
	}
	hyphen := l >= 5 && g.r.float() < hyphenShare
	digits := g.r.float() < digitShare
	nd := 0
	if digits {
		nd = 1 + g.r.intn(3)
		if nd > l-2 {
			nd = l - 2
		}
	}
	wl := l - nd // letters and hyphens
	var s string
	if hyphen && wl >= 5 {
		parts := 2
		if wl >= 11 && g.r.float() < 0.2 {
			parts = 3
		}
		s = g.hyphenated(wl, parts)
	} else {
		s = g.word(wl)
	}
	if nd > 0 {
		num := make([]byte, nd)
		for i := range num {
			num[i] = byte('0' + g.r.intn(10))
		}
		if g.r.float() < 0.75 {
			s += string(num)
		} else {
			s = string(num) + s
		}
	}
	return s
}

// hyphenated joins parts words of at least 2 letters with hyphens, l
// characters in all.
func (g *gen) hyphenated(l, parts int) string {
	letters := l - (parts - 1)
	var b strings.Builder
	left := letters
	for p := 0; p < parts; p++ {
		rest := parts - p - 1
		var pl int
		if rest == 0 {
			pl = left
		} else {
			pl = 2 + g.r.intn(left-2*rest-1)
		}
		if p > 0 {
			b.WriteByte('-')
		}
		b.WriteString(g.word(pl))
		left -= pl
	}
	return b.String()
}

// word is a pronounceable-looking lower-case word of exactly l letters.
func (g *gen) word(l int) string {
	b := make([]byte, 0, l+6)
	for len(b) < l {
		if len(b) == 0 || g.r.float() < 0.85 {
			b = append(b, onsets.pick(g.r)...)
		}
		b = append(b, vowels.pick(g.r)...)
		if g.r.float() < 0.35 {
			b = append(b, codas.pick(g.r)...)
		}
	}
	return string(b[:l])
}

// cyrillicTLDs get Cyrillic IDN labels, others accented Latin ones.
var cyrillicTLDs = map[string]bool{"ru": true, "xn--p1ai": true, "ua": true, "by": true, "kz": true, "bg": true, "rs": true}

// idnLabel makes a valid punycode label "xn--…" of a 4–12 letter word.
func (g *gen) idnLabel(tld string) (string, bool) {
	const cyr = "абвгдеёжзийклмнопрстуфхцчшщъыьэюя"
	const lat = "abcdefghijklmnoprstuvwzäöüßéèàçñåøæ"
	alpha := []rune(lat)
	if cyrillicTLDs[tld] {
		alpha = []rune(cyr)
	}
	for try := 0; try < 4; try++ {
		n := 4 + g.r.intn(9)
		w := make([]rune, n)
		for i := range w {
			w[i] = alpha[g.r.intn(len(alpha))]
		}
		enc, ok := punycode(string(w))
		if ok && enc != "" && len(enc) <= 63-4 && !isASCII(string(w)) {
			return "xn--" + enc, true
		}
	}
	return "", false
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// punycode encodes a lower-case Unicode label (RFC 3492), without "xn--".
func punycode(s string) (string, bool) {
	const (
		base, tmin, tmax, skew, damp = 36, 1, 26, 38, 700
		initialBias, initialN        = 72, 128
	)
	digit := func(d int32) byte {
		if d < 26 {
			return byte('a' + d)
		}
		return byte('0' + d - 26)
	}
	adapt := func(delta, numPoints int32, first bool) int32 {
		if first {
			delta /= damp
		} else {
			delta /= 2
		}
		delta += delta / numPoints
		k := int32(0)
		for delta > ((base-tmin)*tmax)/2 {
			delta /= base - tmin
			k += base
		}
		return k + (base-tmin+1)*delta/(delta+skew)
	}
	in := []rune(s)
	var out []byte
	for _, r := range in {
		if r < 0x80 {
			out = append(out, byte(r))
		}
	}
	b := int32(len(out))
	h := b
	if b > 0 {
		out = append(out, '-')
	}
	n, delta, bias := int32(initialN), int32(0), int32(initialBias)
	for h < int32(len(in)) {
		m := int32(0x7fffffff)
		for _, r := range in {
			if r >= n && r < m {
				m = r
			}
		}
		if (m - n) > (0x7fffffff-delta)/(h+1) {
			return "", false
		}
		delta += (m - n) * (h + 1)
		n = m
		for _, r := range in {
			if r < n {
				delta++
			}
			if r == n {
				q := delta
				for k := int32(base); ; k += base {
					t := k - bias
					if t < tmin {
						t = tmin
					} else if t > tmax {
						t = tmax
					}
					if q < t {
						break
					}
					out = append(out, digit(t+(q-t)%(base-t)))
					q = (q - t) / (base - t)
				}
				out = append(out, digit(q))
				bias = adapt(delta, h+1, h == b)
				delta = 0
				h++
			}
		}
		delta++
		n++
	}
	return string(out), true
}

// rng is a seeded generator with draws computed here, so sequences depend
// only on the seed (PCG's output is specified by math/rand/v2).
type rng struct{ src *rand.PCG }

func newRNG(seed int64, stream uint64) *rng {
	return &rng{rand.NewPCG(uint64(seed), stream)}
}

func (r *rng) u64() uint64 { return r.src.Uint64() }

// intn is uniform in [0, n) (multiply-shift; bias below 2^-40 for the n
// used here).
func (r *rng) intn(n int) int {
	hi, _ := bits.Mul64(r.u64(), uint64(n))
	return int(hi)
}

// float is uniform in [0, 1).
func (r *rng) float() float64 { return float64(r.u64()>>11) / (1 << 53) }

// weighted picks items with probability proportional to their weight.
type weighted[T any] struct {
	items []T
	cum   []float64
}

func (w *weighted[T]) add(item T, weight float64) {
	total := 0.0
	if len(w.cum) > 0 {
		total = w.cum[len(w.cum)-1]
	}
	w.items = append(w.items, item)
	w.cum = append(w.cum, total+weight)
}

func (w *weighted[T]) total() float64 { return w.cum[len(w.cum)-1] }

func (w *weighted[T]) pick(r *rng) T {
	x := r.float() * w.total()
	i := sort.Search(len(w.cum), func(i int) bool { return w.cum[i] > x })
	if i == len(w.cum) {
		i--
	}
	return w.items[i]
}

// parseTable reads "item weight item weight ..." (whitespace separated).
func parseTable(s string) *weighted[string] {
	f := strings.Fields(s)
	w := &weighted[string]{}
	for i := 0; i+1 < len(f); i += 2 {
		v, err := strconv.ParseFloat(f[i+1], 64)
		if err != nil {
			panic("dnsnames: bad table weight " + f[i+1])
		}
		w.add(f[i], v)
	}
	return w
}

var (
	tlds     = parseTable(tldTable)
	subs     = parseTable(subTable)
	quals    = parseTable(qualTable)
	onsets   = parseTable(onsetTable)
	vowels   = parseTable(vowelTable)
	codas    = parseTable(codaTable)
	suffixes = parseSuffixes(suffixTable)
	slens    = slenWeights()
)

func parseSuffixes(s string) map[string]*weighted[string] {
	m := map[string]*weighted[string]{}
	for _, line := range strings.Split(s, "\n") {
		tld, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		w := &weighted[string]{}
		for _, kv := range strings.Fields(rest) {
			k, v, _ := strings.Cut(kv, "=")
			x, err := strconv.ParseFloat(v, 64)
			if err != nil {
				panic("dnsnames: bad suffix weight " + kv)
			}
			w.add(k, x)
		}
		m[tld] = w
	}
	return m
}

func slenWeights() *weighted[int] {
	w := &weighted[int]{}
	for l := 1; l <= 63; l++ {
		if l < len(slenPerMille) {
			w.add(l, slenPerMille[l])
		} else {
			w.add(l, slenTail(l))
		}
	}
	return w
}
