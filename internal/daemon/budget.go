package daemon

import (
	"sync"

	"github.com/santa-offload/santa/api"
)

// requestBudget bounds the memory each non-root uid's requests hold in
// santad at once (quota.request_bytes): the frames being read and what
// decoding them allocates (api.DecodedBound). Without it a user's
// connections, each sending a frame of up to 256 MiB that decodes to over
// 100 times its size (a rule array of empty maps), would run santad out of
// memory. A request waits while the uid's others hold the room its frame
// needs; one that holds room already (its frame, when it asks for what
// decoding takes) is refused rather than wait, so that two requests of a
// uid never wait for each other.
type requestBudget struct {
	limit uint64 // 0 = unlimited
	mu    sync.Mutex
	freed *sync.Cond
	held  map[uint32]uint64
}

func newRequestBudget(limit uint64) *requestBudget {
	b := &requestBudget{limit: limit, held: map[uint32]uint64{}}
	b.freed = sync.NewCond(&b.mu)
	return b
}

// reserve takes n more bytes for a request of uid that holds own already.
// With none held it waits for the uid's other requests to free room;
// otherwise, or if the request would not fit alone, it refuses.
func (b *requestBudget) reserve(uid uint32, own, n uint64) error {
	if uid == 0 || b.limit == 0 {
		return nil
	}
	if own+n > b.limit {
		return fail(api.StatusQuota, "the request needs about %d bytes of santad's memory, over uid %d's quota of %d for requests "+
			"in flight (santad config quota.request_bytes): split it", own+n, uid, b.limit)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for b.held[uid]+n > b.limit {
		if own > 0 {
			return fail(api.StatusQuota, "the request needs about %d bytes of santad's memory, and uid %d's other requests in flight "+
				"hold too much of its quota of %d (santad config quota.request_bytes): send it again when they are done, or split it",
				own+n, uid, b.limit)
		}
		b.freed.Wait()
	}
	b.held[uid] += n
	return nil
}

// release gives back n bytes uid reserved.
func (b *requestBudget) release(uid uint32, n uint64) {
	if uid == 0 || b.limit == 0 || n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.held[uid] -= n; b.held[uid] == 0 {
		delete(b.held, uid)
	}
	b.freed.Broadcast()
}
