/*
 * client.c - the connection to santad and the operations on it.
 *
 * Every operation fills a struct sp_msg and goes through request(), which
 * frames it, passes the socket fd, reads the response and checks that it
 * answers this request. When santad has closed the connection (it stopped
 * or restarted), request() connects to the same path again (santa.h,
 * "Restarts of santad").
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"

struct santa_client {
	int fd;
	uint64_t seq;      /* of the last request */
	int status;        /* of the most recent call */
	bool broken;       /* santad closed the connection, a frame was cut or a response did not fit: the
	                      stream is lost or out of step, and the next request connects again */
	bool subscribed;   /* the connection carries only sample events now */
	uint64_t sub_seq;  /* the subscribe request's seq, which the events carry */
	char path[sizeof ((struct sockaddr_un *)0)->sun_path]; /* santad's socket, to connect again */
	char err[512];
};

/* santa_connect has no client to keep its error in. */
static _Thread_local char connect_err[256];

static const char *const op_names[] = {
	[SP_OP_HEALTH] = "health",     [SP_OP_BIND] = "bind",
	[SP_OP_UNBIND] = "unbind",     [SP_OP_ADD] = "add",
	[SP_OP_REPLACE] = "replace",   [SP_OP_MODIFY] = "modify",
	[SP_OP_DELETE] = "delete",     [SP_OP_LIST_SOCKETS] = "list_sockets",
	[SP_OP_LIST_RULES] = "list_rules", [SP_OP_STATS] = "stats",
	[SP_OP_SUBSCRIBE] = "subscribe", [SP_OP_SAMPLE] = "sample",
};

static const char *op_name(uint64_t op)
{
	return op < sizeof op_names / sizeof op_names[0] && op_names[op] ? op_names[op] : "unknown op";
}

const char *santa_status_name(int status)
{
	static const char *const names[] = {
		"ok", "malformed", "invalid", "permission denied", "not found",
		"quota exceeded", "full", "version", "internal", "unsupported",
	};
	if (status == SANTA_STATUS_LOCAL)
		return "local";
	return status >= 0 && (size_t)status < sizeof names / sizeof names[0] ? names[status] : "unknown";
}

/* The errno that best says why santad refused a request. */
static int status_errno(uint64_t status)
{
	switch (status) {
	case SANTA_STATUS_INVALID: return EINVAL;
	case SANTA_STATUS_PERMISSION: return EACCES;
	case SANTA_STATUS_NOT_FOUND: return ENOENT;
	case SANTA_STATUS_QUOTA: return EDQUOT;
	case SANTA_STATUS_FULL: return ENOSPC;
	case SANTA_STATUS_UNSUPPORTED: return EOPNOTSUPP;
	default: return EPROTO;
	}
}

static int fail_status(struct santa_client *c, int status, int e, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));

static int fail_status(struct santa_client *c, int status, int e, const char *fmt, ...)
{
	if (c) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(c->err, sizeof c->err, fmt, ap);
		va_end(ap);
		c->status = status;
	}
	errno = e;
	return -1;
}

#define fail(c, e, ...) fail_status(c, SANTA_STATUS_LOCAL, e, __VA_ARGS__)

/* An I/O error part way through a frame leaves the stream out of step. */
static int fail_io(struct santa_client *c, const char *what)
{
	int e = errno;
	c->broken = true;
	if (e == ECONNRESET || e == EPIPE)
		return fail(c, e, "%s: santad closed the connection", what);
	return fail(c, e, "%s: %s", what, strerror(e));
}

const char *santa_error(const struct santa_client *c)
{
	return c ? c->err : connect_err;
}

int santa_status(const struct santa_client *c)
{
	return c ? c->status : SANTA_STATUS_LOCAL;
}

int santa_fd(const struct santa_client *c)
{
	return c ? c->fd : -1;
}

/* ---- connection ---------------------------------------------------------- */

/* A blocking connect interrupted by a signal goes on in the background;
 * wait for it instead of failing. */
static int connect_eintr(int fd, const struct sockaddr_un *sa)
{
	int err = 0;
	socklen_t len = sizeof err;
	struct pollfd p = { .fd = fd, .events = POLLOUT };

	if (connect(fd, (const struct sockaddr *)sa, sizeof *sa) == 0)
		return 0;
	if (errno != EINTR)
		return -1;
	while (poll(&p, 1, -1) < 0)
		if (errno != EINTR)
			return -1;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
		return -1;
	errno = err;
	return err ? -1 : 0;
}

/* Why connecting to santad's socket may have failed with errno e. */
static const char *dial_hint(int e)
{
	if (e == EACCES) /* santad may be running, but not for this user */
		return "santad's socket_mode and socket_group decide who may connect";
	return "is santad running?";
}

/* A new connection to santad at path (shorter than sun_path), or -1 with errno. */
static int dial(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	int fd, e;

	memcpy(sa.sun_path, path, strlen(path));
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -1;
	if (connect_eintr(fd, &sa) < 0) {
		e = errno;
		close(fd);
		errno = e;
		return -1;
	}
	return fd;
}

struct santa_client *santa_connect(const char *path)
{
	struct santa_client *c;
	int e;

	if (!path) {
		path = secure_getenv(SANTA_SOCKET_ENV);
		if (!path || !*path)
			path = SANTA_DEFAULT_SOCKET;
	}
	if (strlen(path) >= sizeof c->path) {
		snprintf(connect_err, sizeof connect_err, "santad socket path %s: longer than %zu bytes", path,
		         sizeof c->path - 1);
		errno = ENAMETOOLONG;
		return NULL;
	}
	if (!(c = calloc(1, sizeof *c))) {
		snprintf(connect_err, sizeof connect_err, "connect to santad: out of memory");
		return NULL;
	}
	memcpy(c->path, path, strlen(path));
	c->fd = dial(path);
	if (c->fd < 0) {
		e = errno;
		snprintf(connect_err, sizeof connect_err, "connect to santad at %s: %s (%s)", path, strerror(e),
		         dial_hint(e));
		free(c);
		errno = e;
		return NULL;
	}
	connect_err[0] = '\0';
	return c;
}

/* Replaces a lost connection with a new one to the same path: 0, or -1
 * with errno (the old connection is closed either way). */
static int redial(struct santa_client *c)
{
	if (c->fd >= 0)
		close(c->fd);
	c->fd = dial(c->path);
	if (c->fd < 0)
		return -1;
	c->broken = false;
	return 0;
}

void santa_close(struct santa_client *c)
{
	if (!c)
		return;
	if (c->fd >= 0)
		close(c->fd);
	free(c);
}

/* ---- framing --------------------------------------------------------------- */

/* Writes the whole frame; passfd rides as SCM_RIGHTS on the sendmsg that
 * carries the first byte. *sent tells a caller whether the stream was touched. */
static int send_frame(int sock, const uint8_t *buf, size_t len, int passfd, size_t *sent)
{
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} ctl;

	for (*sent = 0; *sent < len;) {
		struct iovec iov = { .iov_base = (void *)(buf + *sent), .iov_len = len - *sent };
		struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (*sent == 0 && passfd >= 0) {
			memset(&ctl, 0, sizeof ctl);
			mh.msg_control = ctl.buf;
			mh.msg_controllen = sizeof ctl.buf;
			struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
			cm->cmsg_level = SOL_SOCKET;
			cm->cmsg_type = SCM_RIGHTS;
			cm->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(cm), &passfd, sizeof passfd);
		}
		ssize_t n = sendmsg(sock, &mh, MSG_NOSIGNAL);
		if (n < 0 && errno != EINTR)
			return -1;
		if (n > 0)
			*sent += (size_t)n;
	}
	return 0;
}

/* Reads exactly len bytes. Fds santad might pass are dropped by the kernel,
 * since recv gives it no room for them. */
static int recv_full(int sock, void *buf, size_t len)
{
	for (size_t got = 0; got < len;) {
		ssize_t n = recv(sock, (char *)buf + got, len - got, 0);
		if (n > 0)
			got += (size_t)n;
		else if (n == 0) {
			errno = ECONNRESET;
			return -1;
		} else if (errno != EINTR)
			return -1;
	}
	return 0;
}

static int send_msg(struct santa_client *c, const struct sp_msg *m, int passfd)
{
	char err[256];
	uint8_t *body, *frame;
	size_t len, sent;
	int rc;

	if (santa_proto_encode(m, &body, &len, err, sizeof err) < 0)
		return fail(c, errno, "%s: %s", op_name(m->op), err);
	frame = malloc(4 + len);
	if (!frame) {
		free(body);
		return fail(c, ENOMEM, "%s: out of memory", op_name(m->op));
	}
	frame[0] = (uint8_t)(len >> 24);
	frame[1] = (uint8_t)(len >> 16);
	frame[2] = (uint8_t)(len >> 8);
	frame[3] = (uint8_t)len;
	memcpy(frame + 4, body, len);
	free(body);
	rc = send_frame(c->fd, frame, 4 + len, passfd, &sent);
	free(frame);
	if (rc < 0 && sent == 0) /* e.g. EBADF for a bad sockfd: nothing went out */
		return fail(c, errno, "%s: send to santad: %s", op_name(m->op), strerror(errno));
	return rc < 0 ? fail_io(c, "send to santad") : 0;
}

static int recv_msg(struct santa_client *c, struct sp_msg *m)
{
	char err[256];
	uint8_t hdr[4], *body;
	uint32_t len;
	int rc;

	if (recv_full(c->fd, hdr, sizeof hdr) < 0)
		return fail_io(c, "receive from santad");
	len = (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];
	if (len == 0 || len > SP_MAX_FRAME) {
		c->broken = true;
		return fail(c, EBADMSG, "santad sent a frame of %u bytes (must be 1..%u)", len, SP_MAX_FRAME);
	}
	if (!(body = malloc(len))) {
		c->broken = true;
		return fail(c, ENOMEM, "receive from santad: out of memory for %u bytes", len);
	}
	if (recv_full(c->fd, body, len) < 0) {
		free(body);
		return fail_io(c, "receive from santad");
	}
	rc = santa_proto_decode(body, len, m, err, sizeof err);
	free(body);
	/* the frame was read whole, so the stream stays in step */
	return rc < 0 ? fail(c, errno, "bad response from santad: %s", err) : 0;
}

/* Checks that m answers (op, seq) and succeeded; frees m unless it did. */
static int check_answer(struct santa_client *c, uint64_t op, uint64_t seq, struct sp_msg *m)
{
	/* santad answers a request whose op and seq it could not read without them, e.g.
	 * an older santad refusing a key it does not know; still one answer */
	bool unparsed = m->op == 0 && m->seq == 0 && m->status != 0;
	int rc = 0;

	if (!unparsed && (m->op != op || m->seq != seq)) {
		c->broken = true;
		rc = fail(c, EPROTO, "santad answered %s seq %llu to %s seq %llu: the connection is out of step",
		          op_name(m->op), (unsigned long long)m->seq, op_name(op), (unsigned long long)seq);
	} else if (m->status) {
		int status = m->status > INT_MAX ? INT_MAX : (int)m->status;
		rc = fail_status(c, status, status_errno(m->status), "%s: %s (%s)", op_name(op),
		                 m->error ? m->error : "santad gave no reason", santa_status_name(status));
	} else if (m->v != SP_VERSION) {
		rc = fail(c, EPROTO, "%s: santad answered in protocol version %llu, not %d", op_name(op),
		          (unsigned long long)m->v, SP_VERSION);
	}
	if (rc < 0)
		santa_proto_msg_free(m);
	return rc;
}

/* Starts a call: resets the client's error and refuses a stream that is no
 * longer usable for requests (sample says a sample read is asking). */
static int begin(struct santa_client *c, bool sample)
{
	if (!c)
		return fail(NULL, EINVAL, "no client");
	c->err[0] = '\0';
	c->status = SANTA_STATUS_OK;
	if (c->broken && c->subscribed) /* a stream is not redialed */
		return fail(c, EPIPE, "the sample stream ended with an earlier error; subscribe again on a new client");
	if (c->subscribed && !sample)
		return fail(c, EINVAL, "this connection carries miss samples since santa_subscribe; use another client");
	if (!c->subscribed && sample)
		return fail(c, EINVAL, "not subscribed: call santa_subscribe first");
	return 0;
}

/* What exchange() returns when santad had closed the connection before the
 * request went out (errno says how the send failed): it never saw it. */
#define UNREAD 1

/* Sends req on c's connection and reads its response into *resp: 0 if
 * santad answered ok, -1 on failure, UNREAD. A connection that ends after
 * the request went out fails with ECONNRESET: the outcome is unknown. */
static int exchange(struct santa_client *c, struct sp_msg *req, int sockfd, struct sp_msg *resp)
{
	if (send_msg(c, req, sockfd) < 0) {
		int send_errno = errno;
		if (send_errno != EPIPE && send_errno != ECONNRESET)
			return -1;
		/* santad closed the connection, perhaps refusing it with an
		 * answer first (quota.connections): read it, it says why */
		c->broken = true;
		if (recv_msg(c, resp) < 0) {
			if (errno != ECONNRESET && errno != EPIPE)
				return -1;
			/* no answer, and the frame never went out whole */
			errno = send_errno;
			return UNREAD;
		}
		return check_answer(c, req->op, req->seq, resp);
	}
	if (recv_msg(c, resp) < 0) {
		if (errno == ECONNRESET || errno == EPIPE)
			return fail(c, ECONNRESET,
			            "%s: santad closed the connection before answering: the outcome is unknown (santad may "
			            "or may not have carried the request out); the next call connects again",
			            op_name(req->op));
		return -1;
	}
	return check_answer(c, req->op, req->seq, resp);
}

/*
 * request sends req and reads its response into *resp (free it with
 * santa_proto_msg_free): 0 if santad answered ok. A targeted request names
 * the rule set by the passed sockfd or by cookie; an untargeted one still
 * passes sockfd if it is >= 0 (bind). A lost connection is replaced first;
 * a request santad closed the connection on without reading it is sent once
 * more on a new connection.
 */
static int request(struct santa_client *c, struct sp_msg *req, bool targeted, int sockfd, uint64_t cookie,
                   struct sp_msg *resp)
{
	int rc;

	memset(resp, 0, sizeof *resp);
	if (begin(c, false) < 0)
		return -1;
	if (targeted && sockfd < 0 && cookie == 0) /* in the Go and Python clients' words (docs/api.md) */
		return fail(c, EINVAL, "%s: no target socket: pass the socket's fd or name its cookie", op_name(req->op));
	/* else sendmsg's EBADF reads as if the connection to santad were bad */
	if (targeted && sockfd >= 0 && fcntl(sockfd, F_GETFD) < 0)
		return fail(c, EBADF, "%s: the target fd %d is not open", op_name(req->op), sockfd);
	if (targeted)
		req->socket = cookie;
	req->v = SP_VERSION;
	req->seq = ++c->seq;
	if (c->broken && redial(c) < 0)
		return fail(c, errno, "%s: the connection to santad at %s was lost and connecting again failed: %s (%s)",
		            op_name(req->op), c->path, strerror(errno), dial_hint(errno));
	rc = exchange(c, req, sockfd, resp);
	if (rc == UNREAD) {
		int send_errno = errno;
		if (redial(c) < 0)
			return fail(c, errno, "%s: the connection to santad at %s was lost (%s) and connecting again "
			            "failed: %s (%s)", op_name(req->op), c->path, strerror(send_errno), strerror(errno),
			            dial_hint(errno));
		c->err[0] = '\0'; /* what the lost connection's read said */
		c->status = SANTA_STATUS_OK;
		rc = exchange(c, req, sockfd, resp);
		if (rc == UNREAD)
			return fail(c, EPIPE, "%s: santad at %s closed the new connection too before reading the request",
			            op_name(req->op), c->path);
	}
	return rc;
}

/* ---- operations ------------------------------------------------------------ */

int santa_health(struct santa_client *c, struct santa_health *out)
{
	struct sp_msg req = { .op = SP_OP_HEALTH }, resp;
	const struct sp_daemon_info *d;

	if (c && !out)
		return fail(c, EINVAL, "health: no struct to fill");
	if (request(c, &req, false, -1, 0, &resp) < 0)
		return -1;
	if (!(d = resp.daemon)) {
		santa_proto_msg_free(&resp);
		return fail(c, EPROTO, "health: santad's answer has no daemon info");
	}
	*out = (struct santa_health){
		.protocol = d->protocol,
		.pid = d->pid,
		.uptime_seconds = d->uptime_seconds,
		.interfaces = d->ninterfaces > UINT32_MAX ? UINT32_MAX : (uint32_t)d->ninterfaces,
		.uid = d->uid,
		.sockets = d->sockets,
		.rules = d->rules,
		.max_rules = d->max_rules,
		.data_bytes = d->data_bytes,
		.max_data_bytes = d->max_data_bytes,
		.quota_rules = d->quota_rules,
		.quota_bytes = d->quota_bytes,
		.used_rules = d->used_rules,
		.used_bytes = d->used_bytes,
		.quota_rulesets = d->quota_rulesets,
		.used_rulesets = d->used_rulesets,
	};
	snprintf(out->version, sizeof out->version, "%s", d->version ? d->version : "");
	santa_proto_msg_free(&resp);
	return 0;
}

int santa_bind(struct santa_client *c, int sockfd, uint32_t sample_bytes, uint32_t sample_rate, uint64_t *cookie)
{
	struct sp_msg req = { .op = SP_OP_BIND, .sample_bytes = sample_bytes, .sample_rate = sample_rate }, resp;

	if (c && sockfd < 0)
		return fail(c, EINVAL, "bind: no target socket: bind needs the socket's fd (a cookie names a rule set that exists)");
	if (request(c, &req, false, sockfd, 0, &resp) < 0)
		return -1;
	if (resp.nsockets != 1) {
		santa_proto_msg_free(&resp);
		return fail(c, EPROTO, "bind: santad's answer has %zu sockets, want 1", resp.nsockets);
	}
	if (cookie)
		*cookie = resp.sockets[0].cookie;
	santa_proto_msg_free(&resp);
	return 0;
}

/* For the calls whose answer carries nothing the caller needs. */
static int simple_request(struct santa_client *c, struct sp_msg *req, int sockfd, uint64_t cookie)
{
	struct sp_msg resp;

	if (request(c, req, true, sockfd, cookie, &resp) < 0)
		return -1;
	santa_proto_msg_free(&resp);
	return 0;
}

int santa_unbind(struct santa_client *c, int sockfd, uint64_t cookie)
{
	struct sp_msg req = { .op = SP_OP_UNBIND };
	return simple_request(c, &req, sockfd, cookie);
}

int santa_delete(struct santa_client *c, int sockfd, uint64_t cookie, const uint64_t *ids, size_t n)
{
	/* the encoder only reads ids */
	struct sp_msg req = { .op = SP_OP_DELETE, .ids = (uint64_t *)ids, .nids = ids ? n : 0 };
	return simple_request(c, &req, sockfd, cookie);
}

/* add, replace and modify: send rules, get one id per rule back. modify_id
 * names the rule a modify changes. */
static int send_rules(struct santa_client *c, uint64_t op, int sockfd, uint64_t cookie,
                      const struct santa_rule *const *rules, size_t n, uint64_t *ids, uint64_t modify_id)
{
	struct sp_msg req = { .op = op }, resp;
	struct sp_rule *wire;
	char err[256];
	int rc;

	if (!c)
		return fail(NULL, EINVAL, "no client");
	if (n && !rules)
		return fail(c, EINVAL, "%s: no rules", op_name(op));
	if (!(wire = calloc(n ? n : 1, sizeof *wire)))
		return fail(c, ENOMEM, "%s: out of memory", op_name(op));
	for (size_t i = 0; i < n; i++) {
		if (santa_proto_rule_check(rules[i], err, sizeof err) < 0) {
			free(wire);
			return fail(c, EINVAL, "%s: rule %zu: invalid rule: %s", op_name(op), i, err);
		}
		wire[i] = rules[i]->r; /* shallow: the encoder only reads the rule's buffers */
	}
	if (op == SP_OP_MODIFY)
		wire[0].id = modify_id;
	req.rules = wire;
	req.nrules = n;
	rc = request(c, &req, true, sockfd, cookie, &resp);
	free(wire);
	if (rc < 0)
		return -1;
	if (resp.nids != n) {
		santa_proto_msg_free(&resp);
		return fail(c, EPROTO, "%s: santad answered with %zu ids for %zu rules", op_name(op), resp.nids, n);
	}
	if (ids && n)
		memcpy(ids, resp.ids, n * sizeof *ids);
	santa_proto_msg_free(&resp);
	return 0;
}

int santa_add(struct santa_client *c, int sockfd, uint64_t cookie, const struct santa_rule *const *rules, size_t n,
              uint64_t *ids)
{
	return send_rules(c, SP_OP_ADD, sockfd, cookie, rules, n, ids, 0);
}

int santa_replace(struct santa_client *c, int sockfd, uint64_t cookie, const struct santa_rule *const *rules,
                  size_t n, uint64_t *ids)
{
	return send_rules(c, SP_OP_REPLACE, sockfd, cookie, rules, n, ids, 0);
}

int santa_modify(struct santa_client *c, int sockfd, uint64_t cookie, uint64_t id, const struct santa_rule *rule)
{
	return send_rules(c, SP_OP_MODIFY, sockfd, cookie, &rule, 1, NULL, id);
}

int santa_stats(struct santa_client *c, int sockfd, uint64_t cookie, uint64_t id, uint64_t *hits, uint64_t *bytes)
{
	/* no ids asks for all rules, which id 0 sums up */
	struct sp_msg req = { .op = SP_OP_STATS, .ids = &id, .nids = id != 0 }, resp;
	uint64_t h = 0, b = 0;
	bool found = id == 0;

	if (request(c, &req, true, sockfd, cookie, &resp) < 0)
		return -1;
	for (size_t i = 0; i < resp.nstats; i++) {
		if (id == 0 || resp.stats[i].id == id) {
			h += resp.stats[i].hits;
			b += resp.stats[i].bytes;
			found = true;
		}
	}
	santa_proto_msg_free(&resp);
	if (!found)
		return fail(c, EPROTO, "stats: santad's answer lacks rule %llu", (unsigned long long)id);
	if (hits)
		*hits = h;
	if (bytes)
		*bytes = b;
	return 0;
}

/* How many rules santa_list_rules_tagged asks for per page. */
#define LIST_PAGE_RULES 16384

/* Appends a list_rules page's rules to *infos (*n of them, room for *cap). */
static int append_infos(struct santa_client *c, const struct sp_msg *page, struct santa_rule_info **infos, size_t *n,
                        size_t *cap)
{
	if (*n + page->nrules > *cap) {
		size_t want = *cap ? *cap : 64;
		struct santa_rule_info *grown;
		while (want < *n + page->nrules)
			want *= 2;
		if (!(grown = realloc(*infos, want * sizeof *grown)))
			return fail(c, ENOMEM, "list_rules: out of memory");
		*infos = grown;
		*cap = want;
	}
	for (size_t i = 0; i < page->nrules; i++) {
		const struct sp_rule *r = &page->rules[i];
		struct santa_rule_info *info = &(*infos)[(*n)++];
		*info = (struct santa_rule_info){
			.id = r->id,
			.version = r->version,
			.priority = r->priority,
			.reply_len = r->reply_len,
			.min_len = r->min_len,
			.max_len = r->max_len,
			.expires = r->expires,
			.close = r->close,
		};
		if (r->tag)
			snprintf(info->tag, sizeof info->tag, "%s", r->tag);
	}
	return 0;
}

int santa_list_rules_tagged(struct santa_client *c, int sockfd, uint64_t cookie, const char *tag,
                            struct santa_rule_info **out, size_t *n)
{
	struct santa_rule_info *infos = NULL;
	size_t count = 0, cap = 0;
	uint64_t after = 0;
	bool more = true;

	if (c && (!out || !n))
		return fail(c, EINVAL, "list_rules: nowhere to put the rules");
	while (more) {
		/* the encoder only reads tag */
		struct sp_msg req = { .op = SP_OP_LIST_RULES, .after = after, .limit = LIST_PAGE_RULES, .tag = (char *)tag },
		              resp;
		int rc;
		if (request(c, &req, true, sockfd, cookie, &resp) < 0) {
			free(infos);
			return -1;
		}
		more = resp.more;
		if (more && resp.nrules == 0)
			rc = fail(c, EPROTO, "list_rules: santad says more rules follow but listed none");
		else
			rc = append_infos(c, &resp, &infos, &count, &cap);
		if (rc == 0 && resp.nrules)
			after = resp.rules[resp.nrules - 1].id;
		santa_proto_msg_free(&resp);
		if (rc < 0) {
			free(infos);
			return -1;
		}
	}
	*out = infos;
	*n = count;
	return 0;
}

int santa_list_rules(struct santa_client *c, int sockfd, uint64_t cookie, struct santa_rule_info **out, size_t *n)
{
	return santa_list_rules_tagged(c, sockfd, cookie, NULL, out, n);
}

int santa_delete_tagged(struct santa_client *c, int sockfd, uint64_t cookie, const char *tag, size_t *deleted)
{
	/* the encoder only reads tag */
	struct sp_msg req = { .op = SP_OP_DELETE, .tag = (char *)tag }, resp;

	if (c && (!tag || !*tag))
		return fail(c, EINVAL, "delete by tag: no tag given");
	if (request(c, &req, true, sockfd, cookie, &resp) < 0)
		return -1;
	if (deleted)
		*deleted = resp.nids;
	santa_proto_msg_free(&resp);
	return 0;
}

void santa_rule_info_free(struct santa_rule_info *infos)
{
	free(infos);
}

int santa_subscribe(struct santa_client *c, int sockfd, uint64_t cookie, uint32_t sample_bytes,
                    uint32_t sample_rate)
{
	struct sp_msg req = { .op = SP_OP_SUBSCRIBE, .sample_bytes = sample_bytes, .sample_rate = sample_rate };

	if (simple_request(c, &req, sockfd, cookie) < 0)
		return -1;
	c->subscribed = true;
	c->sub_seq = req.seq;
	return 0;
}

/* Waits until fd is readable, at most timeout_ms (-1: forever), across EINTR. */
static int wait_readable(int fd, int timeout_ms)
{
	struct timespec start, now;
	struct pollfd p = { .fd = fd, .events = POLLIN };

	clock_gettime(CLOCK_MONOTONIC, &start);
	for (int left = timeout_ms;;) {
		int n = poll(&p, 1, left);
		if (n > 0)
			return 0;
		if (n == 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		if (errno != EINTR)
			return -1;
		if (timeout_ms > 0) {
			clock_gettime(CLOCK_MONOTONIC, &now);
			long long spent = (now.tv_sec - start.tv_sec) * 1000LL + (now.tv_nsec - start.tv_nsec) / 1000000;
			left = spent >= timeout_ms ? 0 : timeout_ms - (int)spent;
		}
	}
}

int santa_next_sample(struct santa_client *c, uint8_t *buf, size_t cap, size_t *len, uint32_t *request_len,
                      int timeout_ms)
{
	struct sp_msg m;

	if (begin(c, true) < 0)
		return -1;
	if ((cap && !buf) || !len)
		return fail(c, EINVAL, "sample: no buffer");
	if (wait_readable(c->fd, timeout_ms) < 0) {
		if (errno == ETIMEDOUT)
			return fail(c, ETIMEDOUT, "sample: none arrived within %d ms", timeout_ms);
		return fail(c, errno, "sample: poll: %s", strerror(errno));
	}
	if (recv_msg(c, &m) < 0 || check_answer(c, SP_OP_SAMPLE, c->sub_seq, &m) < 0)
		return -1;
	if (cap && m.sample.len)
		memcpy(buf, m.sample.data, m.sample.len < cap ? m.sample.len : cap);
	*len = m.sample.len;
	if (request_len)
		*request_len = m.request_len;
	santa_proto_msg_free(&m);
	return 0;
}
