// Package dataplane loads Santa's XDP rule processor and its socket release
// hook, attaches them and keeps their maps: rule sets, rules, counters, miss
// samples and released sockets.
// It is the only writer of those maps; everything above it goes through it.
package dataplane

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type santa_region -type santa_ruleset -type santa_cond -type santa_copy -type santa_guard -type santa_rule -type santa_rule_counters -type santa_reasons -type santa_miss_sample -type santa_limit -type santa_local_addr -type santa_tcp_key -type santa_tcp_flow santa ../../bpf/santa_xdp.c -- -I../../bpf
//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types release ../../bpf/santa_release.c -- -I../../bpf
//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -no-global-types handover ../../bpf/santa_handover.c -- -I../../bpf
