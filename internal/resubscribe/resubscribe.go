// Package resubscribe keeps a netlink subscription (vishvananda/netlink's
// LinkSubscribe, AddrSubscribe…) going when the kernel ends it: a burst of
// events faster than its reader overflows the subscription's socket, the
// kernel reports ENOBUFS and the library closes the update channel. The
// events of the burst are lost, so after subscribing again the caller
// catches up with the kernel's state as it is.
package resubscribe

import (
	"fmt"
	"log/slog"
	"time"
)

// A subscription that the kernel ended is replaced after a pause that
// doubles, up to pauseMax, while they keep ending: the burst of events that
// overflowed one may overflow the next.
const (
	pauseFirst = 100 * time.Millisecond
	pauseMax   = 10 * time.Second
)

// SubscribeFunc starts one subscription, as the library's
// XxxSubscribeWithOptions does, with onError as its ErrorCallback.
type SubscribeFunc[U any] func(updates chan<- U, done <-chan struct{}, onError func(error)) error

// Subscription is a netlink subscription that Follow renews.
type Subscription[U any] struct {
	log       *slog.Logger
	what      string // "interface updates"
	state     string // what catching up looks at: "the interfaces"
	subscribe SubscribeFunc[U]
	updates   chan U
	done      chan struct{} // releases the current subscription's socket
}

// Subscribe starts a subscription to what ("address updates"), whose
// catching up looks at state ("the addresses"), for the log.
func Subscribe[U any](log *slog.Logger, what, state string, subscribe SubscribeFunc[U]) (*Subscription[U], error) {
	s := &Subscription[U]{log: log, what: what, state: state, subscribe: subscribe}
	if err := s.start(); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *Subscription[U]) start() error {
	updates := make(chan U, 64)
	done := make(chan struct{})
	err := s.subscribe(updates, done, func(err error) {
		select {
		case <-done: // its socket was closed on purpose
		default:
			s.log.Warn(s.what, "error", err)
		}
	})
	if err != nil {
		close(done)
		return fmt.Errorf("subscribe to %s: %w", s.what, err)
	}
	s.updates, s.done = updates, done
	return nil
}

// End releases the current subscription's socket.
func (s *Subscription[U]) End() {
	close(s.done)
	for range s.updates { // until its reader, which may be handing over one more, sees the socket closed
	}
}

// Follow hands each update to handle until stop is closed, then ends the
// subscription. When the kernel ends it, Follow subscribes again and then
// calls catchUp, as the updates missed meanwhile are lost.
func (s *Subscription[U]) Follow(stop <-chan struct{}, handle func(U), catchUp func()) {
	pause := pauseFirst
	for {
		subscribed := time.Now()
		stopping := s.follow(stop, handle)
		s.End()
		if stopping {
			return
		}
		if time.Since(subscribed) > pauseMax {
			pause = pauseFirst // a new burst, not the one that ended the last
		}
		s.log.Warn(s.what+" ended: subscribing again, then catching up with "+s.state+" as they are", "in", pause)
		for {
			select {
			case <-stop:
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, pauseMax)
			err := s.start()
			if err == nil {
				break
			}
			s.log.Error(s.what+": could not subscribe again", "error", err, "retry_in", pause)
		}
		catchUp()
	}
}

// follow hands updates to handle until stop is closed (true) or the
// subscription ends (false).
func (s *Subscription[U]) follow(stop <-chan struct{}, handle func(U)) (stopping bool) {
	for {
		select {
		case <-stop:
			return true
		case u, ok := <-s.updates:
			if !ok {
				return false
			}
			handle(u)
		}
	}
}
