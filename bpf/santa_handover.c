// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The rule processor at TC ingress: what XDP passes to it to send, and the
 * socket-less TCP path's handover (docs/tcp.md, docs/matching.md):
 *
 * - Replies of several segments: the XDP responder passes the request with
 *   metadata (struct santa_tcp_emit) and this hook sends the segments, each a
 *   clone of the request rewritten, and drops the request.
 * - UDP replies the XDP frame had no room for (veth's copies of a local
 *   sender's frames): the XDP responder passes the request with metadata
 *   (struct santa_udp_emit), and this hook rewrites it into the reply.
 * - The handover: a segment of a socket-less connection that the XDP
 *   responder passed (a request no rule answers, or anything else it does
 *   not handle) is given to the kernel with the listener it reached, as a
 *   request socket built from the options the stamp carries: the kernel makes
 *   the connection's socket from this segment, the application accepts it
 *   and reads the byte stream from this segment on. */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "santa.h"
#include "maps.h"
#include "parsing.h"
#include "csum.h"
#include "reply.h"
#include "tcp.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define TC_ACT_OK 0
#define TC_ACT_SHOT 2

extern int bpf_sk_assign_tcp_reqsk(struct __sk_buff *skb, struct sock *sk,
				   struct bpf_tcp_req_attrs *attrs, int attrs__sz) __ksym;

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

#define SKB_CHECKSUM_PARTIAL 3 /* CHECKSUM_PARTIAL, include/linux/skbuff.h */

/* The skb is CHECKSUM_PARTIAL: a request from a local sender, on a veth.
 * Its rewrite into a reply keeps that state, so whatever sends the reply on
 * completes its checksum from the field (the kernel itself where the device
 * does not offload checksums: from a complete checksum it would make a
 * wrong one), and a veth peer takes it unchecked. Such a reply carries the
 * pseudo-header sum, as a local sender's segment does; any other the
 * complete checksum. */
static __always_inline int checksum_partial(struct __sk_buff *skb)
{
	struct sk_buff *kskb = bpf_cast_to_kern_ctx(skb);
	return BPF_CORE_READ_BITFIELD(kskb, ip_summed) == SKB_CHECKSUM_PARTIAL;
}

/* Ethernet with a tag, IPv6, the longest TCP header. */
#define HEADERS_MAX (18 + 40 + 60)

/* One segment of a long reply: where it stands. */
struct emit_state {
	struct santa_tcp_emit e;
	__u32 l23;
	__u32 reply_len;
	__u32 unit_lo, unit_hi; /* stamp_unit() */
};

/* Write rule r's copies of the request in s->req over its template, which
 * the skb holds from offset at on. */
static __always_inline int store_copies(struct __sk_buff *skb, struct santa_scratch *s,
					const struct santa_page *page, const struct santa_rule *r, __u32 at)
{
	for (__u32 k = 0; k < SANTA_MAX_COPIES; k++) {
		if (k >= r->ncopies)
			break;
		const struct santa_copy *cp = rule_copy(r, k);
		int err;
		if (cp->mask) { /* the template has zeros where its bits go */
			s->copy_word = masked_copy_bits(s, page, r, cp) |
				       *(const __u64 *)(page->b + ((r->tpl + cp->dst) & (SANTA_PAGE_DATA - 1)));
			err = bpf_skb_store_bytes(skb, at + cp->dst, &s->copy_word,
						  NONZERO(cp->len, SANTA_MAX_COPY_MASK - 1), 0);
		} else {
			err = bpf_skb_store_bytes(skb, at + cp->dst, s->req + (cp->src & SANTA_OFF_MASK),
						  NONZERO(cp->len, SANTA_OFF_MASK), 0);
		}
		if (err)
			return err;
	}
	return 0;
}

/* Rewrite the skb, request req, into reply bytes [off, off + n) of the rule
 * st->e.rule names, as one segment. A rule with copies takes one segment,
 * made from the request the skb still holds. Global, so the verifier checks
 * it once. */
__noinline int emit_segment(struct __sk_buff *skb, const struct emit_state *st, const struct pkt_info *req,
			    __u32 off, __u32 n)
{
	__u32 zero = 0;
	struct santa_scratch *s = bpf_map_lookup_elem(&santa_scratch, &zero);
	if (!skb || !st || !req || !s || n == 0 || n > SANTA_MAX_REPLY)
		return -1;
	const struct santa_rule *r = rule_of_ref(&st->e.rule);
	if (!r)
		return -1;
	__u32 page_id = r->page;
	const struct santa_page *page = bpf_map_lookup_elem(&santa_pages, &page_id);
	if (!page)
		return -1;
	int whole = off == 0 && n == r->reply_len;
	if (r->ncopies) {
		__u32 req_len = st->e.req_len;
		if (!whole || req_len == 0 || req_len > SANTA_REQ_WINDOW ||
		    bpf_skb_load_bytes(skb, st->e.req_off, s->req, NONZERO(req_len, SANTA_OFF_MASK)))
			return -1;
	}
	int last = off + n >= st->reply_len;
	int close = last && (r->flags & SANTA_RULE_CLOSE);
	__u32 l23 = st->l23 & 63;
	if (l23 > 58)
		return -1;
	/* s->l4 holds the reply's Ethernet and IP headers, s->hdr gets this segment's */
	__builtin_memcpy(s->hdr, s->l4, 64);
	set_l3_lengths(s->hdr, req, 32 + n);
	__u64 unit = (__u64)st->unit_hi << 32 | st->unit_lo;
	struct tcp_reply t = {
		.flags = TCP_ACK | (last ? TCP_PSH : 0) | (close ? TCP_FIN : 0),
		.seq = st->e.seq + off,
		.ack = st->e.ack,
		.tsval = st->e.stamp,
		.tsecr = st->e.tsecr,
		.opts = st->e.opts,
		.uid = st->e.uid,
	};
	if (close)
		t.tsval = stamp_make(req, unit, 1, &t);
	struct tcphdr *th = write_tcp_header(s->hdr, l23, req, &t);
	const __u8 *chunk = page->b + ((r->tpl + off) & (SANTA_PAGE_DATA - 1));
	if (checksum_partial(skb)) {
		th->check = csum_fold64(csum_pseudo(&req->tuple, req->family, IPPROTO_TCP, 32 + n));
	} else {
		/* the whole reply in one segment: the template's sum from install
		 * time, with the copies' */
		__u64 sum = tcp_header_sum(th, 32, req, n) +
			    (whole ? reply_payload_sum(s, r, page) : csum_words(chunk, n, SANTA_MAX_REPLY / 8));
		th->check = ~csum_fold64(sum);
	}
	if (bpf_skb_change_tail(skb, l23 + 32 + n, 0) ||
	    bpf_skb_store_bytes(skb, 0, s->hdr, NONZERO(l23 + 32, 127), 0) ||
	    bpf_skb_store_bytes(skb, l23 + 32, chunk, NONZERO(n, SANTA_OFF_MASK), 0) ||
	    store_copies(skb, s, page, r, l23 + 32))
		return -1;
	return 0;
}

/* Send the reply segments the XDP responder asked for, then drop the request req. */
static __always_inline int emit_reply(struct __sk_buff *skb, struct emit_state *st, const struct pkt_info *req)
{
	__u32 zero = 0;
	struct santa_scratch *s = bpf_map_lookup_elem(&santa_scratch, &zero);
	__u32 slot = st->e.rule.slot;
	const struct santa_rule *r = rule_of_ref(&st->e.rule);
	st->l23 = req->l2_len + req->l3_len;
	if (!s || !r || st->l23 > 58 || bpf_skb_load_bytes(skb, 0, s->l4, NONZERO(st->l23, 63))) {
		COUNT(tcp_emit_failed);
		return TC_ACT_SHOT;
	}
	reverse_addresses(s->l4, req);
	st->reply_len = r->reply_len;
	__u64 unit = stamp_unit();
	st->unit_lo = unit;
	st->unit_hi = unit >> 32;
	__u32 mss = opts_mss(st->e.opts) - TS_OPTION_LEN, off = st->e.from;
	if (mss == 0)
		return TC_ACT_SHOT;
	if (!st->e.resend) {
		struct santa_rule_counters *c = bpf_map_lookup_elem(&santa_rule_stats, &slot);
		if (c) {
			c->hits++;
			c->bytes += st->reply_len;
		}
		COUNT(answered);
	}
	/* each segment but the last goes out as a clone; the last is the skb */
	for (int k = 0; k < SANTA_TCP_SEGMENTS; k++) {
		if (off >= st->reply_len)
			break;
		__u32 n = st->reply_len - off < mss ? st->reply_len - off : mss;
		if (emit_segment(skb, st, req, off, n)) {
			COUNT(tcp_emit_failed);
			return TC_ACT_SHOT;
		}
		COUNT(tcp_segments_sent);
		off += n;
		/* a resend: the missing segment, then the last, whose arrival
		 * makes the client ack again if more is missing */
		if (st->e.resend && off < st->reply_len) {
			__u32 tail = (st->reply_len - off) % mss;
			off = st->reply_len - (tail ? tail : mss);
		}
		if (off >= st->reply_len)
			return bpf_redirect(skb->ifindex, 0);
		if (bpf_clone_redirect(skb, skb->ifindex, 0)) {
			COUNT(tcp_emit_failed);
			return TC_ACT_SHOT;
		}
	}
	return TC_ACT_SHOT;
}

/* The reply to the UDP request req that XDP had no room for in its frame,
 * from the rule its metadata names: the skb rewritten into it and sent back
 * out of the interface it came in on. Until the skb is rewritten, a failure
 * (the rule went in the microseconds since XDP matched it, the skb cannot
 * grow) leaves the request to its socket, as if there had been no rule; so
 * does metadata of another version. Global, so that its stack is not added
 * to the TCP path's. */
__noinline int emit_udp_reply(struct __sk_buff *skb, const struct pkt_info *req)
{
	if (!skb || !req)
		return TC_ACT_OK;
	struct santa_udp_emit *meta = (void *)(long)skb->data_meta;
	if ((void *)(meta + 1) > (void *)(long)skb->data || meta->magic != SANTA_UDP_EMIT_MAGIC)
		return TC_ACT_OK;
	struct santa_rule_ref ref = meta->rule;
	__u32 zero = 0;
	struct santa_scratch *s = bpf_map_lookup_elem(&santa_scratch, &zero);
	const struct santa_rule *r = rule_of_ref(&ref);
	if (!s || !r)
		goto pass;
	__u32 slot = ref.slot, page_id = r->page, reply_len = r->reply_len;
	const struct santa_page *page = bpf_map_lookup_elem(&santa_pages, &page_id);
	__u32 l23 = req->l2_len + req->l3_len, payload_len = req->payload_len;
	if (!page || l23 > 58 || reply_len == 0 || reply_len > SANTA_MAX_REPLY || payload_len == 0 ||
	    payload_len > SANTA_REQ_WINDOW || bpf_skb_load_bytes(skb, 0, s->hdr, NONZERO(l23, 63)) ||
	    bpf_skb_load_bytes(skb, req->payload_off, s->req, NONZERO(payload_len, SANTA_OFF_MASK)))
		goto pass;
	reverse_addresses(s->hdr, req);
	set_l3_lengths(s->hdr, req, sizeof(struct udphdr) + reply_len);
	__u32 hdr_len = write_udp_header(s, l23, req, r, page, checksum_partial(skb));
	if (bpf_skb_change_tail(skb, hdr_len + reply_len, 0))
		goto pass;
	/* the request is gone from here on: a failure drops */
	if (bpf_skb_store_bytes(skb, 0, s->hdr, NONZERO(hdr_len, 127), 0) ||
	    bpf_skb_store_bytes(skb, hdr_len, page->b + (r->tpl & (SANTA_PAGE_DATA - 1)),
				NONZERO(reply_len, SANTA_OFF_MASK), 0))
		goto fail;
	if (store_copies(skb, s, page, r, hdr_len))
		goto fail;
	struct santa_rule_counters *c = bpf_map_lookup_elem(&santa_rule_stats, &slot);
	if (c) {
		c->hits++;
		c->bytes += hdr_len + reply_len;
	}
	COUNT(answered);
	return bpf_redirect(skb->ifindex, 0);
pass:
	COUNT(udp_emit_passed);
	return TC_ACT_OK;
fail:
	COUNT(udp_emit_failed);
	return TC_ACT_SHOT;
}

/* The packet is IPv4 or IPv6 right after an untagged Ethernet header, in the
 * linear part, and carries UDP: most of what this hook sees on a UDP server,
 * which it leaves without pulling and parsing the headers. */
static __always_inline int plain_udp(const struct __sk_buff *skb)
{
	void *data = (void *)(long)skb->data, *end = (void *)(long)skb->data_end;
	struct ethhdr *eth = data;
	if ((void *)(eth + 1) > end)
		return 0;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);
		return (void *)(ip + 1) <= end && ip->protocol == IPPROTO_UDP;
	}
	if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);
		return (void *)(ip6 + 1) <= end && ip6->nexthdr == IPPROTO_UDP;
	}
	return 0;
}

SEC("tc")
int santa_handover(struct __sk_buff *skb)
{
	if (skb->protocol != bpf_htons(ETH_P_IP) && skb->protocol != bpf_htons(ETH_P_IPV6) &&
	    skb->protocol != bpf_htons(ETH_P_8021Q))
		return TC_ACT_OK;
	/* XDP passes metadata only with a reply for TC to send */
	int from_xdp = skb->data_meta < skb->data;
	if (!from_xdp && plain_udp(skb))
		return TC_ACT_OK;
	/* the headers in the linear part; the payload may stay in fragments */
	bpf_skb_pull_data(skb, skb->len < HEADERS_MAX ? skb->len : HEADERS_MAX);
	struct pkt_info req = {};
	if (parse_request((void *)(long)skb->data, (void *)(long)skb->data_end, &req, 0))
		return TC_ACT_OK;
	if (req.proto == IPPROTO_UDP)
		return from_xdp ? emit_udp_reply(skb, &req) : TC_ACT_OK;
	if (req.proto != IPPROTO_TCP)
		return TC_ACT_OK;
	struct santa_tcp_emit *meta = (void *)(long)skb->data_meta;
	if ((void *)&meta->seq <= (void *)(long)skb->data) { /* XDP asked for segments */
		if ((void *)(meta + 1) <= (void *)(long)skb->data && meta->magic == SANTA_TCP_EMIT_MAGIC) {
			struct emit_state st = { .e = *meta };
			return emit_reply(skb, &st, &req);
		}
		/* in another version's layout: neither send it nor hand the
		 * connection over (it may be a resend of a reply the client
		 * holds part of) */
		COUNT(tcp_drop_emit_layout);
		return TC_ACT_SHOT;
	}
	/* no socket-less connection can be on a port that never had a rule set:
	 * the kernel's own connections there skip the stamp check */
	if (!port_in(local_port(&req), SANTA_PORTS_TCP_SEEN))
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
	/* an echo out of a stamp's time is no stamp, whoever owns the
	 * listener: most of the kernel's own connections' echoes (their TSval
	 * starts at random) leave here, before the socket lookup (docs/tcp.md
	 * "Cost") */
	__u64 unit = stamp_unit();
	if (!o.has_ts || stamp_age(o.tsecr, unit) > SANTA_TCP_VALID_UNITS)
		return TC_ACT_OK;

	__u32 tuple_len = req.family == 4 ? sizeof(req.tuple.ipv4) : sizeof(req.tuple.ipv6);
	struct bpf_sock *sk = bpf_skc_lookup_tcp(skb, &req.tuple, tuple_len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return TC_ACT_OK;
	if (sk->state != BPF_TCP_LISTEN) /* the kernel has it already */
		goto release;
	/* only to a listener of the user whose listener answered the SYN (the
	 * stamp's MAC covers its owner): another user's resets it */
	__u32 opts;
	int fin;
	__u64 age;
	if (!stamp_check(&req, o.tsecr, unit, sock_uid(sk, BPF_TCP_LISTEN), &opts, &fin, &age))
		goto release;
	/* A reply of eBPF's not all acked: XDP passes such a segment only
	 * once the connection's rule set went (it drops it before), and the
	 * kernel's socket, made from it at the client's ack, would not know
	 * the rest of the reply. As XDP does when the rule of a reply in
	 * flight went: a client that has none of it (one segment, not acked)
	 * has its request handed over when it sends it again (anything else
	 * is dropped till then); one that may have part of it is reset (the
	 * kernel resets an ACK its listener gets). */
	struct tcphdr *th = (void *)s->l4;
	__u32 ack = bpf_ntohl(th->ack_seq);
	struct santa_tcp_flow *f = bpf_map_lookup_elem(&santa_tcp_flows, &req.tuple);
	if (f && (__s32)(ack - f->reply_end) < 0) {
		if (ack != f->reply_start || f->reply_end - f->reply_start > opts_mss(opts) - TS_OPTION_LEN) {
			bpf_map_delete_elem(&santa_tcp_flows, &req.tuple);
			COUNT(tcp_reset_rule_gone);
			goto release;
		}
		if (bpf_ntohl(th->seq) != f->req_seq) {
			COUNT(tcp_drop_rule_gone);
			bpf_sk_release(sk);
			return TC_ACT_SHOT;
		}
	}
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
	if (bpf_sk_assign_tcp_reqsk(skb, listener, &attrs, sizeof(attrs)) == 0) {
		/* the kernel's now: XDP passes its segments before it looks at
		 * flows, and nothing of eBPF's is in flight (XDP hands over only
		 * once the client has all of eBPF's replies). Left to the sweep,
		 * the flow would hold its place in the table for minutes. */
		bpf_map_delete_elem(&santa_tcp_flows, &req.tuple);
		COUNT(tcp_handed_over);
	} else {
		COUNT(tcp_handover_failed);
	}
release:
	bpf_sk_release(sk);
	return TC_ACT_OK;
}
