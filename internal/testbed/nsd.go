//go:build linux

package testbed

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/miekg/dns"
)

// NSDPath and NSDCheckconfPath are Debian's locations of NSD.
var (
	NSDPath          = "/usr/sbin/nsd"
	NSDCheckconfPath = "/usr/sbin/nsd-checkconf"
)

// ZoneOrigin is the zone the testbed's NSD serves by default.
const ZoneOrigin = "example.test."

// Zone is a zone file to serve: a fixed set of records plus, optionally,
// Generated synthetic names (see GenName).
type Zone struct {
	Origin    string   // e.g. "example.test."
	Records   []string // zone file lines, relative to Origin; SOA and NS included
	Generated int      // adds GenName(0..Generated-1) with an A record each
}

// ExampleZone is example.test. with SOA, NS, glue, a few A/AAAA/TXT/MX/CNAME
// records and generated extra names. The server's addresses are those of
// tb's server side.
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
		},
		Generated: generated,
	}
}

// Well-known answers of ExampleZone, for tests.
var (
	ExampleWWW4 = netip.MustParseAddr("198.18.255.10")
	ExampleWWW6 = netip.MustParseAddr("2001:2:0:ff::10")
)

// GenName is the i-th generated name of a zone: "h<i>.<origin>".
func GenName(origin string, i int) string { return "h" + strconv.Itoa(i) + "." + origin }

// GenAddr is the A record of the i-th generated name: 198.19.0.0 + i
// (wrapping in 198.19.0.0/16).
func GenAddr(i int) netip.Addr {
	return netip.AddrFrom4([4]byte{198, 19, byte(i >> 8), byte(i)})
}

// WriteTo writes the zone file.
func (z Zone) WriteTo(w io.Writer) (int64, error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	cw := &countWriter{w: bw}
	fmt.Fprintf(cw, "$ORIGIN %s\n$TTL 300\n", z.Origin)
	for _, r := range z.Records {
		fmt.Fprintln(cw, r)
	}
	for i := 0; i < z.Generated; i++ {
		a := GenAddr(i).As4()
		fmt.Fprintf(cw, "h%d IN A %d.%d.%d.%d\n", i, a[0], a[1], a[2], a[3])
	}
	if err := bw.Flush(); err != nil {
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

// NSDOptions configure StartNSD. The zero value serves ExampleZone(0) on
// port 53 of both server addresses with one server process, unpinned.
type NSDOptions struct {
	Zone        *Zone         // nil: tb.ExampleZone(0)
	Port        int           // 0: 53
	ServerCount int           // 0: 1
	Pin         bool          // pin every NSD process to CPU
	CPU         int           // the CPU for Pin
	Extra       []string      // extra lines for the "server:" clause
	Timeout     time.Duration // to wait for the first answer; 0: 10 s + 1 s per 50 k generated names
}

// NSD is a running NSD in the server namespace of a testbed.
type NSD struct {
	Dir   string         // temp dir with config, zone, pidfile, log
	Conf  string         // path of nsd.conf
	Addr4 netip.AddrPort // where it listens
	Addr6 netip.AddrPort
	Zone  Zone

	tb   *Testbed
	cmd  *exec.Cmd
	out  *LockedBuffer
	done chan struct{}
	werr error

	stopOnce sync.Once
	stopErr  error
}

// StartNSD writes a zone and config under a temp dir and starts NSD in the
// server namespace, listening on the server's IPv4 and IPv6 addresses. It
// returns once NSD answers an SOA query from the client namespace. NSD is
// stopped by Stop or when the testbed closes.
//
// The config turns response rate limiting off (Debian's NSD has it on by
// default), has no remote control, no chroot and no user switch (the temp
// dir stays readable), and keeps everything under Dir.
func (tb *Testbed) StartNSD(o NSDOptions) (*NSD, error) {
	if o.Port == 0 {
		o.Port = 53
	}
	if o.ServerCount == 0 {
		o.ServerCount = 1
	}
	zone := tb.ExampleZone(0)
	if o.Zone != nil {
		zone = *o.Zone
	}
	if o.Timeout == 0 {
		o.Timeout = 10*time.Second + time.Duration(zone.Generated/50000)*time.Second
	}
	dir, err := os.MkdirTemp("", "santa-nsd-")
	if err != nil {
		return nil, err
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	n := &NSD{
		Dir:   dir,
		Conf:  filepath.Join(dir, "nsd.conf"),
		Addr4: netip.AddrPortFrom(tb.Server.IP4, uint16(o.Port)),
		Addr6: netip.AddrPortFrom(tb.Server.IP6, uint16(o.Port)),
		Zone:  zone,
		tb:    tb,
		out:   &LockedBuffer{},
		done:  make(chan struct{}),
	}
	fail := func(err error) (*NSD, error) {
		n.Stop()
		return nil, err
	}
	zoneFile := filepath.Join(dir, strings.TrimSuffix(zone.Origin, ".")+".zone")
	zf, err := os.Create(zoneFile)
	if err != nil {
		return fail(err)
	}
	if _, err := zone.WriteTo(zf); err != nil {
		zf.Close()
		return fail(fmt.Errorf("write zone: %w", err))
	}
	if err := zf.Close(); err != nil {
		return fail(err)
	}

	var conf strings.Builder
	fmt.Fprintf(&conf, `# Written by internal/testbed for testbed %s.
server:
	ip-address: %s
	ip-address: %s
	port: %d
	server-count: %d
	username: ""
	chroot: ""
	zonesdir: "%s"
	database: ""
	zonelistfile: "%s/zone.list"
	xfrdfile: "%s/xfrd.state"
	xfrdir: "%s"
	pidfile: "%s/nsd.pid"
	logfile: "%s/nsd.log"
	verbosity: 1
	hide-version: yes
	reuseport: no
	rrl-ratelimit: 0
	rrl-whitelist-ratelimit: 0
	round-robin: no
`, tb.ID, tb.Server.IP4, tb.Server.IP6, o.Port, o.ServerCount, dir, dir, dir, dir, dir, dir)
	for _, l := range o.Extra {
		fmt.Fprintf(&conf, "\t%s\n", l)
	}
	fmt.Fprintf(&conf, `
remote-control:
	control-enable: no

zone:
	name: "%s"
	zonefile: "%s"
`, zone.Origin, zoneFile)
	if err := os.WriteFile(n.Conf, []byte(conf.String()), 0o644); err != nil {
		return fail(err)
	}
	if out, err := exec.Command(NSDCheckconfPath, n.Conf).CombinedOutput(); err != nil {
		return fail(fmt.Errorf("nsd-checkconf: %w: %s", err, bytes.TrimSpace(out)))
	}

	args := []string{"netns", "exec", tb.Server.NS}
	if o.Pin {
		args = append(args, "taskset", "-c", strconv.Itoa(o.CPU))
	}
	args = append(args, NSDPath, "-d", "-c", n.Conf)
	n.cmd = exec.Command("ip", args...)
	n.cmd.Stdout = n.out
	n.cmd.Stderr = n.out
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
	if err := n.cmd.Start(); err != nil {
		return fail(fmt.Errorf("start nsd: %w", err))
	}
	go func() {
		n.werr = n.cmd.Wait()
		close(n.done)
	}()
	tb.addCleanup(n.Stop)

	deadline := time.Now().Add(o.Timeout)
	for {
		select {
		case <-n.done:
			return fail(fmt.Errorf("nsd exited: %v: %s%s", n.werr, n.out.String(), n.Log()))
		default:
		}
		m := new(dns.Msg)
		m.SetQuestion(zone.Origin, dns.TypeSOA)
		r, _, err := tb.Exchange(n.Addr4, m, 200*time.Millisecond)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			break
		}
		if time.Now().After(deadline) {
			return fail(fmt.Errorf("nsd did not answer within %v (last error %v): %s%s", o.Timeout, err, n.out.String(), n.Log()))
		}
		time.Sleep(50 * time.Millisecond)
	}
	if o.Pin {
		// taskset covered every process forked since; be sure anyway.
		pids, err := n.PIDs()
		if err != nil {
			return fail(err)
		}
		for _, p := range pids {
			if err := PinProcess(p, o.CPU); err != nil {
				return fail(fmt.Errorf("pin nsd %d: %w", p, err))
			}
		}
	}
	return n, nil
}

// PID is the pid of NSD's main process.
func (n *NSD) PID() int { return n.cmd.Process.Pid }

// PIDs returns the main process and its descendants (xfrd and the server
// processes that answer queries).
func (n *NSD) PIDs() ([]int, error) {
	select {
	case <-n.done:
		return nil, errors.New("nsd is not running")
	default:
	}
	return Descendants(n.PID())
}

// Log returns the contents of NSD's log file.
func (n *NSD) Log() string {
	b, _ := os.ReadFile(filepath.Join(n.Dir, "nsd.log"))
	return string(b)
}

// Stop terminates NSD (SIGTERM, then SIGKILL to its process group after
// 5 s) and removes its directory. Safe to call more than once.
func (n *NSD) Stop() error {
	n.stopOnce.Do(func() {
		defer os.RemoveAll(n.Dir)
		if n.cmd == nil || n.cmd.Process == nil {
			return
		}
		select {
		case <-n.done:
			return
		default:
		}
		pgid := n.cmd.Process.Pid // Setpgid: the group is this NSD's own
		procs, _ := Descendants(pgid)
		_ = n.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-n.done:
		case <-time.After(5 * time.Second):
			_ = syscall.Kill(-pgid, syscall.SIGKILL) // the main process is still there: the group is ours
			<-n.done
			n.stopErr = fmt.Errorf("nsd did not stop on SIGTERM; killed")
		}
		// Children (xfrd, servers) normally exit with the main process.
		// Kill stragglers by pid, only those still in this NSD's group.
		waitFor(2*time.Second, 20*time.Millisecond, func() bool {
			left := false
			for _, p := range procs[1:] {
				if g, err := syscall.Getpgid(p); err == nil && g == pgid && !isZombie(p) {
					left = true
				}
			}
			return !left
		})
		for _, p := range procs[1:] {
			if g, err := syscall.Getpgid(p); err == nil && g == pgid && !isZombie(p) {
				_ = syscall.Kill(p, syscall.SIGKILL)
			}
		}
	})
	return n.stopErr
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
