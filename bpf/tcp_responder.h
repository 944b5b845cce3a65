/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The socket-less TCP responder at XDP (docs/tcp.md), part of santa_xdp.c.
 *
 * For a listener with a rule set, eBPF answers the SYN with a stamped
 * SYN-ACK and keeps nothing. A later segment proves the connection with the
 * stamp the client echoes; a request that matches a rule is answered in
 * place (reply seq = the request's ack, so a client's retransmission
 * regenerates a lost reply); pure ACKs are consumed, FINs answered. Whatever
 * else comes is passed, and the TC hook (santa_handover.c) hands the
 * connection to the kernel with that segment. */
#pragma once

#define SANTA_MSS4 1460 /* the MSS eBPF announces: a 1500-byte MTU */
#define SANTA_MSS6 1440
#define SANTA_WINDOW 64240 /* the receive window eBPF announces, as the kernel's first */

/* The cookie of the listener a segment reaches, 0 if none. *kernel_sock says
 * the kernel has a socket of its own for the 4-tuple (then 0 is returned). */
static __always_inline __u64 tcp_listener(struct xdp_md *ctx, struct pkt_info *req, int *wildcard,
					  int *kernel_sock)
{
	__u32 tuple_len = req->family == 4 ? sizeof(req->tuple.ipv4) : sizeof(req->tuple.ipv6);
	struct bpf_sock *sk = bpf_skc_lookup_tcp(ctx, &req->tuple, tuple_len, BPF_F_CURRENT_NETNS, 0);
	if (!sk)
		return 0;
	__u64 cookie = 0;
	if (sk->state == BPF_TCP_LISTEN) {
		struct sock *ksk = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct sock));
		cookie = ksk->__sk_common.skc_cookie.counter;
		*wildcard = sk->src_ip4 == 0 &&
			    (sk->src_ip6[0] | sk->src_ip6[1] | sk->src_ip6[2] | sk->src_ip6[3]) == 0;
	} else {
		*kernel_sock = 1;
	}
	bpf_sk_release(sk);
	return cookie;
}

/* What a reply segment carries besides the payload of rule r. */
struct tcp_reply {
	__u8 flags;
	__u8 syn;     /* a SYN-ACK: the handshake's options */
	__u32 seq;
	__u32 ack;
	__u32 tsval;
	__u32 tsecr;
	__u32 opts;   /* the stamp's option bits */
};

/* Replace the segment by a reply segment with the payload of the rule in
 * slot (0: none). Global, so the verifier checks it once. */
__noinline int tcp_send(struct xdp_md *ctx, struct pkt_info *req, const struct tcp_reply *t, __u32 slot)
{
	struct santa_scratch *s = scratch();
	if (!req || !t || !s)
		return XDP_PASS;
	const struct santa_rule *r = NULL;
	const struct santa_page *page = NULL;
	if (slot) {
		r = bpf_map_lookup_elem(&santa_rules, &slot);
		if (!r) {
			COUNT(pass_error);
			return XDP_PASS;
		}
		page = rule_page(r);
		if (!page)
			return XDP_PASS;
	}
	barrier_var(r); /* the verifier knows r's null checks, not that they follow slot's */
	__u32 reply_len = r ? r->reply_len : 0;
	__u32 tcp_len = t->syn ? 40 : 32;
	__u32 l23 = reverse_l2_l3(ctx, req, s, tcp_len + reply_len);
	if (!l23) {
		COUNT(pass_error);
		return XDP_PASS;
	}
	barrier_var(l23); /* keep the mask below for the verifier */
	struct tcphdr *th = (void *)s->hdr + (l23 & 63);
	__u8 ws = opts_wscale(t->opts);
	__u8 *h = (__u8 *)th;
	th->source = req->family == 4 ? req->tuple.ipv4.dport : req->tuple.ipv6.dport;
	th->dest = req->family == 4 ? req->tuple.ipv4.sport : req->tuple.ipv6.sport;
	th->seq = bpf_htonl(t->seq);
	th->ack_seq = bpf_htonl(t->ack);
	h[12] = (tcp_len / 4) << 4;
	h[13] = t->flags;
	th->window = bpf_htons(t->syn || ws == OPTS_NO_WSCALE ? SANTA_WINDOW : SANTA_WINDOW >> SANTA_TCP_WSCALE);
	th->check = 0;
	th->urg_ptr = 0;
	__u8 *o = h + 20;
	if (t->syn) {
		__u16 mss = req->family == 4 ? SANTA_MSS4 : SANTA_MSS6;
		o[0] = 2, o[1] = 4, o[2] = mss >> 8, o[3] = mss & 0xff;
		if (opts_sack(t->opts))
			o[4] = 4, o[5] = 2;
		else
			o[4] = 1, o[5] = 1;
		o += 6;
	} else {
		o[0] = 1, o[1] = 1;
		o += 2;
	}
	o[0] = 8, o[1] = 10;
	__be32 tsval = bpf_htonl(t->tsval), tsecr = bpf_htonl(t->tsecr);
	__builtin_memcpy(o + 2, &tsval, 4);
	__builtin_memcpy(o + 6, &tsecr, 4);
	if (t->syn) {
		o[10] = 1;
		if (ws != OPTS_NO_WSCALE)
			o[11] = 3, o[12] = 3, o[13] = SANTA_TCP_WSCALE;
		else
			o[11] = 1, o[12] = 1, o[13] = 1;
	}
	__u64 sum = csum_pseudo(&req->tuple, req->family, IPPROTO_TCP, tcp_len + reply_len) +
		    (__u32)bpf_csum_diff(NULL, 0, (void *)th, t->syn ? 40 : 32, 0);
	if (r && page)
		sum += reply_payload_sum(s, r, page);
	th->check = ~csum_fold64(sum);
	return send_frame(ctx, s, l23 + tcp_len, r, page, slot);
}

/* A SYN to a listener with a rule set: answer it with a stamped SYN-ACK. */
static __always_inline int tcp_syn(struct xdp_md *ctx, struct pkt_info *req, struct santa_scratch *s,
				   __u8 flags, const struct tcp_opts *o, __u64 unit)
{
	if ((flags & (TCP_ACK | TCP_FIN)) || req->payload_len || o->bad || (o->mss && o->mss < 536)) {
		COUNT(tcp_pass_syn_other);
		return XDP_PASS;
	}
	if (!o->has_ts) {
		COUNT(tcp_pass_no_timestamps);
		return XDP_PASS;
	}
	struct tcp_reply t = {
		.flags = TCP_SYN | TCP_ACK,
		.syn = 1,
		.seq = bpf_get_prandom_u32(),
		.ack = bpf_ntohl(((struct tcphdr *)s->l4)->seq) + 1,
		.tsecr = o->tsval,
		.opts = stamp_opts(o),
	};
	t.tsval = stamp_make(req, unit, 0, t.opts);
	if (!t.tsval) {
		COUNT(tcp_pass_no_key);
		return XDP_PASS;
	}
	if (!request_checksum_ok(req, s)) {
		COUNT(pass_bad_checksum);
		return XDP_PASS;
	}
	bpf_map_delete_elem(&santa_tcp_flows, &req->tuple); /* a new connection on this 4-tuple */
	COUNT(tcp_syn_answered);
	return tcp_send(ctx, req, &t, 0);
}

/* A TCP segment (XDP entry for TCP). Global, so the verifier checks it once. */
__noinline int tcp_segment(struct xdp_md *ctx, struct pkt_info *req)
{
	if (!req)
		return XDP_PASS;
	int wildcard = 0, kernel_sock = 0;
	__u64 cookie = tcp_listener(ctx, req, &wildcard, &kernel_sock);
	if (kernel_sock) {
		COUNT(tcp_pass_kernel_socket);
		return XDP_PASS;
	}
	if (!cookie) {
		COUNT(pass_no_socket);
		return XDP_PASS;
	}
	__u32 id;
	const struct santa_ruleset *rs = socket_ruleset(cookie, &id);
	struct santa_scratch *s = scratch();
	if (!rs || !s)
		return XDP_PASS;
	if (!kernel_would_deliver(ctx, req, wildcard)) {
		COUNT(pass_not_local);
		return XDP_PASS;
	}
	if (load_l4_header(ctx, req, s)) {
		COUNT(pass_error);
		return XDP_PASS;
	}
	struct tcphdr *th = (void *)s->l4;
	__u8 flags = tcp_flags(th);
	struct tcp_opts o = {};
	tcp_parse_options(s, req->l4_len, &o);
	__u64 unit = stamp_unit();

	if (flags & TCP_RST) {
		/* the kernel ignores a RST to a listener too */
		bpf_map_delete_elem(&santa_tcp_flows, &req->tuple);
		COUNT(tcp_rst_consumed);
		return XDP_DROP;
	}
	if (flags & TCP_SYN)
		return tcp_syn(ctx, req, s, flags, &o, unit);
	__u32 opts;
	int fin;
	__u64 age;
	if (!(flags & TCP_ACK) || !o.has_ts || !stamp_check(req, o.tsecr, unit, &opts, &fin, &age)) {
		COUNT(tcp_pass_bad_stamp);
		return XDP_PASS;
	}
	__u32 seq = bpf_ntohl(th->seq);
	struct tcp_reply t = {
		.flags = TCP_ACK,
		.seq = bpf_ntohl(th->ack_seq),
		.tsecr = o.tsval,
		.opts = opts,
	};
	if ((flags & TCP_URG) || ((flags & TCP_FIN) && req->payload_len)) {
		COUNT(tcp_handover_flags);
		return XDP_PASS;
	}
	if (flags & TCP_FIN) {
		/* FIN-ACK, or only ACK the client's FIN if eBPF sent its own */
		if (!request_checksum_ok(req, s)) {
			COUNT(pass_bad_checksum);
			return XDP_PASS;
		}
		bpf_map_delete_elem(&santa_tcp_flows, &req->tuple);
		t.flags |= fin ? 0 : TCP_FIN;
		t.ack = seq + 1;
		t.tsval = stamp_make(req, unit, 1, opts);
		COUNT(tcp_fin_answered);
		return tcp_send(ctx, req, &t, 0);
	}
	if (req->payload_len <= 1 && age >= 1) {
		/* after an idle unit: a keepalive probe (seq = the client's next - 1,
		 * with no byte or one), which wants an ACK; the new stamp keeps the
		 * connection valid */
		if (!request_checksum_ok(req, s)) {
			COUNT(pass_bad_checksum);
			return XDP_PASS;
		}
		t.ack = seq + 1;
		t.tsval = stamp_make(req, unit, fin, opts);
		COUNT(tcp_keepalive_answered);
		return tcp_send(ctx, req, &t, 0);
	}
	if (req->payload_len == 0) {
		COUNT(tcp_ack_consumed);
		return XDP_DROP;
	}
	if (fin) {
		COUNT(tcp_drop_after_fin);
		return XDP_DROP;
	}
	/* Pipelining guard: while the client has not acked eBPF's last reply,
	 * only that reply's request (retransmitted) may be answered; handing
	 * the connection over now would lose the reply's sequence space. */
	struct santa_tcp_flow *f = bpf_map_lookup_elem(&santa_tcp_flows, &req->tuple);
	if (f && (__s32)(t.seq - f->reply_end) < 0 && seq != f->req_seq) {
		COUNT(tcp_drop_pipelined);
		return XDP_DROP;
	}
	__u32 slot = 0;
	const struct santa_rule *r = match_request(ctx, req, s, cookie, id, rs, &slot);
	if (!r)
		return XDP_PASS;
	if (r->reply_len + 12 > opts_mss(opts)) {
		COUNT(tcp_handover_long_reply);
		return XDP_PASS;
	}
	__u8 ws = opts_wscale(opts);
	if (r->reply_len > ((__u32)bpf_ntohs(th->window) << (ws == OPTS_NO_WSCALE ? 0 : ws))) {
		COUNT(tcp_handover_window);
		return XDP_PASS;
	}
	if (!request_checksum_ok(req, s)) {
		COUNT(pass_bad_checksum);
		return XDP_PASS;
	}
	int close = r->flags & SANTA_RULE_CLOSE;
	struct santa_tcp_flow nf = {
		.req_seq = seq,
		.reply_end = t.seq + r->reply_len + (close ? 1 : 0),
	};
	bpf_map_update_elem(&santa_tcp_flows, &req->tuple, &nf, BPF_ANY);
	t.flags |= TCP_PSH | (close ? TCP_FIN : 0);
	t.ack = seq + req->payload_len;
	t.tsval = stamp_make(req, unit, close, opts);
	return tcp_send(ctx, req, &t, slot);
}
