package mcctl

import (
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// linkFollower puts the write tracker on the interfaces that appear in the
// namespace while the controller runs (when no interfaces were given): a
// write through an interface without the tracker would go unseen. A new
// interface starts down (moving one into a namespace brings it down too),
// so the tracker is usually on it before it carries a packet. If it is up
// by the time the tracker is attached, writes may have passed it unseen:
// the follower then bumps the epoch, at once and, through the controller,
// once more when such writes have settled.
type linkFollower struct {
	tracker *Tracker
	guards  *guardMap
	pinDir  string
	log     *slog.Logger

	attached map[int]bool // by ifindex; only the follower's goroutine uses it
	done     chan struct{}
	wg       sync.WaitGroup
	failed   chan error  // why the follower stopped: the controller stops too
	bumped   atomic.Bool // the epoch was bumped since the controller last looked
}

// followLinks subscribes to the namespace's interface changes, then puts the
// tracker on every interface there is, then follows the changes.
func followLinks(t *Tracker, g *guardMap, pinDir string, log *slog.Logger) (*linkFollower, []string, error) {
	f := &linkFollower{tracker: t, guards: g, pinDir: pinDir, log: log, attached: map[int]bool{},
		done: make(chan struct{}), failed: make(chan error, 1)}
	updates, err := f.subscribe()
	if err != nil {
		return nil, nil, err
	}
	names, err := f.attachAll(false) // pinned, with the rest, by the controller
	if err != nil {
		close(f.done)
		return nil, nil, err
	}
	f.wg.Add(1)
	go f.follow(updates)
	return f, names, nil
}

func (f *linkFollower) subscribe() (chan netlink.LinkUpdate, error) {
	updates := make(chan netlink.LinkUpdate, 64)
	err := netlink.LinkSubscribeWithOptions(updates, f.done, netlink.LinkSubscribeOptions{
		ErrorCallback: func(err error) {
			select {
			case <-f.done: // the socket was closed on purpose
			default:
				f.log.Warn("watching for new interfaces", "error", err)
			}
		},
	})
	if err != nil {
		return nil, fmt.Errorf("watch for new interfaces (netlink): %w", err)
	}
	return updates, nil
}

// attachAll puts the tracker on every interface it is not on yet, and
// returns their names. appeared: they came while the controller runs.
func (f *linkFollower) attachAll(appeared bool) ([]string, error) {
	ifs, err := net.Interfaces()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, ifc := range ifs {
		if f.attached[ifc.Index] {
			continue
		}
		if err := f.attach(ifc.Index, ifc.Name, appeared); err != nil {
			return nil, err
		}
		names = append(names, ifc.Name)
	}
	return names, nil
}

// attach puts the tracker on one interface. One that appeared while the
// controller runs is pinned at once, and bumps the epoch if it is up.
func (f *linkFollower) attach(index int, name string, appeared bool) error {
	if err := f.tracker.AttachIndex(index, name); err != nil {
		if _, lerr := net.InterfaceByIndex(index); lerr != nil {
			return nil // gone again
		}
		return err
	}
	f.attached[index] = true
	if !appeared {
		return nil
	}
	if err := f.tracker.Pin(f.pinDir); err != nil {
		return err
	}
	l, err := netlink.LinkByIndex(index)
	up := err == nil && l.Attrs().RawFlags&unix.IFF_UP != 0
	f.log.Info("write tracker attached to a new interface", "interface", name, "up", up)
	if up {
		f.guards.bump(epochSlot)
		f.bumped.Store(true)
	}
	return nil
}

func (f *linkFollower) follow(updates chan netlink.LinkUpdate) {
	defer f.wg.Done()
	for {
		select {
		case <-f.done:
			return
		case u, ok := <-updates:
			var err error
			switch {
			case !ok: // the subscription failed (its socket overflowed): start over
				if updates, err = f.subscribe(); err == nil {
					_, err = f.attachAll(true)
				}
			case u.Header.Type == unix.RTM_DELLINK:
				delete(f.attached, int(u.Index))
			case !f.attached[int(u.Index)]:
				err = f.attach(int(u.Index), u.Attrs().Name, true)
			}
			if err != nil {
				f.failed <- fmt.Errorf("put the write tracker on a new interface: %w", err)
				return
			}
		}
	}
}

// epochBumped says whether the follower bumped the epoch since the last call.
func (f *linkFollower) epochBumped() bool {
	return f.bumped.Swap(false)
}

// stop ends the following; the tracker and the guard map are not touched
// after it returns.
func (f *linkFollower) stop() {
	close(f.done)
	f.wg.Wait()
}
