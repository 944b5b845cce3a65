//go:build linux

package mcgen

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// RcvbufForLiveFrames is the receive buffer (bytes, as passed to
// SO_RCVBUF) that holds as many of this generator's datagrams as the
// default 212992 bytes hold of socket-sent ones.
const RcvbufForLiveFrames = 5 * 212992

// SetUDPRcvbuf sets the receive buffer of every UDP (datagram) socket of
// process pid to bytes (SO_RCVBUFFORCE on a copy of its descriptors taken
// with pidfd_getfd; needs root) and returns how many sockets it changed.
//
// Why: live frames are whole pages, so at a socket server every datagram
// of this generator is an skb with a truesize of 4240 bytes instead of 832
// (the same datagram sent from a socket), and the default 212992-byte
// buffer holds only 50 of them instead of 256; bursts or short stalls of the
// server then overflow it (UdpRcvbufErrors) where real traffic would not.
// net.core.rmem_default cannot be raised per namespace (read-only outside
// the initial namespace on this kernel) and memcached has no option for it.
// Five times the default (RcvbufForLiveFrames) restores the usual capacity.
// The kernel doubles the value it stores (SO_RCVBUF semantics).
func SetUDPRcvbuf(pid, bytes int) (int, error) {
	if bytes <= 0 {
		return 0, fmt.Errorf("receive buffer of %d bytes", bytes)
	}
	pidfd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return 0, fmt.Errorf("pidfd_open %d: %w", pid, err)
	}
	defer unix.Close(pidfd)
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	ents, err := os.ReadDir(dir)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, e := range ents {
		target, err := os.Readlink(dir + "/" + e.Name())
		if err != nil || !strings.HasPrefix(target, "socket:") {
			continue
		}
		tfd, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		fd, err := unix.PidfdGetfd(pidfd, tfd, 0)
		if err != nil {
			errs = append(errs, fmt.Errorf("pidfd_getfd %d/%d: %w", pid, tfd, err))
			continue
		}
		typ, err := unix.GetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_TYPE)
		if err == nil && typ == unix.SOCK_DGRAM {
			if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, bytes); err != nil {
				errs = append(errs, fmt.Errorf("SO_RCVBUFFORCE on %d/%d: %w", pid, tfd, err))
			} else {
				n++
			}
		}
		unix.Close(fd)
	}
	return n, errors.Join(errs...)
}
