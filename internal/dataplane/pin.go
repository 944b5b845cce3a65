package dataplane

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// A restarting santad loads a new data plane while the old one still
// answers, replays its rules into it with RestoreRules, then swaps it in
// (AttachPinned). The old instance's maps, pinned with Pin, tell it which
// sockets are still open and what every rule has counted so far.

// bpffsRoot is where bpffs is conventionally mounted.
const bpffsRoot = "/sys/fs/bpf"

// EnsureBPFFS makes sure path lies on a bpffs, mounting one at /sys/fs/bpf
// if path is below it and none is mounted there yet.
func EnsureBPFFS(path string) error {
	if ok, err := onBPFFS(path); err != nil || ok {
		return err
	}
	if rel, err := filepath.Rel(bpffsRoot, filepath.Clean(path)); err != nil || !filepath.IsLocal(rel) {
		return fmt.Errorf("%s is not on a bpffs", path)
	}
	if ok, err := onBPFFS(bpffsRoot); err != nil || ok {
		return err
	}
	if err := unix.Mount("bpf", bpffsRoot, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpffs at %s: %w", bpffsRoot, err)
	}
	return nil
}

// onBPFFS reports whether path, or its closest existing ancestor, is on a bpffs.
func onBPFFS(path string) (bool, error) {
	for p := filepath.Clean(path); ; p = filepath.Dir(p) {
		var st unix.Statfs_t
		err := unix.Statfs(p, &st)
		if err == nil {
			return st.Type == unix.BPF_FS_MAGIC, nil
		}
		if !errors.Is(err, unix.ENOENT) || p == filepath.Dir(p) {
			return false, fmt.Errorf("statfs %s: %w", p, err)
		}
	}
}

type pinner interface {
	Pin(string) error
	Unpin() error
}

// named lists the collection's maps and programs by their names in bpf/.
func (o *objects) named() map[string]pinner {
	out := map[string]pinner{}
	v := reflect.ValueOf(o).Elem()
	for _, f := range reflect.VisibleFields(v.Type()) {
		name := f.Tag.Get("ebpf")
		if name == "" {
			continue
		}
		if p, ok := v.FieldByIndex(f.Index).Interface().(pinner); ok {
			out[name] = p
		}
	}
	return out
}

// Pin pins every map and program of the data plane but those pinned apart
// (Config.GuardsPin, FlowsPin) under dir, by their names in bpf/, for a
// successor's OpenPrevious. dir is made if missing; it must lie on a bpffs
// (EnsureBPFFS) and hold none of these pins yet.
func (d *Dataplane) Pin(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	apart := map[string]bool{"santa_tcp_flows": d.cfg.FlowsPin != ""} // see PublishFlows
	for _, sm := range d.cfg.sharedMaps() {
		apart[sm.name] = sm.pin != "" // pinning again would move it
	}
	var done []pinner
	for name, obj := range d.objs.named() {
		if apart[name] {
			continue
		}
		if err := obj.Pin(filepath.Join(dir, name)); err != nil {
			for _, p := range done {
				p.Unpin()
			}
			return fmt.Errorf("pin %s: %w", name, err)
		}
		done = append(done, obj)
	}
	return nil
}

// Unpin removes dir, on a bpffs, and every pin in it: a predecessor's
// objects go away once nothing else holds them.
func Unpin(dir string) error {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("statfs %s: %w", dir, err)
	}
	if st.Type != unix.BPF_FS_MAGIC {
		return fmt.Errorf("unpin %s: not on a bpffs", dir)
	}
	return os.RemoveAll(dir)
}

// Previous is a pinned predecessor, which it only reads.
type Previous struct {
	dir     string
	spec    *ebpf.CollectionSpec
	sockets *ebpf.Map
}

// errLayout says a predecessor's maps are laid out differently.
var errLayout = errors.New("layout differs from this version's")

// OpenPrevious opens the data plane pinned under dir by Pin.
func OpenPrevious(dir string) (*Previous, error) {
	spec, err := loadSanta()
	if err != nil {
		return nil, fmt.Errorf("read rule processor ELF: %w", err)
	}
	p := &Previous{dir: dir, spec: spec}
	if p.sockets, err = p.open("santa_sockets", true); err != nil {
		return nil, err
	}
	return p, nil
}

// open opens the predecessor's map name, checking that its layout is this
// version's. Descriptors are read-only where they can be: the kernel maps no
// read-only descriptor shared, so maps to mmap get writable ones (and
// read-only mappings).
func (p *Previous) open(name string, readOnly bool) (*ebpf.Map, error) {
	m, err := ebpf.LoadPinnedMap(filepath.Join(p.dir, name), &ebpf.LoadPinOptions{ReadOnly: readOnly})
	if err != nil {
		return nil, fmt.Errorf("open previous %s: %w", name, err)
	}
	if err := sameLayout(m, p.spec.Maps[name]); err != nil {
		m.Close()
		return nil, fmt.Errorf("previous %s: %w", name, err)
	}
	return m, nil
}

// mapStruct is the struct named name in m's type information (BTF): a
// predecessor's map is read by its own version's field names and offsets.
func mapStruct(m *ebpf.Map, name string) (*btf.Struct, error) {
	h, err := m.Handle()
	if err != nil {
		return nil, fmt.Errorf("type information: %w", err)
	}
	defer h.Close()
	types, err := h.Spec(nil)
	if err != nil {
		return nil, fmt.Errorf("type information: %w", err)
	}
	var st *btf.Struct
	if err := types.TypeByName(name, &st); err != nil {
		return nil, fmt.Errorf("no struct %s: %w", name, err)
	}
	return st, nil
}

// sameLayout checks that m has the type and key and value sizes of ms and,
// for a struct value, the same fields at the same offsets, as m's BTF says.
func sameLayout(m *ebpf.Map, ms *ebpf.MapSpec) error {
	if m.Type() != ms.Type || m.KeySize() != ms.KeySize || m.ValueSize() != ms.ValueSize {
		return fmt.Errorf("%w: %v with %d-byte keys and %d-byte values, want %v, %d and %d", errLayout,
			m.Type(), m.KeySize(), m.ValueSize(), ms.Type, ms.KeySize, ms.ValueSize)
	}
	want, ok := ms.Value.(*btf.Struct)
	if !ok {
		return nil
	}
	have, err := mapStruct(m, want.Name)
	if errors.Is(err, btf.ErrNotFound) {
		return fmt.Errorf("%w: %v", errLayout, err)
	}
	if err != nil {
		return err
	}
	var gf btf.GoFormatter
	a, err := gf.TypeDeclaration(want.Name, want)
	if err != nil {
		return err
	}
	b, err := gf.TypeDeclaration(want.Name, have)
	if err != nil {
		return err
	}
	if a != b {
		return fmt.Errorf("%w: struct %s has other fields", errLayout, want.Name)
	}
	return nil
}

// readPrevious reads entries first to first+n-1 of the predecessor's array
// map name.
func readPrevious[T any](p *Previous, name string, first, n int) ([]T, error) {
	m, err := p.open(name, true)
	if err != nil {
		return nil, err
	}
	defer m.Close()
	out := make([]T, n)
	for i := range out {
		if err := m.Lookup(uint32(first+i), &out[i]); err != nil {
			return nil, fmt.Errorf("previous %s entry %d: %w", name, first+i, err)
		}
	}
	return out, nil
}

// Alive reports whether the socket still has its rule set in the
// predecessor: it is bound and has not closed (see AttachReleaseHook).
func (p *Previous) Alive(cookie uint64) bool {
	var id uint32
	return p.sockets.Lookup(cookie, &id) == nil
}

// RuleStats sums the predecessor's statistics by rule ID: of the rules
// linked into the bucket chains of its bound rule sets, each slot's base and
// per-CPU counters. It fails if the predecessor's layout is not this version's.
func (p *Previous) RuleStats() (map[RuleID]RuleStats, error) {
	live, err := p.liveRulesets()
	if err != nil {
		return nil, err
	}
	var arrays []*mmapArray
	defer func() {
		for _, a := range arrays {
			a.close()
		}
	}()
	mapped := func(name string) (*mmapArray, error) {
		m, err := p.open(name, false)
		if err != nil {
			return nil, err
		}
		defer m.Close() // the mapping, read-only, holds the map
		a, err := mapArray(m, false)
		if err == nil {
			arrays = append(arrays, a)
		}
		return a, err
	}
	buckets, err := mapped("santa_buckets")
	if err != nil {
		return nil, err
	}
	rules, err := mapped("santa_rules")
	if err != nil {
		return nil, err
	}
	bases, err := mapped("santa_rule_base")
	if err != nil {
		return nil, err
	}
	stats, err := p.open("santa_rule_stats", true)
	if err != nil {
		return nil, err
	}
	defer stats.Close()

	newest, end := newestSlots(live, buckets, rules, bases.entries)
	counts, err := sumPerCPU(stats, end)
	if err != nil {
		return nil, fmt.Errorf("read previous rule counters: %w", err)
	}
	out := make(map[RuleID]RuleStats, len(newest))
	for id, v := range newest {
		out[id] = baseOf(bases, v.slot).add(counts[v.slot])
	}
	return out, nil
}

// liveRulesets are the ids of the predecessor's bound rule sets.
func (p *Previous) liveRulesets() (map[uint32]bool, error) {
	live := map[uint32]bool{}
	var cookie uint64
	var rsID uint32
	it := p.sockets.Iterate()
	for it.Next(&cookie, &rsID) {
		live[rsID] = true
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("read previous sockets: %w", err)
	}
	return live, nil
}

// retargetLocked points f's rule, in the predecessor's coordinates, at the
// same rule in this data plane, if it was the newest version of a live rule
// there and the rule here has the same reply; else it leaves f as it is and
// returns false. d.mu is held.
func (d *Dataplane) retargetLocked(f *santaSantaTcpFlow, newest map[RuleID]prevVersion, old *mmapArray) bool {
	ref := f.Rule
	v, ok := newest[RuleID(ref.Id)]
	if !ok || v.slot != ref.Slot || ref.Slot >= old.entries || old.load32(ref.Slot, offRuleRuleset) != ref.Ruleset ||
		old.load32(ref.Slot, offRuleGeneration) != ref.Generation {
		return false // not the newest version of a live rule: its reply is gone
	}
	r, ok := d.byID[RuleID(ref.Id)]
	if !ok || r.slot == 0 || !sameReply(old.value(ref.Slot), d.rules.value(r.slot)) {
		return false
	}
	f.Rule.Slot = r.slot
	f.Rule.Ruleset = d.rules.load32(r.slot, offRuleRuleset)
	f.Rule.Generation = d.rules.load32(r.slot, offRuleGeneration)
	return true
}

// newestRules maps the predecessor's rules for reading, with where each
// live rule's newest version lies (newestSlots).
func (p *Previous) newestRules() (map[RuleID]prevVersion, *mmapArray, error) {
	live, err := p.liveRulesets()
	if err != nil {
		return nil, nil, err
	}
	m, err := p.open("santa_rules", false)
	if err != nil {
		return nil, nil, err
	}
	rules, err := mapArray(m, false)
	m.Close() // the mapping holds the map
	if err != nil {
		return nil, nil, err
	}
	bm, err := p.open("santa_buckets", false)
	if err != nil {
		rules.close()
		return nil, nil, err
	}
	buckets, err := mapArray(bm, false)
	bm.Close()
	if err != nil {
		rules.close()
		return nil, nil, err
	}
	defer buckets.close()
	newest, _ := newestSlots(live, buckets, rules, rules.entries)
	return newest, rules, nil
}

// CarryCounters adds the predecessor's answer and pass reasons (santa_counters)
// to this data plane's, by name, so that they do not fall across a restart
// or an upgrade: reasons this version does not have are left out, and its
// new ones start at zero. Call it before this data plane's programs are
// swapped in (they count nothing yet; the predecessor's counts between this
// read and the swap are lost: a few events less, never more).
func (d *Dataplane) CarryCounters(p *Previous) error {
	m, err := ebpf.LoadPinnedMap(filepath.Join(p.dir, "santa_counters"), &ebpf.LoadPinOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("open previous santa_counters: %w", err)
	}
	defer m.Close()
	if m.Type() != ebpf.PerCPUArray || m.ValueSize()%8 != 0 {
		return fmt.Errorf("previous santa_counters: %v with %d-byte values, want a per-CPU array of 64-bit counters", m.Type(), m.ValueSize())
	}
	st, err := mapStruct(m, "santa_reasons")
	if err != nil {
		return fmt.Errorf("previous santa_counters: %w", err)
	}
	// each CPU's value as 64-bit words
	words := int(m.ValueSize() / 8)
	per := reflect.New(reflect.SliceOf(reflect.ArrayOf(words, reflect.TypeOf(uint64(0)))))
	if err := m.Lookup(uint32(0), per.Interface()); err != nil {
		return fmt.Errorf("read previous santa_counters: %w", err)
	}
	old := map[string]uint64{}
	for _, mem := range st.Members {
		size, err := btf.Sizeof(mem.Type)
		if err != nil || size != 8 || mem.BitfieldSize != 0 || mem.Offset%64 != 0 || int(mem.Offset/64) >= words {
			continue
		}
		for cpu := 0; cpu < per.Elem().Len(); cpu++ {
			old[mem.Name] += per.Elem().Index(cpu).Index(int(mem.Offset / 64)).Uint()
		}
	}
	vals := make([]santaSantaReasons, ebpf.MustPossibleCPU())
	if err := d.objs.SantaCounters.Lookup(uint32(0), &vals); err != nil {
		return fmt.Errorf("read counters: %w", err)
	}
	v := reflect.ValueOf(&vals[0]).Elem()
	for i := 0; i < v.NumField(); i++ {
		if f := v.Field(i); f.Kind() == reflect.Uint64 {
			f.SetUint(f.Uint() + old[strings.ToLower(camel.ReplaceAllString(v.Type().Field(i).Name, "${1}_${2}"))])
		}
	}
	if err := d.objs.SantaCounters.Update(uint32(0), vals, ebpf.UpdateExist); err != nil {
		return fmt.Errorf("carry counters: %w", err)
	}
	return nil
}

// sameReply says two rules (santa_rules values) have the same reply
// template: length and checksum.
func sameReply(a, b []byte) bool {
	return binary.LittleEndian.Uint16(a[offRuleReplyLen:]) == binary.LittleEndian.Uint16(b[offRuleReplyLen:]) &&
		binary.LittleEndian.Uint16(a[offRuleTplCsum:]) == binary.LittleEndian.Uint16(b[offRuleTplCsum:]) &&
		a[offRuleNcopies] == b[offRuleNcopies]
}

// prevVersion is where the newest version of a rule lies in a predecessor.
type prevVersion struct{ slot, generation uint32 }

// newestSlots finds, of the rules linked into the bucket chains of the
// live rule sets, each rule's newest version: a modified rule's old version
// stays linked for a moment (retireGrace) beside the new one. end is one
// past the highest slot linked; slots are below limit.
func newestSlots(live map[uint32]bool, buckets, rules *mmapArray, limit uint32) (map[RuleID]prevVersion, uint32) {
	newest := map[RuleID]prevVersion{}
	var end uint32
	limit = min(rules.entries, limit)
	for b := range buckets.entries {
		for s, n := buckets.load32(b, offBucketHead), 0; s != 0 && s < limit && n < MaxChain; s, n = rules.load32(s, offRuleNext), n+1 {
			if !live[rules.load32(s, offRuleRuleset)] {
				continue
			}
			id := RuleID(binary.LittleEndian.Uint64(rules.value(s)[offRuleID:]))
			v := prevVersion{s, rules.load32(s, offRuleGeneration)}
			if seen, ok := newest[id]; !ok || v.generation > seen.generation {
				newest[id] = v
			}
			end = max(end, s+1)
		}
	}
	return newest, end
}

// sumPerCPU reads the per-CPU rule counters of slots 0..end-1 in batches
// (an array's come in key order) and sums each over the CPUs.
func sumPerCPU(m *ebpf.Map, end uint32) ([]RuleStats, error) {
	cpus, err := ebpf.PossibleCPU()
	if err != nil {
		return nil, err
	}
	const batch = 4096
	keys := make([]uint32, batch)
	vals := make([]santaSantaRuleCounters, batch*cpus)
	out := make([]RuleStats, 0, end)
	var cursor ebpf.MapBatchCursor
	for uint32(len(out)) < end {
		n, err := m.BatchLookup(&cursor, keys, vals, nil)
		for i := 0; i < n && uint32(len(out)) < end; i++ {
			out = append(out, sumCPUs(vals[i*cpus:(i+1)*cpus]))
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			break
		}
		if err != nil {
			return nil, err
		}
	}
	if uint32(len(out)) < end {
		return nil, fmt.Errorf("%d of %d slots read", len(out), end)
	}
	return out, nil
}

// Close releases the predecessor's maps; its pins stay (see Unpin).
func (p *Previous) Close() error { return p.sockets.Close() }
