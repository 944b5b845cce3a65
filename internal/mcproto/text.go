package mcproto

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// textConn speaks the text protocol over TCP or UDP.
type textConn struct{ t transport }

// DialText connects to memcached's TCP port ("host:port") and speaks the
// text protocol.
func DialText(addr string) (Conn, error) {
	s, err := dialStream(addr)
	if err != nil {
		return nil, err
	}
	return &textConn{s}, nil
}

// ParseValues parses the reply to a text get or gets: zero or more
// "VALUE <key> <flags> <bytes> [<cas>]\r\n<data>\r\n" and "END\r\n". An
// error reply is a *ServerError.
func ParseValues(payload []byte) ([]Item, error) {
	r := bufio.NewReader(bytes.NewReader(payload))
	items, err := readValues(r)
	if err == nil && r.Buffered() > 0 {
		err = fmt.Errorf("mcproto: %d bytes after END", r.Buffered())
	}
	return items, err
}

// readValues reads a get/gets reply up to and including its END line.
func readValues(r *bufio.Reader) ([]Item, error) {
	var items []Item
	for {
		line, err := readLine(r)
		if err != nil {
			return nil, err
		}
		if line == "END" {
			return items, nil
		}
		f := strings.Fields(line)
		if len(f) < 4 || len(f) > 5 || f[0] != "VALUE" {
			return nil, unexpected(line)
		}
		it := Item{Key: f[1]}
		flags, err1 := strconv.ParseUint(f[2], 10, 32)
		n, err2 := strconv.ParseUint(f[3], 10, 31)
		var err3 error
		if len(f) == 5 {
			it.CAS, err3 = strconv.ParseUint(f[4], 10, 64)
		}
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("mcproto: bad VALUE line %q", line)
		}
		it.Flags = uint32(flags)
		if it.Value, err = readData(r, int(n)); err != nil {
			return nil, err
		}
		items = append(items, it)
	}
}

// readLine reads one "\r\n"-terminated line and returns it without the
// terminator.
func readLine(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", fmt.Errorf("mcproto: reading reply: %w", noEOF(err))
	}
	s, ok := strings.CutSuffix(line, "\r\n")
	if !ok {
		return "", fmt.Errorf("mcproto: reply line %q does not end in \\r\\n", line)
	}
	return s, nil
}

// readData reads a data block of n bytes and its "\r\n".
func readData(r *bufio.Reader, n int) ([]byte, error) {
	b := make([]byte, n+2)
	if _, err := io.ReadFull(r, b); err != nil {
		return nil, fmt.Errorf("mcproto: reading %d-byte value: %w", n, noEOF(err))
	}
	if string(b[n:]) != "\r\n" {
		return nil, fmt.Errorf("mcproto: %d-byte value not followed by \\r\\n", n)
	}
	return b[:n], nil
}

// noEOF turns a reply cut short into io.ErrUnexpectedEOF.
func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}

// unexpected is the error for a reply line that is not the expected one:
// an error reply of memcached, or garbage.
func unexpected(line string) error {
	for _, p := range []string{"ERROR", "CLIENT_ERROR", "SERVER_ERROR"} {
		if strings.HasPrefix(line, p) {
			return &ServerError{Reply: line}
		}
	}
	return fmt.Errorf("mcproto: unexpected reply %q", line)
}

// command sends one command and maps its single reply line: ok is the
// success reply, others maps other known lines to outcomes.
func (c *textConn) command(req []byte, ok string, others map[string]error) error {
	return c.t.roundTrip(req, func(r *bufio.Reader) error {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		if line == ok {
			return nil
		}
		if e, known := others[line]; known {
			return e
		}
		return unexpected(line)
	})
}

var (
	storeOutcomes = map[string]error{"NOT_STORED": ErrNotStored, "EXISTS": ErrExists, "NOT_FOUND": ErrNotFound}
	foundOutcomes = map[string]error{"NOT_FOUND": ErrNotFound}
)

func (c *textConn) store(cmd, key string, value []byte, flags uint32, exptime int32, cas string) error {
	req := fmt.Appendf(nil, "%s %s %d %d %d%s\r\n", cmd, key, flags, exptime, len(value), cas)
	req = append(append(req, value...), "\r\n"...)
	return c.command(req, "STORED", storeOutcomes)
}

func (c *textConn) Set(key string, value []byte, flags uint32, exptime int32) error {
	return c.store("set", key, value, flags, exptime, "")
}

func (c *textConn) Add(key string, value []byte, flags uint32, exptime int32) error {
	return c.store("add", key, value, flags, exptime, "")
}

func (c *textConn) Replace(key string, value []byte, flags uint32, exptime int32) error {
	return c.store("replace", key, value, flags, exptime, "")
}

// Append and Prepend ignore flags and exptime; the item keeps its own.
func (c *textConn) Append(key string, value []byte) error {
	return c.store("append", key, value, 0, 0, "")
}

func (c *textConn) Prepend(key string, value []byte) error {
	return c.store("prepend", key, value, 0, 0, "")
}

func (c *textConn) CAS(key string, value []byte, flags uint32, exptime int32, cas uint64) error {
	return c.store("cas", key, value, flags, exptime, " "+strconv.FormatUint(cas, 10))
}

func (c *textConn) Incr(key string, delta uint64) (uint64, error) { return c.arith("incr", key, delta) }
func (c *textConn) Decr(key string, delta uint64) (uint64, error) { return c.arith("decr", key, delta) }

func (c *textConn) arith(cmd, key string, delta uint64) (uint64, error) {
	var v uint64
	err := c.t.roundTrip(fmt.Appendf(nil, "%s %s %d\r\n", cmd, key, delta), func(r *bufio.Reader) error {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		if line == "NOT_FOUND" {
			return ErrNotFound
		}
		if v, err = strconv.ParseUint(line, 10, 64); err != nil {
			return unexpected(line)
		}
		return nil
	})
	return v, err
}

func (c *textConn) Delete(key string) error {
	return c.command([]byte("delete "+key+"\r\n"), "DELETED", foundOutcomes)
}

func (c *textConn) Touch(key string, exptime int32) error {
	return c.command(fmt.Appendf(nil, "touch %s %d\r\n", key, exptime), "TOUCHED", foundOutcomes)
}

func (c *textConn) FlushAll() error { return c.command([]byte("flush_all\r\n"), "OK", nil) }

func (c *textConn) Gets(key string) (Item, error) {
	var items []Item
	err := c.t.roundTrip([]byte("gets "+key+"\r\n"), func(r *bufio.Reader) error {
		var err error
		items, err = readValues(r)
		return err
	})
	if err != nil {
		return Item{}, err
	}
	it, hit, err := single(key, items)
	if err == nil && !hit {
		err = ErrCacheMiss
	}
	return it, err
}

// single picks the item of a one-key get reply; false on a miss.
func single(key string, items []Item) (Item, bool, error) {
	switch {
	case len(items) == 0:
		return Item{}, false, nil
	case len(items) > 1 || items[0].Key != key:
		return Item{}, false, fmt.Errorf("mcproto: get %q answered with %d items, the first for %q", key, len(items), items[0].Key)
	}
	return items[0], true, nil
}

func (c *textConn) Version() (string, error) {
	var v string
	err := c.t.roundTrip([]byte("version\r\n"), func(r *bufio.Reader) error {
		line, err := readLine(r)
		if err != nil {
			return err
		}
		var ok bool
		if v, ok = strings.CutPrefix(line, "VERSION "); !ok {
			return unexpected(line)
		}
		return nil
	})
	return v, err
}

func (c *textConn) Close() error { return c.t.Close() }
