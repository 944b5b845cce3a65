package mcproto

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// The binary protocol: a 24-byte header (magic 0x80 request, 0x81
// response), then extras, key and value.
const (
	binRequest   = 0x80
	binResponse  = 0x81
	binHeaderLen = 24
)

// Binary opcodes.
const (
	opGet     = 0x00
	opSet     = 0x01
	opAdd     = 0x02
	opReplace = 0x03
	opDelete  = 0x04
	opIncr    = 0x05
	opDecr    = 0x06
	opFlush   = 0x08
	opVersion = 0x0b
	opAppend  = 0x0e
	opPrepend = 0x0f
	opTouch   = 0x1c
)

// Binary response statuses with an outcome of their own.
const (
	statusOK        = 0x0000
	statusNotFound  = 0x0001
	statusExists    = 0x0002
	statusNotStored = 0x0005
)

// binaryConn speaks the binary protocol (deprecated by memcached but still
// served in 1.6 and detected per connection from the first byte).
type binaryConn struct {
	s      *stream
	opaque uint32 // echoed by the server: proves the reply is to this request
}

// DialBinary connects to memcached's TCP port ("host:port") and speaks the
// binary protocol.
func DialBinary(addr string) (Conn, error) {
	s, err := dialStream(addr)
	if err != nil {
		return nil, err
	}
	return &binaryConn{s: s}, nil
}

// binReply is a parsed response.
type binReply struct {
	status uint16
	cas    uint64
	extras []byte
	value  []byte
}

// do sends one request and reads its response.
func (c *binaryConn) do(op byte, key string, extras, value []byte, cas uint64) (binReply, error) {
	c.opaque++
	req := make([]byte, binHeaderLen, binHeaderLen+len(extras)+len(key)+len(value))
	req[0] = binRequest
	req[1] = op
	binary.BigEndian.PutUint16(req[2:], uint16(len(key)))
	req[4] = byte(len(extras))
	binary.BigEndian.PutUint32(req[8:], uint32(len(extras)+len(key)+len(value)))
	binary.BigEndian.PutUint32(req[12:], c.opaque)
	binary.BigEndian.PutUint64(req[16:], cas)
	req = append(append(append(req, extras...), key...), value...)

	var rep binReply
	err := c.s.roundTrip(req, func(r *bufio.Reader) error {
		var h [binHeaderLen]byte
		if _, err := io.ReadFull(r, h[:]); err != nil {
			return fmt.Errorf("mcproto: reading binary header: %w", noEOF(err))
		}
		keyLen := int(binary.BigEndian.Uint16(h[2:]))
		extLen := int(h[4])
		bodyLen := int(binary.BigEndian.Uint32(h[8:]))
		switch {
		case h[0] != binResponse || h[1] != op:
			return fmt.Errorf("mcproto: binary reply magic 0x%02x opcode 0x%02x to opcode 0x%02x", h[0], h[1], op)
		case binary.BigEndian.Uint32(h[12:]) != c.opaque:
			return fmt.Errorf("mcproto: binary reply opaque %d, want %d", binary.BigEndian.Uint32(h[12:]), c.opaque)
		case extLen+keyLen > bodyLen || bodyLen > 1<<30:
			return fmt.Errorf("mcproto: binary reply lengths: extras %d key %d body %d", extLen, keyLen, bodyLen)
		}
		body := make([]byte, bodyLen)
		if _, err := io.ReadFull(r, body); err != nil {
			return fmt.Errorf("mcproto: reading binary body: %w", noEOF(err))
		}
		rep = binReply{
			status: binary.BigEndian.Uint16(h[6:]),
			cas:    binary.BigEndian.Uint64(h[16:]),
			extras: body[:extLen],
			value:  body[extLen+keyLen:],
		}
		return statusError(rep)
	})
	return rep, err
}

// statusError maps a response status to an outcome. Other statuses are a
// *ServerError with the server's message.
func statusError(rep binReply) error {
	switch rep.status {
	case statusOK:
		return nil
	case statusNotFound:
		return ErrNotFound
	case statusExists:
		return ErrExists
	case statusNotStored:
		return ErrNotStored
	}
	return &ServerError{Reply: fmt.Sprintf("status 0x%04x: %s", rep.status, rep.value)}
}

// store sends a set, add, replace or CAS (a set with a CAS value).
func (c *binaryConn) store(op byte, key string, value []byte, flags uint32, exptime int32, cas uint64) error {
	extras := binary.BigEndian.AppendUint32(nil, flags)
	extras = binary.BigEndian.AppendUint32(extras, uint32(exptime))
	_, err := c.do(op, key, extras, value, cas)
	return err
}

func (c *binaryConn) Set(key string, value []byte, flags uint32, exptime int32) error {
	return c.store(opSet, key, value, flags, exptime, 0)
}

// Add answers "exists" for a present key, and Replace "not found" for an
// absent one: both mean not stored, as in the other protocols.
func (c *binaryConn) Add(key string, value []byte, flags uint32, exptime int32) error {
	return notStored(c.store(opAdd, key, value, flags, exptime, 0))
}

func (c *binaryConn) Replace(key string, value []byte, flags uint32, exptime int32) error {
	return notStored(c.store(opReplace, key, value, flags, exptime, 0))
}

func notStored(err error) error {
	if err == ErrExists || err == ErrNotFound {
		return ErrNotStored
	}
	return err
}

func (c *binaryConn) Append(key string, value []byte) error {
	_, err := c.do(opAppend, key, nil, value, 0)
	return err
}

func (c *binaryConn) Prepend(key string, value []byte) error {
	_, err := c.do(opPrepend, key, nil, value, 0)
	return err
}

func (c *binaryConn) CAS(key string, value []byte, flags uint32, exptime int32, cas uint64) error {
	return c.store(opSet, key, value, flags, exptime, cas)
}

func (c *binaryConn) Incr(key string, delta uint64) (uint64, error) {
	return c.arith(opIncr, key, delta)
}

func (c *binaryConn) Decr(key string, delta uint64) (uint64, error) {
	return c.arith(opDecr, key, delta)
}

// arith sends incr or decr with expiration 0xffffffff: fail on a missing
// key instead of creating it with an initial value.
func (c *binaryConn) arith(op byte, key string, delta uint64) (uint64, error) {
	extras := binary.BigEndian.AppendUint64(nil, delta)
	extras = binary.BigEndian.AppendUint64(extras, 0)
	extras = binary.BigEndian.AppendUint32(extras, 0xffffffff)
	rep, err := c.do(op, key, extras, nil, 0)
	if err != nil {
		return 0, err
	}
	if len(rep.value) != 8 {
		return 0, fmt.Errorf("mcproto: binary incr/decr returned %d bytes", len(rep.value))
	}
	return binary.BigEndian.Uint64(rep.value), nil
}

func (c *binaryConn) Delete(key string) error {
	_, err := c.do(opDelete, key, nil, nil, 0)
	return err
}

func (c *binaryConn) Touch(key string, exptime int32) error {
	_, err := c.do(opTouch, key, binary.BigEndian.AppendUint32(nil, uint32(exptime)), nil, 0)
	return err
}

func (c *binaryConn) FlushAll() error {
	_, err := c.do(opFlush, "", nil, nil, 0)
	return err
}

func (c *binaryConn) Gets(key string) (Item, error) {
	rep, err := c.do(opGet, key, nil, nil, 0)
	if err == ErrNotFound {
		return Item{}, ErrCacheMiss
	}
	if err != nil {
		return Item{}, err
	}
	if len(rep.extras) != 4 {
		return Item{}, fmt.Errorf("mcproto: binary get returned %d bytes of extras", len(rep.extras))
	}
	return Item{Key: key, Flags: binary.BigEndian.Uint32(rep.extras), Value: rep.value, CAS: rep.cas}, nil
}

func (c *binaryConn) Version() (string, error) {
	rep, err := c.do(opVersion, "", nil, nil, 0)
	return string(rep.value), err
}

func (c *binaryConn) Close() error { return c.s.Close() }
