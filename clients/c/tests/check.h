/* check.h - a minimal test harness: CHECK records a failure and goes on. */
#ifndef SANTA_CHECK_H
#define SANTA_CHECK_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int check_failures, check_count;

#define CHECK(cond, ...)                                                      \
	do {                                                                  \
		check_count++;                                                \
		if (!(cond)) {                                                \
			check_failures++;                                     \
			fprintf(stderr, "%s:%d: FAIL %s: ", __FILE__, __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                         \
			fputc('\n', stderr);                                  \
		}                                                             \
	} while (0)

static inline int check_done(const char *name)
{
	printf("%s: %d checks, %d failed\n", name, check_count, check_failures);
	return check_failures ? 1 : 0;
}

/* Hex text to bytes; returns a malloc'd buffer (non-NULL even when empty) or NULL on bad hex. */
static inline unsigned char *unhex(const char *hex, size_t *len)
{
	size_t n = strlen(hex);
	unsigned char *b = malloc(n / 2 + 1);
	*len = 0;
	if (!b || n % 2) {
		free(b);
		return NULL;
	}
	for (size_t i = 0; i < n / 2; i++) {
		unsigned v;
		if (sscanf(hex + 2 * i, "%2x", &v) != 1) {
			free(b);
			return NULL;
		}
		b[i] = (unsigned char)v;
	}
	*len = n / 2;
	return b;
}

#endif
