/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* Layouts the memcached write tracker shares with user space (via bpf2go). */
#pragma once

enum mc_limit {
	MC_GUARD_SLOTS = 1 << 20, /* santa_guards' slots (SANTA_GUARD_SLOTS) */
	MC_EPOCH_SLOT = 1,        /* bumped by writes of unknown keys: retires every rule */
	MC_FIRST_KEY_SLOT = 2,    /* key slots are hash & (MC_GUARD_SLOTS - 1), moved up past these */
	MC_HEAD = 512,            /* bytes of a command or reply head carried across segments */
	MC_QUEUE = 16,            /* replies a connection may owe before it is tracked coarsely */
	MC_STICKY = 8,            /* keys a coarsely tracked connection remembers */
	MC_PARSED = 8,            /* request segments a connection keeps the digest of */
	MC_MAX_KEY = 250,         /* memcached's key length limit */
	MC_FNV_BASIS = 2166136261u,
	MC_FNV_PRIME = 16777619u,
	MC_FLUSH_RELATIVE_MAX = 60 * 60 * 24 * 30, /* memcached: a flush delay above this is a unix time */
	MC_FLUSH_SLACK = 2,       /* seconds past a delayed flush's time by which memcached has applied it */
	MC_UDP_SLOTS = 4,         /* slots the pending UDP writes of one request id keep; more: the epoch */
	MC_UDP_GIVE_UP_MS = 1000, /* a UDP request id's writes are forgotten this long after the first (bumped unacked) */
	/* struct mc_flow.flags */
	MC_FLOW_UNCOUNTED = 2,    /* replies cannot be counted: every reply bumps the sticky keys */
	MC_FLOW_LOST = 4,         /* the request stream cannot be parsed: every segment bumps the epoch */
	MC_FLOW_TEXT = 8,         /* the first request byte was not 0x80: memcached reads it all as text */
	MC_FLOW_BINARY = 16,      /* it was: memcached reads it all as binary */
	/* an mc_bumped report: the slot, or'd with */
	MC_REPORT_UNACKED = 1 << 30, /* a write no reply of memcached may follow: bump it again later */
};

/* One direction of a TCP connection: where its parser stands. */
struct mc_stream {
	__u32 seq;       /* sequence number of the next byte to parse */
	__u32 skip;      /* data bytes (a value) to pass over before the next head */
	__u16 head_len;  /* bytes of an incomplete head in head[] */
	__u8 unit_after_skip; /* replies: a reply ends when the skipped value does */
	__u8 complete;   /* head[] holds a whole head (a line, or a binary header and key) */
	__u8 head[MC_HEAD + 64]; /* slack: loads of up to 64 bytes at head_len < MC_HEAD */
};

/* A run of replies a connection owes, in order: count replies to reads
 * (slot 0), or the reply to a write of slot (count 1; 0 for noreply). */
struct mc_owed {
	__u32 slot;
	__u32 count;
};

/* Request bytes [seq, seq + len) as parsed, by their keyed digest: bytes
 * sent again there must be the same, or the kernel may have taken other
 * bytes than those the tracker parsed. */
struct mc_parsed {
	__u32 seq;
	__u32 len;
	__u64 digest;
};

/* A memcached TCP connection, keyed by struct mc_flow_key. */
struct mc_flow {
	struct mc_stream in;  /* requests, client to memcached */
	struct mc_stream out; /* replies */
	__u32 flags;
	__u32 head;           /* queue[head % MC_QUEUE] is the oldest owed run */
	__u32 tail;
	__u32 nsticky;
	struct mc_owed queue[MC_QUEUE];
	__u32 sticky[MC_STICKY]; /* slots written on an uncounted connection */
	__u32 nparsed;        /* parsed[nparsed % MC_PARSED] is the next to fill */
	struct mc_parsed parsed[MC_PARSED]; /* the last ones, back to back up to in.seq */
};

struct mc_flow_key {
	__u8 family;
	__u8 pad;
	__u16 client_port;
	__u32 client[4];
	__u32 server[4];
};

/* A UDP write awaiting memcached's reply, by client and request id. */
struct mc_udp_key {
	__u8 family;
	__u8 pad;
	__u16 client_port;
	__u16 request_id;
	__u16 pad2;
	__u32 client[4];
};

/* What the tracker saw, one named field per event, per CPU. */
struct mc_counters {
	__u64 writes;            /* writes of a known key (each bumped its slot) */
	__u64 epoch_writes;      /* writes of unknown keys or every key (flush_all): epoch bumped */
	__u64 reads;             /* requests that change nothing */
	__u64 replies_bumped;    /* replies to writes: their slots bumped again */
	__u64 replies_counted;   /* replies matched to their request */
	__u64 uncounted_flows;   /* connections switched to coarse tracking (quiet commands, unknown commands, full queue) */
	__u64 lost_flows;        /* connections whose requests could not be parsed (bad command line, head too long) */
	__u64 untracked_segments; /* data of connections the tracker did not see open, or in a SYN: epoch bumped */
	__u64 dropped_out_of_order; /* request segments past a gap, dropped so the client resends them in order */
	__u64 udp_writes;        /* of writes: over UDP */
	__u64 udp_replies_bumped; /* UDP replies to writes */
	__u64 udp_writes_unpaired; /* UDP writes whose reply cannot be awaited (mc_udp_writes full of recent ones) or whose request id was forgotten (MC_UDP_GIVE_UP_MS): bumped unacked instead */
	__u64 not_parsed;        /* memcached-port packets whose headers could not be parsed: epoch bumped */
	__u64 bumps_unreported;  /* bumps not reported in mc_bumped (full): the controller checks every rule */
	__u64 unacked_bumps;     /* bumps for writes no reply may follow (noreply, quiet, reset, unparsed, untracked): the controller repeats them later */
	__u64 delayed_flushes;   /* flush_all with a delay (text or binary): no rule is installed until it applies (mc_flush_hold) */
	__u64 bad_checksums;     /* TCP request segments with a wrong checksum, dropped before they are parsed */
	__u64 resent_differ;     /* TCP request segments at parsed sequence numbers with other bytes than those parsed: connection lost */
	__u64 resent_unchecked;  /* TCP request segments at parsed sequence numbers not to be compared with those parsed (other boundaries, older than the kept digests): connection lost */
};
