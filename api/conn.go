package api

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Conn carries framed messages and passed file descriptors over a Unix
// stream socket. A frame is a 4-byte big-endian length and a CBOR message; a
// passed fd rides as SCM_RIGHTS on the frame's first bytes. Send and Recv may
// be called from different goroutines.
type Conn struct {
	c      *net.UnixConn
	send   sync.Mutex
	decode func([]byte) (*Message, error)
}

// NewConn wraps a connected Unix stream socket as santad's end of a
// connection: it refuses messages with keys it does not know.
func NewConn(c *net.UnixConn) *Conn { return &Conn{c: c, decode: Decode} }

// Dial connects to santad's socket as a client, which skips keys it does
// not know in santad's messages (DecodeFromSantad).
func Dial(path string) (*Conn, error) {
	if limit := len(unix.RawSockaddrUnix{}.Path) - 1; len(path) > limit { // connect would say only "invalid argument"
		return nil, fmt.Errorf("santad socket path %s: longer than %d bytes", path, limit)
	}
	c, err := net.DialUnix("unix", nil, &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		hint := "is santad running?"
		if errors.Is(err, unix.EACCES) { // it may be, but not for this user
			hint = "santad's socket_mode and socket_group decide who may connect:"
		}
		return nil, fmt.Errorf("connect to santad at %s: %w (%s see docs/operations.md)", path, err, hint)
	}
	return &Conn{c: c, decode: DecodeFromSantad}, nil
}

// Unix is the underlying socket, e.g. for SO_PEERCRED.
func (c *Conn) Unix() *net.UnixConn { return c.c }

// Close closes the connection.
func (c *Conn) Close() error { return c.c.Close() }

// appendFrame appends m's frame to buf.
func appendFrame(buf []byte, m *Message) ([]byte, error) {
	body, err := Encode(m)
	if err != nil {
		return buf, err
	}
	if len(body) > MaxFrame {
		return buf, fmt.Errorf("%w: message of %d bytes exceeds the %d-byte frame limit; split the request", ErrTooLarge, len(body), MaxFrame)
	}
	buf = binary.BigEndian.AppendUint32(buf, uint32(len(body)))
	return append(buf, body...), nil
}

// SendAll writes messages with one write: a reader waiting for them wakes
// once, not once per message. Nothing is written if one does not encode.
func (c *Conn) SendAll(ms []*Message) error {
	var frames []byte
	for _, m := range ms {
		var err error
		if frames, err = appendFrame(frames, m); err != nil {
			return err
		}
	}
	c.send.Lock()
	defer c.send.Unlock()
	_, err := c.c.Write(frames)
	return err
}

// Send writes one message, passing fd along with it if fd >= 0.
func (c *Conn) Send(m *Message, fd int) error {
	frame, err := appendFrame(nil, m)
	if err != nil {
		return err
	}
	var oob []byte
	if fd >= 0 {
		oob = unix.UnixRights(fd)
	}
	c.send.Lock()
	defer c.send.Unlock()
	n, _, err := c.c.WriteMsgUnix(frame, oob, nil)
	if err != nil {
		return err
	}
	if n < len(frame) { // the fd went with the first bytes; the rest is plain data
		_, err = c.c.Write(frame[n:])
	}
	return err
}

// ErrFrame marks a frame that is not a valid frame of this protocol.
var ErrFrame = errors.New("malformed frame")

// ErrTooLarge marks a message Send refused because it exceeds MaxFrame;
// nothing was written.
var ErrTooLarge = errors.New("message too large")

// Recv reads one message and any fds passed with it; the caller owns the
// files. A frame whose content does not decode returns ErrMalformed (with
// the files, and a message holding only the op and seq HeaderOf reads from
// it), and the stream stays usable; a bad frame header returns ErrFrame,
// after which the stream is out of step.
func (c *Conn) Recv() (*Message, []*os.File, error) {
	return c.RecvWithin(nil)
}

// RecvWithin is Recv for a reader that bounds the memory messages take:
// reserve is asked for a frame's length before its body is read, then for
// what decoding it may allocate (DecodedBound) before it is decoded, and
// may wait for room. If it refuses, the frame is skipped (the stream stays
// in step) and RecvWithin returns its error, with the files and a message
// holding only the op and seq HeaderOf reads from the frame's first bytes.
// A nil reserve bounds nothing.
func (c *Conn) RecvWithin(reserve func(n int) error) (*Message, []*os.File, error) {
	var hdr [4]byte
	oob := make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, err := c.c.ReadMsgUnix(hdr[:], oob)
	if err != nil {
		return nil, nil, err
	}
	if n == 0 {
		return nil, nil, io.EOF
	}
	files, err := parseRights(oob[:oobn])
	if err != nil {
		return nil, nil, err
	}
	if n < 4 {
		if _, err := io.ReadFull(c.c, hdr[n:]); err != nil {
			closeAll(files)
			return nil, nil, err
		}
	}
	size := binary.BigEndian.Uint32(hdr[:])
	if size == 0 || size > MaxFrame {
		closeAll(files)
		return nil, nil, fmt.Errorf("%w: length %d (must be 1..%d)", ErrFrame, size, MaxFrame)
	}
	if reserve != nil {
		if err := reserve(int(size)); err != nil {
			prefix := make([]byte, min(int(size), HeaderPrefix))
			_, serr := io.ReadFull(c.c, prefix)
			if serr == nil {
				_, serr = io.CopyN(io.Discard, c.c, int64(size)-int64(len(prefix)))
			}
			if serr != nil {
				closeAll(files)
				return nil, nil, serr
			}
			return headerOnly(prefix), files, err
		}
	}
	body := make([]byte, size)
	if _, err := io.ReadFull(c.c, body); err != nil {
		closeAll(files)
		return nil, nil, err
	}
	if reserve != nil {
		bound, err := DecodedBound(body)
		if err == nil {
			err = reserve(bound)
		}
		if err != nil {
			return headerOnly(body), files, err
		}
	}
	m, err := c.decode(body)
	if err != nil {
		return headerOnly(body), files, err
	}
	return m, files, nil
}

// headerOnly is the message of a frame that was not decoded: the op and
// seq its first bytes name.
func headerOnly(body []byte) *Message {
	op, seq := HeaderOf(body)
	return &Message{Op: op, Seq: seq}
}

func parseRights(oob []byte) ([]*os.File, error) {
	if len(oob) == 0 {
		return nil, nil
	}
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return nil, fmt.Errorf("%w: control message: %v", ErrFrame, err)
	}
	var files []*os.File
	for _, cm := range msgs {
		fds, err := unix.ParseUnixRights(&cm)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			files = append(files, os.NewFile(uintptr(fd), "passed-socket"))
		}
	}
	return files, nil
}

func closeAll(files []*os.File) {
	for _, f := range files {
		f.Close()
	}
}
