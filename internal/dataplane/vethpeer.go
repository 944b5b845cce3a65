package dataplane

import (
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// PeerPassName is the name of the XDP program that Santa puts on the other
// end of a veth it attaches to in native mode: a frame sent there with
// XDP_TX only arrives if that end has an XDP program (native mode) of its
// own; without one the kernel counts it as sent and drops it
// (shared/notes/kernel-findings.md). The program passes every frame.
const PeerPassName = "santa_peer_pass"

// vethPeer is the other end of a veth: its link as seen in its own network
// namespace, and that namespace.
type vethPeer struct {
	link  netlink.Link
	ns    netns.NsHandle
	nsid  int    // ns's id in the veth's namespace, -1 if it is the veth's own
	where string // where ns was found, "" if it is the veth's own
}

func (p *vethPeer) close() { p.ns.Close() }

func (p *vethPeer) String() string {
	if p.where == "" {
		return p.link.Attrs().Name
	}
	return fmt.Sprintf("%s (network namespace %s)", p.link.Attrs().Name, p.where)
}

// setXDP attaches the XDP program fd to the peer in native mode (-1:
// detaches it) with the netlink flags given: netlink, not a bpf_link, so that
// it stays while the rule processor does, santad running or not. The request
// goes over a netlink socket opened in the peer's namespace: moving a thread
// there and letting it end with its goroutine would, on the main thread
// (which Go wedges instead of ending), leave /proc/self/ns/net naming the
// peer's namespace, and santad finds servers' sockets by it.
func (p *vethPeer) setXDP(fd, flags int) error {
	s, err := nl.GetNetlinkSocketAt(p.ns, netns.None(), unix.NETLINK_ROUTE)
	if err != nil {
		return err
	}
	defer s.Close()
	req := nl.NewNetlinkRequest(unix.RTM_SETLINK, unix.NLM_F_ACK)
	req.Sockets = map[int]*nl.SocketHandle{unix.NETLINK_ROUTE: {Socket: s}}
	msg := nl.NewIfInfomsg(unix.AF_UNSPEC)
	msg.Index = int32(p.link.Attrs().Index)
	req.AddData(msg)
	xdp := nl.NewRtAttr(unix.IFLA_XDP|unix.NLA_F_NESTED, nil)
	xdp.AddRtAttr(nl.IFLA_XDP_FD, nl.Uint32Attr(uint32(int32(fd))))
	xdp.AddRtAttr(nl.IFLA_XDP_FLAGS, nl.Uint32Attr(uint32(flags|nl.XDP_FLAGS_DRV_MODE)))
	req.AddData(xdp)
	_, err = req.Execute(unix.NETLINK_ROUTE, 0)
	return err
}

// peerOf returns the other end of ifindex, an interface of network namespace
// ns, if that is a veth; nil if it is not.
func peerOf(ns netns.NsHandle, ifindex int) (*vethPeer, error) {
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByIndex(ifindex)
	if err != nil {
		return nil, err
	}
	if l.Type() != "veth" {
		return nil, nil
	}
	p := &vethPeer{nsid: -1}
	if nsid := l.Attrs().NetNsID; nsid >= 0 {
		p.nsid = nsid
		p.ns, p.where, err = namespaceWithID(h, nsid)
	} else { // both ends in ns
		var fd int
		fd, err = unix.Dup(int(ns))
		p.ns = netns.NsHandle(fd)
	}
	if err != nil {
		return nil, err
	}
	ph, err := netlink.NewHandleAt(p.ns)
	if err != nil {
		p.close()
		return nil, err
	}
	defer ph.Close()
	if p.link, err = ph.LinkByIndex(l.Attrs().ParentIndex); err != nil {
		p.close()
		return nil, fmt.Errorf("veth peer (ifindex %d): %w", l.Attrs().ParentIndex, err)
	}
	return p, nil
}

// VethPeerHere is the name of the other end of ifname, an interface of the
// caller's network namespace, if ifname is a veth whose other end is in
// that namespace too; "" otherwise.
func VethPeerHere(ifname string) (string, error) {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return "", fmt.Errorf("interface %s: %w", ifname, err)
	}
	if l.Type() != "veth" || l.Attrs().NetNsID >= 0 {
		return "", nil
	}
	peer, err := netlink.LinkByIndex(l.Attrs().ParentIndex)
	if err != nil {
		return "", fmt.Errorf("veth peer of %s: %w", ifname, err)
	}
	return peer.Attrs().Name, nil
}

// namespaceWithID finds the network namespace that h's calls nsid among
// those santad can open: ip-netns's, then every process's (the veth of a
// container usually has its other end in the host's, where some process
// runs), each namespace asked about once.
func namespaceWithID(h *netlink.Handle, nsid int) (netns.NsHandle, string, error) {
	named, _ := filepath.Glob("/run/netns/*")
	procs, _ := filepath.Glob("/proc/[0-9]*/ns/net")
	seen := map[[2]uint64]bool{}
	for _, path := range append(named, procs...) {
		var st unix.Stat_t
		if unix.Stat(path, &st) != nil || seen[[2]uint64{st.Dev, st.Ino}] {
			continue
		}
		seen[[2]uint64{st.Dev, st.Ino}] = true
		ns, err := netns.GetFromPath(path)
		if err != nil {
			continue
		}
		if id, err := h.GetNetNsIdByFd(int(ns)); err == nil && id == nsid {
			return ns, path, nil
		}
		ns.Close()
	}
	return netns.None(), "", fmt.Errorf("its network namespace (id %d) is neither one in /run/netns nor any process's", nsid)
}

// peerPlace is where the other end of an attached veth is, to look at its
// XDP program later: its namespace (nsid as the veth's namespace calls it,
// -1 for the veth's own; where it was last found) and its ifindex there. No
// handle on the namespace is kept: that would keep a container's namespace
// alive after the container is gone.
type peerPlace struct {
	mu    sync.Mutex
	nsid  int
	where string
	index int
}

// open opens the peer's namespace: where it was last found if that path
// still names it, else wherever it is now.
func (p *peerPlace) open(local netns.NsHandle) (netns.NsHandle, error) {
	if p.nsid < 0 {
		fd, err := unix.Dup(int(local))
		return netns.NsHandle(fd), err
	}
	h, err := netlink.NewHandleAt(local)
	if err != nil {
		return netns.None(), err
	}
	defer h.Close()
	p.mu.Lock()
	defer p.mu.Unlock()
	if ns, err := netns.GetFromPath(p.where); err == nil {
		if id, err := h.GetNetNsIdByFd(int(ns)); err == nil && id == p.nsid {
			return ns, nil
		}
		ns.Close()
	}
	ns, where, err := namespaceWithID(h, p.nsid)
	if err == nil {
		p.where = where
	}
	return ns, err
}

// watchPeer finds the other end of att's interface (ifindex in ns) if it is
// a veth, remembers where it is for PeerXDP, and gives it PeerPassName
// unless the config says to leave it alone.
func (d *Dataplane) watchPeer(att *Attachment, ns netns.NsHandle, ifindex int) {
	peer, err := peerOf(ns, ifindex)
	if peer != nil {
		defer peer.close()
		att.peer = &peerPlace{nsid: peer.nsid, where: peer.where, index: peer.link.Attrs().Index}
		if !d.cfg.LeaveVethPeer {
			var did string
			if att.gavePeerPass, did, err = ensurePeerPass(peer); did != "" {
				slog.Info(did, "interface", att.Interface)
			}
		}
	}
	att.peerErr = err
	if err != nil && !d.cfg.LeaveVethPeer {
		slog.Warn("replies sent from XDP may never arrive: give the other end of this veth a native-mode XDP program (any, e.g. one that returns XDP_PASS)",
			"interface", att.Interface, "error", err)
	}
}

// ensurePeerPass gives peer an XDP program in native mode, PeerPassName,
// unless it has one, and says whether it gave it and what it found or did.
// A peer whose program is in generic mode is an error: native and generic
// programs cannot share an interface.
func ensurePeerPass(peer *vethPeer) (bool, string, error) {
	if x := peer.link.Attrs().Xdp; x != nil && x.Attached {
		if x.AttachMode != nl.XDP_ATTACHED_DRV {
			return false, "", fmt.Errorf("veth peer %v has a generic-mode XDP program (id %d): replies sent with XDP_TX need a native-mode one there", peer, x.ProgId)
		}
		return false, fmt.Sprintf("veth peer %v has XDP program %d", peer, x.ProgId), nil
	}
	prog, err := ebpf.NewProgram(&ebpf.ProgramSpec{
		Name:         PeerPassName,
		Type:         ebpf.XDP,
		Instructions: asm.Instructions{asm.Mov.Imm(asm.R0, 2 /* XDP_PASS */), asm.Return()},
		License:      "GPL",
	})
	if err != nil {
		return false, "", fmt.Errorf("load %s: %w", PeerPassName, err)
	}
	defer prog.Close() // the attachment holds its own reference
	if err := peer.setXDP(prog.FD(), nl.XDP_FLAGS_UPDATE_IF_NOEXIST); err != nil {
		return false, "", fmt.Errorf("attach %s to veth peer %v: %w", PeerPassName, peer, err)
	}
	return true, fmt.Sprintf("attached %s to veth peer %v", PeerPassName, peer), nil
}

// PeerXDP says, for an interface attached in native mode that is a veth,
// which XDP program its other end has now, and if none (or one in generic
// mode) that replies sent from XDP are dropped; "" for any other
// interface. An error says why it cannot tell.
func (a *Attachment) PeerXDP() (string, error) {
	if a.peer == nil {
		return "", a.peerErr
	}
	peer, err := a.peerNow()
	if err != nil {
		return "", err
	}
	defer peer.close()
	name, x := peer.link.Attrs().Name, peer.link.Attrs().Xdp
	switch {
	case x == nil || !x.Attached:
		return name + ": no XDP program: replies sent from XDP are dropped", nil
	case x.AttachMode != nl.XDP_ATTACHED_DRV:
		return fmt.Sprintf("%s: generic-mode XDP program %d: replies sent from XDP are dropped", name, x.ProgId), nil
	}
	prog, err := programName(x.ProgId)
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("%s: XDP program %d (%s)", name, x.ProgId, prog), nil
}

// peerNow is the other end of a's veth (a.peer not nil) as it is now,
// where it was found at attach.
func (a *Attachment) peerNow() (*vethPeer, error) {
	ns, err := a.peer.open(a.local.ns)
	if err != nil {
		return nil, fmt.Errorf("veth peer: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, err
	}
	defer h.Close()
	l, err := h.LinkByIndex(a.peer.index)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("veth peer (ifindex %d): %w", a.peer.index, err)
	}
	return &vethPeer{link: l, ns: ns}, nil
}

// RemovePeerPass removes PeerPassName from the other end of veth ifindex, an
// interface of the caller's network namespace, if it is there; any other
// program stays. Not a veth, or no peer: nothing to do.
func RemovePeerPass(ifindex int) error {
	ns, err := netns.Get()
	if err != nil {
		return err
	}
	defer ns.Close()
	peer, err := peerOf(ns, ifindex)
	if peer == nil || err != nil {
		return ignoreGone(err)
	}
	defer peer.close()
	return removePeerPassFrom(peer)
}

// removePeerPass removes PeerPassName from the other end of a's veth, found
// where it was at attach: the interface may have gone to another network
// namespace since, where its index says nothing.
func (a *Attachment) removePeerPass() error {
	if a.peer == nil {
		return nil
	}
	peer, err := a.peerNow()
	if err != nil {
		return ignoreGone(err)
	}
	defer peer.close()
	return removePeerPassFrom(peer)
}

// ignoreGone is err, or nil if it says an interface or its peer is gone
// (and the program with it).
func ignoreGone(err error) error {
	if errors.As(err, new(netlink.LinkNotFoundError)) {
		return nil
	}
	return err
}

// removePeerPassFrom detaches peer's XDP program if it is PeerPassName.
func removePeerPassFrom(peer *vethPeer) error {
	x := peer.link.Attrs().Xdp
	if x == nil || !x.Attached || x.AttachMode != nl.XDP_ATTACHED_DRV {
		return nil
	}
	if name, err := programName(x.ProgId); err != nil || name != PeerPassName {
		return err
	}
	return peer.setXDP(-1, 0)
}

// programName is the name of the loaded BPF program with id.
func programName(id uint32) (string, error) {
	prog, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return "", fmt.Errorf("BPF program %d: %w", id, err)
	}
	defer prog.Close()
	info, err := prog.Info()
	if err != nil {
		return "", fmt.Errorf("BPF program %d: %w", id, err)
	}
	return info.Name, nil
}
