/**
 * @file santa.h
 * @brief libsanta: the C client of santad's control protocol.
 *
 * An application hands santad rules for requests whose answers are fixed for
 * a while; santad's rule processor then answers matching UDP requests to the
 * application's socket from the kernel, and everything else still reaches the
 * application. The protocol is specified in docs/protocol.md.
 *
 * Conventions:
 *  - Calls returning @c int return 0 on success and -1 on failure. A failure
 *    sets @c errno and leaves a message in santa_error() and a status in
 *    santa_status(). The library never aborts and never raises SIGPIPE.
 *  - Rule-set calls name their target with @p sockfd and @p cookie: if
 *    @p sockfd >= 0 the socket itself is passed to santad (SCM_RIGHTS), which
 *    proves the caller owns it; add, replace and modify bind such a socket
 *    first if it has no rule set yet. Otherwise @p cookie (the socket's
 *    SO_COOKIE, as santa_bind() returns it) names an existing rule set the
 *    caller's uid bound. If both are given they must agree.
 *  - Thread safety: a client is not thread-safe. Use one client per thread
 *    (or serialize all calls on a client, including santa_error() and
 *    santa_status()). Different clients are independent. A built rule is only
 *    read by the calls that send it, so several threads may send the same
 *    rule at once as long as none modifies it.
 *  - Calls block until santad answers; EINTR is retried, so a signal does not
 *    abort a call. santa_next_sample() is the only call with a timeout.
 *  - Restarts of santad (since libsanta 3.2): a client outlives them (santad
 *    keeps its rule sets across restarts). It remembers the path it was
 *    connected to. A request that meets a connection santad closed before
 *    reading it (the send fails with EPIPE or ECONNRESET and no answer
 *    follows) is sent once more, with the same seq, on a new connection to
 *    that path; the caller sees only its result. An answer santad sent
 *    before closing (a refusal past quota.connections, status quota) is the
 *    call's result, with no new connection. If the connection ends after the
 *    request went out and before its answer, santad may or may not have
 *    carried the request out: the call fails with errno ECONNRESET and
 *    santa_error() says the outcome is unknown; nothing is resent (find out,
 *    e.g. by listing the rules, before you repeat an add). A connection that
 *    was lost, or left out of step by an earlier failure, is replaced at the
 *    start of the next request. If connecting again fails (santad is not
 *    running), the call fails with the connect's errno (ENOENT,
 *    ECONNREFUSED, ...) and santa_error() names the lost connection, the
 *    path and the reason; a later call tries again. santa_fd() may return
 *    another descriptor after this (-1 while there is no connection). A
 *    subscribed client (santa_subscribe()) is never reconnected: when
 *    santad stops, its stream ends with an error and the caller subscribes
 *    again on a new client.
 */
#ifndef SANTA_H
#define SANTA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(SANTA_API)
#define SANTA_API __attribute__((visibility("default")))
#elif !defined(SANTA_API)
#define SANTA_API
#endif

/** santad's socket when neither a path nor $SANTA_SOCKET is given. */
#define SANTA_DEFAULT_SOCKET "/run/santa/santa.sock"
/** Environment variable naming santad's socket. */
#define SANTA_SOCKET_ENV "SANTA_SOCKET"
/** The protocol version this library speaks. */
#define SANTA_PROTOCOL_VERSION 1

/** Conditions a rule may have. */
#define SANTA_MAX_CONDITIONS 4
/** Bytes in one condition pattern. */
#define SANTA_MAX_PATTERN 1024
/** Request payload bytes the rule processor sees: conditions and copies must lie within them. */
#define SANTA_REQUEST_WINDOW 1472
/** Bytes of one masked copy (santa_rule_copy_masked()). */
#define SANTA_MAX_COPY_MASK 8
/** The longest rule tag santad accepts, in bytes (santa_rule_tag()). */
#define SANTA_MAX_TAG 64
/** Guards a rule may have (santa_rule_guard()). */
#define SANTA_MAX_GUARDS 2
/** Slots of santad's guard map: a guard's slot is below this. */
#define SANTA_GUARD_SLOTS (1u << 20)
/** Largest reply payload over IPv4 (santad allows 20 bytes less over IPv6). */
#define SANTA_MAX_REPLY 1472
/** Largest miss sample santad sends: a whole request window (sample_bytes may not exceed it). */
#define SANTA_MAX_SAMPLE 1472

/** What santa_status() reports (the protocol's status codes, plus one local value). */
enum santa_status_code {
	SANTA_STATUS_LOCAL = -1,      /**< failed in this process or on the connection: bad argument, I/O error, bad response; see errno */
	SANTA_STATUS_OK = 0,          /**< the most recent call succeeded */
	SANTA_STATUS_MALFORMED = 1,   /**< santad could not parse the request */
	SANTA_STATUS_INVALID = 2,     /**< a value was refused (invalid rule, IPv6 reply over 1452 bytes, not a bound UDP or listening TCP socket, an id listed twice) */
	SANTA_STATUS_PERMISSION = 3,  /**< the caller may not do this */
	SANTA_STATUS_NOT_FOUND = 4,   /**< no rule set for that socket, or no such rule */
	SANTA_STATUS_QUOTA = 5,       /**< the caller's uid would exceed its quota */
	SANTA_STATUS_FULL = 6,        /**< the data plane has no room */
	SANTA_STATUS_VERSION = 7,     /**< santad does not speak this protocol version */
	SANTA_STATUS_INTERNAL = 8,    /**< santad failed; its log says why */
	SANTA_STATUS_UNSUPPORTED = 9, /**< santad does not know the operation */
};

/** A connection to santad (opaque). */
struct santa_client;

/** A rule being built (opaque): conditions on the request, processors writing the reply. */
struct santa_rule;

/** santad's state, as santa_health() reports it. */
struct santa_health {
	char version[64];        /**< santad's version, NUL-terminated (truncated if longer) */
	uint32_t protocol;       /**< protocol version santad speaks */
	uint32_t pid;            /**< santad's process id */
	uint64_t uptime_seconds; /**< seconds since santad started */
	uint32_t interfaces;     /**< network interfaces the rule processor is attached to */
	uint32_t uid;            /**< the caller's uid as santad sees it */
	uint64_t sockets;        /**< rule sets (bound sockets), all users */
	uint64_t rules;          /**< rules installed, all users */
	uint64_t max_rules;      /**< rules the data plane can hold */
	uint64_t data_bytes;     /**< pattern, mask and template bytes in use, all users */
	uint64_t max_data_bytes; /**< pattern, mask and template bytes the data plane can hold */
	uint64_t quota_rules;    /**< the caller's rule quota (0 = unlimited) */
	uint64_t quota_bytes;    /**< the caller's pattern, mask and template byte quota (0 = unlimited) */
	uint64_t used_rules;     /**< rules the caller holds */
	uint64_t used_bytes;     /**< pattern, mask and template bytes the caller holds */
	uint64_t quota_rulesets; /**< rule sets the caller may bind (0 = unlimited; libsanta 4.0.0) */
	uint64_t used_rulesets;  /**< rule sets the caller holds (libsanta 4.0.0) */
};

/** One rule of a rule set, as santa_list_rules() reports it. */
struct santa_rule_info {
	uint64_t id;        /**< the rule's id */
	uint32_t version;   /**< 1 when added, +1 per modify */
	uint32_t priority;  /**< lower wins among matching rules */
	uint32_t reply_len; /**< reply payload bytes */
	uint32_t min_len;   /**< shortest request payload it answers (0: no bound), as santa_rule_length() set */
	uint32_t max_len;   /**< longest request payload it answers (0: no bound) */
	uint64_t expires;   /**< Unix time (s) santad removes it at, 0: never (santa_rule_expires()) */
	int close;          /**< TCP: 1 if its reply ends the connection (santa_rule_close()) */
	char tag[SANTA_MAX_TAG + 1]; /**< who added it ("" if untagged; santa_rule_tag()) */
};

/* ---- connection --------------------------------------------------------- */

/**
 * Connects to santad.
 *
 * @param path santad's socket; NULL means $SANTA_SOCKET if set and non-empty,
 *             else SANTA_DEFAULT_SOCKET.
 * @return a client, or NULL with errno set (e.g. ENOENT, ECONNREFUSED,
 *         EACCES, ENAMETOOLONG, ENOMEM); santa_error(NULL) then says what
 *         failed in this thread's last santa_connect().
 */
SANTA_API struct santa_client *santa_connect(const char *path);

/** Closes the connection and frees the client. NULL is a no-op. */
SANTA_API void santa_close(struct santa_client *c);

/**
 * The connection's file descriptor, e.g. to poll() for miss samples after
 * santa_subscribe(). Do not read, write or close it. A request may replace
 * a connection santad closed with a new one (see "Restarts of santad"
 * above), whose descriptor may differ: ask again after each call. -1 while
 * the client has no connection (connecting again failed).
 */
SANTA_API int santa_fd(const struct santa_client *c);

/**
 * What went wrong in the most recent call on @p c ("" if it succeeded). For a
 * refusal by santad this includes santad's error text, which names the field
 * and the limit. The string stays valid until the next call on @p c.
 *
 * @param c a client, or NULL for the reason this thread's last
 *          santa_connect() failed.
 */
SANTA_API const char *santa_error(const struct santa_client *c);

/**
 * The status of the most recent call on @p c: SANTA_STATUS_OK if it
 * succeeded, the protocol status (enum santa_status_code) if santad refused
 * it, or SANTA_STATUS_LOCAL if it failed before or without santad's answer.
 *
 * A refusal also sets errno: EINVAL (invalid), EACCES (permission denied),
 * ENOENT (not found), EDQUOT (quota), ENOSPC (full), EOPNOTSUPP
 * (unsupported), EPROTO (the others). Local failures set the errno of their
 * cause; EPROTO and EBADMSG mean santad's answer made no sense (the next
 * call connects again), ECONNRESET that santad closed the connection after
 * the request went out and before its answer (the outcome is unknown),
 * EPIPE that santad closed a connection it had just accepted anew too, or
 * that a subscription's stream ended.
 */
SANTA_API int santa_status(const struct santa_client *c);

/** A status code's name, e.g. "permission denied"; "unknown" for a code this library does not know. */
SANTA_API const char *santa_status_name(int status);

/* ---- rule builder ------------------------------------------------------- */

/**
 * Starts a rule whose reply is @p reply_len bytes of UDP payload; reply
 * bytes no processor writes are zero.
 *
 * @return the rule, or NULL with errno EINVAL (reply_len not 1 to
 *         SANTA_MAX_REPLY) or ENOMEM. Free it with santa_rule_free().
 *
 * A builder call that fails (returns -1, errno EINVAL or ENOMEM) leaves the
 * rule unusable: santa_add(), santa_replace() and santa_modify() refuse it
 * with the builder's message, so a rule missing a condition its author meant
 * to add is never installed. santa_rule_error() says what failed.
 */
SANTA_API struct santa_rule *santa_rule_new(uint32_t reply_len);

/**
 * Adds a condition: the request payload must carry @p pattern at @p offset.
 * All conditions of a rule must hold; a request shorter than a condition
 * never matches. At most SANTA_MAX_CONDITIONS per rule.
 *
 * @param len 1 to SANTA_MAX_PATTERN, and offset + len <= SANTA_REQUEST_WINDOW.
 * @return 0, or -1 (see santa_rule_new()).
 */
SANTA_API int santa_rule_match(struct santa_rule *rule, uint32_t offset, const void *pattern, size_t len);

/**
 * Adds a masked condition: like santa_rule_match(), but only the request bits
 * set in @p mask are compared (e.g. to ignore some flag bits). The pattern
 * must have no bits outside the mask. santad finds rules by hashing request
 * bytes a condition compares in full: a rule needs a condition whose first
 * byte is compared in full (mask byte 0xff, or a santa_rule_match()), and
 * it hangs on the longest such run of bytes.
 *
 * @param mask @p len bytes, one per pattern byte.
 * @return 0, or -1 (see santa_rule_new()).
 */
SANTA_API int santa_rule_match_masked(struct santa_rule *rule, uint32_t offset, const void *pattern,
                                      const void *mask, size_t len);

/**
 * Adds a put processor: writes @p tpl at @p reply_offset of the reply.
 * Processors run in the order added; a later one overwrites an earlier one.
 *
 * @param len at least 1, and reply_offset + len <= the rule's reply_len.
 * @return 0, or -1 (see santa_rule_new()).
 */
SANTA_API int santa_rule_put(struct santa_rule *rule, uint32_t reply_offset, const void *tpl, size_t len);

/**
 * Adds a copy processor: writes @p len request bytes from @p src_offset at
 * @p reply_offset of the reply (e.g. a DNS query id). A request shorter than
 * src_offset + len never matches the rule.
 *
 * @param len at least 1; reply_offset + len <= reply_len and
 *            src_offset + len <= SANTA_REQUEST_WINDOW.
 * @return 0, or -1 (see santa_rule_new()).
 */
SANTA_API int santa_rule_copy(struct santa_rule *rule, uint32_t reply_offset, uint32_t src_offset, uint32_t len);

/**
 * Adds a masked copy processor: like santa_rule_copy(), but only the request
 * bits set in @p mask are copied (e.g. to echo some flag bits); the reply's
 * other bits keep what earlier puts wrote there (or zero). santad refuses a
 * masked copy that would mix its bits into reply bytes an earlier copy wrote
 * (mask bytes 0xff overwrite such bytes whole).
 *
 * @param mask @p len bytes, one per copied byte.
 * @param len 1 to SANTA_MAX_COPY_MASK; otherwise as for santa_rule_copy().
 * @return 0, or -1 (see santa_rule_new()).
 */
SANTA_API int santa_rule_copy_masked(struct santa_rule *rule, uint32_t reply_offset, uint32_t src_offset,
                                     const void *mask, uint32_t len);

/**
 * Sets the rule's priority (default 0): of several matching rules the lowest
 * priority wins, then the oldest.
 *
 * @return 0, or -1 with errno EINVAL if @p rule is NULL.
 */
SANTA_API int santa_rule_priority(struct santa_rule *rule, uint32_t priority);

/**
 * Bounds the length of the requests (UDP payload bytes) the rule answers: a
 * request shorter than @p min_len or longer than @p max_len does not match
 * it (another rule or the application may still answer it). 0 is no bound;
 * by default there is none. A rule never matches requests shorter than its
 * conditions and copies read; a @p max_len below that is refused when the
 * rule is sent.
 *
 * @param min_len 0 to SANTA_REQUEST_WINDOW.
 * @param max_len 0, or @p min_len to SANTA_REQUEST_WINDOW.
 * @return 0, or -1 (see santa_rule_new()).
 */
SANTA_API int santa_rule_length(struct santa_rule *rule, uint32_t min_len, uint32_t max_len);

/**
 * Adds a guard: the rule answers only while slot @p slot of santad's guard
 * map holds @p version. The guard map (an array of SANTA_GUARD_SLOTS 64-bit
 * counters pinned at <bpffs>/guards, kept across santad restarts) belongs to
 * write trackers such as `santa memcached`'s: they bump the slots of what a
 * write changes, so a rule built from a value read before the write stops
 * answering. A request the rule's conditions match while a guard does not
 * hold goes to the application (counter pass_invalidated). At most
 * SANTA_MAX_GUARDS per rule; all must hold.
 *
 * @param slot below SANTA_GUARD_SLOTS.
 * @param version the slot's value the rule was built for.
 * @return 0, or -1 (see santa_rule_new()).
 */
SANTA_API int santa_rule_guard(struct santa_rule *rule, uint32_t slot, uint64_t version);

/**
 * Makes the rule's reply end the connection (@p on non-zero) or not (0, the
 * default): the reply goes out with FIN. For rules of a listening TCP socket
 * only; santad refuses such a rule for a UDP socket.
 *
 * @return 0, or -1 with errno EINVAL if @p rule is NULL.
 */
SANTA_API int santa_rule_close(struct santa_rule *rule, int on);

/**
 * Makes santad remove the rule by itself at Unix time @p unix_seconds (0, the
 * default: never), e.g. when the answer's TTL runs out, even if the
 * application is gone; from then on the rule never answers, even while
 * santad is not running. santad refuses a time that has passed.
 *
 * @return 0, or -1 with errno EINVAL if @p rule is NULL.
 */
SANTA_API int santa_rule_expires(struct santa_rule *rule, uint64_t unix_seconds);

/**
 * Tags the rule with @p tag (NULL or "", the default: no tag): who added it,
 * e.g. "santa-dns". santa_list_rules() reports it, so a program started anew
 * finds the rules its predecessor left and takes them over or deletes them.
 * santad refuses tags that are not UTF-8 or hold control characters.
 *
 * @return 0, or -1 with errno EINVAL if @p rule is NULL or @p tag is longer
 *         than SANTA_MAX_TAG bytes, ENOMEM if out of memory.
 */
SANTA_API int santa_rule_tag(struct santa_rule *rule, const char *tag);

/** Why a builder call on @p rule failed, or NULL if none did. */
SANTA_API const char *santa_rule_error(const struct santa_rule *rule);

/** Frees a rule. NULL is a no-op. Rules already sent stay installed. */
SANTA_API void santa_rule_free(struct santa_rule *rule);

/* ---- operations ---------------------------------------------------------- */

/**
 * Asks santad for its state and the caller's quota.
 *
 * @param out filled on success.
 */
SANTA_API int santa_health(struct santa_client *c, struct santa_health *out);

/**
 * Gives the socket @p sockfd a rule set (idempotent: binding a bound socket
 * returns its rule set and updates its sampling).
 *
 * @param sockfd a bound UDP socket or a listening TCP socket of the caller (must be >= 0).
 * @param sample_bytes request bytes per miss sample (0 = off, at most SANTA_MAX_SAMPLE).
 * @param sample_rate miss samples per second and CPU.
 * @param cookie if not NULL, receives the socket's cookie, which names the
 *               rule set in later calls.
 */
SANTA_API int santa_bind(struct santa_client *c, int sockfd, uint32_t sample_bytes, uint32_t sample_rate,
                         uint64_t *cookie);

/** Removes a socket's rule set and all its rules (closing the socket does so too). */
SANTA_API int santa_unbind(struct santa_client *c, int sockfd, uint64_t cookie);

/**
 * Adds @p n rules, all or none.
 *
 * @param rules the rules; santad copies them, so they may be freed or reused afterwards.
 * @param ids if not NULL, receives the @p n new rule ids, in the order of @p rules.
 */
SANTA_API int santa_add(struct santa_client *c, int sockfd, uint64_t cookie, const struct santa_rule *const *rules,
                        size_t n, uint64_t *ids);

/**
 * Replaces all rules of the rule set with @p rules in one step (@p n may be
 * 0 to remove them all). Arguments as for santa_add().
 */
SANTA_API int santa_replace(struct santa_client *c, int sockfd, uint64_t cookie,
                            const struct santa_rule *const *rules, size_t n, uint64_t *ids);

/**
 * Changes rule @p id in place to @p rule, keeping its id; its version
 * increases by one. santad refuses an @p id of 0 (no rule has it) as
 * invalid, as for the Go and Python clients.
 */
SANTA_API int santa_modify(struct santa_client *c, int sockfd, uint64_t cookie, uint64_t id,
                           const struct santa_rule *rule);

/** Deletes the @p n rules @p ids, all or none. */
SANTA_API int santa_delete(struct santa_client *c, int sockfd, uint64_t cookie, const uint64_t *ids, size_t n);

/**
 * Reads a rule's counters.
 *
 * @param id a rule id, or 0 for the sum over all rules of the rule set.
 * @param hits if not NULL, receives the requests the rule answered.
 * @param bytes if not NULL, receives the reply frame bytes it sent.
 */
SANTA_API int santa_stats(struct santa_client *c, int sockfd, uint64_t cookie, uint64_t id, uint64_t *hits,
                          uint64_t *bytes);

/**
 * Lists the rule set's rules, oldest first. It asks santad in pages, so a
 * rule set of any size can be listed: a rule added meanwhile may be listed
 * or not, one deleted meanwhile may already be missing, every other rule is
 * listed once.
 *
 * @param out receives a malloc'd array (NULL if there are none); free it
 *            with santa_rule_info_free().
 * @param n receives the number of rules.
 */
SANTA_API int santa_list_rules(struct santa_client *c, int sockfd, uint64_t cookie, struct santa_rule_info **out,
                               size_t *n);

/**
 * santa_list_rules() for the rules tagged @p tag only (NULL or "": all);
 * santad does the filtering. (Since libsanta 3.1.)
 */
SANTA_API int santa_list_rules_tagged(struct santa_client *c, int sockfd, uint64_t cookie, const char *tag,
                                      struct santa_rule_info **out, size_t *n);

/**
 * Deletes every rule of the rule set tagged @p tag, all or none, e.g. what
 * a program that will not run again left. No rule with the tag is not an
 * error. (Since libsanta 3.1.)
 *
 * @param deleted if not NULL, receives how many rules went.
 * @return 0, or -1 (errno EINVAL if @p tag is NULL or empty).
 */
SANTA_API int santa_delete_tagged(struct santa_client *c, int sockfd, uint64_t cookie, const char *tag,
                                  size_t *deleted);

/** Frees what santa_list_rules() returned. NULL is a no-op. */
SANTA_API void santa_rule_info_free(struct santa_rule_info *infos);

/**
 * Turns this connection into a stream of the socket's miss samples: requests
 * that matched no rule, @p sample_bytes of each, at most @p sample_rate per
 * second and CPU (more if another subscriber of the socket asks for more:
 * santad samples as widely as any asks). Read them with santa_next_sample(). Afterwards the
 * connection carries only samples (other calls fail with EINVAL); close the
 * client to unsubscribe. The stream is not reconnected: when santad stops or
 * restarts, santa_next_sample() fails (the stream ended) and the caller
 * subscribes again on a new client.
 */
SANTA_API int santa_subscribe(struct santa_client *c, int sockfd, uint64_t cookie, uint32_t sample_bytes,
                              uint32_t sample_rate);

/**
 * Waits for the next miss sample.
 *
 * @param buf receives the sample's first min(cap, sample length) bytes.
 * @param cap bytes @p buf holds.
 * @param len receives the sample's length (more than @p cap if it was cut).
 * @param request_len if not NULL, receives the full payload length of the request sampled.
 * @param timeout_ms milliseconds to wait for a sample to start arriving; -1 waits forever, 0 only polls.
 * @return 0, or -1: errno ETIMEDOUT when no sample arrived in time (the
 *         connection stays usable), otherwise a failure as for other calls.
 */
SANTA_API int santa_next_sample(struct santa_client *c, uint8_t *buf, size_t cap, size_t *len, uint32_t *request_len,
                                int timeout_ms);

#ifdef __cplusplus
}
#endif

#endif /* SANTA_H */
