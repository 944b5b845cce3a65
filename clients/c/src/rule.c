/*
 * rule.c - the rule builder. It refuses what santad would certainly refuse
 * (see internal/dataplane/rule.go) so mistakes surface at the line that made
 * them; santad still validates everything.
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
	return rule;
}

void santa_rule_free(struct santa_rule *rule)
{
	if (!rule)
		return;
	for (size_t i = 0; i < rule->r.nconditions; i++)
		free(rule->conds[i].pattern.data);
	for (size_t i = 0; i < rule->r.nprocessors; i++)
		free(rule->r.processors[i].template.data);
	free(rule->r.processors);
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

int santa_rule_match(struct santa_rule *rule, uint32_t offset, const void *pattern, size_t len)
{
	size_t i = rule ? rule->r.nconditions : 0;

	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (i == SANTA_MAX_CONDITIONS)
		return rule_fail(rule, EINVAL, "condition %zu: a rule has at most %d conditions", i, SANTA_MAX_CONDITIONS);
	if (!pattern || len == 0)
		return rule_fail(rule, EINVAL, "condition %zu: empty pattern", i);
	if (len > SANTA_MAX_PATTERN)
		return rule_fail(rule, EINVAL, "condition %zu: pattern of %zu bytes: at most %d", i, len, SANTA_MAX_PATTERN);
	if ((uint64_t)offset + len > SANTA_REQUEST_WINDOW)
		return rule_fail(rule, EINVAL,
		                 "condition %zu: bytes %u..%llu lie outside the first %d bytes of the request the matcher sees",
		                 i, offset, (unsigned long long)offset + len, SANTA_REQUEST_WINDOW);
	if (!(rule->conds[i].pattern.data = dup_bytes(pattern, len)))
		return rule_fail(rule, ENOMEM, "condition %zu: out of memory", i);
	rule->conds[i].pattern.len = len;
	rule->conds[i].offset = offset;
	rule->r.nconditions++;
	return 0;
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

int santa_rule_copy(struct santa_rule *rule, uint32_t reply_offset, uint32_t src_offset, uint32_t len)
{
	struct sp_processor p = { .kind = SP_COPY, .reply_offset = reply_offset, .src_offset = src_offset, .length = len };

	if (!rule)
		return rule_fail(NULL, EINVAL, "no rule");
	if (len == 0)
		return rule_fail(rule, EINVAL, "processor %zu (copy): length must be positive", rule->r.nprocessors);
	if (check_reply_range(rule, "copy", reply_offset, len) < 0)
		return -1;
	if ((uint64_t)src_offset + len > SANTA_REQUEST_WINDOW)
		return rule_fail(rule, EINVAL, "processor %zu (copy): request bytes %u..%llu lie outside the first %d bytes",
		                 rule->r.nprocessors, src_offset, (unsigned long long)src_offset + len, SANTA_REQUEST_WINDOW);
	return append_processor(rule, &p);
}

int santa_proto_rule_check(const struct santa_rule *rule, char *err, size_t errlen)
{
	const char *why = !rule                      ? "no rule"
	                  : rule->err[0]              ? rule->err
	                  : !rule->r.nconditions      ? "a rule needs at least one condition"
	                  : !rule->r.nprocessors      ? "a rule needs at least one processor"
	                                              : NULL;
	if (!why)
		return 0;
	snprintf(err, errlen, "%s", why);
	errno = EINVAL;
	return -1;
}
