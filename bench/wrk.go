//go:build linux

package bench

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// WrkPath is Debian's wrk (package wrk).
var WrkPath = "/usr/bin/wrk"

// Wrk runs wrk from the client namespace of a testbed: one thread pinned
// to CPU, closed loop (each connection sends its next request when the
// response to the last has arrived). As a Generator its "rate" is the
// number of connections (-c).
type Wrk struct {
	TB      *testbed.Testbed
	URL     string
	Headers []string // extra request headers ("Connection: close")
	CPU     int
	// Timeout is wrk's --timeout (whole seconds): a response later than
	// that counts as a timeout error; 0: 2 s (wrk's default).
	Timeout time.Duration
	// Prepare, if set, runs before each run (e.g. to remove the server's
	// TIME_WAIT sockets of earlier runs).
	Prepare func() error
}

// WrkResult is what wrk reports for one run.
type WrkResult struct {
	Requests   uint64  // responses received (any status)
	Seconds    float64 // the run's length as wrk measured it
	ReqPerSec  float64
	Non2xx     uint64 // responses with a status other than 2xx or 3xx
	Connect    uint64 // socket errors
	Read       uint64
	Write      uint64
	Timeouts   uint64
	LatAvg     time.Duration
	LatMax     time.Duration
	Percentile map[int]time.Duration // --latency: 50, 75, 90, 99
}

// Errors are the requests that got no good response: socket errors,
// timeouts and non-2xx/3xx responses.
func (r WrkResult) Errors() uint64 { return r.Connect + r.Read + r.Write + r.Timeouts + r.Non2xx }

// Run runs wrk with conns connections for d (whole seconds, at least 1).
// Sent is the requests answered plus those that failed (socket errors,
// timeouts), Replies those answered with a 2xx or 3xx status; the latency
// percentiles are wrk's.
func (w *Wrk) Run(ctx context.Context, conns int, d time.Duration) (LoadResult, error) {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	if w.Prepare != nil {
		if err := w.Prepare(); err != nil {
			return LoadResult{}, err
		}
	}
	r, out, err := w.run(ctx, conns, secs)
	res := LoadResult{Duration: float64(secs), Output: out}
	if err != nil {
		return res, err
	}
	res.Replies = r.Requests - min(r.Requests, r.Non2xx)
	res.Sent = r.Requests + r.Connect + r.Read + r.Write + r.Timeouts
	res.SentPPS = float64(res.Sent) / r.Seconds
	res.RepliesPPS = float64(res.Replies) / r.Seconds
	res.LatP50, res.LatP90, res.LatP99, res.LatMax = r.Percentile[50], r.Percentile[90], r.Percentile[99], r.LatMax
	return res, nil
}

func (w *Wrk) run(ctx context.Context, conns, secs int) (WrkResult, string, error) {
	timeout := w.Timeout
	if timeout <= 0 {
		timeout = 2 * time.Second
	}
	args := []string{"-c", strconv.Itoa(w.CPU), WrkPath, "-t1", "-c", strconv.Itoa(conns),
		"-d", fmt.Sprintf("%ds", secs), "--timeout", fmt.Sprintf("%ds", max(1, int(timeout.Round(time.Second)/time.Second))), "--latency"}
	for _, h := range w.Headers {
		args = append(args, "-H", h)
	}
	args = append(args, w.URL)
	// Bounded: wrk ends after -d (plus its timeout for the last responses).
	cctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+timeout+15*time.Second)
	defer cancel()
	cmd := testbed.Command(cctx, w.TB.Client.NS, "taskset", args...)
	cmd.WaitDelay = 5 * time.Second
	b, err := cmd.CombinedOutput()
	out := string(b)
	if err != nil {
		if cctx.Err() != nil {
			return WrkResult{}, out, fmt.Errorf("wrk: %w (%v): %s", cctx.Err(), err, tail(b))
		}
		return WrkResult{}, out, fmt.Errorf("wrk %s: %w: %s", strings.Join(args[2:], " "), err, tail(b))
	}
	r, err := ParseWrk(out)
	return r, out, err
}

var (
	reWrkTotal   = regexp.MustCompile(`(?m)^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m|h)\b`)
	reWrkRate    = regexp.MustCompile(`(?m)^Requests/sec:\s+([0-9.]+)`)
	reWrkLatency = regexp.MustCompile(`(?m)^\s+Latency\s+([0-9.]+\w+)\s+([0-9.]+\w+)\s+([0-9.]+\w+)`)
	reWrkPct     = regexp.MustCompile(`(?m)^\s+(50|75|90|99)%\s+([0-9.]+\w+)`)
	reWrkSocket  = regexp.MustCompile(`Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)`)
	reWrkNon2xx  = regexp.MustCompile(`Non-2xx or 3xx responses: (\d+)`)
)

// ParseWrk reads wrk's report (with --latency).
func ParseWrk(out string) (WrkResult, error) {
	var r WrkResult
	m := reWrkTotal.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("wrk: no \"N requests in T\" line: %s", tail([]byte(out)))
	}
	r.Requests, _ = strconv.ParseUint(m[1], 10, 64)
	d, err := wrkDuration(m[2] + m[3])
	if err != nil || d <= 0 {
		return r, fmt.Errorf("wrk: run length %q: %v", m[2]+m[3], err)
	}
	r.Seconds = d.Seconds()
	if m := reWrkRate.FindStringSubmatch(out); m != nil {
		r.ReqPerSec, _ = strconv.ParseFloat(m[1], 64)
	}
	if m := reWrkLatency.FindStringSubmatch(out); m != nil {
		r.LatAvg, _ = wrkDuration(m[1])
		r.LatMax, _ = wrkDuration(m[3])
	}
	r.Percentile = map[int]time.Duration{}
	for _, m := range reWrkPct.FindAllStringSubmatch(out, -1) {
		p, _ := strconv.Atoi(m[1])
		if v, err := wrkDuration(m[2]); err == nil {
			r.Percentile[p] = v
		}
	}
	if r.Requests > 0 && len(r.Percentile) == 0 {
		return r, fmt.Errorf("wrk: no latency distribution (run with --latency): %s", tail([]byte(out)))
	}
	if m := reWrkSocket.FindStringSubmatch(out); m != nil {
		r.Connect, _ = strconv.ParseUint(m[1], 10, 64)
		r.Read, _ = strconv.ParseUint(m[2], 10, 64)
		r.Write, _ = strconv.ParseUint(m[3], 10, 64)
		r.Timeouts, _ = strconv.ParseUint(m[4], 10, 64)
	}
	if m := reWrkNon2xx.FindStringSubmatch(out); m != nil {
		r.Non2xx, _ = strconv.ParseUint(m[1], 10, 64)
	}
	return r, nil
}

// wrkDuration parses wrk's durations: 12.34us, 1.20ms, 2.00s, 1.00m, 1h.
func wrkDuration(s string) (time.Duration, error) {
	units := []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}}
	for _, u := range units {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return 0, fmt.Errorf("duration %q: %w", s, err)
			}
			return time.Duration(f * float64(u.unit)), nil
		}
	}
	return 0, fmt.Errorf("duration %q: unknown unit", s)
}
