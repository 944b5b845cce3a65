//go:build linux

package testbed

import (
	"fmt"
	"net/netip"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/santa-offload/santa/internal/mcproto"
)

// MemcachedPath is Debian's memcached.
var MemcachedPath = "/usr/bin/memcached"

// MemcachedOptions configure StartMemcached. The zero value listens on
// port 11211 with one worker thread and 64 MB, unpinned.
type MemcachedOptions struct {
	Port     int  // TCP and UDP port (-p and -U); 0: 11211
	Threads  int  // worker threads (-t); 0: 1
	Pin      bool // pin every thread to CPU (taskset at start)
	CPU      int  // the CPU for Pin
	MemoryMB int  // item memory (-m); 0: 64
	// IPv4Only listens on the server's IPv4 address only: one TCP and one
	// UDP socket (Addr6 and Loopback are then invalid).
	IPv4Only bool
	Extra    []string      // more command-line arguments
	Timeout  time.Duration // to wait until it answers; 0: 10 s
}

// Memcached is a running memcached in the server namespace of a testbed.
type Memcached struct {
	Addr4, Addr6 netip.AddrPort // the server's IPv4 and IPv6 address, TCP and UDP
	Loopback     netip.AddrPort // 127.0.0.1, reachable only inside the server namespace

	serverProcess
}

// StartMemcached starts memcached in the server namespace, listening on
// TCP and UDP on the server's IPv4 and IPv6 addresses and on 127.0.0.1,
// as user memcache (Debian's; nobody if there is none: memcached refuses
// to run as root). It returns once memcached answers "version" over TCP
// and over UDP on both addresses from the client namespace. It is stopped
// by Stop or when the testbed closes.
func (tb *Testbed) StartMemcached(o MemcachedOptions) (*Memcached, error) {
	if o.Port == 0 {
		o.Port = 11211
	}
	if o.Threads <= 0 {
		o.Threads = 1
	}
	if o.MemoryMB <= 0 {
		o.MemoryMB = 64
	}
	if o.Timeout == 0 {
		o.Timeout = 10 * time.Second
	}
	port := uint16(o.Port)
	m := &Memcached{
		Addr4:    netip.AddrPortFrom(tb.Server.IP4, port),
		Addr6:    netip.AddrPortFrom(tb.Server.IP6, port),
		Loopback: netip.AddrPortFrom(netip.AddrFrom4([4]byte{127, 0, 0, 1}), port),
	}
	if o.IPv4Only {
		m.Addr6, m.Loopback = netip.AddrPort{}, netip.AddrPort{}
	}
	username := "memcache"
	if _, err := user.Lookup(username); err != nil {
		username = "nobody"
	}
	args := append([]string{MemcachedPath, "-u", username,
		"-p", strconv.Itoa(o.Port), "-U", strconv.Itoa(o.Port),
		"-l", m.listen(),
		"-t", strconv.Itoa(o.Threads), "-m", strconv.Itoa(o.MemoryMB)}, o.Extra...)
	if err := m.start(tb, "", o.Pin, o.CPU, args); err != nil {
		return nil, fmt.Errorf("memcached: %w", err)
	}
	tb.addCleanup(m.Stop)

	if err := m.waitReady(tb, o.Timeout); err != nil {
		m.Stop()
		return nil, fmt.Errorf("memcached: %w", err)
	}
	return m, nil
}

// listen is memcached's -l: its valid addresses.
func (m *Memcached) listen() string {
	var as []string
	for _, a := range []netip.AddrPort{m.Addr4, m.Addr6, m.Loopback} {
		switch {
		case a.Addr().Is6():
			as = append(as, "["+a.Addr().String()+"]")
		case a.IsValid():
			as = append(as, a.Addr().String())
		}
	}
	return strings.Join(as, ",")
}

// waitReady polls until memcached answers "version" over TCP and UDP on
// the server's addresses from the client namespace.
func (m *Memcached) waitReady(tb *Testbed, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for _, a := range []netip.AddrPort{m.Addr4, m.Addr6} {
		if !a.IsValid() {
			continue
		}
		for {
			select {
			case <-m.done:
				return fmt.Errorf("exited: %v: %s", m.werr, m.out.String())
			default:
			}
			err := tb.Client.Do(func() error { return versionOverTCPAndUDP(a) })
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("no version reply from %v within %v (last: %v): %s", a, timeout, err, m.out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return nil
}

// versionOverTCPAndUDP asks a for its version over TCP and over UDP.
func versionOverTCPAndUDP(a netip.AddrPort) error {
	c, err := mcproto.DialText(a.String())
	if err != nil {
		return err
	}
	defer c.Close()
	if _, err := c.Version(); err != nil {
		return fmt.Errorf("TCP: %w", err)
	}
	u, err := mcproto.DialUDPConn(a)
	if err != nil {
		return err
	}
	defer u.Close()
	if _, err := u.Version(); err != nil {
		return fmt.Errorf("UDP: %w", err)
	}
	return nil
}

func (m *Memcached) PID() int { return m.cmd.Process.Pid }

// Threads returns memcached's thread ids (workers, listener and helper
// threads), e.g. for CPU accounting with ThreadRunTime.
func (m *Memcached) Threads() ([]int, error) {
	if !m.Running() {
		return nil, fmt.Errorf("memcached is not running")
	}
	return Threads(m.PID())
}

// Log is what memcached wrote to stdout and stderr (the first MiB).
func (m *Memcached) Log() string { return m.out.String() }

// Stop terminates memcached: SIGTERM, then SIGKILL to its process group
// after 10 s. Safe to call more than once; the testbed calls it on Close.
func (m *Memcached) Stop() error {
	m.stopOnce.Do(func() {
		if !m.Running() {
			return
		}
		_ = m.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-m.done:
		case <-time.After(stopGrace):
			_ = syscall.Kill(-m.PID(), syscall.SIGKILL) // Setpgid: the group is memcached's own
			<-m.done
			m.stopErr = fmt.Errorf("memcached did not stop on SIGTERM within %v; killed", stopGrace)
		}
	})
	return m.stopErr
}

// PIDs is the memcached process (its threads do all the work).
func (m *Memcached) PIDs() ([]int, error) { return []int{m.PID()}, nil }
