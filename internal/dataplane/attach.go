package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
)

// AttachMode says how the rule processor is attached to an interface.
type AttachMode int

const (
	// AttachAuto tries native XDP and falls back to generic XDP with a warning.
	AttachAuto AttachMode = iota
	// AttachNative requires driver-mode XDP.
	AttachNative
	// AttachGeneric uses generic (skb) XDP: works everywhere, much slower.
	AttachGeneric
)

// Attachment is the rule processor attached to one interface: XDP, and the
// TCP handover at TC ingress.
type Attachment struct {
	Interface string
	Native    bool
	ifindex   int
	link      link.Link
	handover  link.Link
	local     *localAddrs
	pin       string     // where the XDP link is pinned, "" if it is not; the handover's is pin + "-handover"
	peer      *peerPlace // the other end of a veth attached in native mode, nil if none or not found
	peerErr   error      // why a veth's other end was not found
	closed    bool       // Close, Detach or Release ran: it holds nothing any more
	// what the attach changed beyond its own links, for undo: the programs
	// it swapped out of pinned links (nil where it made a new link) and
	// whether it gave the veth's other end PeerPassName
	replacedXDP, replacedHandover *ebpf.Program
	gavePeerPass                  bool
}

// Closed reports whether the attachment was closed, detached or released.
func (a *Attachment) Closed() bool { return a.closed }

// Attach attaches the rule processor to the interface ifname in the calling
// thread's network namespace.
func (d *Dataplane) Attach(ifname string, mode AttachMode) (*Attachment, error) {
	return d.attach(ifname, mode, "")
}

// AttachPinned is Attach for an attachment that outlives the process: the
// XDP link is pinned at pinPath (on a bpffs). If the link pinned there is
// attached to ifname already (a previous instance's), the rule processor
// replaces its program atomically, so that no packet goes unprocessed, and
// the link keeps its mode; a pinned link that is no longer attached is
// replaced by a new one.
func (d *Dataplane) AttachPinned(ifname string, mode AttachMode, pinPath string) (*Attachment, error) {
	if pinPath == "" {
		return nil, errors.New("attach pinned: empty pin path")
	}
	att, err := d.attach(ifname, mode, pinPath)
	if err == nil {
		att.forgetReplaced()
	}
	return att, err
}

// AttachPinnedAll is AttachPinned for every interface of ifnames, with
// their links pinned at pinPath(ifname), all or none: if one fails, those
// attached before it are put back as they were (see undo), and the error
// says why.
func (d *Dataplane) AttachPinnedAll(ifnames []string, mode AttachMode, pinPath func(ifname string) string) ([]*Attachment, error) {
	var atts []*Attachment
	for _, ifname := range ifnames {
		att, err := d.attach(ifname, mode, pinPath(ifname))
		if err != nil {
			for _, done := range atts {
				if uerr := done.undo(); uerr != nil {
					err = errors.Join(err, fmt.Errorf("put %s back as it was: %w", done.Interface, uerr))
				}
			}
			return nil, err
		}
		atts = append(atts, att)
	}
	for _, att := range atts {
		att.forgetReplaced()
	}
	return atts, nil
}

// forgetReplaced lets go of the programs att swapped out: it stays.
func (a *Attachment) forgetReplaced() {
	for _, p := range []*ebpf.Program{a.replacedXDP, a.replacedHandover} {
		if p != nil {
			p.Close()
		}
	}
	a.replacedXDP, a.replacedHandover = nil, nil
}

// undo puts back what attaching a changed: the programs it swapped out go
// back into their pinned links, the links it made are detached and
// unpinned, and the program it gave the veth's other end is removed.
func (a *Attachment) undo() error {
	a.closed = true
	err := errors.Join(putBack(a.link, a.replacedXDP, a.pin), putBack(a.handover, a.replacedHandover, a.handoverPin()))
	if a.gavePeerPass {
		err = errors.Join(err, a.removePeerPass())
	}
	a.local.stop()
	a.forgetReplaced()
	return err
}

// putBack gives the link l the program it had, prev, or detaches it and
// removes its pin if it was made anew (prev nil).
func putBack(l link.Link, prev *ebpf.Program, pin string) error {
	if l == nil {
		return nil
	}
	var err error
	if prev != nil {
		err = l.Update(prev)
	} else {
		err = l.Detach()
		if pin != "" {
			err = errors.Join(err, os.Remove(pin))
		}
	}
	return errors.Join(err, l.Close())
}

// Attachable returns the interface named ifname, or why the rule processor
// cannot be attached to it: it does not exist, or it is the loopback
// interface, where requests between local addresses travel (the parser
// passes 127.0.0.0/8 and ::1, and a local source is a martian on any other
// interface).
func Attachable(ifname string) (*net.Interface, error) {
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("interface %s: %w", ifname, err)
	}
	if iface.Flags&net.FlagLoopback != 0 {
		return nil, fmt.Errorf("interface %s is the loopback interface: the rule processor does not answer requests between local addresses; give santad the interfaces clients' requests arrive on", ifname)
	}
	return iface, nil
}

// XDPFree says why the rule processor cannot go on interface ifname: it
// carries an XDP program already, and not through a link pinned at pin (a
// rule processor this santad's state left, which it takes over). An
// interface takes one XDP program per mode, and santad will not replace
// another's.
func XDPFree(ifname, pin string) error {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return fmt.Errorf("interface %s: %w", ifname, err)
	}
	x := l.Attrs().Xdp
	if x == nil || !x.Attached {
		return nil
	}
	if _, err := os.Stat(pin); err == nil {
		return nil
	}
	what := fmt.Sprint(x.ProgId)
	if name, err := programName(x.ProgId); err == nil {
		what += " (" + name + ")"
	}
	return fmt.Errorf("interface %s already has XDP program %s: another santad, or another XDP program, is on it; "+
		"remove it first (that santad's `santad cleanup`, or `ip link set dev %s xdp off`) or give santad another interface",
		ifname, what, ifname)
}

func (d *Dataplane) attach(ifname string, mode AttachMode, pinPath string) (*Attachment, error) {
	iface, err := Attachable(ifname)
	if err != nil {
		return nil, fmt.Errorf("attach: %w", err)
	}
	local, err := d.watchLocalAddrs(iface.Index)
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", ifname, err)
	}
	att := &Attachment{Interface: ifname, ifindex: iface.Index, local: local, pin: pinPath}
	if d.cfg.TCPIdleClose > 0 && d.fins.Load() == nil {
		// in the interface's network namespace, as this call is
		if s, err := newFINSender(); err != nil {
			slog.Warn("idle socket-less TCP connections will not be closed: a client coming back after 128 s is reset", "error", err)
		} else if !d.fins.CompareAndSwap(nil, s) {
			s.close()
		}
	}
	// TC first: while a predecessor's XDP program still runs, this TC
	// program drops what it passes in another version's layout
	// (tcp_drop_emit_layout); the other way round, the predecessor's TC
	// program would misread this XDP program's requests for segments.
	if err := d.linkHandover(att, iface.Index); err != nil {
		local.stop()
		return nil, err
	}
	if err := d.linkXDP(att, iface.Index, mode); err != nil {
		return nil, errors.Join(err, att.undo())
	}
	if att.Native {
		d.watchPeer(att, local.ns, iface.Index)
	}
	return att, nil
}

// linkHandover gives att its TC ingress link for the TCP handover: the
// pinned one with this program swapped in, or a new one, pinned if att is.
func (d *Dataplane) linkHandover(att *Attachment, ifindex int) error {
	pin := att.handoverPin()
	if pin != "" {
		l, err := link.LoadPinnedLink(pin, nil)
		switch {
		case errors.Is(err, os.ErrNotExist):
		case err != nil:
			return fmt.Errorf("open pinned link %s: %w", pin, err)
		default:
			info, err := l.Info()
			if err == nil && info.TCX() != nil && info.TCX().Ifindex == uint32(ifindex) {
				prev, err := swapProgram(l, info, d.objs.SantaHandover)
				if err != nil {
					l.Close()
					return fmt.Errorf("swap the TCP handover into %s: %w", pin, err)
				}
				att.handover, att.replacedHandover = l, prev
				return nil
			}
			l.Close()
			if err := os.Remove(pin); err != nil {
				return err
			}
		}
	}
	l, err := link.AttachTCX(link.TCXOptions{Interface: ifindex, Program: d.objs.SantaHandover, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return fmt.Errorf("attach the TCP handover to TC ingress (tcx) of %s: %w", att.Interface, err)
	}
	att.handover = l
	if pin != "" {
		if err := l.Pin(pin); err != nil {
			return fmt.Errorf("pin TC link of %s at %s: %w", att.Interface, pin, err)
		}
	}
	return nil
}

// Ifindex is the index the interface had when the rule processor was
// attached to it. One removed and created again may have the same index:
// InterfaceGone tells them apart.
func (a *Attachment) Ifindex() int { return a.ifindex }

// InterfaceGone says whether the interface a (not closed) was attached to
// has been removed: the kernel then detaches the XDP link, whatever index
// a later interface gets. If the link cannot be asked, it is taken to be
// there still.
func (a *Attachment) InterfaceGone() bool {
	info, err := a.link.Info()
	return err == nil && info.XDP() != nil && info.XDP().Ifindex == 0
}

// Pins are the paths of att's pinned links (none if it is not pinned).
func (a *Attachment) Pins() []string {
	if a.pin == "" {
		return nil
	}
	return []string{a.pin, a.handoverPin()}
}

func (a *Attachment) handoverPin() string {
	if a.pin == "" {
		return ""
	}
	return a.pin + "-handover"
}

// linkXDP gives att its XDP link: the pinned one, updated, or a new one,
// pinned if att is.
func (d *Dataplane) linkXDP(att *Attachment, ifindex int, mode AttachMode) error {
	if att.pin != "" {
		if swapped, err := d.swapPinned(att, ifindex, mode); err != nil || swapped {
			return err
		}
	}
	if mode != AttachGeneric {
		l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.SantaXdp, Interface: ifindex, Flags: link.XDPDriverMode})
		if err == nil {
			att.link, att.Native = l, true
			return att.pinLink()
		}
		if mode == AttachNative {
			return fmt.Errorf("attach native XDP to %s: %w", att.Interface, err)
		}
		if errors.Is(err, unix.EBUSY) { // not a driver without XDP: another program is there
			return errors.Join(fmt.Errorf("attach native XDP to %s: %w", att.Interface, err), XDPFree(att.Interface, ""))
		}
		slog.Warn("native XDP unavailable, using generic XDP: replies will cost far more CPU",
			"interface", att.Interface, "error", err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.SantaXdp, Interface: ifindex, Flags: link.XDPGenericMode})
	if err != nil {
		return fmt.Errorf("attach generic XDP to %s: %w", att.Interface, err)
	}
	att.link = l
	return att.pinLink()
}

func (a *Attachment) pinLink() error {
	if a.pin == "" {
		return nil
	}
	if err := a.link.Pin(a.pin); err != nil {
		a.link.Close()
		return fmt.Errorf("pin XDP link of %s at %s: %w", a.Interface, a.pin, err)
	}
	return nil
}

// swapPinned puts this rule processor into the XDP link pinned at att.pin,
// if that link is attached to ifindex, and reports whether it did. A pinned
// link that is attached nowhere (Close, or its interface went away) is
// unpinned; one attached to another interface is left alone, with an error.
func (d *Dataplane) swapPinned(att *Attachment, ifindex int, mode AttachMode) (bool, error) {
	l, err := link.LoadPinnedLink(att.pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("open pinned link %s: %w", att.pin, err)
	}
	info, err := l.Info()
	if err != nil {
		l.Close()
		return false, fmt.Errorf("pinned link %s: %w", att.pin, err)
	}
	xdp := info.XDP()
	switch {
	case xdp == nil:
		l.Close()
		return false, fmt.Errorf("%s pins a %v link, not an XDP link", att.pin, info.Type)
	case xdp.Ifindex == 0:
		l.Close()
		return false, os.Remove(att.pin)
	case xdp.Ifindex != uint32(ifindex):
		l.Close()
		return false, fmt.Errorf("the XDP link pinned at %s is attached to interface %d, not %s (%d)",
			att.pin, xdp.Ifindex, att.Interface, ifindex)
	}
	nlink, err := netlink.LinkByIndex(ifindex)
	if err != nil {
		l.Close()
		return false, fmt.Errorf("attach to %s: %w", att.Interface, err)
	}
	native := nlink.Attrs().Xdp != nil && nlink.Attrs().Xdp.AttachMode == nl.XDP_ATTACHED_DRV
	if mode == AttachNative && !native {
		l.Close()
		return false, fmt.Errorf("the XDP link pinned at %s is generic, native was asked for: Detach it first", att.pin)
	}
	prev, err := swapProgram(l, info, d.objs.SantaXdp)
	if err != nil {
		l.Close()
		return false, fmt.Errorf("swap the rule processor into %s: %w", att.pin, err)
	}
	att.link, att.Native, att.replacedXDP = l, native, prev
	return true, nil
}

// swapProgram puts prog into link l, whose info is info, and returns the
// program l had, for undo.
func swapProgram(l link.Link, info *link.Info, prog *ebpf.Program) (*ebpf.Program, error) {
	prev, err := ebpf.NewProgramFromID(info.Program)
	if err != nil {
		return nil, fmt.Errorf("the program in the link: %w", err)
	}
	if err := l.Update(prog); err != nil {
		prev.Close()
		return nil, err
	}
	return prev, nil
}

// Close detaches the rule processor from the interface. A pinned link stays
// pinned, detached, for AttachPinned to replace; Detach removes it.
func (a *Attachment) Close() error {
	if a.closed {
		return nil
	}
	// a removed veth took its peer with it, and its index may be another's now
	peerLeft := a.Native && !a.InterfaceGone()
	a.closed = true
	var err error
	for _, l := range []link.Link{a.link, a.handover} {
		if l == nil {
			continue
		}
		if a.pin != "" { // the pin would keep it attached
			err = errors.Join(err, l.Detach())
		}
		err = errors.Join(err, l.Close())
	}
	if peerLeft {
		err = errors.Join(err, a.removePeerPass())
	}
	a.local.stop()
	return err
}

// Detach detaches the rule processor and removes the link's pin.
func (a *Attachment) Detach() error {
	if a.closed {
		return nil
	}
	var err error
	if a.pin != "" {
		err = errors.Join(os.Remove(a.pin), os.Remove(a.handoverPin()))
	}
	return errors.Join(err, a.Close())
}

// Release lets go of a pinned attachment without detaching it: the rule
// processor keeps answering, with the interface's addresses as they are now,
// until a successor's AttachPinned swaps itself in. (An attachment that is
// not pinned is detached.)
func (a *Attachment) Release() error {
	if a.closed {
		return nil
	}
	a.closed = true
	a.local.halt()
	err := a.link.Close()
	if a.handover != nil {
		err = errors.Join(err, a.handover.Close())
	}
	return err
}

// WatchLocalAddresses makes wildcard-bound sockets answerable for packets
// arriving on ifindex, in the calling thread's network namespace, without
// attaching: for running the program with BPF_PROG_RUN. Call the returned
// function to stop.
func (d *Dataplane) WatchLocalAddresses(ifindex int) (func(), error) {
	l, err := d.watchLocalAddrs(ifindex)
	if err != nil {
		return nil, err
	}
	return l.stop, nil
}
