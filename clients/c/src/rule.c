/*
 * rule.c - the rule builder. It refuses what santad would certainly refuse
 * (see internal/dataplane/rule.go) so mistakes surface at the line that made
 * them, naming the field in santad's words (the Go and Python clients get
 * santad's text for the same rule); santad still validates everything.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Records the first failure: a rule whose builder call failed must not be
 * installed half-built. */
static int rule_fail(struct santa_rule *rule, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int rule_fail(struct santa_rule *rule, int e, const char *fmt, ...)
{
	if (rule && !rule->err[0]) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(rule->err, sizeof rule->err, fmt, ap);
		va_end(ap);
	}
	errno = e;
	return -1;
}

static uint8_t *dup_bytes(const void *p, size_t len)
{
	uint8_t *b = malloc(len);
	if (b)
		memcpy(b, p, len);
	return b;
}

struct santa_rule *santa_rule_new(uint32_t reply_len)
{
	struct santa_rule *rule;

	if (reply_len < 1 || reply_len > SANTA_MAX_REPLY) {
		errno = EINVAL;
		return NULL;
	}
	if (!(rule = calloc(1, sizeof *rule)))
		return NULL;
	rule->r.reply_len = reply_len;
	rule->r.conditions = rule->conds;
	rule->r.guards = rule->guards;
	return rule;
}

void santa_rule_free(struct santa_rule *rule)
{
	if (!rule)
		return;
	for (size_t i = 0; i < rule->r.nconditions; i++) {
		free(rule->conds[i].pattern.data);
		free(rule->conds[i].mask.data);
	}
	for (size_t i = 0; i < rule->r.nprocessors; i++) {
		free(rule->r.processors[i].template.data);
		free(rule->r.processors[i].mask.data);
	}
	free(rule->r.processors);
	free(rule->r.tag);
	free(rule);
}

const char *santa_rule_error(const struct santa_rule *rule)
{
	return rule && rule->err[0] ? rule->err : NULL;
}

int santa_rule_priority(struct santa_rule *rule, uint32_t priority)
{
	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	rule->r.priority = priority;
	return 0;
}

int santa_rule_length(struct santa_rule *rule, uint32_t min_len, uint32_t max_len)
{
	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (min_len > SANTA_REQUEST_WINDOW)
		return rule_fail(rule, EINVAL, "min length %u: must be between 0 and %d (the request bytes the matcher sees)",
		                 min_len, SANTA_REQUEST_WINDOW);
	if (max_len > SANTA_REQUEST_WINDOW)
		return rule_fail(rule, EINVAL, "max length %u: must be between 0 and %d (the request bytes the matcher sees)",
		                 max_len, SANTA_REQUEST_WINDOW);
	if (max_len && min_len > max_len)
		return rule_fail(rule, EINVAL, "min length %u exceeds max length %u", min_len, max_len);
	rule->r.min_len = min_len;
	rule->r.max_len = max_len;
	return 0;
}

int santa_rule_guard(struct santa_rule *rule, uint32_t slot, uint64_t version)
{
	size_t i = rule ? rule->r.nguards : 0;

	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (i == SANTA_MAX_GUARDS)
		return rule_fail(rule, EINVAL, "%zu guards: at most %d per rule", i + 1, SANTA_MAX_GUARDS);
	if (slot >= SANTA_GUARD_SLOTS)
		return rule_fail(rule, EINVAL, "guard %zu: slot %u is past the guard map's %u slots", i, slot,
		                 SANTA_GUARD_SLOTS);
	rule->guards[i] = (struct sp_guard){ .slot = slot, .version = version };
	rule->r.nguards++;
	return 0;
}

int santa_rule_close(struct santa_rule *rule, int on)
{
	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	rule->r.close = on != 0;
	return 0;
}

int santa_rule_expires(struct santa_rule *rule, uint64_t unix_seconds)
{
	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	rule->r.expires = unix_seconds;
	return 0;
}

int santa_rule_tag(struct santa_rule *rule, const char *tag)
{
	char *dup = NULL;

	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (tag && strlen(tag) > SANTA_MAX_TAG)
		return rule_fail(rule, EINVAL, "tag \"%.20s\"… is %zu bytes, at most %d", tag, strlen(tag), SANTA_MAX_TAG);
	if (tag && *tag && !(dup = strdup(tag)))
		return rule_fail(rule, ENOMEM, "tag: out of memory");
	free(rule->r.tag);
	rule->r.tag = dup;
	return 0;
}

/* Adds a condition; mask is NULL or has len bytes. */
static int add_condition(struct santa_rule *rule, uint32_t offset, const void *pattern, const void *mask, size_t len)
{
	size_t i = rule ? rule->r.nconditions : 0;
	const uint8_t *p = pattern, *m = mask;

	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (i == SANTA_MAX_CONDITIONS)
		return rule_fail(rule, EINVAL, "%zu conditions: at most %d per rule", i + 1, SANTA_MAX_CONDITIONS);
	if (!pattern || len == 0)
		return rule_fail(rule, EINVAL, "condition %zu: empty pattern", i);
	if (len > SANTA_MAX_PATTERN)
		return rule_fail(rule, EINVAL, "condition %zu: pattern of %zu bytes: at most %d", i, len, SANTA_MAX_PATTERN);
	if ((uint64_t)offset + len > SANTA_REQUEST_WINDOW)
		return rule_fail(rule, EINVAL,
		                 "condition %zu: bytes %u..%llu lie outside the first %d bytes of the request the matcher sees",
		                 i, offset, (unsigned long long)offset + len, SANTA_REQUEST_WINDOW);
	for (size_t j = 0; m && j < len; j++)
		if (p[j] & ~m[j])
			return rule_fail(rule, EINVAL,
			                 "condition %zu: pattern byte %zu (0x%02x) has bits 0x%02x outside its mask (0x%02x): clear them",
			                 i, j, p[j], p[j] & ~m[j] & 0xff, m[j]);
	if (!(rule->conds[i].pattern.data = dup_bytes(pattern, len)) || (m && !(rule->conds[i].mask.data = dup_bytes(m, len)))) {
		free(rule->conds[i].pattern.data);
		rule->conds[i].pattern.data = NULL;
		return rule_fail(rule, ENOMEM, "condition %zu: out of memory", i);
	}
	rule->conds[i].pattern.len = len;
	rule->conds[i].mask.len = m ? len : 0;
	rule->conds[i].offset = offset;
	rule->r.nconditions++;
	return 0;
}

int santa_rule_match(struct santa_rule *rule, uint32_t offset, const void *pattern, size_t len)
{
	return add_condition(rule, offset, pattern, NULL, len);
}

int santa_rule_match_masked(struct santa_rule *rule, uint32_t offset, const void *pattern, const void *mask,
                            size_t len)
{
	if (rule && !mask)
		return rule_fail(rule, EINVAL, "condition %zu: no mask", rule->r.nconditions);
	return add_condition(rule, offset, pattern, mask, len);
}

/* Refuses a processor writing reply bytes beyond the rule's reply_len. */
static int check_reply_range(struct santa_rule *rule, const char *kind, uint32_t reply_offset, size_t len)
{
	if ((uint64_t)reply_offset + len <= rule->r.reply_len)
		return 0;
	return rule_fail(rule, EINVAL, "processor %zu (%s): writes reply bytes %u..%llu of a %u-byte reply",
	                 rule->r.nprocessors, kind, reply_offset, (unsigned long long)reply_offset + len,
	                 rule->r.reply_len);
}

/* Appends a processor, taking over p->template.data. */
static int append_processor(struct santa_rule *rule, const struct sp_processor *p)
{
	size_t i = rule->r.nprocessors;

	if (i == rule->proc_cap) {
		size_t cap = rule->proc_cap ? 2 * rule->proc_cap : 2;
		struct sp_processor *grown = realloc(rule->r.processors, cap * sizeof *grown);
		if (!grown)
			return rule_fail(rule, ENOMEM, "processor %zu: out of memory", i);
		rule->r.processors = grown;
		rule->proc_cap = cap;
	}
	rule->r.processors[i] = *p;
	rule->r.nprocessors++;
	return 0;
}

int santa_rule_put(struct santa_rule *rule, uint32_t reply_offset, const void *tpl, size_t len)
{
	struct sp_processor p = { .kind = SP_PUT, .reply_offset = reply_offset, .template.len = len };

	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (!tpl || len == 0)
		return rule_fail(rule, EINVAL, "processor %zu (put): empty template", rule->r.nprocessors);
	if (check_reply_range(rule, "put", reply_offset, len) < 0)
		return -1;
	if (!(p.template.data = dup_bytes(tpl, len)))
		return rule_fail(rule, ENOMEM, "processor %zu (put): out of memory", rule->r.nprocessors);
	if (append_processor(rule, &p) < 0) {
		free(p.template.data);
		return -1;
	}
	return 0;
}

/* Adds a copy processor; mask is NULL or has len bytes. */
static int add_copy(struct santa_rule *rule, uint32_t reply_offset, uint32_t src_offset, const void *mask, uint32_t len)
{
	struct sp_processor p = { .kind = SP_COPY, .reply_offset = reply_offset, .src_offset = src_offset, .length = len };

	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (len == 0)
		return rule_fail(rule, EINVAL, "processor %zu (copy): length 0 must be positive", rule->r.nprocessors);
	if (check_reply_range(rule, "copy", reply_offset, len) < 0)
		return -1;
	if ((uint64_t)src_offset + len > SANTA_REQUEST_WINDOW)
		return rule_fail(rule, EINVAL, "processor %zu (copy): request bytes %u..%llu lie outside the first %d bytes",
		                 rule->r.nprocessors, src_offset, (unsigned long long)src_offset + len, SANTA_REQUEST_WINDOW);
	if (mask && len > SANTA_MAX_COPY_MASK)
		return rule_fail(rule, EINVAL, "processor %zu (copy): a masked copy of %u bytes: masked copies hold at most %d",
		                 rule->r.nprocessors, len, SANTA_MAX_COPY_MASK);
	if (mask) {
		if (!(p.mask.data = dup_bytes(mask, len)))
			return rule_fail(rule, ENOMEM, "processor %zu (copy): out of memory", rule->r.nprocessors);
		p.mask.len = len;
	}
	if (append_processor(rule, &p) < 0) {
		free(p.mask.data);
		return -1;
	}
	return 0;
}

int santa_rule_copy(struct santa_rule *rule, uint32_t reply_offset, uint32_t src_offset, uint32_t len)
{
	return add_copy(rule, reply_offset, src_offset, NULL, len);
}

int santa_rule_copy_masked(struct santa_rule *rule, uint32_t reply_offset, uint32_t src_offset, const void *mask,
                           uint32_t len)
{
	if (rule && !mask)
		return rule_fail(rule, EINVAL, "processor %zu (copy): no mask", rule->r.nprocessors);
	return add_copy(rule, reply_offset, src_offset, mask, len);
}

/* A condition whose first byte is compared in full, which the matcher hashes to find the rule. */
static int anchorable(const struct sp_rule *r)
{
	for (size_t i = 0; i < r->nconditions; i++)
		if (!r->conditions[i].mask.len || r->conditions[i].mask.data[0] == 0xff)
			return 1;
	return 0;
}

/* The request bytes the rule's conditions and copies read. */
static uint64_t bytes_read(const struct sp_rule *r)
{
	uint64_t need = 0, end;

	for (size_t i = 0; i < r->nconditions; i++)
		if ((end = (uint64_t)r->conditions[i].offset + r->conditions[i].pattern.len) > need)
			need = end;
	for (size_t i = 0; i < r->nprocessors; i++)
		if (r->processors[i].kind == SP_COPY &&
		    (end = (uint64_t)r->processors[i].src_offset + r->processors[i].length) > need)
			need = end;
	return need;
}

int santa_proto_rule_check(const struct santa_rule *rule, char *err, size_t errlen)
{
	const char *why = !rule                      ? "no rule"
	                  : rule->err[0]              ? rule->err
	                  : !rule->r.nconditions      ? "a rule needs at least one condition"
	                  : !rule->r.nprocessors      ? "a rule needs at least one processor"
	                  : !anchorable(&rule->r)     ? "no condition compares its first byte in full (mask 0xff): "
	                                                "the matcher finds rules by hashing such bytes"
	                                              : NULL;
	if (why)
		snprintf(err, errlen, "%s", why);
	else if (rule->r.max_len && bytes_read(&rule->r) > rule->r.max_len)
		snprintf(err, errlen, "max length %u: the conditions and copies read %llu request bytes, so the rule could never match",
		         rule->r.max_len, (unsigned long long)bytes_read(&rule->r));
	else
		return 0;
	errno = EINVAL;
	return -1;
}
