/*
 * integration.c - libsanta against a real santad, with requests on the wire.
 *
 * Not part of `make check` (it needs root, a running santad and a veth
 * testbed); `make integration` builds it as build/test_integration. It runs
 * in the server network namespace, where santad's rule processor sits on the
 * server veth:
 *
 *   SANTA_SOCKET=/path/santa.sock        santad's control socket
 *   SANTA_SERVER_ADDR4=198.18.X.1        the server veth's IPv4 address
 *   SANTA_SERVER_ADDR6=2001:2:0:X::1     the server veth's IPv6 address
 *   SANTA_CLIENT_NS=name                 the client namespace (/run/netns/name)
 *   nsenter --net=/run/netns/SERVER_NS build/test_integration
 *
 * The application sockets are bound to the server addresses on ports
 * 7701 (IPv4) and 7702 (IPv6). Requests come from the client namespace:
 * the test creates each client socket there (setns into the client
 * namespace, socket(), setns back: a socket stays in the namespace it was
 * created in), so they cross the veth and pass the rule processor.
 *
 * Every check prints one line, "ok   ..." or "FAIL ..."; the exit status is
 * 0 only if all pass, 1 if one failed, 2 for a missing environment. Every
 * wait is bounded, and an alarm ends a run that hangs anyway.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <santa.h>

#ifndef SO_COOKIE
#define SO_COOKIE 57
#endif

#define PORT4 7701
#define PORT6 7702
#define REPLY_TIMEOUT_MS 2000  /* for a reply, or a request at the application socket */
#define QUIET_MS 100           /* how long the application socket must stay empty */
#define SAMPLE_TIMEOUT_MS 3000 /* for a miss sample */
#define GONE_TIMEOUT_MS 5000   /* for santad to drop a closed socket's rule set */
#define WATCHDOG_SECONDS 180   /* the whole run, also under valgrind */
#define STR_(x) #x
#define STR(x) STR_(x)

/* A cookie no socket has: cookies count up from 1. */
#define UNKNOWN_COOKIE (UINT64_MAX - 7)

static int n_checks, n_failed;
static int client_ns = -1, own_ns = -1;

/* Prints one check line; returns ok. */
__attribute__((format(printf, 2, 3))) static bool check(bool ok, const char *fmt, ...)
{
	va_list ap;

	n_checks++;
	if (!ok)
		n_failed++;
	fputs(ok ? "ok   " : "FAIL ", stdout);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	putchar('\n');
	fflush(stdout);
	return ok;
}

/* santa_error() after a failed call, "" after a success. */
static const char *why(struct santa_client *c, int rc)
{
	return rc == 0 ? "" : santa_error(c);
}

/* Bytes as text, non-printable ones as \xNN, at most the first 32 (then the
 * length); up to 8 strings live at once. */
static const char *show(const void *p, ssize_t len)
{
	static char bufs[8][192];
	static unsigned next;
	char *out = bufs[next++ % 8];
	const unsigned char *b = p;
	size_t o = 0;

	if (len < 0)
		return "(nothing)";
	out[o++] = '"';
	for (ssize_t i = 0; i < len && i < 32; i++) {
		if (b[i] >= 0x20 && b[i] < 0x7f && b[i] != '"' && b[i] != '\\')
			out[o++] = (char)b[i];
		else
			o += (size_t)snprintf(out + o, 5, "\\x%02x", b[i]);
	}
	out[o++] = '"';
	out[o] = 0;
	if (len > 32)
		snprintf(out + o, sizeof bufs[0] - o, "... (%zd bytes)", len);
	return out;
}

static bool same(const void *a, ssize_t alen, const void *b, size_t blen)
{
	return alen >= 0 && (size_t)alen == blen && memcmp(a, b, blen) == 0;
}

static void on_alarm(int sig)
{
	static const char msg[] = "FAIL the test did not finish in " STR(WATCHDOG_SECONDS) " s\n";
	(void)sig;
	if (write(STDOUT_FILENO, msg, sizeof msg - 1) < 0) {
		/* nothing left to tell */
	}
	_exit(1);
}

static int64_t now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits up to ms for fd to be readable: 1, 0 on timeout, -1 on error. */
static int readable(int fd, int ms)
{
	int64_t deadline = now_ms() + ms;
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int left = (int)(deadline - now_ms());
		int rc = poll(&p, 1, left > 0 ? left : 0);
		if (rc >= 0)
			return rc > 0;
		if (errno != EINTR)
			return -1;
	}
}

/* ---- the testbed's two sides --------------------------------------------- */

/* One address family of the test: the server address and its application socket. */
struct fam {
	const char *name; /* "IPv4", "IPv6" */
	int af;
	struct sockaddr_storage addr; /* server address and port */
	socklen_t addrlen;
	unsigned hdr;   /* Ethernet + IP + UDP header bytes of a reply frame */
	int srv;        /* the application socket, or -1 */
	uint64_t cookie;
};

static const char *addr_text(const struct sockaddr_storage *ss)
{
	static char bufs[4][INET6_ADDRSTRLEN + 16];
	static unsigned next;
	char *out = bufs[next++ % 4], ip[INET6_ADDRSTRLEN] = "?";

	if (ss->ss_family == AF_INET) {
		const struct sockaddr_in *a = (const void *)ss;
		inet_ntop(AF_INET, &a->sin_addr, ip, sizeof ip);
		snprintf(out, sizeof bufs[0], "%s:%u", ip, ntohs(a->sin_port));
	} else {
		const struct sockaddr_in6 *a = (const void *)ss;
		inet_ntop(AF_INET6, &a->sin6_addr, ip, sizeof ip);
		snprintf(out, sizeof bufs[0], "[%s]:%u", ip, ntohs(a->sin6_port));
	}
	return out;
}

/* Same address and port. */
static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
	return x->sin6_port == y->sin6_port && memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr) == 0;
}

/* A UDP socket of the client namespace connected to the server, or -1
 * (reason in err). local receives its address. */
static int client_socket(const struct fam *f, struct sockaddr_storage *local, char *err, size_t errlen)
{
	int fd, e;
	socklen_t len = sizeof *local;

	if (setns(client_ns, CLONE_NEWNET) < 0) {
		snprintf(err, errlen, "setns into the client namespace: %s", strerror(errno));
		return -1;
	}
	fd = socket(f->af, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	e = errno;
	if (setns(own_ns, CLONE_NEWNET) < 0) {
		/* every later socket would land in the wrong namespace */
		fprintf(stdout, "FAIL setns back into the server namespace: %s\n", strerror(errno));
		exit(1);
	}
	if (fd < 0) {
		snprintf(err, errlen, "client socket: %s", strerror(e));
		return -1;
	}
	if (connect(fd, (const struct sockaddr *)&f->addr, f->addrlen) < 0 ||
	    getsockname(fd, (struct sockaddr *)local, &len) < 0) {
		snprintf(err, errlen, "client connect to %s: %s", addr_text(&f->addr), strerror(errno));
		close(fd);
		return -1;
	}
	return fd;
}

/* Sends req from the client namespace and returns the reply's length (in
 * out), or -1 if none came in REPLY_TIMEOUT_MS (reason in err). */
static ssize_t exchange(const struct fam *f, const void *req, size_t len, void *out, size_t cap, char *err,
                        size_t errlen)
{
	struct sockaddr_storage local;
	ssize_t n = -1;
	int fd = client_socket(f, &local, err, errlen);

	if (fd < 0)
		return -1;
	if (send(fd, req, len, 0) != (ssize_t)len) {
		snprintf(err, errlen, "send: %s", strerror(errno));
	} else if (readable(fd, REPLY_TIMEOUT_MS) != 1) {
		snprintf(err, errlen, "no reply in %d ms", REPLY_TIMEOUT_MS);
	} else if ((n = recv(fd, out, cap, MSG_DONTWAIT)) < 0) {
		snprintf(err, errlen, "recv: %s", strerror(errno));
	} else {
		err[0] = 0;
	}
	close(fd);
	return n;
}

/* Checks that santad answers req with exactly want, from the kernel. */
static bool expect_reply(const struct fam *f, const char *what, const void *req, size_t len, const void *want,
                         size_t wantlen)
{
	char got[2048], err[256];
	ssize_t n = exchange(f, req, len, got, sizeof got, err, sizeof err);

	return check(same(got, n, want, wantlen), "%s: %s: request %s answered %s, want %s %s", f->name, what,
	             show(req, (ssize_t)len), show(got, n), show(want, (ssize_t)wantlen), err);
}

/* Checks that nothing waits at the application socket: the rule processor
 * answered everything sent so far. */
static bool expect_quiet(const struct fam *f, const char *what)
{
	int r = readable(f->srv, QUIET_MS);
	return check(r == 0, "%s: %s: the application socket received nothing (%s)", f->name, what,
	             r == 0 ? "empty" : r > 0 ? "a datagram is waiting" : strerror(errno));
}

/* Checks that req from the client namespace reaches the application socket
 * unchanged (read there), and that the application's reply reaches the client. */
static bool expect_app(const struct fam *f, const char *what, const void *req, size_t len)
{
	struct sockaddr_storage local, from;
	socklen_t fromlen = sizeof from;
	char got[2048], back[sizeof got + 4], err[256] = "";
	ssize_t n = -1, m = -1;
	int fd = client_socket(f, &local, err, sizeof err);

	if (fd >= 0) {
		if (send(fd, req, len, 0) != (ssize_t)len)
			snprintf(err, sizeof err, "send: %s", strerror(errno));
		else if (readable(f->srv, REPLY_TIMEOUT_MS) != 1)
			snprintf(err, sizeof err, "nothing at the application socket in %d ms", REPLY_TIMEOUT_MS);
		else if ((n = recvfrom(f->srv, got, sizeof got, MSG_DONTWAIT, (struct sockaddr *)&from, &fromlen)) < 0)
			snprintf(err, sizeof err, "recvfrom: %s", strerror(errno));
	}
	bool ok = check(same(got, n, req, len) && same_addr(&from, &local),
	                "%s: %s: request %s reached the application socket as %s from %s (client %s) %s", f->name,
	                what, show(req, (ssize_t)len), show(got, n), n >= 0 ? addr_text(&from) : "-",
	                fd >= 0 ? addr_text(&local) : "-", err);
	if (ok) {
		memcpy(back, "app:", 4);
		memcpy(back + 4, got, (size_t)n);
		err[0] = 0;
		if (sendto(f->srv, back, (size_t)n + 4, 0, (struct sockaddr *)&from, fromlen) != n + 4)
			snprintf(err, sizeof err, "sendto: %s", strerror(errno));
		else if (readable(fd, REPLY_TIMEOUT_MS) != 1)
			snprintf(err, sizeof err, "no reply in %d ms", REPLY_TIMEOUT_MS);
		else if ((m = recv(fd, got, sizeof got, MSG_DONTWAIT)) < 0)
			snprintf(err, sizeof err, "recv: %s", strerror(errno));
		ok = check(same(got, m, back, (size_t)n + 4), "%s: %s: the client got the application's reply %s, want %s %s",
		           f->name, what, show(got, m), show(back, n + 4), err);
	}
	if (fd >= 0)
		close(fd);
	return ok;
}

/* A UDP socket bound to the server address, or -1. */
static int server_socket(const struct fam *f)
{
	int fd = socket(f->af, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd >= 0 && bind(fd, (const struct sockaddr *)&f->addr, f->addrlen) < 0) {
		int e = errno;
		close(fd);
		fd = -1;
		errno = e;
	}
	return fd;
}

/* ---- rules ---------------------------------------------------------------- */

/* Fails the run if a builder call fails: these rules are all valid locally. */
static struct santa_rule *built(struct santa_rule *r, int rc, const char *what)
{
	if (!r || rc < 0) {
		check(false, "build rule %s: %s", what, r && santa_rule_error(r) ? santa_rule_error(r) : strerror(errno));
		santa_rule_free(r);
		return NULL;
	}
	return r;
}

/* "Hello" at offset 0 -> reply (the paper's Listing 1 with "COMSYS"). */
static struct santa_rule *rule_hello(const char *reply)
{
	size_t n = strlen(reply);
	struct santa_rule *r = santa_rule_new((uint32_t)n);
	int rc = r ? santa_rule_match(r, 0, "Hello", 5) | santa_rule_put(r, 0, reply, n) : -1;
	return built(r, rc, "hello");
}

/* A DNS-like rule: requests <id:2>"QRY"<tail:4> are answered <id>"ANS"<tail>,
 * by a put between two copies. */
static struct santa_rule *rule_query(void)
{
	struct santa_rule *r = santa_rule_new(9);
	int rc = r ? santa_rule_match(r, 2, "QRY", 3) | santa_rule_copy(r, 0, 0, 2) | santa_rule_put(r, 2, "ANS", 3) |
	                 santa_rule_copy(r, 5, 5, 4)
	           : -1;
	return built(r, rc, "query");
}

/* "Ping" -> "Pong", priority 5, removed by santad at Unix time expires,
 * tagged PING_TAG. */
#define PING_TAG "c-integration ping"
static struct santa_rule *rule_ping(uint64_t expires)
{
	struct santa_rule *r = santa_rule_new(4);
	int rc = r ? santa_rule_match(r, 0, "Ping", 4) | santa_rule_put(r, 0, "Pong", 4) | santa_rule_priority(r, 5) |
	                 santa_rule_expires(r, expires) | santa_rule_tag(r, PING_TAG)
	           : -1;
	return built(r, rc, "ping");
}

/* Masks and length bounds: exactly 7-byte requests <id:2><flags:2>"MSK" whose
 * flags have bit 0x80 of the first byte clear are answered <id>"\x84"<bit
 * 0x01 of the request's second flags byte>"OK". Tagged MASKED_TAG (deleted
 * by tag). */
#define MASKED_TAG "c-integration masked"
static struct santa_rule *rule_masked(void)
{
	struct santa_rule *r = santa_rule_new(6);
	int rc = r ? santa_rule_match_masked(r, 2, "\0", "\x80", 1) | santa_rule_match(r, 4, "MSK", 3) |
	                 santa_rule_copy(r, 0, 0, 2) | santa_rule_put(r, 2, "\x84\0OK", 4) |
	                 santa_rule_copy_masked(r, 3, 3, "\x01", 1) | santa_rule_length(r, 7, 7) |
	                 santa_rule_tag(r, MASKED_TAG)
	           : -1;
	return built(r, rc, "masked");
}

/* Guards: "GRD" -> reply while slot GUARD_SLOT of santad's guard map holds
 * version. The test's santad has a fresh guard map (every slot 0), and
 * nothing writes that slot. */
#define GUARD_SLOT (SANTA_GUARD_SLOTS - 1)
static struct santa_rule *rule_guarded(const char *reply, uint64_t version, uint32_t priority)
{
	struct santa_rule *r = santa_rule_new(5);
	int rc = r ? santa_rule_match(r, 0, "GRD", 3) | santa_rule_put(r, 0, reply, 5) |
	                 santa_rule_guard(r, GUARD_SLOT, version) | santa_rule_priority(r, priority)
	           : -1;
	return built(r, rc, "guarded");
}

/* Valid for the builder, refused by santad: its copies form 9 separate
 * segments of the reply (santad allows 8). */
static struct santa_rule *rule_too_many_copies(void)
{
	struct santa_rule *r = santa_rule_new(9);
	int rc = r ? santa_rule_match(r, 0, "Bad", 3) : -1;
	for (uint32_t i = 0; r && i < 9; i++)
		rc |= santa_rule_copy(r, i, 2 * i, 1);
	return built(r, rc, "too many copies");
}

/* ---- list and stats helpers ------------------------------------------------ */

struct want_rule {
	uint64_t id;
	uint32_t version, priority, reply_len, min_len, max_len;
	uint64_t expires;
	const char *tag; /* NULL: untagged */
};

/* Checks that the socket's rule set holds exactly want, in order. */
static void expect_rules(struct santa_client *c, const struct fam *f, const char *what, const struct want_rule *want,
                         size_t n)
{
	struct santa_rule_info *got = NULL;
	size_t ngot = 0;
	int rc = santa_list_rules(c, -1, f->cookie, &got, &ngot);
	char desc[512] = "";
	size_t o = 0;
	bool ok = rc == 0 && ngot == n;

	for (size_t i = 0; rc == 0 && i < ngot && o < sizeof desc - 64; i++)
		o += (size_t)snprintf(desc + o, sizeof desc - o,
		                      " {id %" PRIu64 " v%u prio %u len %u req %u..%u expires %" PRIu64 " close %d tag \"%s\"}",
		                      got[i].id, got[i].version, got[i].priority, got[i].reply_len, got[i].min_len,
		                      got[i].max_len, got[i].expires, got[i].close, got[i].tag);
	for (size_t i = 0; ok && i < n; i++)
		ok = got[i].id == want[i].id && got[i].version == want[i].version && got[i].priority == want[i].priority &&
		     got[i].reply_len == want[i].reply_len && got[i].min_len == want[i].min_len &&
		     got[i].max_len == want[i].max_len && got[i].expires == want[i].expires && !got[i].close &&
		     strcmp(got[i].tag, want[i].tag ? want[i].tag : "") == 0;
	check(ok, "%s: %s: santa_list_rules: rc=%d, %zu rules:%s (want %zu) %s", f->name, what, rc, ngot, desc, n,
	      why(c, rc));
	santa_rule_info_free(got);
}

/* Checks that the one rule tagged tag is id. */
static void expect_tagged(struct santa_client *c, const struct fam *f, const char *tag, uint64_t id)
{
	struct santa_rule_info *got = NULL;
	size_t n = 0;
	int rc = santa_list_rules_tagged(c, -1, f->cookie, tag, &got, &n);

	check(rc == 0 && n == 1 && got[0].id == id && strcmp(got[0].tag, tag) == 0,
	      "%s: santa_list_rules_tagged(\"%s\"): rc=%d, %zu rules, first id %" PRIu64 " (want rule %" PRIu64 ") %s",
	      f->name, tag, rc, n, n ? got[0].id : 0, id, why(c, rc));
	santa_rule_info_free(got);
}

/* Checks a rule's counters (id 0: the whole rule set). */
static void expect_stats(struct santa_client *c, const struct fam *f, const char *what, uint64_t id, uint64_t hits,
                         uint64_t bytes)
{
	uint64_t h = UINT64_MAX, b = UINT64_MAX;
	int rc = santa_stats(c, -1, f->cookie, id, &h, &b);
	check(rc == 0 && h == hits && b == bytes, "%s: %s: santa_stats(rule %" PRIu64 "): rc=%d hits=%" PRIu64
	      " bytes=%" PRIu64 " (want %" PRIu64 " and %" PRIu64 ") %s", f->name, what, id, rc, h, b, hits, bytes,
	      why(c, rc));
}

/* Checks that the last call failed with santad's status and errno. */
static void expect_refused(struct santa_client *c, const char *what, int rc, int err, int status, int want_errno,
                           const char *want_text)
{
	const char *msg = santa_error(c);
	check(rc == -1 && santa_status(c) == status && err == want_errno && (!want_text || strstr(msg, want_text)),
	      "%s: rc=%d status=%s errno=%s (want -1, %s, %s): %s", what, rc, santa_status_name(santa_status(c)),
	      strerror(err), santa_status_name(status), strerror(want_errno), msg);
}

static uint64_t health_rules(struct santa_client *c)
{
	struct santa_health h;
	return santa_health(c, &h) == 0 ? h.rules : UINT64_MAX;
}

/* ---- the tests --------------------------------------------------------------- */

static void test_health(struct santa_client *c)
{
	struct santa_health h;
	char path[64], comm[64] = "";
	int rc;

	memset(&h, 0xa5, sizeof h);
	rc = santa_health(c, &h);
	if (!check(rc == 0 && santa_status(c) == SANTA_STATUS_OK && strcmp(santa_error(c), "") == 0,
	           "santa_health: rc=%d status=%s %s", rc, santa_status_name(santa_status(c)), why(c, rc)))
		return;
	check(h.protocol == SANTA_PROTOCOL_VERSION, "health: protocol %u (want %d)", h.protocol, SANTA_PROTOCOL_VERSION);
	check(memchr(h.version, 0, sizeof h.version) && h.version[0], "health: version \"%.*s\"", (int)sizeof h.version,
	      h.version);
	snprintf(path, sizeof path, "/proc/%u/comm", h.pid);
	FILE *fp = fopen(path, "r");
	if (fp) {
		if (!fgets(comm, sizeof comm, fp))
			comm[0] = 0;
		comm[strcspn(comm, "\n")] = 0;
		fclose(fp);
	}
	check(strcmp(comm, "santad") == 0, "health: pid %u is a santad (its comm is \"%s\")", h.pid, comm);
	check(h.uid == getuid(), "health: uid %u (want %u)", h.uid, getuid());
	check(h.interfaces == 1, "health: attached to %u interfaces (want 1, the server veth)", h.interfaces);
	check(h.max_rules > 0 && h.rules <= h.max_rules && h.max_data_bytes > 0 && h.data_bytes <= h.max_data_bytes,
	      "health: rules %" PRIu64 "/%" PRIu64 ", data %" PRIu64 "/%" PRIu64 " bytes", h.rules, h.max_rules,
	      h.data_bytes, h.max_data_bytes);
	check(h.quota_rules == 0 && h.quota_bytes == 0 && h.quota_rulesets == 0,
	      "health: root has no quota (rules %" PRIu64 ", bytes %" PRIu64 ", rule sets %" PRIu64 ")",
	      h.quota_rules, h.quota_bytes, h.quota_rulesets);
}

/* Operations on a cookie no socket has: each is "not found". */
static void test_unknown_cookie(struct santa_client *c, struct santa_rule *hello)
{
	const struct santa_rule *rules[] = { hello };
	struct santa_rule_info *infos = NULL;
	size_t n = 0;
	uint64_t hits, id = 1;
	int rc, e;
	char what[128];

#define REFUSED(call, name)                                                                              \
	do {                                                                                             \
		errno = 0;                                                                               \
		rc = (call);                                                                             \
		e = errno;                                                                               \
		snprintf(what, sizeof what, "unknown cookie %" PRIu64 ": %s", (uint64_t)UNKNOWN_COOKIE, name); \
		expect_refused(c, what, rc, e, SANTA_STATUS_NOT_FOUND, ENOENT, NULL);                    \
	} while (0)
	REFUSED(santa_list_rules(c, -1, UNKNOWN_COOKIE, &infos, &n), "santa_list_rules");
	REFUSED(santa_stats(c, -1, UNKNOWN_COOKIE, 0, &hits, NULL), "santa_stats");
	REFUSED(santa_add(c, -1, UNKNOWN_COOKIE, rules, 1, &id), "santa_add");
	REFUSED(santa_unbind(c, -1, UNKNOWN_COOKIE), "santa_unbind");
	REFUSED(santa_delete_tagged(c, -1, UNKNOWN_COOKIE, "t", NULL), "santa_delete_tagged");
#undef REFUSED
	santa_rule_info_free(infos);
	/* the connection stays usable after refusals */
	struct santa_health h;
	rc = santa_health(c, &h);
	check(rc == 0, "santa_health after refusals: rc=%d %s", rc, why(c, rc));
}

/* The whole life of one application socket, over one address family. */
static void test_family(struct santa_client *c, struct fam *f)
{
	const uint64_t ping_expires = (uint64_t)time(NULL) + 3600;
	struct santa_rule *hello = rule_hello("COMSYS"), *query = rule_query(), *ping = rule_ping(ping_expires);
	struct santa_rule *modified = rule_hello("MODIFIED"), *again = rule_hello("AGAIN"), *bad = rule_too_many_copies();
	struct santa_rule *masked = rule_masked();
	/* the stale rule's guard does not hold: it never answers, though it has the better priority */
	struct santa_rule *guard_holds = rule_guarded("fresh", 0, 1), *guard_moved = rule_guarded("stale", 1, 0);
	struct santa_client *sub = NULL;
	uint64_t so_cookie = 0, cookie2 = 0, ids[2] = { 0, 0 }, new_ids[2] = { 0, 0 }, id3 = 0, id_masked = 0;
	uint64_t ids_guarded[2] = { 0, 0 };
	uint64_t hits_hello = 0, bytes_hello = 0, hits_query = 0, bytes_query = 0;
	uint64_t base_rules = health_rules(c);
	socklen_t len = sizeof so_cookie;
	int rc, e;

	if (!hello || !query || !ping || !modified || !again || !bad || !masked || !guard_holds || !guard_moved)
		goto out;
	f->srv = server_socket(f);
	if (!check(f->srv >= 0, "%s: application socket bound to %s %s", f->name, addr_text(&f->addr),
	           f->srv >= 0 ? "" : strerror(errno)))
		goto out;
	if (getsockopt(f->srv, SOL_SOCKET, SO_COOKIE, &so_cookie, &len) < 0)
		so_cookie = 0;

	/* bind: the cookie is the socket's SO_COOKIE; binding again is idempotent */
	rc = santa_bind(c, f->srv, 0, 0, &f->cookie);
	if (!check(rc == 0 && so_cookie != 0 && f->cookie == so_cookie,
	           "%s: santa_bind: rc=%d cookie=%" PRIu64 " SO_COOKIE=%" PRIu64 " %s", f->name, rc, f->cookie,
	           so_cookie, why(c, rc)))
		goto out;
	rc = santa_bind(c, f->srv, 0, 0, &cookie2);
	check(rc == 0 && cookie2 == so_cookie, "%s: santa_bind again: rc=%d cookie=%" PRIu64 " %s", f->name, rc,
	      cookie2, why(c, rc));
	expect_rules(c, f, "after bind", NULL, 0);

	/* add Listing 1 and the copy rule, passing the socket */
	const struct santa_rule *two[] = { hello, query };
	rc = santa_add(c, f->srv, 0, two, 2, ids);
	if (!check(rc == 0 && ids[0] != 0 && ids[1] != 0 && ids[0] != ids[1],
	           "%s: santa_add(Hello->COMSYS, query copy rule): rc=%d ids %" PRIu64 " %" PRIu64 " %s", f->name, rc,
	           ids[0], ids[1], why(c, rc)))
		goto out;
	uint64_t r = health_rules(c);
	check(r == base_rules + 2, "%s: health counts %" PRIu64 " rules after the add (want %" PRIu64 ")", f->name, r,
	      base_rules + 2);

	/* on the wire: the kernel answers, the application socket stays empty */
	expect_reply(f, "Listing 1", "Hello", 5, "COMSYS", 6);
	expect_reply(f, "Listing 1", "Hello", 5, "COMSYS", 6);
	expect_reply(f, "Listing 1, longer request", "Hello, santa", 12, "COMSYS", 6);
	hits_hello += 3, bytes_hello += 3 * (f->hdr + 6);
	expect_reply(f, "copy rule", "\x12\x34QRYabcd", 9, "\x12\x34" "ANSabcd", 9);
	expect_reply(f, "copy rule", "\xfe\x01QRYwxyz-trailer", 17, "\xfe\x01" "ANSwxyz", 9);
	hits_query += 2, bytes_query += 2 * (f->hdr + 9);
	expect_quiet(f, "kernel answers");

	struct want_rule listed[] = { { .id = ids[0], .version = 1, .reply_len = 6 }, { .id = ids[1], .version = 1, .reply_len = 9 } };
	expect_rules(c, f, "after add", listed, 2);
	expect_stats(c, f, "Listing 1", ids[0], hits_hello, bytes_hello);
	expect_stats(c, f, "copy rule", ids[1], hits_query, bytes_query);

	/* modify Listing 1 in place: same id, version 2, the new reply on the wire */
	rc = santa_modify(c, -1, f->cookie, ids[0], modified);
	check(rc == 0, "%s: santa_modify(rule %" PRIu64 ", Hello->MODIFIED) by cookie: rc=%d %s", f->name, ids[0], rc,
	      why(c, rc));
	listed[0] = (struct want_rule){ .id = ids[0], .version = 2, .reply_len = 8 };
	expect_rules(c, f, "after modify", listed, 2);
	expect_reply(f, "modified rule", "Hello", 5, "MODIFIED", 8);
	expect_reply(f, "modified rule", "Hello", 5, "MODIFIED", 8);
	hits_hello += 2, bytes_hello += 2 * (f->hdr + 8);
	expect_quiet(f, "after modify");
	expect_stats(c, f, "modified rule (counts kept)", ids[0], hits_hello, bytes_hello);
	expect_stats(c, f, "rule set total = answered requests", 0, hits_hello + hits_query, bytes_hello + bytes_query);

	/* refusals change nothing: an invalid rule (also next to a valid one), an unknown id */
	uint64_t junk[2] = { 0, 0 };
	const struct santa_rule *one_bad[] = { bad }, *ok_and_bad[] = { ping, bad };
	char what[160];
	errno = 0;
	rc = santa_add(c, f->srv, 0, one_bad, 1, junk);
	e = errno;
	snprintf(what, sizeof what, "%s: santa_add(9 copy segments)", f->name);
	expect_refused(c, what, rc, e, SANTA_STATUS_INVALID, EINVAL, "invalid rule");
	errno = 0;
	rc = santa_add(c, -1, f->cookie, ok_and_bad, 2, junk);
	e = errno;
	snprintf(what, sizeof what, "%s: santa_add(valid Ping rule, 9 copy segments)", f->name);
	expect_refused(c, what, rc, e, SANTA_STATUS_INVALID, EINVAL, "invalid rule");
	errno = 0;
	rc = santa_modify(c, -1, f->cookie, ids[1] + 1000, ping);
	e = errno;
	snprintf(what, sizeof what, "%s: santa_modify(unknown rule %" PRIu64 ")", f->name, ids[1] + 1000);
	expect_refused(c, what, rc, e, SANTA_STATUS_NOT_FOUND, ENOENT, NULL);
	errno = 0;
	rc = santa_modify(c, -1, f->cookie, 0, ping);
	e = errno;
	snprintf(what, sizeof what, "%s: santa_modify(rule 0)", f->name);
	expect_refused(c, what, rc, e, SANTA_STATUS_INVALID, EINVAL, "rule 0: no id");
	errno = 0;
	rc = santa_replace(c, -1, f->cookie, ok_and_bad, 2, junk);
	e = errno;
	snprintf(what, sizeof what, "%s: santa_replace(valid Ping rule, 9 copy segments)", f->name);
	expect_refused(c, what, rc, e, SANTA_STATUS_INVALID, EINVAL, "invalid rule");
	expect_rules(c, f, "after the refusals", listed, 2);
	r = health_rules(c);
	check(r == base_rules + 2, "%s: health counts %" PRIu64 " rules after the refusals (want %" PRIu64 ")", f->name,
	      r, base_rules + 2);
	expect_app(f, "the refused Ping rule is not installed", "Ping", 4);

	/* delete Listing 1: Hello now reaches the application */
	rc = santa_delete(c, f->srv, 0, &ids[0], 1);
	check(rc == 0, "%s: santa_delete(rule %" PRIu64 "): rc=%d %s", f->name, ids[0], rc, why(c, rc));
	expect_rules(c, f, "after delete", &listed[1], 1);
	expect_app(f, "deleted rule", "Hello", 5);
	expect_reply(f, "copy rule after the delete", "\x00\x07QRY1234", 9, "\x00\x07" "ANS1234", 9);
	hits_query++, bytes_query += f->hdr + 9;
	expect_quiet(f, "after delete");
	expect_stats(c, f, "rule set total after delete", 0, hits_query, bytes_query);
	errno = 0;
	rc = santa_stats(c, -1, f->cookie, ids[0], NULL, NULL);
	e = errno;
	snprintf(what, sizeof what, "%s: santa_stats(deleted rule %" PRIu64 ")", f->name, ids[0]);
	expect_refused(c, what, rc, e, SANTA_STATUS_NOT_FOUND, ENOENT, NULL);

	/* replace: new ids, the old rules gone */
	const struct santa_rule *repl[] = { ping, again };
	rc = santa_replace(c, f->srv, 0, repl, 2, new_ids);
	check(rc == 0 && new_ids[0] && new_ids[1] && new_ids[0] != new_ids[1] && new_ids[0] != ids[0] &&
	              new_ids[0] != ids[1] && new_ids[1] != ids[0] && new_ids[1] != ids[1],
	      "%s: santa_replace(Ping->Pong prio 5, Hello->AGAIN): rc=%d new ids %" PRIu64 " %" PRIu64
	      " (old %" PRIu64 " %" PRIu64 ") %s",
	      f->name, rc, new_ids[0], new_ids[1], ids[0], ids[1], why(c, rc));
	struct want_rule replaced[] = {
		{ .id = new_ids[0], .version = 1, .priority = 5, .reply_len = 4, .expires = ping_expires, .tag = PING_TAG },
		{ .id = new_ids[1], .version = 1, .reply_len = 5 },
	};
	expect_rules(c, f, "after replace", replaced, 2);
	r = health_rules(c);
	check(r == base_rules + 2, "%s: health counts %" PRIu64 " rules after the replace (want %" PRIu64 ")", f->name,
	      r, base_rules + 2);
	expect_reply(f, "replaced rule set", "Ping", 4, "Pong", 4);
	expect_reply(f, "replaced rule set", "Hello", 5, "AGAIN", 5);
	expect_quiet(f, "after replace");
	expect_app(f, "the replaced copy rule is gone", "\x12\x34QRYabcd", 9);
	errno = 0;
	rc = santa_stats(c, -1, f->cookie, ids[1], NULL, NULL);
	e = errno;
	snprintf(what, sizeof what, "%s: santa_stats(replaced rule %" PRIu64 ")", f->name, ids[1]);
	expect_refused(c, what, rc, e, SANTA_STATUS_NOT_FOUND, ENOENT, NULL);
	expect_stats(c, f, "Ping rule", new_ids[0], 1, f->hdr + 4);
	expect_stats(c, f, "rule set total after replace", 0, 2, 2 * f->hdr + 4 + 5);

	/* a masked condition, a masked copy and length bounds, added and deleted again */
	const struct santa_rule *one_masked[] = { masked };
	rc = santa_add(c, -1, f->cookie, one_masked, 1, &id_masked);
	check(rc == 0 && id_masked != 0, "%s: santa_add(masked rule): rc=%d id %" PRIu64 " %s", f->name, rc, id_masked,
	      why(c, rc));
	struct want_rule with_masked[] = { replaced[0], replaced[1],
		                           { .id = id_masked, .version = 1, .reply_len = 6, .min_len = 7, .max_len = 7, .tag = MASKED_TAG } };
	expect_rules(c, f, "after the masked rule's add", with_masked, 3);
	expect_reply(f, "masked rule, ignored bits set", "\x12\x34\x7f\xffMSK", 7, "\x12\x34\x84\x01OK", 6);
	expect_reply(f, "masked rule, ignored bits clear", "\x56\x78\x00\x00MSK", 7, "\x56\x78\x84\x00OK", 6);
	expect_quiet(f, "masked rule");
	expect_app(f, "masked rule, a compared bit differs", "\x12\x34\x80\x00MSK", 7);
	expect_app(f, "masked rule, a request over max_len", "\x12\x34\x00\x00MSK!", 8);
	expect_tagged(c, f, PING_TAG, new_ids[0]);
	expect_tagged(c, f, MASKED_TAG, id_masked);
	size_t deleted = 0;
	rc = santa_delete_tagged(c, -1, f->cookie, MASKED_TAG, &deleted);
	check(rc == 0 && deleted == 1, "%s: santa_delete_tagged(\"" MASKED_TAG "\"): rc=%d, %zu deleted (want 1) %s", f->name,
	      rc, deleted, why(c, rc));
	rc = santa_delete_tagged(c, -1, f->cookie, MASKED_TAG, &deleted);
	check(rc == 0 && deleted == 0, "%s: santa_delete_tagged(\"" MASKED_TAG "\") again: rc=%d, %zu deleted (want 0) %s",
	      f->name, rc, deleted, why(c, rc));
	expect_rules(c, f, "after the masked rule's delete", replaced, 2);

	/* guards: only the rule whose guard holds answers; with it gone the request reaches the application */
	const struct santa_rule *guarded[] = { guard_moved, guard_holds };
	rc = santa_add(c, -1, f->cookie, guarded, 2, ids_guarded);
	check(rc == 0 && ids_guarded[0] && ids_guarded[1], "%s: santa_add(guarded rules): rc=%d %s", f->name, rc, why(c, rc));
	expect_reply(f, "guarded rules, the one whose guard holds", "GRD", 3, "fresh", 5);
	expect_quiet(f, "guarded rules");
	rc = santa_delete(c, -1, f->cookie, &ids_guarded[1], 1);
	check(rc == 0, "%s: santa_delete(rule whose guard holds): rc=%d %s", f->name, rc, why(c, rc));
	expect_app(f, "a rule whose guard does not hold", "GRD", 3);
	rc = santa_delete(c, -1, f->cookie, &ids_guarded[0], 1);
	check(rc == 0, "%s: santa_delete(rule whose guard does not hold): rc=%d %s", f->name, rc, why(c, rc));
	expect_rules(c, f, "after the guarded rules' delete", replaced, 2);

	/* miss samples: 64 bytes of every request no rule answers */
	sub = santa_connect(NULL);
	if (!check(sub != NULL, "%s: santa_connect for the subscription %s", f->name, sub ? "" : santa_error(NULL)))
		goto unbind;
	rc = santa_subscribe(sub, -1, f->cookie, 64, 1000);
	if (!check(rc == 0, "%s: santa_subscribe(sample_bytes 64, rate 1000): rc=%d %s", f->name, rc, why(sub, rc)))
		goto unbind;
	uint8_t big[200], buf[SANTA_MAX_SAMPLE];
	for (size_t i = 0; i < sizeof big; i++)
		big[i] = (uint8_t)(i * 7 + 3);
	big[0] = 'x'; /* not "Ping", not "Hello" */
	struct {
		const char *what;
		const void *req;
		size_t len;
		bool answered; /* by a rule: no sample */
	} misses[] = {
		{ "a 200-byte miss", big, 200, false },
		{ "a 10-byte miss", "nomatch-10", 10, false },
		{ "an answered Ping", "Ping", 4, true },
		{ "a 64-byte miss", big + 100, 64, false },
		{ "a 1-byte miss", "H", 1, false },
	};
	for (size_t i = 0; i < sizeof misses / sizeof misses[0]; i++) {
		if (misses[i].answered) {
			expect_reply(f, "while subscribed", misses[i].req, misses[i].len, "Pong", 4);
			continue;
		}
		expect_app(f, misses[i].what, misses[i].req, misses[i].len);
		size_t slen = SIZE_MAX, want = misses[i].len < 64 ? misses[i].len : 64;
		uint32_t rlen = UINT32_MAX;
		memset(buf, 0, sizeof buf);
		rc = santa_next_sample(sub, buf, sizeof buf, &slen, &rlen, SAMPLE_TIMEOUT_MS);
		check(rc == 0 && slen == want && rlen == misses[i].len && same(buf, (ssize_t)slen, misses[i].req, want),
		      "%s: santa_next_sample after %s: rc=%d len=%zu request_len=%" PRIu32 " bytes %s (want len %zu, "
		      "request_len %zu, bytes %s) %s",
		      f->name, misses[i].what, rc, slen, rlen, show(buf, rc == 0 ? (ssize_t)(slen < 64 ? slen : 64) : -1),
		      want, misses[i].len, show(misses[i].req, (ssize_t)want), why(sub, rc));
	}
	size_t slen = 0;
	errno = 0;
	rc = santa_next_sample(sub, buf, sizeof buf, &slen, NULL, 300);
	e = errno;
	check(rc == -1 && e == ETIMEDOUT, "%s: santa_next_sample with no miss: rc=%d errno=%s (want ETIMEDOUT) %s", f->name,
	      rc, strerror(e), why(sub, rc));
	santa_close(sub);
	sub = NULL;

unbind:
	/* unbind: the rule set and its rules are gone */
	rc = santa_unbind(c, -1, f->cookie);
	check(rc == 0, "%s: santa_unbind by cookie: rc=%d %s", f->name, rc, why(c, rc));
	struct santa_rule_info *infos = NULL;
	size_t n = 0;
	errno = 0;
	rc = santa_list_rules(c, -1, f->cookie, &infos, &n);
	e = errno;
	santa_rule_info_free(infos);
	snprintf(what, sizeof what, "%s: santa_list_rules after unbind", f->name);
	expect_refused(c, what, rc, e, SANTA_STATUS_NOT_FOUND, ENOENT, NULL);
	r = health_rules(c);
	check(r == base_rules, "%s: health counts %" PRIu64 " rules after unbind (want %" PRIu64 ")", f->name, r,
	      base_rules);
	expect_app(f, "unbound socket", "Ping", 4);

	/* the rules die with the socket */
	const struct santa_rule *listing1[] = { hello };
	rc = santa_add(c, f->srv, 0, listing1, 1, &id3);
	check(rc == 0 && id3 != 0, "%s: santa_add after unbind binds the socket again: rc=%d id %" PRIu64 " %s", f->name,
	      rc, id3, why(c, rc));
	struct want_rule last[] = { { .id = id3, .version = 1, .reply_len = 6 } };
	expect_rules(c, f, "after the second add", last, 1);
	expect_reply(f, "rebound socket", "Hello", 5, "COMSYS", 6);
	close(f->srv);
	f->srv = -1;
	int64_t start = now_ms(), waited;
	for (;;) {
		infos = NULL;
		errno = 0;
		rc = santa_list_rules(c, -1, f->cookie, &infos, &n);
		e = errno;
		santa_rule_info_free(infos);
		waited = now_ms() - start;
		if (rc < 0 || waited > GONE_TIMEOUT_MS)
			break;
		struct timespec ts = { 0, 20 * 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	snprintf(what, sizeof what, "%s: santa_list_rules of the closed socket (after %lld ms)", f->name,
	         (long long)waited);
	expect_refused(c, what, rc, e, SANTA_STATUS_NOT_FOUND, ENOENT, NULL);
	r = health_rules(c);
	check(r == base_rules, "%s: health counts %" PRIu64 " rules after the close (want %" PRIu64 ")", f->name, r,
	      base_rules);
	/* a new socket on the same port starts without rules */
	f->srv = server_socket(f);
	if (check(f->srv >= 0, "%s: a new application socket on %s %s", f->name, addr_text(&f->addr),
	          f->srv >= 0 ? "" : strerror(errno)))
		expect_app(f, "new socket on the port", "Hello", 5);

out:
	santa_close(sub);
	if (f->srv >= 0)
		close(f->srv);
	f->srv = -1;
	santa_rule_free(hello);
	santa_rule_free(query);
	santa_rule_free(ping);
	santa_rule_free(modified);
	santa_rule_free(again);
	santa_rule_free(bad);
	santa_rule_free(masked);
	santa_rule_free(guard_holds);
	santa_rule_free(guard_moved);
}

/* ---- main ------------------------------------------------------------------- */

static bool parse_addr(struct fam *f, const char *text, int port)
{
	memset(&f->addr, 0, sizeof f->addr);
	if (f->af == AF_INET) {
		struct sockaddr_in *a = (void *)&f->addr;
		a->sin_family = AF_INET;
		a->sin_port = htons((uint16_t)port);
		f->addrlen = sizeof *a;
		return inet_pton(AF_INET, text, &a->sin_addr) == 1;
	}
	struct sockaddr_in6 *a = (void *)&f->addr;
	a->sin6_family = AF_INET6;
	a->sin6_port = htons((uint16_t)port);
	f->addrlen = sizeof *a;
	return inet_pton(AF_INET6, text, &a->sin6_addr) == 1;
}

int main(void)
{
	static const char *const vars[] = { "SANTA_SOCKET", "SANTA_SERVER_ADDR4", "SANTA_SERVER_ADDR6",
		                            "SANTA_CLIENT_NS" };
	char missing[128] = "";
	struct fam fams[2] = {
		{ .name = "IPv4", .af = AF_INET, .hdr = 14 + 20 + 8, .srv = -1 },
		{ .name = "IPv6", .af = AF_INET6, .hdr = 14 + 40 + 8, .srv = -1 },
	};
	char nspath[4096];

	for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
		const char *v = getenv(vars[i]);
		if (!v || !*v)
			snprintf(missing + strlen(missing), sizeof missing - strlen(missing), " %s", vars[i]);
	}
	if (missing[0]) {
		fprintf(stderr,
		        "test_integration: missing environment:%s\n"
		        "It runs as root in the server network namespace of a veth testbed with santad on the server veth:\n"
		        "  SANTA_SOCKET=santad's control socket SANTA_SERVER_ADDR4=... SANTA_SERVER_ADDR6=... (server veth)\n"
		        "  SANTA_CLIENT_NS=client namespace name  nsenter --net=/run/netns/SERVER_NS test_integration\n",
		        missing);
		return 2;
	}
	if (!parse_addr(&fams[0], getenv("SANTA_SERVER_ADDR4"), PORT4) ||
	    !parse_addr(&fams[1], getenv("SANTA_SERVER_ADDR6"), PORT6)) {
		fprintf(stderr, "test_integration: SANTA_SERVER_ADDR4 (%s) or SANTA_SERVER_ADDR6 (%s) is not an address\n",
		        getenv("SANTA_SERVER_ADDR4"), getenv("SANTA_SERVER_ADDR6"));
		return 2;
	}
	snprintf(nspath, sizeof nspath, "/run/netns/%s", getenv("SANTA_CLIENT_NS"));
	if ((client_ns = open(nspath, O_RDONLY | O_CLOEXEC)) < 0 ||
	    (own_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC)) < 0) {
		fprintf(stderr, "test_integration: %s: %s\n", client_ns < 0 ? nspath : "/proc/self/ns/net", strerror(errno));
		if (client_ns >= 0)
			close(client_ns);
		return 2;
	}
	signal(SIGALRM, on_alarm);
	alarm(WATCHDOG_SECONDS);

	struct santa_client *c = santa_connect(NULL);
	if (check(c != NULL, "santa_connect($SANTA_SOCKET=%s) %s", getenv("SANTA_SOCKET"), c ? "" : santa_error(NULL))) {
		test_health(c);
		struct santa_rule *hello = rule_hello("COMSYS");
		if (hello)
			test_unknown_cookie(c, hello);
		santa_rule_free(hello);
		for (size_t i = 0; i < 2; i++)
			test_family(c, &fams[i]);
		santa_close(c);
	}
	close(client_ns);
	close(own_ns);
	printf("test_integration: %d checks, %d failed\n", n_checks, n_failed);
	return n_failed ? 1 : 0;
}
