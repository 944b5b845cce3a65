// Package follow keeps a controller (santa dns, santa memcached, santa
// http) in step with its server. Watch streams the miss samples of the
// sockets the controller attached to and says at once when the server
// closes one: santad ends a socket's subscriptions when its rule set goes
// with the socket. Run starts the controller again once the server, or
// santad, is back (the --follow option). ClaimTag keeps two controllers
// from running with one tag on one port. Room tells when rules have gone
// from santad after it had no room for more.
package follow

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"syscall"
	"time"

	"github.com/santa-offload/santa/api"
	"github.com/santa-offload/santa/clients/go/santa"
	"github.com/vishvananda/netlink"
)

// ErrServerGone is why a controller stops when its server closed a socket
// it attached to: the server stopped or restarted, and the socket's rules
// went with it.
var ErrServerGone = errors.New("the server closed a socket the controller attached to (it stopped or restarted); its rules are gone")

// SocketGoneError is ErrServerGone for one socket: santad no longer has
// its rule set (the server closed it).
type SocketGoneError struct{ Cookie uint64 }

func (e *SocketGoneError) Error() string {
	return fmt.Sprintf("%v (socket %d)", ErrServerGone, e.Cookie)
}

func (e *SocketGoneError) Unwrap() error { return ErrServerGone }

// ErrNoServer is why a controller cannot start: no process serves the
// server's port (yet).
var ErrNoServer = errors.New("no server on the port")

// WatchOnly are the sample options of a controller that does not learn
// from misses: the least santad takes, one byte once a second and CPU,
// enough to be told when the socket goes.
var WatchOnly = santa.SampleOptions{Bytes: 1, Rate: 1}

// Watch subscribes to the miss samples of every socket in cookies and
// calls each (if not nil) with every sample, from the subscriptions'
// goroutines, until ctx ends. The returned channel receives one error when
// a subscription ends early and cannot be made again: one wrapping
// ErrServerGone when santad no longer has the socket's rule set, another
// when santad is unreachable. A failed first subscription is returned at
// once. It is NewWatcher for a controller whose sampling stays as it is.
func Watch(ctx context.Context, socketPath string, cookies []uint64, opts santa.SampleOptions,
	each func(cookie uint64, s santa.Sample)) (<-chan error, error) {
	w, err := NewWatcher(ctx, socketPath, cookies, opts, each)
	if err != nil {
		return nil, err
	}
	return w.Ended(), nil
}

// A Watcher holds the miss-sample subscriptions of Watch, whose rate it
// can change while they run (SetRate).
type Watcher struct {
	ctx   context.Context
	path  string
	ended chan error

	mu     sync.Mutex
	opts   santa.SampleOptions
	mixed  bool                           // a SetRate failed part way: not every subscription has opts
	closed bool                           // ctx ended: the subscriptions are closed
	subs   map[uint64]*santa.Subscription // each socket's current subscription
}

// NewWatcher is Watch, returning the Watcher.
func NewWatcher(ctx context.Context, socketPath string, cookies []uint64, opts santa.SampleOptions,
	each func(cookie uint64, s santa.Sample)) (*Watcher, error) {
	w := &Watcher{ctx: ctx, path: socketPath, ended: make(chan error, len(cookies)), opts: opts,
		subs: make(map[uint64]*santa.Subscription, len(cookies))}
	for _, cookie := range cookies {
		sub, err := santa.Subscribe(socketPath, santa.Cookie(cookie), opts)
		if err != nil {
			w.closeAll()
			return nil, fmt.Errorf("subscribe to the misses of socket %d: %w", cookie, err)
		}
		w.subs[cookie] = sub
	}
	for cookie, sub := range w.subs {
		go w.stream(cookie, sub, each)
	}
	context.AfterFunc(ctx, func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		w.closed = true
		w.closeAll()
	})
	return w, nil
}

// Ended receives one error for each subscription that ended early and
// could not be made again (see Watch).
func (w *Watcher) Ended() <-chan error { return w.ended }

// stream passes the socket's samples to each until w.ctx ends, taking up
// the subscription that replaced sub (SetRate) or subscribing again.
func (w *Watcher) stream(cookie uint64, sub *santa.Subscription, each func(uint64, santa.Sample)) {
	for {
		streamErr := sub.Each(w.ctx, func(s santa.Sample) {
			if each != nil {
				each(cookie, s)
			}
		})
		if w.ctx.Err() != nil {
			return
		}
		w.mu.Lock()
		if w.closed {
			w.mu.Unlock()
			return
		}
		if next := w.subs[cookie]; next != sub { // SetRate ended it
			sub = next
			w.mu.Unlock()
			continue
		}
		// santad ends a socket's subscriptions when its rule set goes,
		// and all of them when it stops: subscribing again tells which.
		next, err := santa.Subscribe(w.path, santa.Cookie(cookie), w.opts)
		if err == nil {
			w.subs[cookie], sub = next, next
		}
		w.mu.Unlock()
		switch {
		case errors.Is(err, santa.ErrNotFound):
			w.ended <- &SocketGoneError{Cookie: cookie}
			return
		case err != nil:
			w.ended <- fmt.Errorf("the miss samples of socket %d stopped (%v) and santad does not take them up again: %w",
				cookie, streamErr, err)
			return
		}
	}
}

// SetRate changes the subscriptions' samples per second and CPU. Each
// socket's new subscription starts before its old one ends (santad samples
// at the higher rate of the two meanwhile), so no miss goes unsampled
// that either rate would have sampled. On an error the sockets not yet
// changed keep the old rate; a later SetRate changes them all again.
func (w *Watcher) SetRate(rate uint32) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case w.closed || w.ctx.Err() != nil:
		return errors.New("the miss samples are no longer watched")
	case rate == w.opts.Rate && !w.mixed:
		return nil
	}
	opts := w.opts
	opts.Rate = rate
	for cookie, old := range w.subs {
		next, err := santa.Subscribe(w.path, santa.Cookie(cookie), opts)
		if err != nil {
			w.mixed = true
			return fmt.Errorf("subscribe to the misses of socket %d at %d per second and CPU: %w", cookie, rate, err)
		}
		w.subs[cookie] = next
		old.Close() // its stream goroutine takes up next
	}
	w.opts, w.mixed = opts, false
	return nil
}

func (w *Watcher) closeAll() {
	for _, sub := range w.subs {
		sub.Close()
	}
}

// Gone reports whether a controller stopped because its server went away:
// ErrServerGone, ErrNoServer, or santad's "not found" for a socket closed
// under a call.
func Gone(err error) bool {
	return errors.Is(err, ErrServerGone) || errors.Is(err, ErrNoServer) || errors.Is(err, santa.ErrNotFound)
}

// Options are what Run needs to wait for the server and santad.
type Options struct {
	Follow   bool          // start again after the server or santad went away; else run once
	Socket   string        // santad's control socket ("": santa.SocketPath())
	Port     uint16        // the server's port; 0 for one socket by pid and fd, which cannot be followed (no --follow hint)
	Protocol uint32        // api.ProtocolUDP or api.ProtocolTCP (listeners)
	Settle   time.Duration // wait this long after the port has a socket again, for the server to load its data
	Log      *slog.Logger
}

// Run calls run until ctx ends. Without o.Follow it calls it once. With
// it, whenever run ends because the server went away (Gone), or finds no
// socket on the port, Run waits until the port has a socket again, then
// o.Settle, and calls run again; and whenever run fails while santad,
// which answered before run, no longer does or is another process (it
// stopped or restarted), Run waits until santad answers, then for the
// port, and calls run again; so too when santad did not answer at all and
// run could not reach it (not started yet). Any other failure ends Run.
func Run(ctx context.Context, o Options, run func(context.Context) error) error {
	for {
		santad := santadPID(o.Socket)
		err := run(ctx)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			return nil // stopped (a signal, --duration) before it was ready: no failure
		}
		if err == nil || ctx.Err() != nil {
			return err
		}
		absent := !Gone(err) && santad == 0 && unreachable(err)
		santadGone := !Gone(err) && (santad != 0 && santadPID(o.Socket) != santad || absent)
		switch {
		case !Gone(err) && !santadGone:
			return err
		case !o.Follow && o.Port == 0: // --pid and --fd: --follow needs --port
			return err
		case !o.Follow && absent:
			return fmt.Errorf("%w (with --follow the controller waits for santad and starts once it answers)", err)
		case !o.Follow && santadGone:
			return fmt.Errorf("%w (santad went away; with --follow the controller waits for it and starts again)", err)
		case !o.Follow:
			return fmt.Errorf("%w (with --follow the controller waits for the server and attaches again)", err)
		case absent:
			o.Log.Warn("santad does not answer; starting once it does", "socket", o.Socket, "error", err)
			if err := waitForSantad(ctx, o.Socket); err != nil {
				return nil // stopped while waiting
			}
			o.Log.Info("santad answers; starting", "socket", o.Socket)
			continue
		case santadGone:
			o.Log.Warn("santad went away; starting again once it is back", "socket", o.Socket, "error", err)
			if err := waitForSantad(ctx, o.Socket); err != nil {
				return nil // stopped while waiting
			}
			// a server gone meanwhile makes run fail with Gone: waited for then
			o.Log.Info("santad is back; starting again", "socket", o.Socket)
			continue
		default:
			o.Log.Warn("the server went away; attaching again once it is back", "port", o.Port, "error", err)
		}
		if err := WaitForPort(ctx, o.Port, o.Protocol); err != nil {
			if ctx.Err() != nil {
				return nil // stopped while waiting
			}
			return err
		}
		o.Log.Info("the port has a socket again", "port", o.Port, "settle", o.Settle)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(o.Settle):
		}
	}
}

// unreachable says whether err is santad's socket refusing a connection:
// santad is not running (yet), or another one is starting.
func unreachable(err error) bool {
	return errors.Is(err, syscall.ENOENT) || errors.Is(err, syscall.ECONNREFUSED)
}

// pollEvery is how often WaitForPort looks for the server's socket, and
// waitForSantad for santad.
const pollEvery = 250 * time.Millisecond

// santadPID is the pid santad at socket reports, 0 if it does not answer.
func santadPID(socket string) uint32 {
	c, err := santa.Dial(socket)
	if err != nil {
		return 0
	}
	defer c.Close()
	return SantadPID(c)
}

// SantadPID is the pid of the santad c talks to, 0 if none answers.
func SantadPID(c *santa.Client) uint32 {
	info, _, err := c.Health()
	if err != nil {
		return 0
	}
	return info.PID
}

// KeepRules says whether a controller's run that ends now (ctx is the run's)
// must leave its rules rather than delete them: it failed, and santad, which
// answered with pid when the run started, no longer answers or is another
// process, as Run finds too. santad went away under the run: its rules go on
// answering, restored by the next santad, until the next run or controller
// with the tag takes them over. The client would dial a santad started
// meanwhile and delete them there.
func KeepRules(ctx context.Context, c *santa.Client, pid uint32) bool {
	return ctx.Err() == nil && SantadPID(c) != pid
}

// waitForSantad returns once santad at socket answers, or with ctx's error
// when ctx ends first.
func waitForSantad(ctx context.Context, socket string) error {
	return pollUntil(ctx, func() (bool, error) { return santadPID(socket) != 0, nil })
}

// WaitForPort returns once a UDP socket (protocol api.ProtocolUDP) is
// bound, or a TCP socket (api.ProtocolTCP) listens, on port in this network
// namespace, IPv4 or IPv6; or with ctx's error when ctx ends first.
func WaitForPort(ctx context.Context, port uint16, protocol uint32) error {
	return pollUntil(ctx, func() (bool, error) { return portInUse(port, protocol) })
}

// pollUntil asks done every pollEvery until it says yes or fails, or ctx
// ends (then it returns ctx's error).
func pollUntil(ctx context.Context, done func() (bool, error)) error {
	for {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(pollEvery):
		}
	}
}

// tcpListen is the TCP_LISTEN state of sock_diag.
const tcpListen = 10

// portInUse asks sock_diag (netlink) for the namespace's sockets.
func portInUse(port uint16, protocol uint32) (bool, error) {
	for _, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		var socks []*netlink.Socket
		var err error
		if protocol == api.ProtocolTCP {
			socks, err = netlink.SocketDiagTCP(family)
		} else {
			socks, err = netlink.SocketDiagUDP(family)
		}
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return false, fmt.Errorf("list the sockets of port %d (sock_diag): %w", port, err)
		}
		for _, s := range socks {
			if s.ID.SourcePort == port && (protocol != api.ProtocolTCP || s.State == tcpListen) {
				return true, nil
			}
		}
	}
	return false, nil
}

// InNamespace reports whether the caller's network namespace holds one of
// the UDP sockets socks (by cookie): santad binds sockets of its own
// namespace, where a controller must run to ask the server at their
// addresses.
func InNamespace(socks []api.SocketInfo) (bool, error) {
	want := map[uint64]bool{}
	for _, s := range socks {
		want[s.Cookie] = true
	}
	for _, family := range []uint8{syscall.AF_INET, syscall.AF_INET6} {
		all, err := netlink.SocketDiagUDP(family)
		if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
			return false, fmt.Errorf("list the UDP sockets of this network namespace (sock_diag): %w", err)
		}
		for _, s := range all {
			if want[uint64(s.ID.Cookie[0])|uint64(s.ID.Cookie[1])<<32] {
				return true, nil
			}
		}
	}
	return false, nil
}

// DeleteTagged deletes every rule tagged tag of the sockets cookies, in one
// request per socket however many rules it holds: a controller's exit. A
// million rules deleted 1024 per request took santad 10 s, each request
// moving the rest of the set; in one request 2 s. The rules of a socket that
// is gone went with it.
func DeleteTagged(c *santa.Client, cookies []uint64, tag string) error {
	_, _, err := DeleteTaggedCounted(c, cookies, tag)
	return err
}

// DeleteTaggedCounted is DeleteTagged that also says how many rules santad
// deleted, and which sockets were gone (with their rules).
func DeleteTaggedCounted(c *santa.Client, cookies []uint64, tag string) (deleted int, gone []uint64, err error) {
	for _, cookie := range cookies {
		ids, err := c.DeleteTagged(santa.Cookie(cookie), tag)
		switch {
		case errors.Is(err, santa.ErrNotFound):
			gone = append(gone, cookie)
		case err != nil:
			return deleted, gone, fmt.Errorf("delete the rules tagged %q of socket %d: %w", tag, cookie, err)
		}
		deleted += len(ids)
	}
	return deleted, gone, nil
}

// RuleClient is what AddEverywhere and DeleteRules need of a santad client
// (*santa.Client).
type RuleClient interface {
	Add(t santa.Target, rules []api.Rule) ([]uint64, error)
	Delete(t santa.Target, ids []uint64) error
	ListPage(t santa.Target, tag string, after uint64, limit uint32) ([]api.Rule, bool, error)
}

// AddEverywhere adds rules to every socket of cookies, all or none: ids[k]
// are rule k's ids in cookie order. Before each socket's add, the rules of
// a predecessor they supersede go (in; nil: none). When a socket refuses
// them, they are deleted again from the sockets before it, so that the
// sockets stay alike; the error is santad's refusal, with any failure of
// that undo joined.
func AddEverywhere(c RuleClient, cookies []uint64, rules []api.Rule, in *Inherited) ([][]uint64, error) {
	ids := make([][]uint64, len(rules))
	for ci, cookie := range cookies {
		if in != nil {
			if err := in.Supersede(c, cookie, rules); err != nil {
				return nil, err
			}
		}
		got, err := c.Add(santa.Cookie(cookie), rules)
		if err != nil {
			err = fmt.Errorf("add %d rules to socket %d: %w", len(rules), cookie, err)
			for undo := range ci {
				del := make([]uint64, len(rules))
				for k := range rules {
					del[k] = ids[k][undo]
				}
				if derr := c.Delete(santa.Cookie(cookies[undo]), del); derr != nil {
					err = errors.Join(err, fmt.Errorf("undo the add on socket %d: %w", cookies[undo], derr))
				}
			}
			return nil, err
		}
		for k, id := range got {
			ids[k] = append(ids[k], id)
		}
	}
	return ids, nil
}

// AddFitting adds rules to every socket of cookies (AddEverywhere), in
// order, as far as santad takes them. A part santad refuses is halved and
// each half tried again, so that a batch holding one rule santad refuses,
// or finding room for only some, costs a few requests instead of one per
// rule. A rule santad refuses for what it is (santa.ErrInvalid) is left out
// and handed to refused. At the first rule santad has no room for (NoRoom)
// it stops and returns that refusal; any other failure it returns at once.
// ids[k] are rule k's ids in cookie order, nil for a rule not added.
func AddFitting(c RuleClient, cookies []uint64, rules []api.Rule, in *Inherited,
	refused func(k int, err error)) (ids [][]uint64, err error) {
	ids = make([][]uint64, len(rules))
	var add func(lo, hi int) error
	add = func(lo, hi int) error {
		got, err := AddEverywhere(c, cookies, rules[lo:hi], in)
		switch {
		case err == nil:
			copy(ids[lo:hi], got)
			return nil
		case !NoRoom(err) && !errors.Is(err, santa.ErrInvalid):
			return err
		case hi-lo > 1:
			mid := lo + (hi-lo)/2
			if err := add(lo, mid); err != nil {
				return err
			}
			return add(mid, hi)
		case NoRoom(err):
			return err
		default:
			refused(lo, err)
			return nil
		}
	}
	if len(rules) == 0 {
		return ids, nil
	}
	return ids, add(0, len(rules))
}

// NoRoom reports whether santad refused rules for want of room: its data
// plane is full, or the caller's quota is reached.
func NoRoom(err error) bool {
	return errors.Is(err, santa.ErrFull) || errors.Is(err, santa.ErrQuota)
}

// DeleteRules deletes rules ids of socket cookie. santad refuses the whole
// request if one is gone (it removes a rule itself when it expires, and
// all of them with the socket). Then, unless the socket's rule set is gone
// with all its rules (one request tells), each half is tried again, so
// that the rules already gone are left out in a few requests rather than
// one per rule.
func DeleteRules(c RuleClient, cookie uint64, ids []uint64) error {
	if len(ids) == 0 {
		return nil
	}
	err := c.Delete(santa.Cookie(cookie), ids)
	switch {
	case !errors.Is(err, santa.ErrNotFound):
		return err
	case len(ids) == 1:
		return nil
	}
	if _, _, err := c.ListPage(santa.Cookie(cookie), "", 0, 1); err != nil {
		if errors.Is(err, santa.ErrNotFound) {
			return nil
		}
		return err
	}
	return deleteHalves(c, cookie, ids)
}

// deleteHalves deletes ids in two halves, each halved again while santad
// refuses it because one of its rules is gone.
func deleteHalves(c RuleClient, cookie uint64, ids []uint64) error {
	mid := len(ids) / 2
	for _, part := range [][]uint64{ids[:mid], ids[mid:]} {
		err := c.Delete(santa.Cookie(cookie), part)
		switch {
		case errors.Is(err, santa.ErrNotFound) && len(part) > 1:
			err = deleteHalves(c, cookie, part)
		case errors.Is(err, santa.ErrNotFound):
			err = nil
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UnbindEmpty removes the rule sets of cookies that hold no rules: those a
// controller's attach made, on its exit. One with rules (somebody else's)
// stays, and so does one that is gone with its socket.
func UnbindEmpty(c *santa.Client, cookies []uint64, log *slog.Logger) {
	for _, cookie := range cookies {
		if rules, _, err := c.ListPage(santa.Cookie(cookie), "", 0, 1); err != nil || len(rules) > 0 {
			continue
		}
		if err := c.Unbind(santa.Cookie(cookie)); err != nil {
			log.Warn("detaching a socket failed", "socket", cookie, "error", err)
		}
	}
}
