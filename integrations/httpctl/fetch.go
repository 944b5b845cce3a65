package httpctl

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// offloadedStatus are the status codes whose responses rules send (see
// docs/http.md): 200, 206 (a Range request) and 304 (a conditional
// request whose validator still matches). Each is what nginx sends to the
// exact request bytes while the object is unchanged, and a change of the
// object on disk retires the rule.
var offloadedStatus = map[int]bool{200: true, 206: true, 304: true}

// maxHeaderBlock is the longest response header block read.
const maxHeaderBlock = 16 << 10

// dateLen is the length of an IMF-fixdate (http.TimeFormat), the only
// form nginx sends: "Sun, 06 Nov 1994 08:49:37 GMT".
const dateLen = 29

// response is nginx's complete response to one request, as sent.
type response struct {
	raw       []byte // status line, headers, body
	status    int
	headerLen int  // bytes of the status line and headers, up to and including the empty line
	close     bool // the connection ends after it (Connection: close, or HTTP/1.0 without keep-alive)
	keepAlive bool // it says the connection stays open (Connection: keep-alive)
	// date is the offset in raw of the Date header's value (dateLen bytes),
	// -1 without one; expires that of an Expires header whose value is an
	// IMF-fixdate, -1 otherwise.
	date, expires int
	// maxAge is Cache-Control's max-age in seconds, -1 without one.
	maxAge int64
	etag   string
	body   []byte // raw[headerLen:]
}

// at returns the time a date field of r holds, or false.
func (r *response) at(off int) (time.Time, bool) {
	if off < 0 {
		return time.Time{}, false
	}
	t, err := time.Parse(http.TimeFormat, string(r.raw[off:off+dateLen]))
	return t, err == nil
}

// relativeExpires reports whether r's Expires is its Date plus its
// max-age: nginx's `expires TIME`, which moves with the Date.
func (r *response) relativeExpires() bool {
	d, ok1 := r.at(r.date)
	e, ok2 := r.at(r.expires)
	return ok1 && ok2 && r.maxAge >= 0 && e.Sub(d) == time.Duration(r.maxAge)*time.Second
}

// withDate returns a copy of r's bytes with its Date set to t and, if its
// Expires moves with its Date, Expires as far after t as it was after
// the Date. The length does not change.
func (r *response) withDate(t time.Time) []byte {
	out := bytes.Clone(r.raw)
	if r.date < 0 {
		return out
	}
	if r.relativeExpires() {
		copy(out[r.expires:], t.Add(time.Duration(r.maxAge)*time.Second).UTC().Format(http.TimeFormat))
	}
	copy(out[r.date:], t.UTC().Format(http.TimeFormat))
	return out
}

// fetch sends the exact bytes of req to nginx at addr on a connection of
// its own and reads one complete response. A new connection per request
// makes the response the one nginx sends to that request as the first on
// a connection, Connection and Keep-Alive headers included: a reused
// connection could end up with "Connection: close" at nginx's
// keepalive_requests. The response must be complete and framed: a body
// has a Content-Length (chunked responses and responses delimited by the
// end of the connection are refused); HEAD and 304 have none. maxReply
// bounds the whole response; a longer one is refused before its body is
// read. Network errors are returned as they are; a response a rule may
// not send is an errNotOffloadable. A fetch ends early, with an error,
// when ctx ends (a hung nginx would hold a stop for the whole timeout).
func fetch(ctx context.Context, addr netip.AddrPort, req request, maxReply int, timeout time.Duration) (*response, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	conn, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr.String())
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(timeout))
	context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	// Two segments (Go sets TCP_NODELAY): should the rule processor see
	// this connection (santad attached to loopback), the first segment
	// matches no rule and hands the connection to nginx, so nginx answers
	// even a request a rule would.
	if _, err := conn.Write(req.raw[:1]); err != nil {
		return nil, err
	}
	if _, err := conn.Write(req.raw[1:]); err != nil {
		return nil, err
	}
	return readResponse(bufio.NewReaderSize(conn, 4096), req.method == "HEAD", maxReply)
}

// readResponse reads one response to a request (head: to a HEAD request).
func readResponse(br *bufio.Reader, head bool, maxReply int) (*response, error) {
	var hdr []byte
	for {
		line, err := br.ReadSlice('\n')
		hdr = append(hdr, line...)
		if err == bufio.ErrBufferFull {
			return nil, notOffloadable("a header line longer than %d bytes", br.Size())
		}
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, fmt.Errorf("reading the response header: %w", err)
		}
		if len(hdr) > maxHeaderBlock {
			return nil, notOffloadable("a response header block longer than %d bytes", maxHeaderBlock)
		}
		if string(line) == "\r\n" {
			break
		}
	}
	r := &response{raw: hdr, status: -1, date: -1, expires: -1, maxAge: -1, headerLen: len(hdr)}
	lines := strings.Split(string(hdr[:len(hdr)-4]), "\r\n")
	status := strings.SplitN(lines[0], " ", 3)
	if len(status) < 2 || (status[0] != "HTTP/1.1" && status[0] != "HTTP/1.0") || len(status[1]) != 3 {
		return nil, fmt.Errorf("not an HTTP/1.x status line: %q", lines[0])
	}
	if r.status, _ = strconv.Atoi(status[1]); r.status < 100 {
		return nil, fmt.Errorf("bad status in %q", lines[0])
	}
	keepAlive, closeConn := false, false
	contentLength := int64(-1)
	off := len(lines[0]) + 2
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if !ok || !isToken(name) {
			return nil, fmt.Errorf("bad response header line %q", l)
		}
		v := strings.TrimLeft(value, " \t")
		valueOff := off + len(name) + 1 + len(value) - len(v)
		v = strings.TrimRight(v, " \t")
		switch strings.ToLower(name) {
		case "content-length":
			n, err := strconv.ParseInt(v, 10, 64)
			if err != nil || n < 0 || (contentLength >= 0 && n != contentLength) {
				return nil, fmt.Errorf("bad Content-Length %q", v)
			}
			contentLength = n
		case "transfer-encoding":
			return nil, notOffloadable("Transfer-Encoding %s (the body has no length)", v)
		case "connection":
			for _, tok := range strings.Split(v, ",") {
				switch strings.ToLower(strings.TrimSpace(tok)) {
				case "close":
					closeConn = true
				case "keep-alive":
					keepAlive = true
				}
			}
		case "date":
			if r.date >= 0 {
				return nil, notOffloadable("two Date headers")
			}
			if len(v) != dateLen {
				return nil, notOffloadable("Date %q is not an IMF-fixdate", v)
			}
			r.date = valueOff
		case "expires":
			if _, err := time.Parse(http.TimeFormat, v); err == nil && len(v) == dateLen && r.expires < 0 {
				r.expires = valueOff
			}
		case "cache-control":
			for _, d := range strings.Split(v, ",") {
				if a, ok := strings.CutPrefix(strings.TrimSpace(strings.ToLower(d)), "max-age="); ok {
					if n, err := strconv.ParseInt(a, 10, 64); err == nil && n >= 0 {
						r.maxAge = n
					}
				}
			}
		case "etag":
			r.etag = v
		}
		off += len(l) + 2
	}
	r.close = closeConn || (status[0] == "HTTP/1.0" && !keepAlive)
	r.keepAlive = keepAlive && !closeConn
	if r.date >= 0 {
		if _, ok := r.at(r.date); !ok {
			return nil, notOffloadable("Date %q is not an IMF-fixdate", hdr[r.date:r.date+dateLen])
		}
	}
	var bodyLen int64
	switch {
	case r.status < 200:
		return nil, notOffloadable("status %d (interim)", r.status)
	case head || r.status == 204 || r.status == 304:
	case contentLength < 0:
		return nil, notOffloadable("status %d without Content-Length (the body has no length)", r.status)
	default:
		bodyLen = contentLength
	}
	if !offloadedStatus[r.status] {
		return r, notOffloadable("status %d", r.status)
	}
	if total := int64(r.headerLen) + bodyLen; total > int64(maxReply) {
		return nil, fmt.Errorf("%w: %d bytes, more than the %d a reply may have", errTooBig, total, maxReply)
	}
	r.raw = make([]byte, r.headerLen+int(bodyLen))
	copy(r.raw, hdr)
	if _, err := io.ReadFull(br, r.raw[r.headerLen:]); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return nil, fmt.Errorf("reading the response body: %w", err)
	}
	r.body = r.raw[r.headerLen:]
	return r, nil
}

// endsConnection reports whether nginx ends the connection after resp,
// its response to req. nginx says so in its response (Connection: close
// or keep-alive), and that counts: it reads the request's Connection
// header its own way (the last of two such headers wins; "close" or
// "keep-alive" anywhere in the value counts, "keep-alive-x" too), so the
// request's tokens may say otherwise. A response that says neither ends
// the connection if the request asked for it.
func endsConnection(req request, resp *response) bool {
	return resp.close || (req.close && !resp.keepAlive)
}

// errTooBig says a response is longer than a reply may be.
var errTooBig = fmt.Errorf("%w: too big", errNotOffloadable)

// isNotOffloadable reports whether err says the response cannot be
// offloaded (rather than that fetching it failed).
func isNotOffloadable(err error) bool { return errors.Is(err, errNotOffloadable) }
