/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* The socket-less TCP path's building blocks, shared by the XDP responder
 * and the TC handover: TCP options, and the stamps that prove a connection.
 *
 * A stamp is the TSval eBPF sends; the client echoes it in TSecr, which is
 * how a later segment proves that eBPF answered its SYN, with no state kept:
 *
 *   bits 31..26  time unit (2^33 ns of CLOCK_MONOTONIC), low 6 bits
 *   bit  25      eBPF has sent its FIN
 *   bits 24..18  the options negotiated in the handshake (mss index, window
 *                scale, SACK), needed to hand the connection to the kernel
 *   bits 17..0   SipHash-2-4 of (4-tuple, family, fin, options, full unit,
 *                the listener's owner) under the key of the unit's epoch,
 *                low 18 bits
 *
 * The MAC covers every other bit, so the options cannot be changed without
 * breaking it. It covers the owner (sk_uid) of the listener that answered
 * the SYN too: a stamp proves the connection only to a listener of the same
 * user, never to another user's that took the port since. A stamp older
 * than SANTA_TCP_VALID_UNITS units is refused: no replay beyond that. The
 * time bits make stamps grow, as PAWS wants (a stamp's bits below the time
 * bits are fixed for one unit and connection). */
#pragma once

#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_core_read.h>
#include "santa.h"
#include "maps.h"
#include "parsing.h"
#include "siphash.h"
#include "csum.h"

#define TCP_FIN 0x01
#define TCP_SYN 0x02
#define TCP_RST 0x04
#define TCP_PSH 0x08
#define TCP_ACK 0x10
#define TCP_URG 0x20

/* Point ref at the rule in slot. */
static __always_inline void rule_ref_set(struct santa_rule_ref *ref, __u32 slot, const struct santa_rule *r)
{
	ref->id = r->id;
	ref->slot = slot;
	ref->ruleset = r->ruleset;
	ref->generation = r->generation;
}

/* The rule ref names, if its slot still holds it (a rule's slot, rule set
 * and generation never change; a new version has another generation). */
static __always_inline const struct santa_rule *rule_of_ref(const struct santa_rule_ref *ref)
{
	__u32 slot = ref->slot;
	const struct santa_rule *r = bpf_map_lookup_elem(&santa_rules, &slot);
	if (!r || r->id != ref->id || r->ruleset != ref->ruleset || r->generation != ref->generation)
		return NULL;
	return r;
}

/* XDP may not call bpf_get_socket_cookie, and no helper reads a socket's
 * owner: a read-only BTF cast of the socket reads both. */
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym;

#define SANTA_NO_UID 0xffffffff /* the kernel's INVALID_UID: no socket has it */

/* The owner (sk_uid) of socket sk, whose state the caller read (once: the
 * verifier allows no pointer arithmetic on a socket, which the compiler
 * makes of repeated reads): SANTA_NO_UID for time-wait and request
 * sockets, which are no struct sock. */
static __always_inline __u32 sock_uid(struct bpf_sock *sk, __u32 state)
{
	if (state == BPF_TCP_TIME_WAIT || state == BPF_TCP_NEW_SYN_RECV)
		return SANTA_NO_UID;
	struct sock *ksk = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct sock));
	return ksk->sk_uid.val;
}

#define STAMP_MAC_BITS 18
#define STAMP_OPTS_SHIFT 18
#define STAMP_FIN (1u << 25)
#define STAMP_TIME_SHIFT 26
#define OPTS_NO_WSCALE 15

/* The options of a TCP header that matter here. */
struct tcp_opts {
	__u16 mss;      /* 0: absent */
	__u8 wscale;    /* OPTS_NO_WSCALE: absent */
	__u8 sack_ok;
	__u8 has_ts;
	__u8 bad;       /* malformed option list */
	__u8 sack_blocks; /* a SACK option */
	__u32 sack_left;  /* its first block's left edge: above the ack, the client misses data */
	__u32 tsval;
	__u32 tsecr;
};

/* What a reply segment carries besides its payload. */
struct tcp_reply {
	__u8 flags;
	__u8 syn;     /* a SYN-ACK: the handshake's options */
	__u32 seq;
	__u32 ack;
	__u32 tsval;
	__u32 tsecr;
	__u32 opts;   /* the stamp's option bits */
	__u32 uid;    /* the listener's owner (sk_uid), which the stamp's MAC covers */
	__u16 mss;    /* a SYN-ACK: the MSS announced */
};

/* The MSS values a stamp can carry (2 bits). */
static __always_inline __u16 stamp_mss(__u32 idx)
{
	switch (idx & 3) {
	case 0: return 536;
	case 1: return 1220;
	case 2: return 1440;
	}
	return 1460;
}

/* bpf_loop state of tcp_parse_options. */
struct opts_walk {
	const __u8 *h;
	__u32 doff;
	__u32 i;
	struct tcp_opts *o;
};

/* One option at w->i; 1 ends the walk. */
static long tcp_parse_option(__u64 index, struct opts_walk *w)
{
	__u32 i = w->i;
	if (i >= w->doff || i >= 60)
		return 1;
	const __u8 *h = w->h;
	__u8 kind = h[i & 63];
	if (kind == 0)
		return 1;
	if (kind == 1) {
		w->i = i + 1;
		return 0;
	}
	__u8 len = h[(i + 1) & 63];
	if (i + 1 >= w->doff || len < 2 || i + len > w->doff) {
		w->o->bad = 1;
		return 1;
	}
	const __u8 *v = h + ((i + 2) & 63);
	struct tcp_opts *o = w->o;
	if (kind == 2 && len == 4) {
		o->mss = (__u16)v[0] << 8 | v[1];
	} else if (kind == 3 && len == 3) {
		o->wscale = v[0] > 14 ? 14 : v[0];
	} else if (kind == 4 && len == 2) {
		o->sack_ok = 1;
	} else if (kind == 5 && len >= 10) {
		o->sack_blocks = 1;
		o->sack_left = (__u32)v[0] << 24 | (__u32)v[1] << 16 | (__u32)v[2] << 8 | v[3];
	} else if (kind == 8 && len == 10) {
		o->has_ts = 1;
		o->tsval = (__u32)v[0] << 24 | (__u32)v[1] << 16 | (__u32)v[2] << 8 | v[3];
		o->tsecr = (__u32)v[4] << 24 | (__u32)v[5] << 16 | (__u32)v[6] << 8 | v[7];
	}
	w->i = i + len;
	return 0;
}

/* Parse the options of the TCP header in s->l4 (doff bytes). Global, so
 * that its stack is its own. */
__noinline int tcp_parse_options(struct santa_scratch *s, __u32 doff, struct tcp_opts *o)
{
	if (!s || !o)
		return 0;
	o->wscale = OPTS_NO_WSCALE;
	const __u8 *h = s->l4;
	if (doff == 32 && h[20] == 1 && h[21] == 1 && h[22] == 8 && h[23] == 10) {
		/* NOP NOP TS: what every segment after the handshake carries */
		o->has_ts = 1;
		o->tsval = bpf_ntohl(*(__be32 *)(h + 24));
		o->tsecr = bpf_ntohl(*(__be32 *)(h + 28));
		return 0;
	}
	struct opts_walk w = { .h = h, .doff = doff, .i = sizeof(struct tcphdr), .o = o };
	bpf_loop(40, tcp_parse_option, &w, 0);
	return 0;
}

/* The 7 option bits of a stamp for a client SYN's options, where the
 * client takes segments of client_mss (its option, or the default) and
 * this side's MTU allows up to local_mss. */
static __always_inline __u32 stamp_opts(const struct tcp_opts *o, __u16 client_mss, __u16 local_mss)
{
	/* the largest not above the client's nor ours */
	__u16 mss = client_mss < local_mss ? client_mss : local_mss;
	__u32 idx = mss >= 1460 ? 3 : mss >= 1440 ? 2 : mss >= 1220 ? 1 : 0;
	return idx << 5 | (__u32)o->wscale << 1 | o->sack_ok;
}

static __always_inline __u16 opts_mss(__u32 opts) { return stamp_mss(opts >> 5); }
static __always_inline __u8 opts_wscale(__u32 opts) { return (opts >> 1) & 15; }
static __always_inline __u8 opts_sack(__u32 opts) { return opts & 1; }

/* The coarse clock (a jiffy behind at most) is cheaper to read, and a unit is 8.6 s. */
static __always_inline __u64 stamp_unit(void) { return bpf_ktime_get_coarse_ns() >> SANTA_TCP_UNIT_SHIFT; }

/* A stamp's MAC input: 48 bytes as 6 little-endian words. */
struct stamp_msg {
	__u64 w[6];
};

/* SipHash-2-4 of m. Global, so the verifier checks it once. */
__noinline __u64 siphash24_6(__u64 k0, __u64 k1, const struct stamp_msg *msg)
{
	if (!msg)
		return 0;
	const __u64 *m = msg->w;
	__u64 v0 = SIP_INIT0(k0), v1 = SIP_INIT1(k1), v2 = SIP_INIT2(k0), v3 = SIP_INIT3(k1);
	for (int i = 0; i < 6; i++) {
		v3 ^= m[i];
		SIPROUND(v0, v1, v2, v3);
		SIPROUND(v0, v1, v2, v3);
		v0 ^= m[i];
	}
	__u64 b = 48ull << 56;
	v3 ^= b;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	v0 ^= b;
	v2 ^= 0xff;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	return v0 ^ v1 ^ v2 ^ v3;
}

/* The MAC bits of a stamp of unit for the request's connection under a
 * listener of owner uid, or -1 when no key serves the unit's epoch. Global,
 * so that its stack is its own. */
__noinline __s64 stamp_mac(const struct pkt_info *req, __u64 unit, __u32 fin_opts, __u32 uid)
{
	if (!req)
		return -1;
	__u64 epoch = unit >> SANTA_TCP_EPOCH_SHIFT;
	__u32 slot = epoch % SANTA_TCP_KEYS;
	const struct santa_tcp_key *k = bpf_map_lookup_elem(&santa_tcp_keys, &slot);
	if (!k || k->epoch_plus1 != epoch + 1)
		return -1;
	/* the tuple (36 bytes, zero past an IPv4 tuple), then family, fin and
	 * options, then the unit (below 2^31: ns >> 33) with the owner above
	 * it. Owner 0 adds nothing: root's stamps are those of the versions
	 * before the owner came in, so root's connections outlive an upgrade
	 * from one (docs/tcp.md). */
	const __u32 *t = (const __u32 *)&req->tuple;
	struct stamp_msg m;
#pragma unroll
	for (int i = 0; i < 4; i++)
		m.w[i] = t[2 * i] | (__u64)t[2 * i + 1] << 32;
	m.w[4] = t[8] | (__u64)(fin_opts | (__u32)req->family << 8) << 32;
	m.w[5] = unit | (__u64)uid << 32;
	return siphash24_6(k->k0, k->k1, &m) & ((1u << STAMP_MAC_BITS) - 1);
}

/* A stamp of the current unit for reply t (its options and owner), or 0
 * with no key (0 is never a stamp: its MAC would have to be 0 at unit 0
 * with no options). */
static __always_inline __u32 stamp_make(const struct pkt_info *req, __u64 unit, int fin, const struct tcp_reply *t)
{
	__u32 fin_opts = (fin ? 1 : 0) | t->opts << 1;
	__s64 mac = stamp_mac(req, unit, fin_opts, t->uid);
	if (mac < 0)
		return 0;
	return (__u32)(unit & 63) << STAMP_TIME_SHIFT | (fin ? STAMP_FIN : 0) |
	       t->opts << STAMP_OPTS_SHIFT | (__u32)mac;
}

/* The stamp for reply t, given the client's echo of one that proved the
 * connection to t's owner: the echo itself if it is of this unit with the
 * same FIN bit and options (its MAC would be the same), else a new one. */
static __always_inline __u32 reply_stamp(const struct pkt_info *req, __u64 unit, int fin,
					 const struct tcp_reply *t, __u32 echo)
{
	if ((echo >> STAMP_TIME_SHIFT) == (unit & 63) && !!(echo & STAMP_FIN) == !!fin &&
	    ((echo >> STAMP_OPTS_SHIFT) & 127) == t->opts)
		return echo;
	return stamp_make(req, unit, fin, t);
}

/* The age in units of a stamp, as its time bits tell at unit: above
 * SANTA_TCP_VALID_UNITS it is refused whatever its MAC. */
static __always_inline __u64 stamp_age(__u32 stamp, __u64 unit)
{
	return (unit - (stamp >> STAMP_TIME_SHIFT)) & 63;
}

/* Check a stamp echoed by the client to a listener of owner uid. On
 * success returns 1 and sets its options, FIN bit and age in units. */
static __always_inline int stamp_check(const struct pkt_info *req, __u32 stamp, __u64 unit, __u32 uid,
				       __u32 *opts, int *fin, __u64 *age)
{
	*age = stamp_age(stamp, unit);
	if (*age > SANTA_TCP_VALID_UNITS)
		return 0;
	*opts = (stamp >> STAMP_OPTS_SHIFT) & 127;
	*fin = !!(stamp & STAMP_FIN);
	__s64 mac = stamp_mac(req, unit - *age, (*fin ? 1 : 0) | *opts << 1, uid);
	return mac >= 0 && (__u32)mac == (stamp & ((1u << STAMP_MAC_BITS) - 1));
}

/* The 8 flag bits of a TCP header (FIN ... CWR). */
static __always_inline __u8 tcp_flags(const struct tcphdr *th)
{
	return ((const __u8 *)th)[13];
}

#define SANTA_MSS4 1460 /* the largest MSS eBPF announces: a 1500-byte MTU */
#define SANTA_MSS6 1440
#define SANTA_WINDOW 64240 /* the receive window eBPF announces, as the kernel's first */
#define TS_OPTION_LEN 12 /* NOP NOP TS: what every segment after the SYN-ACK carries */

/* Write the reply's TCP header at hdr + l23 (40 bytes for a SYN-ACK, else
 * 32), checksum 0. */
static __always_inline struct tcphdr *write_tcp_header(__u8 *hdr, __u32 l23, const struct pkt_info *req,
						       const struct tcp_reply *t)
{
	struct tcphdr *th = (void *)hdr + (l23 & 63);
	__u8 ws = opts_wscale(t->opts);
	__u8 *h = (__u8 *)th;
	__u32 tcp_len = t->syn ? 40 : 32;
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
		o[0] = 2, o[1] = 4, o[2] = t->mss >> 8, o[3] = t->mss & 0xff;
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
	return th;
}

/* The checksum sum of a reply's pseudo header and TCP header (tcp_len
 * bytes), for a payload of payload_len bytes (whose sum the caller adds). */
static __always_inline __u64 tcp_header_sum(const struct tcphdr *th, __u32 tcp_len, const struct pkt_info *req,
					    __u32 payload_len)
{
	return csum_pseudo(&req->tuple, req->family, IPPROTO_TCP, tcp_len + payload_len) +
	       csum_words((const __u8 *)th, tcp_len == 40 ? 40 : 32, 5);
}

/* The TCP responder's working state, kept in santa_scratch.tcp. */
struct tcp_work {
	struct tcp_opts o;
	struct tcp_reply t;
};
_Static_assert(sizeof(struct tcp_work) <= SANTA_SCRATCH_TCP, "santa_scratch.tcp is too small");
