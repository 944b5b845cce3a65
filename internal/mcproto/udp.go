package mcproto

import (
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"time"
)

// UDPHeaderLen is the length of the frame header memcached puts before
// every UDP request and reply.
const UDPHeaderLen = 8

// Frame is one memcached UDP datagram: the header (request id, sequence
// number, total number of datagrams of the message, a reserved zero) and
// the payload.
type Frame struct {
	ReqID, Seq, Total uint16
	Payload           []byte
}

// EncodeUDP frames a request: a single-datagram message (seq 0, total 1)
// with request id reqID.
func EncodeUDP(reqID uint16, payload []byte) []byte {
	b := make([]byte, UDPHeaderLen+len(payload))
	binary.BigEndian.PutUint16(b[0:], reqID)
	binary.BigEndian.PutUint16(b[4:], 1)
	copy(b[UDPHeaderLen:], payload)
	return b
}

// DecodeUDP splits a datagram into header and payload. The payload aliases
// b.
func DecodeUDP(b []byte) (Frame, error) {
	if len(b) < UDPHeaderLen {
		return Frame{}, fmt.Errorf("mcproto: %d-byte datagram is shorter than the UDP frame header", len(b))
	}
	return Frame{
		ReqID:   binary.BigEndian.Uint16(b[0:]),
		Seq:     binary.BigEndian.Uint16(b[2:]),
		Total:   binary.BigEndian.Uint16(b[4:]),
		Payload: b[UDPHeaderLen:],
	}, nil
}

// GetRequest is the text-protocol GET of one key, "get <key>\r\n": the
// request Santa answers from its rules.
func GetRequest(key string) []byte { return []byte("get " + key + "\r\n") }

// UDPClient sends memcached requests over UDP, one datagram each, and
// matches replies by request id. It is not safe for concurrent use.
type UDPClient struct {
	conn   *net.UDPConn
	nextID uint16
	buf    []byte
}

// DialUDP opens a UDP socket connected to a memcached UDP port, in the
// network namespace of the calling thread (call it inside testbed.Do to
// reach a server in a testbed).
func DialUDP(addr netip.AddrPort) (*UDPClient, error) {
	c, err := net.DialUDP("udp", nil, net.UDPAddrFromAddrPort(addr))
	if err != nil {
		return nil, fmt.Errorf("mcproto: %w", err)
	}
	// A random first id: a reply meant for an earlier client on the same
	// port cannot pass for one of ours.
	return &UDPClient{conn: c, nextID: uint16(rand.Uint32()), buf: make([]byte, 65536)}, nil
}

// Do sends payload (one or more text commands) in one datagram and returns
// the payload of the reply datagram with the same request id, waiting at
// most timeout. Datagrams with other ids (late replies to earlier
// requests) are skipped. A reply of more than one datagram (a large value,
// or a multi-key get) is ErrMultiDatagram. A timeout is an error that
// matches os.ErrDeadlineExceeded.
func (c *UDPClient) Do(payload []byte, timeout time.Duration) ([]byte, error) {
	id := c.nextID
	c.nextID++
	if err := c.conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return nil, fmt.Errorf("mcproto: %w", err)
	}
	if _, err := c.conn.Write(EncodeUDP(id, payload)); err != nil {
		return nil, fmt.Errorf("mcproto: %w", err)
	}
	for {
		n, err := c.conn.Read(c.buf)
		if err != nil {
			return nil, fmt.Errorf("mcproto: UDP request %d: %w", id, err)
		}
		f, err := DecodeUDP(c.buf[:n])
		if err != nil || f.ReqID != id {
			continue
		}
		if f.Total != 1 || f.Seq != 0 {
			return nil, fmt.Errorf("%w (request %d: datagram %d of %d)", ErrMultiDatagram, id, f.Seq, f.Total)
		}
		return append([]byte(nil), f.Payload...), nil
	}
}

// Get asks for one key over UDP. It returns the item and true on a hit,
// false on a miss.
func (c *UDPClient) Get(key string, timeout time.Duration) (Item, bool, error) {
	payload, err := c.Do(GetRequest(key), timeout)
	if err != nil {
		return Item{}, false, err
	}
	items, err := ParseValues(payload)
	if err != nil {
		return Item{}, false, err
	}
	return single(key, items)
}

// LocalAddr is the address of the client's socket.
func (c *UDPClient) LocalAddr() netip.AddrPort { return c.conn.LocalAddr().(*net.UDPAddr).AddrPort() }

// Close closes the socket.
func (c *UDPClient) Close() error { return c.conn.Close() }

// DialUDPConn is a Conn that sends text-protocol commands over UDP, one
// datagram per request (memcached answers writes over UDP too), from the
// calling thread's network namespace. A value must fit in one datagram
// (with its command line, at most 64 KiB less the headers; Gets of a
// value of more than about 1.4 kB is ErrMultiDatagram). A lost datagram
// is a timeout: the write may or may not have happened.
func DialUDPConn(addr netip.AddrPort) (Conn, error) {
	c, err := DialUDP(addr)
	if err != nil {
		return nil, err
	}
	return &textConn{datagrams{c}}, nil
}
