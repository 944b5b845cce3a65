package httpctl

import (
	"bufio"
	"bytes"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/santa-offload/santa/internal/dataplane"
)

// TestLimits checks the package's copy of the rule processor's limits.
func TestLimits(t *testing.T) {
	if reqWindow != dataplane.ReqWindow || maxPattern != dataplane.MaxPattern || maxConds != dataplane.MaxConds {
		t.Fatalf("limits %d/%d/%d, the data plane's %d/%d/%d", reqWindow, maxPattern, maxConds,
			dataplane.ReqWindow, dataplane.MaxPattern, dataplane.MaxConds)
	}
	if (reqWindow+maxPattern-1)/maxPattern > maxConds {
		t.Fatal("a request window does not fit the conditions of one rule")
	}
}

func TestParseRequest(t *testing.T) {
	for _, tc := range []struct {
		req     string
		path    string
		close   bool
		refused string
	}{
		{req: "GET / HTTP/1.1\r\nHost: a\r\n\r\n", path: "/"},
		{req: "HEAD /a/b.css?v=1 HTTP/1.1\r\nHost: a\r\nAccept: */*\r\n\r\n", path: "/a/b.css"},
		{req: "GET /x HTTP/1.0\r\n\r\n", path: "/x", close: true},
		{req: "GET /x HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n", path: "/x"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\nConnection: close\r\n\r\n", path: "/x", close: true},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\nConnection: TE, close\r\n\r\n", path: "/x", close: true},
		{req: "GET /%61%2Fb//c/./d/../e%20f HTTP/1.1\r\nHost: a\r\n\r\n", path: "/a/b/c/e f"},
		{req: "GET /dir/ HTTP/1.1\r\nHost: a\r\n\r\n", path: "/dir/"},
		{req: "GET /a.css#top HTTP/1.1\r\nHost: a\r\n\r\n", path: "/a.css"},
		{req: "GET /a.css#top?v=1 HTTP/1.1\r\nHost: a\r\n\r\n", path: "/a.css"},
		{req: "GET /a%23b.css HTTP/1.1\r\nHost: a\r\n\r\n", path: "/a#b.css"},
		{req: "GET /dir/. HTTP/1.1\r\nHost: a\r\n\r\n", path: "/dir/"},
		{req: "GET /a/.. HTTP/1.1\r\nHost: a\r\n\r\n", path: "/"},
		{req: "POST /x HTTP/1.1\r\nHost: a\r\n\r\n", refused: "method"},
		{req: "GET /x HTTP/2.0\r\nHost: a\r\n\r\n", refused: "version"},
		{req: "GET http://a/x HTTP/1.1\r\nHost: a\r\n\r\n", refused: "origin form"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\n", refused: "no complete header block"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\n\r\nGET /y HTTP/1.1\r\nHost: a\r\n\r\n", refused: "after the header block"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\n\r\n", refused: "body"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n", refused: "body"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n", refused: "Upgrade"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n", refused: "header line"},
		{req: "GET /x HTTP/1.1\r\nHost a\r\n\r\n", refused: "header line"},
		{req: "GET /x HTTP/1.1\r\nHost: a\nb\r\n\r\n", refused: "CR, LF"},
		{req: "GET /../x HTTP/1.1\r\nHost: a\r\n\r\n", refused: "above the root"},
		{req: "GET /%2e%2e/x HTTP/1.1\r\nHost: a\r\n\r\n", refused: "above the root"},
		{req: "GET /%zz HTTP/1.1\r\nHost: a\r\n\r\n", refused: "percent"},
		{req: "GET /%00 HTTP/1.1\r\nHost: a\r\n\r\n", refused: "NUL"},
		{req: "GET /x  HTTP/1.1\r\nHost: a\r\n\r\n", refused: "request line"},
		{req: "GET /x HTTP/1.1\r\nHost: a\r\nCookie: " + strings.Repeat("c", reqWindow) + "\r\n\r\n", refused: "longer than"},
	} {
		r, err := parseRequest([]byte(tc.req))
		if tc.refused != "" {
			if err == nil || !errors.Is(err, errNotOffloadable) || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("%q: %v, want a refusal saying %q", tc.req, err, tc.refused)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.req, err)
			continue
		}
		if r.path != tc.path || r.close != tc.close || string(r.raw) != tc.req {
			t.Errorf("%q: path %q close %v, want %q %v", tc.req, r.path, r.close, tc.path, tc.close)
		}
	}
}

func TestAffects(t *testing.T) {
	root := "/srv/www"
	for _, tc := range []struct {
		changed, reqPath string
		want             bool
	}{
		{"/srv/www/a.css", "/a.css", true},
		{"/srv/www/a.css", "/a.cs", false},
		{"/srv/www/a.cs", "/a.css", false},
		{"/srv/www/static", "/static/a.css", true}, // the directory renamed or removed
		{"/srv/www", "/static/a.css", true},        // everything (lost events)
		{"/srv/www/static2", "/static/a.css", false},
		{"/srv/www/index.html", "/", true},
		{"/srv/www/dir/index.html", "/dir/", true},
		{"/srv/www/dir/sub/x", "/dir/", false},
		{"/srv/www/dir", "/dir/", true},
		{"/srv/www/other/index.html", "/dir/", false},
		{"/srv/www/a.css.gz", "/a.css", true}, // gzip_static's
		{"/srv/www/dir.gz", "/dir/", false},
	} {
		p, err := targetPath(tc.reqPath)
		if err != nil {
			t.Fatal(err)
		}
		dir := strings.HasSuffix(p, "/")
		if got := affects(tc.changed, sources(objectPath(root, p), dir), dir); got != tc.want {
			t.Errorf("a change of %s affects %s: %v, want %v", tc.changed, tc.reqPath, got, tc.want)
		}
	}
}

// TestExactRule checks that a rule's conditions cover the request exactly,
// in patterns the rule processor takes, and that its reply is the response.
func TestExactRule(t *testing.T) {
	reply := []byte("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi")
	for _, n := range []int{18, 500, maxPattern - 1, maxPattern, maxPattern + 1, reqWindow} {
		req := bytes.Repeat([]byte{'x'}, n)
		for _, close := range []bool{false, true} {
			r := exactRule(req, reply, close)
			var got []byte
			for i, c := range r.Conditions {
				if int(c.Offset) != len(got) || len(c.Pattern) == 0 || len(c.Pattern) > maxPattern || c.Mask != nil {
					t.Fatalf("%d bytes: condition %d at %d of %d bytes", n, i, c.Offset, len(c.Pattern))
				}
				if i > 0 && len(c.Pattern) > len(r.Conditions[0].Pattern) {
					t.Fatalf("%d bytes: condition %d is longer than the first (the anchor must be at offset 0)", n, i)
				}
				got = append(got, c.Pattern...)
			}
			if !bytes.Equal(got, req) || len(r.Conditions) > maxConds {
				t.Fatalf("%d bytes: conditions cover %d bytes in %d conditions", n, len(got), len(r.Conditions))
			}
			if r.MinLen != uint32(n) || r.MaxLen != uint32(n) || r.Close != close {
				t.Fatalf("%d bytes: min %d max %d close %v", n, r.MinLen, r.MaxLen, r.Close)
			}
			if len(r.Processors) != 1 || !bytes.Equal(r.Processors[0].Template, reply) || r.Processors[0].ReplyOffset != 0 ||
				r.ReplyLen != uint32(len(reply)) {
				t.Fatalf("%d bytes: reply %+v", n, r.Processors)
			}
		}
	}
}

// TestWithDate checks the Date rewrite: same length, the new Date, and an
// Expires that moves with the Date moves with it (one that does not,
// stays).
func TestWithDate(t *testing.T) {
	date := time.Date(2026, 11, 21, 4, 3, 27, 0, time.UTC)
	hdr := func(expires time.Time, maxAge string) string {
		h := "HTTP/1.1 200 OK\r\nServer: nginx\r\nDate: " + date.Format(http.TimeFormat) + "\r\nContent-Length: 2\r\n"
		if !expires.IsZero() {
			h += "Expires: " + expires.Format(http.TimeFormat) + "\r\n"
		}
		if maxAge != "" {
			h += "Cache-Control: max-age=" + maxAge + "\r\n"
		}
		return h + "\r\nhi"
	}
	later := date.Add(90 * time.Second)
	for _, tc := range []struct {
		name, in, want string
	}{
		{"no Expires", hdr(time.Time{}, ""), strings.Replace(hdr(time.Time{}, ""), date.Format(http.TimeFormat), later.Format(http.TimeFormat), 1)},
		{"relative", hdr(date.Add(time.Hour), "3600"), strings.NewReplacer(date.Format(http.TimeFormat), later.Format(http.TimeFormat),
			date.Add(time.Hour).Format(http.TimeFormat), later.Add(time.Hour).Format(http.TimeFormat)).Replace(hdr(date.Add(time.Hour), "3600"))},
		{"fixed", hdr(date.Add(time.Hour), "315360000"), strings.Replace(hdr(date.Add(time.Hour), "315360000"), date.Format(http.TimeFormat), later.Format(http.TimeFormat), 1)},
	} {
		r, err := readResponse(bufio.NewReader(strings.NewReader(tc.in)), false, 1448)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		got := r.withDate(later)
		if string(got) != tc.want || len(got) != len(tc.in) {
			t.Errorf("%s:\n%q\nwant\n%q", tc.name, got, tc.want)
		}
		if string(r.raw) != tc.in {
			t.Errorf("%s: withDate changed the response", tc.name)
		}
	}
}

// TestReadResponse checks framing and refusals on canned responses (the
// nginx tests check real ones).
func TestReadResponse(t *testing.T) {
	for _, tc := range []struct {
		in      string
		head    bool
		body    string
		close   bool
		refused string // "" for a response a rule may send
		failed  string // a broken response
	}{
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nhi", body: "hi"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nhi", body: "hi", close: true},
		{in: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", body: "hi", close: true},
		{in: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nhi", body: "hi"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n", head: true},
		{in: "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n"},
		{in: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nhi\r\n0\r\n\r\n", refused: "Transfer-Encoding"},
		{in: "HTTP/1.1 200 OK\r\n\r\nhi", refused: "without Content-Length"},
		{in: "HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\nno", refused: "status 404"},
		{in: "HTTP/1.1 100 Continue\r\n\r\n", refused: "interim"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 2000\r\n\r\n", refused: "too big"},
		{in: "HTTP/1.1 200 OK\r\nDate: yesterday\r\nContent-Length: 2\r\n\r\nhi", refused: "IMF-fixdate"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhi", failed: "unexpected EOF"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nhi", failed: "Content-Length"},
		{in: "SSH-2.0-x\r\n\r\n", failed: "status line"},
		{in: "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", failed: "unexpected EOF"},
	} {
		r, err := readResponse(bufio.NewReader(strings.NewReader(tc.in)), tc.head, 1448)
		switch {
		case tc.refused != "":
			if !isNotOffloadable(err) || !strings.Contains(err.Error(), tc.refused) {
				t.Errorf("%q: %v, want a refusal saying %q", tc.in, err, tc.refused)
			}
		case tc.failed != "":
			if err == nil || isNotOffloadable(err) || !strings.Contains(err.Error(), tc.failed) {
				t.Errorf("%q: %v, want a failure saying %q", tc.in, err, tc.failed)
			}
		case err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case string(r.raw) != tc.in || string(r.body) != tc.body || r.close != tc.close:
			t.Errorf("%q: raw %q body %q close %v", tc.in, r.raw, r.body, r.close)
		}
	}
}
