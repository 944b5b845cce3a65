// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/* The socket release hook: a socket's rules die with it. */
#include "include/vmlinux.h"
#include <bpf/bpf_helpers.h>
#include "santa.h"
#include "maps.h"

char LICENSE[] SEC("license") = "Dual BSD/GPL";

/* A closing socket that has a rule set is unbound here, before it leaves the
 * kernel's lookup tables, so its rules stop matching at once; user space
 * learns the cookie from santa_released and frees the rules. */
SEC("cgroup/sock_release")
int santa_release(struct bpf_sock *ctx)
{
	__u64 cookie = bpf_get_socket_cookie(ctx);
	/* fails for sockets without rules, and if user space unbound it first */
	if (bpf_map_delete_elem(&santa_sockets, &cookie))
		return 1;
	__u32 word = SANTA_GEN_SOCKETS;
	__u64 *gen = bpf_map_lookup_elem(&santa_gens, &word);
	if (gen)
		__sync_fetch_and_add(gen, 1);
	if (bpf_ringbuf_output(&santa_released, &cookie, sizeof(cookie), 0))
		COUNT(released_dropped);
	return 1;
}
