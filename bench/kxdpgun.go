//go:build linux

package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/santa-offload/santa/internal/testbed"
)

// KxdpgunPath is Debian's kxdpgun (package knot-dnsutils).
var KxdpgunPath = "/usr/sbin/kxdpgun"

// Gun runs kxdpgun from the client namespace of a testbed.
type Gun struct {
	TB        *testbed.Testbed
	QueryFile string
	Target    string // server IP
	CPU       int    // -F affinity of kxdpgun's (single) thread
	Batch     int    // -b; 0: kxdpgun's default (10 for UDP)
}

// LoadResult is what a load generator reports for one run.
type LoadResult struct {
	Sent       uint64  // total requests
	SentPPS    float64 // as reported by the generator
	Replies    uint64  // total replies
	RepliesPPS float64
	Duration   float64 // seconds, as requested (kxdpgun prints it rounded)
	Output     string  // the generator's own report, for verbose logs
	// Latency percentiles the generator measured itself (wrk), zero if it
	// measures none; the harness reports them when no prober runs.
	LatP50, LatP90, LatP99, LatMax time.Duration
}

var (
	reQueries = regexp.MustCompile(`total queries:\s+(\d+)\s+\((\d+) pps\)`)
	reReplies = regexp.MustCompile(`total replies:\s+(\d+)\s+\((\d+) pps\)`)
)

// WriteQueryFile writes queries in kxdpgun's format ("name type" per line).
func WriteQueryFile(path string, qs []Query) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := bufio.NewWriter(f)
	for _, q := range qs {
		fmt.Fprintf(w, "%s %s\n", q.Name, q.Type)
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Run sends qps queries per second for d (whole seconds, at least 1) and
// returns kxdpgun's counts. kxdpgun replaces the client veth's XDP program
// with its own and leaves it there: Run puts the testbed's xdp_pass back
// (before too, in case an earlier run was interrupted).
func (g *Gun) Run(ctx context.Context, qps int, d time.Duration) (LoadResult, error) {
	if err := g.TB.AttachClientPass(); err != nil {
		return LoadResult{}, err
	}
	res, err := g.run(ctx, qps, d)
	if perr := g.TB.AttachClientPass(); err == nil {
		err = perr
	}
	return res, err
}

func (g *Gun) run(ctx context.Context, qps int, d time.Duration) (LoadResult, error) {
	secs := int(d.Round(time.Second) / time.Second)
	if secs < 1 {
		secs = 1
	}
	args := []string{
		"-t", strconv.Itoa(secs),
		"-Q", strconv.Itoa(qps),
		"-F", strconv.Itoa(g.CPU),
		"-i", g.QueryFile,
		"-I", g.TB.Client.Dev,
	}
	if g.Batch > 0 {
		args = append(args, "-b", strconv.Itoa(g.Batch))
	}
	args = append(args, g.Target)
	// Bounded: the run itself plus generous start-up and tear-down time.
	cctx, cancel := context.WithTimeout(ctx, time.Duration(secs)*time.Second+30*time.Second)
	defer cancel()
	cmd := testbed.Command(cctx, g.TB.Client.NS, KxdpgunPath, args...)
	cmd.WaitDelay = 5 * time.Second
	out, err := cmd.CombinedOutput()
	res := LoadResult{Duration: float64(secs), Output: string(out)}
	if err != nil {
		if cctx.Err() != nil {
			return res, fmt.Errorf("kxdpgun: %w (%v): %s", cctx.Err(), err, tail(out))
		}
		return res, fmt.Errorf("kxdpgun %s: %w: %s", strings.Join(args, " "), err, tail(out))
	}
	m := reQueries.FindStringSubmatch(res.Output)
	if m == nil {
		return res, fmt.Errorf("kxdpgun: no 'total queries' in output: %s", tail(out))
	}
	res.Sent, _ = strconv.ParseUint(m[1], 10, 64)
	res.SentPPS, _ = strconv.ParseFloat(m[2], 64)
	if m := reReplies.FindStringSubmatch(res.Output); m != nil {
		res.Replies, _ = strconv.ParseUint(m[1], 10, 64)
		res.RepliesPPS, _ = strconv.ParseFloat(m[2], 64)
	}
	return res, nil
}

func tail(b []byte) string {
	s := strings.TrimSpace(string(b))
	if len(s) > 600 {
		s = "…" + s[len(s)-600:]
	}
	return s
}

// checkTools fails early if a tool the harness needs is missing.
func checkTools() error {
	for _, p := range []string{KxdpgunPath, testbed.NSDPath, testbed.NSDCheckconfPath} {
		if _, err := os.Stat(p); err != nil {
			return fmt.Errorf("%s missing (Debian packages knot-dnsutils, nsd; run scripts/install-deps.sh)", p)
		}
	}
	for _, p := range []string{"ip", "ethtool", "taskset"} {
		if _, err := exec.LookPath(p); err != nil {
			return fmt.Errorf("%s not on PATH", p)
		}
	}
	return nil
}
