package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"net/netip"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// The stamp's layout (bpf/tcp.h): time, FIN, options, MAC bits.
const (
	stampMACBits   = 18
	stampOptsShift = 18
	stampFIN       = 1 << 25
	stampTimeShift = 26
	optsNoWscale   = 15
	flowOptsKnown  = uint8(santaSantaLimitSANTA_FLOW_OPTS_KNOWN)
	santaWindow    = 64240 // SANTA_WINDOW
)

// DefaultTCPIdleClose is how long a socket-less keep-alive connection may
// stay idle before santad closes it, as nginx's keepalive_timeout does.
// The sweep rounds it up to stamp units and closes a flow idle for more
// than that many, on its next round: up to three units (26 s) later.
// MaxTCPIdleClose (13 units) has the FIN out before the connection's
// stamps expire (16 units, at least 128 s): a client coming back after
// that would be reset.
const (
	DefaultTCPIdleClose = 75 * time.Second
	MaxTCPIdleClose     = 110 * time.Second
)

// siphash24 is SipHash-2-4 of whole little-endian words, the stamp MAC's
// (siphash24_6 in bpf/tcp.h).
func siphash24(k0, k1 uint64, m []uint64) uint64 {
	v0, v1, v2, v3 := k0^0x736f6d6570736575, k1^0x646f72616e646f6d, k0^0x6c7967656e657261, k1^0x7465646279746573
	round := func() {
		v0 += v1
		v1 = bits.RotateLeft64(v1, 13) ^ v0
		v0 = bits.RotateLeft64(v0, 32)
		v2 += v3
		v3 = bits.RotateLeft64(v3, 16) ^ v2
		v0 += v3
		v3 = bits.RotateLeft64(v3, 21) ^ v0
		v2 += v1
		v1 = bits.RotateLeft64(v1, 17) ^ v2
		v2 = bits.RotateLeft64(v2, 32)
	}
	for _, w := range m {
		v3 ^= w
		round()
		round()
		v0 ^= w
	}
	b := uint64(len(m)*8) << 56
	v3 ^= b
	round()
	round()
	v0 ^= b
	v2 ^= 0xff
	for i := 0; i < 4; i++ {
		round()
	}
	return v0 ^ v1 ^ v2 ^ v3
}

// tupleBytes is a flow key as the program hashes it: the 36 bytes of
// struct bpf_sock_tuple (an IPv4 tuple's 12, zeros after).
func tupleBytes(k *santaBpfSockTuple) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(k)), unsafe.Sizeof(*k))
}

// flowIPv4 says whether flow key k is an IPv4 connection's.
func flowIPv4(t []byte) bool {
	for _, b := range t[12:] {
		if b != 0 {
			return false
		}
	}
	return true
}

// flowStamp is the stamp bpf/tcp.h's stamp_make makes at unit for the
// connection of flow key k (tuple t), with eBPF's FIN if fin, the
// connection's option bits and its listener's owner uid; ok is false if no
// key serves unit's epoch.
func (d *Dataplane) flowStamp(t []byte, unit uint64, fin bool, opts, uid uint32) (stamp uint32, ok bool, err error) {
	epoch := unit >> stampEpochShift
	var key StampKey
	if err := d.objs.SantaTcpKeys.Lookup(uint32(epoch%stampKeySlots), &key); err != nil {
		return 0, false, fmt.Errorf("stamp key: %w", err)
	}
	if key.EpochPlus1 != epoch+1 {
		return 0, false, nil
	}
	family, finOpts := uint32(6), opts<<1
	if flowIPv4(t) {
		family = 4
	}
	if fin {
		finOpts |= 1
	}
	m := make([]uint64, 6)
	for i := 0; i < 4; i++ {
		m[i] = binary.LittleEndian.Uint64(t[8*i:])
	}
	m[4] = uint64(binary.LittleEndian.Uint32(t[32:])) | uint64(finOpts|family<<8)<<32
	m[5] = unit | uint64(uid)<<32
	stamp = uint32(unit&63)<<stampTimeShift | opts<<stampOptsShift | uint32(siphash24(key.K0, key.K1, m))&(1<<stampMACBits-1)
	if fin {
		stamp |= stampFIN
	}
	return stamp, true, nil
}

// finSender sends the FINs of idle socket-less connections through raw IP
// sockets of the network namespace santad attached in: the kernel routes
// them and resolves the client's link address.
type finSender struct{ fd4, fd6 int }

func newFINSender() (*finSender, error) {
	fd4, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		return nil, fmt.Errorf("raw IPv4 socket for the FINs of idle TCP connections: %w", err)
	}
	fd6, err := unix.Socket(unix.AF_INET6, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.IPPROTO_RAW)
	if err != nil {
		unix.Close(fd4)
		return nil, fmt.Errorf("raw IPv6 socket for the FINs of idle TCP connections: %w", err)
	}
	return &finSender{fd4, fd6}, nil
}

func (s *finSender) close() error {
	return errors.Join(unix.Close(s.fd4), unix.Close(s.fd6))
}

// sendFIN sends eBPF's FIN-ACK on the connection of flow key t (the
// client's 4-tuple as the program sees it): seq is eBPF's next byte, ack
// the client's, stamp the TSval.
func (s *finSender) sendFIN(t []byte, seq, ack, stamp uint32, opts uint8) error {
	var client, server netip.Addr
	var cport, sport uint16
	if flowIPv4(t) {
		client, server = netip.AddrFrom4([4]byte(t[0:4])), netip.AddrFrom4([4]byte(t[4:8]))
		cport, sport = binary.BigEndian.Uint16(t[8:]), binary.BigEndian.Uint16(t[10:])
	} else {
		client, server = netip.AddrFrom16([16]byte(t[0:16])), netip.AddrFrom16([16]byte(t[16:32]))
		cport, sport = binary.BigEndian.Uint16(t[32:]), binary.BigEndian.Uint16(t[34:])
	}
	tcp := make([]byte, 32)
	binary.BigEndian.PutUint16(tcp[0:], sport)
	binary.BigEndian.PutUint16(tcp[2:], cport)
	binary.BigEndian.PutUint32(tcp[4:], seq)
	binary.BigEndian.PutUint32(tcp[8:], ack)
	tcp[12] = 8 << 4
	tcp[13] = 0x11 // FIN, ACK
	window := uint16(santaWindow)
	if (opts>>1)&15 != optsNoWscale {
		window = santaWindow >> santaSantaLimitSANTA_TCP_WSCALE
	}
	binary.BigEndian.PutUint16(tcp[14:], window)
	copy(tcp[20:], []byte{1, 1, 8, 10})
	binary.BigEndian.PutUint32(tcp[24:], stamp)
	// TSecr 0: the client's last TSval is not kept; it acks no new data,
	// so no round-trip time is taken from it
	binary.BigEndian.PutUint16(tcp[16:], tcpChecksum(server, client, tcp))
	if client.Is4() {
		ip := make([]byte, 20, 20+len(tcp))
		ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_TCP
		binary.BigEndian.PutUint16(ip[2:], uint16(20+len(tcp)))
		binary.BigEndian.PutUint16(ip[6:], 0x4000) // DF
		s4, c4 := server.As4(), client.As4()
		copy(ip[12:], s4[:])
		copy(ip[16:], c4[:])
		return unix.Sendto(s.fd4, append(ip, tcp...), 0, &unix.SockaddrInet4{Addr: c4})
	}
	ip := make([]byte, 40, 40+len(tcp))
	ip[0], ip[6], ip[7] = 0x60, unix.IPPROTO_TCP, 64
	binary.BigEndian.PutUint16(ip[4:], uint16(len(tcp)))
	s16, c16 := server.As16(), client.As16()
	copy(ip[8:], s16[:])
	copy(ip[24:], c16[:])
	return unix.Sendto(s.fd6, append(ip, tcp...), 0, &unix.SockaddrInet6{Addr: c16})
}

// tcpChecksum is the TCP checksum of segment seg from src to dst.
func tcpChecksum(src, dst netip.Addr, seg []byte) uint16 {
	var sum uint32
	add := func(b []byte) {
		for i := 0; i+1 < len(b); i += 2 {
			sum += uint32(binary.BigEndian.Uint16(b[i:]))
		}
		if len(b)%2 == 1 {
			sum += uint32(b[len(b)-1]) << 8
		}
	}
	add(src.AsSlice())
	add(dst.AsSlice())
	var pseudo [4]byte
	binary.BigEndian.PutUint16(pseudo[2:], uint16(len(seg)))
	sum += unix.IPPROTO_TCP
	add(pseudo[:])
	add(seg)
	for sum>>16 != 0 {
		sum = sum&0xffff + sum>>16
	}
	return ^uint16(sum)
}
