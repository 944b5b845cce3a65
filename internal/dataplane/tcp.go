package dataplane

import (
	"crypto/rand"
	"encoding/binary"
	"fmt"
	"log/slog"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
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

// stampUnit is the current stamp time unit (bpf_ktime_get_coarse_ns is
// CLOCK_MONOTONIC, a jiffy behind at most).
func stampUnit() (uint64, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return 0, err
	}
	return uint64(ts.Nano()) >> stampUnitShift, nil
}

// stampEpoch is the current stamp epoch.
func stampEpoch() (uint64, error) {
	u, err := stampUnit()
	return u >> stampEpochShift, err
}

// startStampKeys makes sure the previous, current and next epochs have keys
// (new random ones where a slot holds none, or another epoch's) and keeps
// it so: each epoch's key is written an epoch ahead, so a stamp stays
// checkable for its whole validity, and a key lives three epochs.
func (d *Dataplane) startStampKeys() error {
	if err := d.fillStampKeys(); err != nil {
		return err
	}
	d.stopKeys = make(chan struct{})
	epochLen := time.Duration(1) << (stampUnitShift + stampEpochShift)
	go func() {
		t := time.NewTicker(epochLen / 16)
		defer t.Stop()
		for {
			select {
			case <-d.stopKeys:
				return
			case <-t.C:
				if err := d.fillStampKeys(); err != nil {
					slog.Error("TCP stamp keys not rotated: socket-less connections end when the current key expires", "error", err)
				}
			}
		}
	}()
	return nil
}

// fillStampKeys writes a new key into each of the slots of epochs e-1, e and
// e+1 that does not hold that epoch's key.
func (d *Dataplane) fillStampKeys() error {
	e, err := stampEpoch()
	if err != nil {
		return err
	}
	for epoch := e - 1; epoch <= e+1; epoch++ {
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

// AdoptStampKeys takes a predecessor's stamp keys (Previous.StampKeys), so
// that the socket-less connections it answered stay valid.
func (d *Dataplane) AdoptStampKeys(keys []StampKey) error {
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

// StampKeys reads the predecessor's stamp keys.
func (p *Previous) StampKeys() ([]StampKey, error) {
	m, err := p.open("santa_tcp_keys", true)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	keys := make([]StampKey, stampKeySlots)
	for i := range keys {
		if err := m.Lookup(uint32(i), &keys[i]); err != nil {
			return nil, fmt.Errorf("previous stamp key %d: %w", i, err)
		}
	}
	return keys, nil
}

// stopStampKeys ends the key rotation.
func (d *Dataplane) stopStampKeys() {
	if d.stopKeys != nil {
		close(d.stopKeys)
		d.stopKeys = nil
	}
}
