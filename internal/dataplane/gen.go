// Package dataplane loads Santa's XDP rule processor, attaches it to
// interfaces and keeps its maps: rule sets, rules, counters and miss samples.
// It is the only writer of those maps; everything above it goes through it.
package dataplane

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type santa_region -type santa_ruleset -type santa_cond -type santa_copy -type santa_rule -type santa_rule_counters -type santa_reasons -type santa_miss_sample -type santa_limit -type santa_local_addr santa ../../bpf/santa_xdp.c -- -I../../bpf
