package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/santa-offload/santa/internal/resubscribe"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// localAddrs keeps santa_local_addrs in step with the addresses of an
// attached interface's network namespace: a wildcard-bound socket only gets
// answers for packets addressed to this host, as the kernel would deliver them.
type localAddrs struct {
	d       *Dataplane
	ifindex uint32
	ns      netns.NsHandle
	h       *netlink.Handle
	quit    chan struct{}
	stopped chan struct{}
	have    map[santaSantaLocalAddr]uint8
}

const (
	addrLocal     = uint8(santaSantaLimitSANTA_ADDR_LOCAL)
	addrBroadcast = uint8(santaSantaLimitSANTA_ADDR_BROADCAST)
)

// watchLocalAddrs starts keeping the addresses of the calling thread's
// namespace for packets arriving on ifindex. If the subscription to address
// changes ends (ENOBUFS under a burst of them), it subscribes again and
// syncs: an address removed meanwhile must not stay answered for.
func (d *Dataplane) watchLocalAddrs(ifindex int) (*localAddrs, error) {
	ns, err := netns.Get()
	if err != nil {
		return nil, fmt.Errorf("open network namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return nil, fmt.Errorf("netlink: %w", err)
	}
	l := &localAddrs{d: d, ifindex: uint32(ifindex), ns: ns, h: h,
		quit: make(chan struct{}), stopped: make(chan struct{}), have: map[santaSantaLocalAddr]uint8{}}
	log := slog.With("interface", ifindex)
	updates, err := resubscribe.Subscribe(log, "address updates", "the addresses",
		func(updates chan<- netlink.AddrUpdate, done <-chan struct{}, onError func(error)) error {
			return netlink.AddrSubscribeWithOptions(updates, done, netlink.AddrSubscribeOptions{Namespace: &ns, ErrorCallback: onError})
		})
	if err != nil {
		l.close()
		return nil, err
	}
	if err := l.sync(); err != nil {
		updates.End()
		l.close()
		return nil, err
	}
	syncLogged := func() {
		if err := l.sync(); err != nil {
			log.Warn("local addresses out of date", "error", err)
		}
	}
	go func() {
		defer close(l.stopped)
		updates.Follow(l.quit, func(netlink.AddrUpdate) { syncLogged() }, syncLogged)
	}()
	return l, nil
}

// sync makes the map hold exactly the namespace's addresses.
func (l *localAddrs) sync() error {
	addrs, err := l.h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	want := map[santaSantaLocalAddr]uint8{}
	for _, a := range addrs {
		if ip, ok := netip.AddrFromSlice(a.IP); ok {
			want[l.key(ip.Unmap())] = addrLocal
		}
		for _, b := range broadcastAddrs(a) {
			want[l.key(b)] = addrBroadcast
		}
	}
	m := l.d.objs.SantaLocalAddrs
	for k, kind := range want {
		if kind == l.have[k] {
			continue
		}
		// counted in the filter before the program can find it, so the
		// filter never says "none" of an address in the map
		_, had := l.have[k]
		if !had {
			if err := l.d.countLocalAddr(k, 1); err != nil {
				return err
			}
		}
		if err := m.Put(k, kind); err != nil {
			if !had {
				l.d.countLocalAddr(k, -1)
			}
			return fmt.Errorf("add local address: %w", err)
		}
		l.d.localAddrsChanged()
		l.have[k] = kind
	}
	for k := range l.have {
		if _, ok := want[k]; !ok {
			if err := l.remove(k); err != nil {
				return err
			}
		}
	}
	return nil
}

// remove takes k out of the map, then out of the filter.
func (l *localAddrs) remove(k santaSantaLocalAddr) error {
	if err := l.d.objs.SantaLocalAddrs.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
		return fmt.Errorf("remove local address: %w", err)
	}
	l.d.localAddrsChanged()
	if err := l.d.countLocalAddr(k, -1); err != nil {
		return err
	}
	delete(l.have, k)
	return nil
}

// localAddrsChanged follows every change of santa_local_addrs: the
// program's per-CPU answers of it (santa_scratch.local) hold only while
// its santa_gens word has not moved.
func (d *Dataplane) localAddrsChanged() {
	d.gens.add64(uint32(santaSantaLimitSANTA_GEN_LOCAL_ADDRS), 0, 1)
}

// countLocalAddr adds delta to the count of k's slot in santa_local_filter.
func (d *Dataplane) countLocalAddr(k santaSantaLocalAddr, delta int32) error {
	d.localMu.Lock() // the watchers of several interfaces share the filter
	defer d.localMu.Unlock()
	slot := localFilterSlot(k)
	var n uint32
	if err := d.objs.SantaLocalFilter.Lookup(slot, &n); err != nil {
		return fmt.Errorf("local address filter: %w", err)
	}
	if err := d.objs.SantaLocalFilter.Put(slot, uint32(int32(n)+delta)); err != nil {
		return fmt.Errorf("local address filter: %w", err)
	}
	return nil
}

// localFilterSlot is local_filter_slot's twin (bpf/maps.h): k's 24 bytes
// as three little-endian words.
func localFilterSlot(k santaSantaLocalAddr) uint32 {
	var b [24]byte
	binary.LittleEndian.PutUint32(b[0:], k.Ifindex)
	b[4] = k.Family
	copy(b[8:], k.Addr[:])
	const prime = 0x9e3779b97f4a7c15
	h := binary.LittleEndian.Uint64(b[0:]) * prime
	h = (h ^ binary.LittleEndian.Uint64(b[8:])) * prime
	h = (h ^ binary.LittleEndian.Uint64(b[16:])) * prime
	return uint32(h >> (64 - santaSantaLimitSANTA_LOCAL_FILTER_BITS))
}

func (l *localAddrs) key(ip netip.Addr) santaSantaLocalAddr {
	k := santaSantaLocalAddr{Ifindex: l.ifindex, Family: 6}
	if ip.Is4() {
		k.Family = 4
	}
	copy(k.Addr[:], ip.AsSlice())
	return k
}

// stop ends the watch and removes its addresses.
func (l *localAddrs) stop() {
	l.halt()
	for k := range l.have {
		if err := l.remove(k); err != nil {
			slog.Warn("local addresses", "interface", l.ifindex, "error", err)
		}
	}
}

// halt ends the watch, leaving its addresses in the map.
func (l *localAddrs) halt() {
	close(l.quit)
	<-l.stopped
	l.close()
}

func (l *localAddrs) close() {
	l.h.Close()
	l.ns.Close()
}

// broadcastAddrs are the IPv4 broadcast addresses the kernel routes for an
// address (fib_add_ifaddr): the configured one, and for prefixes shorter than
// /31 the subnet's all-ones and all-zeros addresses.
func broadcastAddrs(a netlink.Addr) []netip.Addr {
	var out []netip.Addr
	if b, ok := netip.AddrFromSlice(a.Broadcast); ok && b.Unmap().Is4() && !b.IsUnspecified() {
		out = append(out, b.Unmap())
	}
	ip, ok := netip.AddrFromSlice(a.IP)
	if !ok || !ip.Unmap().Is4() || a.IPNet == nil {
		return out
	}
	bits, _ := a.Mask.Size()
	if bits >= 31 {
		return out
	}
	p := netip.PrefixFrom(ip.Unmap(), bits).Masked()
	v := p.Addr().As4()
	host := ^uint32(0) >> bits
	n := uint32(v[0])<<24 | uint32(v[1])<<16 | uint32(v[2])<<8 | uint32(v[3])
	n |= host
	return append(out, p.Addr(), netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)}))
}
