package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"reflect"
	"regexp"
	"strings"
	"time"
	"unsafe"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/ringbuf"
	"golang.org/x/sys/unix"
)

// RuleStats counts what one rule answered.
type RuleStats struct {
	Hits  uint64 `json:"hits"`
	Bytes uint64 `json:"bytes"` // reply frame bytes sent
}

func (s RuleStats) add(o RuleStats) RuleStats { return RuleStats{s.Hits + o.Hits, s.Bytes + o.Bytes} }

// slotCounters is the sum of slot's per-CPU counters (zero if unreadable).
func (d *Dataplane) slotCounters(slot uint32) RuleStats {
	var per []santaSantaRuleCounters
	if err := d.objs.SantaRuleStats.Lookup(slot, &per); err != nil {
		return RuleStats{}
	}
	return sumCPUs(per)
}

// sumCPUs adds up one slot's per-CPU counters.
func sumCPUs(per []santaSantaRuleCounters) RuleStats {
	var s RuleStats
	for _, c := range per {
		s.Hits += c.Hits
		s.Bytes += c.Bytes
	}
	return s
}

// baseOf reads slot's entry of a mapped santa_rule_base.
func baseOf(bases *mmapArray, slot uint32) RuleStats {
	v := bases.value(slot)
	return RuleStats{binary.LittleEndian.Uint64(v), binary.LittleEndian.Uint64(v[8:])}
}

// setBase sets what the rule in slot counted before it got the slot. Only
// user space reads it: plain stores do.
func (d *Dataplane) setBase(slot uint32, s RuleStats) {
	v := d.bases.value(slot)
	binary.LittleEndian.PutUint64(v, s.Hits)
	binary.LittleEndian.PutUint64(v[8:], s.Bytes)
}

// resetSlotStats zeroes the per-CPU counters of rule slots whose
// quarantine is over (slotAllocator.reset), in batched updates.
func (d *Dataplane) resetSlotStats(slots []uint32) error {
	const batch = 4096
	cpus := ebpf.MustPossibleCPU()
	zeros := make([]santaSantaRuleCounters, min(len(slots), batch)*cpus)
	for i := 0; i < len(slots); i += batch {
		keys := slots[i:min(len(slots), i+batch)]
		if _, err := d.objs.SantaRuleStats.BatchUpdate(keys, zeros[:len(keys)*cpus], nil); err != nil {
			return fmt.Errorf("reset counters of %d freed rule slots: %w", len(slots), err)
		}
	}
	return nil
}

// RuleStats returns the statistics of the socket's rules (see SocketStats).
func (d *Dataplane) RuleStats(cookie uint64) (map[RuleID]RuleStats, error) {
	rules, _, err := d.SocketStats(cookie)
	return rules, err
}

// SocketStats returns the statistics of the socket's rules, and what its
// rules since gone counted (deleted, replaced, old versions): with these
// the socket's totals only grow while it stays bound. Both are noted
// together, so a rule going meanwhile counts once. It holds the data
// plane's lock only to note the rules' slots: reading the counters of a
// million rules takes about 0.4 s, which would hold up every change (and
// santad's Prometheus scrapes read them all). A rule deleted meanwhile is
// still reported: its slot is not reused, nor its counters reset, within
// the quarantine.
func (d *Dataplane) SocketStats(cookie uint64) (rules map[RuleID]RuleStats, gone RuleStats, err error) {
	type counted struct {
		id   RuleID
		slot uint32
		base RuleStats
	}
	d.mu.Lock()
	rs, ok := d.bySocket[cookie]
	if !ok {
		d.mu.Unlock()
		return nil, RuleStats{}, fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	noted := make([]counted, len(rs.rules))
	var highest uint32
	for i, r := range rs.rules {
		noted[i] = counted{r.id, r.slot, baseOf(d.bases, r.slot)}
		highest = max(highest, r.slot)
	}
	gone = rs.gone
	d.mu.Unlock()

	slots := make([]uint32, len(noted))
	for i, r := range noted {
		slots[i] = r.slot
	}
	counts, err := d.countersOf(slots, highest)
	if err != nil {
		return nil, RuleStats{}, err
	}
	rules = make(map[RuleID]RuleStats, len(noted))
	for i, r := range noted {
		rules[r.id] = r.base.add(counts[i])
	}
	return rules, gone, nil
}

// Total adds up a socket's statistics as SocketStats gives them: what its
// rules and its rules since gone counted.
func Total(rules map[RuleID]RuleStats, gone RuleStats) RuleStats {
	for _, s := range rules {
		gone = gone.add(s)
	}
	return gone
}

// GoneStats is what the socket's rules since gone counted (SocketStats).
func (d *Dataplane) GoneStats(cookie uint64) (RuleStats, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	rs, ok := d.bySocket[cookie]
	if !ok {
		return RuleStats{}, fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	return rs.gone, nil
}

// CarryGoneStats adds to the socket's total of rules gone what a previous
// instance's rules gone counted (see CarryStats).
func (d *Dataplane) CarryGoneStats(cookie uint64, s RuleStats) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	rs, ok := d.bySocket[cookie]
	if !ok {
		return fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	rs.gone = rs.gone.add(s)
	return nil
}

// countsOf reads the per-CPU counters of rules (zero if unreadable, as
// slotCounters), batched when there are many: a rebuild retires every rule
// of its set. Callers hold d.mu.
func (d *Dataplane) countsOf(rules []*installed) []RuleStats {
	slots := make([]uint32, len(rules))
	var highest uint32
	for i, r := range rules {
		slots[i] = r.slot
		highest = max(highest, r.slot)
	}
	counts, err := d.countersOf(slots, highest)
	if err != nil {
		return make([]RuleStats, len(rules))
	}
	return counts
}

// countersOf reads the per-CPU counters of slots (none above highest),
// each summed over CPUs. One lookup per slot made a million system calls
// for a million rules (about a second); for slots dense enough in the
// table, batched reads of it up to highest copy a few kB per call instead.
func (d *Dataplane) countersOf(slots []uint32, highest uint32) ([]RuleStats, error) {
	out := make([]RuleStats, len(slots))
	if uint64(len(slots))*statsBatchSpread <= uint64(highest) {
		for i, slot := range slots {
			out[i] = d.slotCounters(slot)
		}
		return out, nil
	}
	table, err := d.countersUpTo(highest)
	if err != nil {
		return nil, err
	}
	for i, slot := range slots {
		out[i] = table[slot]
	}
	return out, nil
}

// statsBatchSpread: a rule set whose rules are this sparse or sparser in
// the table (highest slot / rules) reads its counters one by one; denser
// ones batch-read the table, where a lookup costs about as much as
// copying this many slots.
const statsBatchSpread = 64

// statsBatchSlots are the slots one batched read copies.
const statsBatchSlots = 4096

// countersUpTo reads the per-CPU counters of slots 0 to highest with
// batched lookups and sums each slot's CPUs.
func (d *Dataplane) countersUpTo(highest uint32) ([]RuleStats, error) {
	cpus := ebpf.MustPossibleCPU()
	// a batch copies as many slots as it has room for: no more than asked
	size := min(statsBatchSlots, int(highest)+1)
	keys := make([]uint32, size)
	values := make([]santaSantaRuleCounters, size*cpus)
	out := make([]RuleStats, highest+1)
	var cursor ebpf.MapBatchCursor
	for next := uint32(0); next <= highest; {
		batch := min(size, int(highest-next)+1)
		n, err := d.objs.SantaRuleStats.BatchLookup(&cursor, keys[:batch], values[:batch*cpus], nil)
		if err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
			return nil, fmt.Errorf("read rule counters: %w", err)
		}
		for i, slot := range keys[:n] {
			if slot <= highest {
				out[slot] = sumCPUs(values[i*cpus : (i+1)*cpus])
			}
		}
		if err != nil || n == 0 {
			break
		}
		next = keys[n-1] + 1
	}
	return out, nil
}

// Counters are the rule processor's answer and pass reasons, summed over CPUs.
type Counters = santaSantaReasons

// Counters reads the answer and pass reasons.
func (d *Dataplane) Counters() (Counters, error) {
	var per []santaSantaReasons
	if err := d.objs.SantaCounters.Lookup(uint32(0), &per); err != nil {
		return Counters{}, fmt.Errorf("read counters: %w", err)
	}
	var sum Counters
	sv := reflect.ValueOf(&sum).Elem()
	for _, c := range per {
		cv := reflect.ValueOf(c)
		for i := 0; i < cv.NumField(); i++ {
			if f := sv.Field(i); f.Kind() == reflect.Uint64 {
				f.SetUint(f.Uint() + cv.Field(i).Uint())
			}
		}
	}
	return sum, nil
}

var camel = regexp.MustCompile(`([a-z0-9])([A-Z])`)

// CounterNames lists the counters as name -> value, names in snake case as in bpf/santa.h.
func CounterNames(c Counters) map[string]uint64 {
	out := map[string]uint64{}
	v := reflect.ValueOf(c)
	for i := 0; i < v.NumField(); i++ {
		if v.Field(i).Kind() != reflect.Uint64 {
			continue
		}
		name := strings.ToLower(camel.ReplaceAllString(v.Type().Field(i).Name, "${1}_${2}"))
		out[name] = v.Field(i).Uint()
	}
	return out
}

// SetSampling changes the miss samples of the socket's rule set.
func (d *Dataplane) SetSampling(cookie uint64, s SampleOptions) error {
	if err := checkSample(s); err != nil {
		return err
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	rs, ok := d.bySocket[cookie]
	if !ok {
		return fmt.Errorf("%w: %#x", ErrNotBound, cookie)
	}
	if rs.protocol == unix.IPPROTO_TCP && (s.Bytes > 0) != (rs.sample.Bytes > 0) {
		delta := 1
		if s.Bytes == 0 {
			delta = -1
		}
		if err := d.countPort(portsTCPSampled, rs.port, delta); err != nil {
			return err
		}
	}
	rs.sample = s
	// the two fields share one aligned word: publish them together
	d.rulesets.store32(rs.id, offRulesetSampleLen, uint32(s.Bytes))
	d.rulesets.store32(rs.id, offRulesetSampleLen+4, uint32(s.PerSecond))
	return nil
}

// MissSample is the start of a request that matched no rule.
type MissSample struct {
	Cookie  uint64 // the receiving socket
	Len     int    // the request's UDP payload length
	Family  int    // 4 or 6
	Payload []byte // its first bytes
}

// ring reads one of the rule processor's ring buffers.
type ring struct{ r *ringbuf.Reader }

func openRing(m *ebpf.Map, what string) (ring, error) {
	r, err := ringbuf.NewReader(m)
	if err != nil {
		return ring{}, fmt.Errorf("open %s: %w", what, err)
	}
	return ring{r}, nil
}

// ErrClosed is returned by Read after Close.
var ErrClosed = ringbuf.ErrClosed

// Close stops reading; a blocked Read returns ErrClosed.
func (r ring) Close() error { return r.r.Close() }

// MissSamples reads miss samples as the rule processor writes them.
type MissSamples struct{ ring }

// OpenMissSamples starts reading miss samples. Only one reader should be open.
func (d *Dataplane) OpenMissSamples() (*MissSamples, error) {
	r, err := openRing(d.objs.SantaMissSamples, "miss samples")
	if err != nil {
		return nil, err
	}
	return &MissSamples{r}, nil
}

// sampleDrainInterval is how often MissSamples.Read looks at the ring: the
// program wakes a waiting reader only once the ring is a quarter full.
const sampleDrainInterval = 100 * time.Millisecond

// Read blocks until a sample arrives or the reader is closed. A sample waits
// in the ring for at most sampleDrainInterval, so samples come in bursts.
func (m *MissSamples) Read() (MissSample, error) {
	var rec ringbuf.Record
	for {
		m.r.SetDeadline(time.Now().Add(sampleDrainInterval))
		err := m.r.ReadInto(&rec)
		if errors.Is(err, os.ErrDeadlineExceeded) {
			continue
		}
		if err != nil {
			return MissSample{}, err
		}
		break
	}
	// The program writes the record in host order, laid out as the
	// generated struct: read it in place (binary.Read reflects over every
	// payload byte, tens of µs per sample).
	if len(rec.RawSample) < int(unsafe.Sizeof(santaSantaMissSample{})) {
		return MissSample{}, fmt.Errorf("decode miss sample: %d bytes, want %d", len(rec.RawSample), unsafe.Sizeof(santaSantaMissSample{}))
	}
	raw := (*santaSantaMissSample)(unsafe.Pointer(&rec.RawSample[0]))
	n := min(int(raw.Caplen), len(raw.Data))
	return MissSample{
		Cookie:  raw.Cookie,
		Len:     int(raw.Len),
		Family:  int(raw.Family),
		Payload: append([]byte(nil), raw.Data[:n]...),
	}, nil
}
