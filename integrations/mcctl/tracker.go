package mcctl

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// Guard slots the tracker and the controller agree on (bpf/tracker.h).
const (
	guardSlots    = uint32(trackerMcLimitMC_GUARD_SLOTS)
	epochSlot     = uint32(trackerMcLimitMC_EPOCH_SLOT)
	firstKeySlot  = uint32(trackerMcLimitMC_FIRST_KEY_SLOT)
	fnvBasis      = uint32(trackerMcLimitMC_FNV_BASIS)
	fnvPrime      = uint32(trackerMcLimitMC_FNV_PRIME)
	maxKeyLen     = int(trackerMcLimitMC_MAX_KEY)
	reportUnacked = uint32(trackerMcLimitMC_REPORT_UNACKED)
	trackedFlows  = 16384
	flowsMaxLimit = 1 << 20
)

// KeySlot is the guard slot of a memcached key: the tracker bumps it when
// the key is written (bpf/tracker.c key_slot is the twin).
func KeySlot(key string) uint32 {
	h := fnvBasis
	for i := 0; i < len(key); i++ {
		h = (h ^ uint32(key[i])) * fnvPrime
	}
	slot := h & (guardSlots - 1)
	if slot < firstKeySlot {
		slot += firstKeySlot
	}
	return slot
}

// Tracker is the memcached write tracker (bpf/tracker.c) loaded and
// attached at TC ingress and egress of interfaces of one network namespace.
type Tracker struct {
	objs       trackerObjects
	bumps      *ringbuf.Reader // mc_bumped
	unreported uint64          // bumps_unreported at the last DrainBumps

	mu     sync.Mutex // links may be added while the controller runs
	links  []link.Link
	pinned int // links[:pinned] are pinned
}

// TrackerConfig says what to track.
type TrackerConfig struct {
	// TCPPorts and UDPPorts are every port memcached serves on: a write
	// through a port not listed goes unseen.
	TCPPorts, UDPPorts []uint16
	// Guards is santad's guard map (its pin: daemon.Config.GuardsPin).
	Guards *ebpf.Map
	// Flows is how many TCP connections are tracked at once (0: 16384);
	// a connection pushed out is treated as untracked (every segment
	// retires every rule).
	Flows int
	// UDPWrites is how many UDP request ids with recent writes are kept
	// (0: 65536); a write that finds no room is bumped as one without a
	// reply (settled by the controller).
	UDPWrites int
	// FlushHold, if set, is a predecessor's mc_flush_hold (pinned by Pin):
	// a delayed flush it saw may still be pending.
	FlushHold *ebpf.Map
	// TextOnly says that memcached reads every TCP connection as text
	// (-B ascii), even one whose first byte starts a binary request.
	TextOnly bool
}

// flushHoldPin is mc_flush_hold's pin in Pin's directory.
const flushHoldPin = "flush-hold"

// LoadFlushHold opens the mc_flush_hold a predecessor pinned in dir (for
// TrackerConfig.FlushHold); nil if there is none.
func LoadFlushHold(dir string) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(dir, flushHoldPin), nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open the write tracker's flush hold: %w", err)
	}
	return m, nil
}

// LoadTracker loads the tracker; Attach puts it on interfaces.
func LoadTracker(cfg TrackerConfig) (*Tracker, error) {
	if cfg.Guards == nil {
		return nil, errors.New("tracker: no guard map")
	}
	if cfg.Flows == 0 {
		cfg.Flows = trackedFlows
	}
	if cfg.Flows < 1 || cfg.Flows > flowsMaxLimit {
		return nil, fmt.Errorf("tracker: %d flows: must be between 1 and %d", cfg.Flows, flowsMaxLimit)
	}
	spec, err := loadTracker()
	if err != nil {
		return nil, err
	}
	spec.Maps["mc_flows"].MaxEntries = uint32(cfg.Flows)
	if cfg.UDPWrites < 0 || cfg.UDPWrites > flowsMaxLimit {
		return nil, fmt.Errorf("tracker: %d UDP writes: must be between 1 and %d", cfg.UDPWrites, flowsMaxLimit)
	}
	if cfg.UDPWrites > 0 {
		spec.Maps["mc_udp_writes"].MaxEntries = uint32(cfg.UDPWrites)
	}
	for name, ports := range map[string][]uint16{"tcp_ports": cfg.TCPPorts, "udp_ports": cfg.UDPPorts} {
		var bits [65536 / 64]uint64
		for _, p := range ports {
			bits[p/64] |= 1 << (p % 64)
		}
		if err := spec.Variables[name].Set(bits); err != nil {
			return nil, err
		}
	}
	if cfg.TextOnly {
		if err := spec.Variables["text_only"].Set(uint8(1)); err != nil {
			return nil, err
		}
	}
	// a forged segment whose bytes match a digest of parsed ones would
	// pass for a retransmission of them: its key is secret
	var digestKey [2]uint64
	if err := binary.Read(rand.Reader, binary.NativeEndian, &digestKey); err != nil {
		return nil, fmt.Errorf("tracker: digest key: %w", err)
	}
	if err := spec.Variables["digest_key"].Set(digestKey); err != nil {
		return nil, err
	}
	realtimeMinusMonotonic := time.Now().Unix() - int64(monotonicNow()/time.Second)
	if err := spec.Variables["realtime_minus_monotonic"].Set(realtimeMinusMonotonic); err != nil {
		return nil, err
	}
	t := &Tracker{}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{"santa_guards": cfg.Guards}}
	if cfg.FlushHold != nil {
		opts.MapReplacements["mc_flush_hold"] = cfg.FlushHold
	}
	if err := spec.LoadAndAssign(&t.objs, opts); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load memcached tracker: %+v", ve)
		}
		return nil, fmt.Errorf("load memcached tracker: %w", err)
	}
	if t.bumps, err = ringbuf.NewReader(t.objs.McBumped); err != nil {
		t.objs.Close()
		return nil, fmt.Errorf("memcached tracker: read bumped slots: %w", err)
	}
	return t, nil
}

// Attach puts the tracker at TC ingress and egress of the interface (in
// the caller's network namespace), ahead of other TCX programs.
func (t *Tracker) Attach(ifname string) error {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("interface %s: %w", ifname, err)
	}
	return t.AttachIndex(ifc.Index, ifname)
}

// AttachIndex is Attach by interface index (name is for messages).
func (t *Tracker) AttachIndex(index int, ifname string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	for _, a := range []struct {
		prog   *ebpf.Program
		attach ebpf.AttachType
	}{{t.objs.McIngress, ebpf.AttachTCXIngress}, {t.objs.McEgress, ebpf.AttachTCXEgress}} {
		l, err := link.AttachTCX(link.TCXOptions{Interface: index, Program: a.prog, Attach: a.attach, Anchor: link.Head()})
		if err != nil {
			return fmt.Errorf("attach memcached tracker to %s (TCX): %w", ifname, err)
		}
		t.links = append(t.links, l)
	}
	return nil
}

// Counters sums the tracker's per-CPU event counters by name.
func (t *Tracker) Counters() (map[string]uint64, error) {
	var per []trackerMcCounters
	if err := t.objs.McEvents.Lookup(uint32(0), &per); err != nil {
		return nil, err
	}
	out := map[string]uint64{}
	typ := reflect.TypeOf(trackerMcCounters{})
	for _, c := range per {
		v := reflect.ValueOf(c)
		for i := range typ.NumField() {
			if f := typ.Field(i); f.Type.Kind() == reflect.Uint64 {
				out[snake(f.Name)] += v.Field(i).Uint()
			}
		}
	}
	return out, nil
}

// DrainBumps calls each with the slot of every bump since the last call,
// without waiting for more. unacked says that memcached may apply the write
// with no reply after it, so that no later bump comes when it has (a
// noreply or quiet write, a reset connection, a request the tracker could
// not follow). lost says that some of those bumps were not reported (the
// ring was full): their slots are unknown.
func (t *Tracker) DrainBumps(each func(slot uint32, unacked bool)) (lost bool, err error) {
	t.bumps.SetDeadline(time.Now())
	var rec ringbuf.Record
	for {
		err := t.bumps.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			break
		}
		if err != nil {
			return false, err
		}
		report := binary.NativeEndian.Uint32(rec.RawSample)
		each(report&^reportUnacked, report&reportUnacked != 0)
	}
	var per []trackerMcCounters
	if err := t.objs.McEvents.Lookup(uint32(0), &per); err != nil {
		return false, err
	}
	var n uint64
	for _, c := range per {
		n += c.BumpsUnreported
	}
	lost, t.unreported = n != t.unreported, n
	return lost, nil
}

// FlushHold is the CLOCK_MONOTONIC time (monotonicNow) until which a
// delayed flush the tracker saw may not have been applied by memcached yet;
// 0 if it saw none.
func (t *Tracker) FlushHold() (time.Duration, error) {
	var per []uint64
	if err := t.objs.McFlushHold.Lookup(uint32(0), &per); err != nil {
		return 0, err
	}
	var hold uint64
	for _, h := range per {
		hold = max(hold, h)
	}
	return time.Duration(min(hold, math.MaxInt64)), nil
}

// monotonicNow is CLOCK_MONOTONIC, bpf_ktime_get_ns's clock.
func monotonicNow() time.Duration {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) // cannot fail for this clock
	return time.Duration(ts.Nano())
}

// snake turns bpf2go's field names back into the C names (EpochWrites -> epoch_writes).
func snake(s string) string {
	var b strings.Builder
	for i, r := range s {
		if r >= 'A' && r <= 'Z' {
			if i > 0 {
				b.WriteByte('_')
			}
			r += 'a' - 'A'
		}
		b.WriteRune(r)
	}
	return b.String()
}

// Close detaches and unloads the tracker.
func (t *Tracker) Close() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for _, l := range t.links {
		errs = append(errs, l.Close())
	}
	errs = append(errs, t.bumps.Close(), t.objs.Close())
	return errors.Join(errs...)
}

// Pin pins the tracker's links not pinned yet under dir (made if missing),
// so that they outlive the process. The links a predecessor pinned there
// are replaced: the first call removes those beyond this tracker's.
func (t *Tracker) Pin(dir string) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	pinPath := func(i int) string { return filepath.Join(dir, fmt.Sprintf("link-%d", i)) }
	first := t.pinned == 0
	if first {
		// a controller started after this one exits must see a delayed
		// flush still pending: the predecessor's pin is this map or older
		holdPath := filepath.Join(dir, flushHoldPin)
		os.Remove(holdPath)
		if err := t.objs.McFlushHold.Pin(holdPath); err != nil {
			return fmt.Errorf("pin memcached tracker's flush hold: %w", err)
		}
	}
	for ; t.pinned < len(t.links); t.pinned++ {
		path := pinPath(t.pinned)
		if old, err := link.LoadPinnedLink(path, nil); err == nil {
			old.Unpin() // the new tracker runs already: no write goes unseen
			old.Close()
		}
		if err := t.links[t.pinned].Pin(path); err != nil {
			return fmt.Errorf("pin memcached tracker: %w", err)
		}
	}
	for i := len(t.links); first; i++ {
		if err := os.Remove(pinPath(i)); err != nil {
			break // the predecessor pinned no more
		}
	}
	return nil
}

// Unpin removes the pins of Pin: the links go with Close. The flush hold
// stays pinned while a delayed flush is pending.
func (t *Tracker) Unpin() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	var errs []error
	for _, l := range t.links[:t.pinned] {
		errs = append(errs, l.Unpin())
	}
	t.pinned = 0
	// a delayed flush still pending stays for the next controller
	if hold, err := t.FlushHold(); err != nil || hold <= monotonicNow() {
		errs = append(errs, t.objs.McFlushHold.Unpin())
	}
	return errors.Join(errs...)
}
