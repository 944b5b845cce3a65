/*
 * test_decode.c - the strict decoder: what it must refuse (the cases of
 * api/vectors_test.go TestDecodeRefuses, and more), and the few liberties it
 * shares with the Go client's decoder (keys it does not know are skipped).
 */
#include <errno.h>

#include "check.h"
#include "proto.h"

static const struct {
	const char *name, *hex, *why; /* why: a part of the expected error text */
} refused[] = {
	/* api/vectors_test.go TestDecodeRefuses */
	{ "duplicate key", "a200010002", "duplicate message key 0" },
	{ "not a map", "83010203", "want a map, got an array" },
	{ "trailing bytes", "a1000100", "trailing bytes" },
	{ "indefinite map", "bf0001ff", "indefinite" },
	{ "negative op", "a12001", "key: want an unsigned integer, got a negative integer" },
	{ "text where uint", "a1016161", "op: want an unsigned integer, got text" },
	{ "tag", "a100c11a5f5e1000", "v: want an unsigned integer, got a tag" },
	{ "truncated", "a2000101", "truncated" },
	{ "empty", "", "empty" },
	/* more of docs/protocol.md's refusals */
	{ "negative value", "a10120", "op: want an unsigned integer, got a negative integer" },
	{ "float", "a100f93c00", "v: want an unsigned integer, got a float" },
	{ "null", "a100f6", "got a float or simple value" },
	{ "bytes where text", "a1044161", "error: want text, got bytes" },
	{ "text where bytes", "a10f6161", "sample: want bytes, got text" },
	{ "indefinite bytes", "a10f5f4161ff", "sample: indefinite" },
	{ "indefinite text", "a1047f6161ff", "error: indefinite" },
	{ "indefinite array", "a10a9f01ff", "ids: indefinite" },
	{ "uint where bool", "a10b81a10901", "sockets[0].created: want a bool, got an unsigned integer" },
	{ "text key", "a1616101", "key: want an unsigned integer, got text" },
	{ "uint where bool (close)", "a10981a10901", "rules[0].close: want a bool, got an unsigned integer" },
	{ "nested duplicate key", "a10981a204010402", "rules[0]: duplicate rule key 4 (reply_len)" },
	{ "trailing byte after nesting", "a10981a10281a1014161 00", "trailing bytes" },
	{ "deep text pattern", "a10981a10281a1016161", "rules[0].conditions[0].pattern: want bytes, got text" },
	{ "uint32 overflow", "a10d1b0000000100000000", "sample_bytes: 4294967296 does not fit in 32 bits" },
	{ "uint16 overflow", "a1081a00010000", "port: 65536 does not fit in 16 bits" },
	{ "guard slot overflow", "a10981a10881a1001b0000000100000000", "rules[0].guards[0].slot: 4294967296 does not fit in 32 bits" },
	{ "guard not a map", "a10981a1088101", "rules[0].guards[0]: want a map, got an unsigned integer" },
	{ "duplicate counter", "a111a2616101616102", "counters: duplicate key" },
	{ "counter value text", "a111a161616162", "counters: want an unsigned integer, got text" },
	{ "counter key uint", "a111a10101", "counters: want text, got an unsigned integer" },
	{ "text with NUL", "a104626100", "error: text holds a NUL byte" },
	{ "invalid UTF-8", "a10462fffe", "invalid CBOR" },
	{ "daemon not a map", "a11001", "daemon: want a map, got an unsigned integer" },
	{ "huge array claim", "a10a9b0000000100000000", "claims more items" },
	{ "huge map claim", "bb0000000100000000", "claims more items" },
	{ "huge bytes claim", "a10f5b0000000100000000", "truncated" },
	{ "stray break", "a100ff", "invalid CBOR" },
	{ "two messages", "a10001a10001", "trailing bytes" },
};

/* Accepted although not what an encoder of this protocol writes, as the Go decoder accepts them. */
static const struct {
	const char *name, *hex;
} accepted[] = {
	{ "non-shortest integer", "a1001b0000000000000001" },
	{ "keys out of order", "a3020701040001" },
	{ "zero value present", "a2000103 00" },
	{ "false present", "a10b81a109f4" },
	{ "empty array", "a10a80" },
	{ "empty daemon", "a110a0" },
	/* keys of a later version, skipped (more in skipped_keys.json) */
	{ "unknown key", "a2000118ff01" },
	{ "nested unknown key", "a10981a10c01" },
};

/* Seeds for the mutation test: vectors.json's health response, DNS rule and guarded rule. */
static const char *const seeds[] = {
	"a500010101020110af0065302e332e3001010219109203190e100481a20065766574683001666e61746976650502061903e8071a00"
	"01000008196000091a010000000a19fffe0b1a000186a00c1a040000000d1903e80e19600011a368616e7377657265641a075bcd15"
	"6c706173735f6e6f745f756470006d706173735f6e6f5f6d61746368182a",
	"a5000101040206051b00000100000000070981a40282a20002014401000001a2000c015103777777076578616d706c6503636f6d00"
	"0382a3000101020246818000010001a2000204020419012c050a",
	"a40001010202020b81a800191001010402110344c6120001041914e90519fffe09f50a1904d2",
	"a5000101040210051910010981a50282a20004014400010000a200080148676574206b310d0a0382a200020402a30001010202581d00000001"
	"000056414c5545206b31203020320d0a76310d0a454e440d0a04181f07100882a200070103a2001a000fffff011b0000000100000001",
};

/* Decodes data; whatever decodes must re-encode to bytes that decode and
 * re-encode to the same bytes (like api's FuzzDecode). */
static void round_trip(const uint8_t *data, size_t len)
{
	struct sp_msg m;
	uint8_t *a = NULL, *b = NULL;
	size_t alen = 0, blen = 0;
	char err[256];

	if (santa_proto_decode(data, len, &m, err, sizeof err) < 0)
		return;
	CHECK(santa_proto_encode(&m, &a, &alen, err, sizeof err) == 0, "re-encode: %s", err);
	santa_proto_msg_free(&m);
	if (!a)
		return;
	CHECK(santa_proto_decode(a, alen, &m, err, sizeof err) == 0, "decode re-encoded: %s", err);
	CHECK(santa_proto_encode(&m, &b, &blen, err, sizeof err) == 0 && blen == alen && memcmp(a, b, alen) == 0,
	      "round trip changed the message");
	santa_proto_msg_free(&m);
	free(a);
	free(b);
}

/* Every truncation, and every byte replaced by values that change CBOR's
 * meaning (type and length boundaries, simple values, breaks). */
static void mutate(const char *hex)
{
	static const uint8_t values[] = { 0x00, 0x01, 0x17, 0x18, 0x1b, 0x1f, 0x20, 0x3b, 0x40, 0x5b, 0x5f, 0x60, 0x7b,
		                          0x7f, 0x80, 0x9b, 0x9f, 0xa0, 0xbb, 0xbf, 0xc0, 0xf4, 0xf5, 0xf6, 0xf9, 0xfb, 0xff };
	size_t len;
	uint8_t *b = unhex(hex, &len);

	for (size_t cut = 0; cut <= len; cut++)
		round_trip(b, cut);
	for (size_t i = 0; i < len; i++) {
		uint8_t orig = b[i];
		for (size_t v = 0; v < sizeof values + 2; v++) {
			b[i] = v < sizeof values ? values[v] : (uint8_t)(orig + (v == sizeof values ? 1 : -1));
			round_trip(b, len);
		}
		b[i] = orig;
	}
	free(b);
}

/* Compacts hex written with spaces for readability. */
static unsigned char *unhex_spaced(const char *hex, size_t *len)
{
	char buf[256];
	size_t n = 0;
	for (; *hex && n < sizeof buf - 1; hex++)
		if (*hex != ' ')
			buf[n++] = *hex;
	buf[n] = '\0';
	return unhex(buf, len);
}

int main(void)
{
	for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
		size_t len;
		unsigned char *b = unhex_spaced(refused[i].hex, &len);
		struct sp_msg m;
		char err[256] = "";
		errno = 0;
		int rc = santa_proto_decode(b, len, &m, err, sizeof err);
		CHECK(rc == -1, "%s: decoded, want an error", refused[i].name);
		CHECK(errno == EBADMSG, "%s: errno %d, want EBADMSG", refused[i].name, errno);
		CHECK(strstr(err, refused[i].why) != NULL, "%s: error \"%s\" lacks \"%s\"", refused[i].name, err,
		      refused[i].why);
		CHECK(m.rules == NULL && m.error == NULL && m.nids == 0, "%s: result not cleared", refused[i].name);
		free(b);
	}
	for (size_t i = 0; i < sizeof accepted / sizeof accepted[0]; i++) {
		size_t len;
		unsigned char *b = unhex_spaced(accepted[i].hex, &len);
		struct sp_msg m;
		char err[256] = "";
		CHECK(santa_proto_decode(b, len, &m, err, sizeof err) == 0, "%s: %s", accepted[i].name, err);
		santa_proto_msg_free(&m);
		free(b);
	}
	for (size_t i = 0; i < sizeof seeds / sizeof seeds[0]; i++)
		mutate(seeds[i]);
	return check_done("test_decode");
}
