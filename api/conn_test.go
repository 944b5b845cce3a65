package api

import (
	"bytes"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// connPair is two connected ends of a Unix stream socket.
func connPair(t *testing.T) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	var conns [2]*Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "end")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = NewConn(c.(*net.UnixConn))
		t.Cleanup(func() { conns[i].Close() })
	}
	return conns[0], conns[1]
}

// TestSendAll checks that messages sent with one write are received one by
// one, in order, and that a batch with one message too large writes nothing.
func TestSendAll(t *testing.T) {
	a, b := connPair(t)
	var batch []*Message
	for i := range 3 {
		batch = append(batch, &Message{V: Version, Op: OpSample, Seq: 7, Socket: uint64(i + 1),
			Sample: bytes.Repeat([]byte{byte(i)}, 10*(i+1)), RequestLen: uint32(100 + i)})
	}
	if err := a.SendAll(batch); err != nil {
		t.Fatal(err)
	}
	for i, want := range batch {
		got, files, err := b.Recv()
		if err != nil || len(files) != 0 {
			t.Fatalf("message %d: %v (%d files)", i, err, len(files))
		}
		if got.Op != OpSample || got.Socket != want.Socket || !bytes.Equal(got.Sample, want.Sample) || got.RequestLen != want.RequestLen {
			t.Errorf("message %d: got %+v, want %+v", i, got, want)
		}
	}

	huge := &Message{V: Version, Op: OpSample, Sample: make([]byte, MaxFrame)}
	if err := a.SendAll([]*Message{batch[0], huge}); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("a batch with a message over the frame limit: %v, want ErrTooLarge", err)
	}
	// nothing of that batch was written: the next message is the next read
	if err := a.Send(batch[2], -1); err != nil {
		t.Fatal(err)
	}
	if got, _, err := b.Recv(); err != nil || got.Socket != batch[2].Socket {
		t.Fatalf("after the refused batch: %+v, %v; want socket %d", got, err, batch[2].Socket)
	}
}

// TestDialPathTooLong: a socket path longer than a Unix socket address
// holds is named as such, as libsanta does, not as "invalid argument".
func TestDialPathTooLong(t *testing.T) {
	path := "/run/" + strings.Repeat("x", 103) + "/santa.sock"
	if _, err := Dial(path); err == nil || !strings.Contains(err.Error(), "longer than 107 bytes") {
		t.Fatalf("Dial of a %d-byte path: %v, want an error saying it is longer than 107 bytes", len(path), err)
	}
}

// TestUndecodedFrameNamesItsRequest: a frame Recv does not decode, or
// that RecvWithin skips undecoded, still yields the op and seq its first
// bytes name, so that santad's refusal names the request it refuses.
func TestUndecodedFrameNamesItsRequest(t *testing.T) {
	a, b := connPair(t)
	unknownKey, err := encMode.Marshal(map[uint64]any{0: 1, 1: uint64(OpAdd), 2: uint64(1) << 40, 5: 7, 99: 1})
	if err != nil {
		t.Fatal(err)
	}
	big, err := Encode(&Message{V: Version, Op: OpReplace, Seq: 70000, Socket: 7, Rules: make([]Rule, 1000)})
	if err != nil {
		t.Fatal(err)
	}
	refuse := func(int) error { return errors.New("no room") }
	for _, c := range []struct {
		name    string
		body    []byte
		reserve func(int) error
		op      Op
		seq     uint64
	}{
		{"an unknown key", unknownKey, nil, OpAdd, 1 << 40},
		{"a frame skipped for its length", big, refuse, OpReplace, 70000},
		{"not CBOR", []byte{0xff, 0x00}, nil, 0, 0},
		{"not a map", []byte{0x82, 0x01, 0x02}, nil, 0, 0},
		{"keys out of order", []byte{0xa3, 0x02, 0x05, 0x01, 0x04, 0x18, 0x63, 0x01}, nil, 0, 5},
	} {
		frame := append(binary.BigEndian.AppendUint32(nil, uint32(len(c.body))), c.body...)
		if _, err := a.Unix().Write(frame); err != nil {
			t.Fatal(err)
		}
		m, _, err := b.RecvWithin(c.reserve)
		if err == nil || m == nil || m.Op != c.op || m.Seq != c.seq {
			t.Errorf("%s: %+v, %v; want an error and op %s seq %d", c.name, m, err, c.op, c.seq)
		}
	}
	// the stream stayed in step
	if err := a.Send(&Message{V: Version, Op: OpHealth, Seq: 9}, -1); err != nil {
		t.Fatal(err)
	}
	if m, _, err := b.Recv(); err != nil || m.Seq != 9 {
		t.Fatalf("after the undecoded frames: %+v, %v; want health seq 9", m, err)
	}
}
