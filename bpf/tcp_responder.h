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

/* The cookie of the listener a segment reaches (0 for a listener whose
 * cookie was never asked for, which has no rules); *listener says there is
 * one. *kernel_sock says the kernel has a socket of its own for the 4-tuple
 * (then 0 is returned). *uid is the owner (sk_uid) of the socket found, a
 * listener or a full socket of the kernel's, else SANTA_NO_UID. */
static __always_inline __u64 tcp_listener(struct xdp_md *ctx, struct pkt_info *req, int *listener,
					  int *kernel_sock, __u32 *uid)
{
	__u32 tuple_len = req->family == 4 ? sizeof(req->tuple.ipv4) : sizeof(req->tuple.ipv6);
	struct bpf_sock *sk = bpf_skc_lookup_tcp(ctx, &req->tuple, tuple_len, BPF_F_CURRENT_NETNS, 0);
	*uid = SANTA_NO_UID;
	if (!sk)
		return 0;
	__u64 cookie = 0;
	__u32 state = sk->state;
	if (state == BPF_TCP_LISTEN) {
		struct sock *ksk = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct sock));
		cookie = ksk->__sk_common.skc_cookie.counter;
		*listener = 1;
	} else {
		*kernel_sock = 1;
	}
	*uid = sock_uid(sk, state);
	bpf_sk_release(sk);
	return cookie;
}

#define TCP_NO_ROOM (-1) /* tcp_send: the frame cannot grow to the reply, and is unchanged */

/* Replace the segment by a reply segment with the payload of the rule in
 * slot (0: none). Global, so the verifier checks it once. */
__noinline int tcp_send(struct xdp_md *ctx, struct pkt_info *req, const struct tcp_reply *t, __u32 slot)
{
	struct santa_scratch *s = scratch();
	if (!req || !t || !s)
		return XDP_PASS;
	const struct santa_rule *r = NULL;
	const struct santa_page *page = NULL;
	struct santa_rule_counters *st = NULL;
	if (slot) {
		st = rule_counters(slot);
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
	/* a frame without the room for the reply is left as it is, for TC:
	 * known before the headers are built */
	if (!frame_fits(ctx, req->l2_len + req->l3_len + tcp_len + reply_len))
		return TCP_NO_ROOM;
	__u32 l23 = reverse_l2_l3(ctx, req, s, tcp_len + reply_len);
	if (!l23) {
		COUNT(pass_error);
		return XDP_PASS;
	}
	barrier_var(l23); /* keep the mask below for the verifier */
	struct tcphdr *th = write_tcp_header(s->hdr, l23, req, t);
	__u64 sum = tcp_header_sum(th, tcp_len, req, reply_len);
	if (r && page)
		sum += reply_payload_sum(s, r, page);
	th->check = ~csum_fold64(sum);
	if (resize_frame(ctx, l23 + tcp_len + reply_len))
		return TCP_NO_ROOM;
	return send_frame(ctx, s, l23 + tcp_len, r, page, st);
}

/* Where the request a reply answers lies in the frame (len 0: nowhere). */
struct req_bytes {
	__u32 off;
	__u32 len;
};

/* Pass the segment to TC with metadata that has it send the reply of flow f
 * from reply byte from on (or, with resend, the segment there and the last),
 * stamped for t, with the request's bytes at rq for the rule's copies: TC
 * can send several frames, and grow one beyond what XDP's frame has room
 * for. */
static __always_inline int emit_by_tc(struct xdp_md *ctx, const struct pkt_info *req, const struct santa_tcp_flow *f,
				      __u32 from, const struct tcp_reply *t, const struct tcp_opts *o, __u64 unit,
				      int resend, struct req_bytes rq)
{
	__u32 stamp = reply_stamp(req, unit, 0, t, o->tsecr);
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct santa_tcp_emit))) {
		COUNT(tcp_emit_failed);
		return XDP_DROP; /* the client asks again */
	}
	struct santa_tcp_emit *e = (void *)(long)ctx->data_meta;
	if ((void *)(e + 1) > (void *)(long)ctx->data) {
		COUNT(tcp_emit_failed);
		return XDP_DROP;
	}
	e->magic = SANTA_TCP_EMIT_MAGIC;
	e->rule = f->rule;
	e->seq = f->reply_start;
	e->ack = f->req_seq;
	e->tsecr = o->tsval;
	e->stamp = stamp;
	e->opts = t->opts;
	e->uid = t->uid;
	e->from = from;
	e->req_off = rq.off;
	e->req_len = rq.len;
	e->resend = resend;
	return XDP_PASS;
}

/* The rule of flow f's reply in flight went (deleted, or a new version:
 * santa http gives its rules a new Date every second) and its slot may hold
 * other bytes now: the rest of that reply cannot be sent. A client that has
 * none of it (one segment, not acked) asks again and is answered anew, by
 * today's rule or the kernel: the flow goes. One that may have part of it
 * is reset: a new reply could differ from the bytes it holds. */
static __always_inline int reply_gone(struct xdp_md *ctx, struct pkt_info *req, struct santa_tcp_flow *f,
				      struct tcp_reply *t, const struct tcp_opts *o, __u64 unit, __u32 ack)
{
	int none = t->seq == f->reply_start && f->reply_end - f->reply_start <= opts_mss(t->opts) - TS_OPTION_LEN;
	bpf_map_delete_elem(&santa_tcp_flows, &req->tuple);
	if (none) {
		COUNT(tcp_drop_rule_gone);
		return XDP_DROP;
	}
	COUNT(tcp_reset_rule_gone);
	t->flags = TCP_RST | TCP_ACK;
	t->ack = ack;
	t->tsval = reply_stamp(req, unit, 1, t, o->tsecr);
	return tcp_send(ctx, req, t, 0);
}

/* The last request flow f answered came again: if its reply is in flight,
 * send it again from what the client acks; else ack the request (fin: the
 * stamp says eBPF sent its FIN). */
static __always_inline int answer_again(struct xdp_md *ctx, struct pkt_info *req, struct santa_scratch *s,
					struct santa_tcp_flow *f, struct tcp_reply *t,
					const struct tcp_opts *o, __u64 unit, int in_flight, int fin)
{
	/* a client retransmits its request while it misses any of the reply:
	 * santad's sweep leaves a flow alone that long */
	f->seen = unit;
	if (!in_flight) {
		t->ack = f->req_end;
		t->tsval = reply_stamp(req, unit, fin, t, o->tsecr);
		return tcp_send(ctx, req, t, 0);
	}
	const struct santa_rule *r = rule_of_ref(&f->rule);
	if (!r)
		return reply_gone(ctx, req, f, t, o, unit, f->req_end);
	/* the request's bytes, for the rule's copies */
	__u32 skip = f->req_seq - bpf_ntohl(((struct tcphdr *)s->l4)->seq);
	struct req_bytes rq = { .off = req->payload_off + skip, .len = f->req_end - f->req_seq };
	if (rq.len == 0 || rq.len > SANTA_REQ_WINDOW || skip > SANTA_REQ_WINDOW)
		rq.len = 0;
	if (f->multi)
		return emit_by_tc(ctx, req, f, t->seq - f->reply_start, t, o, unit, 0, rq);
	if (rq.len == 0 || bpf_xdp_load_bytes(ctx, rq.off, s->req, NONZERO(rq.len, SANTA_OFF_MASK))) {
		COUNT(pass_error);
		return XDP_DROP; /* the client asks again */
	}
	int close = r->flags & SANTA_RULE_CLOSE;
	t->flags |= TCP_PSH | (close ? TCP_FIN : 0);
	t->seq = f->reply_start;
	t->ack = f->req_end;
	t->tsval = reply_stamp(req, unit, close, t, o->tsecr);
	int verdict = tcp_send(ctx, req, t, f->rule.slot);
	if (verdict != TCP_NO_ROOM)
		return verdict;
	((struct santa_tcp_flow *)f)->multi = 1; /* TC sends it, as a long reply */
	return emit_by_tc(ctx, req, f, t->seq - f->reply_start, t, o, unit, 0, rq);
}

/* A SYN to a listener of owner uid with a rule set: answer it with a
 * stamped SYN-ACK. */
static __always_inline int tcp_syn(struct xdp_md *ctx, struct pkt_info *req, struct santa_scratch *s,
				   __u8 flags, const struct tcp_opts *o, __u64 unit, __u32 uid)
{
	/* the client's MSS (absent: the default, RFC 9293); the kernel takes
	 * no smaller one at a handover (bpf_sk_assign_tcp_reqsk) */
	__u16 min_mss = req->family == 4 ? 536 : 1220;
	__u16 client_mss = o->mss ? o->mss : min_mss;
	if ((flags & (TCP_ACK | TCP_FIN)) || req->payload_len || o->bad || client_mss < min_mss) {
		COUNT(tcp_pass_syn_other);
		return XDP_PASS;
	}
	if (!o->has_ts) {
		COUNT(tcp_pass_no_timestamps);
		return XDP_PASS;
	}
	/* the MSS this side's MTU allows, at most a 1500-byte MTU's */
	__u32 mtu = interface_mtu(ctx), ip_tcp = req->family == 4 ? 40 : 60;
	if (mtu < ip_tcp + 536) {
		COUNT(tcp_pass_small_mtu);
		return XDP_PASS;
	}
	__u16 max_mss = req->family == 4 ? SANTA_MSS4 : SANTA_MSS6;
	__u16 local_mss = mtu - ip_tcp < max_mss ? mtu - ip_tcp : max_mss;
	struct tcp_reply t = {
		.flags = TCP_SYN | TCP_ACK,
		.syn = 1,
		.seq = bpf_get_prandom_u32(),
		.ack = bpf_ntohl(((struct tcphdr *)s->l4)->seq) + 1,
		.tsecr = o->tsval,
		.opts = stamp_opts(o, client_mss, local_mss),
		.uid = uid,
		.mss = local_mss,
	};
	t.tsval = stamp_make(req, unit, 0, &t);
	if (!t.tsval) {
		COUNT(tcp_pass_no_key);
		return XDP_PASS;
	}
	if (!request_checksum_ok(req, s)) {
		COUNT(pass_bad_checksum);
		return XDP_PASS;
	}
	/* A SYN on a connection with a flow gets a challenge ACK (RFC 5961
	 * 4.2): a duplicate or blind SYN must not drop the state of a reply
	 * in flight. A client that opened a new connection on the 4-tuple
	 * answers the ACK with a RST at its ack, which ends the flow, and
	 * sends its SYN again. */
	const struct santa_tcp_flow *f = bpf_map_lookup_elem(&santa_tcp_flows, &req->tuple);
	if (f) {
		t.flags = TCP_ACK;
		t.syn = 0;
		t.seq = f->reply_end;
		t.ack = f->req_end;
		/* its stamp carries the connection's options, not the SYN's: the
		 * client takes it for its next echo, and a blind SYN would
		 * otherwise set the options of the connection's handover */
		if (f->opts & SANTA_FLOW_OPTS_KNOWN) {
			t.opts = f->opts & ~SANTA_FLOW_OPTS_KNOWN;
			t.tsval = stamp_make(req, unit, 0, &t);
		}
		COUNT(tcp_syn_challenged);
		return tcp_send(ctx, req, &t, 0);
	}
	COUNT(tcp_syn_answered);
	return tcp_send(ctx, req, &t, 0);
}

/* Data on a connection the kernel owns (handed over, or its own) is a miss
 * too, sampled for the subscribers of its listener's rule set: the later
 * requests of a keep-alive client handed over to the application would
 * otherwise never be learned. Only on a port whose rule set takes samples
 * (SANTA_PORTS_TCP_SAMPLED): elsewhere the second socket lookup would be
 * wasted on every data segment. The listener is what a lookup without the
 * source finds; req's source is zeroed for it (the caller passes the
 * segment on and reads req no more). That listener need not be the one
 * that accepted the connection (closed since, another user's listening on
 * the port now): only one of the connection's owner (conn_uid), as its
 * accepted sockets are, gets its data. */
static __always_inline void sample_kernel_data(struct xdp_md *ctx, struct pkt_info *req, __u32 conn_uid)
{
	if (req->payload_len == 0 || !port_in(local_port(req), SANTA_PORTS_TCP_SAMPLED))
		return;
	if (req->family == 4) {
		req->tuple.ipv4.saddr = 0;
		req->tuple.ipv4.sport = 0;
	} else {
		__builtin_memset(req->tuple.ipv6.saddr, 0, sizeof(req->tuple.ipv6.saddr));
		req->tuple.ipv6.sport = 0;
	}
	int listener = 0, kernel_sock = 0;
	__u32 uid;
	__u64 cookie = tcp_listener(ctx, req, &listener, &kernel_sock, &uid);
	if (uid != conn_uid || conn_uid == SANTA_NO_UID)
		return;
	struct santa_scratch *s = scratch();
	__u32 id = cookie && s ? socket_ruleset_id(s, cookie) : 0;
	const struct santa_ruleset *rs = id ? bpf_map_lookup_elem(&santa_rulesets, &id) : NULL;
	if (!rs || !rs->sample_len || !s)
		return;
	__u32 len = req->payload_len < SANTA_REQ_WINDOW ? req->payload_len : SANTA_REQ_WINDOW;
	if (bpf_xdp_load_bytes(ctx, req->payload_off, s->req, NONZERO(len, SANTA_OFF_MASK)) == 0)
		sample_miss(cookie, id, rs, s, req);
}

/* A TCP segment (XDP entry for TCP). Global, so the verifier checks it once. */
__noinline int tcp_segment(struct xdp_md *ctx, struct pkt_info *req)
{
	if (!req)
		return XDP_PASS;
	int listener = 0, kernel_sock = 0;
	__u32 uid;
	__u64 cookie = tcp_listener(ctx, req, &listener, &kernel_sock, &uid);
	if (kernel_sock) {
		COUNT(tcp_pass_kernel_socket);
		sample_kernel_data(ctx, req, uid);
		return XDP_PASS;
	}
	if (!listener) {
		COUNT(pass_no_socket);
		return XDP_PASS;
	}
	if (!cookie) {
		COUNT(pass_no_ruleset);
		return XDP_PASS;
	}
	struct santa_scratch *s = scratch();
	if (!s)
		return XDP_PASS;
	__u32 id;
	const struct santa_ruleset *rs = socket_ruleset(s, cookie, &id);
	if (!rs)
		return XDP_PASS;
	if (!kernel_would_deliver(ctx, s, req) || !master_delivers(ctx, req))
		return XDP_PASS;
	if (load_l4_header(ctx, req, s)) {
		COUNT(pass_error);
		return XDP_PASS;
	}
	struct tcphdr *th = (void *)s->l4;
	__u8 flags = tcp_flags(th);
	/* in scratch: the stack is short (the matcher's calls need it) */
	struct tcp_work *w = (void *)s->tcp;
	struct tcp_opts *o = &w->o;
	__builtin_memset(o, 0, sizeof(*o));
	tcp_parse_options(s, req->l4_len, o);
	__u64 unit = stamp_unit();

	/* Right after a restart the flows are not all carried over yet: one
	 * not here yet would be taken for none (a retransmitted request
	 * answered anew, at the client's ack). A SYN needs none. */
	__u32 zero = 0;
	const __u32 *carrying = bpf_map_lookup_elem(&santa_tcp_carrying, &zero);
	if (carrying && *carrying && (flags & (TCP_SYN | TCP_RST)) != TCP_SYN) {
		COUNT(tcp_drop_carrying);
		return XDP_DROP;
	}
	if (flags & TCP_RST) {
		/* Only a RST at the client's next byte (after its FIN: that + 1)
		 * ends the flow (RFC 5961 3.2): a blind or stale one must not
		 * drop the state of a reply in flight, or the client's next
		 * retransmission would be answered from the wrong sequence
		 * number. The kernel ignores a RST to a listener too. */
		struct santa_tcp_flow *f = bpf_map_lookup_elem(&santa_tcp_flows, &req->tuple);
		if (f && bpf_ntohl(th->seq) - f->req_end > 1) {
			COUNT(tcp_drop_rst_seq);
			return XDP_DROP;
		}
		if (f)
			bpf_map_delete_elem(&santa_tcp_flows, &req->tuple);
		COUNT(tcp_rst_consumed);
		return XDP_DROP;
	}
	if (flags & TCP_SYN)
		return tcp_syn(ctx, req, s, flags, o, unit, uid);
	__u32 opts;
	int fin;
	__u64 age;
	/* a stamp proves the connection to a listener of the owner it was made
	 * under only: another user's that took the port since gets neither its
	 * requests nor their samples (the kernel resets it) */
	if (!(flags & TCP_ACK) || !o->has_ts || !stamp_check(req, o->tsecr, unit, uid, &opts, &fin, &age)) {
		COUNT(tcp_pass_bad_stamp);
		return XDP_PASS;
	}
	__u32 seq = bpf_ntohl(th->seq);
	struct tcp_reply *t = &w->t;
	*t = (struct tcp_reply){
		.flags = TCP_ACK,
		.seq = bpf_ntohl(th->ack_seq),
		.tsecr = o->tsval,
		.opts = opts,
		.uid = uid,
	};
	/* the flow of the last request eBPF answered on the connection */
	struct santa_tcp_flow *f = bpf_map_lookup_elem(&santa_tcp_flows, &req->tuple);
	/* An ack of bytes eBPF never sent (beyond its last reply, and its FIN)
	 * is dropped and answered with an ACK of where eBPF stands, as the
	 * kernel does (RFC 5961 5.2): taken, a request there would be answered
	 * at a sequence number the client has no bytes before, a FIN answered
	 * there, a pure ACK taken for the client having eBPF's all. Without a
	 * flow eBPF does not know its next byte. */
	if (f && (__s32)(t->seq - f->reply_end - (fin ? 1 : 0)) > 0) {
		/* nor may it go to the kernel, whose socket would take the ack
		 * for eBPF's: a corrupt one is dropped as the kernel would */
		if (req->payload_len > SANTA_REQ_WINDOW ||
		    (req->payload_len &&
		     bpf_xdp_load_bytes(ctx, req->payload_off, s->req, NONZERO(req->payload_len, SANTA_OFF_MASK))) ||
		    !request_checksum_ok(req, s)) {
			COUNT(pass_bad_checksum);
			return XDP_DROP;
		}
		t->seq = f->reply_end;
		t->ack = f->req_end;
		t->tsval = reply_stamp(req, unit, fin, t, o->tsecr);
		COUNT(tcp_ack_unsent_challenged);
		return tcp_send(ctx, req, t, 0);
	}
	if ((flags & TCP_FIN) && req->payload_len) {
		/* a client that closes before eBPF acked its last request sends
		 * that request again with its FIN: once the reply is all acked,
		 * answer the FIN. Its flow may be gone if eBPF sent its own FIN
		 * (the stamp says so): no data after that FIN is ever taken, so
		 * this is the request answered. Other data with a FIN is the
		 * kernel's. */
		int answered = f ? (__s32)(seq - f->req_seq) <= 0 && seq + req->payload_len == f->req_end : fin;
		if (!answered && f) {
			/* the kernel's socket, made from this segment, must not
			 * miss bytes, get answered ones again, or miss eBPF's
			 * in flight */
			int in_flight = (__s32)(t->seq - f->reply_end) < 0;
			if ((__s32)(seq - f->req_end) > 0) {
				COUNT(tcp_drop_gap); /* as a request after a gap, below */
				return XDP_DROP;
			}
			if ((__s32)(seq - f->req_end) < 0) {
				/* answered bytes, then new ones: the reply (or the
				 * ACK) first; the client then sends the rest alone */
				COUNT(tcp_request_repeated);
				return answer_again(ctx, req, s, f, t, o, unit, in_flight, fin);
			}
			if (in_flight) {
				COUNT(tcp_drop_pipelined);
				return XDP_DROP;
			}
		}
		if (!answered) {
			COUNT(tcp_handover_flags);
			return XDP_PASS;
		}
		if (f && (__s32)(t->seq - f->reply_end) < 0) /* the reply first */
			return answer_again(ctx, req, s, f, t, o, unit, 1, fin);
		if (req->payload_len > SANTA_REQ_WINDOW ||
		    bpf_xdp_load_bytes(ctx, req->payload_off, s->req, NONZERO(req->payload_len, SANTA_OFF_MASK))) {
			COUNT(tcp_handover_flags);
			return XDP_PASS;
		}
		seq += req->payload_len; /* the FIN's sequence number */
	}
	if (flags & TCP_URG) {
		COUNT(tcp_handover_flags);
		return XDP_PASS;
	}
	if (flags & TCP_FIN) {
		/* FIN-ACK, or only ACK the client's FIN if eBPF sent its own */
		if (!request_checksum_ok(req, s)) {
			COUNT(pass_bad_checksum);
			return XDP_PASS;
		}
		/* Once the client has all eBPF sent, the flow is of no more
		 * use if the client cannot send its request again: the reply
		 * acked it (one segment from XDP), or eBPF's FIN went with it
		 * (see FIN with data above). Else it goes when the client acks
		 * eBPF's FIN, below, or when swept. */
		if (f && seq != f->req_end) {
			COUNT(tcp_drop_gap); /* as a request after a gap, below */
			return XDP_DROP;
		}
		/* The client closed before eBPF's reply arrived (nc -N): a
		 * FIN-ACK at its ack would sit inside that reply, end the
		 * client's stream before it and ack the request, which the
		 * client would never send again. It sends its FIN again. */
		if (f && (__s32)(t->seq - f->reply_end) < 0) {
			COUNT(tcp_drop_fin_in_reply);
			return XDP_DROP;
		}
		if (f && t->seq == f->reply_end && (!f->multi || fin))
			bpf_map_delete_elem(&santa_tcp_flows, &req->tuple);
		t->flags |= fin ? 0 : TCP_FIN;
		t->ack = seq + 1;
		t->tsval = reply_stamp(req, unit, 1, t, o->tsecr);
		COUNT(tcp_fin_answered);
		return tcp_send(ctx, req, t, 0);
	}
	if (req->payload_len <= 1) {
		/* A keepalive probe (seq = the client's next - 1, with no byte or
		 * one) wants an ACK; the new stamp keeps the connection valid.
		 * The flow of the last request eBPF answered knows the client's
		 * next byte, so every probe is answered, however often the
		 * client probes; without one (no request answered yet, or the
		 * flow swept) such a segment is taken for a probe after an idle
		 * stamp unit. A client probes only once it has all eBPF sent:
		 * before, one byte there is a 1-byte request sent again. */
		if (f ? seq + 1 == f->req_end && (req->payload_len == 0 || (__s32)(t->seq - f->reply_end) >= 0)
		      : age >= 1) {
			if (!request_checksum_ok(req, s)) {
				COUNT(pass_bad_checksum);
				return XDP_PASS;
			}
			if (f)
				f->seen = unit; /* probed: not idle, the sweep keeps it */
			t->ack = seq + 1;
			t->tsval = reply_stamp(req, unit, fin, t, o->tsecr);
			COUNT(tcp_keepalive_answered);
			return tcp_send(ctx, req, t, 0);
		}
	}
	if (req->payload_len == 0) {
		if (f && fin && t->seq == f->reply_end + 1) {
			/* the client acks the FIN eBPF sent with the ACK of its
			 * own: the connection is over */
			bpf_map_delete_elem(&santa_tcp_flows, &req->tuple);
			COUNT(tcp_ack_consumed);
			return XDP_DROP;
		}
		if (f && f->multi && t->seq == f->reply_end) {
			/* the client has the whole long reply: ack its request, once */
			if (f->last_ack == t->seq) {
				COUNT(tcp_ack_consumed);
				return XDP_DROP;
			}
			f->last_ack = t->seq;
			t->ack = f->req_end;
			t->tsval = reply_stamp(req, unit, fin, t, o->tsecr);
			COUNT(tcp_request_acked);
			return tcp_send(ctx, req, t, 0);
		}
		if (f && f->multi && (__s32)(t->seq - f->reply_start) >= 0 && (__s32)(t->seq - f->reply_end) < 0) {
			/* a reply of several segments is not all acked: a repeated
			 * ack, or one with SACK blocks above it (not a D-SACK of
			 * a duplicate), says a segment went missing */
			int repeated = (o->sack_blocks && (__s32)(o->sack_left - t->seq) > 0) || t->seq == f->last_ack;
			if (t->seq != f->last_ack)
				f->resends = 0;
			f->last_ack = t->seq;
			if (repeated) {
				const struct santa_rule *r = rule_of_ref(&f->rule);
				if (!r)
					return reply_gone(ctx, req, f, t, o, unit, f->req_seq);
				if (r->ncopies) {
					COUNT(tcp_drop_resend_copies);
					return XDP_DROP;
				}
				/* a segment the path cannot carry (a hop's smaller
				 * MTU) would be resent for every ack it provokes */
				if (f->resends >= SANTA_TCP_RESENDS) {
					COUNT(tcp_resend_limit);
					return XDP_DROP;
				}
				f->resends++;
				COUNT(tcp_resend);
				struct req_bytes none = {};
				return emit_by_tc(ctx, req, f, t->seq - f->reply_start, t, o, unit, 1, none);
			}
		}
		COUNT(tcp_ack_consumed);
		return XDP_DROP;
	}
	/* The flow's last answer: while the client has not acked all of it
	 * (in flight), only its request (retransmitted) may be answered, and
	 * nothing may go to the kernel, whose sequence space would miss it. */
	int in_flight = f && (__s32)(t->seq - f->reply_end) < 0;
	__u32 end = seq + req->payload_len;
	int trimmed = 0;
	if (f && (__s32)(end - f->req_end) <= 0) {
		if (end != f->req_end) {
			COUNT(tcp_drop_old_request);
			return XDP_DROP;
		}
		/* the last request answered, again (a client's retransmission may
		 * carry older unacked requests before it) */
		COUNT(tcp_request_repeated);
		return answer_again(ctx, req, s, f, t, o, unit, in_flight, fin);
	}
	if (fin) { /* only the request answered with the FIN may come again */
		COUNT(tcp_drop_after_fin);
		return XDP_DROP;
	}
	if (f && (__s32)(seq - f->req_end) < 0) {
		/* answered bytes, then new ones (a retransmission that took in
		 * the next request): the reply first; else only the new request
		 * counts, and it cannot go to the kernel with the old bytes */
		if (in_flight) {
			COUNT(tcp_request_repeated);
			return answer_again(ctx, req, s, f, t, o, unit, 1, fin);
		}
		if (req->payload_len > SANTA_REQ_WINDOW ||
		    bpf_xdp_load_bytes(ctx, req->payload_off, s->req, NONZERO(req->payload_len, SANTA_OFF_MASK)) ||
		    !request_checksum_ok(req, s)) {
			COUNT(pass_bad_checksum);
			return XDP_DROP;
		}
		__u32 old = f->req_end - seq;
		req->payload_off += old;
		req->payload_len -= old;
		seq = f->req_end;
		trimmed = 1;
	} else if (in_flight) {
		COUNT(tcp_drop_pipelined);
		return XDP_DROP;
	} else if (f && seq != f->req_end) {
		/* after bytes eBPF has not taken (a request dropped as
		 * pipelined, or lost): an answer, or the kernel's socket made
		 * from this segment, would ack them, and the client would never
		 * send them again. It sends them again first. */
		COUNT(tcp_drop_gap);
		return XDP_DROP;
	}
	__u32 slot = 0;
	const struct santa_rule *r = match_request(ctx, req, s, cookie, id, rs, &slot);
	if (!r)
		return trimmed ? answer_again(ctx, req, s, f, t, o, unit, 0, fin) : XDP_PASS;
	__u32 mss = opts_mss(opts) - TS_OPTION_LEN;
	int multi = r->reply_len > mss;
	if (multi && (r->ncopies || r->reply_len > SANTA_TCP_SEGMENTS * mss)) {
		COUNT(tcp_handover_long_reply);
		return trimmed ? answer_again(ctx, req, s, f, t, o, unit, 0, fin) : XDP_PASS;
	}
	int close = r->flags & SANTA_RULE_CLOSE;
	struct santa_tcp_flow nf = {
		.req_seq = seq,
		.req_end = seq + req->payload_len,
		.reply_start = t->seq,
		.multi = multi,
		.opts = opts | SANTA_FLOW_OPTS_KNOWN,
		.last_ack = t->seq,
		.seen = unit,
		.uid = uid,
	};
	nf.reply_end = nf.reply_start + r->reply_len + (close ? 1 : 0);
	rule_ref_set(&nf.rule, slot, r);
	__u8 ws = opts_wscale(opts);
	if (nf.reply_end - t->seq > ((__u32)bpf_ntohs(th->window) << (ws == OPTS_NO_WSCALE ? 0 : ws))) {
		COUNT(tcp_handover_window);
		return trimmed ? answer_again(ctx, req, s, f, t, o, unit, 0, fin) : XDP_PASS;
	}
	if (!trimmed && !request_checksum_ok(req, s)) {
		COUNT(pass_bad_checksum);
		return XDP_PASS;
	}
	if (f) {
		*f = nf;
	} else if (bpf_map_update_elem(&santa_tcp_flows, &req->tuple, &nf, BPF_ANY)) {
		/* the table is full; no entry means nothing of eBPF's is in
		 * flight: the kernel can take it */
		COUNT(tcp_pass_flows_full);
		return XDP_PASS;
	}
	struct req_bytes rq = { .off = req->payload_off, .len = req->payload_len };
	if (multi) {
		COUNT(tcp_long_reply);
		return emit_by_tc(ctx, req, &nf, t->seq - nf.reply_start, t, o, unit, 0, rq);
	}
	t->flags |= TCP_PSH | (close ? TCP_FIN : 0);
	t->ack = seq + req->payload_len;
	t->tsval = reply_stamp(req, unit, close, t, o->tsecr);
	int verdict = tcp_send(ctx, req, t, slot);
	if (verdict != TCP_NO_ROOM)
		return verdict;
	/* TC sends it, as a long reply: mark the entry written above in place */
	if (!f)
		f = bpf_map_lookup_elem(&santa_tcp_flows, &req->tuple);
	if (!f) {
		COUNT(tcp_emit_failed);
		return XDP_DROP; /* the client asks again */
	}
	f->multi = nf.multi = 1;
	COUNT(tcp_xdp_no_room);
	return emit_by_tc(ctx, req, &nf, 0, t, o, unit, 0, rq);
}
