package dataplane

import (
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/cilium/ebpf"
)

// Dataplane is the loaded rule processor and the user-space view of its maps.
// It is safe for concurrent use.
type Dataplane struct {
	cfg  Config
	objs objects
	seed uint32
	mask uint32
	// the shared maps Load pinned because none were pinned there
	freshPins []string
	// prevFlows is the predecessor's TCP flow table (pinned at
	// Config.FlowsPin when Load ran) until PublishFlows, and carried what
	// CarryFlows copied of it.
	prevFlows *ebpf.Map
	carried   map[string]carriedFlow

	mu         sync.Mutex
	rules      *mmapArray // santa_rules
	buckets    *mmapArray // santa_buckets
	pages      *mmapArray // santa_pages
	rulesets   *mmapArray // santa_rulesets
	bases      *mmapArray // santa_rule_base
	gens       *mmapArray // santa_gens
	slots      *slotAllocator
	rsIDs      *slotAllocator
	data       *dataAllocator
	chainLen   []uint8 // rules per bucket, to keep every chain within MaxChain
	bySocket   map[uint64]*ruleset
	portUsers  map[portKey]int // rule sets that hold a port in a set of santa_ports
	localMu    sync.Mutex      // the address watchers share santa_local_filter
	byID       map[RuleID]*installed
	retiring   []retiring // replaced rules still linked for packets in flight
	closed     bool
	lastID     RuleID
	order      uint32
	stopUpkeep chan struct{} // ends the stamp key rotation and the flow sweep
	upkeepDone chan struct{} // closed once they have ended
	// fins sends the FINs of idle connections (Config.TCPIdleClose), from
	// the network namespace of the first Attach; nil before it
	fins       atomic.Pointer[finSender]
	idleClosed atomic.Uint64 // connections closeIdle closed
}

// RuleID names an installed rule for as long as it exists.
type RuleID uint64

// objects is the rule processor's one collection: the XDP program, the
// socket release hook and the TCP handover (separate entry files, so more
// bpf2go objects) share every map.
type objects struct {
	santaObjects
	releasePrograms
	handoverPrograms
}

func (o *objects) Close() error {
	return errors.Join(o.santaObjects.Close(), o.releasePrograms.Close(), o.handoverPrograms.Close())
}

// Field offsets the data plane publishes with atomic stores, or reads from a
// predecessor's maps.
var (
	offRuleNext         = int(unsafe.Offsetof(santaSantaRule{}.Next))
	offRuleRuleset      = int(unsafe.Offsetof(santaSantaRule{}.Ruleset))
	offRuleID           = int(unsafe.Offsetof(santaSantaRule{}.Id))
	offRuleGeneration   = int(unsafe.Offsetof(santaSantaRule{}.Generation))
	offRuleReplyLen     = int(unsafe.Offsetof(santaSantaRule{}.ReplyLen))
	offRuleTplCsum      = int(unsafe.Offsetof(santaSantaRule{}.TplCsum))
	offRuleNcopies      = int(unsafe.Offsetof(santaSantaRule{}.Ncopies))
	offBucketHead       = int(unsafe.Offsetof(santaSantaBucket{}.Head))
	offBucketHint       = int(unsafe.Offsetof(santaSantaBucket{}.Hint))
	offRulesetFlags     = int(unsafe.Offsetof(santaSantaRuleset{}.Flags))
	offRulesetGen       = int(unsafe.Offsetof(santaSantaRuleset{}.Generation))
	offRulesetSampleLen = int(unsafe.Offsetof(santaSantaRuleset{}.SampleLen))
	offRulesetLens      = int(unsafe.Offsetof(santaSantaRuleset{}.Lens))
	rangeSize           = int(unsafe.Sizeof(santaSantaRuleset{}.Lens[0]))
	ruleValueSize       = binary.Size(santaSantaRule{})
	rulesetValueSize    = binary.Size(santaSantaRuleset{})
)

// Load loads the rule processor with the given sizes (zero fields take
// DefaultConfig's). It needs CAP_BPF and CAP_NET_ADMIN.
func Load(cfg Config) (*Dataplane, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	spec, err := loadSpec()
	if err != nil {
		return nil, err
	}
	var seed [4]byte
	if _, err := rand.Read(seed[:]); err != nil {
		return nil, err
	}
	d := &Dataplane{
		cfg:       cfg,
		seed:      binary.LittleEndian.Uint32(seed[:]),
		mask:      uint32(1)<<cfg.HashBits - 1,
		bySocket:  map[uint64]*ruleset{},
		portUsers: map[portKey]int{},
		byID:      map[RuleID]*installed{},
	}
	sizes := map[string]uint32{
		"santa_sockets":       uint32(cfg.MaxRulesets),
		"santa_rulesets":      rulesetIDs(cfg),
		"santa_sample_budget": rulesetIDs(cfg),
		"santa_buckets":       d.mask + 1,
		"santa_rules":         uint32(cfg.MaxRules) + 1,
		"santa_rule_stats":    uint32(cfg.MaxRules) + 1,
		"santa_rule_base":     uint32(cfg.MaxRules) + 1,
		"santa_pages":         uint32(cfg.DataMiB),
		"santa_miss_samples":  uint32(cfg.SampleRingKiB) * 1024,
		"santa_released":      releasedRing(cfg),
		"santa_tcp_flows":     uint32(cfg.TCPFlows),
	}
	for name, n := range sizes {
		ms, ok := spec.Maps[name]
		if !ok {
			return nil, fmt.Errorf("rule processor ELF has no map %s", name)
		}
		ms.MaxEntries = n
	}
	if err := spec.Variables["bucket_mask"].Set(d.mask); err != nil {
		return nil, err
	}
	if err := spec.Variables["bucket_seed"].Set(d.seed); err != nil {
		return nil, err
	}
	opts := &ebpf.CollectionOptions{MapReplacements: map[string]*ebpf.Map{}}
	var toPin []sharedMap
	for _, sm := range cfg.sharedMaps() {
		m, fresh, err := openShared(sm, spec.Maps[sm.name])
		if err != nil {
			return nil, err
		}
		if m != nil {
			defer m.Close()
			opts.MapReplacements[sm.name] = m
		}
		if fresh {
			toPin = append(toPin, sm)
		}
	}
	if cfg.FlowsPin != "" {
		m, err := ebpf.LoadPinnedMap(cfg.FlowsPin, &ebpf.LoadPinOptions{ReadOnly: true})
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("open the previous TCP flow table: %w", err)
		}
		d.prevFlows = m
	}
	if err := spec.LoadAndAssign(&d.objs, opts); err != nil {
		if d.prevFlows != nil {
			d.prevFlows.Close()
		}
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load rule processor: %+v", ve)
		}
		return nil, fmt.Errorf("load rule processor: %w", err)
	}
	for _, m := range []struct {
		dst **mmapArray
		src *ebpf.Map
	}{{&d.rules, d.objs.SantaRules}, {&d.buckets, d.objs.SantaBuckets},
		{&d.pages, d.objs.SantaPages}, {&d.rulesets, d.objs.SantaRulesets},
		{&d.bases, d.objs.SantaRuleBase}, {&d.gens, d.objs.SantaGens}} {
		if *m.dst, err = mapArray(m.src, true); err != nil {
			d.Close()
			return nil, err
		}
	}
	if d.prevFlows != nil {
		// until PublishFlows: the program must not run on a flow table
		// that lacks the predecessor's flows
		if err := d.objs.SantaTcpCarrying.Put(uint32(0), uint32(1)); err != nil {
			d.Close()
			return nil, fmt.Errorf("mark the TCP flows as being carried over: %w", err)
		}
	}
	named := d.objs.named()
	for _, sm := range toPin {
		err := os.MkdirAll(filepath.Dir(sm.pin), 0o700)
		if err == nil {
			err = named[sm.name].Pin(sm.pin)
		}
		if err != nil {
			d.Close()
			return nil, fmt.Errorf("pin %s: %w", sm.name, err)
		}
		d.freshPins = append(d.freshPins, sm.pin)
	}
	if err := d.startTCPUpkeep(); err != nil {
		d.Close()
		return nil, err
	}
	d.slots = newSlotAllocator(uint32(cfg.MaxRules) + 1)
	d.slots.reset = d.resetSlotStats
	d.rsIDs = newSlotAllocator(rulesetIDs(cfg))
	d.data = newDataAllocator(uint32(cfg.DataMiB))
	d.chainLen = make([]uint8, d.mask+1)
	return d, nil
}

// UnpinFresh removes the pins of the shared maps that Load pinned where
// there were none, for a start that fails: a predecessor's stay.
func (d *Dataplane) UnpinFresh() error {
	var err error
	for _, pin := range d.freshPins {
		err = errors.Join(err, os.Remove(pin))
	}
	return err
}

// sharedMap is a map pinned apart from the data plane's generations, at a
// fixed path, and reused by successors.
type sharedMap struct {
	name string // in bpf/
	pin  string // empty: not pinned
}

// sharedMaps: the guard map, since write trackers and controllers hold on
// to it. (The TCP flow table is pinned apart too, but each data plane has
// its own: see CarryFlows.)
func (c Config) sharedMaps() []sharedMap {
	return []sharedMap{{"santa_guards", c.GuardsPin}}
}

// openShared opens the map pinned at sm.pin, if there is one; fresh says a
// new map is to be pinned there. One of another layout or size is refused.
func openShared(sm sharedMap, spec *ebpf.MapSpec) (m *ebpf.Map, fresh bool, err error) {
	if sm.pin == "" {
		return nil, false, nil
	}
	m, err = ebpf.LoadPinnedMap(sm.pin, nil)
	if errors.Is(err, os.ErrNotExist) {
		return nil, true, nil
	}
	if err != nil {
		return nil, false, fmt.Errorf("open %s: %w", sm.pin, err)
	}
	err = sameLayout(m, spec)
	if err == nil && m.MaxEntries() != spec.MaxEntries {
		err = fmt.Errorf("%d entries, want %d", m.MaxEntries(), spec.MaxEntries)
	}
	if err != nil {
		m.Close()
		return nil, false, fmt.Errorf("%s pinned at %s: not this version's (%v); remove it", sm.name, sm.pin, err)
	}
	return m, false, nil
}

// loadSpec reads every entry file's object into one collection spec: the
// release hook and the handover refer to the maps by name, so they use the
// XDP object's.
func loadSpec() (*ebpf.CollectionSpec, error) {
	spec, err := loadSanta()
	if err != nil {
		return nil, fmt.Errorf("read rule processor ELF: %w", err)
	}
	release, err := loadRelease()
	if err != nil {
		return nil, fmt.Errorf("read release hook ELF: %w", err)
	}
	spec.Programs["santa_release"] = release.Programs["santa_release"]
	handover, err := loadHandover()
	if err != nil {
		return nil, fmt.Errorf("read TCP handover ELF: %w", err)
	}
	spec.Programs["santa_handover"] = handover.Programs["santa_handover"]
	return spec, nil
}

// releasedRing is the size of santa_released: room for the cookie of every
// socket that can have a rule set (8 bytes plus an 8-byte record header),
// a power of two of at least a page.
func releasedRing(cfg Config) uint32 {
	n := max(16*cfg.MaxRulesets, os.Getpagesize())
	return 1 << bits.Len(uint(n-1))
}

// rulesetIDs is the size of the rule set id space: id 0 is never used, and
// every rule set may be mid-replace, its old id quarantined, at the same time.
func rulesetIDs(cfg Config) uint32 { return 2*uint32(cfg.MaxRulesets) + 1 }

// Program is the XDP rule processor, for attaching or BPF_PROG_RUN.
func (d *Dataplane) Program() *ebpf.Program { return d.objs.SantaXdp }

// Config is the configuration the data plane was loaded with.
func (d *Dataplane) Config() Config { return d.cfg }

// Close unmaps and releases everything Load created. Attachments must be closed first.
func (d *Dataplane) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.closed = true
	d.stopTCPUpkeep()
	var errs []error
	if s := d.fins.Swap(nil); s != nil {
		errs = append(errs, s.close())
	}
	if d.prevFlows != nil {
		errs = append(errs, d.prevFlows.Close())
		d.prevFlows = nil
	}
	for _, a := range []*mmapArray{d.rules, d.buckets, d.pages, d.rulesets, d.bases, d.gens} {
		errs = append(errs, a.close())
	}
	errs = append(errs, d.objs.Close())
	return errors.Join(errs...)
}
