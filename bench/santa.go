//go:build linux

package bench

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"

	"golang.org/x/sys/unix"

	"github.com/santa-offload/santa/internal/dataplane"
	"github.com/santa-offload/santa/internal/dnsrule"
	"github.com/santa-offload/santa/internal/sockets"
	"github.com/santa-offload/santa/internal/testbed"
)

// SantaCase is Santa attached to the server veth with rules for NSD's answers.
type SantaCase struct {
	name    string
	rules   int  // names h0..h<rules-1> get a rule (names past the zone get NSD's NXDOMAIN)
	noMatch bool // the rules are for AAAA, the queries ask for A: everything reaches NSD

	dp    *dataplane.Dataplane
	att   *dataplane.Attachment
	socks []sockets.Socket
}

func init() {
	Register(&SantaCase{name: CaseSanta1, rules: 1})
	Register(&SantaCase{name: CaseSanta10k, rules: 10_000})
	Register(&SantaCase{name: CaseSanta1M, rules: 1_000_000})
	Register(&SantaCase{name: CaseSanta1MNoMatch, rules: 1_000_000, noMatch: true})
}

func (c *SantaCase) Name() string { return c.name }

func (c *SantaCase) Description() string {
	if c.noMatch {
		return fmt.Sprintf("Santa with %d rules (AAAA) that match none of the queries (A): NSD answers everything", c.rules)
	}
	return fmt.Sprintf("Santa with %d rules made from NSD's answers; every query matches one", c.rules)
}

func (c *SantaCase) qtype() uint16 {
	if c.noMatch {
		return dns.TypeAAAA
	}
	return dns.TypeA
}

func (c *SantaCase) Setup(env *Env) error {
	cfg := dataplane.Config{}
	if c.rules > 50_000 {
		cfg = dataplane.Config{HashBits: 22, MaxRules: c.rules + 4096, DataMiB: 256}
	}
	dp, err := dataplane.Load(cfg)
	if err != nil {
		return err
	}
	c.dp = dp
	if err := env.TB.Server.Do(func() error {
		c.att, err = dp.Attach(env.TB.Server.Dev, dataplane.AttachNative)
		return err
	}); err != nil {
		return err
	}
	c.socks, err = sockets.FindUDPSockets(env.NSD.PID(), 53)
	if err != nil {
		return err
	}
	var cookie uint64
	for _, s := range c.socks {
		if s.Local.Addr() == env.NSD.Addr4.Addr() || (s.Local.Addr().IsUnspecified() && cookie == 0) {
			cookie = s.Cookie
		}
	}
	if cookie == 0 {
		return fmt.Errorf("no NSD socket for %v among %d", env.NSD.Addr4, len(c.socks))
	}
	sock := dataplane.Socket{Cookie: cookie, Protocol: unix.IPPROTO_UDP, Port: 53}
	if err := dp.Bind(sock, dataplane.SampleOptions{Bytes: dataplane.MaxSample, PerSecond: 100}); err != nil {
		return err
	}
	tmpl, err := learnGunQuery(env, dp)
	if err != nil {
		return fmt.Errorf("learn kxdpgun's query format: %w", err)
	}
	if err := dp.SetSampling(cookie, dataplane.SampleOptions{}); err != nil {
		return err
	}
	start := time.Now()
	rules, err := fetchRules(env, tmpl, c.rules, c.qtype())
	if err != nil {
		return err
	}
	env.Logf("[%s] %d answers fetched from NSD in %v", c.name, len(rules), time.Since(start).Round(time.Millisecond))
	start = time.Now()
	if _, err := dp.AddRules(cookie, rules); err != nil {
		return err
	}
	env.Logf("[%s] %d rules installed in %v", c.name, len(rules), time.Since(start).Round(time.Millisecond))
	return nil
}

// Queries are names with rules (A), or, for the no-match case, the default
// mix, which no AAAA rule matches.
func (c *SantaCase) Queries(env *Env) []Query {
	if c.noMatch {
		return env.Queries
	}
	qs := make([]Query, c.rules)
	for i := range qs {
		qs[i] = Query{Name: testbed.GenName(env.Zone.Origin, i), Type: "A"}
	}
	return qs
}

func (c *SantaCase) Teardown() error {
	var errs []error
	if c.att != nil {
		errs = append(errs, c.att.Close())
	}
	if c.dp != nil {
		errs = append(errs, c.dp.Close())
	}
	errs = append(errs, sockets.CloseAll(c.socks))
	c.att, c.dp, c.socks = nil, nil, nil
	return errors.Join(errs...)
}

// gunQuery is kxdpgun's query layout: a header and what follows the question
// (an OPT record, if it sends one).
type gunQuery struct {
	header [12]byte
	tail   []byte
}

// learnGunQuery sends a few queries with kxdpgun and reads them back as
// Santa miss samples: the exact bytes a rule has to match.
func learnGunQuery(env *Env, dp *dataplane.Dataplane) (gunQuery, error) {
	ms, err := dp.OpenMissSamples()
	if err != nil {
		return gunQuery{}, err
	}
	defer ms.Close()
	dir, err := os.MkdirTemp("", "santa-bench-")
	if err != nil {
		return gunQuery{}, err
	}
	defer os.RemoveAll(dir)
	qfile := filepath.Join(dir, "probe.queries")
	if err := WriteQueryFile(qfile, []Query{{Name: testbed.GenName(env.Zone.Origin, 0), Type: "A"}}); err != nil {
		return gunQuery{}, err
	}
	gun := &Gun{TB: env.TB, QueryFile: qfile, Target: env.TB.Server.IP4.String(), CPU: env.Placement.ClientCPU}
	got := make(chan dataplane.MissSample, 1)
	go func() {
		if m, err := ms.Read(); err == nil {
			got <- m
		}
		close(got)
	}()
	_, runErr := gun.Run(context.Background(), 100, time.Second)
	if err := env.TB.AttachClientPass(); err != nil {
		return gunQuery{}, err
	}
	if runErr != nil {
		return gunQuery{}, runErr
	}
	var m dataplane.MissSample
	select {
	case s, ok := <-got:
		if !ok {
			return gunQuery{}, errors.New("no miss sample")
		}
		m = s
	case <-time.After(2 * time.Second):
		return gunQuery{}, errors.New("no miss sample within 2 s")
	}
	if m.Len != len(m.Payload) {
		return gunQuery{}, fmt.Errorf("query of %d bytes, longer than a sample", m.Len)
	}
	var msg dns.Msg
	if err := msg.Unpack(m.Payload); err != nil || len(msg.Question) != 1 {
		return gunQuery{}, fmt.Errorf("sample is no one-question query: %v", err)
	}
	qend := 12 + len(dns.Fqdn(msg.Question[0].Name)) + 1 + 4
	var q gunQuery
	copy(q.header[:], m.Payload[:12])
	q.tail = append([]byte(nil), m.Payload[qend:]...)
	env.Logf("kxdpgun query: header %x, %d bytes after the question", q.header[2:], len(q.tail))
	return q, nil
}

func (q gunQuery) build(name string, qtype uint16) []byte {
	out := append([]byte(nil), q.header[:]...)
	for _, label := range strings.Split(strings.TrimSuffix(name, "."), ".") {
		out = append(out, byte(len(label)))
		out = append(out, label...)
	}
	out = append(out, 0)
	out = binary.BigEndian.AppendUint16(out, qtype)
	out = binary.BigEndian.AppendUint16(out, dns.ClassINET)
	return append(out, q.tail...)
}

// fetchRules asks NSD for the answer to each of n queries, four at a time.
func fetchRules(env *Env, tmpl gunQuery, n int, qtype uint16) ([]dataplane.Rule, error) {
	const workers = 4
	rules := make([]dataplane.Rule, n)
	errs := make([]error, workers)
	var wg sync.WaitGroup
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			conn, err := env.TB.DialUDP(env.NSD.Addr4)
			if err != nil {
				errs[w] = err
				return
			}
			defer conn.Close()
			for i := w; i < n; i += workers {
				q := tmpl.build(testbed.GenName(env.Zone.Origin, i), qtype)
				binary.BigEndian.PutUint16(q, uint16(i))
				var err error
				for try := 0; try < 3; try++ {
					if rules[i], _, err = dnsrule.FromServer(conn, q, time.Second); err == nil {
						break
					}
					var ne net.Error
					if !errors.As(err, &ne) || !ne.Timeout() {
						break
					}
				}
				if err != nil {
					errs[w] = fmt.Errorf("answer %d: %w", i, err)
					return
				}
				if w == 0 && i > 0 && i%(200_000) == 0 {
					env.Logf("  %d/%d answers", i, n)
				}
			}
		}(w)
	}
	wg.Wait()
	return rules, errors.Join(errs...)
}
