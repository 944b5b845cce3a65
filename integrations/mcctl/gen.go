package mcctl

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include/x86_64-linux-gnu" -target bpfel -type mc_flow -type mc_flow_key -type mc_udp_key -type mc_counters -type mc_limit tracker bpf/tracker.c -- -I./bpf
