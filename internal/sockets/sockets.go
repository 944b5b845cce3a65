//go:build linux

// Package sockets finds the sockets another process serves on (unconnected
// UDP sockets, listening TCP sockets) and duplicates them into this process,
// so rules can be bound to them (a rule set is keyed by the socket's
// SO_COOKIE, and the kernel only makes a cookie when someone asks for it).
//
// It is how Santa offloads an unmodified server: santad's `attach --pid`
// and the namespace tests use it with NSD. It needs the right to ptrace the
// target (root, or CAP_SYS_PTRACE), as pidfd_getfd does.
package sockets

import (
	"bufio"
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Socket is one socket of the target process, duplicated into this one.
type Socket struct {
	FD     int            // our duplicate (O_CLOEXEC); close it with Close
	Cookie uint64         // SO_COOKIE, the same for every fd of the socket
	Local  netip.AddrPort // bound address (unspecified for a wildcard bind)
	Inode  uint64         // socket:[inode] in /proc/PID/fd
}

// Close closes the duplicated fd. The socket itself lives on in the target.
func (s Socket) Close() error { return unix.Close(s.FD) }

// CloseAll closes every socket's fd.
func CloseAll(ss []Socket) error {
	var errs []error
	for _, s := range ss {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// FindUDPSockets returns the unconnected UDP sockets (IPv4 and IPv6) that
// process pid holds open and that are bound to port (0: any port), each
// duplicated into this process with pidfd_getfd and with its SO_COOKIE read
// (which also makes the kernel assign one). Sockets are looked up in the
// target's own network namespace (/proc/PID/net/udp{,6}), so the caller may
// run in any namespace. A socket held through several fds is returned
// once. Connected UDP sockets are left out: they only receive from their
// peer and serve no port. No matching socket is not an error: the result is
// then empty. The caller closes the returned fds (CloseAll).
func FindUDPSockets(pid int, port uint16) ([]Socket, error) {
	return find(pid, port, udpTables)
}

// FindTCPListeners returns the TCP sockets (IPv4 and IPv6) that process pid
// holds open and that listen on port (0: any port), like FindUDPSockets
// (/proc/PID/net/tcp{,6}, state LISTEN). Connections, accepted or not, are
// left out: rules bind to the listening socket. So are MPTCP listeners
// (SO_PROTOCOL IPPROTO_MPTCP, Go's default since 1.24), which the table lists
// by their TCP subflow: the fd is not the socket the kernel looks up.
func FindTCPListeners(pid int, port uint16) ([]Socket, error) {
	return find(pid, port, tcpTables)
}

// table is how to find one protocol's sockets in /proc/PID/net.
type table struct {
	name  string   // for errors: "UDP sockets", "TCP listeners"
	files []string // under /proc/PID, the v4 table first
	proto int      // SO_PROTOCOL of a socket found
	// want says whether an entry of the files is a socket to return
	want func(e procEntry) bool
}

var (
	udpTables = table{name: "UDP sockets", files: []string{"net/udp", "net/udp6"}, proto: unix.IPPROTO_UDP,
		want: func(e procEntry) bool { return e.remote.Port() == 0 }} // unconnected
	tcpTables = table{name: "TCP listeners", files: []string{"net/tcp", "net/tcp6"}, proto: unix.IPPROTO_TCP,
		want: func(e procEntry) bool { return e.state == tcpListen }}
)

// tcpListen is TCP_LISTEN, the st column of a listening socket.
const tcpListen = 0x0a

func find(pid int, port uint16, tab table) ([]Socket, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("find %s: bad pid %d", tab.name, pid)
	}
	proc := filepath.Join("/proc", strconv.Itoa(pid))
	bound := map[uint64]netip.AddrPort{}
	for _, f := range tab.files {
		if err := readTable(filepath.Join(proc, f), port, tab.want, bound); err != nil {
			return nil, fmt.Errorf("find %s of pid %d: %w", tab.name, pid, err)
		}
	}
	if len(bound) == 0 {
		return nil, nil
	}

	cands, err := heldSockets(pid, bound)
	if err != nil {
		return nil, fmt.Errorf("find %s of pid %d: %w", tab.name, pid, err)
	}
	if len(cands) == 0 {
		return nil, nil
	}

	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return nil, fmt.Errorf("pidfd_open(%d): %w", pid, err)
	}
	defer unix.Close(pidfd)

	var out []Socket
	fail := func(err error) ([]Socket, error) {
		CloseAll(out)
		return nil, err
	}
	for _, c := range cands {
		fd, err := unix.PidfdGetfd(pidfd, c.fd, 0)
		if err != nil {
			if errors.Is(err, unix.EBADF) {
				continue // the target closed it meanwhile
			}
			return fail(fmt.Errorf("pidfd_getfd(pid %d, fd %d): %w", pid, c.fd, err))
		}
		s := Socket{FD: fd, Inode: c.inode}
		// The target may have reused the fd number for another file
		// between readlink and pidfd_getfd: check it is still the socket.
		var st unix.Stat_t
		if err := unix.Fstat(fd, &st); err != nil || st.Ino != c.inode || st.Mode&unix.S_IFMT != unix.S_IFSOCK {
			unix.Close(fd)
			continue
		}
		if proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL); err != nil || proto != tab.proto {
			unix.Close(fd)
			continue
		}
		if s.Cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
			unix.Close(fd)
			return fail(fmt.Errorf("SO_COOKIE of pid %d fd %d: %w", pid, c.fd, err))
		}
		if s.Local, err = localAddr(fd); err != nil {
			unix.Close(fd)
			return fail(fmt.Errorf("getsockname of pid %d fd %d: %w", pid, c.fd, err))
		}
		out = append(out, s)
	}
	slices.SortFunc(out, func(a, b Socket) int {
		if c := a.Local.Compare(b.Local); c != 0 {
			return c
		}
		return cmp.Compare(a.Cookie, b.Cookie)
	})
	return out, nil
}

// heldSocket is an fd of a process that holds a socket.
type heldSocket struct {
	fd    int
	inode uint64
}

// heldSockets lists the fds of process pid that hold a socket whose inode
// is in bound, each socket once.
func heldSockets[V any](pid int, bound map[uint64]V) ([]heldSocket, error) {
	fdDir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(fdDir)
	if err != nil {
		return nil, err
	}
	var held []heldSocket
	seen := map[uint64]bool{}
	for _, e := range ents {
		fd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		link, err := os.Readlink(filepath.Join(fdDir, e.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		ino, ok := socketInode(link)
		if !ok || seen[ino] {
			continue
		}
		if _, ok := bound[ino]; !ok {
			continue
		}
		seen[ino] = true
		held = append(held, heldSocket{fd, ino})
	}
	return held, nil
}

// Listener is a socket a process serves on: an unconnected UDP socket or a
// listening TCP socket.
type Listener struct {
	Protocol int // unix.IPPROTO_UDP or unix.IPPROTO_TCP
	Local    netip.AddrPort
}

// ListenersInNamespace returns the listeners of each process in the
// caller's network namespace (the caller left out), by pid, on any port.
// Unlike FindUDPSockets it duplicates no socket: it reads the namespace's
// socket tables once and the processes' fd links.
func ListenersInNamespace() (map[int][]Listener, error) {
	listeners := map[uint64]Listener{}
	for _, tab := range []table{udpTables, tcpTables} {
		bound := map[uint64]netip.AddrPort{}
		for _, f := range tab.files {
			if err := readTable(filepath.Join("/proc/self", f), 0, tab.want, bound); err != nil {
				return nil, fmt.Errorf("list the %s of this network namespace: %w", tab.name, err)
			}
		}
		for ino, local := range bound {
			listeners[ino] = Listener{Protocol: tab.proto, Local: local}
		}
	}
	pids, err := PeersInNamespace()
	if err != nil {
		return nil, err
	}
	out := map[int][]Listener{}
	for _, pid := range pids {
		held, err := heldSockets(pid, listeners)
		if err != nil {
			continue // exited meanwhile, or a kernel thread
		}
		for _, h := range held {
			out[pid] = append(out[pid], listeners[h.inode])
		}
	}
	return out, nil
}

// PeersInNamespace returns the processes in the caller's network namespace,
// the caller left out.
func PeersInNamespace() ([]int, error) {
	procs, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	ourNS, err := os.Stat("/proc/self/ns/net")
	if err != nil {
		return nil, err
	}
	self := os.Getpid()
	var pids []int
	for _, p := range procs {
		pid, err := strconv.Atoi(p.Name())
		if err != nil || pid == self {
			continue
		}
		if ns, err := os.Stat(filepath.Join("/proc", p.Name(), "ns", "net")); err == nil && os.SameFile(ns, ourNS) {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// socketInode parses a /proc/PID/fd link of the form socket:[12345].
func socketInode(link string) (uint64, bool) {
	s, ok := strings.CutPrefix(link, "socket:[")
	if !ok {
		return 0, false
	}
	s, ok = strings.CutSuffix(s, "]")
	if !ok {
		return 0, false
	}
	n, err := strconv.ParseUint(s, 10, 64)
	return n, err == nil
}

// readTable adds the inodes of the sockets bound to port (0: any) that want
// accepts, listed in a /proc/net/{udp,tcp}{,6} file.
func readTable(path string, port uint16, want func(procEntry) bool, into map[uint64]netip.AddrPort) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) && strings.HasSuffix(path, "6") {
		return nil // IPv6 disabled
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 4096), 1<<20)
	first := true
	for sc.Scan() {
		if first { // header
			first = false
			continue
		}
		e, err := parseProcLine(sc.Text())
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		if !want(e) || (port != 0 && e.local.Port() != port) || e.inode == 0 {
			continue
		}
		into[e.inode] = e.local
	}
	return sc.Err()
}

// procEntry is one socket of a /proc/net/{udp,tcp}{,6} table.
type procEntry struct {
	local, remote netip.AddrPort
	state         uint8 // st: TCP_* (UDP sockets show 07, TCP_CLOSE, unless connected)
	inode         uint64
}

// parseProcLine parses one entry of /proc/net/{udp,tcp}{,6}, which share
// their first columns:
//
//	sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode ...
//	0: 0100007F:0035 00000000:0000 07 00000000:00000000 00:00000000 00000000     0        0 12345 ...
//
// Addresses are printed as 32-bit words in host byte order, ports and the
// state as hex numbers.
func parseProcLine(line string) (procEntry, error) {
	f := strings.Fields(line)
	if len(f) < 10 {
		return procEntry{}, fmt.Errorf("short line %q", line)
	}
	var e procEntry
	var err error
	if e.local, err = parseProcAddr(f[1]); err != nil {
		return e, err
	}
	if e.remote, err = parseProcAddr(f[2]); err != nil {
		return e, err
	}
	st, err := strconv.ParseUint(f[3], 16, 8)
	if err != nil {
		return e, fmt.Errorf("state %q: %w", f[3], err)
	}
	e.state = uint8(st)
	if e.inode, err = strconv.ParseUint(f[9], 10, 64); err != nil {
		return e, fmt.Errorf("inode %q: %w", f[9], err)
	}
	return e, nil
}

func parseProcAddr(s string) (netip.AddrPort, error) {
	a, p, ok := strings.Cut(s, ":")
	if !ok {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	port, err := strconv.ParseUint(p, 16, 16)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("port in %q: %w", s, err)
	}
	raw, err := hex.DecodeString(a)
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.AddrPort{}, fmt.Errorf("address %q", s)
	}
	// each 32-bit word is printed as a host-order number
	b := make([]byte, len(raw))
	for i := 0; i < len(raw); i += 4 {
		binary.NativeEndian.PutUint32(b[i:], binary.BigEndian.Uint32(raw[i:]))
	}
	addr, _ := netip.AddrFromSlice(b)
	return netip.AddrPortFrom(addr, uint16(port)), nil
}

func localAddr(fd int) (netip.AddrPort, error) {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return netip.AddrPort{}, err
	}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		return netip.AddrPortFrom(netip.AddrFrom4(a.Addr), uint16(a.Port)), nil
	case *unix.SockaddrInet6:
		return netip.AddrPortFrom(netip.AddrFrom16(a.Addr), uint16(a.Port)), nil
	}
	return netip.AddrPort{}, fmt.Errorf("not an IP socket: %T", sa)
}
