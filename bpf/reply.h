/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Reply headers, built in a buffer from the request's: shared by the XDP
 * responder and the TC segment emitter. */
#pragma once

#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "parsing.h"
#include "csum.h"

/* Swap the MAC and IP addresses of the request's headers at hdr. */
static __always_inline void reverse_addresses(__u8 *hdr, const struct pkt_info *req)
{
	struct ethhdr *eth = (void *)hdr;
	__u8 mac[6];
	__builtin_memcpy(mac, eth->h_dest, 6);
	__builtin_memcpy(eth->h_dest, eth->h_source, 6);
	__builtin_memcpy(eth->h_source, mac, 6);
	__u32 l3 = req->l2_len == 14 ? 14 : 18;
	if (req->family == 4) {
		struct iphdr *ip = (void *)hdr + l3;
		__be32 a = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = a;
	} else {
		struct ipv6hdr *ip6 = (void *)hdr + l3;
		struct in6_addr a = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = a;
	}
}

/* Set the IP header at hdr for a reply with a transport segment of l4_len
 * bytes: length, fixed fields, header checksum. */
static __always_inline void set_l3_lengths(__u8 *hdr, const struct pkt_info *req, __u32 l4_len)
{
	__u32 l3 = req->l2_len == 14 ? 14 : 18;
	if (req->family == 4) {
		struct iphdr *ip = (void *)hdr + l3;
		ip->tos = 0;
		ip->tot_len = bpf_htons(sizeof(*ip) + l4_len);
		ip->id = 0;
		ip->frag_off = bpf_htons(0x4000); /* DF */
		ip->ttl = 64;
		ip->check = 0;
		ip->check = ~ipv4_header_sum(ip); /* inline: cheaper than bpf_csum_diff's call */
	} else {
		struct ipv6hdr *ip6 = (void *)hdr + l3;
		*(__be32 *)ip6 = bpf_htonl(0x60000000); /* version, no class, no flow label */
		ip6->payload_len = bpf_htons(l4_len);
		ip6->hop_limit = 64;
	}
}
