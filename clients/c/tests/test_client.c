/*
 * test_client.c - the client against a fake santad over a real Unix socket:
 * framing, fd passing, seq checks, santad's refusals, local errors and miss
 * samples. The fake answers one byte per write, so the client must cope
 * with short reads.
 *
 *   test_client               run the tests (the fake runs in a thread)
 *   test_client --serve PATH  only run the fake santad at PATH (tests/listing1.sh)
 *
 * The fake's rules of thumb: rule ids count from 1; rule n has 10n hits and
 * 100n bytes; a cookie of 666 gets an answer with the wrong seq, 667 gets
 * the connection closed, 668 the answer to a request santad cannot parse.
 * With drop_next set it closes the next connection at once, as a santad
 * that stops; with refuse_next it answers it quota (seq 0) and closes it, as
 * santad past quota.connections.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <netinet/in.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "check.h"
#include "internal.h"

#define MAX_CONNS 8
#define MAX_RULES 16

struct fake {
	int listen_fd;
	int stop[2]; /* a byte on stop[1] ends the server */
	uint64_t cookie; /* the one rule set the fake keeps */
	uint64_t next_id;
	struct sp_rule rules[MAX_RULES]; /* id, version, reply_len, priority only */
	size_t nrules;
	_Atomic int requests; /* frames received, to tell whether a call reached santad */
	_Atomic int fd_misplaced; /* fds that arrived after a frame's first read */
	_Atomic int accepted; /* connections accepted */
	_Atomic int drop_next, refuse_next;
};

static uint64_t socket_cookie(int fd)
{
	uint64_t cookie = 0;
	socklen_t len = sizeof cookie;
	getsockopt(fd, SOL_SOCKET, SO_COOKIE, &cookie, &len);
	return cookie;
}

/* Reads len bytes with recvmsg, collecting a passed fd; *first says whether
 * this is the frame's first read, where an fd belongs. */
static int fake_read(struct fake *f, int conn, void *buf, size_t len, int *fd, bool first)
{
	for (size_t got = 0; got < len;) {
		union {
			char buf[CMSG_SPACE(sizeof(int))];
			struct cmsghdr align;
		} ctl;
		struct iovec iov = { .iov_base = (char *)buf + got, .iov_len = len - got };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl.buf, .msg_controllen = sizeof ctl };
		ssize_t n = recvmsg(conn, &mh, MSG_CMSG_CLOEXEC);
		if (n <= 0)
			return -1;
		struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
		if (cm && cm->cmsg_type == SCM_RIGHTS) {
			if (!first || got > 0 || *fd >= 0)
				f->fd_misplaced++;
			if (*fd >= 0)
				close(*fd);
			memcpy(fd, CMSG_DATA(cm), sizeof *fd);
		}
		got += (size_t)n;
	}
	return 0;
}

/* Sends a message one byte per write. */
static int fake_send(int conn, const struct sp_msg *m)
{
	uint8_t *body;
	size_t len;
	char err[256];

	if (santa_proto_encode(m, &body, &len, err, sizeof err) < 0) {
		fprintf(stderr, "fake: encode: %s\n", err);
		return -1;
	}
	uint8_t hdr[4] = { (uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len };
	int rc = 0;
	for (size_t i = 0; i < 4 + len && rc == 0; i++)
		rc = send(conn, i < 4 ? &hdr[i] : &body[i - 4], 1, MSG_NOSIGNAL) == 1 ? 0 : -1;
	free(body);
	return rc;
}

static struct sp_rule *find_rule(struct fake *f, uint64_t id)
{
	for (size_t i = 0; i < f->nrules; i++)
		if (f->rules[i].id == id)
			return &f->rules[i];
	return NULL;
}

static uint64_t refuse(struct sp_msg *resp, uint64_t status, char *why)
{
	resp->error = why;
	return status;
}

/* Keeps what santad's list reports of a rule added or modified. */
static void keep_listed_fields(struct sp_rule *kept, const struct sp_rule *r)
{
	kept->reply_len = r->reply_len;
	kept->priority = r->priority;
	kept->min_len = r->min_len;
	kept->max_len = r->max_len;
	kept->expires = r->expires;
	kept->close = r->close;
}

/* Fills resp for req the way santad would; a non-zero return is a status.
 * passed says the request came with a socket fd. */
static uint64_t fake_answer(struct fake *f, const struct sp_msg *req, uint64_t cookie, bool passed, struct sp_msg *resp,
                            struct sp_socket_info *si, struct sp_rule_stats *st, struct sp_daemon_info *d,
                            uint64_t *ids)
{
	static struct sp_interface lo = { .name = "lo", .mode = "generic" };
	bool targeted = req->op != SP_OP_HEALTH && req->op != SP_OP_BIND;

	if (targeted && cookie == 0)
		return refuse(resp, 2, "no target: pass a socket or name its cookie");
	bool binds = passed && (req->op == SP_OP_ADD || req->op == SP_OP_REPLACE || req->op == SP_OP_MODIFY);
	if (targeted && cookie != f->cookie && !binds)
		return refuse(resp, 4, "no rule set for that socket");
	switch (req->op) {
	case SP_OP_HEALTH:
		*d = (struct sp_daemon_info){ .version = "fake-1.0", .protocol = 1, .pid = (uint32_t)getpid(),
			                      .interfaces = &lo, .ninterfaces = 1, .uid = (uint32_t)getuid(),
			                      .rules = f->nrules, .sockets = f->cookie != 0,
			                      .quota_rulesets = 64, .used_rulesets = f->cookie != 0 };
		resp->daemon = d;
		return 0;
	case SP_OP_BIND:
		if (cookie == 0)
			return refuse(resp, 2, "bind: pass the socket");
		*si = (struct sp_socket_info){ .cookie = cookie, .family = 4, .protocol = 17, .created = f->cookie != cookie };
		if (f->cookie != cookie)
			f->nrules = 0;
		f->cookie = cookie;
		resp->sockets = si;
		resp->nsockets = 1;
		return 0;
	case SP_OP_UNBIND:
		f->cookie = 0;
		f->nrules = 0;
		return 0;
	case SP_OP_REPLACE:
		f->nrules = 0;
		/* fall through */
	case SP_OP_ADD:
		f->cookie = cookie;
		if (f->nrules + req->nrules > MAX_RULES)
			return refuse(resp, 6, "too many rules");
		for (size_t i = 0; i < req->nrules; i++) {
			const struct sp_rule *r = &req->rules[i];
			if (!r->nconditions || !r->nprocessors)
				return refuse(resp, 2, "invalid rule");
			ids[i] = ++f->next_id;
			f->rules[f->nrules++] = (struct sp_rule){ .id = ids[i], .version = 1 };
			keep_listed_fields(&f->rules[f->nrules - 1], r);
		}
		resp->ids = ids;
		resp->nids = req->nrules;
		return 0;
	case SP_OP_MODIFY:
		for (size_t i = 0; i < req->nrules; i++) {
			struct sp_rule *r = find_rule(f, req->rules[i].id);
			if (!r)
				return refuse(resp, 2, "no such rule");
			r->version++;
			keep_listed_fields(r, &req->rules[i]);
			ids[i] = r->id;
		}
		resp->ids = ids;
		resp->nids = req->nrules;
		return 0;
	case SP_OP_DELETE:
		for (size_t i = 0; i < req->nids; i++) {
			struct sp_rule *r = find_rule(f, req->ids[i]);
			if (!r)
				return refuse(resp, 4, "no such rule");
			*r = f->rules[--f->nrules];
		}
		return 0;
	case SP_OP_STATS:
		for (size_t i = 0; i < (req->nids ? req->nids : f->nrules); i++) {
			uint64_t id = req->nids ? req->ids[i] : f->rules[i].id;
			if (!find_rule(f, id))
				return refuse(resp, 4, "no such rule");
			st[i] = (struct sp_rule_stats){ .id = id, .hits = 10 * id, .bytes = 100 * id };
			resp->nstats++;
		}
		resp->stats = st;
		return 0;
	case SP_OP_LIST_RULES:
		resp->rules = f->rules;
		resp->nrules = f->nrules;
		return 0;
	case SP_OP_SUBSCRIBE:
		return 0;
	default:
		return refuse(resp, 9, "unknown op");
	}
}

/* Serves one request on conn; -1 closes the connection. */
static int fake_serve(struct fake *f, int conn)
{
	uint8_t hdr[4], *body;
	int fd = -1, rc = -1;
	struct sp_msg req, resp;
	struct sp_socket_info si;
	struct sp_rule_stats st[MAX_RULES];
	struct sp_daemon_info d;
	uint64_t ids[MAX_RULES];
	char err[256];

	if (fake_read(f, conn, hdr, 4, &fd, true) < 0)
		goto out;
	uint32_t len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
	if (!(body = malloc(len)) || fake_read(f, conn, body, len, &fd, false) < 0) {
		free(body);
		goto out;
	}
	f->requests++;
	resp = (struct sp_msg){ .v = 1 };
	int bad = santa_proto_decode(body, len, &req, err, sizeof err);
	free(body);
	if (bad == 0 && req.socket == 668) {
		santa_proto_msg_free(&req);
		snprintf(err, sizeof err, "malformed message: unknown message key 99");
		bad = -1;
	}
	if (bad < 0) { /* like santad: status malformed, no op, no seq */
		resp.status = 1;
		resp.error = err;
		rc = fake_send(conn, &resp);
		goto out;
	}
	resp.op = req.op;
	resp.seq = req.seq;
	uint64_t cookie = fd >= 0 ? socket_cookie(fd) : req.socket;
	if (fd >= 0 && req.socket && req.socket != cookie) {
		resp.status = 2;
		resp.error = "the passed socket and the named cookie disagree";
	} else if (cookie == 667) {
		santa_proto_msg_free(&req);
		goto out;
	} else {
		if (cookie == 666)
			resp.seq++;
		resp.status = fake_answer(f, &req, cookie, fd >= 0, &resp, &si, st, &d, ids);
	}
	rc = fake_send(conn, &resp);
	if (rc == 0 && req.op == SP_OP_SUBSCRIBE && resp.status == 0) {
		uint8_t big[200];
		for (size_t i = 0; i < sizeof big; i++)
			big[i] = (uint8_t)i;
		struct sp_msg ev = { .v = 1, .op = SP_OP_SAMPLE, .seq = req.seq, .socket = cookie, .request_len = 1000,
			             .sample = { big, sizeof big } };
		rc = fake_send(conn, &ev);
		/* the most santad sends: a whole request window */
		uint8_t window[SANTA_REQUEST_WINDOW];
		memset(window, 'w', sizeof window);
		ev.sample = (struct sp_bytes){ window, sizeof window };
		ev.request_len = sizeof window;
		rc |= fake_send(conn, &ev);
		ev.sample = (struct sp_bytes){ (uint8_t *)"abc", 3 };
		ev.request_len = 3;
		rc |= fake_send(conn, &ev);
	}
	santa_proto_msg_free(&req);
out:
	if (fd >= 0)
		close(fd);
	return rc;
}

/* Serves connections until a byte arrives on f->stop[0]. */
static void *fake_run(void *arg)
{
	struct fake *f = arg;
	struct pollfd p[2 + MAX_CONNS];
	size_t n = 2;

	p[0] = (struct pollfd){ .fd = f->stop[0], .events = POLLIN };
	p[1] = (struct pollfd){ .fd = f->listen_fd, .events = POLLIN };
	while (poll(p, n, -1) >= 0 && !p[0].revents) {
		if (p[1].revents && n < 2 + MAX_CONNS) {
			int conn = accept4(f->listen_fd, NULL, NULL, SOCK_CLOEXEC);
			if (conn >= 0)
				f->accepted++;
			if (conn >= 0 && f->refuse_next) {
				struct sp_msg no = { .v = 1, .status = 5, .error = "uid 0 holds 64 connections to santad" };
				f->refuse_next = 0;
				fake_send(conn, &no);
				close(conn);
			} else if (conn >= 0 && f->drop_next) {
				f->drop_next = 0;
				close(conn);
			} else if (conn >= 0)
				p[n++] = (struct pollfd){ .fd = conn, .events = POLLIN };
		}
		for (size_t i = 2; i < n; i++) {
			if (p[i].revents && fake_serve(f, p[i].fd) < 0) {
				close(p[i].fd);
				p[i--] = p[--n];
			}
		}
	}
	for (size_t i = 2; i < n; i++)
		close(p[i].fd);
	return NULL;
}

static int fake_listen(struct fake *f, const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };

	*f = (struct fake){ .listen_fd = -1 };
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	unlink(path);
	if (pipe(f->stop) < 0 || (f->listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0 ||
	    bind(f->listen_fd, (struct sockaddr *)&sa, sizeof sa) < 0 || listen(f->listen_fd, 8) < 0) {
		perror("fake santad");
		return -1;
	}
	return 0;
}

/* ---- the tests ------------------------------------------------------------ */

static struct fake fake;

static int udp_socket(void)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0, "udp socket: %s", strerror(errno));
	return fd;
}

static struct santa_rule *hello_rule(void)
{
	struct santa_rule *r = santa_rule_new(6);
	santa_rule_match(r, 0, "Hello", 5);
	santa_rule_put(r, 0, "COMSYS", 6);
	return r;
}

static void test_connect(const char *path)
{
	char long_path[200];
	struct santa_client *c;

	errno = 0;
	CHECK(santa_connect("/nonexistent/santa.sock") == NULL && errno == ENOENT, "errno %d", errno);
	CHECK(strstr(santa_error(NULL), "/nonexistent/santa.sock: No such file"), "error \"%s\"", santa_error(NULL));
	memset(long_path, 'x', sizeof long_path - 1);
	long_path[sizeof long_path - 1] = '\0';
	errno = 0;
	CHECK(santa_connect(long_path) == NULL && errno == ENAMETOOLONG, "errno %d", errno);

	setenv(SANTA_SOCKET_ENV, path, 1);
	c = santa_connect(NULL);
	CHECK(c != NULL && santa_error(NULL)[0] == '\0', "connect via $SANTA_SOCKET: %s", santa_error(NULL));
	santa_close(c);
	unsetenv(SANTA_SOCKET_ENV);
	santa_close(NULL);
}

static void test_calls(const char *path)
{
	struct santa_client *c = santa_connect(path);
	struct santa_health h;
	struct santa_rule *r = hello_rule(), *bad = hello_rule();
	const struct santa_rule *one[] = { r }, *two[] = { r, r }, *poisoned[] = { bad };
	struct santa_rule_info *infos;
	uint64_t cookie = 0, ids[2] = { 0, 0 }, hits = 0, bytes = 0, del[] = { 1, 3 };
	size_t n;
	int udp = udp_socket();

	CHECK(c != NULL, "connect: %s", santa_error(NULL));
	CHECK(santa_fd(c) >= 0 && santa_fd(NULL) == -1, "santa_fd");
	CHECK(santa_health(c, &h) == 0, "health: %s", santa_error(c));
	CHECK(strcmp(h.version, "fake-1.0") == 0 && h.protocol == 1 && h.interfaces == 1 && h.uid == getuid(),
	      "health fields: %s %u %u", h.version, h.protocol, h.interfaces);
	CHECK(h.quota_rulesets == 64 && h.used_rulesets == 0, "health: rule-set quota %" PRIu64 ", used %" PRIu64,
	      h.quota_rulesets, h.used_rulesets);
	CHECK(santa_status(c) == SANTA_STATUS_OK && santa_error(c)[0] == '\0', "status after success");

	CHECK(santa_bind(c, udp, 64, 10, &cookie) == 0, "bind: %s", santa_error(c));
	CHECK(cookie == socket_cookie(udp) && cookie != 0, "bind cookie %llu", (unsigned long long)cookie);
	CHECK(santa_add(c, udp, 0, one, 1, ids) == 0 && ids[0] == 1, "add by fd: %s", santa_error(c));
	CHECK(santa_add(c, -1, cookie, two, 2, ids) == 0 && ids[0] == 2 && ids[1] == 3, "add by cookie: %s",
	      santa_error(c));
	CHECK(santa_add(c, udp, cookie, one, 1, NULL) == 0, "add by fd and cookie: %s", santa_error(c));
	CHECK(santa_stats(c, -1, cookie, 2, &hits, &bytes) == 0 && hits == 20 && bytes == 200, "stats of rule 2");
	CHECK(santa_stats(c, udp, 0, 0, &hits, NULL) == 0 && hits == 100, "stats sum: %llu", (unsigned long long)hits);
	CHECK(santa_rule_priority(r, 7) == 0 && santa_rule_length(r, 5, 9) == 0 && santa_rule_expires(r, 1234567890) == 0 &&
	              santa_rule_close(r, 1) == 0 && santa_modify(c, -1, cookie, 2, r) == 0,
	      "modify: %s", santa_error(c));
	CHECK(santa_list_rules(c, -1, cookie, &infos, &n) == 0 && n == 4, "list: %s", santa_error(c));
	CHECK(n == 4 && infos[1].id == 2 && infos[1].version == 2 && infos[1].priority == 7 && infos[0].reply_len == 6,
	      "list entries");
	CHECK(n == 4 && infos[1].min_len == 5 && infos[1].max_len == 9 && infos[1].expires == 1234567890 &&
	              infos[1].close == 1 && infos[0].min_len == 0 && infos[0].expires == 0 && infos[0].close == 0,
	      "list entries: length bounds, expires, close");
	santa_rule_info_free(infos);
	CHECK(santa_delete(c, -1, cookie, del, 2) == 0, "delete: %s", santa_error(c));
	CHECK(santa_list_rules(c, -1, cookie, &infos, &n) == 0 && n == 2, "list after delete");
	santa_rule_info_free(infos);
	CHECK(santa_replace(c, udp, 0, NULL, 0, NULL) == 0, "replace with nothing: %s", santa_error(c));
	CHECK(santa_list_rules(c, -1, cookie, &infos, &n) == 0 && n == 0 && infos == NULL, "list after replace");

	/* santad's refusals */
	errno = 0;
	CHECK(santa_stats(c, -1, cookie, 99, &hits, NULL) == -1 && errno == ENOENT, "stats of a missing rule");
	CHECK(santa_status(c) == SANTA_STATUS_NOT_FOUND, "status %d", santa_status(c));
	CHECK(strcmp(santa_error(c), "stats: no such rule (not found)") == 0, "error \"%s\"", santa_error(c));
	errno = 0;
	CHECK(santa_modify(c, -1, cookie, 42, r) == -1 && errno == EINVAL && santa_status(c) == SANTA_STATUS_INVALID,
	      "modify of a missing rule");
	/* no rule id: santad answers, as it does the Go and Python clients */
	int asked = fake.requests;
	errno = 0;
	CHECK(santa_modify(c, udp, 0, 0, r) == -1 && errno == EINVAL && santa_status(c) == SANTA_STATUS_INVALID &&
	          fake.requests == asked + 1,
	      "modify without id: %s", santa_error(c));

	/* local failures, which must not reach santad */
	int before = fake.requests;
	errno = 0;
	/* in the Go and Python clients' words (docs/api.md) */
	CHECK(santa_unbind(c, -1, 0) == -1 && errno == EINVAL && santa_status(c) == SANTA_STATUS_LOCAL &&
	          strcmp(santa_error(c), "unbind: no target socket: pass the socket's fd or name its cookie") == 0,
	      "no target: %s", santa_error(c));
	santa_rule_put(bad, 6, "!", 1);
	CHECK(santa_add(c, udp, 0, poisoned, 1, ids) == -1 && errno == EINVAL &&
	          strstr(santa_error(c), "add: rule 0: invalid rule: processor 1 (put): writes reply bytes 6..7"),
	      "poisoned rule: %s", santa_error(c));
	CHECK(santa_bind(c, -1, 0, 0, NULL) == -1 && errno == EINVAL &&
	          strstr(santa_error(c), "bind: no target socket: bind needs the socket's fd"),
	      "bind without fd: %s", santa_error(c));
	CHECK(santa_delete_tagged(c, -1, cookie, "", NULL) == -1 && errno == EINVAL, "delete by an empty tag");
	CHECK(santa_next_sample(c, NULL, 0, &n, NULL, 0) == -1 && errno == EINVAL, "sample without subscribe");
	CHECK(santa_health(NULL, &h) == -1 && errno == EINVAL, "NULL client");
	int closed = dup(udp);
	close(closed);
	CHECK(santa_add(c, closed, 0, one, 1, ids) == -1 && errno == EBADF &&
	          strstr(santa_error(c), "add: the target fd") && strstr(santa_error(c), "is not open"),
	      "bad fd: %s", santa_error(c));
	CHECK(fake.requests == before, "%d local failures reached santad", fake.requests - before);
	CHECK(santa_health(c, &h) == 0, "connection unusable after local failures: %s", santa_error(c));

	CHECK(santa_unbind(c, udp, 0) == 0, "unbind: %s", santa_error(c));
	CHECK(fake.fd_misplaced == 0, "%d fds arrived after a frame's first byte", fake.fd_misplaced);
	santa_rule_free(r);
	santa_rule_free(bad);
	santa_close(c);
	close(udp);
}

static void test_subscribe(const char *path)
{
	struct santa_client *c = santa_connect(path), *sub = santa_connect(path);
	struct santa_health h;
	uint8_t buf[8], whole[SANTA_MAX_SAMPLE];
	size_t len = 0;
	uint32_t request_len = 0;
	uint64_t cookie = 0;
	int udp = udp_socket();

	CHECK(c && sub, "connect");
	CHECK(santa_bind(c, udp, 0, 0, &cookie) == 0, "bind: %s", santa_error(c));
	CHECK(santa_subscribe(sub, -1, cookie, 32, 100) == 0, "subscribe: %s", santa_error(sub));
	CHECK(santa_next_sample(sub, buf, sizeof buf, &len, &request_len, 5000) == 0, "sample: %s", santa_error(sub));
	CHECK(len == 200 && request_len == 1000 && buf[0] == 0 && buf[7] == 7, "cut sample: len %zu", len);
	CHECK(santa_next_sample(sub, whole, sizeof whole, &len, &request_len, 5000) == 0 && len == SANTA_REQUEST_WINDOW &&
	      request_len == SANTA_REQUEST_WINDOW && whole[len - 1] == 'w',
	      "a whole request window fits a SANTA_MAX_SAMPLE buffer: len %zu", len);
	CHECK(santa_next_sample(sub, buf, sizeof buf, &len, NULL, -1) == 0 && len == 3 && memcmp(buf, "abc", 3) == 0,
	      "second sample");
	errno = 0;
	CHECK(santa_next_sample(sub, buf, sizeof buf, &len, NULL, 50) == -1 && errno == ETIMEDOUT, "timeout");
	CHECK(santa_health(sub, &h) == -1 && errno == EINVAL && strstr(santa_error(sub), "miss samples"),
	      "request on a subscribed connection: %s", santa_error(sub));
	CHECK(santa_subscribe(sub, -1, cookie, 32, 100) == -1 && errno == EINVAL, "second subscribe");
	CHECK(santa_unbind(c, -1, cookie) == 0, "unbind: %s", santa_error(c));
	santa_close(sub);
	santa_close(c);
	close(udp);
}

static void test_out_of_step(const char *path)
{
	struct santa_client *c = santa_connect(path);
	struct santa_health h;

	errno = 0;
	CHECK(santa_unbind(c, -1, 668) == -1 && errno == EPROTO && santa_status(c) == SANTA_STATUS_MALFORMED,
	      "unparsed request: %s", santa_error(c));
	CHECK(santa_health(c, &h) == 0, "connection unusable after a malformed answer: %s", santa_error(c));
	errno = 0;
	CHECK(santa_unbind(c, -1, 666) == -1 && errno == EPROTO && strstr(santa_error(c), "out of step"),
	      "wrong seq: %s", santa_error(c));
	int accepted = fake.accepted;
	CHECK(santa_health(c, &h) == 0 && santa_error(c)[0] == '\0', "after wrong seq: %s", santa_error(c));
	CHECK(fake.accepted == accepted + 1, "the call after an out-of-step answer did not connect again");
	santa_close(c);
}

/* Waits until santad's end of c's connection is closed (10 s at most). */
static void wait_closed(struct santa_client *c)
{
	struct pollfd p = { .fd = santa_fd(c), .events = POLLRDHUP };
	while (poll(&p, 1, 10000) < 0 && errno == EINTR)
		;
	CHECK(p.revents & (POLLRDHUP | POLLHUP), "the fake did not close the connection in 10 s");
}

static void test_redial(const char *path)
{
	struct santa_client *c;
	struct santa_health h;
	int accepted, requests;

	/* santad closed the connection (it stopped) before the request: sent
	 * again, once, on a new connection */
	fake.drop_next = 1;
	c = santa_connect(path);
	CHECK(c != NULL, "connect: %s", santa_error(NULL));
	wait_closed(c);
	accepted = fake.accepted, requests = fake.requests;
	CHECK(santa_health(c, &h) == 0 && santa_error(c)[0] == '\0' && santa_status(c) == SANTA_STATUS_OK,
	      "health after santad closed the connection: %s", santa_error(c));
	CHECK(fake.accepted == accepted + 1 && fake.requests == requests + 1, "%d connections and %d requests, want 1 and 1",
	      fake.accepted - accepted, fake.requests - requests);
	CHECK(santa_health(c, &h) == 0 && fake.accepted == accepted + 1, "the new connection was not kept");

	/* santad read the request and closed the connection: the outcome is
	 * unknown, nothing is resent, the next call connects again */
	requests = fake.requests;
	errno = 0;
	CHECK(santa_unbind(c, -1, 667) == -1 && errno == ECONNRESET && santa_status(c) == SANTA_STATUS_LOCAL &&
	          strstr(santa_error(c), "closed the connection") && strstr(santa_error(c), "outcome is unknown"),
	      "closed after the request: errno %d: %s", errno, santa_error(c));
	CHECK(fake.requests == requests + 1 && fake.accepted == accepted + 1, "the request was sent again");
	CHECK(santa_health(c, &h) == 0 && fake.accepted == accepted + 2, "the call after an unknown outcome: %s",
	      santa_error(c));
	santa_close(c);

	/* santad refused the connection (quota.connections) and closed it:
	 * the refusal is the error, no redial */
	fake.refuse_next = 1;
	c = santa_connect(path);
	CHECK(c != NULL, "connect: %s", santa_error(NULL));
	wait_closed(c);
	accepted = fake.accepted, requests = fake.requests;
	errno = 0;
	CHECK(santa_health(c, &h) == -1 && errno == EDQUOT && santa_status(c) == SANTA_STATUS_QUOTA &&
	          strstr(santa_error(c), "64 connections"),
	      "refused connection: errno %d: %s", errno, santa_error(c));
	CHECK(fake.accepted == accepted && fake.requests == requests, "the refused request was sent again");
	CHECK(santa_health(c, &h) == 0 && fake.accepted == accepted + 1, "the call after a refusal: %s", santa_error(c));
	santa_close(c);
}

/* santad is gone: the call names the lost connection and the failed
 * connect, and the client stays usable for a later call. */
static void test_redial_fails(void)
{
	char path[64];
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	struct santa_client *c;
	struct santa_health h;
	int l, conn;

	snprintf(path, sizeof path, "/tmp/santa-test-gone-%d.sock", (int)getpid());
	snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
	unlink(path);
	l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(l >= 0 && bind(l, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(l, 1) == 0, "listen: %s",
	      strerror(errno));
	c = santa_connect(path);
	CHECK(c != NULL, "connect: %s", santa_error(NULL));
	conn = accept(l, NULL, NULL);
	close(conn);
	close(l);
	unlink(path);
	wait_closed(c);
	for (int i = 0; i < 2; i++) {
		errno = 0;
		CHECK(santa_health(c, &h) == -1 && errno == ENOENT && strstr(santa_error(c), path) &&
		          strstr(santa_error(c), "was lost") && strstr(santa_error(c), "connecting again failed") &&
		          strstr(santa_error(c), "No such file"),
		      "call %d without santad: errno %d: %s", i, errno, santa_error(c));
		CHECK(santa_fd(c) == -1, "santa_fd %d with no connection", santa_fd(c));
	}
	CHECK(strstr(santa_error(c), "Broken pipe") == NULL, "the second call names the first's send error");
	santa_close(c);
}

static void test_names(void)
{
	CHECK(strcmp(santa_status_name(SANTA_STATUS_PERMISSION), "permission denied") == 0, "status name");
	CHECK(strcmp(santa_status_name(SANTA_STATUS_LOCAL), "local") == 0, "local name");
	CHECK(strcmp(santa_status_name(42), "unknown") == 0, "unknown name");
}

int main(int argc, char **argv)
{
	char path[64];
	pthread_t thread;

	if (argc == 3 && strcmp(argv[1], "--serve") == 0) {
		if (fake_listen(&fake, argv[2]) < 0)
			return 1;
		fake_run(&fake);
		return 0;
	}
	snprintf(path, sizeof path, "/tmp/santa-test-%d.sock", (int)getpid());
	if (fake_listen(&fake, path) < 0 || pthread_create(&thread, NULL, fake_run, &fake) != 0)
		return 1;
	test_connect(path);
	test_calls(path);
	test_subscribe(path);
	test_out_of_step(path);
	test_redial(path);
	test_redial_fails();
	test_names();
	if (write(fake.stop[1], "x", 1) != 1)
		return 1;
	pthread_join(thread, NULL);
	close(fake.listen_fd);
	close(fake.stop[0]);
	close(fake.stop[1]);
	unlink(path);
	return check_done("test_client");
}
