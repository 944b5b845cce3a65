/*
 * codec.c - the protocol's messages <-> CBOR, with libcbor.
 *
 * Encoding is RFC 8949 core deterministic, byte-identical to the Go encoder
 * (api/codec.go): shortest integer forms, definite lengths, map keys in
 * ascending order, zero/empty/false fields left out. Decoding is strict but
 * for one thing: it refuses duplicate keys, wrong types, indefinite lengths,
 * tags, floats, negative integers, values too wide for their field and
 * trailing bytes, and skips keys it does not know with their values, which a
 * newer santad may add (docs/protocol.md "Versioning").
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cbor.h>

#include "proto.h"

/* ---- schema tables -------------------------------------------------------- */

#define F_UINT(k, T, f) { k, SP_UINT, sizeof(((T *)0)->f), #f, offsetof(T, f), 0, NULL }
#define F_BOOL(k, T, f) { k, SP_BOOL, 0, #f, offsetof(T, f), 0, NULL }
#define F_BYTES(k, T, f) { k, SP_BYTES, 0, #f, offsetof(T, f), 0, NULL }
#define F_TEXT(k, T, f) { k, SP_TEXT, 0, #f, offsetof(T, f), 0, NULL }
#define F_UINTS(k, T, f) { k, SP_UINTS, 0, #f, offsetof(T, f), offsetof(T, n##f), NULL }
#define F_ARRAY(k, T, f, S) { k, SP_ARRAY, 0, #f, offsetof(T, f), offsetof(T, n##f), &(S) }
#define F_STRUCT(k, T, f, S) { k, SP_STRUCT, 0, #f, offsetof(T, f), 0, &(S) }
#define F_COUNTERS(k, T, f) { k, SP_COUNTERS, 0, #f, offsetof(T, f), offsetof(T, n##f), NULL }
#define SCHEMA(T, name, fields) { name, sizeof(T), fields, sizeof(fields) / sizeof(fields[0]) }

static const struct sp_field condition_fields[] = {
	F_UINT(0, struct sp_condition, offset),
	F_BYTES(1, struct sp_condition, pattern),
	F_BYTES(2, struct sp_condition, mask),
};
static const struct sp_schema condition_schema = SCHEMA(struct sp_condition, "condition", condition_fields);

static const struct sp_field processor_fields[] = {
	F_UINT(0, struct sp_processor, kind),
	F_UINT(1, struct sp_processor, reply_offset),
	F_BYTES(2, struct sp_processor, template),
	F_UINT(3, struct sp_processor, src_offset),
	F_UINT(4, struct sp_processor, length),
	F_BYTES(5, struct sp_processor, mask),
};
static const struct sp_schema processor_schema = SCHEMA(struct sp_processor, "processor", processor_fields);

static const struct sp_field guard_fields[] = {
	F_UINT(0, struct sp_guard, slot),
	F_UINT(1, struct sp_guard, version),
};
static const struct sp_schema guard_schema = SCHEMA(struct sp_guard, "guard", guard_fields);

static const struct sp_field rule_fields[] = {
	F_UINT(0, struct sp_rule, id),
	F_UINT(1, struct sp_rule, version),
	F_ARRAY(2, struct sp_rule, conditions, condition_schema),
	F_ARRAY(3, struct sp_rule, processors, processor_schema),
	F_UINT(4, struct sp_rule, reply_len),
	F_UINT(5, struct sp_rule, priority),
	F_UINT(6, struct sp_rule, min_len),
	F_UINT(7, struct sp_rule, max_len),
	F_ARRAY(8, struct sp_rule, guards, guard_schema),
	F_BOOL(9, struct sp_rule, close),
	F_UINT(10, struct sp_rule, expires),
	F_TEXT(11, struct sp_rule, tag),
};
static const struct sp_schema rule_schema = SCHEMA(struct sp_rule, "rule", rule_fields);

static const struct sp_field socket_info_fields[] = {
	F_UINT(0, struct sp_socket_info, cookie),
	F_UINT(1, struct sp_socket_info, family),
	F_UINT(2, struct sp_socket_info, protocol),
	F_BYTES(3, struct sp_socket_info, address),
	F_UINT(4, struct sp_socket_info, port),
	F_UINT(5, struct sp_socket_info, owner),
	F_UINT(6, struct sp_socket_info, rules),
	F_UINT(7, struct sp_socket_info, template_bytes),
	F_UINT(8, struct sp_socket_info, hits),
	F_BOOL(9, struct sp_socket_info, created),
	F_UINT(10, struct sp_socket_info, pid),
	F_UINT(11, struct sp_socket_info, reply_bytes),
};
static const struct sp_schema socket_info_schema = SCHEMA(struct sp_socket_info, "socket info", socket_info_fields);

static const struct sp_field rule_stats_fields[] = {
	F_UINT(0, struct sp_rule_stats, id),
	F_UINT(1, struct sp_rule_stats, hits),
	F_UINT(2, struct sp_rule_stats, bytes),
};
static const struct sp_schema rule_stats_schema = SCHEMA(struct sp_rule_stats, "rule stats", rule_stats_fields);

static const struct sp_field interface_fields[] = {
	F_TEXT(0, struct sp_interface, name),
	F_TEXT(1, struct sp_interface, mode),
	F_TEXT(2, struct sp_interface, peer),
};
static const struct sp_schema interface_schema = SCHEMA(struct sp_interface, "interface", interface_fields);

static const struct sp_field daemon_info_fields[] = {
	F_TEXT(0, struct sp_daemon_info, version),
	F_UINT(1, struct sp_daemon_info, protocol),
	F_UINT(2, struct sp_daemon_info, pid),
	F_UINT(3, struct sp_daemon_info, uptime_seconds),
	F_ARRAY(4, struct sp_daemon_info, interfaces, interface_schema),
	F_UINT(5, struct sp_daemon_info, sockets),
	F_UINT(6, struct sp_daemon_info, rules),
	F_UINT(7, struct sp_daemon_info, max_rules),
	F_UINT(8, struct sp_daemon_info, data_bytes),
	F_UINT(9, struct sp_daemon_info, max_data_bytes),
	F_UINT(10, struct sp_daemon_info, uid),
	F_UINT(11, struct sp_daemon_info, quota_rules),
	F_UINT(12, struct sp_daemon_info, quota_bytes),
	F_UINT(13, struct sp_daemon_info, used_rules),
	F_UINT(14, struct sp_daemon_info, used_bytes),
	F_UINT(15, struct sp_daemon_info, quota_rulesets),
	F_UINT(16, struct sp_daemon_info, used_rulesets),
};
static const struct sp_schema daemon_info_schema = SCHEMA(struct sp_daemon_info, "daemon info", daemon_info_fields);

static const struct sp_field msg_fields[] = {
	F_UINT(0, struct sp_msg, v),
	F_UINT(1, struct sp_msg, op),
	F_UINT(2, struct sp_msg, seq),
	F_UINT(3, struct sp_msg, status),
	F_TEXT(4, struct sp_msg, error),
	F_UINT(5, struct sp_msg, socket),
	F_UINT(6, struct sp_msg, pid),
	F_UINT(7, struct sp_msg, fd),
	F_UINT(8, struct sp_msg, port),
	F_ARRAY(9, struct sp_msg, rules, rule_schema),
	F_UINTS(10, struct sp_msg, ids),
	F_ARRAY(11, struct sp_msg, sockets, socket_info_schema),
	F_ARRAY(12, struct sp_msg, stats, rule_stats_schema),
	F_UINT(13, struct sp_msg, sample_bytes),
	F_UINT(14, struct sp_msg, sample_rate),
	F_BYTES(15, struct sp_msg, sample),
	F_STRUCT(16, struct sp_msg, daemon, daemon_info_schema),
	F_COUNTERS(17, struct sp_msg, counters),
	F_UINT(18, struct sp_msg, request_len),
	F_UINT(19, struct sp_msg, protocol),
	F_UINT(20, struct sp_msg, after),
	F_UINT(21, struct sp_msg, limit),
	F_BOOL(22, struct sp_msg, more),
	F_TEXT(23, struct sp_msg, tag),
};
const struct sp_schema santa_proto_msg_schema = SCHEMA(struct sp_msg, "message", msg_fields);

/* ---- field access --------------------------------------------------------- */

static size_t *count_of(const void *obj, const struct sp_field *f)
{
	return (size_t *)SP_AT(obj, f->count_off);
}

/* Arrays, struct pointers and text are all reached through a pointer field. */
static void **ptr_of(const void *obj, const struct sp_field *f)
{
	return (void **)SP_AT(obj, f->off);
}

static bool field_empty(const struct sp_field *f, const void *obj)
{
	const void *p = SP_AT(obj, f->off);
	switch (f->type) {
	case SP_UINT: return sp_get_uint(p, f->width) == 0;
	case SP_BOOL: return !*(const bool *)p;
	case SP_BYTES: return ((const struct sp_bytes *)p)->len == 0;
	case SP_TEXT: return *ptr_of(obj, f) == NULL || **(char **)ptr_of(obj, f) == '\0';
	case SP_STRUCT: return *ptr_of(obj, f) == NULL; /* like Go's pointer: present even if all zero */
	default: return *count_of(obj, f) == 0;
	}
}

/* Counters sort as their encoded keys do: shorter text first, then bytewise. */
static int counter_cmp(const void *a, const void *b)
{
	const char *x = ((const struct sp_counter *)a)->name, *y = ((const struct sp_counter *)b)->name;
	size_t lx = strlen(x), ly = strlen(y);
	if (lx != ly)
		return lx < ly ? -1 : 1;
	return memcmp(x, y, lx);
}

/* Sorts counters into encoding order; false if a name repeats. */
static bool sort_counters(struct sp_counter *c, size_t n)
{
	qsort(c, n, sizeof *c, counter_cmp);
	for (size_t i = 1; i < n; i++)
		if (counter_cmp(&c[i - 1], &c[i]) == 0)
			return false;
	return true;
}

/* ---- encoding ------------------------------------------------------------- */

/* libcbor encodes an integer in the width it was built with; core
 * deterministic encoding wants the shortest one. */
static cbor_item_t *enc_uint(uint64_t v)
{
	if (v <= UINT8_MAX)
		return cbor_build_uint8((uint8_t)v);
	if (v <= UINT16_MAX)
		return cbor_build_uint16((uint16_t)v);
	if (v <= UINT32_MAX)
		return cbor_build_uint32((uint32_t)v);
	return cbor_build_uint64(v);
}

/* push and put take over the caller's reference to the items (NULL from a
 * failed build is fine) and report whether the container got them. */
static bool push(cbor_item_t *array, cbor_item_t *item)
{
	bool ok = item && cbor_array_push(array, item);
	if (item)
		cbor_decref(&item);
	return ok;
}

static bool put(cbor_item_t *map, cbor_item_t *key, cbor_item_t *value)
{
	bool ok = key && value && cbor_map_add(map, (struct cbor_pair){ .key = key, .value = value });
	if (key)
		cbor_decref(&key);
	if (value)
		cbor_decref(&value);
	return ok;
}

static cbor_item_t *enc_struct(const struct sp_schema *s, const void *obj);

static cbor_item_t *enc_counters(const struct sp_counter *c, size_t n)
{
	struct sp_counter *sorted = malloc(n * sizeof *sorted);
	cbor_item_t *map = sorted ? cbor_new_definite_map(n) : NULL;
	if (map) {
		memcpy(sorted, c, n * sizeof *sorted);
		bool ok = sort_counters(sorted, n);
		for (size_t i = 0; ok && i < n; i++)
			ok = put(map, cbor_build_string(sorted[i].name), enc_uint(sorted[i].value));
		if (!ok)
			cbor_decref(&map);
	}
	free(sorted);
	return map;
}

static cbor_item_t *enc_value(const struct sp_field *f, const void *obj)
{
	const void *p = SP_AT(obj, f->off);
	const struct sp_bytes *b = p;
	cbor_item_t *array;

	switch (f->type) {
	case SP_UINT: return enc_uint(sp_get_uint(p, f->width));
	case SP_BOOL: return cbor_build_bool(true);
	case SP_BYTES: return cbor_build_bytestring(b->data, b->len);
	case SP_TEXT: return cbor_build_string(*ptr_of(obj, f));
	case SP_STRUCT: return enc_struct(f->elem, *ptr_of(obj, f));
	case SP_COUNTERS: return enc_counters(*ptr_of(obj, f), *count_of(obj, f));
	}
	/* SP_UINTS, SP_ARRAY */
	size_t n = *count_of(obj, f);
	const char *base = *ptr_of(obj, f);
	if (!(array = cbor_new_definite_array(n)))
		return NULL;
	for (size_t i = 0; i < n; i++) {
		cbor_item_t *item = f->type == SP_UINTS ? enc_uint(((const uint64_t *)base)[i])
		                                        : enc_struct(f->elem, base + i * f->elem->size);
		if (!push(array, item)) {
			cbor_decref(&array);
			return NULL;
		}
	}
	return array;
}

static cbor_item_t *enc_struct(const struct sp_schema *s, const void *obj)
{
	size_t n = 0;
	for (size_t i = 0; i < s->nfields; i++)
		n += !field_empty(&s->fields[i], obj);
	cbor_item_t *map = cbor_new_definite_map(n);
	if (!map)
		return NULL;
	for (size_t i = 0; i < s->nfields; i++) {
		const struct sp_field *f = &s->fields[i];
		if (!field_empty(f, obj) && !put(map, enc_uint(f->key), enc_value(f, obj))) {
			cbor_decref(&map);
			return NULL;
		}
	}
	return map;
}

int santa_proto_encode(const struct sp_msg *m, uint8_t **out, size_t *len, char *err, size_t errlen)
{
	cbor_item_t *root = enc_struct(&santa_proto_msg_schema, m);
	unsigned char *buf = NULL;
	size_t cap = 0, n = root ? cbor_serialize_alloc(root, &buf, &cap) : 0;

	if (root)
		cbor_decref(&root);
	if (n == 0) {
		/* the only input encoding refuses is a repeated counter name */
		snprintf(err, errlen, "cannot encode the message: out of memory or duplicate counter names");
		free(buf);
		errno = ENOMEM;
		return -1;
	}
	if (n > SP_MAX_FRAME) {
		snprintf(err, errlen, "message of %zu bytes exceeds the %u-byte frame limit; split the request", n, SP_MAX_FRAME);
		free(buf);
		errno = EMSGSIZE;
		return -1;
	}
	*out = buf;
	*len = n;
	return 0;
}

/* ---- decoding ------------------------------------------------------------- */

struct dec {
	char *err;
	size_t errlen;
	char path[256]; /* where in the message we are, e.g. "rules[0].conditions[1]" */
	size_t pathlen;
};

static int fail_errno(struct dec *d, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail_errno(struct dec *d, int e, const char *fmt, ...)
{
	char msg[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	snprintf(d->err, d->errlen, "malformed message: %s%s%s", d->path, d->pathlen ? ": " : "", msg);
	errno = e;
	return -1;
}

#define fail(d, ...) fail_errno(d, EBADMSG, __VA_ARGS__)
#define nomem(d) fail_errno(d, ENOMEM, "out of memory")

/* Appends a path segment and returns the length to restore afterwards. */
static size_t path_push(struct dec *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static size_t path_push(struct dec *d, const char *fmt, ...)
{
	size_t old = d->pathlen;
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(d->path + old, sizeof d->path - old, fmt, ap);
	va_end(ap);
	d->pathlen = n < 0 ? old : old + (size_t)n >= sizeof d->path ? sizeof d->path - 1 : old + (size_t)n;
	return old;
}

static void path_pop(struct dec *d, size_t old)
{
	d->pathlen = old;
	d->path[old] = '\0';
}

static const char *type_name(cbor_type t, bool is_bool)
{
	switch (t) {
	case CBOR_TYPE_UINT: return "an unsigned integer";
	case CBOR_TYPE_NEGINT: return "a negative integer";
	case CBOR_TYPE_BYTESTRING: return "bytes";
	case CBOR_TYPE_STRING: return "text";
	case CBOR_TYPE_ARRAY: return "an array";
	case CBOR_TYPE_MAP: return "a map";
	case CBOR_TYPE_TAG: return "a tag";
	default: return is_bool ? "a bool" : "a float or simple value";
	}
}

/* cbor_is_bool asserts on a float, so look at the width first. */
static bool is_bool(const cbor_item_t *it)
{
	return cbor_isa_float_ctrl(it) && cbor_float_get_width(it) == CBOR_FLOAT_0 && cbor_is_bool(it);
}

static bool definite(const cbor_item_t *it)
{
	switch (cbor_typeof(it)) {
	case CBOR_TYPE_BYTESTRING: return cbor_bytestring_is_definite(it);
	case CBOR_TYPE_STRING: return cbor_string_is_definite(it);
	case CBOR_TYPE_ARRAY: return cbor_array_is_definite(it);
	case CBOR_TYPE_MAP: return cbor_map_is_definite(it);
	default: return true;
	}
}

/* want checks an item's type (CBOR_TYPE_FLOAT_CTRL standing for bool) and
 * that its length is definite. */
static int want(struct dec *d, const cbor_item_t *it, cbor_type t)
{
	if (cbor_typeof(it) != t || (t == CBOR_TYPE_FLOAT_CTRL && !is_bool(it)))
		return fail(d, "want %s, got %s", type_name(t, true), type_name(cbor_typeof(it), is_bool(it)));
	if (!definite(it))
		return fail(d, "indefinite lengths are not allowed");
	return 0;
}

/* Copies a text item into a new C string; text holding a NUL cannot be one. */
static int dec_text(struct dec *d, const cbor_item_t *it, char **out)
{
	if (want(d, it, CBOR_TYPE_STRING) < 0)
		return -1;
	size_t n = cbor_string_length(it);
	if (memchr(cbor_string_handle(it), 0, n))
		return fail(d, "text holds a NUL byte");
	if (!(*out = malloc(n + 1)))
		return nomem(d);
	memcpy(*out, cbor_string_handle(it), n);
	(*out)[n] = '\0';
	return 0;
}

static int dec_uint(struct dec *d, const cbor_item_t *it, unsigned width, uint64_t *v)
{
	if (want(d, it, CBOR_TYPE_UINT) < 0)
		return -1;
	*v = cbor_get_int(it);
	uint64_t max = width >= 8 ? UINT64_MAX : (UINT64_C(1) << (8 * width)) - 1;
	if (*v > max)
		return fail(d, "%llu does not fit in %u bits", (unsigned long long)*v, 8 * width);
	return 0;
}

static int dec_struct(struct dec *d, const struct sp_schema *s, const cbor_item_t *it, void *obj);

static int dec_counters(struct dec *d, const cbor_item_t *it, void *obj, const struct sp_field *f)
{
	if (want(d, it, CBOR_TYPE_MAP) < 0)
		return -1;
	size_t n = cbor_map_size(it);
	struct cbor_pair *pairs = cbor_map_handle(it);
	struct sp_counter *c = calloc(n ? n : 1, sizeof *c);
	if (!c)
		return nomem(d);
	*ptr_of(obj, f) = c;
	*count_of(obj, f) = n;
	for (size_t i = 0; i < n; i++) {
		if (dec_text(d, pairs[i].key, &c[i].name) < 0 || dec_uint(d, pairs[i].value, 8, &c[i].value) < 0)
			return -1;
	}
	if (!sort_counters(c, n))
		return fail(d, "duplicate key");
	return 0;
}

static int dec_value(struct dec *d, const struct sp_field *f, const cbor_item_t *it, void *obj)
{
	void *p = SP_AT(obj, f->off);
	uint64_t v;

	switch (f->type) {
	case SP_UINT:
		if (dec_uint(d, it, f->width, &v) < 0)
			return -1;
		sp_set_uint(p, f->width, v);
		return 0;
	case SP_BOOL:
		if (want(d, it, CBOR_TYPE_FLOAT_CTRL) < 0)
			return -1;
		*(bool *)p = cbor_get_bool(it);
		return 0;
	case SP_BYTES: {
		struct sp_bytes *b = p;
		if (want(d, it, CBOR_TYPE_BYTESTRING) < 0)
			return -1;
		b->len = cbor_bytestring_length(it);
		if (b->len && !(b->data = malloc(b->len)))
			return nomem(d);
		if (b->len)
			memcpy(b->data, cbor_bytestring_handle(it), b->len);
		return 0;
	}
	case SP_TEXT:
		return dec_text(d, it, (char **)p);
	case SP_STRUCT:
		if (!(*(void **)p = calloc(1, f->elem->size)))
			return nomem(d);
		return dec_struct(d, f->elem, it, *(void **)p);
	case SP_COUNTERS:
		return dec_counters(d, it, obj, f);
	}

	/* SP_UINTS, SP_ARRAY: allocate zeroed slots first so a failure part way
	 * leaves something santa_proto_free can release. */
	if (want(d, it, CBOR_TYPE_ARRAY) < 0)
		return -1;
	size_t n = cbor_array_size(it), size = f->type == SP_UINTS ? sizeof(uint64_t) : f->elem->size;
	char *base = calloc(n ? n : 1, size);
	if (!base)
		return nomem(d);
	*(void **)p = base;
	*count_of(obj, f) = n;
	for (size_t i = 0; i < n; i++) {
		cbor_item_t *elem = cbor_array_handle(it)[i];
		size_t old = path_push(d, "[%zu]", i);
		int rc = f->type == SP_UINTS ? dec_uint(d, elem, 8, (uint64_t *)base + i)
		                             : dec_struct(d, f->elem, elem, base + i * size);
		if (rc < 0)
			return -1;
		path_pop(d, old);
	}
	return 0;
}

static int dec_struct(struct dec *d, const struct sp_schema *s, const cbor_item_t *it, void *obj)
{
	uint64_t seen = 0;

	if (want(d, it, CBOR_TYPE_MAP) < 0)
		return -1;
	for (size_t i = 0; i < cbor_map_size(it); i++) {
		const struct cbor_pair *pair = &cbor_map_handle(it)[i];
		const struct sp_field *f = NULL;
		if (!cbor_isa_uint(pair->key))
			return fail(d, "%s key: want an unsigned integer, got %s", s->name,
			            type_name(cbor_typeof(pair->key), is_bool(pair->key)));
		uint64_t key = cbor_get_int(pair->key);
		for (size_t j = 0; j < s->nfields && !f; j++)
			if (s->fields[j].key == key)
				f = &s->fields[j];
		if (!f)
			continue; /* a key of a later version */
		if (seen & (UINT64_C(1) << key))
			return fail(d, "duplicate %s key %llu (%s)", s->name, (unsigned long long)key, f->name);
		seen |= UINT64_C(1) << key;
		size_t old = path_push(d, "%s%s", d->pathlen ? "." : "", f->name);
		if (dec_value(d, f, pair->value, obj) < 0)
			return -1;
		path_pop(d, old);
	}
	return 0;
}

/* cbor_load allocates a definite array's or map's slots before it reads
 * them; refusing counts the remaining bytes cannot hold keeps a few hostile
 * bytes from making it allocate gigabytes. */
struct scan {
	size_t left;
	bool ok;
};

static void scan_array(void *ctx, size_t n)
{
	struct scan *s = ctx;
	s->ok &= n <= s->left;
}

static void scan_map(void *ctx, size_t n)
{
	struct scan *s = ctx;
	s->ok &= n <= s->left / 2;
}

static bool counts_fit(const uint8_t *data, size_t len)
{
	struct cbor_callbacks cb = cbor_empty_callbacks;
	struct scan s = { .ok = true };

	cb.array_start = scan_array;
	cb.map_start = scan_map;
	for (size_t off = 0; off < len && s.ok;) {
		s.left = len - off;
		struct cbor_decoder_result r = cbor_stream_decode(data + off, len - off, &cb, &s);
		if (r.status != CBOR_DECODER_FINISHED || r.read == 0)
			break; /* cbor_load reports what is wrong */
		off += r.read;
	}
	return s.ok;
}

int santa_proto_decode(const uint8_t *data, size_t len, struct sp_msg *m, char *err, size_t errlen)
{
	struct dec d = { .err = err, .errlen = errlen };
	struct cbor_load_result res;
	cbor_item_t *root;
	int rc;

	memset(m, 0, sizeof *m);
	if (len == 0)
		return fail(&d, "empty");
	if (!counts_fit(data, len))
		return fail(&d, "an array or map claims more items than the message holds");
	if (!(root = cbor_load(data, len, &res))) {
		switch (res.error.code) {
		case CBOR_ERR_MEMERROR: return nomem(&d);
		case CBOR_ERR_NOTENOUGHDATA: return fail(&d, "truncated");
		case CBOR_ERR_SYNTAXERROR: return fail(&d, "invalid CBOR at byte %zu (e.g. bad UTF-8 or a stray break)", res.error.position);
		default: return fail(&d, "invalid CBOR at byte %zu", res.error.position);
		}
	}
	if (res.read != len)
		rc = fail(&d, "trailing bytes after the message (%zu)", len - res.read);
	else
		rc = dec_struct(&d, &santa_proto_msg_schema, root, m);
	cbor_decref(&root);
	if (rc < 0) {
		int e = errno;
		santa_proto_msg_free(m);
		errno = e;
	}
	return rc;
}

/* ---- freeing -------------------------------------------------------------- */

void santa_proto_free(const struct sp_schema *s, void *obj)
{
	for (size_t i = 0; obj && i < s->nfields; i++) {
		const struct sp_field *f = &s->fields[i];
		void *p = f->type >= SP_TEXT ? *ptr_of(obj, f) : NULL;
		switch (f->type) {
		case SP_UINT:
		case SP_BOOL: break;
		case SP_BYTES: free(((struct sp_bytes *)SP_AT(obj, f->off))->data); break;
		case SP_TEXT:
		case SP_UINTS: free(p); break;
		case SP_STRUCT:
			santa_proto_free(f->elem, p);
			free(p);
			break;
		case SP_ARRAY:
			for (size_t j = 0; p && j < *count_of(obj, f); j++)
				santa_proto_free(f->elem, (char *)p + j * f->elem->size);
			free(p);
			break;
		case SP_COUNTERS:
			for (size_t j = 0; p && j < *count_of(obj, f); j++)
				free(((struct sp_counter *)p)[j].name);
			free(p);
			break;
		}
	}
	if (obj)
		memset(obj, 0, s->size);
}

void santa_proto_msg_free(struct sp_msg *m)
{
	santa_proto_free(&santa_proto_msg_schema, m);
}
