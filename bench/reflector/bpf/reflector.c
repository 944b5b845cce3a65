// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* A bare XDP reflector: the benchmark's physical limit on the veth testbed.
 *
 * It sends every UDP datagram for the configured port straight back where it
 * came from: MAC, IP addresses and UDP ports swapped, XDP_TX. The payload is
 * left as it is (a DNS query comes back as a query). Swapping addresses does
 * not change the IPv4 header checksum or the UDP checksum (both are sums over
 * the swapped fields), so nothing is recomputed. Everything else (other
 * ports, IPv4 options, fragments, IPv6 extension headers, VLAN) is passed. */
#include "../../../bpf/include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define ETH_ALEN 6
#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IP_MF 0x2000
#define IP_OFFSET 0x1FFF

/* UDP destination port to reflect, host byte order; 0 reflects every port.
 * Set by the loader before loading (bpf2go: spec.Variables). */
volatile const __u16 reflect_port = 53;

/* Packets reflected, per CPU (index 0). */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} reflected SEC(".maps");

static __always_inline void swap_mac(struct ethhdr *eth)
{
	unsigned char tmp[ETH_ALEN];

	__builtin_memcpy(tmp, eth->h_source, ETH_ALEN);
	__builtin_memcpy(eth->h_source, eth->h_dest, ETH_ALEN);
	__builtin_memcpy(eth->h_dest, tmp, ETH_ALEN);
}

static __always_inline int reflect_udp(struct udphdr *udp, void *end)
{
	__be16 port;

	if ((void *)(udp + 1) > end)
		return 0;
	if (reflect_port && udp->dest != bpf_htons(reflect_port))
		return 0;
	port = udp->source;
	udp->source = udp->dest;
	udp->dest = port;
	return 1;
}

SEC("xdp")
int reflector(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	__u32 zero = 0;
	__u64 *cnt;

	if ((void *)(eth + 1) > end)
		return XDP_PASS;

	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		__be32 addr;

		if ((void *)(ip + 1) > end)
			return XDP_PASS;
		if (ip->ihl != 5 || ip->protocol != IPPROTO_UDP ||
		    (ip->frag_off & bpf_htons(IP_MF | IP_OFFSET)))
			return XDP_PASS;
		if (!reflect_udp((void *)(ip + 1), end))
			return XDP_PASS;
		addr = ip->saddr;
		ip->saddr = ip->daddr;
		ip->daddr = addr;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		struct in6_addr addr;

		if ((void *)(ip6 + 1) > end)
			return XDP_PASS;
		if (ip6->nexthdr != IPPROTO_UDP)
			return XDP_PASS;
		if (!reflect_udp((void *)(ip6 + 1), end))
			return XDP_PASS;
		addr = ip6->saddr;
		ip6->saddr = ip6->daddr;
		ip6->daddr = addr;
	} else {
		return XDP_PASS;
	}

	swap_mac(eth);
	cnt = bpf_map_lookup_elem(&reflected, &zero);
	if (cnt)
		(*cnt)++;
	return XDP_TX;
}
