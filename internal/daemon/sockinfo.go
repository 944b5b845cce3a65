package daemon

import (
	"fmt"
	"log/slog"
	"os/user"
	"strconv"
	"strings"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/internal/sockets"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// inspectSocket reads what santad needs from a socket fd: its cookie, and
// that it is a bound UDP socket or a listening TCP socket.
func inspectSocket(fd int) (api.SocketInfo, error) {
	typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
	if err != nil {
		return api.SocketInfo{}, fail(api.StatusInvalid, "the passed fd is not a socket (%v)", err)
	}
	proto, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_PROTOCOL)
	if err != nil {
		return api.SocketInfo{}, fail(api.StatusInvalid, "socket protocol: %v", err)
	}
	domain, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_DOMAIN)
	if err != nil {
		return api.SocketInfo{}, fail(api.StatusInvalid, "socket domain: %v", err)
	}
	ip := domain == unix.AF_INET || domain == unix.AF_INET6
	switch {
	case ip && typ == unix.SOCK_DGRAM && proto == unix.IPPROTO_UDP:
	case ip && typ == unix.SOCK_STREAM && proto == unix.IPPROTO_TCP:
		listening, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_ACCEPTCONN)
		if err != nil {
			return api.SocketInfo{}, fail(api.StatusInvalid, "SO_ACCEPTCONN: %v", err)
		}
		if listening != 1 {
			return api.SocketInfo{}, fail(api.StatusInvalid, "TCP socket is not listening: rules bind to the listening socket")
		}
	case ip && typ == unix.SOCK_STREAM && proto == unix.IPPROTO_MPTCP:
		return api.SocketInfo{}, fail(api.StatusInvalid, "the passed socket is an MPTCP socket: santad binds plain TCP "+
			"listeners (Go listens with MPTCP by default: net.ListenConfig.SetMultipathTCP(false))")
	default:
		return api.SocketInfo{}, fail(api.StatusInvalid, "the passed socket is neither an IPv4 or IPv6 UDP socket nor a TCP socket "+
			"(domain %d, type %d, protocol %d): santad offloads UDP sockets and listening TCP sockets", domain, typ, proto)
	}
	if err := inSantadsNetns(fd); err != nil {
		return api.SocketInfo{}, err
	}
	if err := boundWhereDelivered(fd); err != nil {
		return api.SocketInfo{}, err
	}
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return api.SocketInfo{}, fail(api.StatusInvalid, "socket address: %v", err)
	}
	info := api.SocketInfo{Protocol: uint32(proto)}
	switch a := sa.(type) {
	case *unix.SockaddrInet4:
		info.Family, info.Address, info.Port = 4, api.Bytes(a.Addr[:]), uint16(a.Port)
	case *unix.SockaddrInet6:
		info.Family, info.Address, info.Port = 6, api.Bytes(a.Addr[:]), uint16(a.Port)
	}
	if info.Port == 0 {
		return api.SocketInfo{}, fail(api.StatusInvalid, "the passed socket is not bound to a port: bind it before passing it to santad")
	}
	if info.Cookie, err = unix.GetsockoptUint64(fd, unix.SOL_SOCKET, unix.SO_COOKIE); err != nil {
		return api.SocketInfo{}, fail(api.StatusInternal, "SO_COOKIE: %v", err)
	}
	return info, nil
}

// inSantadsNetns refuses a socket of another network namespace than
// santad's: the rule processor, on santad's interfaces, looks sockets up in
// their namespace and never finds it, so its rules would never answer (a
// user in a namespace of its own may bind any port there, 53 included).
func inSantadsNetns(fd int) error {
	nsfd, err := unix.IoctlRetInt(fd, unix.SIOCGSKNS)
	if err != nil {
		return fail(api.StatusInternal, "the socket's network namespace (SIOCGSKNS): %v", err)
	}
	defer unix.Close(nsfd)
	var socketNS, santadNS unix.Stat_t
	if err := unix.Fstat(nsfd, &socketNS); err != nil {
		return fail(api.StatusInternal, "the socket's network namespace: %v", err)
	}
	if err := unix.Stat("/proc/thread-self/ns/net", &santadNS); err != nil {
		return fail(api.StatusInternal, "santad's network namespace: %v", err)
	}
	if socketNS.Dev != santadNS.Dev || socketNS.Ino != santadNS.Ino {
		return fail(api.StatusInvalid, "the socket is in another network namespace than santad's (net:[%d], not net:[%d]): "+
			"the rule processor answers requests on santad's interfaces only, for sockets of its namespace", socketNS.Ino, santadNS.Ino)
	}
	return nil
}

// boundWhereDelivered refuses a socket bound to an interface
// (SO_BINDTODEVICE) that hands the frames it receives to another one: a
// bridge, bond or VRF port, or the lower interface of a macvlan or ipvlan.
// The rule processor looks the socket up on the interface a frame arrives
// on, before that handover, and would find such a socket, which the kernel
// never gives the frame; and the socket the kernel does give it to, bound
// to the upper interface on the same port, may be another user's, whose
// requests the rules would then answer.
func boundWhereDelivered(fd int) error {
	ifindex, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_BINDTOIFINDEX)
	if err != nil {
		return fail(api.StatusInternal, "SO_BINDTOIFINDEX: %v", err)
	}
	if ifindex == 0 {
		return nil
	}
	l, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		return fail(api.StatusInternal, "the interface the socket is bound to (%d): %v", ifindex, err)
	}
	name := l.Attrs().Name
	if m := l.Attrs().MasterIndex; m != 0 {
		master := fmt.Sprintf("index %d", m)
		if ml, err := netlink.LinkByIndex(m); err == nil {
			master = ml.Attrs().Name
		}
		return fail(api.StatusInvalid, "the socket is bound to interface %s (SO_BINDTODEVICE), a port of %s, which the kernel "+
			"gives its frames to: rules on it would answer requests the kernel never delivers to it; "+
			"offload a socket bound to no interface", name, master)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return fail(api.StatusInternal, "interfaces: %v", err)
	}
	for _, u := range links {
		switch u.Type() {
		case "macvlan", "macvtap", "ipvlan", "ipvtap":
			if u.Attrs().ParentIndex == ifindex {
				return fail(api.StatusInvalid, "the socket is bound to interface %s (SO_BINDTODEVICE), the lower interface "+
					"of %s %s, which the kernel gives frames for it to: rules on it would answer requests the kernel never delivers to it; "+
					"offload a socket bound to no interface", name, u.Type(), u.Attrs().Name)
			}
		}
	}
	return nil
}

// socketOfProcess takes fd of process pid (pidfd_getfd) and inspects it.
func socketOfProcess(pid, fd int) (api.SocketInfo, error) {
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return api.SocketInfo{}, fail(api.StatusNotFound, "process %d: %v", pid, err)
	}
	defer unix.Close(pidfd)
	dup, err := unix.PidfdGetfd(pidfd, fd, 0)
	if err != nil {
		return api.SocketInfo{}, fail(api.StatusNotFound, "fd %d of process %d: %v", fd, pid, err)
	}
	defer unix.Close(dup)
	info, err := inspectSocket(dup)
	if err != nil {
		return api.SocketInfo{}, fail(statusOf(err), "fd %d of process %d: %v", fd, pid, err)
	}
	info.PID = uint32(pid)
	return info, nil
}

// socketsOnPort finds every unconnected UDP socket (proto api.ProtocolUDP)
// or every listening TCP socket (api.ProtocolTCP) bound to port by a process
// in santad's network namespace (the only one its interfaces answer for),
// each socket once however many processes share it. A socket santad would
// refuse to bind (inspectSocket) is left out, with a line in santad's log;
// if every one is, the error names each and why.
func socketsOnPort(port uint16, proto uint32) ([]api.SocketInfo, error) {
	find, what := sockets.FindUDPSockets, "a UDP socket bound to port %d"
	if proto == api.ProtocolTCP {
		find, what = sockets.FindTCPListeners, "a TCP socket listening on port %d (MPTCP listeners cannot be bound)"
	}
	pids, err := sockets.PeersInNamespace()
	if err != nil {
		return nil, err
	}
	seen := map[uint64]bool{}
	var out []api.SocketInfo
	var refused []string
	status := api.StatusNotFound
	for _, pid := range pids {
		found, err := find(pid, port)
		if err != nil {
			continue // exited meanwhile, or a kernel thread
		}
		for _, s := range found {
			if seen[s.Cookie] {
				continue
			}
			seen[s.Cookie] = true
			info, err := inspectSocket(s.FD)
			if err != nil {
				refused = append(refused, fmt.Sprintf("socket %d of pid %d: %v", s.Cookie, pid, err))
				status = statusOf(err)
				continue
			}
			info.PID = uint32(pid)
			out = append(out, info)
		}
		sockets.CloseAll(found)
	}
	switch {
	case len(out) > 0:
		for _, r := range refused {
			slog.Info("bind by port: left a socket out", "port", port, "refused", r)
		}
		return out, nil
	case len(refused) > 0:
		return nil, fail(status, "every socket on port %d is refused: %s", port, strings.Join(refused, "; "))
	}
	return nil, fail(api.StatusNotFound, "no process in santad's network namespace has "+what, port)
}

func lookupGroup(name string) (int, error) {
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("socket_group %q: %w (create the group, or leave socket_group out)", name, err)
	}
	return strconv.Atoi(g.Gid)
}
