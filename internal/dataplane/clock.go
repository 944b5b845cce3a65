package dataplane

import (
	"fmt"
	"math"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// monotonicNow is CLOCK_MONOTONIC in ns, the clock of the data plane's
// bpf_ktime_get_coarse_ns (which lags it by a jiffy at most).
func monotonicNow() (uint64, error) {
	base, err := monotonicBase()
	if err != nil {
		return 0, err
	}
	return base.ns + uint64(time.Since(base.at)), nil
}

// monotonicBase pairs one CLOCK_MONOTONIC reading with Go's clock at that
// moment. Go's monotonic clock is CLOCK_MONOTONIC too, read through the
// vDSO, so later readings need no system call (unix.ClockGettime makes
// one: a rule with an expiry time paid it, a million rules 0.45 s).
// The reading is taken between two of Go's, again if the thread was held
// up in between, and paired with their midpoint.
var monotonicBase = sync.OnceValues(func() (clockPair, error) {
	for try := 1; ; try++ {
		var ts unix.Timespec
		before := time.Now()
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			return clockPair{}, fmt.Errorf("read CLOCK_MONOTONIC: %w", err)
		}
		took := time.Since(before)
		if took < 20*time.Microsecond || try == 10 {
			return clockPair{at: before.Add(took / 2), ns: uint64(ts.Nano())}, nil
		}
	}
})

type clockPair struct {
	at time.Time // Go's clock
	ns uint64    // CLOCK_MONOTONIC at the same moment
}

// UntilUnix is the time from now to Unix time sec (a rule's Expires):
// negative once it has passed, the longest Duration for a time further
// off. (time.Unix cannot hold it: a time past 2^63 - 62135596800 s wraps
// into the past, and such a rule expired at once.)
func UntilUnix(sec uint64, now time.Time) time.Duration {
	if sec >= math.MaxInt64/uint64(time.Second) {
		return math.MaxInt64
	}
	return time.Duration(int64(sec)*int64(time.Second) - now.UnixNano())
}

// monotonicAt is Unix time sec on the data plane's clock (ns): now plus
// the time until then, 0 if it has passed, saturated far in the future.
func monotonicAt(sec uint64) (uint64, error) {
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	until := UntilUnix(sec, time.Now())
	switch {
	case until <= 0:
		return 0, nil
	case uint64(until) > math.MaxUint64-now:
		return math.MaxUint64, nil
	}
	return now + uint64(until), nil
}
