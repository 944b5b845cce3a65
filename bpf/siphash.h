/* SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause) */
/* SipHash (Aumasson and Bernstein) building blocks: the TCP stamp's MAC
 * (bpf/tcp.h) and the memcached tracker's digests of request bytes
 * (integrations/mcctl/bpf/tracker.c) are both SipHash-2-4. */
#pragma once

#define SIP_ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

/* One SipRound over the state words v0..v3. */
#define SIPROUND(v0, v1, v2, v3)                                                   \
	do {                                                                       \
		v0 += v1; v1 = SIP_ROTL(v1, 13); v1 ^= v0; v0 = SIP_ROTL(v0, 32);  \
		v2 += v3; v3 = SIP_ROTL(v3, 16); v3 ^= v2;                         \
		v0 += v3; v3 = SIP_ROTL(v3, 21); v3 ^= v0;                         \
		v2 += v1; v1 = SIP_ROTL(v1, 17); v1 ^= v2; v2 = SIP_ROTL(v2, 32);  \
	} while (0)

/* The state under key (k0, k1) before the first word. */
#define SIP_INIT0(k0) ((k0) ^ 0x736f6d6570736575ull)
#define SIP_INIT1(k1) ((k1) ^ 0x646f72616e646f6dull)
#define SIP_INIT2(k0) ((k0) ^ 0x6c7967656e657261ull)
#define SIP_INIT3(k1) ((k1) ^ 0x7465646279746573ull)
