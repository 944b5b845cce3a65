package dataplane

import (
	"fmt"
	"math"
	"time"

	"golang.org/x/sys/unix"
)

// monotonicNow is CLOCK_MONOTONIC in ns, the clock of the data plane's
// bpf_ktime_get_coarse_ns (which lags it by a jiffy at most).
func monotonicNow() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, fmt.Errorf("read CLOCK_MONOTONIC: %w", err)
	}
	return uint64(ts.Nano()), nil
}

// monotonicAt is wall-clock time t on the data plane's clock (ns): now
// plus the time until t, 0 if t has passed, saturated far in the future.
func monotonicAt(t time.Time) (uint64, error) {
	now, err := monotonicNow()
	if err != nil {
		return 0, err
	}
	until := time.Until(t)
	switch {
	case until <= 0:
		return 0, nil
	case uint64(until) > math.MaxUint64-now:
		return math.MaxUint64, nil
	}
	return now + uint64(until), nil
}
