package httpctl

import (
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// bindListeners has santad give every TCP listening socket bound to port
// (every process, IPv4 and IPv6, every SO_REUSEPORT member) a rule set and
// returns them. It is the controller's only call that depends on santad's
// TCP support.
func bindListeners(c *santa.Client, port uint16) ([]api.SocketInfo, error) {
	socks, err := c.BindPortProtocol(port, api.ProtocolTCP, santa.SampleOptions{})
	if err != nil {
		return nil, fmt.Errorf("attach to the TCP listeners of port %d: %w", port, err)
	}
	var out []api.SocketInfo
	for _, s := range socks {
		if s.Protocol == api.ProtocolTCP {
			out = append(out, s)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no TCP socket listens on port %d (is nginx running in this network namespace?)", port)
	}
	return out, nil
}

// listenerCookies returns the cookies (SO_COOKIE) of the TCP sockets
// listening on port in the caller's network namespace, IPv4 and IPv6. It
// asks sock_diag for listening sockets only, so its cost does not grow
// with the connections: cheap enough to ask every second whether nginx
// opened more (a reload with another listen, or more workers with
// reuseport).
func listenerCookies(port uint16) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	for _, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		req := nl.NewNetlinkRequest(nl.SOCK_DIAG_BY_FAMILY, unix.NLM_F_DUMP)
		req.AddData(&listenersRequest{family: family})
		msgs, err := req.Execute(unix.NETLINK_INET_DIAG, nl.SOCK_DIAG_BY_FAMILY)
		if err != nil && !errors.Is(err, nl.ErrDumpInterrupted) {
			if family == unix.AF_INET6 && errors.Is(err, syscall.ENOENT) {
				continue // IPv6 disabled
			}
			return nil, fmt.Errorf("list the listening sockets of port %d (sock_diag): %w", port, err)
		}
		for _, m := range msgs {
			// struct inet_diag_msg: family, state, timer, retrans, then
			// inet_diag_sockid: sport (big endian), dport, src[16], dst[16],
			// if, cookie[2]
			if len(m) < 52 || m[1] != tcpListenState || binary.BigEndian.Uint16(m[4:6]) != port {
				continue
			}
			out[uint64(nl.NativeEndian().Uint32(m[44:48]))|uint64(nl.NativeEndian().Uint32(m[48:52]))<<32] = true
		}
	}
	return out, nil
}

// tcpListenState is TCP_LISTEN.
const tcpListenState = 10

// listenersRequest is a struct inet_diag_req_v2 for the TCP sockets of
// family in state LISTEN.
type listenersRequest struct{ family uint8 }

func (r *listenersRequest) Len() int { return 56 }

func (r *listenersRequest) Serialize() []byte {
	b := make([]byte, 56)
	b[0], b[1] = r.family, unix.IPPROTO_TCP
	nl.NativeEndian().PutUint32(b[4:8], 1<<tcpListenState)
	// inet_diag_sockid zero but the cookie: INET_DIAG_NOCOOKIE
	nl.NativeEndian().PutUint32(b[48:52], ^uint32(0))
	nl.NativeEndian().PutUint32(b[52:56], ^uint32(0))
	return b
}
