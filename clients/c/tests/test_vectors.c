/*
 * test_vectors.c - the shared protocol vectors (testdata/protocol/vectors.json):
 * every message must encode to exactly its CBOR, and its CBOR must decode to
 * exactly the message, field by field.
 *
 * The JSON is read through the library's schema tables, keyed by the names
 * docs/protocol.md gives; a name the tables lack fails the test, a wrong key
 * number or width shows up as different bytes.
 */
#include <errno.h>
#include <json-c/json.h>

#include "check.h"
#include "proto.h"

static const struct sp_field *field_named(const struct sp_schema *s, const char *name)
{
	for (size_t i = 0; i < s->nfields; i++)
		if (strcmp(s->fields[i].name, name) == 0)
			return &s->fields[i];
	return NULL;
}

static size_t *count_at(void *obj, const struct sp_field *f)
{
	return (size_t *)SP_AT(obj, f->count_off);
}

static void **ptr_at(void *obj, const struct sp_field *f)
{
	return (void **)SP_AT(obj, f->off);
}

/* Fills obj from a JSON object; the result is freed with santa_proto_free. */
static int from_json(const struct sp_schema *s, json_object *j, void *obj)
{
	json_object_object_foreach(j, name, val) {
		const struct sp_field *f = field_named(s, name);
		void *p;
		if (!f) {
			fprintf(stderr, "%s has no key named %s\n", s->name, name);
			return -1;
		}
		p = SP_AT(obj, f->off);
		switch (f->type) {
		case SP_UINT: sp_set_uint(p, f->width, json_object_get_uint64(val)); break;
		case SP_BOOL: *(bool *)p = json_object_get_boolean(val); break;
		case SP_BYTES: {
			struct sp_bytes *b = p;
			if (!(b->data = unhex(json_object_get_string(val), &b->len)))
				return -1;
			break;
		}
		case SP_TEXT: *(char **)p = strdup(json_object_get_string(val)); break;
		case SP_STRUCT:
			*(void **)p = calloc(1, f->elem->size);
			if (from_json(f->elem, val, *(void **)p) < 0)
				return -1;
			break;
		case SP_COUNTERS: {
			size_t n = 0;
			struct sp_counter *c = calloc(json_object_object_length(val) + 1, sizeof *c);
			*(void **)p = c;
			json_object_object_foreach(val, cname, cval) {
				c[n].name = strdup(cname);
				c[n++].value = json_object_get_uint64(cval);
				*count_at(obj, f) = n;
			}
			break;
		}
		case SP_UINTS:
		case SP_ARRAY: {
			size_t n = json_object_array_length(val);
			size_t size = f->type == SP_UINTS ? sizeof(uint64_t) : f->elem->size;
			char *base = calloc(n + 1, size);
			*(void **)p = base;
			*count_at(obj, f) = n;
			for (size_t i = 0; i < n; i++) {
				json_object *e = json_object_array_get_idx(val, i);
				if (f->type == SP_UINTS)
					((uint64_t *)base)[i] = json_object_get_uint64(e);
				else if (from_json(f->elem, e, base + i * size) < 0)
					return -1;
			}
			break;
		}
		}
	}
	return 0;
}

static bool bytes_equal(const struct sp_bytes *b, const char *hex)
{
	size_t len;
	unsigned char *want = unhex(hex, &len);
	bool eq = want && len == b->len && (len == 0 || memcmp(want, b->data, len) == 0);
	free(want);
	return eq;
}

/* Checks obj against JSON: every key the JSON names holds its value, every
 * field the JSON leaves out is empty. */
static void compare(const struct sp_schema *s, json_object *j, void *obj, const char *path)
{
	for (size_t i = 0; i < s->nfields; i++) {
		const struct sp_field *f = &s->fields[i];
		void *p = SP_AT(obj, f->off);
		json_object *val = NULL;
		bool has = json_object_object_get_ex(j, f->name, &val);
		char sub[256];
		snprintf(sub, sizeof sub, "%s.%s", path, f->name);

		switch (f->type) {
		case SP_UINT: {
			uint64_t got = sp_get_uint(p, f->width), want = has ? json_object_get_uint64(val) : 0;
			CHECK(got == want, "%s: got %llu, want %llu", sub, (unsigned long long)got, (unsigned long long)want);
			break;
		}
		case SP_BOOL:
			CHECK(*(bool *)p == (has && json_object_get_boolean(val)), "%s: got %d", sub, *(bool *)p);
			break;
		case SP_BYTES:
			CHECK(bytes_equal(p, has ? json_object_get_string(val) : ""), "%s: bytes differ", sub);
			break;
		case SP_TEXT: {
			const char *got = *(char **)p;
			CHECK(has ? got && strcmp(got, json_object_get_string(val)) == 0 : got == NULL, "%s: got \"%s\"", sub,
			      got ? got : "(none)");
			break;
		}
		case SP_STRUCT:
			CHECK(has == (*ptr_at(obj, f) != NULL), "%s: presence differs", sub);
			if (has && *ptr_at(obj, f))
				compare(f->elem, val, *ptr_at(obj, f), sub);
			break;
		case SP_COUNTERS: {
			size_t n = *count_at(obj, f);
			struct sp_counter *c = *ptr_at(obj, f);
			CHECK(n == (has ? (size_t)json_object_object_length(val) : 0), "%s: %zu entries", sub, n);
			for (size_t k = 0; has && k < n; k++) {
				json_object *cv = NULL;
				CHECK(json_object_object_get_ex(val, c[k].name, &cv) && json_object_get_uint64(cv) == c[k].value,
				      "%s.%s: got %llu", sub, c[k].name, (unsigned long long)c[k].value);
			}
			break;
		}
		case SP_UINTS:
		case SP_ARRAY: {
			size_t n = *count_at(obj, f), want = has ? json_object_array_length(val) : 0;
			char *base = *ptr_at(obj, f);
			CHECK(n == want, "%s: %zu elements, want %zu", sub, n, want);
			for (size_t k = 0; k < n && k < want; k++) {
				json_object *e = json_object_array_get_idx(val, k);
				char elem[300];
				snprintf(elem, sizeof elem, "%s[%zu]", sub, k);
				if (f->type == SP_UINTS)
					CHECK(((uint64_t *)base)[k] == json_object_get_uint64(e), "%s differs", elem);
				else
					compare(f->elem, e, base + k * f->elem->size, elem);
			}
			break;
		}
		}
	}
}

/* The tables must list keys in ascending order: the encoder relies on it. */
static void check_schema(const struct sp_schema *s)
{
	for (size_t i = 0; i < s->nfields; i++) {
		const struct sp_field *f = &s->fields[i];
		CHECK(i == 0 || f->key > s->fields[i - 1].key, "%s: key %u out of order", s->name, f->key);
		CHECK(f->key < 24, "%s: key %u needs more than one byte", s->name, f->key);
		if (f->elem)
			check_schema(f->elem);
	}
}

/* A few fields checked by hand, independently of the schema tables. */
static void spot_checks(const char *name, const struct sp_msg *m)
{
	if (strcmp(name, "add the paper's Listing 1 rule to the passed socket") == 0) {
		CHECK(m->op == SP_OP_ADD && m->seq == 5 && m->nrules == 1, "listing 1 header");
		const struct sp_rule *r = &m->rules[0];
		CHECK(r->nconditions == 1 && r->conditions[0].pattern.len == 5 &&
		          memcmp(r->conditions[0].pattern.data, "Hello", 5) == 0,
		      "listing 1 condition");
		CHECK(r->nprocessors == 1 && r->processors[0].kind == SP_PUT && r->processors[0].template.len == 6 &&
		          memcmp(r->processors[0].template.data, "COMSYS", 6) == 0 && r->reply_len == 6,
		      "listing 1 processor");
	} else if (strcmp(name, "health response") == 0) {
		CHECK(m->daemon && strcmp(m->daemon->version, "0.3.0") == 0 && m->daemon->max_data_bytes == 16u << 20,
		      "daemon info");
		/* decoded counters come in encoding order: shorter names first */
		CHECK(m->ncounters == 3 && strcmp(m->counters[0].name, "answered") == 0 &&
		          m->counters[0].value == 123456789 && m->counters[2].value == 42,
		      "counters");
	} else if (strcmp(name, "stats response") == 0) {
		CHECK(m->nstats == 2 && m->stats[0].hits == UINT64_C(1) << 33 && m->stats[0].bytes == UINT64_C(1) << 40 &&
		          m->stats[1].id == 4 && m->stats[1].hits == 0,
		      "stats");
	} else if (strcmp(name, "add a memcached-style rule with guards") == 0) {
		CHECK(m->nrules == 1 && m->rules[0].nguards == 2 && m->rules[0].guards[0].slot == 7 &&
		          m->rules[0].guards[0].version == 3 && m->rules[0].guards[1].slot == 0xfffff &&
		          m->rules[0].guards[1].version == (UINT64_C(1) << 32) + 1,
		      "guards");
	} else if (strcmp(name, "bind response") == 0) {
		CHECK(m->nsockets == 1 && m->sockets[0].created && m->sockets[0].port == 5353 && m->sockets[0].pid == 1234,
		      "socket info");
	}
}

/* skipped_keys.json, beside vectors.json: santad messages with keys of a
 * later version decode to the message without them. */
static void check_skipped_keys(const char *vectors_path)
{
	char path[4096];
	const char *slash = strrchr(vectors_path, '/');
	int dir = slash ? (int)(slash - vectors_path + 1) : 0;
	json_object *all;
	size_t n;

	snprintf(path, sizeof path, "%.*sskipped_keys.json", dir, vectors_path);
	all = json_object_from_file(path);
	CHECK(all && json_object_is_type(all, json_type_array), "cannot read %s", path);
	n = all ? json_object_array_length(all) : 0;
	CHECK(n >= 4, "only %zu vectors in %s", n, path);
	for (size_t i = 0; i < n; i++) {
		json_object *v = json_object_array_get_idx(all, i), *jname, *jmsg, *jcbor;
		struct sp_msg decoded;
		size_t len;
		char err[256] = "";

		if (!json_object_object_get_ex(v, "name", &jname) || !json_object_object_get_ex(v, "message", &jmsg) ||
		    !json_object_object_get_ex(v, "cbor", &jcbor)) {
			CHECK(0, "%s: vector %zu lacks name, message or cbor", path, i);
			continue;
		}
		const char *name = json_object_get_string(jname);
		unsigned char *cbor = unhex(json_object_get_string(jcbor), &len);
		if (cbor && santa_proto_decode(cbor, len, &decoded, err, sizeof err) == 0) {
			compare(&santa_proto_msg_schema, jmsg, &decoded, name);
			santa_proto_msg_free(&decoded);
		} else {
			CHECK(0, "%s: decode: %s", name, err);
		}
		free(cbor);
	}
	json_object_put(all);
}

int main(int argc, char **argv)
{
	const char *path = argc > 1 ? argv[1] : "../../testdata/protocol/vectors.json";
	json_object *all = json_object_from_file(path);
	size_t n;

	if (!all || !json_object_is_type(all, json_type_array)) {
		fprintf(stderr, "cannot read %s: %s\n", path, json_util_get_last_err());
		json_object_put(all);
		return 1;
	}
	check_schema(&santa_proto_msg_schema);
	n = json_object_array_length(all);
	CHECK(n >= 20, "only %zu vectors", n);
	for (size_t i = 0; i < n; i++) {
		json_object *v = json_object_array_get_idx(all, i), *jname, *jmsg, *jcbor;
		struct sp_msg built = { 0 }, decoded;
		uint8_t *enc = NULL;
		size_t want_len, enc_len = 0;
		char err[256] = "";

		if (!json_object_object_get_ex(v, "name", &jname) || !json_object_object_get_ex(v, "message", &jmsg) ||
		    !json_object_object_get_ex(v, "cbor", &jcbor)) {
			CHECK(0, "vector %zu lacks name, message or cbor", i);
			continue;
		}
		const char *name = json_object_get_string(jname);
		unsigned char *want = unhex(json_object_get_string(jcbor), &want_len);
		CHECK(want != NULL, "%s: bad hex", name);

		/* message -> CBOR */
		CHECK(from_json(&santa_proto_msg_schema, jmsg, &built) == 0, "%s: message does not fit the schema", name);
		CHECK(santa_proto_encode(&built, &enc, &enc_len, err, sizeof err) == 0, "%s: encode: %s", name, err);
		if (want && !(enc_len == want_len && memcmp(enc, want, want_len) == 0)) {
			CHECK(0, "%s: encoding differs", name);
			fprintf(stderr, "  got  ");
			for (size_t k = 0; k < enc_len; k++)
				fprintf(stderr, "%02x", enc[k]);
			fprintf(stderr, "\n  want %s\n", json_object_get_string(jcbor));
		}

		/* CBOR -> message */
		if (want && santa_proto_decode(want, want_len, &decoded, err, sizeof err) == 0) {
			compare(&santa_proto_msg_schema, jmsg, &decoded, name);
			spot_checks(name, &decoded);
			santa_proto_msg_free(&decoded);
		} else {
			CHECK(0, "%s: decode: %s", name, err);
		}
		santa_proto_msg_free(&built);
		free(enc);
		free(want);
	}
	json_object_put(all);
	check_skipped_keys(path);
	return check_done("test_vectors");
}
