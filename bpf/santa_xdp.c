// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The rule processor at XDP: answers UDP requests that match a rule of the
 * socket the kernel would deliver them to, and runs the socket-less TCP path
 * for listeners with rules (docs/tcp.md); passes everything else untouched. */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "santa.h"
#include "maps.h"
#include "parsing.h"
#include "csum.h"
#include "matcher.h"
#include "reply.h"
#include "tcp.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

static __always_inline int count_parse_result(int err)
{
	switch (err) {
	case PARSE_NOT_IP: COUNT(pass_not_ip); break;
	case PARSE_NOT_UNICAST: COUNT(pass_not_unicast); break;
	case PARSE_NOT_UDP_TCP: COUNT(pass_not_udp); break;
	case PARSE_IP_OPTIONS: COUNT(pass_ip_options); break;
	case PARSE_IPV6_EXT: COUNT(pass_ipv6_ext); break;
	case PARSE_FRAGMENT: COUNT(pass_fragment); break;
	case PARSE_BAD_ADDRESS: COUNT(pass_bad_address); break;
	case PARSE_VLAN: COUNT(pass_vlan); break;
	default: COUNT(pass_malformed); break;
	}
	return XDP_PASS;
}

/* The UDP socket the kernel would deliver the request to, looked up on
 * the interface it arrived on (NULL: none), to be released. */
static __always_inline struct bpf_sock *lookup_udp(struct xdp_md *ctx, struct pkt_info *req)
{
	__u32 tuple_len = req->family == 4 ? sizeof(req->tuple.ipv4) : sizeof(req->tuple.ipv6);
	return bpf_sk_lookup_udp(ctx, &req->tuple, tuple_len, BPF_F_CURRENT_NETNS, 0);
}

/* The cookie of the socket this request would be delivered to (read
 * through a BTF cast, bpf/tcp.h); *found says there is one. A socket's
 * cookie is made when first asked for (SO_COOKIE): santad asks before
 * binding rules, so a socket without one (cookie 0) has no rules. */
static __always_inline __u64 receiving_socket(struct xdp_md *ctx, struct pkt_info *req, int *found)
{
	struct bpf_sock *sk = lookup_udp(ctx, req);
	if (!sk)
		return 0;
	struct sock *ksk = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct sock));
	__u64 cookie = ksk->__sk_common.skc_cookie.counter;
	*found = 1;
	bpf_sk_release(sk);
	return cookie;
}

extern void *bpf_cast_to_kern_ctx(void *obj) __ksym;

/* A socket that would receive the request may have a rule set: one bound to
 * its local port has (santa_ports), or an sk_lookup program in the
 * interface's namespace may deliver it to a socket bound to another port
 * (the socket lookup runs it). Only then is the socket looked up. */
static __always_inline int port_may_have_ruleset(struct xdp_md *ctx, const struct pkt_info *req)
{
	if (port_in(local_port(req), req->proto == IPPROTO_TCP ? SANTA_PORTS_TCP : SANTA_PORTS_UDP))
		return 1;
	struct xdp_buff *xdp = bpf_cast_to_kern_ctx(ctx);
	return xdp->rxq->dev->nd_net.net->bpf.run_array[NETNS_BPF_SK_LOOKUP] != NULL;
}

/* What santa_local_addrs says of an address: 0 if it is no address of this
 * host, else SANTA_ADDR_LOCAL or SANTA_ADDR_BROADCAST. A source rarely is
 * one, and its slot in santa_local_filter says so without a lookup; the
 * destination of a request to a wildcard-bound socket always is, and this
 * CPU's cache answers it while its santa_gens word has not moved. */
static __always_inline __u8 local_addr_kind(struct xdp_md *ctx, struct santa_scratch *s, __u8 family,
					    const void *addr)
{
	struct santa_local_addr key __attribute__((aligned(8))) = { /* hashed as words */
		.ifindex = ctx->ingress_ifindex,
		.family = family,
	};
	if (family == 4)
		__builtin_memcpy(key.addr, addr, 4);
	else
		__builtin_memcpy(key.addr, addr, 16);
	__u32 slot = local_filter_slot(&key);
	__u32 *n = bpf_map_lookup_elem(&santa_local_filter, &slot);
	if (n && *n == 0)
		return 0;
	__u32 word = SANTA_GEN_LOCAL_ADDRS;
	__u64 *gen_now = bpf_map_lookup_elem(&santa_gens, &word);
	/* read before the lookup: a change after it moves gen past this */
	__u64 gen = gen_now ? *(volatile __u64 *)gen_now : 0;
	struct santa_local_cache *c = &s->local[slot & (SANTA_LOCAL_CACHE - 1)];
	const __u64 *k = (const __u64 *)&key, *ck = (const __u64 *)&c->key;
	if (gen_now && c->gen == gen && ck[0] == k[0] && ck[1] == k[1] && ck[2] == k[2])
		return c->kind;
	__u8 *kind = bpf_map_lookup_elem(&santa_local_addrs, &key);
	c->key = key;
	c->gen = gen;
	c->kind = kind ? *kind : 0;
	return c->kind;
}

/* The frame is addressed to the interface's MAC: the kernel drops a unicast
 * frame for another host (PACKET_OTHERHOST), which a promiscuous interface,
 * a bridge port or a flooding switch hands it. (On the loopback device,
 * where BPF_PROG_RUN runs by default, there is no MAC to compare.) */
static __always_inline int frame_for_interface(struct xdp_md *ctx)
{
	const struct ethhdr *eth = (void *)(long)ctx->data;
	if ((void *)(eth + 1) > (void *)(long)ctx->data_end)
		return 0;
	struct net_device *dev = ((struct xdp_buff *)bpf_cast_to_kern_ctx(ctx))->rxq->dev;
	if (dev->flags & IFF_LOOPBACK)
		return 1;
	__u8 mac[8] = {};
	if (bpf_probe_read_kernel(mac, 6, dev->dev_addr))
		return 0;
	return *(__u32 *)mac == *(const __u32 *)eth->h_dest &&
	       *(__u16 *)(mac + 4) == *(const __u16 *)(eth->h_dest + 4);
}

/* The kernel would deliver the request to the socket the lookup found
 * (counted if not): the frame is for this interface, its source is no
 * address of this host nor a broadcast address (a martian), and its
 * destination is an address of this host, since the socket lookup does no
 * routing (a wildcard-bound socket, or one bound with IP_FREEBIND or to an
 * address since removed, matches any). */
static __always_inline int kernel_would_deliver(struct xdp_md *ctx, struct santa_scratch *s,
						struct pkt_info *req)
{
	if (!frame_for_interface(ctx)) {
		COUNT(pass_other_host);
		return 0;
	}
	const void *src = req->family == 4 ? (void *)&req->tuple.ipv4.saddr : (void *)req->tuple.ipv6.saddr;
	const void *dst = req->family == 4 ? (void *)&req->tuple.ipv4.daddr : (void *)req->tuple.ipv6.daddr;
	if (local_addr_kind(ctx, s, req->family, src) ||
	    local_addr_kind(ctx, s, req->family, dst) != SANTA_ADDR_LOCAL) {
		COUNT(pass_not_local);
		return 0;
	}
	return 1;
}

/* Another socket on ksk's port, in its network namespace, is bound to an
 * interface (SO_BINDTODEVICE): on a master, one bound to the master
 * outranks ksk, which is bound to none (sockets share a port with
 * SO_REUSEADDR, any user's, or SO_REUSEPORT). It walks the port's slot of
 * the UDP hash table, SANTA_PORT_SHARERS sockets at most. */
static __always_inline int port_shared_with_bound(struct sock *ksk)
{
	struct net *net = BPF_CORE_READ(ksk, __sk_common.skc_net.net); /* compared as a number */
	__u16 port = ksk->__sk_common.skc_num;
	__u64 cookie = ksk->__sk_common.skc_cookie.counter;
	struct udp_table *table = BPF_CORE_READ(net, ipv4.udp_table);
	__u32 slot = (port + BPF_CORE_READ(net, hash_mix)) & BPF_CORE_READ(table, mask);
	struct udp_hslot *hslot = (void *)BPF_CORE_READ(table, hash) + slot * bpf_core_type_size(struct udp_hslot);
	struct hlist_node *node = BPF_CORE_READ(hslot, head.first);
	for (int i = 0; i < SANTA_PORT_SHARERS; i++) {
		if (!node)
			return 0;
		struct sock *other = (void *)node - bpf_core_field_offset(struct sock, __sk_common.skc_node);
		if (BPF_CORE_READ(other, __sk_common.skc_num) == port &&
		    BPF_CORE_READ(other, __sk_common.skc_net.net) == net &&
		    BPF_CORE_READ(other, __sk_common.skc_bound_dev_if) &&
		    BPF_CORE_READ(other, __sk_common.skc_cookie.counter) != cookie)
			return 1;
		node = BPF_CORE_READ(node, next);
	}
	return 1;
}

/* The kernel may deliver the request to another socket than the one the
 * lookup on this interface finds, once it hands the frame to a master and
 * looks the socket up there: the socket is bound to this interface (made
 * a port after the bind), which gets nothing there, or to none, and shares
 * its port with one bound to an interface, maybe the master, which the
 * kernel prefers there. A TCP listener bound to none shares its port and
 * address with no other user's listener (the kernel refuses the second
 * listen whatever SO_REUSEADDR says; only SO_REUSEPORT sockets of one user
 * share them, one of which the program does not look for). */
static __always_inline int outranked_on_master(struct xdp_md *ctx, struct pkt_info *req)
{
	if (req->proto == IPPROTO_TCP) {
		__u32 tuple_len = req->family == 4 ? sizeof(req->tuple.ipv4) : sizeof(req->tuple.ipv6);
		struct bpf_sock *sk = bpf_skc_lookup_tcp(ctx, &req->tuple, tuple_len, BPF_F_CURRENT_NETNS, 0);
		if (!sk)
			return 1;
		int bound = sk->bound_dev_if;
		bpf_sk_release(sk);
		return bound;
	}
	struct bpf_sock *sk = lookup_udp(ctx, req);
	if (!sk)
		return 1;
	int outranked = sk->bound_dev_if ||
			port_shared_with_bound(bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct sock)));
	bpf_sk_release(sk);
	return outranked;
}

/* The kernel delivers the request (a UDP datagram, or a TCP segment to a
 * listener) to the socket the lookup on this interface found (counted if
 * not), also when it hands the frame to a master first and looks the
 * socket up there: a port of a bridge, bond, team or Open vSwitch does,
 * and a VRF's interface, where a socket bound to no interface gets nothing
 * unless udp_l3mdev_accept (tcp_l3mdev_accept) is set. */
static __always_inline int master_delivers(struct xdp_md *ctx, struct pkt_info *req)
{
	struct net_device *dev = ((struct xdp_buff *)bpf_cast_to_kern_ctx(ctx))->rxq->dev;
	__u64 priv = BPF_CORE_READ_BITFIELD(dev, priv_flags);
	__u64 port = bpf_core_enum_value(enum netdev_priv_flags, IFF_BRIDGE_PORT) |
		     bpf_core_enum_value(enum netdev_priv_flags, IFF_TEAM_PORT) |
		     bpf_core_enum_value(enum netdev_priv_flags, IFF_OVS_DATAPATH);
	int delivers = 1;
	if (priv & bpf_core_enum_value(enum netdev_priv_flags, IFF_L3MDEV_SLAVE))
		delivers = (req->proto == IPPROTO_TCP ? dev->nd_net.net->ipv4.sysctl_tcp_l3mdev_accept
						      : dev->nd_net.net->ipv4.sysctl_udp_l3mdev_accept) &&
			   !outranked_on_master(ctx, req);
	else if ((priv & port) || (dev->flags & IFF_SLAVE))
		delivers = !outranked_on_master(ctx, req);
	if (!delivers)
		COUNT(pass_under_master);
	return delivers;
}

/* Copy the first bytes of an unmatched request to the miss-sample ring,
 * within the rule set's per-CPU budget. */
static __always_inline void sample_miss(__u64 cookie, __u32 rs_id, const struct santa_ruleset *rs,
					const struct santa_scratch *s, struct pkt_info *req)
{
	if (!rs->sample_len)
		return;
	struct santa_sample_budget *b = bpf_map_lookup_elem(&santa_sample_budget, &rs_id);
	if (!b)
		return;
	__u64 now = bpf_ktime_get_coarse_ns(); /* a jiffy's precision is plenty for 1 s windows */
	if (now - b->window_start >= 1000000000ull) {
		b->window_start = now;
		b->used = 0;
	}
	if (b->used >= rs->sample_per_sec) {
		COUNT(miss_sample_limited);
		return;
	}
	b->used++;
	struct santa_miss_sample *m = bpf_ringbuf_reserve(&santa_miss_samples, sizeof(*m), 0);
	if (!m) {
		COUNT(miss_sample_dropped);
		return;
	}
	m->cookie = cookie;
	m->ruleset = rs_id;
	m->len = req->payload_len;
	__u32 caplen = req->payload_len < rs->sample_len ? req->payload_len : rs->sample_len;
	if (caplen > SANTA_SAMPLE_MAX)
		caplen = SANTA_SAMPLE_MAX;
	m->caplen = caplen;
	m->family = req->family;
	/* a plain copy of this size is not inlined; the helper copies what was taken */
	if (caplen > 0)
		bpf_probe_read_kernel(m->data, caplen, s->req);
	/* Wake the reader only once the ring is a quarter full: it also looks
	 * every 100 ms (MissSamples.Read), and a wakeup per sample cost santad
	 * and its controllers more than the samples themselves. */
	__u64 quarter = bpf_ringbuf_query(&santa_miss_samples, BPF_RB_RING_SIZE) / 4;
	bpf_ringbuf_submit(m, bpf_ringbuf_query(&santa_miss_samples, BPF_RB_AVAIL_DATA) >= quarter ?
				      BPF_RB_FORCE_WAKEUP : BPF_RB_NO_WAKEUP);
	COUNT(miss_sampled);
}

/* The request's UDP or TCP checksum is valid, in the partial form of a
 * locally generated packet (the field holds the folded pseudo-header sum),
 * or absent (UDP over IPv4). A TCP header must be in s->l4; a UDP header's
 * sum is made from what the parser kept. Global, so the verifier checks it
 * once. */
__noinline int request_checksum_ok(struct pkt_info *req, const struct santa_scratch *s)
{
	if (!req || !s)
		return 0;
	__u16 check = req->l4_check;
	if (check == 0 && req->proto == IPPROTO_UDP)
		return req->family == 4;
	__u32 l4_len = req->l4_len + req->payload_len;
	__u64 pseudo = csum_pseudo(&req->tuple, req->family, req->proto, l4_len);
	if (check == csum_fold64(pseudo))
		return 1;
	__u64 sum = pseudo;
	if (req->proto == IPPROTO_UDP) /* the UDP header: ports, length, checksum */
		sum += (req->family == 4 ? (__u32)req->tuple.ipv4.sport + req->tuple.ipv4.dport :
					   (__u32)req->tuple.ipv6.sport + req->tuple.ipv6.dport) +
		       bpf_htons((__u16)l4_len) + check;
	else
		sum += csum_words(s->l4, req->l4_len & 63, 8);
	sum += santa_csum_req(s, 0, req->payload_len);
	return csum_fold64(sum) == 0xffff;
}

/* Load the request's transport header into s->l4. */
static __always_inline int load_l4_header(struct xdp_md *ctx, struct pkt_info *req, struct santa_scratch *s)
{
	return bpf_xdp_load_bytes(ctx, req->l2_len + req->l3_len, s->l4, NONZERO(req->l4_len, 63));
}

/* Copy the first len bytes (8 to 128) of the frame to hdr (to_frame 0) or
 * of hdr to the frame (to_frame 1) with direct 8-byte accesses, the last one
 * overlapping: cheaper than a helper call; 0 on success. to_frame is a
 * constant at each call, so the branch folds away. */
static __always_inline int move_headers(struct xdp_md *ctx, __u8 *hdr, __u32 len, int to_frame)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	if (len < 8 || len > 128)
		return -1;
	for (__u32 i = 0; i < 16; i++) {
		__u32 at = i * 8;
		if (at + 8 > len)
			break;
		if (data + at + 8 > end)
			return -1;
		if (to_frame)
			*(__u64 *)(data + at) = *(const __u64 *)(hdr + at);
		else
			*(__u64 *)(hdr + at) = *(const __u64 *)(data + at);
	}
	__u32 last = (len - 8) & 127;
	if (data + last + 8 > end)
		return -1;
	if (to_frame)
		*(__u64 *)(data + last) = *(const __u64 *)(hdr + last);
	else
		*(__u64 *)(hdr + last) = *(const __u64 *)(data + last);
	return 0;
}

/* Load the request's Ethernet and IP headers into s->hdr and turn them into
 * the reply's, for a transport segment of l4_len bytes. Returns their length
 * (the transport header goes there) or 0. */
static __always_inline __u32 reverse_l2_l3(struct xdp_md *ctx, struct pkt_info *req,
					   struct santa_scratch *s, __u32 l4_len)
{
	__u32 l23 = req->l2_len + req->l3_len;
	if (l23 > 58 || move_headers(ctx, s->hdr, l23, 0))
		return 0;
	reverse_addresses(s->hdr, req);
	set_l3_lengths(s->hdr, req, l4_len);
	return l23;
}

/* Write rule r's UDP reply headers into s->hdr. Returns their length or 0. */
static __always_inline __u32 build_udp_headers(struct xdp_md *ctx, struct pkt_info *req,
					       struct santa_scratch *s, const struct santa_rule *r,
					       const struct santa_page *page)
{
	__u32 l23 = reverse_l2_l3(ctx, req, s, sizeof(struct udphdr) + r->reply_len);
	if (!l23)
		return 0;
	return write_udp_header(s, l23, req, r, page, 0);
}

/* How far the frame can grow, as bpf_xdp_adjust_head and _tail check it:
 * at the head down to the xdp_frame and metadata the kernel keeps there,
 * at the tail up to the skb_shared_info it reserves at the frame's end.
 * tail is -1 (unknown) for a frame in several buffers, which grows at the
 * tail of its last. Read from the kernel's xdp_buff, so that a reply that
 * cannot fit costs no failed helper calls (veth leaves a frame copied from
 * a local sender only its rounding to 64 bytes as tailroom, and most of
 * the TCP replies to such frames go by TC). */
struct frame_room {
	int head;
	int tail;
};

static __always_inline struct frame_room frame_room(struct xdp_md *ctx)
{
	struct xdp_buff *xdp = bpf_cast_to_kern_ctx(ctx);
	long data = (long)xdp->data, meta = (long)xdp->data_meta, start = (long)xdp->data_hard_start;
	long kept = bpf_core_type_size(struct xdp_frame) + (meta <= data ? data - meta : 0);
	long shinfo = (bpf_core_type_size(struct skb_shared_info) + 63) & ~63l; /* SKB_DATA_ALIGN */
	struct frame_room room = {
		.head = data - start - kept,
		.tail = xdp->flags & XDP_FLAGS_HAS_FRAGS ? -1 :
			start + xdp->frame_sz - shinfo - (long)xdp->data_end,
	};
	return room;
}

/* A frame of new_len bytes fits where this one is (or may: room unknown). */
static __always_inline int frame_fits(struct xdp_md *ctx, __u32 new_len)
{
	int delta = (int)new_len - (int)(ctx->data_end - ctx->data);
	struct frame_room room = frame_room(ctx);
	return delta <= 0 || room.tail < 0 || delta <= room.head + room.tail;
}

/* Resize the frame to new_len bytes: grow into the headroom (the headers
 * are rewritten anyway), else at the tail, else at both (veth's copied
 * frames: a reply 217 to 279 bytes longer than its request fits only
 * that way). A helper that refuses what frame_room promised is not the
 * end: the next way is tried. Shrink at the tail. On failure the frame is
 * unchanged. */
static __always_inline int resize_frame(struct xdp_md *ctx, __u32 new_len)
{
	int delta = (int)new_len - (int)(ctx->data_end - ctx->data);
	if (delta == 0)
		return 0;
	if (delta < 0)
		return bpf_xdp_adjust_tail(ctx, delta);
	struct frame_room room = frame_room(ctx);
	if (delta <= room.head && bpf_xdp_adjust_head(ctx, -delta) == 0)
		return 0;
	if ((room.tail < 0 || delta <= room.tail) && bpf_xdp_adjust_tail(ctx, delta) == 0)
		return 0;
	int head = room.head;
	if (head <= 0 || delta <= head || (room.tail >= 0 && delta > head + room.tail) ||
	    bpf_xdp_adjust_tail(ctx, delta - head))
		return -1;
	if (bpf_xdp_adjust_head(ctx, -head) == 0)
		return 0;
	bpf_xdp_adjust_tail(ctx, head - delta);
	return -1;
}

/* Apply copy cp of rule r to the reply at frame offset at, which already
 * holds the template: a copy of up to 8 bytes is merged with the template's
 * next 8 bytes (read from the page: reading them back from the frame would
 * stall on the store that just wrote them) and stored directly; a longer
 * one, or one at the frame's end, is written by the helper. */
static __always_inline int apply_copy(struct xdp_md *ctx, const struct santa_scratch *s,
				      const struct santa_page *page, const struct santa_rule *r,
				      const struct santa_copy *cp, __u32 at)
{
	void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
	__u8 *p = data + (at & 4095);
	__u64 tpl = *(const __u64 *)(page->b + ((r->tpl + cp->dst) & (SANTA_PAGE_DATA - 1)));
	if (cp->mask) {
		/* the template has zeros where a masked copy's bits go */
		__u64 v = masked_copy_bits(s, page, r, cp) | tpl;
		if ((void *)(p + 8) <= end) {
			*(__u64 *)p = v;
			return 0;
		}
		return bpf_xdp_store_bytes(ctx, at, &v, NONZERO(cp->len, SANTA_MAX_COPY_MASK - 1));
	}
	if (cp->len <= 8 && (void *)(p + 8) <= end) {
		__u64 keep = cp->len == 8 ? 0 : ~0ull << (cp->len * 8);
		__u64 v = *(const __u64 *)(s->req + (cp->src & SANTA_OFF_MASK));
		*(__u64 *)p = (tpl & keep) | (v & ~keep);
		return 0;
	}
	return bpf_xdp_store_bytes(ctx, at, (void *)s->req + (cp->src & SANTA_OFF_MASK),
				   NONZERO(cp->len, SANTA_OFF_MASK));
}

/* The counters of the rule in slot, their first word already loaded: with
 * many rules they miss the cache, and asking as soon as the rule is known
 * lets that miss overlap the work before the reply is counted. */
static __always_inline struct santa_rule_counters *rule_counters(__u32 slot)
{
	struct santa_rule_counters *c = bpf_map_lookup_elem(&santa_rule_stats, &slot);
	if (c)
		(void)*(volatile __u64 *)&c->hits;
	return c;
}

/* Replace the frame by the headers in s->hdr and rule r's reply (if r),
 * and count it in st (the rule's counters, from rule_counters). */
static __always_inline int send_frame(struct xdp_md *ctx, struct santa_scratch *s, __u32 hdr_len,
				      const struct santa_rule *r, const struct santa_page *page,
				      struct santa_rule_counters *st)
{
	__u32 reply_len = r ? r->reply_len : 0;
	if (resize_frame(ctx, hdr_len + reply_len)) {
		COUNT(pass_no_room);
		return XDP_PASS;
	}
	/* From here on the request is gone: a failure must drop, not pass. */
	if (move_headers(ctx, s->hdr, hdr_len, 1))
		goto fail;
	if (!r || !page)
		return XDP_TX;
	if (bpf_xdp_store_bytes(ctx, hdr_len, (void *)page->b + (r->tpl & (SANTA_PAGE_DATA - 1)),
				NONZERO(reply_len, SANTA_OFF_MASK)))
		goto fail;
	for (__u32 k = 0; k < SANTA_MAX_COPIES; k++) {
		if (k >= r->ncopies)
			break;
		const struct santa_copy *cp = rule_copy(r, k);
		if (apply_copy(ctx, s, page, r, cp, hdr_len + cp->dst))
			goto fail;
	}
	if (st) {
		st->hits++;
		st->bytes += hdr_len + reply_len;
	}
	COUNT(answered);
	return XDP_TX;
fail:
	COUNT(pass_error);
	return XDP_DROP;
}

/* The data page of rule r, counting why not if it has none. */
static __always_inline const struct santa_page *rule_page(const struct santa_rule *r)
{
	__u32 page_id = r->page;
	const struct santa_page *page = bpf_map_lookup_elem(&santa_pages, &page_id);
	if (!page)
		COUNT(pass_error);
	return page;
}

/* The MTU of the interface the request came in on (the reply leaves by it). */
static __always_inline __u32 interface_mtu(struct xdp_md *ctx)
{
	return ((struct xdp_buff *)bpf_cast_to_kern_ctx(ctx))->rxq->dev->mtu;
}

/* An IP packet of ip_len bytes fits that MTU (read every time: an IPv4
 * link's MTU may be below IPv6's minimum of 1280). */
static __always_inline int fits_mtu(struct xdp_md *ctx, __u32 ip_len)
{
	return ip_len <= interface_mtu(ctx);
}

/* Pass the UDP request to TC with metadata that has it send the reply of
 * rule r (in slot), which the frame has no room for: TC can grow an skb. */
static __always_inline int udp_emit_by_tc(struct xdp_md *ctx, __u32 slot, const struct santa_rule *r)
{
	if (bpf_xdp_adjust_meta(ctx, -(int)sizeof(struct santa_udp_emit))) {
		COUNT(pass_no_room);
		return XDP_PASS;
	}
	struct santa_udp_emit *e = (void *)(long)ctx->data_meta;
	if ((void *)(e + 1) > (void *)(long)ctx->data) {
		COUNT(pass_no_room);
		return XDP_PASS;
	}
	e->magic = SANTA_UDP_EMIT_MAGIC;
	e->pad = 0;
	rule_ref_set(&e->rule, slot, r);
	COUNT(udp_xdp_no_room);
	return XDP_PASS;
}

/* Turn the UDP request into rule r's reply (in slot): in place, or by TC if
 * the frame cannot grow to it. */
static __always_inline int answer_udp(struct xdp_md *ctx, struct pkt_info *req,
				      struct santa_scratch *s, __u32 slot, const struct santa_rule *r,
				      struct santa_rule_counters *st)
{
	/* an IPv4 MTU-sized reply does not fit IPv6's larger header, nor any
	 * reply a smaller MTU than 1500 (it would have to be fragmented) */
	__u32 ip_len = req->l3_len + sizeof(struct udphdr) + r->reply_len;
	if (r->reply_len == 0 || ip_len > SANTA_MAX_REPLY + 28 || !fits_mtu(ctx, ip_len)) {
		COUNT(pass_reply_too_big);
		return XDP_PASS;
	}
	if (!frame_fits(ctx, req->l2_len + ip_len))
		return udp_emit_by_tc(ctx, slot, r);
	const struct santa_page *page = rule_page(r);
	if (!page)
		return XDP_PASS;
	__u32 hdr_len = build_udp_headers(ctx, req, s, r, page);
	if (!hdr_len) {
		COUNT(pass_error);
		return XDP_PASS;
	}
	return send_frame(ctx, s, hdr_len, r, page, st);
}

/* The rule set id of the socket with cookie, 0 if it has none: what
 * santa_sockets says, from this CPU's cache while its santa_gens word has not
 * moved (the hash lookup cost as much as all the socket's other checks). */
static __always_inline __u32 socket_ruleset_id(struct santa_scratch *s, __u64 cookie)
{
	__u32 word = SANTA_GEN_SOCKETS;
	__u64 *gen_now = bpf_map_lookup_elem(&santa_gens, &word);
	if (!gen_now)
		return 0;
	/* read before the lookup: a change after it moves gen past this */
	__u64 gen = *(volatile __u64 *)gen_now;
	struct santa_socket_cache *c = &s->sockets[cookie & (SANTA_SOCKET_CACHE - 1)];
	if (c->cookie == cookie && c->gen == gen)
		return c->ruleset;
	__u32 *rs_id = bpf_map_lookup_elem(&santa_sockets, &cookie);
	c->cookie = cookie;
	c->gen = gen;
	c->ruleset = rs_id ? *rs_id : 0;
	return c->ruleset;
}

/* The rule set of the socket with cookie, with its id, or NULL (counted). */
static __always_inline const struct santa_ruleset *socket_ruleset(struct santa_scratch *s, __u64 cookie,
								  __u32 *id)
{
	*id = socket_ruleset_id(s, cookie);
	const struct santa_ruleset *rs = *id ? bpf_map_lookup_elem(&santa_rulesets, id) : NULL;
	if (!rs)
		COUNT(pass_no_ruleset);
	return rs;
}

/* Copy the payload into s->req and find the rule that answers it. Returns
 * the rule (its slot in *slot), or NULL with the reason counted and a miss
 * sampled. */
static __always_inline const struct santa_rule *match_request(struct xdp_md *ctx, struct pkt_info *req,
							      struct santa_scratch *s, __u64 cookie,
							      __u32 id, const struct santa_ruleset *rs,
							      __u32 *slot)
{
	if (req->payload_len > SANTA_REQ_WINDOW) {
		COUNT(pass_too_long);
		return NULL;
	}
	if (req->payload_len == 0) {
		COUNT(pass_no_match); /* every rule needs at least one payload byte */
		return NULL;
	}
	if (bpf_xdp_load_bytes(ctx, req->payload_off, s->req, NONZERO(req->payload_len, SANTA_OFF_MASK))) {
		COUNT(pass_error);
		return NULL;
	}
	struct match_notes notes;
	*slot = match_rules(id, rs, s, req->payload_len, &notes);
	if (notes.truncated)
		COUNT(chain_truncated);
	if (!*slot) {
		if (notes.invalidated)
			COUNT(pass_invalidated);
		else if (notes.expired)
			COUNT(pass_expired);
		else
			COUNT(pass_no_match);
		sample_miss(cookie, id, rs, s, req);
		return NULL;
	}
	const struct santa_rule *r = bpf_map_lookup_elem(&santa_rules, slot);
	if (!r)
		COUNT(pass_error);
	return r;
}

/* The per-CPU scratch area. */
static __always_inline struct santa_scratch *scratch(void)
{
	__u32 zero = 0;
	struct santa_scratch *s = bpf_map_lookup_elem(&santa_scratch, &zero);
	if (!s)
		COUNT(pass_error);
	return s;
}

/* A UDP datagram. Global, so the verifier checks it once. */
__noinline int udp_request(struct xdp_md *ctx, struct pkt_info *req)
{
	if (!req)
		return XDP_PASS;
	int found = 0;
	__u64 cookie = receiving_socket(ctx, req, &found);
	if (!found) {
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
	__u32 slot = 0;
	const struct santa_rule *r = match_request(ctx, req, s, cookie, id, rs, &slot);
	if (!r)
		return XDP_PASS;
	struct santa_rule_counters *st = rule_counters(slot);
	if (!request_checksum_ok(req, s)) {
		COUNT(pass_bad_checksum);
		return XDP_PASS;
	}
	if (!kernel_would_deliver(ctx, s, req) || !master_delivers(ctx, req))
		return XDP_PASS;
	return answer_udp(ctx, req, s, slot, r, st);
}

#include "tcp_responder.h"

SEC("xdp")
int santa_xdp(struct xdp_md *ctx)
{
	struct pkt_info req = {};
	int err = parse_request((void *)(long)ctx->data, (void *)(long)ctx->data_end, &req, 1);
	if (err)
		return count_parse_result(err);
	if (!port_may_have_ruleset(ctx, &req)) {
		COUNT(pass_port_unbound);
		return XDP_PASS;
	}
	if (req.proto == IPPROTO_TCP)
		return tcp_segment(ctx, &req);
	return udp_request(ctx, &req);
}
