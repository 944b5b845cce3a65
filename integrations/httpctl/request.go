package httpctl

import (
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
)

// Limits of the rule processor (internal/dataplane/limits.go, checked by
// TestLimits): a rule sees the first reqWindow bytes of a request segment,
// in at most maxConds conditions of at most maxPattern bytes.
const (
	reqWindow  = 1472
	maxPattern = 1024
	maxConds   = 4
)

// errNotOffloadable says a request or its response cannot be answered by
// a rule; the message says why.
var errNotOffloadable = errors.New("not offloadable")

func notOffloadable(format string, args ...any) error {
	return fmt.Errorf("%w: %s", errNotOffloadable, fmt.Sprintf(format, args...))
}

// request is a GET or HEAD request that a rule may answer: the exact bytes
// of its request line and header block, and what the controller needs to
// know about them.
type request struct {
	raw     []byte // the request line and the headers up to the empty line, as sent
	method  string // GET or HEAD
	target  string // the request target as sent (origin form: path and query)
	path    string // the target's path, percent-decoded and cleaned; "/" ends a directory
	version string // HTTP/1.0 or HTTP/1.1
	// close says the client asked for the connection to end after the
	// response: HTTP/1.0 without "Connection: keep-alive", or
	// "Connection: close" (nginx's response has the last word:
	// endsConnection).
	close bool
}

// line is the request line, for logs.
func (r request) line() string { return r.method + " " + r.target + " " + r.version }

// parseRequest checks that b is exactly one complete request a rule may
// answer and parses it: GET or HEAD, HTTP/1.0 or HTTP/1.1, a target in
// origin form, every header line well formed, and nothing after the empty
// line that ends the headers (no body, no pipelined request). It refuses
// what a plain static request does not carry but what would change how the
// server reads the connection (Content-Length, Transfer-Encoding, Expect,
// Upgrade), and requests longer than the rule processor's window.
func parseRequest(b []byte) (request, error) {
	if len(b) > reqWindow {
		return request{}, notOffloadable("%d bytes: longer than the %d bytes a rule sees", len(b), reqWindow)
	}
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return request{}, notOffloadable("no complete header block")
	}
	if end+4 != len(b) {
		return request{}, notOffloadable("%d bytes after the header block (a body or a pipelined request)", len(b)-end-4)
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	r := request{raw: b}
	first := strings.Split(lines[0], " ")
	if len(first) != 3 {
		return request{}, notOffloadable("request line %q: want METHOD TARGET VERSION", lines[0])
	}
	r.method, r.target, r.version = first[0], first[1], first[2]
	switch {
	case r.method != "GET" && r.method != "HEAD":
		return request{}, notOffloadable("method %q: only GET and HEAD", r.method)
	case r.version != "HTTP/1.0" && r.version != "HTTP/1.1":
		return request{}, notOffloadable("version %q: only HTTP/1.0 and HTTP/1.1", r.version)
	}
	for i := 0; i < len(r.target); i++ {
		if c := r.target[i]; c <= ' ' || c >= 0x7f {
			return request{}, notOffloadable("target %q: byte %#x", r.target, c)
		}
	}
	var err error
	if r.path, err = targetPath(r.target); err != nil {
		return request{}, err
	}
	var keepAlive, closeConn bool
	for _, l := range lines[1:] {
		name, value, ok := strings.Cut(l, ":")
		if !ok || name == "" || !isToken(name) {
			return request{}, notOffloadable("header line %q", l)
		}
		if strings.ContainsAny(value, "\r\n\x00") {
			return request{}, notOffloadable("header %s: a CR, LF or NUL in its value", name)
		}
		switch strings.ToLower(name) {
		case "content-length", "transfer-encoding":
			return request{}, notOffloadable("header %s: a request with a body", name)
		case "expect", "upgrade":
			return request{}, notOffloadable("header %s", name)
		case "connection":
			for _, tok := range strings.Split(value, ",") {
				switch strings.ToLower(strings.TrimSpace(tok)) {
				case "close":
					closeConn = true
				case "keep-alive":
					keepAlive = true
				}
			}
		}
	}
	r.close = closeConn || (r.version == "HTTP/1.0" && !keepAlive)
	return r, nil
}

// isToken reports whether s is an HTTP token (RFC 9110 §5.6.2), as header
// names are.
func isToken(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}

// targetPath is the path of an origin-form request target as nginx
// resolves it before it maps it to a file: the query and a fragment
// dropped (nginx ends the path at the first "?" or "#"),
// percent-decoded, "//" merged, "." and ".." segments resolved. A path
// that ends in "/" (a directory, served by its index file) keeps it. It
// refuses what nginx refuses (a ".." above the root, a NUL, a bad escape).
func targetPath(target string) (string, error) {
	p := target
	if end := strings.IndexAny(p, "?#"); end >= 0 {
		p = p[:end]
	}
	if !strings.HasPrefix(p, "/") {
		return "", notOffloadable("target %q: not a path (origin form)", target)
	}
	var dec strings.Builder
	for i := 0; i < len(p); i++ {
		c := p[i]
		if c == '%' {
			if i+2 >= len(p) || unhex(p[i+1]) < 0 || unhex(p[i+2]) < 0 {
				return "", notOffloadable("target %q: bad percent escape", target)
			}
			c = byte(unhex(p[i+1])<<4 | unhex(p[i+2]))
			i += 2
		}
		if c == 0 {
			return "", notOffloadable("target %q: a NUL", target)
		}
		dec.WriteByte(c)
	}
	d := dec.String()
	depth := 0
	for _, seg := range strings.Split(d, "/") {
		switch seg {
		case "", ".":
		case "..":
			if depth--; depth < 0 {
				return "", notOffloadable("target %q: climbs above the root", target)
			}
		default:
			depth++
		}
	}
	clean := path.Clean(d)
	if strings.HasSuffix(d, "/") || strings.HasSuffix(d, "/.") || strings.HasSuffix(d, "/..") {
		if clean != "/" {
			clean += "/"
		}
	}
	return clean, nil
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// objectPath is the file or directory under root that nginx serves for
// the cleaned request path p with `root ROOT`: root joined with p. A path
// that ends in "/" maps to the directory itself: nginx answers it with an
// index file (index.html by default) or a listing, both entries of the
// directory, and a change of any of its entries invalidates the rule.
func objectPath(root, p string) string {
	return filepath.Join(root, filepath.FromSlash(p))
}

// sources are the paths whose changes may change nginx's response for
// obj, the object a request maps to (a directory when dir): obj itself;
// for a file, obj.gz too, which nginx sends instead with gzip_static to a
// client that accepts gzip; for a directory, what each of its entries
// that is a symbolic link resolves to (an index.html that is a link); and
// every symbolic link met while resolving each of them, with the path it
// resolves to, as inotify reports a write by the name it is made through
// (the file a link within the root names, not the link) and a link that
// names a link is re-pointed under its own name.
func sources(obj string, dir bool) []string {
	names := []string{obj}
	if !dir {
		names = append(names, obj+".gz")
	} else if real, err := filepath.EvalSymlinks(obj); err == nil {
		entries, _ := os.ReadDir(real)
		for _, en := range entries {
			if en.Type()&fs.ModeSymlink != 0 {
				names = append(names, filepath.Join(real, en.Name()))
			}
		}
	}
	out := slices.Clone(names)
	for _, p := range names {
		for _, l := range links(p) {
			if !slices.Contains(out, l) {
				out = append(out, l)
			}
		}
	}
	return out
}

// links are the symbolic links met while resolving the absolute path p,
// each by its own path with the links before it resolved, and the path p
// resolves to; nothing if p does not resolve (it does not exist, or a
// loop).
func links(p string) []string {
	var out []string
	rest := strings.Split(filepath.Clean(p), "/")[1:]
	cur := "/"
	for hops := 0; len(rest) > 0; {
		next := filepath.Join(cur, rest[0])
		rest = rest[1:]
		fi, err := os.Lstat(next)
		if err != nil {
			return nil
		}
		if fi.Mode()&fs.ModeSymlink == 0 {
			cur = next
			continue
		}
		target, err := os.Readlink(next)
		if hops++; err != nil || hops > 40 { // the kernel's limit
			return nil
		}
		out = append(out, next)
		if !filepath.IsAbs(target) {
			target = filepath.Join(cur, target) // cur has no links: ".." is lexical
		}
		rest = append(strings.Split(filepath.Clean(target), "/")[1:], rest...)
		cur = "/"
	}
	return append(out, cur)
}

// affects reports whether a change of the path changed (reported by the
// watcher) may change nginx's response for a request whose response comes
// from one of srcs (its sources; directories when dir): changed is a
// source or one of its parent directories (created, removed, renamed, its
// permissions changed), or, for a directory, one of its entries (its
// index file, or a listing).
func affects(changed string, srcs []string, dir bool) bool {
	return slices.ContainsFunc(srcs, func(src string) bool {
		return changed == src || strings.HasPrefix(src, strings.TrimSuffix(changed, "/")+"/") ||
			(dir && filepath.Dir(changed) == src)
	})
}
