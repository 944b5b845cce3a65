/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Internet checksums, computed from scratch (never derived from the request's:
 * locally generated requests carry only a partial checksum).
 * All sums are of 16-bit words as loaded in host order, like the kernel's csum_partial;
 * the folded result is stored as is. */
#pragma once

#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

static __always_inline __u16 csum_fold64(__u64 sum)
{
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffffffff) + (sum >> 32);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return (__u16)sum;
}

/* Sum of len bytes at p, p[0] taken as the first byte of a 16-bit word.
 * p must have 3 readable bytes of slack after len. */
static __always_inline __u64 csum_bytes(const __u8 *p, __u32 len)
{
	__u32 whole = len & ~3u;
	__u64 sum = 0;

	/* bpf_csum_diff takes at most 512 bytes, a multiple of 4 */
	for (__u32 i = 0; i < (SANTA_REQ_WINDOW + 511) / 512; i++) {
		__u32 off = i * 512;
		if (off >= whole)
			break;
		__u32 n = whole - off;
		if (n > 512)
			n = 512;
		sum += (__u32)bpf_csum_diff(NULL, 0, (void *)(p + off), NONZERO(n, 511), 0);
	}
	__u32 tail = 0, rest = len & 3;
	const __u8 *t = p + (whole & 2047);
	if (rest > 0)
		((__u8 *)&tail)[0] = t[0];
	if (rest > 1)
		((__u8 *)&tail)[1] = t[1];
	if (rest > 2)
		((__u8 *)&tail)[2] = t[2];
	return sum + tail;
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
