package mcctl

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"time"
)

// value is what memcached holds for a key, as a GET would return it.
type value struct {
	found bool
	flags uint32
	data  []byte
	ttl   int // seconds left; -1: no expiry
}

// fetcher asks memcached for values over one TCP connection with the meta
// protocol (mg <key> v f t), many requests per round trip.
type fetcher struct {
	addr    string
	timeout time.Duration
	conn    net.Conn
	r       *bufio.Reader
}

func newFetcher(addr string, timeout time.Duration) *fetcher {
	return &fetcher{addr: addr, timeout: timeout}
}

// fetch returns the values of keys, in order. A connection error closes
// the connection (the next fetch dials again).
func (f *fetcher) fetch(keys []string) ([]value, error) {
	if err := f.connect(); err != nil {
		return nil, err
	}
	out, err := f.exchange(keys)
	if err != nil {
		f.close()
		return nil, fmt.Errorf("fetch from memcached at %s: %w", f.addr, err)
	}
	return out, nil
}

// connect dials memcached unless f is connected.
func (f *fetcher) connect() error {
	if f.conn != nil {
		return nil
	}
	c, err := net.DialTimeout("tcp", f.addr, f.timeout)
	if err != nil {
		return fmt.Errorf("connect to memcached at %s: %w", f.addr, err)
	}
	f.conn, f.r = c, bufio.NewReaderSize(c, 64<<10)
	return nil
}

func (f *fetcher) exchange(keys []string) ([]value, error) {
	f.conn.SetDeadline(time.Now().Add(f.timeout + time.Duration(len(keys))*10*time.Microsecond))
	var req strings.Builder
	for _, k := range keys {
		req.WriteString("mg " + k + " v f t\r\n")
	}
	if _, err := f.conn.Write([]byte(req.String())); err != nil {
		return nil, err
	}
	out := make([]value, len(keys))
	for i := range keys {
		line, err := f.r.ReadString('\n')
		if err != nil {
			return nil, err
		}
		fields := strings.Fields(line)
		switch {
		case len(fields) == 1 && fields[0] == "EN":
			continue
		case len(fields) >= 2 && fields[0] == "VA":
			n, err := strconv.Atoi(fields[1])
			if err != nil || n < 0 {
				return nil, fmt.Errorf("bad reply %q", line)
			}
			v := value{found: true, ttl: -1, data: make([]byte, n+2)}
			for _, fl := range fields[2:] {
				switch fl[0] {
				case 'f':
					u, err := strconv.ParseUint(fl[1:], 10, 32)
					if err != nil {
						return nil, fmt.Errorf("bad flags in %q", line)
					}
					v.flags = uint32(u)
				case 't':
					if v.ttl, err = strconv.Atoi(fl[1:]); err != nil {
						return nil, fmt.Errorf("bad ttl in %q", line)
					}
				}
			}
			if _, err := io.ReadFull(f.r, v.data); err != nil {
				return nil, err
			}
			if string(v.data[n:]) != "\r\n" {
				return nil, errors.New("value not terminated by CRLF")
			}
			v.data = v.data[:n]
			out[i] = v
		default:
			return nil, fmt.Errorf("unexpected reply %q to mg %s", strings.TrimSpace(line), keys[i])
		}
	}
	return out, nil
}

// textOnly asks memcached at addr whether it reads every TCP connection as
// text (-B ascii): a request that starts with 0x80, the binary magic, is
// then a line even as a connection's first.
func textOnly(addr string, timeout time.Duration) (bool, error) {
	f := newFetcher(addr, timeout)
	if err := f.connect(); err != nil {
		return false, err
	}
	defer f.close()
	f.conn.SetDeadline(time.Now().Add(timeout))
	if _, err := f.conn.Write([]byte("stats settings\r\n")); err != nil {
		return false, fmt.Errorf("ask memcached at %s for its settings: %w", addr, err)
	}
	ascii := false
	for {
		line, err := f.r.ReadString('\n')
		if err != nil {
			return false, fmt.Errorf("ask memcached at %s for its settings: %w", addr, err)
		}
		switch fields := strings.Fields(line); {
		case len(fields) == 1 && fields[0] == "END":
			return ascii, nil
		case len(fields) == 3 && fields[0] == "STAT" && fields[1] == "binding_protocol":
			ascii = fields[2] == "ascii"
		}
	}
}

func (f *fetcher) close() {
	if f.conn != nil {
		f.conn.Close()
		f.conn, f.r = nil, nil
	}
}
