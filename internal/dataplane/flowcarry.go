package dataplane

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/btf"
	"golang.org/x/sys/unix"
)

// A successor carries the TCP flows over (where eBPF's replies on socket-less
// connections stand): a client that holds part of a long reply and finds no
// flow, or one whose rule is gone, would be answered anew (the reply's first
// bytes where it expects the rest) or reset. Each data plane has a flow table
// of its own, so that neither program ever reads a flow in the other's
// coordinates: the predecessor's keeps answering from its table until the
// swap, and the successor copies it before and right after the swap
// (CarryFlows), then pins its own in its place (PublishFlows). From the swap
// until the second copy is done the successor's program drops the segments
// of socket-less connections but SYNs (their clients send them again): a
// flow the predecessor made or moved on after the first copy would
// otherwise be taken for none, or for where it stood, and a retransmitted
// request answered anew at the wrong place.

// FlowsCarried counts what a CarryFlows pass copied.
type FlowsCarried struct {
	Flows int // flows copied
	// InFlight counts those with a long reply the client had not all
	// acked, pointed at the restored rule that made it; Gone those whose
	// rule was not restored as it was (eBPF finds their reply gone).
	InFlight, Gone int
	// Left counts the predecessor's flows this data plane's table had no
	// room for (a smaller tcp_flows), or gave up for one of a reply in
	// flight; LeftInFlight those of them with a long reply in flight.
	Left, LeftInFlight int
}

// carriedFlow is what CarryFlows last copied for a key: the predecessor's
// entry as it was, and what it wrote into this data plane's table.
type carriedFlow struct {
	was   string
	wrote santaSantaTcpFlow
}

// replyInFlight says the client had not acked all of f's long reply. Only
// a long reply's flow follows the client's acks; without its flow, a client
// that has part of it and sends its request again is answered anew, the
// reply's first bytes where it expects the rest. A one-segment reply is
// sent again as it was.
func replyInFlight(f *santaSantaTcpFlow) bool {
	return f.Multi != 0 && int32(f.LastAck-f.ReplyEnd) < 0
}

// CarryFlows copies into this data plane's flow table the flows of the
// predecessor's (the one pinned at Config.FlowsPin when Load ran, of any
// layout: fields are read by their names in its BTF) that it has not copied
// yet or that the predecessor changed since, each pointed at the same rule
// in this data plane (by id, if it was the newest version of a live rule
// there and the restored rule has the same reply; else at no rule). A flow
// this data plane's program made, changed or ended is left alone. Call it
// once before the programs are swapped in (AttachPinned) and once right
// after, for what the predecessor did in between.
//
// A table too small for them all (a smaller tcp_flows) takes the flows of
// long replies in flight first, then the most recently active; for one of
// a reply in flight it gives up a flow it carried that was idle and that
// this program has not touched since.
func (d *Dataplane) CarryFlows(p *Previous) (FlowsCarried, error) {
	var done FlowsCarried
	if d.prevFlows == nil || p == nil {
		return done, nil
	}
	src := d.prevFlows
	if src.KeySize() != uint32(binary.Size(santaBpfSockTuple{})) {
		return done, fmt.Errorf("previous flow table: %d-byte keys, want %d", src.KeySize(), binary.Size(santaBpfSockTuple{}))
	}
	read, err := flowReader(src)
	if err != nil {
		return done, err
	}
	newest, old, err := p.newestRules()
	if err != nil {
		return done, err
	}
	defer old.close()
	dst := d.objs.SantaTcpFlows
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.carried == nil {
		d.carried = map[string]carriedFlow{}
	}
	type pending struct {
		k        santaBpfSockTuple
		key, was string
		f        santaSantaTcpFlow
		ruled    bool // it named a rule
		pointed  bool // at the restored one
	}
	var todo []pending
	entries, err := readRaw(src)
	if err != nil {
		return done, fmt.Errorf("read previous flow table: %w", err)
	}
	for _, e := range entries {
		key, val := e[0], e[1]
		last, copied := d.carried[string(key)]
		if copied && last.was == string(val) {
			continue
		}
		var k santaBpfSockTuple
		if err := binary.Read(bytes.NewReader(key), binary.LittleEndian, &k); err != nil {
			return done, err
		}
		var now santaSantaTcpFlow
		switch err := dst.Lookup(&k, &now); {
		case err == nil && (!copied || now != last.wrote):
			continue // this program's own, or moved on by it
		case errors.Is(err, ebpf.ErrKeyNotExist) && copied:
			continue // this program ended it
		case err != nil && !errors.Is(err, ebpf.ErrKeyNotExist):
			return done, fmt.Errorf("read flow: %w", err)
		}
		f, ruled := read(val, old)
		pointed := ruled && d.retargetLocked(&f, newest, old)
		if !pointed {
			f.Rule.Id, f.Rule.Slot, f.Rule.Ruleset, f.Rule.Generation = 0, ^uint32(0), 0, 0 // no rule: eBPF finds it gone
		}
		todo = append(todo, pending{k, string(key), string(val), f, ruled, pointed})
	}
	// replies in flight first, then the most recently active
	slices.SortStableFunc(todo, func(a, b pending) int {
		if x, y := replyInFlight(&a.f), replyInFlight(&b.f); x != y {
			if x {
				return -1
			}
			return 1
		}
		return cmp.Compare(int32(b.f.Seen-a.f.Seen), 0)
	})
	var idle []string // carried idle flows to give up for replies in flight, least recently active first
	idleListed := false
	evict := func() bool {
		if !idleListed {
			idleListed = true
			for k, c := range d.carried {
				if !replyInFlight(&c.wrote) {
					idle = append(idle, k)
				}
			}
			slices.SortFunc(idle, func(a, b string) int {
				return cmp.Compare(int32(d.carried[a].wrote.Seen-d.carried[b].wrote.Seen), 0)
			})
		}
		for len(idle) > 0 {
			ks := idle[0]
			idle = idle[1:]
			c, ok := d.carried[ks]
			if !ok {
				continue
			}
			var k santaBpfSockTuple
			if binary.Read(bytes.NewReader([]byte(ks)), binary.LittleEndian, &k) != nil {
				continue
			}
			var now santaSantaTcpFlow
			if dst.Lookup(&k, &now) != nil || now != c.wrote || replyInFlight(&now) {
				continue // this program's by now
			}
			if dst.Delete(&k) == nil {
				delete(d.carried, ks)
				done.Left++
				return true
			}
		}
		return false
	}
	for _, e := range todo {
		inFlight := replyInFlight(&e.f)
		err := dst.Update(&e.k, &e.f, ebpf.UpdateAny)
		if errors.Is(err, unix.E2BIG) && inFlight && evict() {
			err = dst.Update(&e.k, &e.f, ebpf.UpdateAny)
		}
		if errors.Is(err, unix.E2BIG) { // this table is full (a smaller tcp_flows)
			done.Left++
			if inFlight {
				done.LeftInFlight++
			}
			continue
		}
		if err != nil {
			return done, fmt.Errorf("copy flow: %w", err)
		}
		d.carried[e.key] = carriedFlow{e.was, e.f}
		done.Flows++
		if inFlight && e.pointed {
			done.InFlight++
		} else if inFlight && e.ruled {
			done.Gone++
		}
	}
	return done, nil
}

// readRaw reads every entry of m as raw key and value bytes, in batches:
// the pass right after the swap is the moment a flow the predecessor changed
// is not carried over yet (a full table of 131072 flows took 0.7 s entry by
// entry).
func readRaw(m *ebpf.Map) ([][2][]byte, error) {
	const batch = 4096
	bytesOf := func(size uint32) reflect.Value {
		return reflect.MakeSlice(reflect.SliceOf(reflect.ArrayOf(int(size), reflect.TypeFor[byte]())), batch, batch)
	}
	keys, vals := bytesOf(m.KeySize()), bytesOf(m.ValueSize())
	var out [][2][]byte
	var cursor ebpf.MapBatchCursor
	for {
		n, err := m.BatchLookup(&cursor, keys.Interface(), vals.Interface(), nil)
		for i := 0; i < n; i++ {
			out = append(out, [2][]byte{bytes.Clone(keys.Index(i).Bytes()), bytes.Clone(vals.Index(i).Bytes())})
		}
		if errors.Is(err, ebpf.ErrKeyNotExist) {
			return out, nil
		}
		if err != nil {
			return out, err
		}
	}
}

// flowReader reads entries of flow table m as this version's flows, field
// by field as m's BTF names them, the rule in the predecessor's coordinates:
// ruled says the entry names one. Entries from before rule references
// (48e38bb and older) name it by slot alone: the rule then in that slot.
func flowReader(m *ebpf.Map) (func(v []byte, rules *mmapArray) (f santaSantaTcpFlow, ruled bool), error) {
	st, err := mapStruct(m, "santa_tcp_flow")
	if err != nil {
		return nil, fmt.Errorf("previous flow table: %w", err)
	}
	field := map[string]btf.Member{}
	for _, m := range st.Members {
		field[m.Name] = m
	}
	get := func(v []byte, name string) (uint64, bool) {
		m, ok := field[name]
		if !ok || m.BitfieldSize != 0 || m.Offset%8 != 0 {
			return 0, false
		}
		size, err := btf.Sizeof(m.Type)
		off := int(m.Offset / 8)
		if err != nil || off+size > len(v) {
			return 0, false
		}
		switch size {
		case 1:
			return uint64(v[off]), true
		case 2:
			return uint64(binary.LittleEndian.Uint16(v[off:])), true
		case 4:
			return uint64(binary.LittleEndian.Uint32(v[off:])), true
		case 8:
			return binary.LittleEndian.Uint64(v[off:]), true
		}
		return 0, false
	}
	for _, name := range []string{"req_seq", "req_end", "reply_start", "reply_end", "last_ack", "seen"} {
		if _, ok := get(make([]byte, m.ValueSize()), name); !ok {
			return nil, fmt.Errorf("previous flow table: no field %s to copy", name)
		}
	}
	var refOff = -1
	if ref, ok := field["rule"]; ok && ref.Offset%8 == 0 {
		s, isStruct := btf.UnderlyingType(ref.Type).(*btf.Struct)
		if isStruct && s.Name == "santa_rule_ref" && s.Size == uint32(binary.Size(santaSantaTcpFlow{}.Rule)) {
			refOff = int(ref.Offset / 8)
		}
	}
	return func(v []byte, rules *mmapArray) (santaSantaTcpFlow, bool) {
		u32 := func(name string) uint32 { x, _ := get(v, name); return uint32(x) }
		f := santaSantaTcpFlow{ReqSeq: u32("req_seq"), ReqEnd: u32("req_end"), ReplyStart: u32("reply_start"),
			ReplyEnd: u32("reply_end"), LastAck: u32("last_ack"), Seen: u32("seen")}
		if multi, _ := get(v, "multi"); multi != 0 {
			f.Multi = 1
		}
		opts, _ := get(v, "opts") // 0 from versions before it: not known
		f.Opts = uint8(opts)
		// 0 from versions before it, whose stamps are those of owner 0
		f.Uid = u32("uid")
		if refOff >= 0 && refOff+binary.Size(f.Rule) <= len(v) {
			r := v[refOff:]
			f.Rule.Id, f.Rule.Slot = binary.LittleEndian.Uint64(r), binary.LittleEndian.Uint32(r[8:])
			f.Rule.Ruleset, f.Rule.Generation = binary.LittleEndian.Uint32(r[12:]), binary.LittleEndian.Uint32(r[16:])
			return f, f.Rule.Id != 0
		}
		if slot, ok := get(v, "slot"); ok && uint32(slot) < rules.entries {
			f.Rule.Slot = uint32(slot)
			f.Rule.Id = binary.LittleEndian.Uint64(rules.value(uint32(slot))[offRuleID:])
			f.Rule.Ruleset = rules.load32(uint32(slot), offRuleRuleset)
			f.Rule.Generation = rules.load32(uint32(slot), offRuleGeneration)
			return f, f.Rule.Id != 0
		}
		return f, false
	}, nil
}

// PublishFlows lets the program use its flows, which until then it drops
// every segment of a socket-less connection but a SYN for (counter
// tcp_drop_carrying: Load marks them as being carried over when there is a
// predecessor's table), lets go of the predecessor's table (CarryFlows copies
// no more), and pins this data plane's at Config.FlowsPin in its place, for
// a successor. Call it once the programs are swapped in and CarryFlows has
// run after the swap.
func (d *Dataplane) PublishFlows() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.prevFlows != nil {
		if err := d.objs.SantaTcpCarrying.Put(uint32(0), uint32(0)); err != nil {
			return fmt.Errorf("end carrying the TCP flows over: %w", err)
		}
		d.prevFlows.Close()
		d.prevFlows, d.carried = nil, nil
	}
	if d.cfg.FlowsPin == "" {
		return nil
	}
	m, err := d.objs.SantaTcpFlows.Clone() // its pin moves below, not the table's
	if err != nil {
		return err
	}
	defer m.Close()
	tmp := d.cfg.FlowsPin + "-new" // bpffs names have no dots
	if err := os.MkdirAll(filepath.Dir(tmp), 0o700); err != nil {
		return fmt.Errorf("publish the TCP flow table: %w", err)
	}
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("publish the TCP flow table: %w", err)
	}
	if err := m.Pin(tmp); err != nil {
		return fmt.Errorf("publish the TCP flow table: %w", err)
	}
	// one step: a successor finds the predecessor's table or this one
	if err := os.Rename(tmp, d.cfg.FlowsPin); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("publish the TCP flow table: %w", err)
	}
	return nil
}
