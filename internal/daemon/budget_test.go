package daemon

import (
	"testing"
	"time"

	"github.com/santa-offload/santa/api"
)

// TestRequestBudget: a uid's frame waits for room its other requests free;
// a request that holds room (its frame) is refused rather than wait, so two
// requests of a uid never wait for each other; root and other uids are not
// bound by one uid's use.
func TestRequestBudget(t *testing.T) {
	b := newRequestBudget(100)
	if err := b.reserve(7, 0, 60); err != nil { // request A's frame
		t.Fatal(err)
	}
	if err := b.reserve(7, 0, 30); err != nil { // request B's frame
		t.Fatal(err)
	}
	if err := b.reserve(7, 60, 20); statusOf(err) != api.StatusQuota { // A's decoding, with B's frame held
		t.Fatalf("a request holding room, asking for more than is left: %v, want quota at once", err)
	}
	if err := b.reserve(7, 0, 101); statusOf(err) != api.StatusQuota {
		t.Fatalf("a frame over the quota by itself: %v, want quota", err)
	}
	waiting := make(chan error)
	go func() { waiting <- b.reserve(7, 0, 50) }()
	select {
	case err := <-waiting:
		t.Fatalf("a frame with 10 bytes left of 100: %v, want it to wait", err)
	case <-time.After(50 * time.Millisecond):
	}
	b.release(7, 60)
	if err := <-waiting; err != nil {
		t.Fatalf("the waiting frame once room was freed: %v", err)
	}
	if err := b.reserve(0, 0, 1000); err != nil {
		t.Errorf("root: %v", err)
	}
	if err := b.reserve(8, 0, 100); err != nil {
		t.Errorf("another uid: %v", err)
	}
}
