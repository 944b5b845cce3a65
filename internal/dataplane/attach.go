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
}

// Attach attaches the rule processor to the interface ifname in the calling
// thread's network namespace.
func (d *Dataplane) Attach(ifname string, mode AttachMode) (*Attachment, error) {
	iface, err := net.InterfaceByName(ifname)
	if err != nil {
		return nil, fmt.Errorf("attach to %s: %w", ifname, err)
	}
	if mode != AttachGeneric {
		l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.SantaXdp, Interface: iface.Index, Flags: link.XDPDriverMode})
		if err == nil {
			return &Attachment{ifname, true, l}, nil
		}
		if mode == AttachNative {
			return nil, fmt.Errorf("attach native XDP to %s: %w", ifname, err)
		}
		slog.Warn("native XDP unavailable, using generic XDP: replies will cost far more CPU",
			"interface", ifname, "error", err)
	}
	l, err := link.AttachXDP(link.XDPOptions{Program: d.objs.SantaXdp, Interface: iface.Index, Flags: link.XDPGenericMode})
	if err != nil {
		return nil, fmt.Errorf("attach generic XDP to %s: %w", ifname, err)
	}
	return &Attachment{ifname, false, l}, nil
}

// Close detaches the rule processor from the interface.
func (a *Attachment) Close() error { return a.link.Close() }
