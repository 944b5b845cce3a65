package dataplane

import (
	"fmt"
	"log/slog"
	"net"

	"github.com/cilium/ebpf/link"
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

// Attachment is the rule processor attached to one interface.
type Attachment struct {
	Interface string
	Native    bool
	link      link.Link
	local     *localAddrs
}

// Attach attaches the rule processor to the interface ifname in the calling
// thread's network namespace.
func (d *Dataplane) Attach(ifname string, mode AttachMode) (*Attachment, error) {
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", ifname, err)
	}
	local, err := d.watchLocalAddrs(iface.Index)
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", ifname, err)
	}
	att := &Attachment{Interface: ifname, local: local}
	if mode != AttachGeneric {
		l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.SantaXdp, Interface: iface.Index, Flags: link.XDPDriverMode})
		if err == nil {
			att.link, att.Native = l, true
			return att, nil
		}
		if mode == AttachNative {
			local.stop()
			return nil, fmt.Errorf("attach native XDP to %s: %w", ifname, err)
		}
		slog.Warn("native XDP unavailable, using generic XDP: replies will cost far more CPU",
			"interface", ifname, "error", err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.SantaXdp, Interface: iface.Index, Flags: link.XDPGenericMode})
	if err != nil {
		local.stop()
		return nil, fmt.Errorf("attach generic XDP to %s: %w", ifname, err)
	}
	att.link = l
	return att, nil
}

// Close detaches the rule processor from the interface.
func (a *Attachment) Close() error {
	err := a.link.Close()
	a.local.stop()
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
