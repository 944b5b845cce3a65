/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The region-hash matcher (paper §2.2): a 32-bit hash of each region of the
 * request (eight bytes per step), a bucket per (rule set, region, truncated
 * hash), candidates checked by stored hash, then region identity, then every
 * condition byte by byte. */
#pragma once

#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "santa.h"
#include "maps.h"

#define REGION_HASH_BASIS 0xcbf29ce484222325ull
#define REGION_HASH_PRIME 0x9e3779b97f4a7c15ull

/* Set by user space before loading. */
volatile const __u32 bucket_mask = (1 << 20) - 1; /* 2^hash_bits - 1 */
volatile const __u32 bucket_seed = 0;             /* keeps bucket positions unpredictable */

/* Bucket of (rule set, region, hash), in the rule set's part of the table.
 * internal/dataplane/bucket.go has the twin. */
static __always_inline __u32 bucket_of(__u32 ruleset, const struct santa_ruleset *rs,
				       struct santa_region r, __u32 hash)
{
	__u32 x = hash ^ bucket_seed ^ (ruleset * 0x9E3779B1u) ^
		  ((((__u32)r.off << 16) | r.len) * 0x85EBCA6Bu);
	x ^= x >> 16;
	x *= 0x7FEB352Du;
	x ^= x >> 15;
	x *= 0x846CA68Bu;
	x ^= x >> 16;
	return (rs->buckets_base | (x & rs->buckets_mask)) & bucket_mask;
}

/* The len pattern bytes at data in page equal the request bytes at off;
 * with masked, only in the bits set in the mask that follows the pattern at
 * the next 8-byte boundary. Inlined into one global function per case, so
 * unmasked patterns pay nothing for masks. */
static __always_inline int pattern_equal(const struct santa_scratch *s, __u32 off,
					 const struct santa_page *page, __u32 data, __u32 len,
					 const int masked)
{
	if (!s || !page || len > SANTA_MAX_PATTERN)
		return 0;
	data &= SANTA_PAGE_DATA - 1;
	const __u8 *a = s->req + (off & SANTA_OFF_MASK);
	const __u8 *b = page->b + data;
	const __u8 *m = page->b + ((data + ((len + 7) & ~7u)) & (SANTA_PAGE_DATA - 1));
	__u32 i;
	for (i = 0; i < SANTA_MAX_PATTERN / 8; i++) {
		if (i * 8 + 8 > len)
			break;
		__u64 diff = *(const __u64 *)(a + i * 8) ^ *(const __u64 *)(b + i * 8);
		if (masked)
			diff &= *(const __u64 *)(m + i * 8);
		if (diff)
			return 0;
	}
	__u32 rest = len - i * 8;
	if (rest == 0)
		return 1;
	/* compare the last 1..7 bytes; the buffers have slack to read 8 */
	__u64 tail = (1ull << ((rest & 7) * 8)) - 1;
	i &= SANTA_MAX_PATTERN / 8 - 1;
	if (masked)
		tail &= *(const __u64 *)(m + i * 8);
	return ((*(const __u64 *)(a + i * 8) ^ *(const __u64 *)(b + i * 8)) & tail) == 0;
}

/* Global functions, so the verifier checks each loop once rather than for
 * every condition of every candidate of every region. */
__noinline int santa_pattern_equal(const struct santa_scratch *s, __u32 off,
				   const struct santa_page *page, __u32 data, __u32 len)
{
	return pattern_equal(s, off, page, data, len, 0);
}

__noinline int santa_pattern_equal_masked(const struct santa_scratch *s, __u32 off,
					  const struct santa_page *page, __u32 data, __u32 len)
{
	return pattern_equal(s, off, page, data, len, 1);
}

/* One step of the region hash: eight request bytes, little-endian, into h.
 * Both halves of a step are invertible, so regions that differ in one word
 * never reach the same 64-bit state; the shift brings the high bits, which
 * the multiplication mixes best, down to where the next one spreads them.
 * internal/dataplane/bucket.go has the twin. */
static __always_inline __u64 region_hash_step(__u64 h, __u64 word)
{
	h = (h ^ word) * REGION_HASH_PRIME;
	return h ^ (h >> 32);
}

/* The 32-bit hash of request bytes [off, end): a step per whole 8-byte word,
 * one more for the 0-7 bytes left, and the high half of that last product,
 * whose every bit depends on all the bits below it. One multiplication per
 * eight bytes where FNV-1a, which this replaced, chained eight. Regions at one
 * offset are nested and come sorted by length, so the pass in s->probe
 * carries on from the last one's whole words. The scratch has slack to read
 * 8 bytes past any region. A global function: the verifier checks its loop
 * once, and the caller keeps its registers (and its short stack). */
__noinline __u32 santa_region_hash(struct santa_scratch *s, __u32 off, __u32 end)
{
	if (!s)
		return 0;
	struct santa_region_probe *p = &s->probe;
	__u64 h = p->state;
	__u32 pos = p->pos;
	if (off != p->off || pos > end) {
		h = REGION_HASH_BASIS;
		pos = off;
	}
	for (__u32 j = 0; j < SANTA_MAX_REGION_LEN / 8; j++) {
		if (pos + 8 > end)
			break;
		h = region_hash_step(h, *(const __u64 *)(s->req + (pos & SANTA_OFF_MASK)));
		pos += 8;
	}
	p->state = h;
	p->off = off;
	p->pos = pos;
	__u64 tail = *(const __u64 *)(s->req + (pos & SANTA_OFF_MASK)) &
		     ((1ull << ((end - pos) & 7) * 8) - 1);
	return region_hash_step(h, tail) >> 32;
}

/* What a rule walk noticed besides its result. */
struct match_notes {
	__u8 truncated;   /* a chain had more than SANTA_MAX_CHAIN rules */
	__u8 invalidated; /* a rule's conditions held but a guard did not */
	__u8 expired;     /* a rule's conditions held but its expires time had come */
};

/* State of one bucket-chain walk (bpf_loop callback context). */
struct chain_walk {
	__u32 slot;        /* next rule slot to look at, 0 = end of chain */
	__u32 ruleset;
	__u32 hash;
	struct santa_region region;
	__u32 payload_len;
	__u32 disjoint;    /* stop at the first match */
	__u32 generation;  /* the rule set's visible generation */
	__u32 best;        /* best matching rule slot so far, 0 = none */
	struct match_notes notes;
	__u32 best_priority;
	__u32 best_order;
};

/* Every condition of rule r holds for the request in scratch s. */
static __always_inline int rule_matches(const struct santa_rule *r, const struct santa_scratch *s,
					__u32 payload_len)
{
	if (payload_len < r->min_len || payload_len > r->max_len)
		return 0;
	__u32 page_id = r->page;
	const struct santa_page *page = bpf_map_lookup_elem(&santa_pages, &page_id);
	if (!page)
		return 0;
	for (__u32 k = 0; k < SANTA_MAX_CONDS; k++) {
		if (k >= r->nconds)
			break;
		const struct santa_cond *c = rule_cond(r, k);
		__u32 off = c->off, len = c->len;
		if (off + len > payload_len || len > SANTA_MAX_PATTERN)
			return 0;
		int equal = c->data & SANTA_COND_MASKED ?
				    santa_pattern_equal_masked(s, off, page, c->data, len) :
				    santa_pattern_equal(s, off, page, c->data, len);
		if (!equal)
			return 0;
	}
	return 1;
}

/* Every guard of rule r still holds its version. */
static __always_inline int guards_hold(const struct santa_rule *r)
{
	for (__u32 k = 0; k < SANTA_MAX_GUARDS; k++) {
		if (k >= r->nguards)
			break;
		__u32 slot = r->guards[k].slot;
		const __u64 *v = bpf_map_lookup_elem(&santa_guards, &slot);
		if (!v || *(volatile const __u64 *)v != r->guards[k].version)
			return 0;
	}
	return 1;
}

/* Start loading what answering with the rule in slot reads besides its
 * first line: its data lines (where hint says), its second line (conditions
 * 1 and 2, guards, expiry) and its counters. With many rules each is a
 * cache miss; asked for while the rule's first line loads, they overlap it
 * rather than follow it. Global, so the verifier checks it once. */
__noinline int santa_warm_rule(__u32 slot, __u32 hint)
{
	__u32 page_id = hint >> 16;
	const struct santa_page *page = bpf_map_lookup_elem(&santa_pages, &page_id);
	if (page) {
		const __u8 *first = page->b + ((hint >> 2) * 64 & (SANTA_PAGE_DATA - 1));
		__u32 more = hint & 3; /* lines after the first; the page has slack past its data */
		(void)*(volatile const __u8 *)first;
		if (more > 0)
			(void)*(volatile const __u8 *)(first + 64);
		if (more > 1)
			(void)*(volatile const __u8 *)(first + 128);
		if (more > 2)
			(void)*(volatile const __u8 *)(first + 192);
	}
	const struct santa_rule *r = bpf_map_lookup_elem(&santa_rules, &slot);
	if (r)
		(void)*(volatile const __u64 *)&r->expires;
	struct santa_rule_counters *c = bpf_map_lookup_elem(&santa_rule_stats, &slot);
	if (c)
		(void)*(volatile const __u64 *)&c->hits;
	return 0;
}

static long chain_step(__u32 i, struct chain_walk *w)
{
	__u32 slot = w->slot;
	if (!slot)
		return 1;
	const struct santa_rule *r = bpf_map_lookup_elem(&santa_rules, &slot);
	if (!r)
		return 1;
	w->slot = r->next;
	/* two-stage collision resolution: the full hash, then the region */
	if (r->ruleset != w->ruleset || r->hash != w->hash ||
	    r->region.off != w->region.off || r->region.len != w->region.len ||
	    r->generation > w->generation)
		return 0;
	if (w->best && (r->priority > w->best_priority ||
			(r->priority == w->best_priority && r->order >= w->best_order)))
		return 0;
	__u32 zero = 0;
	const struct santa_scratch *s = bpf_map_lookup_elem(&santa_scratch, &zero);
	if (!s || !rule_matches(r, s, w->payload_len))
		return 0;
	if (!guards_hold(r)) {
		w->notes.invalidated = 1;
		return 0;
	}
	/* santad removes a rule within the second its time comes; this
	 * holds the rule to its time exactly, and while no santad runs */
	if (r->flags & SANTA_RULE_EXPIRES && bpf_ktime_get_coarse_ns() >= r->expires) {
		w->notes.expired = 1;
		return 0;
	}
	w->best = slot;
	w->best_priority = r->priority;
	w->best_order = r->order;
	return w->disjoint ? 1 : 0;
}

/* The best rule of rule set rs_id for the request in s, 0 if none, with
 * what the walk noticed on the way in *notes.
 * Regions are hashed in ascending order (one pass per offset), and
 * their bucket heads loaded in the same pass: the loads do not depend on each
 * other, so their cache misses overlap. Chains are then walked longest
 * region first: a rule hangs on the longest region its anchor covers, so a
 * request is most often answered by the longest region it fits, and a
 * disjoint rule set stops there. The best rule does not depend on the order. */
static __always_inline __u32 match_rules(__u32 rs_id, const struct santa_ruleset *rs,
					 struct santa_scratch *s, __u32 payload_len,
					 struct match_notes *notes)
{
	struct chain_walk w = {
		.ruleset = rs_id,
		.payload_len = payload_len,
		.disjoint = rs->flags & SANTA_RULESET_DISJOINT,
		.generation = rs->generation,
	};
	__u32 *hashes = s->probe.hash;
	struct santa_bucket *heads = s->probe.bucket;
	s->probe.off = SANTA_NO_PASS;

	for (__u32 ri = 0; ri < SANTA_MAX_REGIONS; ri++) {
		heads[ri].head = 0;
		if (ri >= rs->nregions)
			continue;
		struct santa_region reg = rs->regions[ri];
		__u32 end = (__u32)reg.off + reg.len;
		if (end > payload_len || reg.len > SANTA_MAX_REGION_LEN)
			continue;
		__u32 hash = santa_region_hash(s, reg.off, end);
		hashes[ri] = hash;
		struct santa_len_range lens = rs->lens[ri];
		if (payload_len < lens.min || payload_len > lens.max)
			continue; /* no rule on this region answers requests this long */
		__u32 bucket = bucket_of(rs_id, rs, reg, hash);
		struct santa_bucket *b = bpf_map_lookup_elem(&santa_buckets, &bucket);
		if (b)
			heads[ri] = *b;
	}
	for (int ri = SANTA_MAX_REGIONS - 1; ri >= 0; ri--) {
		if (!heads[ri].head)
			continue;
		w.slot = heads[ri].head;
		/* smaller rule sets stay in the cache: warming would only cost its call */
		if (rs->buckets_mask >= SANTA_WARM_MIN_BUCKETS - 1)
			santa_warm_rule(w.slot, heads[ri].hint);
		w.hash = hashes[ri];
		w.region = rs->regions[ri];
		/* most chains hold one rule: look at it before paying for bpf_loop */
		if (!chain_step(0, &w) && w.slot)
			bpf_loop(SANTA_MAX_CHAIN - 1, chain_step, &w, 0);
		if (w.slot && !(w.disjoint && w.best))
			w.notes.truncated = 1;
		if (w.disjoint && w.best)
			break;
	}
	*notes = w.notes;
	return w.best;
}
