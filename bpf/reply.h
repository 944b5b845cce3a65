/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Reply headers and payload sums, built in a buffer from the request's:
 * shared by the XDP responder and the TC emitters (TCP segments, UDP
 * replies the XDP frame had no room for). */
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
/* The request bits masked copy cp of rule r puts into the reply: its 8
 * request bytes under its mask (zero past cp->len). */
static __always_inline __u64 masked_copy_bits(const struct santa_scratch *s, const struct santa_page *page,
					      const struct santa_rule *r, const struct santa_copy *cp)
{
	__u64 mask = *(const __u64 *)(page->b + ((r->tpl + cp->mask) & (SANTA_PAGE_DATA - 1)));
	return *(const __u64 *)(s->req + (cp->src & SANTA_OFF_MASK)) & mask;
}

/* The sum of rule r's reply payload: the template with the copies in its
 * zeroed gaps (a masked copy's bits in its zeroed bits), so the template's
 * sum plus the copies', each at its offset's parity. */
static __always_inline __u64 reply_payload_sum(const struct santa_scratch *s, const struct santa_rule *r,
					       const struct santa_page *page)
{
	__u64 sum = r->tpl_csum;
	for (__u32 k = 0; k < SANTA_MAX_COPIES; k++) {
		if (k >= r->ncopies)
			break;
		const struct santa_copy *cp = rule_copy(r, k);
		__u64 copied = cp->mask ? masked_copy_bits(s, page, r, cp) :
			     cp->len <= 8 ? csum_words(s->req + (cp->src & SANTA_OFF_MASK), cp->len, 1) :
					    santa_csum_req(s, cp->src, cp->len);
		__u16 part = csum_fold64(copied);
		sum += (cp->dst & 1) ? csum_swap(part) : part;
	}
	return sum;
}

/* Write rule r's UDP header into s->hdr after the reply's Ethernet and IP
 * headers (l23 bytes, already the reply's): ports swapped, length, and the
 * checksum of the payload the template and copies make (the request's
 * payload in s->req), or with partial only the pseudo-header sum, for
 * whatever sends the reply on to complete (a CHECKSUM_PARTIAL skb at TC).
 * Returns the headers' length. */
static __always_inline __u32 write_udp_header(struct santa_scratch *s, __u32 l23, const struct pkt_info *req,
					      const struct santa_rule *r, const struct santa_page *page, int partial)
{
	__u32 l4_len = sizeof(struct udphdr) + r->reply_len;
	barrier_var(l23); /* keep the mask below for the verifier */
	struct udphdr *udp = (void *)s->hdr + (l23 & 63);
	udp->source = req->family == 4 ? req->tuple.ipv4.dport : req->tuple.ipv6.dport;
	udp->dest = req->family == 4 ? req->tuple.ipv4.sport : req->tuple.ipv6.sport;
	udp->len = bpf_htons(l4_len);
	udp->check = 0;
	__u64 pseudo = csum_pseudo(&req->tuple, req->family, IPPROTO_UDP, l4_len);
	if (partial) {
		udp->check = csum_fold64(pseudo);
		return l23 + sizeof(*udp);
	}
	__u64 sum = pseudo + udp->source + udp->dest + udp->len + reply_payload_sum(s, r, page);
	__u16 check = ~csum_fold64(sum);
	udp->check = check ? check : 0xffff;
	return l23 + sizeof(*udp);
}
