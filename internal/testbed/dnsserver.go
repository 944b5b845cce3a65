//go:build linux

package testbed

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"
)

// Kinds of authoritative DNS server the testbed can start, for
// StartDNSServer. All are the unmodified Debian packages.
const (
	KindNSD  = "nsd"  // /usr/sbin/nsd (Debian nsd)
	KindKnot = "knot" // /usr/sbin/knotd (Debian knot)
	KindBIND = "bind" // /usr/sbin/named (Debian bind9)
)

// DNSServerKinds lists every kind, for tests that loop over all servers.
var DNSServerKinds = []string{KindNSD, KindKnot, KindBIND}

// DNSServerOptions configure StartDNSServer, StartKnot and StartBIND (and,
// through NSDOptions, StartNSD). The zero value serves tb.ExampleZone(0)
// on port 53 of both server addresses with one UDP worker, unpinned.
type DNSServerOptions struct {
	Zone *Zone // nil: tb.ExampleZone(0)
	Port int   // 0: 53
	// MoreZones are served besides Zone, each from a file named after its
	// origin beside Zone's (DNSProcess.ZoneFileOf).
	MoreZones []Zone
	// Wildcard binds NSD to the wildcard addresses (0.0.0.0 and ::, its
	// default when no ip-address is configured) instead of the server's
	// two; NSD only (StartDNSServer refuses it for the others).
	Wildcard bool
	// Workers is the number of UDP workers (0: 1): NSD's server-count
	// (processes), Knot's udp-workers (threads), named's -n and -U.
	Workers int
	// Pin restricts every process and thread of the server to CPU: by the
	// server's own option where there is one (NSD cpu-affinity), by taskset
	// at start and by re-pinning all threads once the server answers
	// (knotd pins its UDP workers itself, to CPU i mod #CPUs).
	Pin bool
	CPU int
	// Extra are server-specific configuration lines: NSD and Knot add them
	// to the "server:" section, BIND to the "options { }" block (each a
	// complete statement, e.g. "minimal-responses yes;").
	Extra []string
	// Timeout to wait for the first SOA answer; 0: 10 s + 1 s per 20 k
	// records of the zone.
	Timeout time.Duration
}

// DNSServer is a running authoritative DNS server in the server namespace
// of a testbed: *NSD, *Knot or *BIND.
type DNSServer interface {
	// Name is the kind: "nsd", "knot" or "bind".
	Name() string
	// Addrs are where it listens: the server's IPv4 and IPv6 address.
	Addrs() (v4, v6 netip.AddrPort)
	// PID is the main process (the one holding the UDP sockets; for NSD
	// the parent of the answering server processes).
	PID() int
	// PIDs are the main process and all its descendant processes (NSD:
	// xfrd and the server processes; Knot and BIND: only the main process,
	// whose threads do the work; see Threads for those).
	PIDs() ([]int, error)
	// Log is the server's own log file.
	Log() string
	// Stop terminates the server (see DNSProcess.Stop).
	Stop() error
	// Proc gives the common details (directory, config, zone, addresses).
	Proc() *DNSProcess
}

// DNSProcess is what every testbed DNS server has in common. *NSD, *Knot
// and *BIND embed it, so its fields and methods are theirs.
type DNSProcess struct {
	Kind     string         // "nsd", "knot", "bind"
	Dir      string         // temp dir with config, zone, pidfile, log, databases
	Conf     string         // path of the configuration file
	ZoneFile string         // path of the zone file
	LogFile  string         // path of the server's log file
	Addr4    netip.AddrPort // where it listens
	Addr6    netip.AddrPort
	Zone     Zone
	// MoreZones are served besides Zone (DNSServerOptions.MoreZones).
	MoreZones []Zone

	tb *Testbed
	serverProcess
}

// dnsLaunch is what differs between the servers.
type dnsLaunch struct {
	kind    string
	conf    string // config file name in the dir
	logFile string // log file name in the dir
	// config returns the configuration text.
	config func(p *DNSProcess, o DNSServerOptions) string
	// check validates the written config (and zone); the error carries the
	// checker's message.
	check func(p *DNSProcess) error
	// argv is the server's command line (binary first), without taskset.
	argv func(p *DNSProcess, o DNSServerOptions) []string
	// unpin: the server pins threads itself; without o.Pin, give every
	// thread all online CPUs back once it answers.
	unpin bool
	// loadFailed matches the server's log line for a zone that failed to
	// load (the server keeps running and answers SERVFAIL): the start then
	// fails at once instead of at the timeout.
	loadFailed *regexp.Regexp
}

// StartDNSServer starts a server of the given kind ("nsd", "knot", "bind")
// serving o.Zone. See StartNSD, StartKnot and StartBIND.
func (tb *Testbed) StartDNSServer(kind string, o DNSServerOptions) (DNSServer, error) {
	var (
		s   DNSServer
		err error
	)
	if o.Wildcard && kind != KindNSD {
		return nil, fmt.Errorf("%s: only NSD is started on the wildcard addresses", kind)
	}
	// Assign only on success: a nil *NSD in a DNSServer is not a nil
	// DNSServer.
	switch kind {
	case KindNSD:
		var n *NSD
		if n, err = tb.StartNSD(NSDOptions{Zone: o.Zone, MoreZones: o.MoreZones, Port: o.Port, ServerCount: o.Workers,
			Pin: o.Pin, CPU: o.CPU, Extra: o.Extra, Timeout: o.Timeout, Wildcard: o.Wildcard}); err == nil {
			s = n
		}
	case KindKnot:
		var k *Knot
		if k, err = tb.StartKnot(o); err == nil {
			s = k
		}
	case KindBIND:
		var b *BIND
		if b, err = tb.StartBIND(o); err == nil {
			s = b
		}
	default:
		err = fmt.Errorf("unknown DNS server kind %q (want one of %s)", kind, strings.Join(DNSServerKinds, ", "))
	}
	return s, err
}

// startDNS writes the zone and config of a server under a new temp dir,
// checks them, starts the server in the server namespace and waits until it
// answers an SOA query for the zone's origin over IPv4 and IPv6 from the
// client namespace. The server is stopped by Stop or when tb closes.
func (tb *Testbed) startDNS(l dnsLaunch, o DNSServerOptions) (*DNSProcess, error) {
	if o.Port == 0 {
		o.Port = 53
	}
	if o.Workers <= 0 {
		o.Workers = 1
	}
	zone := tb.ExampleZone(0)
	if o.Zone != nil {
		zone = *o.Zone
	}
	if o.Timeout == 0 {
		o.Timeout = 10*time.Second + time.Duration(zone.RecordCount()/20000)*time.Second
	}
	dir, err := os.MkdirTemp("", "santa-"+l.kind+"-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	p := &DNSProcess{
		Kind:      l.kind,
		Dir:       dir,
		Conf:      filepath.Join(dir, l.conf),
		ZoneFile:  filepath.Join(dir, zoneFileName(zone.Origin)),
		LogFile:   filepath.Join(dir, l.logFile),
		Addr4:     netip.AddrPortFrom(tb.Server.IP4, uint16(o.Port)),
		Addr6:     netip.AddrPortFrom(tb.Server.IP6, uint16(o.Port)),
		Zone:      zone,
		MoreZones: o.MoreZones,
		tb:        tb,
	}
	fail := func(err error) (*DNSProcess, error) {
		p.Stop()
		return nil, fmt.Errorf("%s: %w", l.kind, err)
	}
	for _, z := range p.zones() {
		if err := writeZoneFile(p.ZoneFileOf(z.Origin), z); err != nil {
			return fail(err)
		}
	}
	if err := os.WriteFile(p.Conf, []byte(l.config(p, o)), 0o644); err != nil {
		return fail(err)
	}
	if err := l.check(p); err != nil {
		return fail(err)
	}

	if err := p.start(tb, dir, o.Pin, o.CPU, l.argv(p, o)); err != nil {
		return fail(err)
	}
	tb.addCleanup(p.Stop)

	if err := p.waitSOA(o.Timeout, l.loadFailed); err != nil {
		return fail(err)
	}
	switch {
	case o.Pin:
		// taskset covered every process and thread created since, but
		// servers may set their own affinity (knotd does): pin again.
		if err := p.pinAll(func(tid int) error { return PinThread(tid, o.CPU) }); err != nil {
			return fail(fmt.Errorf("pin to cpu%d: %w", o.CPU, err))
		}
	case l.unpin:
		if err := p.pinAll(unpinThread); err != nil {
			return fail(fmt.Errorf("unpin: %w", err))
		}
	}
	return p, nil
}

// waitSOA polls until the server answers the SOA of each of its zones on
// both addresses. It gives up early if the log matches loadFailed.
func (p *DNSProcess) waitSOA(timeout time.Duration, loadFailed *regexp.Regexp) error {
	deadline := time.Now().Add(timeout)
	for _, z := range p.zones() {
		for _, a := range []netip.AddrPort{p.Addr4, p.Addr6} {
			if err := p.waitSOAOf(z.Origin, a, deadline, timeout, loadFailed); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitSOAOf is waitSOA for one zone and address, until deadline.
func (p *DNSProcess) waitSOAOf(origin string, a netip.AddrPort, deadline time.Time, timeout time.Duration, loadFailed *regexp.Regexp) error {
	m := new(dns.Msg)
	m.SetQuestion(origin, dns.TypeSOA)
	m.RecursionDesired = false
	for {
		select {
		case <-p.done:
			return fmt.Errorf("exited: %v: %s%s", p.werr, p.out.String(), p.Log())
		default:
		}
		r, _, err := p.tb.Exchange(a, m, 200*time.Millisecond)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			return nil
		}
		if err == nil {
			err = fmt.Errorf("rcode %s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("no SOA answer for %s from %v within %v (last: %v): %s%s", origin, a, timeout, err, p.out.String(), p.Log())
		}
		if log := p.Log(); loadFailed != nil && loadFailed.MatchString(log) {
			return fmt.Errorf("zone failed to load: %s%s", p.out.String(), log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// pinAll applies f to every thread of every process of the server.
func (p *DNSProcess) pinAll(f func(tid int) error) error {
	pids, err := p.PIDs()
	if err != nil {
		return err
	}
	var errs []error
	for _, pid := range pids {
		tids, err := Threads(pid)
		if err != nil {
			if errors.Is(err, os.ErrNotExist) {
				continue
			}
			return err
		}
		for _, tid := range tids {
			if err := f(tid); err != nil && !errors.Is(err, unix.ESRCH) {
				errs = append(errs, fmt.Errorf("thread %d of %d: %w", tid, pid, err))
			}
		}
	}
	return errors.Join(errs...)
}

// unpinThread lets a thread run on every online CPU.
func unpinThread(tid int) error {
	var set unix.CPUSet
	for i := 0; i < runtime.NumCPU(); i++ {
		set.Set(i)
	}
	return unix.SchedSetaffinity(tid, &set)
}

// zones are every zone the server serves: Zone, then MoreZones.
func (p *DNSProcess) zones() []Zone { return append([]Zone{p.Zone}, p.MoreZones...) }

// ZoneFileOf is the path of the file of the zone with that origin (for
// Zone, ZoneFile).
func (p *DNSProcess) ZoneFileOf(origin string) string {
	return filepath.Join(p.Dir, zoneFileName(origin))
}

// zoneFileName is the zone file's name for an origin ("root.zone" for ".").
func zoneFileName(origin string) string {
	n := strings.TrimSuffix(origin, ".")
	if n == "" {
		n = "root"
	}
	return n + ".zone"
}

// writeZoneFile writes z to path; a Signed zone is written beside it
// unsigned, then signed into path with keys made in path's directory.
func writeZoneFile(path string, z Zone) error {
	unsigned := path
	if z.Signed {
		unsigned = path + ".unsigned"
	}
	f, err := os.Create(unsigned)
	if err != nil {
		return err
	}
	if _, err := z.WriteTo(f); err != nil {
		f.Close()
		return fmt.Errorf("write zone: %w", err)
	}
	if err := f.Close(); err != nil || !z.Signed {
		return err
	}
	dir := filepath.Dir(path)
	for _, role := range [][]string{{"-f", "KSK"}, nil} {
		args := append([]string{"-q", "-K", dir, "-a", "ECDSAP256SHA256"}, role...)
		if err := runCheck("dnssec-keygen", append(args, z.Origin)...); err != nil {
			return fmt.Errorf("sign zone: %w", err)
		}
	}
	// -S adds the DNSKEYs and picks the keys' roles; -N keep: the SOA
	// serial stays the unsigned zone's; -d: its dsset file goes beside the
	// keys, not into the caller's working directory
	args := []string{"-q", "-S", "-K", dir, "-d", dir, "-N", "keep", "-o", z.Origin, "-f", path}
	if z.NSEC3 {
		args = append(args, "-3", "-", "-H", "0")
	}
	if err := runCheck("dnssec-signzone", append(args, unsigned)...); err != nil {
		return fmt.Errorf("sign zone: %w", err)
	}
	return nil
}

// runCheck runs a config or zone checker and returns its output as the
// error on failure.
func runCheck(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", filepath.Base(name), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// Name is the kind of server.
func (p *DNSProcess) Name() string { return p.Kind }

// Addrs are the IPv4 and IPv6 addresses and port it listens on.
func (p *DNSProcess) Addrs() (v4, v6 netip.AddrPort) { return p.Addr4, p.Addr6 }

// Proc returns p (for the DNSServer interface).
func (p *DNSProcess) Proc() *DNSProcess { return p }

// PID is the pid of the server's main process.
// PIDs returns the main process and its descendants.
func (p *DNSProcess) PIDs() ([]int, error) {
	select {
	case <-p.done:
		return nil, fmt.Errorf("%s is not running", p.Kind)
	default:
	}
	return Descendants(p.PID())
}

// Threads returns the thread ids of all the server's processes.
func (p *DNSProcess) Threads() ([]int, error) {
	var tids []int
	err := p.pinAll(func(tid int) error { tids = append(tids, tid); return nil })
	return tids, err
}

// Log returns the contents of the server's log file.
func (p *DNSProcess) Log() string {
	b, _ := os.ReadFile(p.LogFile)
	return string(b)
}

// Output returns what the server wrote to stdout and stderr (the first MiB).
func (p *DNSProcess) Output() string { return p.out.String() }

// stopGrace is how long Stop waits after SIGTERM before SIGKILL.
const stopGrace = 10 * time.Second

// Stop terminates the server (SIGTERM to the main process, then SIGKILL to
// its process group after 10 s; leftover processes of the group are
// killed) and removes its directory. Safe to call more than once; the
// testbed calls it on Close.
func (p *DNSProcess) Stop() error {
	p.stopOnce.Do(func() {
		defer os.RemoveAll(p.Dir)
		if !p.Running() {
			return
		}
		pgid := p.cmd.Process.Pid // Setpgid: the group is this server's own
		procs, _ := Descendants(pgid)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-pgid, syscall.SIGKILL) // the main process is still there: the group is ours
			<-p.done
			p.stopErr = fmt.Errorf("%s did not stop on SIGTERM within %v; killed", p.Kind, stopGrace)
		}
		// children (NSD's xfrd and servers) normally exit with the main process
		p.killStragglers(procs[1:])
	})
	return p.stopErr
}

func isZombie(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] == 'Z'
}

// Descendants returns pid and all its descendant processes.
func Descendants(pid int) ([]int, error) {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	children := map[int][]int{}
	for _, e := range ents {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...; comm may contain spaces and ')'.
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := strings.Fields(string(b[i+1:]))
		if len(f) < 2 {
			continue
		}
		pp, _ := strconv.Atoi(f[1])
		children[pp] = append(children[pp], p)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out, nil
}

// LockedBuffer collects a child process's output while it runs; it keeps
// the first MiB.
type LockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *LockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil
	}
	return l.b.Write(p)
}

func (l *LockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// Exchange sends a DNS query over UDP from the client namespace to server
// and returns the reply and round-trip time.
func (tb *Testbed) Exchange(server netip.AddrPort, m *dns.Msg, timeout time.Duration) (*dns.Msg, time.Duration, error) {
	conn, err := tb.DialUDP(server)
	if err != nil {
		return nil, 0, err
	}
	defer conn.Close()
	c := &dns.Client{Net: "udp", Timeout: timeout, UDPSize: dns.DefaultMsgSize}
	return c.ExchangeWithConnContext(context.Background(), m, &dns.Conn{Conn: conn})
}

// Query asks server for name/qtype from the client namespace (RD off).
func (tb *Testbed) Query(server netip.AddrPort, name string, qtype uint16) (*dns.Msg, error) {
	m := new(dns.Msg)
	m.SetQuestion(dns.Fqdn(name), qtype)
	m.RecursionDesired = false
	r, _, err := tb.Exchange(server, m, time.Second)
	return r, err
}
