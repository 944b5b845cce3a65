/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The rule processor's maps. Sizes marked "set by user space" are placeholders
 * that internal/dataplane overrides from its Config before loading. */
#pragma once

#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "santa.h"

/* Socket cookie -> rule set id: which rule set a receiving socket owns. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, __u64);
	__type(value, __u32);
	__uint(max_entries, 65536); /* set by user space */
} santa_sockets SEC(".maps");

/* Generation words, one per map whose answers each CPU caches
 * (SANTA_GEN_*): santad (and, for santa_sockets, the release hook) adds
 * one atomically after every change of that map, and a cached answer
 * (santa_scratch.sockets, .local) holds only while its word has not moved. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SANTA_GENS);
	__uint(map_flags, BPF_F_MMAPABLE); /* user space adds in place */
} santa_gens SEC(".maps");

/* Word set * SANTA_PORT_WORDS + port / 64 -> a bit per local port, in each
 * set SANTA_PORTS_*: the ports of the sockets that have rule sets (santad
 * keeps them, XDP only reads them). A request to any other port is passed
 * without a socket lookup. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SANTA_PORT_SETS * SANTA_PORT_WORDS);
} santa_ports SEC(".maps");

/* Set (SANTA_PORTS_*) of santa_ports holds local port (host order). */
static __always_inline int port_in(__u16 port, __u32 set)
{
	__u32 word = set * SANTA_PORT_WORDS + port / 64;
	__u64 *bits = bpf_map_lookup_elem(&santa_ports, &word);
	return bits && (*bits & (1ull << (port % 64)));
}

/* (attached interface, address) -> SANTA_ADDR_LOCAL or _BROADCAST for the
 * addresses of the interface's namespace: what the kernel would deliver. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct santa_local_addr);
	__type(value, __u8);
	__uint(max_entries, 4096);
} santa_local_addrs SEC(".maps");

/* local_filter_slot(key) -> how many keys of santa_local_addrs hash there:
 * a request whose addresses' slots hold 0 needs no lookup there (most
 * sources), which is cheaper than a miss in the hash map. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, SANTA_LOCAL_FILTER_SLOTS);
} santa_local_filter SEC(".maps");

/* The slot of key in santa_local_filter; internal/dataplane/localaddr.go
 * has the twin. */
static __always_inline __u32 local_filter_slot(const struct santa_local_addr *key)
{
	const __u64 *w = (const __u64 *)key;
	__u64 h = w[0] * 0x9e3779b97f4a7c15ull;
	h = (h ^ w[1]) * 0x9e3779b97f4a7c15ull;
	h = (h ^ w[2]) * 0x9e3779b97f4a7c15ull;
	return h >> (64 - SANTA_LOCAL_FILTER_BITS);
}

/* Rule set id -> its regions and miss-sample settings. Id 0 is never used. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_ruleset);
	__uint(max_entries, 4096); /* set by user space */
	__uint(map_flags, BPF_F_MMAPABLE); /* user space writes in place, publishes atomically */
} santa_rulesets SEC(".maps");

/* Bucket index (rule set, region, hash) -> first rule slot of its chain (0 = empty) and where its data lies. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_bucket);
	__uint(max_entries, 1 << 20); /* set by user space: 2^hash_bits */
	__uint(map_flags, BPF_F_MMAPABLE); /* user space writes in place, publishes atomically */
} santa_buckets SEC(".maps");

/* Rule slot -> rule. Slot 0 is never used, so 0 can end a chain. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_rule);
	__uint(max_entries, 65536); /* set by user space */
	__uint(map_flags, BPF_F_MMAPABLE); /* user space writes in place, publishes atomically */
} santa_rules SEC(".maps");

/* Page -> pattern, mask and template bytes of the rules placed in it. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_page);
	__uint(max_entries, 16); /* set by user space */
	__uint(map_flags, BPF_F_MMAPABLE); /* user space writes in place, publishes atomically */
} santa_pages SEC(".maps");

/* Guard slot -> version: rules answer only while their guards' slots hold
 * the versions they were installed with (struct santa_guard). Write trackers
 * bump slots; it outlives data plane generations (pinned apart). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, SANTA_GUARD_SLOTS);
	__uint(map_flags, BPF_F_MMAPABLE); /* controllers read versions in place */
} santa_guards SEC(".maps");

/* Rule slot -> hits and reply bytes, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_rule_counters);
	__uint(max_entries, 65536); /* set by user space: as santa_rules */
} santa_rule_stats SEC(".maps");

/* Rule slot -> hits and bytes the rule counted in the slots it had before
 * (rebuild, modify, restart). Only user space reads and writes it; a
 * restarted santad reads its predecessor's. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_rule_counters);
	__uint(max_entries, 65536); /* set by user space: as santa_rules */
	__uint(map_flags, BPF_F_MMAPABLE); /* user space reads and writes it in place */
} santa_rule_base SEC(".maps");

/* The pass and answer reasons, one named field each, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_reasons);
	__uint(max_entries, 1);
} santa_counters SEC(".maps");

/* Count one occurrence of a named reason in santa_counters. */
#define COUNT(field)                                                            \
	do {                                                                    \
		__u32 _zero = 0;                                                \
		struct santa_reasons *_c = bpf_map_lookup_elem(&santa_counters, &_zero); \
		if (_c)                                                         \
			_c->field++;                                            \
	} while (0)

/* Per-CPU scratch: the request window and the reply headers. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_scratch);
	__uint(max_entries, 1);
} santa_scratch SEC(".maps");

/* Rule set id -> this CPU's miss-sample budget for the current second. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_sample_budget);
	__uint(max_entries, 4096); /* set by user space: as santa_rulesets */
} santa_sample_budget SEC(".maps");

/* Miss samples for controllers that look for hot requests. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20); /* set by user space */
} santa_miss_samples SEC(".maps");

/* Cookies of closed sockets whose rule sets the release hook unbound. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 16); /* set by user space: room for every rule set's socket */
} santa_released SEC(".maps");

/* Stamp epoch % SANTA_TCP_KEYS -> that epoch's SipHash key (TCP stamps);
 * santad writes each epoch's key before it begins. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, struct santa_tcp_key);
	__uint(max_entries, SANTA_TCP_KEYS);
} santa_tcp_keys SEC(".maps");

/* TCP 4-tuple of a socket-less connection -> the last request eBPF answered
 * on it and where its reply stands. Not an LRU: an entry must not go while
 * its reply is in flight; eBPF deletes it at the client's FIN, santad sweeps
 * idle ones, and a new flow that finds it full goes to the kernel. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct bpf_sock_tuple);
	__type(value, struct santa_tcp_flow);
	__uint(max_entries, SANTA_TCP_FLOWS); /* set by user space */
} santa_tcp_flows SEC(".maps");

/* Index 0: 1 while santad carries the flows of the rule processor it
 * replaced into santa_tcp_flows (from the swap until they are all in):
 * segments that would read or change a flow are dropped, and sent again by
 * their clients, rather than answered from a flow not carried yet. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u32);
	__uint(max_entries, 1);
} santa_tcp_carrying SEC(".maps");

/* Emit the miss sample's layout into BTF for bpf2go (the ring buffer has no value type). */
const struct santa_miss_sample *santa_miss_sample_layout __attribute__((unused));
const enum santa_limit *santa_limit_layout __attribute__((unused));
