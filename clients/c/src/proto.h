/*
 * proto.h - libsanta internals: the control protocol's messages as C structs
 * and their CBOR codec (docs/protocol.md). Not installed; the tests use it.
 *
 * One table per map type (a schema) drives encoding, decoding and freeing, so
 * the three can never disagree about a key, its type or its width.
 */
#ifndef SANTA_PROTO_H
#define SANTA_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_VERSION 1
#define SP_MAX_FRAME (256u << 20) /* largest frame body either side accepts */

enum sp_op {
	SP_OP_HEALTH = 1,
	SP_OP_BIND = 2,
	SP_OP_UNBIND = 3,
	SP_OP_ADD = 4,
	SP_OP_REPLACE = 5,
	SP_OP_MODIFY = 6,
	SP_OP_DELETE = 7,
	SP_OP_LIST_SOCKETS = 8,
	SP_OP_LIST_RULES = 9,
	SP_OP_STATS = 10,
	SP_OP_SUBSCRIBE = 11,
	SP_OP_SAMPLE = 12,
};

enum sp_proc_kind { SP_PUT = 1, SP_COPY = 2 };

/*
 * C field names equal the protocol's key names: the schema tables take their
 * names from the fields, and the tests match them against vectors.json.
 * Arrays are a pointer plus a size_t count named n<field>.
 */
struct sp_bytes {
	uint8_t *data;
	size_t len;
};

struct sp_condition {
	uint32_t offset;
	struct sp_bytes pattern;
	struct sp_bytes mask; /* empty: every bit compared */
};

struct sp_processor {
	uint32_t kind; /* enum sp_proc_kind */
	uint32_t reply_offset;
	struct sp_bytes template;
	uint32_t src_offset;
	uint32_t length;
	struct sp_bytes mask; /* copy; empty: every bit copied */
};

/* The rule answers only while slot `slot` of santad's guard map holds `version`. */
struct sp_guard {
	uint32_t slot;
	uint64_t version;
};

struct sp_rule {
	uint64_t id;
	uint32_t version;
	struct sp_condition *conditions;
	size_t nconditions;
	struct sp_processor *processors;
	size_t nprocessors;
	uint32_t reply_len;
	uint32_t priority;
	uint32_t min_len; /* 0: no bound */
	uint32_t max_len; /* 0: no bound */
	struct sp_guard *guards;
	size_t nguards;
	bool close; /* TCP only: the reply ends the connection (sent with FIN) */
	uint64_t expires; /* Unix time (s) santad removes the rule at, 0 = never */
	char *tag; /* who added the rule; NULL or "": no tag */
};

struct sp_socket_info {
	uint64_t cookie;
	uint32_t family;
	uint32_t protocol;
	struct sp_bytes address;
	uint16_t port;
	uint32_t owner;
	uint64_t rules;
	uint64_t template_bytes;
	uint64_t hits;
	bool created;
	uint32_t pid;
	uint64_t reply_bytes;
};

struct sp_rule_stats {
	uint64_t id;
	uint64_t hits;
	uint64_t bytes;
};

struct sp_interface {
	char *name;
	char *mode;
	char *peer; /* a veth's other end's XDP program (native mode only) */
};

struct sp_daemon_info {
	char *version;
	uint32_t protocol;
	uint32_t pid;
	uint64_t uptime_seconds;
	struct sp_interface *interfaces;
	size_t ninterfaces;
	uint64_t sockets;
	uint64_t rules;
	uint64_t max_rules;
	uint64_t data_bytes;
	uint64_t max_data_bytes;
	uint32_t uid;
	uint64_t quota_rules;
	uint64_t quota_bytes;
	uint64_t used_rules;
	uint64_t used_bytes;
	uint64_t quota_rulesets;
	uint64_t used_rulesets;
};

/* One entry of the text -> uint "counters" map. */
struct sp_counter {
	char *name;
	uint64_t value;
};

/* Every request, response and event. Zero, NULL and empty mean "absent". */
struct sp_msg {
	uint64_t v;
	uint64_t op;
	uint64_t seq;
	uint64_t status;
	char *error;
	uint64_t socket;
	uint32_t pid;
	uint32_t fd;
	uint16_t port;
	struct sp_rule *rules;
	size_t nrules;
	uint64_t *ids;
	size_t nids;
	struct sp_socket_info *sockets;
	size_t nsockets;
	struct sp_rule_stats *stats;
	size_t nstats;
	uint32_t sample_bytes;
	uint32_t sample_rate;
	struct sp_bytes sample;
	struct sp_daemon_info *daemon; /* present even when all its fields are zero */
	struct sp_counter *counters;   /* santa_proto_decode returns them in encoding order */
	size_t ncounters;
	uint32_t request_len;
	uint32_t protocol; /* bind by port: 17 UDP (also 0) or 6 TCP */
	uint64_t after;    /* list_rules: only rules with a larger id */
	uint32_t limit;    /* list_rules: at most this many rules (0: all) */
	bool more;         /* list_rules response: rules past the last listed one remain */
	char *tag;         /* list_rules: only rules with this tag; delete: every rule with it */
};

/* Schema: how a struct maps to a CBOR map. The types from SP_TEXT on are
 * reached through a pointer field. */
enum sp_type {
	SP_UINT,     /* unsigned integer field of `width` bytes */
	SP_BOOL,     /* bool */
	SP_BYTES,    /* struct sp_bytes */
	SP_TEXT,     /* NUL-terminated char * (text holding a NUL is refused) */
	SP_UINTS,    /* uint64_t * + count */
	SP_ARRAY,    /* pointer to `elem` structs + count */
	SP_STRUCT,   /* pointer to one `elem` struct */
	SP_COUNTERS, /* struct sp_counter * + count, a map text -> uint */
};

struct sp_schema;

struct sp_field {
	uint8_t key;
	uint8_t type;      /* enum sp_type */
	uint8_t width;     /* SP_UINT: sizeof the C field */
	const char *name;  /* the key's name in docs/protocol.md */
	size_t off;        /* offset of the field (of the pointer, for arrays) */
	size_t count_off;  /* arrays: offset of the size_t count */
	const struct sp_schema *elem;
};

struct sp_schema {
	const char *name;
	size_t size; /* sizeof the C struct */
	const struct sp_field *fields; /* ascending by key */
	size_t nfields;
};

extern const struct sp_schema santa_proto_msg_schema;

#define SP_AT(obj, off) ((char *)(obj) + (off))

/* Reads and writes an SP_UINT field of the given width. */
static inline uint64_t sp_get_uint(const void *p, unsigned width)
{
	switch (width) {
	case 1: return *(const uint8_t *)p;
	case 2: return *(const uint16_t *)p;
	case 4: return *(const uint32_t *)p;
	default: return *(const uint64_t *)p;
	}
}

static inline void sp_set_uint(void *p, unsigned width, uint64_t v)
{
	switch (width) {
	case 1: *(uint8_t *)p = (uint8_t)v; break;
	case 2: *(uint16_t *)p = (uint16_t)v; break;
	case 4: *(uint32_t *)p = (uint32_t)v; break;
	default: *(uint64_t *)p = v; break;
	}
}

/*
 * santa_proto_encode encodes m in core deterministic CBOR into a malloc'd buffer.
 * santa_proto_decode parses exactly one message from data into *m (zeroed first),
 * refusing anything outside the protocol; free the result with santa_proto_msg_free.
 * Both return 0, or -1 with errno set and a reason in err.
 */
int santa_proto_encode(const struct sp_msg *m, uint8_t **out, size_t *len, char *err, size_t errlen);
int santa_proto_decode(const uint8_t *data, size_t len, struct sp_msg *m, char *err, size_t errlen);

/* Frees what santa_proto_decode (or any malloc-based builder) allocated in obj, not obj itself. */
void santa_proto_free(const struct sp_schema *s, void *obj);
void santa_proto_msg_free(struct sp_msg *m);

#endif
