// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The memcached write tracker (docs/memcached.md). At TC ingress it parses
 * every request to memcached's ports and bumps the guard slot of each key a
 * write changes, before memcached sees the write; at TC egress it bumps the
 * slot again as memcached's reply to that write leaves, i.e. after memcached
 * has applied it. Rules offloading a key's GET carry the key's slot and the
 * epoch slot as guards, so no rule built from a value read before a write can
 * answer once the writer has its reply.
 *
 * TCP streams are parsed in order: a segment past a gap is dropped so the
 * client resends it in order, and bytes sent again where the tracker has
 * parsed must be those parsed (by keyed digests), or the kernel may have
 * dropped what the tracker parsed and taken them instead. Each connection
 * keeps the replies it owes as a queue of runs; a reply that completes pops
 * the queue. Where replies cannot
 * be counted (quiet commands, unknown commands) the connection falls back to
 * bumping every key it wrote on every reply; where the requests cannot be
 * parsed at all, every segment bumps the epoch, which retires every rule.
 * A bump no reply may follow (a noreply write, a reset connection) is marked
 * in its report: the controller bumps the slot again once it has settled. */
#include "../../../bpf/include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>
#include "tracker.h"
#include "../../../bpf/siphash.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define TCX_NEXT -1
#define TCX_DROP 2
#define NONZERO(n, mask) ((((n) - 1) & (mask)) + 1)

/* Set by user space before loading: bit p (host order) is set for each port
 * p memcached serves on. Every listener must be watched: a write through any
 * of them changes what the rules answer. */
volatile const __u64 tcp_ports[65536 / 64] = {};
volatile const __u64 udp_ports[65536 / 64] = {};
/* CLOCK_REALTIME minus CLOCK_MONOTONIC in seconds at load: turns a flush's
 * unix time into the clock of bpf_ktime_get_ns, as memcached itself does
 * once, at its start. */
volatile const __s64 realtime_minus_monotonic = 0;
/* memcached reads every TCP connection as text (-B ascii), whatever its
 * first byte. */
volatile const __u8 text_only = 0;
/* The key of the digests of parsed request bytes (struct mc_parsed), random
 * per load: bytes forged to match a digest would need it. */
volatile const __u64 digest_key[2] = {};

/* Guard slot -> version: santad's pinned santa_guards, replaced at load. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, MC_GUARD_SLOTS);
	__uint(map_flags, BPF_F_MMAPABLE);
} santa_guards SEC(".maps");

/* TCP connection to memcached -> its parsers and owed replies. */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__type(key, struct mc_flow_key);
	__type(value, struct mc_flow);
	__uint(max_entries, 16384); /* set by user space */
} mc_flows SEC(".maps");

/* The UDP writes of one client and request id. Requests may share an id,
 * and a reply cannot tell which of them it answers, so every reply of the
 * id bumps the slots of all of them, and the entry stays until it is given
 * up (udp_give_up): a reply never finds its write's slots gone. */
struct mc_udp_write {
	struct bpf_spin_lock lock;
	__u32 nslots;
	__u64 since; /* bpf_ktime_get_ns of its first write */
	__u32 slots[MC_UDP_SLOTS]; /* the last one becomes the epoch when more come */
};

/* UDP client and request id -> its recent writes, whose slots its replies
 * bump. Not an LRU: an entry pushed out unseen would lose its replies'
 * bumps; entries are given up, bumped unacked, once MC_UDP_GIVE_UP_MS old. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__type(key, struct mc_udp_key);
	__type(value, struct mc_udp_write);
	__uint(max_entries, 65536);
} mc_udp_writes SEC(".maps");

/* When the full mc_udp_writes was last cleared of the entries given up. */
__u64 udp_cleared_at = 0;

/* Per CPU: the monotonic time (ns) until which a delayed flush seen may not
 * have been applied yet; the controller installs no rule built from a value
 * fetched before it. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, __u64);
	__uint(max_entries, 1);
} mc_flush_hold SEC(".maps");

/* A zeroed connection to initialise new entries from, and per-CPU room to
 * parse a UDP request in. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct mc_flow);
	__uint(max_entries, 2);
} mc_scratch SEC(".maps");

/* What the tracker saw, per CPU. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__type(key, __u32);
	__type(value, struct mc_counters);
	__uint(max_entries, 1);
} mc_events SEC(".maps");

/* The slot (__u32) of every bump: the controller checks only their rules (it polls). */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1 << 20);
} mc_bumped SEC(".maps");

#define COUNT(field)                                                          \
	do {                                                                  \
		__u32 _zero = 0;                                              \
		struct mc_counters *_c = bpf_map_lookup_elem(&mc_events, &_zero); \
		if (_c)                                                       \
			_c->field++;                                          \
	} while (0)

static __always_inline void report_bump(__u32 slot, __u32 report)
{
	if (slot < MC_EPOCH_SLOT)
		return; /* slot 0: a read's reply, no write; it guards no rule */
	__u64 *v = bpf_map_lookup_elem(&santa_guards, &slot);
	if (v)
		__sync_fetch_and_add(v, 1);
	/* after the increment: whoever reads the report sees the new version */
	if (report & MC_REPORT_UNACKED)
		COUNT(unacked_bumps);
	report |= slot;
	if (bpf_ringbuf_output(&mc_bumped, &report, sizeof(report), BPF_RB_NO_WAKEUP))
		COUNT(bumps_unreported);
}

static __always_inline void bump(__u32 slot)
{
	report_bump(slot, 0);
}

/* A write that memcached may apply with no reply after it for the tracker to
 * see: the controller bumps its slot again once memcached has surely applied
 * it (Config.Settle), retiring a rule built from a value fetched before. */
static __always_inline void bump_unacked(__u32 slot)
{
	report_bump(slot, MC_REPORT_UNACKED);
}

/* A flush_all with a delay (seconds, or a unix time above
 * MC_FLUSH_RELATIVE_MAX; -1: one memcached cuts to 32 bits) empties memcached
 * later, with no packet to show when: the epoch bumps of its request and
 * reply come too early. Record when it has surely been applied, before
 * those bumps, so that the controller keeps every rule away until then. */
static __always_inline void hold_for_flush(__s64 delay)
{
	__u64 until = ~0ull; /* unforeseeable: hold for good */
	if (delay > MC_FLUSH_RELATIVE_MAX) {
		__s64 at = delay - realtime_minus_monotonic + MC_FLUSH_SLACK;
		until = at > 0 ? (__u64)at * 1000000000ull : 0;
	} else if (delay >= 0) {
		until = bpf_ktime_get_ns() + (__u64)(delay + MC_FLUSH_SLACK) * 1000000000ull;
	}
	COUNT(delayed_flushes);
	__u32 zero = 0;
	__u64 *hold = bpf_map_lookup_elem(&mc_flush_hold, &zero);
	if (hold && *hold < until) /* per CPU, with migration off: no race */
		*hold = until;
}

/* ---- packets ---- */

struct packet {
	__u8 family;
	__u8 proto;
	__u8 tcp_flags;   /* FIN 1, SYN 2, RST 4, ACK 16, URG 32 */
	__u16 sport, dport; /* network order */
	__u32 src[4], dst[4];
	__u32 seq;        /* TCP, host order */
	__u32 ack;        /* TCP, host order */
	__u32 l4_off;
	__u32 payload_off;
	__u32 payload_len;
	__u8 fragment;    /* the first fragment: the rest passes unseen */
};

enum { TCP_FIN = 1, TCP_SYN = 2, TCP_RST = 4, TCP_ACK = 16, TCP_URG = 32 };

struct ext_walk {
	struct __sk_buff *skb;
	__u32 off;
	__u8 next;
	__u8 fragment;
	__u8 stop; /* not a first fragment, or cut short */
};

/* One IPv6 extension header; the kernel takes any number of them. */
static long ext_step(__u32 i, struct ext_walk *w)
{
	if (w->next != 0 && w->next != 43 && w->next != 44 && w->next != 60)
		return 1;
	__u8 ext[8];
	if (bpf_skb_load_bytes(w->skb, w->off, ext, sizeof(ext))) {
		w->stop = 1;
		return 1;
	}
	if (w->next == 44) {
		if (ext[2] | (ext[3] & 0xf8)) { /* fragment offset: not the first */
			w->stop = 1;
			return 1;
		}
		w->fragment = ext[3] & 1; /* more fragments */
		w->off += 8;
	} else {
		w->off += (ext[1] + 1) * 8;
	}
	w->next = ext[0];
	return 0;
}

/* Parse Ethernet, IPv4/IPv6 (with extension headers) and TCP/UDP. Returns 0
 * for a TCP or UDP packet (non-first fragments excluded: the first one
 * stands for the datagram). */
static __always_inline int parse_packet(struct __sk_buff *skb, struct packet *p)
{
	__u32 off = 14, end = skb->len;
	__u32 l3_end;
	if (skb->protocol == bpf_htons(ETH_P_IP)) {
		struct iphdr ip;
		if (bpf_skb_load_bytes(skb, off, &ip, sizeof(ip)))
			return -1;
		if (ip.frag_off & bpf_htons(0x1fff)) /* the first fragment carries the command */
			return -1;
		p->fragment = !!(ip.frag_off & bpf_htons(0x2000)); /* more fragments */
		p->family = 4;
		p->proto = ip.protocol;
		p->src[0] = ip.saddr;
		p->dst[0] = ip.daddr;
		l3_end = off + bpf_ntohs(ip.tot_len);
		off += ip.ihl * 4;
	} else if (skb->protocol == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr ip6;
		if (bpf_skb_load_bytes(skb, off, &ip6, sizeof(ip6)))
			return -1;
		p->family = 6;
		__builtin_memcpy(p->src, &ip6.saddr, 16);
		__builtin_memcpy(p->dst, &ip6.daddr, 16);
		l3_end = off + sizeof(ip6) + bpf_ntohs(ip6.payload_len);
		/* 8 bytes at least each: 2^13 fill 64 KiB */
		struct ext_walk w = {.skb = skb, .off = off + sizeof(ip6), .next = ip6.nexthdr};
		bpf_loop(1 << 13, ext_step, &w, 0);
		if (w.stop)
			return -1;
		off = w.off;
		p->fragment = w.fragment;
		p->proto = w.next;
	} else {
		return -1;
	}
	if (l3_end < end)
		end = l3_end; /* Ethernet padding */
	p->l4_off = off;
	if (p->proto == IPPROTO_UDP) {
		struct udphdr udp;
		if (bpf_skb_load_bytes(skb, off, &udp, sizeof(udp)))
			return -1;
		p->sport = udp.source;
		p->dport = udp.dest;
		off += sizeof(udp);
	} else if (p->proto == IPPROTO_TCP) {
		struct tcphdr tcp;
		if (bpf_skb_load_bytes(skb, off, &tcp, sizeof(tcp)))
			return -1;
		p->sport = tcp.source;
		p->dport = tcp.dest;
		p->seq = bpf_ntohl(tcp.seq);
		p->ack = bpf_ntohl(tcp.ack_seq);
		p->tcp_flags = ((__u8 *)&tcp)[13];
		off += tcp.doff * 4;
	} else {
		return -1;
	}
	if (off > end)
		return -1;
	p->payload_off = off;
	p->payload_len = end - off;
	return 0;
}

/* ---- heads: a command or reply line, or a binary header and its key ---- */

/* Move bytes [pos, end) of the packet into s->head until it holds a whole
 * head (s->complete): a binary header and its extras and key if binary, a
 * line otherwise. Returns the bytes taken, or -1 when the head outgrows
 * MC_HEAD or cannot be read. */
__noinline int mc_take_head(struct __sk_buff *skb, struct mc_stream *s, __u32 pos, __u32 end, int binary)
{
	if (!s)
		return -1;
	__u32 start = pos;
	s->complete = 0;
	for (int c = 0; c < MC_HEAD / 64 + 1; c++) {
		__u32 have = s->head_len;
		if (have >= MC_HEAD)
			return -1;
		if (pos >= end)
			break;
		__u32 n = end - pos;
		if (n > 64)
			n = 64;
		if (n > MC_HEAD - have)
			n = MC_HEAD - have;
		have &= MC_HEAD - 1;
		if (bpf_skb_load_bytes(skb, pos, s->head + have, NONZERO(n, 63)))
			return -1;
		if (binary) {
			__u32 total = have + n, need = 24;
			if (total >= 24 && s->head[0] == 0x80) /* a request */
				need += s->head[4] + ((__u32)s->head[2] << 8 | s->head[3]);
			if (total >= need) {
				pos += need - have;
				s->head_len = need;
				s->complete = 1;
				return pos - start;
			}
			s->head_len = total;
			pos += n;
			continue;
		}
		for (__u32 k = 0; k < 64; k++) {
			if (k >= n)
				break;
			if (s->head[have + k] == '\n') {
				pos += k + 1;
				s->head_len = have + k + 1;
				s->complete = 1;
				return pos - start;
			}
		}
		s->head_len = have + n;
		pos += n;
	}
	return pos - start;
}

/* k & 7, masked where the verifier sees it (the compiler would drop a mask
 * it can prove redundant). */
static __always_inline __u32 bounded8(__u32 k)
{
	asm volatile("" : "+r"(k));
	return k & 7;
}

/* Tokens of a text head, as memcached splits them (runs of spaces separate). */
struct tokens {
	__u32 n;
	__u16 start[8];
	__u16 len[8];
	__u64 flag_firsts; /* tokens 2..: bit (first char - 'A') set, for meta flags */
	__u32 odd;         /* a NUL, or a CR but the one before the final LF */
};

struct split_walk {
	const struct mc_stream *s;
	struct tokens *t;
	__u32 in; /* inside a token */
};

static long split_step(__u32 i, struct split_walk *w)
{
	const struct mc_stream *s = w->s;
	struct tokens *t = w->t;
	if (i >= s->head_len)
		return 1;
	__u8 c = s->head[i & (MC_HEAD - 1)];
	/* memcached takes the line up to its LF, less one CR before it, and
	 * splits it at spaces only; a NUL ends the line it tokenizes (strlen) */
	int eol = c == '\n' || (c == '\r' && i + 2 == s->head_len);
	int sep = c == ' ' || eol;
	if (c == 0 || (c == '\r' && !eol))
		t->odd = 1;
	__u32 n = t->n;
	if (!sep && !w->in) {
		w->in = 1;
		if (n < 8)
			t->start[bounded8(n)] = i;
		if (n >= 2 && c >= 'A' && c <= 'z')
			t->flag_firsts |= 1ull << ((c - 'A') & 63);
	} else if (sep && w->in) {
		w->in = 0;
		if (n < 8)
			t->len[bounded8(n)] = i - t->start[bounded8(n)];
		t->n = n + 1;
	}
	return 0;
}

static __always_inline void split(const struct mc_stream *s, struct tokens *t)
{
	struct split_walk w = {.s = s, .t = t};
	bpf_loop(MC_HEAD, split_step, &w, 0);
}

/* A word of up to 16 bytes, packed little-endian. */
struct word {
	__u64 lo, hi;
	__u32 len;
};

/* Token k equals word w. */
__noinline int mc_token_is(const struct mc_stream *s, const struct tokens *t, __u32 k, const struct word *w)
{
	if (!s || !t || !w || k >= t->n || k >= 8)
		return 0;
	k = bounded8(k);
	if (t->len[k] != w->len)
		return 0;
	__u64 lo = w->lo, hi = w->hi;
	__u32 wlen = w->len;
	__u32 at = t->start[k];
	for (__u32 i = 0; i < 16; i++) {
		if (i >= wlen)
			break;
		__u8 want = (i < 8 ? lo >> (i * 8) : hi >> ((i - 8) * 8)) & 0xff;
		if (s->head[(at + i) & (MC_HEAD - 1)] != want)
			return 0;
	}
	return 1;
}

/* Bytes off..off+7 of a string literal as a little-endian word (folded at compile time). */
#define PACK8(w, off)                                                                            \
	((__u64)(sizeof(w) > (off) + 0 ? (__u8)(w)[(off) + 0] : 0) |                              \
	 (__u64)(sizeof(w) > (off) + 1 ? (__u8)(w)[(off) + 1] : 0) << 8 |                         \
	 (__u64)(sizeof(w) > (off) + 2 ? (__u8)(w)[(off) + 2] : 0) << 16 |                        \
	 (__u64)(sizeof(w) > (off) + 3 ? (__u8)(w)[(off) + 3] : 0) << 24 |                        \
	 (__u64)(sizeof(w) > (off) + 4 ? (__u8)(w)[(off) + 4] : 0) << 32 |                        \
	 (__u64)(sizeof(w) > (off) + 5 ? (__u8)(w)[(off) + 5] : 0) << 40 |                        \
	 (__u64)(sizeof(w) > (off) + 6 ? (__u8)(w)[(off) + 6] : 0) << 48 |                        \
	 (__u64)(sizeof(w) > (off) + 7 ? (__u8)(w)[(off) + 7] : 0) << 56)
#define IS(k, w)                                                                 \
	({                                                                       \
		struct word _w = {PACK8(w, 0), PACK8(w, 8), sizeof(w) - 1};      \
		mc_token_is(s, t, k, &_w);                                       \
	})

#define MC_SIGNED 0x100 /* mc_token_digits' form: a minus sign may come first */

/* Token k is 1 to form's low byte (at most 19) decimal digits, with a
 * minus sign first if form has MC_SIGNED; their value goes to *v. */
__noinline int mc_token_digits(const struct mc_stream *s, const struct tokens *t, __u32 k, __u32 form, __s64 *v)
{
	if (!s || !t || !v || k >= t->n || k >= 8)
		return 0;
	k = bounded8(k);
	__u32 at = t->start[k], len = t->len[k], max_digits = form & 0xff;
	int negative = (form & MC_SIGNED) && len > 1 && s->head[at & (MC_HEAD - 1)] == '-';
	at += negative;
	len -= negative;
	if (len == 0 || len > max_digits || len > 19)
		return 0;
	__s64 n = 0;
	for (__u32 i = 0; i < 19; i++) {
		if (i >= len)
			break;
		__u8 c = s->head[(at + i) & (MC_HEAD - 1)];
		if (c < '0' || c > '9')
			return 0;
		n = n * 10 + (c - '0');
	}
	*v = negative ? -n : n;
	return 1;
}

/* Token k as a decimal number of up to 10 digits, or -1. */
static __always_inline __s64 token_num(const struct mc_stream *s, const struct tokens *t, __u32 k)
{
	__s64 v;
	return mc_token_digits(s, t, k, 10, &v) ? v : -1;
}

/* The flags, exptime and (cas) unique of a storage command read as
 * memcached reads them (safe_strtoul, safe_strtol, safe_strtoull). One
 * it cannot read makes it refuse the command without taking the data
 * block, which it then reads as commands: a write there would go unseen.
 * Only plain numbers in range pass here; anything else (a sign on flags,
 * spaces memcached would skip) is taken for unreadable, which costs the
 * flow, never a write. */
static __always_inline int storage_numbers_ok(const struct mc_stream *s, const struct tokens *t, int cas)
{
	__s64 flags, exptime, unique;
	return mc_token_digits(s, t, 2, 10, &flags) && flags <= 0xffffffffll &&
	       mc_token_digits(s, t, 3, 10 | MC_SIGNED, &exptime) && exptime <= 0x7fffffffll &&
	       exptime >= -0x80000000ll && (!cas || mc_token_digits(s, t, 5, 19, &unique));
}

struct digits_walk {
	const struct mc_stream *s;
	__u32 at, len;
	__u32 digits; /* significant ones */
	__u32 bad;    /* not a digit */
	__s64 v;      /* of the first 10 significant digits */
};

static long digits_step(__u32 i, struct digits_walk *w)
{
	if (i >= w->len)
		return 1;
	__u8 c = w->s->head[(w->at + i) & (MC_HEAD - 1)];
	if (c < '0' || c > '9') {
		w->bad = 1;
		return 1;
	}
	if (w->v || c != '0')
		w->digits++;
	if (w->digits <= 10)
		w->v = w->v * 10 + (c - '0');
	return 0;
}

/* flush_all's delay, token 1, as memcached reads it (safe_strtol: a sign,
 * then decimal digits, at most INT_MAX): 0 if it flushes at once (0 or
 * negative) or refuses the command (no flush); -1 for a negative number
 * below INT_MIN, which memcached cuts to 32 bits, an unforeseeable delay. */
__noinline __s64 mc_flush_delay(const struct mc_stream *s, const struct tokens *t)
{
	if (!s || !t || t->n < 2)
		return 0;
	struct digits_walk w = {.s = s, .at = t->start[1], .len = t->len[1]};
	__u8 sign = s->head[w.at & (MC_HEAD - 1)];
	if (sign == '+' || sign == '-')
		w.at++, w.len--;
	if (w.len == 0)
		return 0;
	bpf_loop(MC_HEAD, digits_step, &w, 0);
	if (w.bad)
		return 0;
	if (sign == '-') /* over 18 digits: out of a long's range, refused */
		return w.digits > 18 ? 0 : w.digits > 10 || w.v > 0x80000000ll ? -1 : 0;
	return w.digits > 10 || w.v > 0x7fffffff ? 0 : w.v;
}
#define flush_delay mc_flush_delay

/* The guard slot of the key at head[at, at + len): mcctl.KeySlot is the twin. */
__noinline __u32 mc_key_slot(const struct mc_stream *s, __u32 at, __u32 len)
{
	if (!s)
		return MC_EPOCH_SLOT;
	__u32 h = MC_FNV_BASIS;
	for (__u32 i = 0; i < MC_MAX_KEY; i++) {
		if (i >= len)
			break;
		h = (h ^ s->head[(at + i) & (MC_HEAD - 1)]) * MC_FNV_PRIME;
	}
	__u32 slot = h & (MC_GUARD_SLOTS - 1);
	return slot < MC_FIRST_KEY_SLOT ? slot + MC_FIRST_KEY_SLOT : slot;
}
#define key_slot mc_key_slot

/* What a request does. */
enum mc_kind {
	MC_READ = 1,  /* changes nothing; one reply */
	MC_WRITE,     /* changes slot; one reply unless noreply */
	MC_QUIET,     /* replies only sometimes; a write if slot != 0 */
	MC_UNKNOWN,   /* not a data command this tracker knows; changes no key */
	MC_BAD,       /* memcached's reading of what follows cannot be predicted */
};

struct verdict {
	__u32 kind;
	__u32 slot;
	__u32 skip;   /* value bytes that follow the head */
	__u32 noreply;
	__s64 flush_delay; /* a flush's delay argument, 0 if none; -1: unforeseeable */
};

/* A binary flush's expiration extra (big-endian seconds), 0 without one. */
static __always_inline __s64 binary_flush_delay(const struct mc_stream *s, __u32 extlen)
{
	if (extlen != 4)
		return 0;
	return (__u32)s->head[24] << 24 | (__u32)s->head[25] << 16 | (__u32)s->head[26] << 8 | s->head[27];
}

static __always_inline void binary_request(const struct mc_stream *s, struct verdict *v)
{
	__u8 op = s->head[1];
	__u32 extlen = s->head[4], keylen = (__u32)s->head[2] << 8 | s->head[3];
	__u32 body = (__u32)s->head[8] << 24 | (__u32)s->head[9] << 16 | (__u32)s->head[10] << 8 | s->head[11];
	if (body < extlen + keylen || keylen > MC_MAX_KEY) {
		v->kind = MC_BAD;
		return;
	}
	v->skip = body - extlen - keylen;
	__u32 slot = keylen ? key_slot(s, 24 + extlen, keylen) : MC_EPOCH_SLOT;
	switch (op) {
	case 0x00: case 0x0c: case 0x0a: case 0x0b: case 0x07: /* get, getk, noop, version, quit */
		v->kind = MC_READ;
		break;
	case 0x09: case 0x0d: case 0x17: /* getq, getkq, quitq */
		v->kind = MC_QUIET;
		break;
	case 0x01: case 0x02: case 0x03: case 0x04: case 0x05: case 0x06: /* set add replace delete incr decr */
	case 0x0e: case 0x0f: case 0x1c: case 0x1d: case 0x23: /* append prepend touch gat gatk */
		v->kind = MC_WRITE;
		v->slot = slot;
		break;
	case 0x08: /* flush */
		v->kind = MC_WRITE;
		v->slot = MC_EPOCH_SLOT;
		v->flush_delay = binary_flush_delay(s, extlen);
		break;
	case 0x11: case 0x12: case 0x13: case 0x14: case 0x15: case 0x16: /* quiet writes */
	case 0x19: case 0x1a: case 0x1e: case 0x24:
		v->kind = MC_QUIET;
		v->slot = slot;
		break;
	case 0x18: /* flushq */
		v->kind = MC_QUIET;
		v->slot = MC_EPOCH_SLOT;
		v->flush_delay = binary_flush_delay(s, extlen);
		break;
	default:
		v->kind = MC_UNKNOWN;
	}
}

#define FLAG(c) (1ull << ((c) - 'A'))

/* The first 4 bytes of head. */
static __always_inline __u32 head4(const struct mc_stream *s)
{
	return *(const __u32 *)s->head;
}

/* The head is a get or gets whose keys memcached accepts (the line is too
 * short for a key over MC_MAX_KEY): a read, known without splitting the line
 * into tokens, which costs most of a request's parse. Most requests are. */
static __always_inline int plain_get(const struct mc_stream *s)
{
	if (head4(s) == (__u32)PACK8("get ", 0))
		return s->head_len <= 4 + MC_MAX_KEY + 1;
	return head4(s) == (__u32)PACK8("gets", 0) && s->head[4] == ' ' &&
	       s->head_len <= 5 + MC_MAX_KEY + 1;
}

/* Classify the request head in s, of the binary protocol or the text one. */
__noinline int mc_classify(const struct mc_stream *s, struct verdict *v, int binary)
{
	if (!s || !v)
		return 0;
	if (binary) {
		if (s->head[0] == 0x80)
			binary_request(s, v);
		else /* memcached closes the connection */
			v->kind = MC_BAD;
		return 0;
	}
	if (plain_get(s)) {
		v->kind = MC_READ;
		return 0;
	}
	struct tokens tok = {};
	struct tokens *t = &tok;
	split(s, t);
	/* the key, where the command has one; memcached refuses longer ones */
	__u32 key_len = t->n > 1 ? t->len[1] : 0;
	__u32 slot = key_len ? key_slot(s, t->start[1], key_len) : 0;
	int last_noreply = IS(t->n - 1, "noreply");
	/* memcached's tokens would differ from these: "delete k\0" deletes k,
	 * "set\r k ..." is no set, and a write may follow in what looked like
	 * its value */
	if (t->odd || (t->n > 1 && key_len > MC_MAX_KEY)) {
		v->kind = MC_BAD;
		return 0;
	}
	if (IS(0, "get") || IS(0, "gets") || IS(0, "version") || IS(0, "mn") || IS(0, "me") || IS(0, "quit")) {
		v->kind = MC_READ;
		v->noreply = IS(0, "quit");
	} else if (IS(0, "set") || IS(0, "add") || IS(0, "replace") || IS(0, "append") || IS(0, "prepend") ||
		   IS(0, "cas")) {
		__s64 bytes = token_num(s, t, 4);
		__u32 want = IS(0, "cas") ? 6 : 5; /* tokens without noreply */
		if (t->n < want || t->n > want + 1 || bytes < 0 || bytes > (1 << 30) ||
		    (t->n == want + 1 && !last_noreply) || !storage_numbers_ok(s, t, IS(0, "cas"))) {
			v->kind = MC_BAD;
			return 0;
		}
		v->kind = MC_WRITE;
		v->slot = slot;
		v->skip = bytes + 2;
		v->noreply = last_noreply;
	} else if (IS(0, "incr") || IS(0, "decr") || IS(0, "delete") || IS(0, "touch")) {
		if (t->n < 2) {
			v->kind = MC_BAD;
			return 0;
		}
		v->kind = MC_WRITE;
		v->slot = slot;
		v->noreply = last_noreply;
	} else if (IS(0, "gat") || IS(0, "gats")) {
		/* gat <exptime> <key>*: changes the expiry of every key */
		v->kind = MC_WRITE;
		v->slot = t->n == 3 ? key_slot(s, t->start[2], t->len[2]) : MC_EPOCH_SLOT;
	} else if (IS(0, "flush_all")) { /* flush_all [delay] [noreply] */
		v->kind = MC_WRITE;
		v->slot = MC_EPOCH_SLOT;
		v->noreply = last_noreply;
		if (t->n > 1 && !IS(1, "noreply"))
			v->flush_delay = flush_delay(s, t);
	} else if (IS(0, "verbosity")) {
		v->kind = MC_READ;
		v->noreply = last_noreply;
	} else if (IS(0, "mg") || IS(0, "ms") || IS(0, "md") || IS(0, "ma")) {
		if (t->n < 2) {
			v->kind = MC_BAD;
			return 0;
		}
		int write = !IS(0, "mg") || (t->flag_firsts & (FLAG('T') | FLAG('N') | FLAG('E')));
		if (IS(0, "ms")) {
			/* memcached refuses 19 tokens or more (MFLAG_MAX_OPT_LENGTH)
			 * before it reads the size, taking no data block */
			__s64 bytes = token_num(s, t, 2);
			if (bytes < 0 || bytes > (1 << 30) || t->n >= 19) {
				v->kind = MC_BAD;
				return 0;
			}
			v->skip = bytes + 2;
		}
		v->kind = t->flag_firsts & FLAG('q') ? MC_QUIET : write ? MC_WRITE : MC_READ;
		if (write) /* b: the key is base64, so its slot is unknown */
			v->slot = t->flag_firsts & FLAG('b') ? MC_EPOCH_SLOT : slot;
	} else {
		v->kind = MC_UNKNOWN;
	}
	return 0;
}

/* ---- TCP connections ---- */

__noinline int mc_sticky_add(struct mc_flow *f, __u32 slot)
{
	if (!f)
		return 0;
	for (__u32 i = 0; i < MC_STICKY; i++) {
		if (i >= f->nsticky)
			break;
		if (f->sticky[i] == slot)
			return 0;
	}
	if (f->nsticky < MC_STICKY)
		f->sticky[f->nsticky++ & (MC_STICKY - 1)] = slot;
	else
		f->sticky[0] = MC_EPOCH_SLOT; /* full: every reply retires everything */
	return 0;
}

__noinline int mc_report_sticky(struct mc_flow *f, __u32 report)
{
	if (!f)
		return 0;
	for (__u32 i = 0; i < MC_STICKY; i++) {
		if (i >= f->nsticky)
			break;
		report_bump(f->sticky[i], report);
	}
	return 0;
}

static __always_inline void mc_bump_sticky(struct mc_flow *f)
{
	mc_report_sticky(f, 0);
}

/* From now on replies are not counted: the writes still owed a reply join
 * the sticky slots, which every reply bumps. */
__noinline int mc_uncount(struct mc_flow *f)
{
	if (!f)
		return 0;
	if (f->flags & MC_FLOW_UNCOUNTED)
		return 0;
	f->flags |= MC_FLOW_UNCOUNTED;
	COUNT(uncounted_flows);
	for (__u32 i = 0; i < MC_QUEUE; i++) {
		if (f->head + i >= f->tail)
			break;
		__u32 slot = f->queue[(f->head + i) & (MC_QUEUE - 1)].slot;
		if (slot)
			mc_sticky_add(f, slot);
	}
	f->head = f->tail = 0;
	return 0;
}

/* Record a reply the connection owes (count 1) or a noreply write (count 0). */
__noinline int mc_owe(struct mc_flow *f, __u32 slot, __u32 count)
{
	if (!f)
		return 0;
	if (f->flags & MC_FLOW_UNCOUNTED) {
		if (slot)
			mc_sticky_add(f, slot);
		return 0;
	}
	if (!slot && f->tail != f->head) {
		struct mc_owed *last = &f->queue[(f->tail - 1) & (MC_QUEUE - 1)];
		if (!last->slot) {
			last->count += count;
			return 0;
		}
	}
	if (f->tail - f->head >= MC_QUEUE) {
		mc_uncount(f);
		if (slot)
			mc_sticky_add(f, slot);
		return 0;
	}
	struct mc_owed *e = &f->queue[f->tail & (MC_QUEUE - 1)];
	e->slot = slot;
	e->count = count;
	f->tail++;
	return 0;
}

/* A whole reply left: everything before it has been applied. */
__noinline int mc_reply_done(struct mc_flow *f)
{
	if (!f)
		return 0;
	for (__u32 i = 0; i < MC_QUEUE; i++) {
		if (f->head == f->tail)
			break;
		struct mc_owed *e = &f->queue[f->head & (MC_QUEUE - 1)];
		if (e->count) {
			if (e->slot) {
				bump(e->slot);
				COUNT(replies_bumped);
			}
			if (--e->count == 0)
				f->head++;
			COUNT(replies_counted);
			return 0;
		}
		bump(e->slot); /* a noreply write, applied before this reply */
		f->head++;
	}
	/* a reply nobody asked for: the count is off, so memcached read the
	 * stream otherwise than the tracker did, and may have taken a write
	 * the tracker saw as a value: every rule goes, before this reply
	 * reaches the client */
	bump(MC_EPOCH_SLOT);
	mc_uncount(f);
	mc_bump_sticky(f);
	return 0;
}

static __always_inline void lose(struct mc_flow *f)
{
	if (!(f->flags & MC_FLOW_LOST))
		COUNT(lost_flows);
	f->flags |= MC_FLOW_LOST;
	bump_unacked(MC_EPOCH_SLOT);
}

/* The request head in f->in is whole: act on it. */
__noinline int mc_request(struct mc_flow *f)
{
	if (!f)
		return 0;
	struct verdict v = {};
	mc_classify(&f->in, &v, f->flags & MC_FLOW_BINARY);
	if (v.flush_delay)
		hold_for_flush(v.flush_delay);
	switch (v.kind) {
	case MC_READ:
		COUNT(reads);
		mc_owe(f, 0, !v.noreply);
		break;
	case MC_WRITE:
		report_bump(v.slot, v.noreply ? MC_REPORT_UNACKED : 0);
		if (v.slot == MC_EPOCH_SLOT)
			COUNT(epoch_writes);
		else
			COUNT(writes);
		mc_owe(f, v.slot, !v.noreply);
		break;
	case MC_QUIET:
		if (v.slot) {
			bump_unacked(v.slot);
			COUNT(writes);
		}
		mc_uncount(f);
		mc_owe(f, v.slot, 0);
		break;
	case MC_UNKNOWN:
		mc_uncount(f);
		break;
	default:
		lose(f);
		return 0;
	}
	f->in.skip = v.skip;
	return 0;
}

/* The reply head in f->out is whole: act on it. */
__noinline int mc_reply(struct mc_flow *f)
{
	if (!f)
		return 0;
	struct mc_stream *s = &f->out;
	if (f->flags & MC_FLOW_BINARY) {
		s->skip = (__u32)s->head[8] << 24 | (__u32)s->head[9] << 16 | (__u32)s->head[10] << 8 | s->head[11];
		if (s->skip)
			s->unit_after_skip = 1;
		else
			mc_reply_done(f);
		return 0;
	}
	if (s->head_len == 5 && head4(s) == (__u32)PACK8("END\r", 0) && s->head[4] == '\n') {
		mc_reply_done(f); /* the end of a get's reply, most often alone */
		return 0;
	}
	struct tokens tok = {};
	struct tokens *t = &tok;
	split(s, t);
	if (IS(0, "VALUE")) { /* VALUE <key> <flags> <bytes> [<cas>]: more until END */
		__s64 bytes = token_num(s, t, 3);
		if (bytes < 0) {
			mc_uncount(f);
			return 0;
		}
		s->skip = bytes + 2;
	} else if (IS(0, "VA")) { /* meta: VA <bytes> <flags>*, then the value ends the reply */
		__s64 bytes = token_num(s, t, 1);
		if (bytes < 0) {
			mc_uncount(f);
			return 0;
		}
		s->skip = bytes + 2;
		s->unit_after_skip = 1;
	} else if (!IS(0, "STAT")) {
		mc_reply_done(f);
	}
	return 0;
}

struct walk {
	struct __sk_buff *skb;
	struct mc_flow *flow;
	__u32 pos;
	__u32 end;
	__u32 egress;
};

static long walk_step(__u32 i, struct walk *w)
{
	struct mc_flow *f = w->flow;
	if (w->pos >= w->end || f->flags & MC_FLOW_LOST || (w->egress && f->flags & MC_FLOW_UNCOUNTED))
		return 1;
	struct mc_stream *s = w->egress ? &f->out : &f->in;
	if (s->skip) {
		__u32 n = w->end - w->pos;
		if (n > s->skip)
			n = s->skip;
		s->skip -= n;
		w->pos += n;
		if (!s->skip && s->unit_after_skip) {
			s->unit_after_skip = 0;
			mc_reply_done(f);
		}
		return 0;
	}
	if (!w->egress && !(f->flags & (MC_FLOW_TEXT | MC_FLOW_BINARY))) {
		/* memcached reads a connection in the protocol of its first
		 * byte: a later head that starts like a binary one is a line */
		__u8 first;
		if (bpf_skb_load_bytes(w->skb, w->pos, &first, 1)) {
			lose(f);
			return 1;
		}
		f->flags |= first == 0x80 && !text_only ? MC_FLOW_BINARY : MC_FLOW_TEXT;
	}
	int taken = mc_take_head(w->skb, s, w->pos, w->end, f->flags & MC_FLOW_BINARY);
	if (taken < 0) {
		if (w->egress)
			mc_uncount(f);
		else
			lose(f);
		return 1;
	}
	w->pos += taken;
	if (!s->complete)
		return 1;
	if (w->egress)
		mc_reply(f);
	else
		mc_request(f);
	s->head_len = 0;
	return 0;
}

/* ---- digests of parsed request bytes (SipHash-2-4, bpf/siphash.h) ---- */

/* A walk over a segment's bytes [pos, end), 64 at a time (bpf_loop). */
struct chunk_walk {
	struct __sk_buff *skb;
	__u32 pos, end;
	__u32 cut; /* could not be read */
};

/* Load the walk's next bytes into buf (zeroed by the caller), at most 64,
 * and step past them: how many, 0 at the end or when they could not be
 * read (cut). */
static __always_inline __u32 next_chunk(struct chunk_walk *w, __u64 buf[8])
{
	if (w->pos >= w->end)
		return 0;
	__u32 n = w->end - w->pos;
	if (n > 64)
		n = 64;
	if (bpf_skb_load_bytes(w->skb, w->pos, buf, NONZERO(n, 63))) {
		w->cut = 1;
		return 0;
	}
	w->pos += n;
	return n;
}

struct digest_walk {
	struct chunk_walk c;
	__u64 v[4];
};

/* Absorb 64 bytes of the segment, in words of 8, zero-padded. */
static long digest_step(__u32 i, struct digest_walk *w)
{
	__u64 buf[8] = {};
	__u32 n = next_chunk(&w->c, buf);
	if (!n)
		return 1;
	__u64 v0 = w->v[0], v1 = w->v[1], v2 = w->v[2], v3 = w->v[3];
	for (int k = 0; k < 8; k++) {
		if (k * 8 >= n)
			break;
		v3 ^= buf[k];
		SIPROUND(v0, v1, v2, v3);
		SIPROUND(v0, v1, v2, v3);
		v0 ^= buf[k];
	}
	w->v[0] = v0, w->v[1] = v1, w->v[2] = v2, w->v[3] = v3;
	return 0;
}

/* SipHash-2-4 under digest_key of the segment's bytes [pos, pos + len),
 * zero-padded to whole words, then of their length. Returns 0 if they
 * could all be read. */
__noinline int mc_digest(struct __sk_buff *skb, __u32 pos, __u32 len, __u64 *digest)
{
	if (!skb || !digest)
		return -1;
	__u64 k0 = digest_key[0], k1 = digest_key[1];
	struct digest_walk w = {.c = {.skb = skb, .pos = pos, .end = pos + len},
				.v = {SIP_INIT0(k0), SIP_INIT1(k1), SIP_INIT2(k0), SIP_INIT3(k1)}};
	bpf_loop(1 << 13, digest_step, &w, 0); /* 512 KiB, a BIG TCP segment */
	if (w.c.cut || w.c.pos < w.c.end)
		return -1;
	__u64 v0 = w.v[0], v1 = w.v[1], v2 = w.v[2], v3 = w.v[3];
	v3 ^= len;
	SIPROUND(v0, v1, v2, v3);
	SIPROUND(v0, v1, v2, v3);
	v0 ^= len;
	v2 ^= 0xff;
	for (int r = 0; r < 4; r++)
		SIPROUND(v0, v1, v2, v3);
	*digest = v0 ^ v1 ^ v2 ^ v3;
	return 0;
}

/* Keep the digest of request bytes [seq, seq + len), at pos in the
 * segment, about to be parsed. Bytes that cannot be digested could not be
 * checked when sent again: the connection is lost. */
__noinline int mc_remember(struct __sk_buff *skb, struct mc_flow *f, __u32 pos, __u32 seq, __u32 len)
{
	if (!skb || !f)
		return 0;
	__u64 digest;
	if (mc_digest(skb, pos, len, &digest)) {
		lose(f);
		return 0;
	}
	struct mc_parsed *e = &f->parsed[f->nparsed & (MC_PARSED - 1)];
	e->seq = seq;
	e->len = len;
	e->digest = digest;
	f->nparsed++;
	return 0;
}

enum { RESENT_SAME, RESENT_DIFFER, RESENT_UNCHECKED };

/* A request segment that starts before in.seq carries bytes the tracker
 * parsed. The kernel takes bytes at a sequence number once: if it dropped
 * those parsed (a forged segment: an ACK of unsent data, out of its window,
 * an old timestamp) and takes these, memcached reads other bytes than the
 * tracker did, and a write among them would pass for a retransmission. So
 * these must be the bytes parsed, digest by digest of the kept segments
 * from where one began. */
__noinline int mc_resent(struct __sk_buff *skb, const struct mc_flow *f, const struct packet *p)
{
	if (!skb || !f || !p)
		return RESENT_UNCHECKED;
	__u32 end = p->seq + p->payload_len;
	__u32 checked = p->seq; /* the bytes before it are the parsed ones */
	__u32 kept = f->nparsed < MC_PARSED ? f->nparsed : MC_PARSED;
	for (__u32 i = 0; i < MC_PARSED; i++) {
		if (i >= kept)
			break;
		const struct mc_parsed *e = &f->parsed[(f->nparsed - kept + i) & (MC_PARSED - 1)];
		if ((__s32)(e->seq + e->len - checked) <= 0)
			continue; /* before the segment */
		if ((__s32)(e->seq - end) >= 0)
			break; /* after it */
		/* the segment starts or ends inside e: other boundaries */
		if (e->seq != checked || (__s32)(e->seq + e->len - end) > 0)
			return RESENT_UNCHECKED;
		__u64 digest;
		if (mc_digest(skb, p->payload_off + (e->seq - p->seq), e->len, &digest))
			return RESENT_UNCHECKED;
		if (digest != e->digest)
			return RESENT_DIFFER;
		checked = e->seq + e->len;
	}
	__u32 parsed_end = (__s32)(end - f->in.seq) < 0 ? end : f->in.seq;
	/* older than the digests kept */
	return (__s32)(checked - parsed_end) < 0 ? RESENT_UNCHECKED : RESENT_SAME;
}

/* Parse the new bytes of a segment; returns 0 if it is to be dropped. */
static __always_inline int walk_segment(struct __sk_buff *skb, struct mc_flow *f, const struct packet *p,
					int egress)
{
	struct mc_stream *s = egress ? &f->out : &f->in;
	__u32 end_seq = p->seq + p->payload_len;
	if ((__s32)(end_seq - s->seq) <= 0)
		return 1; /* a retransmission of parsed bytes (requests: checked by mc_resent) */
	__u32 skipped = s->seq - p->seq;
	if ((__s32)skipped < 0) { /* past a gap */
		if (!egress) {
			COUNT(dropped_out_of_order);
			return 0;
		}
		mc_uncount(f);
		mc_bump_sticky(f);
		return 1;
	}
	struct walk w = {.skb = skb, .flow = f, .pos = p->payload_off + skipped,
			 .end = p->payload_off + p->payload_len, .egress = egress};
	if (!egress)
		mc_remember(skb, f, w.pos, s->seq, end_seq - s->seq);
	bpf_loop(1 << 16, walk_step, &w, 0);
	s->seq = end_seq;
	return 1;
}

static __always_inline void flow_key(struct mc_flow_key *k, const struct packet *p, int egress)
{
	k->family = p->family;
	k->client_port = egress ? p->dport : p->sport;
	__builtin_memcpy(k->client, egress ? p->dst : p->src, 16);
	__builtin_memcpy(k->server, egress ? p->src : p->dst, 16);
}

/* Bump every slot the connection wrote and owes a reply for. */
__noinline int mc_report_owed(struct mc_flow *f, __u32 report)
{
	if (!f)
		return 0;
	for (__u32 i = 0; i < MC_QUEUE; i++) {
		if (f->head + i >= f->tail)
			break;
		report_bump(f->queue[(f->head + i) & (MC_QUEUE - 1)].slot, report);
	}
	mc_report_sticky(f, report);
	return 0;
}

/* The connection ends: whatever it still owes has been applied. */
static __always_inline void retire(struct mc_flow *f, const struct mc_flow_key *k)
{
	mc_report_owed(f, 0);
	bpf_map_delete_elem(&mc_flows, k);
}

struct csum_walk {
	struct chunk_walk c;
	__u64 sum;
};

/* Sum 64 bytes of the segment (16-bit words as loaded, like csum_partial). */
static long csum_step(__u32 i, struct csum_walk *w)
{
	__u64 buf[8] = {};
	if (!next_chunk(&w->c, buf))
		return 1;
	for (int k = 0; k < 8; k++)
		w->sum += (__u32)buf[k] + (buf[k] >> 32);
	return 0;
}

static __always_inline __u16 fold(__u64 sum)
{
	for (int i = 0; i < 4; i++)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

/* The TCP checksum of a segment holds, as the kernel will check it: the
 * device verified it, or the field holds the pseudo-header sum of a local
 * sender (checksum offload), or the segment sums up right. */
__noinline int mc_tcp_checksum_ok(struct __sk_buff *skb, const struct packet *p)
{
	if (!skb || !p)
		return 0;
	if (bpf_csum_level(skb, BPF_CSUM_LEVEL_QUERY) >= 0) /* CHECKSUM_UNNECESSARY */
		return 1;
	__u16 check;
	if (bpf_skb_load_bytes(skb, p->l4_off + 16, &check, sizeof(check)))
		return 0;
	__u32 len = p->payload_off + p->payload_len - p->l4_off;
	__u64 pseudo = bpf_htons(IPPROTO_TCP) + bpf_htons((__u16)len);
	for (int i = 0; i < 4; i++) {
		if (p->family == 4 && i > 0)
			break;
		pseudo += (__u64)p->src[i] + p->dst[i];
	}
	if (check == fold(pseudo))
		return 1;
	struct csum_walk w = {.c = {.skb = skb, .pos = p->l4_off, .end = p->payload_off + p->payload_len}, .sum = pseudo};
	bpf_loop(1 << 10, csum_step, &w, 0); /* 64 KiB */
	return !w.c.cut && w.c.pos >= w.c.end && fold(w.sum) == 0xffff;
}

static __always_inline int tcp_request(struct __sk_buff *skb, const struct packet *p)
{
	struct mc_flow_key k = {};
	flow_key(&k, p, 0);
	/* memcached's SYN-ACK starts the connection's state (tcp_reply), not
	 * the SYN: the kernel answers a SYN on a connection it has with a
	 * challenge ACK and drops it, and a forged one reset the state (the
	 * honest segments after it were taken for past a gap). The data of a
	 * SYN (TCP Fast Open) comes before that state. */
	if (p->tcp_flags & TCP_SYN) {
		if (p->payload_len) {
			bump_unacked(MC_EPOCH_SLOT);
			COUNT(untracked_segments);
		}
		return TCX_NEXT;
	}
	struct mc_flow *f = bpf_map_lookup_elem(&mc_flows, &k);
	/* The client resets the connection: memcached may still apply what it
	 * has read, but will not reply. The entry stays for a reply already on
	 * its way out. */
	if (f && p->tcp_flags & TCP_RST)
		mc_report_owed(f, MC_REPORT_UNACKED);
	if (!p->payload_len)
		return TCX_NEXT;
	if (!f) {
		bump_unacked(MC_EPOCH_SLOT);
		COUNT(untracked_segments);
		return TCX_NEXT;
	}
	if (f->flags & MC_FLOW_LOST) {
		bump_unacked(MC_EPOCH_SLOT);
		return TCX_NEXT;
	}
	/* the rest of the segment passes unseen; or an urgent byte, which
	 * memcached's reads leave out of the stream (no SO_OOBINLINE) */
	if (p->fragment || p->tcp_flags & TCP_URG) {
		lose(f);
		return TCX_NEXT;
	}
	/* the kernel drops such a segment, and the client sends its bytes
	 * again, maybe others: taken for a retransmission of parsed bytes,
	 * they would go unseen */
	if (!mc_tcp_checksum_ok(skb, p)) {
		COUNT(bad_checksums);
		return TCX_DROP;
	}
	if ((__s32)(f->in.seq - p->seq) > 0) {
		int resent = mc_resent(skb, f, p);
		if (resent == RESENT_DIFFER)
			COUNT(resent_differ);
		else if (resent == RESENT_UNCHECKED)
			COUNT(resent_unchecked);
		if (resent != RESENT_SAME) {
			lose(f);
			return TCX_NEXT;
		}
	}
	return walk_segment(skb, f, p, 0) ? TCX_NEXT : TCX_DROP;
}

/* A connection starts at memcached's SYN-ACK p: the client's next byte is
 * the one it acks. */
static __always_inline void start_flow(const struct mc_flow_key *k, const struct packet *p)
{
	__u32 zero = 0;
	struct mc_flow *init = bpf_map_lookup_elem(&mc_scratch, &zero);
	if (!init)
		return;
	bpf_map_update_elem(&mc_flows, k, init, BPF_ANY);
	struct mc_flow *f = bpf_map_lookup_elem(&mc_flows, k);
	if (f) {
		f->in.seq = p->ack;
		f->out.seq = p->seq + 1;
	}
}

static __always_inline int tcp_reply(struct __sk_buff *skb, const struct packet *p)
{
	struct mc_flow_key k = {};
	flow_key(&k, p, 1);
	struct mc_flow *f = bpf_map_lookup_elem(&mc_flows, &k);
	if ((p->tcp_flags & (TCP_SYN | TCP_ACK)) == (TCP_SYN | TCP_ACK)) {
		/* resent (the client's ACK was lost, or its SYN resent), with the
		 * same sequence number: the connection's state stays, requests
		 * may have been parsed meanwhile */
		if (f && f->out.seq == p->seq + 1)
			return TCX_NEXT;
		/* a new connection on the 4-tuple: the old one's socket is gone */
		if (f)
			retire(f, &k);
		start_flow(&k, p);
		return TCX_NEXT;
	}
	if (!f) {
		if (p->payload_len) {
			bump(MC_EPOCH_SLOT);
			COUNT(untracked_segments);
		}
		return TCX_NEXT;
	}
	if (p->payload_len) {
		if (f->flags & MC_FLOW_LOST)
			bump(MC_EPOCH_SLOT);
		else if (f->flags & MC_FLOW_UNCOUNTED)
			mc_uncount(f), mc_bump_sticky(f);
		else
			walk_segment(skb, f, p, 1);
	}
	if (p->tcp_flags & (TCP_FIN | TCP_RST))
		retire(f, &k);
	return TCX_NEXT;
}

/* ---- UDP ---- */

static __always_inline void udp_key(struct mc_udp_key *k, const struct packet *p, int egress, __u16 id)
{
	k->family = p->family;
	k->client_port = egress ? p->dport : p->sport;
	k->request_id = id;
	__builtin_memcpy(k->client, egress ? p->dst : p->src, 16);
}

#define MC_UDP_GIVE_UP_NS (MC_UDP_GIVE_UP_MS * 1000000ull)

/* Give up an entry: a reply of its writes may still come, and would find
 * nothing, so they are bumped unacked (the controller bumps them again once
 * they have settled). Only entries older than MC_UDP_GIVE_UP_NS / 2 are
 * given up, and only younger ones are joined, so no write joins one that
 * is going. */
static __always_inline void udp_give_up(struct mc_udp_key *k, struct mc_udp_write *w)
{
	__u32 slots[MC_UDP_SLOTS];
	__builtin_memcpy(slots, w->slots, sizeof(slots));
	__u32 n = w->nslots;
	if (bpf_map_delete_elem(&mc_udp_writes, k))
		return; /* another CPU gave it up */
	for (__u32 i = 0; i < MC_UDP_SLOTS; i++) {
		if (i >= n)
			break;
		report_bump(slots[i], MC_REPORT_UNACKED);
		COUNT(udp_writes_unpaired);
	}
}

static long udp_give_up_old(struct bpf_map *map, struct mc_udp_key *k, struct mc_udp_write *w, __u64 *now)
{
	if (*now - w->since > MC_UDP_GIVE_UP_NS)
		udp_give_up(k, w);
	return 0;
}

/* Record a write of slot so that the replies of its request id bump it.
 * If it cannot be recorded (the map is full of recent writes), it is
 * bumped unacked instead. */
__noinline int mc_udp_await(struct mc_udp_key *k, __u32 slot)
{
	if (!k)
		return 0;
	__u64 now = bpf_ktime_get_ns();
	for (int try = 0; try < 3; try++) {
		struct mc_udp_write *w = bpf_map_lookup_elem(&mc_udp_writes, k);
		if (w && now - w->since > MC_UDP_GIVE_UP_NS / 2) {
			udp_give_up(k, w);
			continue;
		}
		if (w) {
			bpf_spin_lock(&w->lock);
			if (w->nslots < MC_UDP_SLOTS)
				w->slots[w->nslots++ & (MC_UDP_SLOTS - 1)] = slot;
			else /* full: the epoch covers them all */
				w->slots[MC_UDP_SLOTS - 1] = MC_EPOCH_SLOT;
			bpf_spin_unlock(&w->lock);
			return 0;
		}
		struct mc_udp_write fresh = {.nslots = 1, .since = now, .slots = {slot}};
		int err = bpf_map_update_elem(&mc_udp_writes, k, &fresh, BPF_NOEXIST);
		if (!err)
			return 0;
		if (err == -17 /* EEXIST */)
			continue; /* another CPU added it meanwhile: join it */
		if (now - udp_cleared_at < MC_UDP_GIVE_UP_NS)
			break; /* full, and cleared less than MC_UDP_GIVE_UP_NS ago */
		udp_cleared_at = now;
		bpf_for_each_map_elem(&mc_udp_writes, udp_give_up_old, &now, 0);
	}
	report_bump(slot, MC_REPORT_UNACKED);
	COUNT(udp_writes_unpaired);
	return 0;
}

struct udp_walk {
	struct __sk_buff *skb;
	struct mc_stream *s;
	__u32 pos;
	__u32 end;
	int binary;
};

/* One command of a datagram past its first: only a delayed flush matters
 * there (the datagram bumps the epoch anyway). After a command memcached
 * refuses the walk goes on at the next line, which memcached may read as a
 * command too: a flush seen there holds at worst for nothing. */
static long udp_walk_step(__u32 i, struct udp_walk *w)
{
	if (w->pos >= w->end)
		return 1;
	w->s->head_len = 0;
	int taken = mc_take_head(w->skb, w->s, w->pos, w->end, w->binary);
	if (taken <= 0 || !w->s->complete)
		return 1;
	struct verdict v = {};
	mc_classify(w->s, &v, w->binary);
	if (v.flush_delay)
		hold_for_flush(v.flush_delay);
	w->pos += taken + v.skip;
	return 0;
}

static __always_inline int udp_request(struct __sk_buff *skb, const struct packet *p)
{
	__u16 id;
	__u8 first = 0; /* memcached reads each datagram in the protocol of its first byte */
	/* a first fragment without the request id comes from no real stack:
	 * its reply could not be told */
	if (p->payload_len < 8 || bpf_skb_load_bytes(skb, p->payload_off, &id, sizeof(id)))
		return p->fragment ? TCX_DROP : TCX_NEXT;
	if ((p->payload_len == 8 || bpf_skb_load_bytes(skb, p->payload_off + 8, &first, 1)) && !p->fragment) {
		COUNT(reads); /* memcached ignores a datagram without a command */
		return TCX_NEXT;
	}
	int binary = first == 0x80;
	__u32 one = 1;
	struct mc_flow *scratch = bpf_map_lookup_elem(&mc_scratch, &one);
	if (!scratch)
		return TCX_NEXT;
	struct mc_stream *s = &scratch->in;
	s->head_len = 0;
	__u32 start = p->payload_off + 8, end = p->payload_off + p->payload_len;
	struct verdict v = {};
	int single = 0;
	int taken = mc_take_head(skb, s, start, end, binary);
	if (taken >= 0 && s->complete) {
		mc_classify(s, &v, binary);
		if (v.flush_delay)
			hold_for_flush(v.flush_delay);
		/* a first fragment: more may follow in the others, unseen */
		single = !p->fragment && start + taken + v.skip >= end;
		if (!single) {
			struct udp_walk w = {.skb = skb, .s = s, .pos = start + taken + v.skip, .end = end, .binary = binary};
			bpf_loop(1 << 16, udp_walk_step, &w, 0);
		}
	} else if (taken >= 0 && !p->fragment) { /* no whole command: memcached changes nothing */
		COUNT(reads);
		return TCX_NEXT;
	} /* else a head over MC_HEAD, which memcached takes all the same, or one cut by fragmenting: bad */
	if (single && (v.kind == MC_READ || v.kind == MC_UNKNOWN || (v.kind == MC_QUIET && !v.slot))) {
		COUNT(reads);
		return TCX_NEXT;
	}
	/* a bad command line, or more than one command: not worth parsing */
	__u32 slot = single && v.slot ? v.slot : MC_EPOCH_SLOT;
	/* several commands: maybe all noreply */
	report_bump(slot, v.noreply || !single ? MC_REPORT_UNACKED : 0);
	if (slot == MC_EPOCH_SLOT)
		COUNT(epoch_writes);
	else
		COUNT(writes);
	COUNT(udp_writes);
	if (single && v.noreply)
		return TCX_NEXT; /* no reply comes: bumped unacked */
	struct mc_udp_key k = {};
	udp_key(&k, p, 0, id);
	mc_udp_await(&k, slot);
	return TCX_NEXT;
}

static __always_inline int udp_reply(struct __sk_buff *skb, const struct packet *p)
{
	__u16 id;
	if (p->payload_len < 8 || bpf_skb_load_bytes(skb, p->payload_off, &id, sizeof(id)))
		return TCX_NEXT;
	struct mc_udp_key k = {};
	udp_key(&k, p, 1, id);
	struct mc_udp_write *w = bpf_map_lookup_elem(&mc_udp_writes, &k);
	if (!w)
		return TCX_NEXT;
	__u32 slots[MC_UDP_SLOTS], n;
	bpf_spin_lock(&w->lock);
	__builtin_memcpy(slots, w->slots, sizeof(slots));
	n = w->nslots;
	bpf_spin_unlock(&w->lock);
	for (__u32 i = 0; i < MC_UDP_SLOTS; i++) {
		if (i >= n)
			break;
		bump(slots[i]);
	}
	COUNT(udp_replies_bumped);
	return TCX_NEXT;
}

/* Whether memcached serves on port (network order) of ports. */
static __always_inline int served(const volatile __u64 *ports, __u16 port)
{
	port = bpf_ntohs(port);
	return ports[port / 64] >> (port % 64) & 1;
}

SEC("tc")
int mc_ingress(struct __sk_buff *skb)
{
	struct packet p = {};
	if (parse_packet(skb, &p))
		return TCX_NEXT;
	if (p.proto == IPPROTO_TCP && served(tcp_ports, p.dport))
		return tcp_request(skb, &p);
	if (p.proto == IPPROTO_UDP && served(udp_ports, p.dport))
		return udp_request(skb, &p);
	return TCX_NEXT;
}

SEC("tc")
int mc_egress(struct __sk_buff *skb)
{
	struct packet p = {};
	if (parse_packet(skb, &p))
		return TCX_NEXT;
	if (p.proto == IPPROTO_TCP && served(tcp_ports, p.sport))
		return tcp_reply(skb, &p);
	if (p.proto == IPPROTO_UDP && served(udp_ports, p.sport))
		return udp_reply(skb, &p);
	return TCX_NEXT;
}

/* Emit the limits into BTF for bpf2go. */
const enum mc_limit *mc_limit_layout __attribute__((unused));
