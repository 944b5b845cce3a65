// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The TCP handover at TC ingress (docs/tcp.md): a segment of a socket-less
 * connection that the XDP responder passed (a request no rule answers, or
 * anything else it does not handle) is given to the kernel with the
 * listener it reached, as a request socket built from the options the stamp
 * carries: the kernel makes the connection's socket from this segment, the
 * application accepts it and reads the byte stream from this segment on. */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "santa.h"
#include "maps.h"
#include "parsing.h"
#include "tcp.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TC_ACT_OK 0

extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk,
				   struct bpf_tcp_req_attrs *attrs, int attrs__sz) __ksym;

/* Ethernet with a tag, IPv6, the longest TCP header. */
#define HEADERS_MAX (18 + 40 + 60)

SEC("tc")
int santa_handover(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP) && skb->protocol != bpf_htons(ETH_P_IPV6) &&
	    skb->protocol != bpf_htons(ETH_P_8021Q))
		return TC_ACT_OK;
	/* the headers in the linear part; the payload may stay in fragments */
	bpf_skb_pull_data(skb, skb->len < HEADERS_MAX ? skb->len : HEADERS_MAX);
	struct pkt_info req = {};
	if (parse_request((void *)(long)skb->data, (void *)(long)skb->data_end, &req, 0) ||
	    req.proto != IPPROTO_TCP)
		return TC_ACT_OK;
	__u32 zero = 0;
	struct santa_scratch *s = bpf_map_lookup_elem(&santa_scratch, &zero);
	if (!s || bpf_skb_load_bytes(skb, req.l2_len + req.l3_len, s->l4, NONZERO(req.l4_len, 63)))
		return TC_ACT_OK;
	__u8 flags = tcp_flags((struct tcphdr *)s->l4);
	if ((flags & (TCP_SYN | TCP_RST | TCP_ACK)) != TCP_ACK)
		return TC_ACT_OK;
	struct tcp_opts o = {};
	tcp_parse_options(s, req.l4_len, &o);
	__u32 opts;
	int fin;
	__u64 age;
	if (!o.has_ts || !stamp_check(&req, o.tsecr, stamp_unit(), &opts, &fin, &age))
		return TC_ACT_OK;

	__u32 tuple_len = req.family == 4 ? sizeof(req.tuple.ipv4) : sizeof(req.tuple.ipv6);
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &req.tuple, tuple_len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return TC_ACT_OK;
	if (sk->state != BPF_TCP_LISTEN) /* the kernel has it already */
		goto release;
	struct sock *listener = (struct sock *)bpf_skc_to_tcp_sock(sk);
	if (!listener)
		goto release;
	__u8 ws = opts_wscale(opts);
	struct bpf_tcp_req_attrs attrs = {
		.rcv_tsval = o.tsval,
		.rcv_tsecr = o.tsecr,
		.mss = opts_mss(opts),
		.rcv_wscale = ws == OPTS_NO_WSCALE ? 0 : SANTA_TCP_WSCALE,
		.snd_wscale = ws == OPTS_NO_WSCALE ? 0 : ws,
		.wscale_ok = ws != OPTS_NO_WSCALE,
		.sack_ok = opts_sack(opts),
		.tstamp_ok = 1,
	};
	if (bpf_sk_assign_tcp_reqsk(skb, listener, &attrs, sizeof(attrs)) == 0)
		COUNT(tcp_handed_over);
	else
		COUNT(tcp_handover_failed);
release:
	bpf_sk_release(sk);
	return TC_ACT_OK;
}
