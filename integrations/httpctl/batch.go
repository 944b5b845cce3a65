package httpctl

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"time"

	"golang.org/x/sys/unix"
)

// fetchTask is one request to fetch from nginx: over each address of from
// in turn, every response the same beyond Date (fetchSame).
type fetchTask struct {
	e        *entry // the loop's: the fetch worker does not touch it
	req      request
	from     []netip.AddrPort
	main     netip.AddrPort // the group's address: errors over another name theirs
	maxReply int
	resp     *response // the last response, if all of them were the same
	err      error     // else why not; set before the fetch if the addresses could not be listed
}

// fetchBatch is requests fetched one after another, off the loop in the
// fetch worker; the loop then applies what was fetched.
type fetchBatch struct {
	tasks []*fetchTask
	want  int       // stop once this many were answered (0: fetch all)
	now   time.Time // when the batch was made
	apply func(*fetchBatch) error
	f     fetcher // what fetches it
	done  int     // tasks[:done] were fetched, a response or nginx's failure each
}

// newBatch is a batch of tasks, nil if there are none.
func newBatch(tasks []*fetchTask, want int, now time.Time, apply func(*fetchBatch) error) *fetchBatch {
	if len(tasks) == 0 {
		return nil
	}
	return &fetchBatch{tasks: tasks, want: want, now: now, apply: apply}
}

// fetchNext hands the fetch worker its next batch if it is free: the
// requests whose files changed and settled first, then those learn found
// hot, then those due for re-validation. One batch at a time: a request
// is fetched by one batch at most, and a hung nginx holds one connection.
// Outside the loop (tests) each batch is fetched and applied at once.
func (c *Controller) fetchNext(now time.Time) error {
	for _, next := range []func(time.Time) *fetchBatch{c.pendingBatch, c.learnBatch, c.revalidateBatch} {
		if c.fetching != nil {
			return nil
		}
		b := next(now)
		switch {
		case b == nil:
		case c.inLoop:
			b.f = c.fetcher(c.w)
			c.fetching, c.changed = b, nil
			c.toFetch <- b
		default:
			b.f = c.fetcher(nil)
			b.f.run(b)
			if err := b.apply(b); err != nil {
				return err
			}
		}
	}
	return nil
}

// startFetchWorker starts the fetch worker: it fetches the batches sent
// on c.toFetch and sends each back on c.fetched, until toFetch is closed.
// It runs in the calling thread's network namespace, where nginx is
// reached: a goroutine may run on any thread, and not every thread of the
// process need be in that namespace (the tests run the controller on a
// thread of a namespace of their own).
func (c *Controller) startFetchWorker() error {
	ns, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		return fmt.Errorf("the network namespace to fetch from: %w", err)
	}
	in, out, started := c.toFetch, c.fetched, make(chan error, 1)
	go func() {
		leave, err := enterNetns(ns)
		ns.Close()
		started <- err
		if err != nil {
			return
		}
		defer leave()
		for b := range in {
			b.f.run(b)
			out <- b
		}
	}()
	return <-started
}

// enterNetns locks the calling goroutine to its thread and moves the
// thread into the network namespace ns, unless it is there already; leave
// moves it back and unlocks it. A thread that cannot be moved back stays
// locked and ends with its goroutine; none may end otherwise: a child
// process started from it with a parent-death signal (as the tests start
// nginx and santad) would get that signal.
func enterNetns(ns *os.File) (leave func(), err error) {
	runtime.LockOSThread()
	own, err := os.Open("/proc/thread-self/ns/net")
	if err != nil {
		runtime.UnlockOSThread()
		return nil, fmt.Errorf("the fetch worker's network namespace: %w", err)
	}
	stay := func() { // the thread is in its own namespace
		own.Close()
		runtime.UnlockOSThread()
	}
	var want, have unix.Stat_t
	if err := errors.Join(unix.Fstat(int(ns.Fd()), &want), unix.Fstat(int(own.Fd()), &have)); err != nil {
		stay()
		return nil, fmt.Errorf("the network namespace to fetch from: %w", err)
	}
	if want.Dev == have.Dev && want.Ino == have.Ino {
		return stay, nil
	}
	if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
		stay()
		return nil, fmt.Errorf("the fetch worker joins the network namespace to fetch from: %w", err)
	}
	return func() {
		if unix.Setns(int(own.Fd()), unix.CLONE_NEWNET) == nil {
			runtime.UnlockOSThread()
		}
		own.Close()
	}, nil
}

// fetcher fetches from nginx. It holds nothing of the loop's: the fetch
// worker runs it while the loop goes on.
type fetcher struct {
	ctx     context.Context // cuts a fetch short when it ends (the stop)
	w       *watcher        // a change under the root cuts a fetch short; nil: not
	timeout time.Duration
}

func (c *Controller) fetcher(w *watcher) fetcher {
	return fetcher{ctx: c.ctx, w: w, timeout: c.cfg.Timeout}
}

// errCutShort ends a fetch that the stop or a change under the document
// root cut short (not nginx): nothing is refused for it.
var errCutShort = errors.New("fetch cut short")

// run fetches the batch's tasks in turn, for at most maxBatchTime and
// until b.want of them were answered, and stops at a fetch cut short: the
// rest are left for later.
func (f fetcher) run(b *fetchBatch) {
	start, answered := time.Now(), 0
	for _, t := range b.tasks {
		if time.Since(start) > maxBatchTime || (b.want > 0 && answered == b.want) {
			return
		}
		if t.err == nil {
			t.resp, t.err = f.fetchSame(t)
		}
		if errors.Is(t.err, errCutShort) {
			return
		}
		b.done++
		if t.err == nil {
			answered++
		}
	}
}

// fetchSame fetches t's request over each address of t.from in turn and
// returns the last response, if every one is complete, offloadable and,
// Date aside, the same as the one before.
func (f fetcher) fetchSame(t *fetchTask) (*response, error) {
	var last *response
	for i, addr := range t.from {
		r, err := f.fetchFrom(addr, t.req, t.maxReply)
		if errors.Is(err, errCutShort) {
			return nil, err
		}
		if err != nil && addr != t.main {
			err = fmt.Errorf("over %v: %w", addr, err)
		}
		if err != nil {
			return nil, err
		}
		if d, _ := r.at(r.date); last != nil && !bytes.Equal(last.withDate(d), r.raw) {
			return nil, fmt.Errorf("%w: two responses to the same request differ beyond Date (over %v and %v)", errVaries, t.from[i-1], addr)
		}
		last = r
	}
	return last, nil
}

// fetchFrom fetches req from nginx at addr (see fetchContext for what
// cuts it short).
func (f fetcher) fetchFrom(addr netip.AddrPort, req request, maxReply int) (*response, error) {
	ctx, end := f.ctx, func() {}
	if f.w != nil {
		ctx, end = f.w.fetchContext(f.ctx)
	}
	defer end()
	r, err := fetch(ctx, addr, req, maxReply, f.timeout)
	if err != nil && ctx.Err() != nil {
		return nil, fmt.Errorf("%w: %w", errCutShort, context.Cause(ctx))
	}
	return r, err
}
