package dataplane

import (
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
