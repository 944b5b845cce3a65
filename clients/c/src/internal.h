/* internal.h - libsanta internals shared by the library's sources. */
#ifndef SANTA_INTERNAL_H
#define SANTA_INTERNAL_H

#include "santa.h"
#include "proto.h"

/* A rule is built directly in its wire form, so sending it is a shallow copy. */
struct santa_rule {
	struct sp_rule r; /* r.conditions points at conds, r.guards at guards, r.processors at a malloc'd array */
	struct sp_condition conds[SANTA_MAX_CONDITIONS];
	struct sp_guard guards[SANTA_MAX_GUARDS];
	size_t proc_cap;
	char err[200]; /* the first builder failure; non-empty makes the rule unusable */
};

/* 0 if the rule can be sent, else -1 with errno EINVAL and the reason in err. */
int santa_proto_rule_check(const struct santa_rule *rule, char *err, size_t errlen);

#endif
