package mcproto

import (
	"bufio"
	"bytes"
	"fmt"
	"net"
	"time"
)

// transport carries one request and its reply at a time; parse reads the
// reply from r.
type transport interface {
	roundTrip(req []byte, parse func(r *bufio.Reader) error) error
	Close() error
}

// stream is a TCP connection to memcached.
type stream struct {
	conn net.Conn
	r    *bufio.Reader
	err  error // the first I/O or framing error; the stream is out of step after it
}

// dialStream connects to a memcached TCP address ("host:port") from the
// calling thread's network namespace.
func dialStream(addr string) (*stream, error) {
	c, err := net.DialTimeout("tcp", addr, DefaultTimeout)
	if err != nil {
		return nil, fmt.Errorf("mcproto: %w", err)
	}
	return &stream{conn: c, r: bufio.NewReader(c)}, nil
}

func (s *stream) roundTrip(req []byte, parse func(r *bufio.Reader) error) error {
	if s.err != nil {
		return fmt.Errorf("mcproto: connection unusable after an earlier error: %w", s.err)
	}
	if err := s.conn.SetDeadline(time.Now().Add(DefaultTimeout)); err != nil {
		s.err = err
		return fmt.Errorf("mcproto: %w", err)
	}
	if _, err := s.conn.Write(req); err != nil {
		s.err = err
		return fmt.Errorf("mcproto: %w", err)
	}
	err := parse(s.r)
	if err != nil && !isOutcome(err) {
		s.err = err
	}
	return err
}

// Close closes the connection. After an I/O error it resets it instead
// (linger 0): a request that got no reply may still sit in the kernel's
// retransmission queue, and a plain close would go on sending it, so that
// memcached could apply a write seconds after its caller gave up on it
// (TestNoStaleReadsUnderLoss saw a replace land 3 s late, after 25 newer
// writes of its key).
func (s *stream) Close() error {
	if tc, ok := s.conn.(*net.TCPConn); ok && s.err != nil {
		tc.SetLinger(0)
	}
	return s.conn.Close()
}

// datagrams carries each request in one UDP datagram and takes the reply
// from one datagram.
type datagrams struct{ c *UDPClient }

func (d datagrams) roundTrip(req []byte, parse func(r *bufio.Reader) error) error {
	payload, err := d.c.Do(req, DefaultTimeout)
	if err != nil {
		return err
	}
	r := bufio.NewReader(bytes.NewReader(payload))
	if err := parse(r); err != nil {
		return err
	}
	if r.Buffered() > 0 {
		return fmt.Errorf("mcproto: %d bytes after the reply in the datagram", r.Buffered())
	}
	return nil
}

func (d datagrams) Close() error { return d.c.Close() }
