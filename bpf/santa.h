/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Layouts shared by the rule processor and user space (via bpf2go). */
#pragma once

/* Limits, as an enum so bpf2go hands them to Go (internal/dataplane). */
enum santa_limit {
	SANTA_MAX_REGIONS = 8,       /* regions hashed per rule set and packet */
	SANTA_MAX_CONDS = 4,         /* conditions per rule */
	SANTA_MAX_COPIES = 8,        /* copy segments per rule (after flattening) */
	SANTA_MAX_COPY_MASK = 8,     /* bytes of one masked copy */
	SANTA_MAX_GUARDS = 2,        /* guards per rule */
	SANTA_GUARD_SLOTS = 1 << 20, /* slots in santa_guards */
	SANTA_MAX_CHAIN = 16,        /* rules walked per bucket */
	SANTA_WARM_MIN_BUCKETS = 4096, /* rule sets with this many buckets (about 1000 rules) warm their rules (matcher.h) */
	SANTA_REQ_WINDOW = 1472,     /* request bytes the matcher sees: a full 1500-byte MTU */
	SANTA_MAX_PATTERN = 1024,    /* bytes in one condition pattern */
	SANTA_MAX_REGION_LEN = 64,   /* bytes hashed for one region */
	SANTA_MAX_REPLY = 1472,      /* UDP payload of a reply (IPv4, 1500-byte MTU) */
	SANTA_PAGE_DATA = 1 << 20,   /* bytes of rule data in one page */
	SANTA_PAGE_SLACK = 2048,     /* offset < PAGE_DATA plus length <= 2048 stays in bounds */
	SANTA_SAMPLE_MAX = 1472,     /* request bytes in one miss sample: a whole request window */
	SANTA_OFF_MASK = 2047,       /* bounds offsets and lengths for the verifier */
	SANTA_SCRATCH_REQ = 4096,    /* > 2 * SANTA_OFF_MASK: offset plus length stays inside */
	SANTA_SCRATCH_L4 = 128,      /* a TCP header (at most 60 bytes) with slack for option reads */
	SANTA_SCRATCH_TCP = 64,      /* the TCP responder's working state (bpf/tcp.h) */
	SANTA_PORT_WORDS = 65536 / 64, /* santa_ports: 64-bit words of one set of port bits */
	SANTA_PORTS_UDP = 0,         /* santa_ports set: UDP ports with a rule set */
	SANTA_PORTS_TCP = 1,         /* santa_ports set: TCP ports with a rule set */
	SANTA_PORTS_TCP_SAMPLED = 2, /* santa_ports set: TCP ports with a rule set that takes miss samples */
	SANTA_PORTS_TCP_SEEN = 3,    /* santa_ports set: TCP ports that had a rule set since the data plane
				      * loaded: socket-less connections (stamps) exist only there */
	SANTA_PORT_SETS = 4,
	SANTA_RULESET_DISJOINT = 1,  /* rule set flag: at most one rule can match a packet */
	SANTA_ADDR_LOCAL = 1,        /* santa_local_addrs: an address of this host */
	SANTA_ADDR_BROADCAST = 2,    /* santa_local_addrs: a subnet broadcast address */
	SANTA_LOCAL_FILTER_BITS = 12, /* santa_local_filter: 2^12 slots */
	SANTA_LOCAL_FILTER_SLOTS = 1 << 12,
	SANTA_SOCKET_CACHE = 16,     /* santa_scratch: cached santa_sockets answers per CPU */
	SANTA_PORT_SHARERS = 32,     /* sockets of a UDP hash slot walked for one bound to an interface on the
				      * port (port_shared_with_bound); a longer chain is taken as having one */
	SANTA_LOCAL_CACHE = 4,       /* santa_scratch: cached santa_local_addrs answers per CPU */
	SANTA_GEN_SOCKETS = 0,       /* santa_gens: the word of santa_sockets */
	SANTA_GEN_LOCAL_ADDRS = 1,   /* santa_gens: the word of santa_local_addrs */
	SANTA_GENS = 2,
	SANTA_COND_MASKED = 1u << 31, /* santa_cond.data flag: the pattern has a mask */
	SANTA_RULE_CLOSE = 1,        /* santa_rule.flags: TCP, the reply ends the connection (FIN with it) */
	SANTA_RULE_EXPIRES = 2,      /* santa_rule.flags: the rule stops answering at santa_rule.expires */
	SANTA_TCP_UNIT_SHIFT = 33,   /* stamp time unit: 2^33 ns (8.6 s) of CLOCK_MONOTONIC */
	SANTA_TCP_EPOCH_SHIFT = 8,   /* a stamp key serves 2^8 units (36.7 min) */
	SANTA_TCP_VALID_UNITS = 16,  /* a stamp proves its connection for 16 units (137 s) */
	SANTA_TCP_KEYS = 3,          /* santa_tcp_keys slots: epochs e-1, e, e+1 by e % 3 */
	SANTA_TCP_WSCALE = 7,        /* the window scale eBPF announces (the kernel's usual) */
	SANTA_TCP_FLOWS = 1 << 17,   /* default size of santa_tcp_flows (set by user space) */
	SANTA_TCP_SEGMENTS = 10,     /* segments of one reply: the initial window (RFC 6928) */
	SANTA_TCP_RESENDS = 8,       /* resends for repeated acks while the client's ack stands still */
	SANTA_MAX_TCP_REPLY = 14480, /* longest TCP reply: 10 segments of a 1500-byte MTU with timestamps */
	/* santa_tcp_emit.magic: a new value whenever santa_tcp_emit's layout
	 * changes (TestEmitLayoutHasItsMagic), so that a TC program of another
	 * version, running beside this XDP program for moments of an upgrade,
	 * drops the frame (tcp_drop_emit_layout) instead of misreading it.
	 * 0x53545345 named two layouts, before and after the rule ref came in
	 * (up to commit 3257ea6); 0x53545346 the one without the request's
	 * place (req_off, req_len: up to commit 703a112); 0x53545347 the one
	 * without the listener's owner (uid: up to commit a1d35c6). */
	SANTA_TCP_EMIT_MAGIC = 0x53545348,
	/* santa_udp_emit.magic, likewise: TC sends the reply only for metadata
	 * it can read, and passes any other to the socket untouched. */
	SANTA_UDP_EMIT_MAGIC = 0x53554401,
	SANTA_FLOW_OPTS_KNOWN = 0x80, /* santa_tcp_flow.opts holds the connection's option bits */
};

/* n in [1, mask + 1] for the verifier, where the caller knows 1 <= n <= mask + 1. */
#define NONZERO(n, mask) ((((n) - 1) & (mask)) + 1)

/* A window of the UDP payload the matcher hashes once per packet. */
struct santa_region {
	__u16 off;
	__u16 len;
};

/* Payload lengths [min, max]; {0, 0} holds none. */
struct santa_len_range {
	__u16 min;
	__u16 max;
};

/* One rule set: the rules of one socket. */
struct santa_ruleset {
	__u32 nregions;
	__u32 flags;
	__u32 generation;       /* rules with a higher generation are not visible yet */
	/* the rule set's buckets: buckets_base | (bucket hash & buckets_mask),
	 * an aligned part of the table sized to its rules, so the chain heads of
	 * a small set share a few pages (TLB, cache) instead of the whole table */
	__u32 buckets_base;
	__u32 buckets_mask;
	struct santa_region regions[SANTA_MAX_REGIONS]; /* sorted by (off, len) */
	__u16 sample_len;       /* bytes per miss sample, 0 = no samples */
	__u16 sample_pad;
	__u32 sample_per_sec;   /* miss samples per second and CPU */
	/* per region: a superset of the payload lengths its rules answer (they
	 * only widen); a request outside is not looked up there */
	struct santa_len_range lens[SANTA_MAX_REGIONS];
};

/* A condition: len bytes at off in the payload equal the pattern at data in
 * the rule's page. With SANTA_COND_MASKED set in data, only the bits set in
 * the len-byte mask that follows the pattern (at the next 8-byte boundary)
 * are compared; the pattern has no bits outside its mask. */
struct santa_cond {
	__u16 off;
	__u16 len;
	__u32 data;
};

/* Copy len request bytes from payload offset src to reply offset dst.
 * A masked copy (mask != 0, len <= SANTA_MAX_COPY_MASK) copies only the bits
 * set in the 8 bytes at tpl + mask in the rule's page (zero past len); the
 * template holds the reply's other bits there. */
struct santa_copy {
	__u16 src;
	__u16 dst;
	__u16 len;
	__u16 mask;
};

/* A rule answers only while slot `slot` of santa_guards holds `version`.
 * Whatever changes the answer (a write tracker of the application) bumps the
 * slot before the application sees the change, and again once it has made it. */
struct santa_guard {
	__u32 slot;
	__u32 pad;
	__u64 version;
};

/* A rule. Its first 64 bytes hold what matching and the reply read for a
 * rule with one condition and one copy; the second line what most other
 * rules read besides: conditions 1 and 2, the guards and the expiry time
 * (a DNS rule reads lines one and two, so does a memcached rule); the third
 * the rest. */
struct santa_rule {
	__u32 ruleset;          /* owner; 0 marks a free slot */
	__u32 next;             /* next rule slot in the bucket chain, 0 = end */
	__u32 hash;             /* region hash (matcher.h) of the anchor region of the anchor condition */
	struct santa_region region; /* the anchor region's identity */
	__u32 priority;         /* of several matching rules the lowest priority wins, */
	__u32 order;            /* then the lowest order (insertion order): docs/matching.md */
	__u32 generation;       /* visible once the rule set's generation reaches it */
	__u32 page;             /* data page holding patterns and template */
	__u32 tpl;              /* template offset in the page */
	__u16 tpl_csum;         /* folded 16-bit ones' complement sum of the template */
	__u16 reply_len;
	__u16 min_len;          /* shortest request: the rule's bound, and what its conditions and copies read */
	__u16 max_len;          /* longest request the rule answers */
	__u8 nconds;
	__u8 ncopies;
	__u8 nguards;
	__u8 flags;             /* SANTA_RULE_* */
	struct santa_cond cond0;  /* condition 0 (rule_cond) */
	struct santa_copy copy0;  /* copy 0 (rule_copy) */
	struct santa_cond conds[2]; /* conditions 1 and 2 */
	struct santa_guard guards[SANTA_MAX_GUARDS];
	__u64 id;               /* user space's RuleID, read back by its successor after a restart */
	__u64 expires;          /* with SANTA_RULE_EXPIRES: CLOCK_MONOTONIC ns (bpf_ktime_get_coarse_ns)
				 * from which the rule no longer answers, santad running or not */
	struct santa_cond cond3;  /* condition 3 */
	struct santa_copy copies[SANTA_MAX_COPIES - 1]; /* copies 1.. */
};
_Static_assert(__builtin_offsetof(struct santa_rule, conds) == 64, "santa_rule: first line overflows");
_Static_assert(__builtin_offsetof(struct santa_rule, cond3) == 128, "santa_rule: second line overflows");
_Static_assert(SANTA_MAX_CONDS == 4, "santa_rule: cond0, conds[2] and cond3");
_Static_assert(sizeof(struct santa_rule) == 192, "santa_rule: not three cache lines");

/* Condition k and copy k of rule r (k below nconds, ncopies). */
static __always_inline const struct santa_cond *rule_cond(const struct santa_rule *r, __u32 k)
{
	return k == 0 ? &r->cond0 : k < 3 ? &r->conds[(k - 1) & 1] : &r->cond3;
}

static __always_inline const struct santa_copy *rule_copy(const struct santa_rule *r, __u32 k)
{
	return k == 0 ? &r->copy0 : &r->copies[(k - 1) & (SANTA_MAX_COPIES - 1)];
}

/* Rule data: patterns and flattened reply templates, allocated by user space. */
struct santa_page {
	__u8 b[SANTA_PAGE_DATA + SANTA_PAGE_SLACK];
};

/* An address of the network namespace an attached interface lives in. */
struct santa_local_addr {
	__u32 ifindex;   /* the attached interface the packet arrived on */
	__u8 family;     /* 4 or 6 */
	__u8 pad[3];
	__u8 addr[16];   /* IPv4 in the first 4 bytes */
};
_Static_assert(sizeof(struct santa_local_addr) == 24, "santa_local_addr: local_filter_slot hashes three words");

/* Per-rule, per-CPU statistics. */
struct santa_rule_counters {
	__u64 hits;
	__u64 bytes;
};

/* Why a packet was passed to the stack (or answered). One field per reason,
 * per CPU, so user space reads names rather than indexes. */
struct santa_reasons {
	__u64 answered;          /* a rule matched and the reply was sent with XDP_TX */
	__u64 pass_not_ip;       /* not IPv4/IPv6 (ARP, LLDP, ...) */
	__u64 pass_not_unicast;  /* Ethernet multicast/broadcast: never answered */
	__u64 pass_vlan;         /* 802.1Q tag of a VLAN (not 0): the kernel's VLAN device, if any, receives it */
	__u64 pass_not_udp;      /* another transport protocol than UDP and TCP */
	__u64 pass_ip_options;   /* IPv4 header with options */
	__u64 pass_ipv6_ext;     /* IPv6 extension header */
	__u64 pass_fragment;     /* IPv4 fragment */
	__u64 pass_malformed;    /* truncated frame, inconsistent lengths, bad header or header checksum */
	__u64 pass_bad_address;  /* source or destination no unicast host has (loopback, multicast, ...) */
	__u64 pass_not_local;    /* source is an address of this host, or the destination is none of its
				  * addresses (a wildcard-bound socket, or one bound with IP_FREEBIND or to an
				  * address since removed): the kernel would not deliver */
	__u64 pass_other_host;   /* unicast frame to another MAC than the interface's (promiscuous
				  * interface, bridge port, flooding switch): the kernel drops it */
	__u64 pass_under_master; /* arrived on a port of a bridge, bond, team, Open vSwitch or VRF, whose master
				  * the kernel hands it to, where another socket (or none) may receive it */
	__u64 pass_port_unbound; /* no socket bound to the destination port has a rule set (santa_ports):
				  * passed without a socket lookup */
	__u64 pass_no_socket;    /* no socket would receive the packet */
	__u64 pass_no_ruleset;   /* the receiving socket has no rule set */
	__u64 pass_no_match;     /* rule set present, no rule matched */
	__u64 pass_invalidated;  /* a rule's conditions held but one of its guards has moved on */
	__u64 pass_expired;      /* a rule's conditions held but its expires time had come (not yet removed) */
	__u64 pass_too_long;     /* payload longer than the matcher's window */
	__u64 pass_bad_checksum; /* a rule matched but the request's UDP checksum is wrong */
	__u64 pass_no_room;      /* the frame could not be resized for the reply */
	__u64 udp_xdp_no_room;   /* a UDP reply the frame has no room for: passed to TC, which sends it */
	__u64 udp_emit_passed;   /* TC: a UDP reply XDP passed could not be built (its rule went, the skb
				  * could not grow): the request goes to the socket untouched */
	__u64 udp_emit_failed;   /* TC: writing a UDP reply failed after the request was rewritten: dropped,
				  * the client asks again */
	__u64 pass_reply_too_big; /* the reply exceeds the interface MTU or 1500 bytes (IPv6 header) */
	__u64 pass_error;        /* a helper failed while building the reply */
	__u64 miss_sampled;      /* misses copied to the sample ring */
	__u64 miss_sample_dropped; /* samples lost: ring full */
	__u64 miss_sample_limited; /* samples skipped by the rate limit */
	__u64 chain_truncated;   /* a bucket chain was longer than SANTA_MAX_CHAIN */
	__u64 released_dropped;  /* a closed socket's cookie was lost: santa_released full */
	/* TCP (docs/tcp.md). "Handover" passes mark segments of a socket-less
	 * connection that the TC hook gives to the kernel with its listener. */
	__u64 tcp_syn_answered;     /* SYN answered with a stamped SYN-ACK */
	__u64 tcp_ack_consumed;     /* pure ACK of a socket-less connection, nothing to do */
	__u64 tcp_keepalive_answered; /* pure ACK or 1-byte probe after an idle unit: ACKed, stamp renewed */
	__u64 tcp_fin_answered;     /* client FIN answered (FIN-ACK, or ACK after our FIN) */
	__u64 tcp_rst_consumed;     /* RST to a listener with a rule set: nothing to tear down */
	__u64 tcp_pass_kernel_socket; /* the kernel has a socket for the 4-tuple (handed over, or its own) */
	__u64 tcp_pass_no_timestamps; /* SYN without the timestamp option: the kernel accepts it */
	__u64 tcp_pass_syn_other;   /* SYN with data, SYN-ACK, bad options, MSS < 536 (IPv6: 1220): the kernel's */
	__u64 tcp_pass_small_mtu;   /* SYN on an interface whose MTU allows no 536-byte MSS: the kernel's */
	__u64 tcp_pass_no_key;      /* no stamp key for this epoch (santad not rotating): the kernel's */
	__u64 tcp_pass_bad_stamp;   /* ACK to a listener without a valid stamp (expired, forged, kernel syncookie) */
	__u64 tcp_handover_flags;   /* handover: URG, or FIN with data */
	__u64 tcp_handover_window;  /* handover: the client's window is smaller than the reply */
	__u64 tcp_handover_long_reply; /* handover: the reply is longer than 10 segments of the client's MSS,
				    * or takes several and copies request bytes */
	__u64 tcp_drop_pipelined;   /* a request before the client acked the last reply: dropped, it retransmits */
	__u64 tcp_drop_fin_in_reply; /* the client's FIN before it acked the last reply: dropped, it sends it
				      * again (a FIN-ACK would end its stream inside the reply) */
	__u64 tcp_drop_after_fin;   /* data after eBPF's FIN: dropped */
	__u64 tcp_drop_old_request; /* a retransmitted request older than the last answered: dropped,
				     * the later reply acks it */
	__u64 tcp_request_repeated; /* the last request answered came again: its reply sent again
				     * (from where the client is), or the request acked */
	__u64 tcp_handed_over;      /* TC: a socket-less connection given to its listener */
	__u64 tcp_handover_failed;  /* TC: bpf_sk_assign_tcp_reqsk refused it (the kernel then resets it) */
	__u64 tcp_long_reply;       /* a reply of several segments, sent by TC */
	__u64 tcp_xdp_no_room;      /* a reply of one segment the frame has no room for: sent by TC */
	__u64 tcp_resend;           /* a repeated ack (loss): TC resends the missing segment and the last */
	__u64 tcp_request_acked;    /* the client has a long reply: eBPF acks its request */
	__u64 tcp_segments_sent;    /* TC: segments of long replies and resends */
	__u64 tcp_emit_failed;      /* TC: a segment could not be built or sent */
	__u64 tcp_pass_flows_full;  /* handover: santa_tcp_flows is full, eBPF cannot keep the flow's state */
	__u64 tcp_drop_rule_gone;   /* the rule of a reply in flight went and the client has none of the reply:
				     * dropped with the flow, the client asks again and is answered anew */
	__u64 tcp_reset_rule_gone;  /* the rule of a reply in flight went and the client has part of it: reset */
	__u64 tcp_resend_limit;     /* a repeated ack after SANTA_TCP_RESENDS resends without progress
				     * (a segment the path cannot carry): not resent */
	__u64 tcp_drop_resend_copies; /* a repeated ack for a reply with copies, which only its request can
				       * rebuild: not resent, the client retransmits the request */
	__u64 tcp_drop_rst_seq;     /* RST on a flow, not at the client's next byte (RFC 5961): dropped,
				     * the flow stays */
	__u64 tcp_drop_gap;         /* request or FIN after bytes eBPF has not taken (dropped or lost):
				     * dropped, not acked nor handed over */
	__u64 tcp_syn_challenged;   /* SYN on a connection with a flow: challenge ACK (RFC 5961), the flow stays */
	__u64 tcp_drop_carrying;    /* a segment while santad carries a predecessor's flows over (moments
				     * after a restart): dropped, the client sends it again */
	__u64 tcp_drop_emit_layout; /* TC: a frame XDP passed with metadata TC cannot read (an XDP program of
				     * another version, moments of an upgrade): dropped, the client sends it again */
	__u64 tcp_ack_unsent_challenged; /* a segment acking bytes eBPF never sent, on a connection with a flow:
					  * dropped, answered with an ACK of where eBPF stands (RFC 5961 5.2) */
};

/* A miss sample as it appears in the ring buffer. */
struct santa_miss_sample {
	__u64 cookie;   /* socket cookie of the receiving socket */
	__u32 ruleset;
	__u16 len;      /* UDP payload length of the request */
	__u16 caplen;   /* bytes in data */
	__u8 family;    /* 4 or 6 */
	__u8 pad[7];
	__u8 data[SANTA_SAMPLE_MAX];
};

/* A bucket of the matcher's hash table: the first rule of its chain, and
 * where that rule's data lies, so that loading it need not wait for the
 * rule. The hint is only ever a hint: user space writes it beside head
 * without ordering, and the program only touches the lines it names. */
struct santa_bucket {
	__u32 head; /* first rule slot of the chain, 0 = empty */
	__u32 hint; /* page << 16 | first 64-byte line << 2 | lines - 1 (up to 4) */
};

#define SANTA_NO_PASS 0xffffffffu

/* The matcher's per-region results for one request: each region's hash
 * and its bucket (head 0: no rule, or the region does not fit), and the
 * hash pass it is in (santa_region_hash). */
struct santa_region_probe {
	__u32 hash[SANTA_MAX_REGIONS];
	struct santa_bucket bucket[SANTA_MAX_REGIONS];
	__u64 state;   /* the pass's hash state after its whole words */
	__u32 off;     /* where the pass started; SANTA_NO_PASS: none yet (no offset is) */
	__u32 pos;     /* where its whole words end */
};

/* A CPU's copy of one santa_sockets answer: cookie's rule set (0: none)
 * as it was while its santa_gens word held gen. */
struct santa_socket_cache {
	__u64 cookie;
	__u64 gen;
	__u32 ruleset;
	__u32 pad;
};

/* A CPU's copy of one santa_local_addrs answer: what key is (0: none) as
 * it was while its santa_gens word held gen. */
struct santa_local_cache {
	struct santa_local_addr key;
	__u64 gen;
	__u8 kind;
	__u8 pad[7];
};

/* Per-CPU work area: the request window (with slack for word-wise compares
 * past a pattern's end), the reply's headers, the request's TCP header,
 * the TCP responder's state, the matcher's probes (off the short stack) and
 * the recent answers of santa_sockets, by cookie % SANTA_SOCKET_CACHE, and
 * of santa_local_addrs, by filter slot % SANTA_LOCAL_CACHE. */
struct santa_scratch {
	__u8 req[SANTA_SCRATCH_REQ];
	__u8 hdr[128];
	__u8 l4[SANTA_SCRATCH_L4];
	__u8 tcp[SANTA_SCRATCH_TCP];
	__u64 copy_word; /* TC: a masked copy's bytes for bpf_skb_store_bytes (its stack has none to spare) */
	struct santa_region_probe probe;
	struct santa_socket_cache sockets[SANTA_SOCKET_CACHE];
	struct santa_local_cache local[SANTA_LOCAL_CACHE];
};

/* The SipHash key of one stamp epoch (TCP). */
struct santa_tcp_key {
	__u64 k0;
	__u64 k1;
	__u64 epoch_plus1; /* the epoch this key serves, plus one; 0 = empty slot */
};

/* The rule a reply came from, to send its bytes again later: its slot, and
 * what the slot's rule must still be (santad reuses a slot a second after
 * its rule went, for another rule or a new version of the same). */
struct santa_rule_ref {
	__u64 id;
	__u32 slot;
	__u32 ruleset;
	__u32 generation;
	__u32 pad;
};

/* What eBPF remembers of a flow it answered (TCP): the pipelining guard,
 * and where a reply of several segments stands. */
struct santa_tcp_flow {
	__u32 req_seq;     /* sequence number of the request last answered */
	__u32 req_end;     /* after its last byte: what the reply acks */
	__u32 reply_start; /* sequence number of that reply's first byte */
	__u32 reply_end;   /* after its last (and FIN): what the client acks once it has it all */
	struct santa_rule_ref rule; /* its rule */
	__u32 last_ack;    /* the client's last ack: a repeat asks for a resend */
	__u32 seen;        /* stamp unit (low 32 bits) it last answered: santad sweeps idle flows */
	__u8 multi;        /* the reply takes several segments (sent by TC) */
	__u8 resends;      /* resends for repeated acks since the client's ack last moved */
	__u8 opts;         /* the connection's stamp option bits | SANTA_FLOW_OPTS_KNOWN (0: a flow of
			    * a version before it): santad closes an idle connection with a stamped FIN */
	__u8 pad;
	__u32 uid;         /* the owner (sk_uid) of the listener that answered: the stamps' MAC covers it
			    * (0 from versions before it, whose stamps are those of owner 0) */
};

/* XDP -> TC metadata (before the frame): send segments of rule slot's reply
 * (TC can send several frames, XDP one). */
struct santa_tcp_emit {
	__u32 magic;       /* SANTA_TCP_EMIT_MAGIC */
	__u32 seq;         /* sequence number of reply byte 0 */
	__u32 ack;         /* the request's first byte: no segment acks the request, so
			    * that a lost segment makes the client retransmit it (there is
			    * no timer here); eBPF acks it once the client has the reply */
	__u32 tsecr;
	__u32 stamp;       /* the TSval of the segments without FIN */
	__u32 opts;        /* the stamp's option bits */
	__u32 uid;         /* the listener's owner (sk_uid), for the stamp of a segment with eBPF's FIN */
	__u16 from;        /* first reply byte to send (segments of opts' MSS less the timestamps) */
	__u16 req_off;     /* the request's bytes in the frame, for the rule's copies (a reply with */
	__u16 req_len;     /* copies takes one segment); req_len 0: the frame carries none */
	__u8 resend;       /* a repeated ack: the segment at from, and the last one */
	__u8 pad[5];
	struct santa_rule_ref rule; /* whose reply */
};

/* XDP -> TC metadata (before the frame): send rule's reply to this UDP
 * request, which the frame had no room for (veth's copies of a local
 * sender's frames: docs/matching.md). */
struct santa_udp_emit {
	__u32 magic;                /* SANTA_UDP_EMIT_MAGIC */
	__u32 pad;
	struct santa_rule_ref rule; /* whose reply */
};

/* Per-CPU miss sample budget of one rule set. */
struct santa_sample_budget {
	__u64 window_start;
	__u32 used;
	__u32 pad;
};
