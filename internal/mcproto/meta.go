package mcproto

import (
	"bufio"
	"fmt"
	"strconv"
	"strings"
)

// metaConn speaks the meta protocol (ms, mg, md, ma; memcached >= 1.6).
// The meta protocol has no flush or version command: those go as text
// commands on the same connection, which memcached allows.
type metaConn struct{ text textConn }

// DialMeta connects to memcached's TCP port ("host:port") and speaks the
// meta protocol.
func DialMeta(addr string) (Conn, error) {
	s, err := dialStream(addr)
	if err != nil {
		return nil, err
	}
	return &metaConn{textConn{s}}, nil
}

// metaOutcomes are the meta status codes other than HD (success).
var metaOutcomes = map[string]error{"NS": ErrNotStored, "EX": ErrExists, "NF": ErrNotFound}

// set sends ms with mode (S set, E add, R replace, A append, P prepend)
// and further flags.
func (c *metaConn) set(key string, value []byte, mode byte, flags ...string) error {
	req := fmt.Appendf(nil, "ms %s %d M%c", key, len(value), mode)
	for _, f := range flags {
		req = append(append(req, ' '), f...)
	}
	req = append(append(append(req, "\r\n"...), value...), "\r\n"...)
	return c.text.command(req, "HD", metaOutcomes)
}

func (c *metaConn) Set(key string, value []byte, flags uint32, exptime int32) error {
	return c.set(key, value, 'S', metaF(flags), metaT(exptime))
}

func (c *metaConn) Add(key string, value []byte, flags uint32, exptime int32) error {
	return c.set(key, value, 'E', metaF(flags), metaT(exptime))
}

func (c *metaConn) Replace(key string, value []byte, flags uint32, exptime int32) error {
	return c.set(key, value, 'R', metaF(flags), metaT(exptime))
}

func (c *metaConn) Append(key string, value []byte) error  { return c.set(key, value, 'A') }
func (c *metaConn) Prepend(key string, value []byte) error { return c.set(key, value, 'P') }

func (c *metaConn) CAS(key string, value []byte, flags uint32, exptime int32, cas uint64) error {
	return c.set(key, value, 'S', metaF(flags), metaT(exptime), "C"+strconv.FormatUint(cas, 10))
}

func metaF(flags uint32) string  { return "F" + strconv.FormatUint(uint64(flags), 10) }
func metaT(exptime int32) string { return "T" + strconv.FormatInt(int64(exptime), 10) }

func (c *metaConn) Incr(key string, delta uint64) (uint64, error) { return c.arith(key, 'I', delta) }
func (c *metaConn) Decr(key string, delta uint64) (uint64, error) { return c.arith(key, 'D', delta) }

// arith sends ma with mode I (incr) or D (decr), asking for the new value.
func (c *metaConn) arith(key string, mode byte, delta uint64) (uint64, error) {
	var v uint64
	err := c.text.t.roundTrip(fmt.Appendf(nil, "ma %s M%c D%d v\r\n", key, mode, delta), func(r *bufio.Reader) error {
		value, _, err := readMetaValue(r, metaOutcomes)
		if err != nil {
			return err
		}
		if v, err = strconv.ParseUint(string(value), 10, 64); err != nil {
			return fmt.Errorf("mcproto: ma returned %q", value)
		}
		return nil
	})
	return v, err
}

func (c *metaConn) Delete(key string) error {
	return c.text.command([]byte("md "+key+"\r\n"), "HD", metaOutcomes)
}

// Touch is mg with T and no value: HD on a hit, EN on a miss.
func (c *metaConn) Touch(key string, exptime int32) error {
	return c.text.command([]byte("mg "+key+" "+metaT(exptime)+"\r\n"), "HD", map[string]error{"EN": ErrNotFound})
}

func (c *metaConn) Gets(key string) (Item, error) {
	it := Item{Key: key}
	err := c.text.t.roundTrip([]byte("mg "+key+" v f c\r\n"), func(r *bufio.Reader) error {
		value, flags, err := readMetaValue(r, map[string]error{"EN": ErrCacheMiss})
		if err != nil {
			return err
		}
		it.Value = value
		for _, f := range flags {
			var perr error
			switch f[0] {
			case 'f':
				var n uint64
				n, perr = strconv.ParseUint(f[1:], 10, 32)
				it.Flags = uint32(n)
			case 'c':
				it.CAS, perr = strconv.ParseUint(f[1:], 10, 64)
			}
			if perr != nil {
				return fmt.Errorf("mcproto: mg returned flag %q", f)
			}
		}
		return nil
	})
	return it, err
}

// readMetaValue reads a "VA <len> <flags>*\r\n<data>\r\n" reply and returns
// the data and the returned flags. Other status lines map through
// outcomes.
func readMetaValue(r *bufio.Reader, outcomes map[string]error) ([]byte, []string, error) {
	line, err := readLine(r)
	if err != nil {
		return nil, nil, err
	}
	f := strings.Fields(line)
	if len(f) == 1 {
		if e, known := outcomes[f[0]]; known {
			return nil, nil, e
		}
	}
	if len(f) < 2 || f[0] != "VA" {
		return nil, nil, unexpected(line)
	}
	n, err := strconv.ParseUint(f[1], 10, 31)
	if err != nil {
		return nil, nil, fmt.Errorf("mcproto: bad VA line %q", line)
	}
	value, err := readData(r, int(n))
	return value, f[2:], err
}

func (c *metaConn) FlushAll() error          { return c.text.FlushAll() }
func (c *metaConn) Version() (string, error) { return c.text.Version() }
func (c *metaConn) Close() error             { return c.text.Close() }
