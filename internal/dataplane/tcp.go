package dataplane

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/ebpf"
)

// Stamp time, as the TCP path measures it (bpf/tcp.h): units of
// CLOCK_MONOTONIC, epochs of units; a key serves one epoch.
const (
	stampUnitShift  = uint(santaSantaLimitSANTA_TCP_UNIT_SHIFT)
	stampEpochShift = uint(santaSantaLimitSANTA_TCP_EPOCH_SHIFT)
	stampKeySlots   = uint64(santaSantaLimitSANTA_TCP_KEYS)
)

// StampKey is the SipHash key of one stamp epoch.
type StampKey = santaSantaTcpKey

// stampUnit is the current stamp time unit.
func stampUnit() (uint64, error) {
	now, err := monotonicNow()
	return now >> stampUnitShift, err
}

// stampEpoch is the current stamp epoch.
func stampEpoch() (uint64, error) {
	u, err := stampUnit()
	return u >> stampEpochShift, err
}

// startTCPUpkeep makes sure the previous, current and next epochs have stamp
// keys (new random ones where a slot holds none, or another epoch's) and
// keeps it so: each epoch's key is written an epoch ahead, so a stamp stays
// checkable for its whole validity, and a key lives three epochs. Every
// stamp unit it also sweeps idle flows (sweepFlows).
func (d *Dataplane) startTCPUpkeep() error {
	if err := d.fillStampKeys(); err != nil {
		return err
	}
	// the goroutine keeps its own copies: stopTCPUpkeep clears the fields
	stop, done := make(chan struct{}), make(chan struct{})
	d.stopUpkeep, d.upkeepDone = stop, done
	go func() {
		defer close(done)
		t := time.NewTicker(time.Duration(1) << stampUnitShift)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				if err := d.fillStampKeys(); err != nil {
					slog.Error("TCP stamp keys not rotated: socket-less connections end when the current key expires", "error", err)
				}
				unit, err := stampUnit()
				if err == nil {
					err = d.sweepFlows(unit)
				}
				if err != nil {
					slog.Error("TCP flow table not swept", "error", err)
				}
			}
		}
	}()
	return nil
}

// flowIdleUnits is how long a flow may be idle before sweepFlows deletes
// it: longer than the two minutes (TCP_RTO_MAX) within which a client
// retransmits its request while it misses any of eBPF's reply, and each
// such retransmission refreshes the flow. So nothing of eBPF's is in flight
// on a flow swept; the connection's next request starts a new one.
const flowIdleUnits = uint32(santaSantaLimitSANTA_TCP_VALID_UNITS) + 1

// sweepFlows deletes the flows idle for more than flowIdleUnits at stamp
// unit now, and warns when the table is nearly full.
func (d *Dataplane) sweepFlows(now uint64) error {
	m := d.objs.SantaTcpFlows
	const batch = 4096
	keys := make([]santaBpfSockTuple, batch)
	vals := make([]santaSantaTcpFlow, batch)
	var idle, closing []santaBpfSockTuple
	closeUnits := d.idleCloseUnits()
	live := 0
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n; i++ {
			switch f := &vals[i]; {
			case uint32(now)-f.Seen > flowIdleUnits:
				idle = append(idle, keys[i])
			case closeUnits > 0 && uint32(now)-f.Seen > closeUnits && closable(f):
				closing = append(closing, keys[i])
			default:
				live++
			}
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return fmt.Errorf("read flows: %w", err)
		}
	}
	for _, k := range idle {
		// look again right before: a new request may have come since
		var v santaSantaTcpFlow
		if err := m.Lookup(&k, &v); err != nil || uint32(now)-v.Seen <= flowIdleUnits {
			continue
		}
		if err := m.Delete(&k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete idle flow: %w", err)
		}
	}
	if err := d.closeIdle(closing, now, closeUnits); err != nil {
		return err
	}
	if size := int(m.MaxEntries()); live > size*9/10 {
		slog.Warn("the TCP flow table is nearly full: new socket-less connections go to the kernel when it is (raise dataplane.tcp_flows)",
			"flows", live, "size", size)
	}
	return nil
}

// fillStampKeys fills the key slots around the current epoch (fillStampKeysAt).
func (d *Dataplane) fillStampKeys() error {
	e, err := stampEpoch()
	if err != nil {
		return err
	}
	return d.fillStampKeysAt(e)
}

// fillStampKeysAt writes a new key into each of the slots of epochs e-1 (if
// any), e and e+1 that does not hold that epoch's key; tests give it any epoch.
func (d *Dataplane) fillStampKeysAt(e uint64) error {
	// from e-1, except in epoch 0 (the first 37 minutes after boot), where
	// e-1 would wrap around and end the loop before it began
	for epoch := max(e, 1) - 1; epoch <= e+1; epoch++ {
		slot := uint32(epoch % stampKeySlots)
		var k StampKey
		if err := d.objs.SantaTcpKeys.Lookup(slot, &k); err != nil {
			return fmt.Errorf("read stamp key %d: %w", slot, err)
		}
		if k.EpochPlus1 == epoch+1 {
			continue
		}
		var b [16]byte
		if _, err := rand.Read(b[:]); err != nil {
			return err
		}
		k = StampKey{K0: binary.LittleEndian.Uint64(b[:8]), K1: binary.LittleEndian.Uint64(b[8:]), EpochPlus1: epoch + 1}
		if err := d.objs.SantaTcpKeys.Update(slot, &k, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("write stamp key %d: %w", slot, err)
		}
	}
	return nil
}

// AdoptSocketless takes from the predecessor what the socket-less TCP
// connections it answered need: its stamp keys, so that their stamps stay
// valid, and its ports that had a rule set, so that TC still hands them to
// their listeners where the rule set went while no santad ran.
func (d *Dataplane) AdoptSocketless(p *Previous) error {
	keys, err := readPrevious[StampKey](p, "santa_tcp_keys", 0, int(stampKeySlots))
	if err != nil {
		return err
	}
	if err := d.adoptStampKeys(keys); err != nil {
		return err
	}
	ports, err := readPrevious[uint64](p, "santa_ports", portsTCPSeen*portWords, portWords)
	if err != nil {
		return err
	}
	return d.adoptSeenPorts(ports)
}

// adoptStampKeys writes the keys of the current epoch and its neighbours.
func (d *Dataplane) adoptStampKeys(keys []StampKey) error {
	e, err := stampEpoch()
	if err != nil {
		return err
	}
	for _, k := range keys {
		epoch := k.EpochPlus1 - 1
		if k.EpochPlus1 == 0 || epoch+1 < e || epoch > e+1 {
			continue
		}
		if err := d.objs.SantaTcpKeys.Update(uint32(epoch%stampKeySlots), &k, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("adopt stamp key: %w", err)
		}
	}
	return nil
}

// stopTCPUpkeep ends the key rotation and the flow sweep, and waits until
// they no longer use the maps.
func (d *Dataplane) stopTCPUpkeep() {
	if d.stopUpkeep != nil {
		close(d.stopUpkeep)
		<-d.upkeepDone
		d.stopUpkeep, d.upkeepDone = nil, nil
	}
}

// idleCloseUnits is Config.TCPIdleClose in stamp units (0: never).
func (d *Dataplane) idleCloseUnits() uint32 {
	unit := time.Duration(1) << stampUnitShift
	if d.cfg.TCPIdleClose <= 0 || d.fins.Load() == nil {
		return 0
	}
	return uint32((d.cfg.TCPIdleClose + unit - 1) / unit)
}

// closable says whether eBPF may close flow f's connection with a FIN: it
// knows the connection's options, and the client has all of eBPF's bytes
// (a reply of several segments all acked; a one-segment reply acks the
// request, so a client missing it sends the request again, which
// refreshes the flow).
func closable(f *santaSantaTcpFlow) bool {
	return f.Opts&flowOptsKnown != 0 && (f.Multi == 0 || f.LastAck == f.ReplyEnd)
}

// closeIdle ends the connections of flows idle for more than closeUnits
// with a FIN carrying a fresh stamp with the FIN bit, as a server's
// keep-alive timeout would: the client sees the connection close before
// its stamps expire, instead of a reset when it comes back. The flow goes
// first (as a swept one): the client's ACK and FIN that follow are
// answered without it, from the stamp's FIN bit (docs/tcp.md).
func (d *Dataplane) closeIdle(keys []santaBpfSockTuple, now uint64, closeUnits uint32) error {
	fins := d.fins.Load()
	if len(keys) == 0 || fins == nil {
		return nil
	}
	m := d.objs.SantaTcpFlows
	closed := 0
	for i := range keys {
		k := &keys[i]
		// look again right before: a new request may have come since
		var f santaSantaTcpFlow
		if err := m.Lookup(k, &f); err != nil || uint32(now)-f.Seen <= closeUnits || !closable(&f) {
			continue
		}
		t := tupleBytes(k)
		stamp, ok, err := d.flowStamp(t, now, true, uint32(f.Opts&^flowOptsKnown), f.Uid)
		if err != nil || !ok {
			return fmt.Errorf("stamp for the FIN of an idle connection: no key for this unit (%v)", err)
		}
		if err := m.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return fmt.Errorf("delete idle flow: %w", err)
		}
		if err := fins.sendFIN(t, f.ReplyEnd, f.ReqEnd, stamp, f.Opts); err != nil {
			slog.Warn("FIN of an idle TCP connection not sent: the client is reset when it comes back after its stamps expired", "error", err)
			continue
		}
		closed++
	}
	if closed > 0 {
		d.idleClosed.Add(uint64(closed))
		slog.Debug("idle TCP connections closed", "connections", closed)
	}
	return nil
}

// IdleClosed is how many idle socket-less TCP connections this data plane
// closed with eBPF's FIN (Config.TCPIdleClose).
func (d *Dataplane) IdleClosed() uint64 { return d.idleClosed.Load() }
