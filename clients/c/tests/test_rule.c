/*
 * test_rule.c - the rule builder: what it refuses and how, that a failed
 * builder call makes the rule unusable, and that a built rule encodes to the
 * shared vector's bytes.
 */
#include <errno.h>

#include "check.h"
#include "internal.h"

/* vectors.json, "add the paper's Listing 1 rule to the passed socket" */
static const char listing1_hex[] = "a40001010402050981a30281a1014548656c6c6f0381a200010246434f4d5359530406";
/* vectors.json, "add a rule with masked condition and copy and request length bounds" */
static const char masked_hex[] =
	"a500010104020f051910010981a50282a30002014200000242784fa20004015100010000000000000377777700000100010383a2000204"
	"02a3000101020246840000010001a500020102030204020542011004182806150719012c";
/* vectors.json, "add a memcached-style rule with guards" */
static const char guarded_hex[] =
	"a5000101040210051910010981a50282a20004014400010000a200080148676574206b310d0a0382a200020402a30001010202581d0000"
	"0001000056414c5545206b31203020320d0a76310d0a454e440d0a04181f07100882a200070103a2001a000fffff011b0000000100000001";
/* vectors.json, "add a TCP rule whose reply closes the connection" */
static const char closing_hex[] =
	"a5000101040213051930010981a40281a10156474554202f6865616c746820485454502f312e310d0a0381a2000102583b485454502f31"
	"2e3120323030204f4b0d0a436f6e74656e742d4c656e6774683a20320d0a436f6e6e656374696f6e3a20636c6f73650d0a0d0a6f6b0418"
	"3b09f5";
/* vectors.json, "add a DNS rule that santad removes when its answer's TTL runs out" */
static const char expiring_hex[] =
	"a5000101040214051b00000100000000070981a40281a2000201581f0100000100000000000003777777076578616d706c65"
	"03636f6d00000100010382a200020402a30001010202582f8180000100010000000003777777076578616d706c6503636f6d"
	"0000010001c00c000100010000012c0004c61300010418310a1a6afd86c0";

/* vectors.json, "list_rules response: a rule tagged by the controller that added it" */
static const char tagged_hex[] =
	"a40001010902150981a6000901020281a10147676574206b0d0a0381a20001025556414c5545206b203020310d0a760d0a454e440d0a04"
	"150b6f73616e74612d6d656d636163686564";

/* Checks that a builder call failed with EINVAL and recorded why. */
#define REFUSED(rule, call, text)                                                                          \
	do {                                                                                               \
		errno = 0;                                                                                 \
		int rc_ = (call);                                                                          \
		CHECK(rc_ == -1 && errno == EINVAL, "%s: rc %d errno %d", #call, rc_, errno);            \
		CHECK(santa_rule_error(rule) && strstr(santa_rule_error(rule), text), "%s: error \"%s\"", #call, \
		      santa_rule_error(rule) ? santa_rule_error(rule) : "(none)");                       \
	} while (0)

static struct santa_rule *fresh(uint32_t reply_len)
{
	struct santa_rule *r = santa_rule_new(reply_len);
	CHECK(r != NULL, "santa_rule_new(%u)", reply_len);
	return r;
}

/* The same on a fresh rule r of reply_len bytes. */
#define REFUSED_NEW(reply_len, call, text)              \
	do {                                            \
		struct santa_rule *r = fresh(reply_len); \
		REFUSED(r, call, text);                 \
		santa_rule_free(r);                     \
	} while (0)

static void test_reply_len(void)
{
	errno = 0;
	CHECK(santa_rule_new(0) == NULL && errno == EINVAL, "reply_len 0 accepted");
	errno = 0;
	CHECK(santa_rule_new(SANTA_MAX_REPLY + 1) == NULL && errno == EINVAL, "reply_len 1473 accepted");
	struct santa_rule *r = fresh(SANTA_MAX_REPLY);
	CHECK(santa_rule_error(r) == NULL, "new rule has an error");
	santa_rule_free(r);
}

static void test_conditions(void)
{
	static const uint8_t big[SANTA_MAX_PATTERN + 1];

	REFUSED_NEW(6, santa_rule_match(r, 0, NULL, 5), "condition 0: empty pattern");
	REFUSED_NEW(6, santa_rule_match(r, 0, "x", 0), "condition 0: empty pattern");
	REFUSED_NEW(6, santa_rule_match(r, 0, big, sizeof big), "pattern of 1025 bytes: at most 1024");
	REFUSED_NEW(6, santa_rule_match(r, 1470, "abc", 3), "bytes 1470..1473 lie outside the first 1472");
	REFUSED_NEW(6, santa_rule_match(r, UINT32_MAX, "a", 1), "bytes 4294967295..4294967296 lie outside");

	struct santa_rule *r = fresh(6);
	CHECK(santa_rule_match(r, 0, big, SANTA_MAX_PATTERN) == 0, "1024-byte pattern refused");
	CHECK(santa_rule_match(r, 1471, "a", 1) == 0, "last byte of the window refused");
	CHECK(santa_rule_match(r, 2, "b", 1) == 0 && santa_rule_match(r, 3, "c", 1) == 0, "conditions 3 and 4 refused");
	REFUSED(r, santa_rule_match(r, 4, "d", 1), "5 conditions: at most 4 per rule");
	santa_rule_free(r);
}

static void test_processors(void)
{

	REFUSED_NEW(6, santa_rule_put(r, 0, NULL, 1), "processor 0 (put): empty template");
	REFUSED_NEW(6, santa_rule_put(r, 4, "abc", 3), "processor 0 (put): writes reply bytes 4..7 of a 6-byte reply");
	REFUSED_NEW(6, santa_rule_put(r, UINT32_MAX, "a", 1), "writes reply bytes 4294967295..4294967296");
	REFUSED_NEW(6, santa_rule_copy(r, 0, 0, 0), "processor 0 (copy): length 0 must be positive");
	REFUSED_NEW(6, santa_rule_copy(r, 5, 0, 2), "processor 0 (copy): writes reply bytes 5..7 of a 6-byte reply");
	REFUSED_NEW(6, santa_rule_copy(r, 0, 1471, 2), "request bytes 1471..1473 lie outside the first 1472 bytes");

	/* many processors grow the array; later ones are numbered on */
	struct santa_rule *r = fresh(SANTA_MAX_REPLY);
	for (uint32_t i = 0; i < 100; i++)
		CHECK(santa_rule_put(r, i, "x", 1) == 0 && santa_rule_copy(r, i + 100, i, 1) == 0, "processor %u", i);
	REFUSED(r, santa_rule_put(r, SANTA_MAX_REPLY, "x", 1), "processor 200 (put)");
	santa_rule_free(r);
}

/* A failed builder call poisons the rule: sending it must fail with the first reason. */
static void test_sticky(void)
{
	char err[256];
	struct santa_rule *r = fresh(6);

	CHECK(santa_rule_match(r, 0, "Hello", 5) == 0 && santa_rule_put(r, 0, "COMSYS", 6) == 0, "valid rule");
	CHECK(santa_proto_rule_check(r, err, sizeof err) == 0, "valid rule refused: %s", err);
	REFUSED(r, santa_rule_put(r, 6, "!", 1), "writes reply bytes 6..7");
	CHECK(santa_rule_match(r, 5, "!", 1) == 0, "a later valid call failed");
	REFUSED(r, santa_rule_copy(r, 0, 0, 0), "writes reply bytes 6..7"); /* the first reason is kept */
	errno = 0;
	CHECK(santa_proto_rule_check(r, err, sizeof err) == -1 && errno == EINVAL && strstr(err, "writes reply bytes 6..7"),
	      "poisoned rule accepted: %s", err);
	santa_rule_free(r);

	r = fresh(6);
	CHECK(santa_proto_rule_check(r, err, sizeof err) == -1 && strstr(err, "at least one condition"), "%s", err);
	santa_rule_match(r, 0, "a", 1);
	CHECK(santa_proto_rule_check(r, err, sizeof err) == -1 && strstr(err, "at least one processor"), "%s", err);
	santa_rule_free(r);
	CHECK(santa_proto_rule_check(NULL, err, sizeof err) == -1, "NULL rule accepted");
}

static void test_masks_and_bounds(void)
{
	static const uint8_t nine[9] = { 1, 1, 1, 1, 1, 1, 1, 1, 1 };
	char err[256];

	REFUSED_NEW(6, santa_rule_match_masked(r, 0, "ab", "\xff\x0f", 2),
	            "condition 0: pattern byte 1 (0x62) has bits 0x60 outside its mask (0x0f)");
	REFUSED_NEW(6, santa_rule_match_masked(r, 0, "a", NULL, 1), "condition 0: no mask");
	REFUSED_NEW(9, santa_rule_copy_masked(r, 0, 0, nine, 9), "processor 0 (copy): a masked copy of 9 bytes: masked copies hold at most 8");
	REFUSED_NEW(6, santa_rule_copy_masked(r, 0, 0, NULL, 1), "processor 0 (copy): no mask");
	REFUSED_NEW(6, santa_rule_length(r, 7, 6), "min length 7 exceeds max length 6");
	REFUSED_NEW(6, santa_rule_length(r, 0, SANTA_REQUEST_WINDOW + 1),
	            "max length 1473: must be between 0 and 1472 (the request bytes the matcher sees)");
	REFUSED_NEW(6, santa_rule_length(r, SANTA_REQUEST_WINDOW + 1, 0),
	            "min length 1473: must be between 0 and 1472 (the request bytes the matcher sees)");

	/* a rule needs a condition whose first byte is compared in full */
	struct santa_rule *r = fresh(6);
	CHECK(santa_rule_match_masked(r, 0, "\x01", "\x0f", 1) == 0 && santa_rule_put(r, 0, "x", 1) == 0, "masked rule");
	CHECK(santa_proto_rule_check(r, err, sizeof err) == -1 && strstr(err, "no condition compares its first byte in full"),
	      "unanchored rule: %s", err);
	CHECK(santa_rule_match_masked(r, 4, "a\0", "\xff\x00", 2) == 0, "anchorable masked condition refused");
	CHECK(santa_proto_rule_check(r, err, sizeof err) == 0, "anchored rule refused: %s", err);
	/* bounds below what the rule reads */
	CHECK(santa_rule_copy(r, 1, 9, 2) == 0 && santa_rule_length(r, 0, 10) == 0, "bounds refused");
	CHECK(santa_proto_rule_check(r, err, sizeof err) == -1 && strstr(err, "max length 10: the conditions and copies read 11"),
	      "max length below a copy: %s", err);
	CHECK(santa_rule_length(r, 11, 0) == 0 && santa_proto_rule_check(r, err, sizeof err) == 0, "min length only: %s", err);
	santa_rule_free(r);
}

static void test_guards(void)
{
	char err[256];

	REFUSED_NEW(6, santa_rule_guard(r, SANTA_GUARD_SLOTS, 1), "guard 0: slot 1048576 is past the guard map's 1048576 slots");

	struct santa_rule *r = fresh(6);
	CHECK(santa_rule_match(r, 0, "a", 1) == 0 && santa_rule_put(r, 0, "x", 1) == 0, "rule");
	CHECK(santa_rule_guard(r, 0, 0) == 0 && santa_rule_guard(r, SANTA_GUARD_SLOTS - 1, UINT64_MAX) == 0,
	      "two guards refused: %s", santa_rule_error(r));
	CHECK(santa_proto_rule_check(r, err, sizeof err) == 0, "guarded rule refused: %s", err);
	REFUSED(r, santa_rule_guard(r, 1, 1), "3 guards: at most 2 per rule");
	santa_rule_free(r);
}

static void test_null(void)
{
	errno = 0;
	CHECK(santa_rule_match(NULL, 0, "a", 1) == -1 && errno == EINVAL, "match on NULL");
	CHECK(santa_rule_put(NULL, 0, "a", 1) == -1, "put on NULL");
	CHECK(santa_rule_copy(NULL, 0, 0, 1) == -1, "copy on NULL");
	CHECK(santa_rule_priority(NULL, 1) == -1, "priority on NULL");
	CHECK(santa_rule_match_masked(NULL, 0, "a", "a", 1) == -1, "masked match on NULL");
	CHECK(santa_rule_copy_masked(NULL, 0, 0, "a", 1) == -1, "masked copy on NULL");
	CHECK(santa_rule_length(NULL, 1, 2) == -1, "length on NULL");
	CHECK(santa_rule_guard(NULL, 1, 2) == -1, "guard on NULL");
	CHECK(santa_rule_close(NULL, 1) == -1, "close on NULL");
	CHECK(santa_rule_error(NULL) == NULL, "error of NULL");
	santa_rule_free(NULL);
}

/* Checks that m encodes to the shared vector hex. */
static void encodes_as(const struct sp_msg *m, const char *hex, const char *what)
{
	uint8_t *enc = NULL;
	size_t len = 0, want_len;
	unsigned char *want = unhex(hex, &want_len);
	char err[256];

	CHECK(santa_proto_encode(m, &enc, &len, err, sizeof err) == 0, "%s: encode: %s", what, err);
	CHECK(len == want_len && memcmp(enc, want, len) == 0, "%s encodes differently", what);
	free(enc);
	free(want);
}

/* The builder's rule, sent as the paper's Listing 1, is the shared vector byte for byte. */
static void test_wire(void)
{
	struct santa_rule *r = fresh(6);
	struct sp_msg m = { .v = 1, .op = SP_OP_ADD, .seq = 5, .nrules = 1 };
	uint8_t *enc = NULL;
	size_t len = 0, want_len;
	unsigned char *want = unhex(listing1_hex, &want_len);
	char err[256];

	santa_rule_match(r, 0, "Hello", 5);
	santa_rule_put(r, 0, "COMSYS", 6);
	m.rules = &r->r;
	CHECK(santa_proto_encode(&m, &enc, &len, err, sizeof err) == 0, "encode: %s", err);
	CHECK(len == want_len && memcmp(enc, want, len) == 0, "listing 1 rule encodes differently");
	free(enc);

	/* priority is key 5 of the rule, after reply_len */
	santa_rule_priority(r, 300);
	CHECK(santa_proto_encode(&m, &enc, &len, err, sizeof err) == 0, "encode: %s", err);
	CHECK(len == want_len + 4 && memcmp(enc + len - 6, "\x04\x06\x05\x19\x01\x2c", 6) == 0 && enc[9] == 0xa4,
	      "priority encodes wrongly");
	free(enc);
	free(want);
	santa_rule_free(r);

	/* masks and length bounds */
	static const uint8_t name[] = { 0, 1, 0, 0, 0, 0, 0, 0, 3, 'w', 'w', 'w', 0, 0, 1, 0, 1 };
	r = fresh(40);
	m = (struct sp_msg){ .v = 1, .op = SP_OP_ADD, .seq = 15, .socket = 4097, .nrules = 1, .rules = &r->r };
	CHECK(santa_rule_match_masked(r, 2, "\0\0", "\x78\x4f", 2) == 0 && santa_rule_match(r, 4, name, sizeof name) == 0 &&
	      santa_rule_copy(r, 0, 0, 2) == 0 && santa_rule_put(r, 2, "\x84\0\0\1\0\1", 6) == 0 &&
	      santa_rule_copy_masked(r, 2, 2, "\x01\x10", 2) == 0 && santa_rule_length(r, 21, 300) == 0,
	      "masked rule: %s", santa_rule_error(r));
	encodes_as(&m, masked_hex, "masked rule");
	santa_rule_free(r);

	/* guards, one with a 64-bit version */
	static const char value[] = "\0\0\0\1\0\0VALUE k1 0 2\r\nv1\r\nEND\r\n";
	r = fresh(31);
	m = (struct sp_msg){ .v = 1, .op = SP_OP_ADD, .seq = 16, .socket = 4097, .nrules = 1, .rules = &r->r };
	CHECK(santa_rule_match(r, 4, "\0\1\0\0", 4) == 0 && santa_rule_match(r, 8, "get k1\r\n", 8) == 0 &&
	      santa_rule_copy(r, 0, 0, 2) == 0 && santa_rule_put(r, 2, value, sizeof value - 1) == 0 &&
	      santa_rule_length(r, 0, 16) == 0 && santa_rule_guard(r, 7, 3) == 0 &&
	      santa_rule_guard(r, SANTA_GUARD_SLOTS - 1, (UINT64_C(1) << 32) + 1) == 0,
	      "guarded rule: %s", santa_rule_error(r));
	encodes_as(&m, guarded_hex, "guarded rule");
	santa_rule_free(r);

	/* a TCP rule whose reply closes the connection: close is key 9 of the rule, true */
	static const char http_ok[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok";
	r = fresh(sizeof http_ok - 1);
	m = (struct sp_msg){ .v = 1, .op = SP_OP_ADD, .seq = 19, .socket = 12289, .nrules = 1, .rules = &r->r };
	CHECK(santa_rule_match(r, 0, "GET /health HTTP/1.1\r\n", 22) == 0 && santa_rule_put(r, 0, http_ok, sizeof http_ok - 1) == 0 &&
	      santa_rule_close(r, 1) == 0, "closing rule: %s", santa_rule_error(r));
	encodes_as(&m, closing_hex, "closing rule");
	CHECK(santa_rule_close(r, 0) == 0 && !r->r.close, "close not cleared");
	santa_rule_free(r);

	/* a DNS rule santad removes at a Unix time: expires is key 10 of the rule */
	static const char query[] = "\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03" "www" "\x07" "example" "\x03" "com" "\x00\x00\x01\x00\x01";
	static const char answer[] = "\x81\x80\x00\x01\x00\x01\x00\x00\x00\x00\x03" "www" "\x07" "example" "\x03" "com" "\x00\x00\x01\x00\x01"
				     "\xc0\x0c\x00\x01\x00\x01\x00\x00\x01\x2c\x00\x04\xc6\x13\x00\x01";
	r = fresh(49);
	m = (struct sp_msg){ .v = 1, .op = SP_OP_ADD, .seq = 20, .socket = (UINT64_C(1) << 40) + 7, .nrules = 1, .rules = &r->r };
	CHECK(santa_rule_match(r, 2, query, sizeof query - 1) == 0 && santa_rule_copy(r, 0, 0, 2) == 0 &&
	      santa_rule_put(r, 2, answer, sizeof answer - 1) == 0 && santa_rule_expires(r, 1795000000) == 0,
	      "expiring rule: %s", santa_rule_error(r));
	encodes_as(&m, expiring_hex, "expiring rule");
	CHECK(santa_rule_expires(NULL, 1) == -1, "expires on NULL");
	santa_rule_free(r);

	/* a tagged rule as list_rules reports it: tag is key 11 of the rule */
	r = fresh(21);
	r->r.id = 9;
	r->r.version = 2;
	m = (struct sp_msg){ .v = 1, .op = SP_OP_LIST_RULES, .seq = 21, .nrules = 1, .rules = &r->r };
	CHECK(santa_rule_match(r, 0, "get k\r\n", 7) == 0 && santa_rule_put(r, 0, "VALUE k 0 1\r\nv\r\nEND\r\n", 21) == 0 &&
	      santa_rule_tag(r, "an old tag") == 0 && santa_rule_tag(r, "santa-memcached") == 0,
	      "tagged rule: %s", santa_rule_error(r));
	encodes_as(&m, tagged_hex, "tagged rule");
	CHECK(santa_rule_tag(r, "") == 0 && r->r.tag == NULL, "empty tag not cleared");
	CHECK(santa_rule_tag(r, NULL) == 0 && r->r.tag == NULL, "NULL tag not cleared");
	CHECK(santa_rule_tag(NULL, "x") == -1 && errno == EINVAL, "tag on NULL");
	santa_rule_free(r);
	char long_tag[SANTA_MAX_TAG + 2];
	memset(long_tag, 't', sizeof long_tag - 1);
	long_tag[sizeof long_tag - 1] = '\0';
	r = fresh(1);
	/* in santad's words (api.CheckTag) */
	CHECK(santa_rule_tag(r, long_tag) == -1 && errno == EINVAL && santa_rule_error(r) &&
	          strcmp(santa_rule_error(r), "tag \"tttttttttttttttttttt\"… is 65 bytes, at most 64") == 0,
	      "a 65-byte tag: %s", santa_rule_error(r) ? santa_rule_error(r) : "taken");
	santa_rule_free(r);
	r = fresh(1);
	long_tag[SANTA_MAX_TAG] = '\0';
	CHECK(santa_rule_tag(r, long_tag) == 0 && strlen(r->r.tag) == SANTA_MAX_TAG, "a 64-byte tag refused: %s",
	      santa_rule_error(r));
	santa_rule_free(r);
}

int main(void)
{
	test_reply_len();
	test_conditions();
	test_processors();
	test_sticky();
	test_masks_and_bounds();
	test_guards();
	test_null();
	test_wire();
	return check_done("test_rule");
}
