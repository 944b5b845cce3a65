/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Internet checksums, computed from scratch (never derived from the request's:
 * locally generated requests carry only a partial checksum).
 * All sums are of 16-bit words as loaded in host order, like the kernel's csum_partial;
 * the folded result is stored as is. */
#pragma once

#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "santa.h"

static __always_inline __u16 csum_fold64(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* Sum of len bytes at p (at most max_words * 8), p[0] taken as the first
 * byte of a 16-bit word: 32-bit halves of 8-byte words, whose sum folds to
 * the same 16-bit sum. p must have 8 readable bytes of slack after len.
 * Inline loads rather than bpf_csum_diff: its call cost more than the
 * sum of a short request. Callers that loop over many words are global
 * functions, so the verifier checks the loop once. */
static __always_inline __u64 csum_words(const __u8 *p, __u32 len, const __u32 max_words)
{
	__u64 sum = 0;
	__u32 i;
	for (i = 0; i < max_words; i++) {
		if (i * 8 + 8 > len)
			break;
		__u64 w = *(const __u64 *)(p + i * 8);
		sum += (__u32)w + (w >> 32);
	}
	__u32 rest = len - i * 8; /* 0..7 when len <= max_words * 8 */
	__u64 w = *(const __u64 *)(p + i * 8) & ((1ull << ((rest & 7) * 8)) - 1);
	return sum + (__u32)w + (w >> 32);
}

/* Sum of len bytes (at most SANTA_REQ_WINDOW) from off of the request window. */
__noinline __u64 santa_csum_req(const struct santa_scratch *s, __u32 off, __u32 len)
{
	if (!s || len > SANTA_REQ_WINDOW)
		return 0;
	return csum_words(s->req + (off & SANTA_OFF_MASK), len, SANTA_REQ_WINDOW / 8);
}

/* Pseudo-header sum of a UDP datagram or TCP segment of l4_len bytes.
 * Symmetric in the addresses, so it serves request and reply alike. */
static __always_inline __u64 csum_pseudo(const struct bpf_sock_tuple *t, __u8 family, __u8 proto,
					 __u32 l4_len)
{
	__u64 sum = bpf_htons(proto) + bpf_htons((__u16)l4_len);
	if (family == 4) {
		sum += t->ipv4.saddr;
		sum += t->ipv4.daddr;
	} else {
#pragma unroll
		for (int i = 0; i < 4; i++)
			sum += t->ipv6.saddr[i] + (__u64)t->ipv6.daddr[i];
	}
	return sum;
}

static __always_inline __u16 csum_swap(__u16 v)
{
	return (v >> 8) | (v << 8);
}
