package dataplane

import (
	"math"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// monotonicNow, derived from Go's clock after one reading, stays on
// CLOCK_MONOTONIC: every reading lies between two of the kernel's taken
// around it.
func TestMonotonicNowIsTheKernelClock(t *testing.T) {
	kernel := func() uint64 {
		var ts unix.Timespec
		if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
			t.Fatal(err)
		}
		return uint64(ts.Nano())
	}
	for i := 0; i < 5; i++ {
		before := kernel()
		now, err := monotonicNow()
		after := kernel()
		if err != nil {
			t.Fatal(err)
		}
		// Go reads the same clock through the vDSO: allow the calibration's
		// skew (at most 10 µs), no drift
		if now+10_000 < before || now > after+10_000 {
			t.Fatalf("monotonicNow %d outside the kernel's [%d, %d]", now, before, after)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// UntilUnix holds Unix times of any size: one past what time.Unix can
// represent is far off, not (wrapped) in the past.
func TestUntilUnix(t *testing.T) {
	now := time.Unix(1_800_000_000, 500_000_000)
	for sec, want := range map[uint64]time.Duration{
		1_800_000_010:  9500 * time.Millisecond,
		1_799_999_990:  -10500 * time.Millisecond,
		1 << 62:        math.MaxInt64,
		1 << 63:        math.MaxInt64,
		math.MaxUint64: math.MaxInt64,
		9_223_372_035:  time.Duration(9_223_372_035*int64(time.Second) - now.UnixNano()),
	} {
		if got := UntilUnix(sec, now); got != want {
			t.Errorf("UntilUnix(%d): %v, want %v", sec, got, want)
		}
	}
}
