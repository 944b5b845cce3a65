//go:build linux

package testbed

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// XDP attach modes for AttachXDPNetlink.
const (
	XDPModeDriver  = unix.XDP_FLAGS_DRV_MODE // native XDP (veth supports it)
	XDPModeGeneric = unix.XDP_FLAGS_SKB_MODE
)

// NewXDPPass loads a program that returns XDP_PASS for every frame. It is
// built from instructions, so it needs no compiler. The caller closes it.
func NewXDPPass() (*ebpf.Program, error) {
	return ebpf.NewProgram(&ebpf.ProgramSpec{
		Name: "xdp_pass",
		Type: ebpf.XDP,
		Instructions: asm.Instructions{
			asm.Mov.Imm(asm.R0, 2), // XDP_PASS
			asm.Return(),
		},
		License: "GPL",
	})
}

// AttachXDPNetlink attaches prog to the interface with index ifindex in the
// network namespace ns ("" = the caller's) the old way, through rtnetlink,
// replacing whatever program is attached in that mode. Unlike a bpf_link
// (link.AttachXDP), such an attachment can be replaced by other tools
// (kxdpgun) and outlives the process that made it: remove it with
// DetachXDPNetlink. mode is XDPModeDriver or XDPModeGeneric.
func AttachXDPNetlink(ns string, ifindex int, prog *ebpf.Program, mode uint32) error {
	return inNS(ns, func() error { return setLinkXDP(ifindex, prog.FD(), mode) })
}

// DetachXDPNetlink removes a netlink-attached XDP program (of the given
// mode) from the interface. Removing from an interface without one is not
// an error.
func DetachXDPNetlink(ns string, ifindex int, mode uint32) error {
	return inNS(ns, func() error { return setLinkXDP(ifindex, -1, mode) })
}

// XDPInfo says which XDP programs an interface has.
type XDPInfo struct {
	Attached uint8  // XDP_ATTACHED_*: 0 none, 1 driver, 2 generic, 3 hw, 4 multi
	ProgID   uint32 // the program when exactly one is attached
	DrvID    uint32 // native mode program (also set for bpf_link attachments)
	SKBID    uint32 // generic mode program
}

// ID returns the id of the program that sees received frames first: the
// native one if any, else the generic one. 0 if none.
func (x XDPInfo) ID() uint32 {
	switch {
	case x.DrvID != 0:
		return x.DrvID
	case x.SKBID != 0:
		return x.SKBID
	}
	return x.ProgID
}

// QueryXDP reports the XDP programs attached to interface ifindex in ns.
func QueryXDP(ns string, ifindex int) (XDPInfo, error) {
	var info XDPInfo
	err := inNS(ns, func() error {
		var err error
		info, err = getLinkXDP(ifindex)
		return err
	})
	return info, err
}

func inNS(ns string, f func() error) error {
	if ns == "" {
		return f()
	}
	return Do(ns, f)
}

// --- minimal rtnetlink ---

func nlAttr(typ uint16, payload []byte) []byte {
	l := unix.SizeofNlAttr + len(payload)
	b := make([]byte, (l+3)&^3)
	binary.NativeEndian.PutUint16(b[0:], uint16(l))
	binary.NativeEndian.PutUint16(b[2:], typ)
	copy(b[4:], payload)
	return b
}

func u32b(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

// rtRequest sends one rtnetlink request with an ifinfomsg body and returns
// the reply messages (without the final ack/error). A NLMSG_ERROR with a
// non-zero code becomes the returned error.
func rtRequest(msgType uint16, flags uint16, ifindex int, attrs []byte) ([][]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	// Extended acks give readable errors, if the kernel fills them in.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)

	body := make([]byte, unix.SizeofIfInfomsg)
	body[0] = unix.AF_UNSPEC
	binary.NativeEndian.PutUint32(body[4:], uint32(ifindex))
	body = append(body, attrs...)

	msg := make([]byte, unix.SizeofNlMsghdr, unix.SizeofNlMsghdr+len(body))
	msg = append(msg, body...)
	binary.NativeEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.NativeEndian.PutUint16(msg[4:], msgType)
	binary.NativeEndian.PutUint16(msg[6:], flags|unix.NLM_F_REQUEST|unix.NLM_F_ACK)
	const seq = 1
	binary.NativeEndian.PutUint32(msg[8:], seq)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}

	var replies [][]byte
	buf := make([]byte, 65536)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err != nil {
			return nil, fmt.Errorf("netlink recv: %w", err)
		}
		msgs, err := syscallParseNetlink(buf[:n])
		if err != nil {
			return nil, err
		}
		for _, m := range msgs {
			if m.seq != seq {
				continue
			}
			switch m.typ {
			case unix.NLMSG_ERROR:
				if len(m.data) < 4 {
					return nil, errors.New("netlink: short error message")
				}
				code := int32(binary.NativeEndian.Uint32(m.data))
				if code != 0 {
					return nil, fmt.Errorf("netlink: %w%s", unix.Errno(-code), extAckMsg(m))
				}
				return replies, nil
			case unix.NLMSG_DONE:
				return replies, nil
			default:
				replies = append(replies, append([]byte(nil), m.data...)) // buf is reused
			}
		}
	}
}

type nlMsg struct {
	typ   uint16
	flags uint16
	seq   uint32
	data  []byte
}

func syscallParseNetlink(b []byte) ([]nlMsg, error) {
	var out []nlMsg
	for len(b) >= unix.SizeofNlMsghdr {
		l := int(binary.NativeEndian.Uint32(b[0:]))
		if l < unix.SizeofNlMsghdr || l > len(b) {
			return nil, errors.New("netlink: bad message length")
		}
		out = append(out, nlMsg{
			typ:   binary.NativeEndian.Uint16(b[4:]),
			flags: binary.NativeEndian.Uint16(b[6:]),
			seq:   binary.NativeEndian.Uint32(b[8:]),
			data:  b[unix.SizeofNlMsghdr:l],
		})
		b = b[(l+3)&^3:]
	}
	return out, nil
}

// extAckMsg extracts NLMSGERR_ATTR_MSG from an extended ack, if present.
func extAckMsg(m nlMsg) string {
	if m.flags&unix.NLM_F_ACK_TLVS == 0 || len(m.data) < 4+unix.SizeofNlMsghdr {
		return ""
	}
	// error code, then the original header (payload capped), then TLVs.
	off := 4 + unix.SizeofNlMsghdr
	if m.flags&unix.NLM_F_CAPPED == 0 {
		ol := int(binary.NativeEndian.Uint32(m.data[4:]))
		off = 4 + ol
	}
	for _, a := range parseAttrs(m.data[min(off, len(m.data)):]) {
		if a.typ == unix.NLMSGERR_ATTR_MSG {
			s := a.data
			for len(s) > 0 && s[len(s)-1] == 0 {
				s = s[:len(s)-1]
			}
			return " (" + string(s) + ")"
		}
	}
	return ""
}

type nlattr struct {
	typ  uint16
	data []byte
}

func parseAttrs(b []byte) []nlattr {
	var out []nlattr
	for len(b) >= unix.SizeofNlAttr {
		l := int(binary.NativeEndian.Uint16(b[0:]))
		if l < unix.SizeofNlAttr || l > len(b) {
			break
		}
		out = append(out, nlattr{typ: binary.NativeEndian.Uint16(b[2:]) &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER), data: b[unix.SizeofNlAttr:l]})
		b = b[min((l+3)&^3, len(b)):]
	}
	return out
}

func setLinkXDP(ifindex, progFD int, mode uint32) error {
	inner := append(nlAttr(unix.IFLA_XDP_FD, u32b(uint32(int32(progFD)))), nlAttr(unix.IFLA_XDP_FLAGS, u32b(mode))...)
	attrs := nlAttr(unix.IFLA_XDP|unix.NLA_F_NESTED, inner)
	_, err := rtRequest(unix.RTM_SETLINK, 0, ifindex, attrs)
	if err != nil {
		return fmt.Errorf("set XDP on ifindex %d: %w", ifindex, err)
	}
	return nil
}

func getLinkXDP(ifindex int) (XDPInfo, error) {
	var info XDPInfo
	msgs, err := rtRequest(unix.RTM_GETLINK, 0, ifindex, nil)
	if err != nil {
		return info, fmt.Errorf("get link %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		for _, a := range parseAttrs(m[unix.SizeofIfInfomsg:]) {
			if a.typ != unix.IFLA_XDP {
				continue
			}
			for _, x := range parseAttrs(a.data) {
				switch {
				case x.typ == unix.IFLA_XDP_ATTACHED && len(x.data) >= 1:
					info.Attached = x.data[0]
				case x.typ == unix.IFLA_XDP_PROG_ID && len(x.data) >= 4:
					info.ProgID = binary.NativeEndian.Uint32(x.data)
				case x.typ == unix.IFLA_XDP_DRV_PROG_ID && len(x.data) >= 4:
					info.DrvID = binary.NativeEndian.Uint32(x.data)
				case x.typ == unix.IFLA_XDP_SKB_PROG_ID && len(x.data) >= 4:
					info.SKBID = binary.NativeEndian.Uint32(x.data)
				}
			}
		}
	}
	// With one program attached the kernel reports only IFLA_XDP_PROG_ID.
	switch info.Attached {
	case 1:
		if info.DrvID == 0 {
			info.DrvID = info.ProgID
		}
	case 2:
		if info.SKBID == 0 {
			info.SKBID = info.ProgID
		}
	}
	return info, nil
}

// ProgramStats returns the accumulated run time and run count of the
// program with the given id (needs BPF stats enabled, see EnableBPFStats).
func ProgramStats(id uint32) (*ebpf.ProgramStats, error) {
	p, err := ebpf.NewProgramFromID(ebpf.ProgramID(id))
	if err != nil {
		return nil, fmt.Errorf("program %d: %w", id, err)
	}
	defer p.Close()
	return p.Stats()
}

// EnableBPFStats turns on run-time accounting of BPF programs
// (BPF_ENABLE_STATS, the reference-counted equivalent of the sysctl
// kernel.bpf_stats_enabled=1) until the returned closer is closed.
func EnableBPFStats() (interface{ Close() error }, error) {
	c, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		// Fallback: older kernels only have the sysctl.
		if werr := os.WriteFile("/proc/sys/kernel/bpf_stats_enabled", []byte("1"), 0); werr == nil {
			return sysctlStats{}, nil
		}
		return nil, err
	}
	return c, nil
}

type sysctlStats struct{}

func (sysctlStats) Close() error { return nil } // leave the sysctl as others may rely on it
