/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Packet parsing through a cursor, in the style of xdp-tools' parsing_helpers.h:
 * every helper bounds-checks and either advances the cursor or reports why not. */
#pragma once

#include "include/vmlinux.h"
#include <bpf/bpf_endian.h>

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define ETH_P_8021Q 0x8100
#define VLAN_VID_MASK 0x0fff
#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF
#define NEXTHDR_UDP 17
#define NEXTHDR_TCP 6

struct cursor {
	void *pos;
	void *end;
};

/* What the parser learned about a UDP datagram or TCP segment; offsets are
 * from the frame start. */
struct pkt_info {
	__u32 l2_len;      /* 14, or 18 with an 802.1Q tag */
	__u32 l3_len;      /* 20 or 40 */
	__u32 l4_len;      /* transport header: 8 (UDP), 20..60 (TCP) */
	__u32 payload_off; /* l2_len + l3_len + l4_len */
	__u32 payload_len; /* payload bytes (excluding any Ethernet padding) */
	__u8 family;       /* 4 or 6 */
	__u8 proto;        /* IPPROTO_UDP or IPPROTO_TCP */
	__u16 l4_check;    /* the transport header's checksum field, as on the wire */
	struct bpf_sock_tuple tuple;
};

/* Parse results: a request, or a pass reason for the counters. */
enum parse_result {
	PARSE_OK = 0,
	PARSE_NOT_IP,
	PARSE_NOT_UNICAST,
	PARSE_NOT_UDP_TCP,
	PARSE_IP_OPTIONS,
	PARSE_IPV6_EXT,
	PARSE_FRAGMENT,
	PARSE_MALFORMED,
	PARSE_BAD_ADDRESS,
	PARSE_VLAN,
};

/* IPv4 addresses no unicast host has: 0/8, 127/8, 224/4 and above
 * (multicast, reserved, broadcast). The kernel drops such sources as
 * martians; a reply to or from them must not be sent. */
static __always_inline int ipv4_not_unicast(__be32 a)
{
	__u8 first = bpf_ntohl(a) >> 24;
	return first == 0 || first == 127 || first >= 224;
}

/* IPv6 ::, ::1 and multicast ff00::/8. */
static __always_inline int ipv6_not_unicast(const struct in6_addr *a)
{
	if (a->in6_u.u6_addr8[0] == 0xff)
		return 1;
	return (a->in6_u.u6_addr32[0] | a->in6_u.u6_addr32[1] | a->in6_u.u6_addr32[2]) == 0 &&
	       (a->in6_u.u6_addr32[3] == 0 || a->in6_u.u6_addr32[3] == bpf_htonl(1));
}

/* The folded sum of the 20-byte IPv4 header at ip (without options). */
static __always_inline __u16 ipv4_header_sum(const struct iphdr *ip)
{
	const __u16 *w = (const __u16 *)ip;
	__u32 sum = 0;
#pragma unroll
	for (int i = 0; i < 10; i++)
		sum += w[i];
	sum = (sum & 0xffff) + (sum >> 16);
	sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

/* The IPv4 header checksum holds: the kernel drops the packet otherwise. */
static __always_inline int ipv4_header_ok(const struct iphdr *ip)
{
	return ipv4_header_sum(ip) == 0xffff;
}

/* The request's destination port, host order: the local port it is for. */
static __always_inline __u16 local_port(const struct pkt_info *req)
{
	return bpf_ntohs(req->family == 4 ? req->tuple.ipv4.dport : req->tuple.ipv6.dport);
}

static __always_inline void set_ports(struct pkt_info *req, __be16 sport, __be16 dport)
{
	if (req->family == 4) {
		req->tuple.ipv4.sport = sport;
		req->tuple.ipv4.dport = dport;
	} else {
		req->tuple.ipv6.sport = sport;
		req->tuple.ipv6.dport = dport;
	}
}

static __always_inline int parse_eth(struct cursor *c, __u16 *proto, __u32 *l2_len)
{
	struct ethhdr *eth = c->pos;
	if ((void *)(eth + 1) > c->end)
		return PARSE_MALFORMED;
	if (eth->h_dest[0] & 1) /* group bit: multicast or broadcast */
		return PARSE_NOT_UNICAST;
	c->pos = eth + 1;
	*proto = eth->h_proto;
	*l2_len = sizeof(*eth);
	if (*proto == bpf_htons(ETH_P_8021Q)) {
		struct vlan_hdr *vlan = c->pos;
		if ((void *)(vlan + 1) > c->end)
			return PARSE_MALFORMED;
		/* the kernel hands a frame of VLAN n > 0 to the host's device for
		 * that VLAN, if any, which may have other sockets, or sit in another
		 * namespace; VLAN 0 only carries a priority */
		if (vlan->h_vlan_TCI & bpf_htons(VLAN_VID_MASK))
			return PARSE_VLAN;
		c->pos = vlan + 1;
		*proto = vlan->h_vlan_encapsulated_proto;
		*l2_len += sizeof(*vlan);
	}
	return PARSE_OK;
}

/* IPv4 without options, not a fragment, carrying UDP or TCP. Sets *l4_len from tot_len. */
static __always_inline int parse_ipv4(struct cursor *c, struct pkt_info *req, __u32 *l4_len,
				      int whole)
{
	struct iphdr *ip = c->pos;
	if ((void *)(ip + 1) > c->end)
		return PARSE_MALFORMED;
	if (ip->version != 4 || ip->ihl < 5)
		return PARSE_MALFORMED;
	if (ip->ihl != 5)
		return PARSE_IP_OPTIONS;
	if (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET))
		return PARSE_FRAGMENT;
	if (ip->protocol != IPPROTO_UDP && ip->protocol != IPPROTO_TCP)
		return PARSE_NOT_UDP_TCP;
	if (!ipv4_header_ok(ip))
		return PARSE_MALFORMED;
	if (ipv4_not_unicast(ip->saddr) || ipv4_not_unicast(ip->daddr))
		return PARSE_BAD_ADDRESS;
	__u32 tot = bpf_ntohs(ip->tot_len);
	if (tot < sizeof(*ip) + sizeof(struct udphdr) || (whole && (void *)ip + tot > c->end))
		return PARSE_MALFORMED;
	req->family = 4;
	req->proto = ip->protocol;
	req->l3_len = sizeof(*ip);
	req->tuple.ipv4.saddr = ip->saddr;
	req->tuple.ipv4.daddr = ip->daddr;
	*l4_len = tot - sizeof(*ip);
	c->pos = ip + 1;
	return PARSE_OK;
}

static __always_inline int ipv6_is_ext(__u8 nexthdr)
{
	switch (nexthdr) {
	case 0:   /* hop-by-hop */
	case 43:  /* routing */
	case 44:  /* fragment */
	case 50:  /* ESP */
	case 51:  /* AH */
	case 60:  /* destination options */
	case 135: /* mobility */
	case 139: /* HIP */
	case 140: /* shim6 */
	case 253:
	case 254: /* experimental */
		return 1;
	}
	return 0;
}

/* IPv6 with UDP or TCP directly after the fixed header. */
static __always_inline int parse_ipv6(struct cursor *c, struct pkt_info *req, __u32 *l4_len,
				      int whole)
{
	struct ipv6hdr *ip6 = c->pos;
	if ((void *)(ip6 + 1) > c->end)
		return PARSE_MALFORMED;
	if (ip6->version != 6)
		return PARSE_MALFORMED;
	if (ipv6_is_ext(ip6->nexthdr))
		return PARSE_IPV6_EXT;
	if (ip6->nexthdr != NEXTHDR_UDP && ip6->nexthdr != NEXTHDR_TCP)
		return PARSE_NOT_UDP_TCP;
	if (ipv6_not_unicast(&ip6->saddr) || ipv6_not_unicast(&ip6->daddr))
		return PARSE_BAD_ADDRESS;
	__u32 plen = bpf_ntohs(ip6->payload_len);
	if (plen < sizeof(struct udphdr) || (whole && (void *)(ip6 + 1) + plen > c->end))
		return PARSE_MALFORMED;
	req->family = 6;
	req->proto = ip6->nexthdr;
	req->l3_len = sizeof(*ip6);
	__builtin_memcpy(req->tuple.ipv6.saddr, &ip6->saddr, 16);
	__builtin_memcpy(req->tuple.ipv6.daddr, &ip6->daddr, 16);
	*l4_len = plen;
	c->pos = ip6 + 1;
	return PARSE_OK;
}

/* A UDP header whose length agrees with the IP layer's. */
static __always_inline int parse_udp(struct cursor *c, struct pkt_info *req, __u32 l4_len)
{
	struct udphdr *udp = c->pos;
	if ((void *)(udp + 1) > c->end)
		return PARSE_MALFORMED;
	if (bpf_ntohs(udp->len) != l4_len)
		return PARSE_MALFORMED;
	set_ports(req, udp->source, udp->dest);
	req->l4_check = udp->check;
	req->l4_len = sizeof(*udp);
	req->payload_len = l4_len - sizeof(*udp);
	return PARSE_OK;
}

/* A TCP header (options included) within the IP layer's length. */
static __always_inline int parse_tcp(struct cursor *c, struct pkt_info *req, __u32 l4_len)
{
	struct tcphdr *th = c->pos;
	if ((void *)(th + 1) > c->end)
		return PARSE_MALFORMED;
	__u32 doff = th->doff * 4;
	if (doff < sizeof(*th) || doff > l4_len)
		return PARSE_MALFORMED;
	set_ports(req, th->source, th->dest);
	req->l4_check = th->check;
	req->l4_len = doff;
	req->payload_len = l4_len - doff;
	return PARSE_OK;
}

/* Parse Ethernet (+802.1Q), IPv4/IPv6 and UDP or TCP in [data, end) into
 * *req. With whole, the payload must be in [data, end) too (XDP); else only
 * the headers up to the transport header's first 20 bytes (a TC skb's
 * linear part). */
static __always_inline int parse_request(void *data, void *end, struct pkt_info *req, int whole)
{
	struct cursor c = { .pos = data, .end = end };
	__u16 proto;
	__u32 l4_len;
	int err = parse_eth(&c, &proto, &req->l2_len);
	if (err)
		return err;
	if (proto == bpf_htons(ETH_P_IP))
		err = parse_ipv4(&c, req, &l4_len, whole);
	else if (proto == bpf_htons(ETH_P_IPV6))
		err = parse_ipv6(&c, req, &l4_len, whole);
	else
		return PARSE_NOT_IP;
	if (err)
		return err;
	err = req->proto == IPPROTO_UDP ? parse_udp(&c, req, l4_len) : parse_tcp(&c, req, l4_len);
	if (err)
		return err;
	req->payload_off = req->l2_len + req->l3_len + req->l4_len;
	return PARSE_OK;
}
