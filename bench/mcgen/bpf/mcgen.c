// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* Load generator for the memcached benchmark: one XDP program, attached to
 * the client veth, with two roles.
 *
 * Why one program: BPF_PROG_RUN with repeat > 1 adds the program to the
 * kernel's XDP dispatcher for the duration of the call and removes it
 * afterwards; each change rebuilds the dispatcher and waits for an RCU grace
 * period (tens to hundreds of ms per call here). A program that is attached
 * to an interface stays in the dispatcher, so the calls only take a
 * reference.
 *
 * The roles are told apart by XDP metadata: user space runs the program
 * with BPF_PROG_RUN in live-frame mode (BPF_F_TEST_XDP_LIVE_FRAMES) on data
 * that starts with 8 bytes of metadata holding gen_magic; live mode restores
 * the metadata pointer whenever a recycled page-pool page is used again.
 * Frames received from the server veth carry no metadata (the generator
 * strips it before transmitting, so even frames an XDP responder on the
 * server sends back in our own pages come back without it).
 *
 * generator (metadata == gen_magic): copies the next prebuilt Ethernet frame
 *   (built in user space with correct IP and UDP checksums) into the
 *   page-pool frame, optionally stamps a request id into the first two payload bytes (fixing
 *   the UDP checksum incrementally) and returns XDP_TX, which live mode turns
 *   into a redirect out of the ctx's ingress interface: the client veth,
 *   i.e. towards the server veth. Live mode re-uses page-pool pages without
 *   resetting their content, so the whole frame is written every time.
 *
 * counter (every other frame, i.e. what the client veth receives): UDP
 *   datagrams from the server port to one of the generator's source ports
 *   are counted and dropped
 *   (with request ids: matched against the ids in flight); everything else
 *   is passed, like the testbed's xdp_pass. */
#include "../../../bpf/include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define ETH_P_IP 0x0800
#define ETH_P_IPV6 0x86DD
#define IP_OFFSET 0x1FFF

/* Room per prebuilt frame (Ethernet header included). Keep in sync with
 * maxFrame in mcgen.go. */
#define MAX_FRAME 512
#define NIDS 65536

struct frame {
	__u32 len;
	__u8 data[MAX_FRAME];
};

/* Prebuilt frames, index 0..nframes-1. max_entries set by the loader. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct frame);
} frames SEC(".maps");

/* Request ids in flight: set to 1 by gen, swapped back to 0 by count. */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, NIDS);
	__type(key, __u32);
	__type(value, __u32);
} inflight SEC(".maps");

enum {
	CNT_REPLIES,   /* UDP datagrams from the server port to ours (dropped) */
	CNT_MATCHED,   /* ... whose request id was in flight */
	CNT_UNMATCHED, /* ... whose request id was not (or too short) */
	CNT_PASSED,    /* everything else, passed to the stack */
	CNT_MAX,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CNT_MAX);
	__type(key, __u32);
	__type(value, __u64);
} counts SEC(".maps");

/* Set by the loader (spec.Variables). */
volatile const __u32 nframes = 1;
volatile const __u16 server_port = 11211; /* host order */
volatile const __u16 client_port_lo = 40000; /* the generator's source ports, */
volatile const __u16 client_port_hi = 40000; /* host order, inclusive */
volatile const __u32 l4_off = 14 + 20;    /* UDP header offset in the frames */
volatile const __u8 stamp_id = 0;         /* rewrite payload bytes 0..1 */
volatile const __u64 gen_magic = 0;       /* metadata of generator runs */

/* Generator state. Only one BPF_PROG_RUN runs at a time (the Go side
 * serialises Run), so plain updates suffice. Read by user space. */
__u64 sent = 0;      /* frames returned with XDP_TX */
__u64 failed = 0;    /* frames that could not be built (dropped) */
__u64 idle = 0;      /* iterations that sent nothing (pacing, budget) */
__u64 budget = 0;    /* frames still allowed; decremented per frame */
/* Pacing inside a call (spin mode), in 1/16 ns: send when the clock has
 * reached pace_next, then advance it by pace_interval; a backlog beyond
 * pace_maxlag is dropped. pace_interval 0: send on every iteration. */
__u64 pace_next = 0;
__u64 pace_interval = 0;
__u64 pace_maxlag = 0;
__u32 next_frame = 0;
__u32 next_id = 0;

static __always_inline __u16 csum_fold(__u32 s)
{
	s = (s & 0xffff) + (s >> 16);
	s = (s & 0xffff) + (s >> 16);
	return (__u16)s;
}

static __always_inline int gen(struct xdp_md *ctx)
{
	__u32 k = next_frame;
	struct frame *f;
	__u32 len;
	long cur;

	if (pace_interval) {
		__u64 now = bpf_ktime_get_ns() << 4;

		if (now < pace_next) {
			idle++;
			return XDP_DROP;
		}
		if (now - pace_next > pace_maxlag)
			pace_next = now - pace_maxlag;
		pace_next += pace_interval;
	}
	if (!budget) {
		idle++;
		return XDP_DROP;
	}
	budget--;

	if (k + 1 >= nframes)
		next_frame = 0;
	else
		next_frame = k + 1;

	f = bpf_map_lookup_elem(&frames, &k);
	if (!f)
		goto fail;
	len = f->len;
	if (len < 14 || len > MAX_FRAME)
		goto fail;

	/* No metadata on the wire. */
	cur = (long)ctx->data - (long)ctx->data_meta;
	if (cur > 0 && bpf_xdp_adjust_meta(ctx, (int)cur))
		goto fail;
	cur = (long)ctx->data_end - (long)ctx->data;
	if (cur != (long)len && bpf_xdp_adjust_tail(ctx, (int)len - (int)cur))
		goto fail;
	if (bpf_xdp_store_bytes(ctx, 0, f->data, len))
		goto fail;

	if (stamp_id) {
		void *data = (void *)(long)ctx->data;
		void *end = (void *)(long)ctx->data_end;
		__u32 off = l4_off;
		__u16 *csum, *pid, old, new;
		__u32 id = next_id & (NIDS - 1);
		__u32 one = 1, *fl;

		if (off > 14 + 40)
			goto fail;
		csum = data + off + 6;
		pid = data + off + 8;
		if ((void *)(pid + 1) > end)
			goto fail;
		next_id = id + 1;
		old = *pid;
		new = bpf_htons((__u16)id);
		*pid = new;
		/* RFC 1624: HC' = ~(~HC + ~m + m'). 0 means "no checksum"
		 * (IPv4 only; user space always fills one in). */
		if (*csum) {
			__u16 c = ~csum_fold((__u32)(__u16)~*csum + (__u16)~old + new);
			*csum = c ? c : 0xffff;
		}
		fl = bpf_map_lookup_elem(&inflight, &id);
		if (fl)
			*fl = one;
	}
	sent++;
	return XDP_TX;
fail:
	failed++;
	return XDP_DROP;
}

static __always_inline void bump(__u32 i)
{
	__u64 *c = bpf_map_lookup_elem(&counts, &i);

	if (c)
		(*c)++;
}

static __always_inline int count(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct udphdr *udp;

	if ((void *)(eth + 1) > end)
		goto pass;
	if (eth->h_proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = (void *)(eth + 1);

		if ((void *)(ip + 1) > end)
			goto pass;
		if (ip->protocol != IPPROTO_UDP || (ip->frag_off & bpf_htons(IP_OFFSET)) || ip->ihl < 5)
			goto pass;
		udp = (void *)ip + ip->ihl * 4;
	} else if (eth->h_proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = (void *)(eth + 1);

		if ((void *)(ip6 + 1) > end)
			goto pass;
		if (ip6->nexthdr != IPPROTO_UDP)
			goto pass;
		udp = (void *)(ip6 + 1);
	} else {
		goto pass;
	}
	if ((void *)(udp + 1) > end)
		goto pass;
	if (udp->source != bpf_htons(server_port) || bpf_ntohs(udp->dest) < client_port_lo ||
	    bpf_ntohs(udp->dest) > client_port_hi)
		goto pass; /* e.g. the replies of a latency prober's socket */

	bump(CNT_REPLIES);
	if (stamp_id) {
		__u16 *pid = (void *)(udp + 1);
		__u32 id, *fl;

		if ((void *)(pid + 1) > end) {
			bump(CNT_UNMATCHED);
			return XDP_DROP;
		}
		id = bpf_ntohs(*pid);
		fl = bpf_map_lookup_elem(&inflight, &id);
		if (fl && __sync_lock_test_and_set(fl, 0))
			bump(CNT_MATCHED);
		else
			bump(CNT_UNMATCHED);
	}
	return XDP_DROP;
pass:
	bump(CNT_PASSED);
	return XDP_PASS;
}

SEC("xdp")
int mcgen(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	__u64 *meta = (void *)(long)ctx->data_meta;

	if ((void *)(meta + 1) <= data && *meta == gen_magic)
		return gen(ctx);
	return count(ctx);
}
