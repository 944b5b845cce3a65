/*
 * redial_driver.c - TestClientRedial's C part: one libsanta client across
 * restarts of santad.
 *
 *   SANTA_SOCKET=... redial_driver ADDR PORT
 *
 * Binds a UDP socket to ADDR:PORT, adds a rule for it and prints
 * "added <id>"; then, for every line on stdin, lists the socket's rules on
 * the same client and prints "listed <id> ..." or
 * "error errno=<errno> <santa_error()>".
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <santa.h>

int main(int argc, char **argv)
{
	struct sockaddr_in sa = { .sin_family = AF_INET };
	struct santa_client *c;
	struct santa_rule *r;
	struct santa_rule_info *infos;
	uint64_t id;
	size_t n;
	char line[64];
	int udp;

	if (argc != 3 || inet_pton(AF_INET, argv[1], &sa.sin_addr) != 1)
		return fprintf(stderr, "usage: redial_driver ADDR PORT\n"), 2;
	sa.sin_port = htons((uint16_t)atoi(argv[2]));
	udp = socket(AF_INET, SOCK_DGRAM, 0);
	if (udp < 0 || bind(udp, (struct sockaddr *)&sa, sizeof sa) < 0)
		return perror("udp socket"), 1;
	if (!(c = santa_connect(NULL)))
		return fprintf(stderr, "%s\n", santa_error(NULL)), 1;
	r = santa_rule_new(4);
	santa_rule_match(r, 0, "ping", 4);
	santa_rule_put(r, 0, "pong", 4);
	const struct santa_rule *rules[] = { r };
	if (santa_add(c, udp, 0, rules, 1, &id) < 0)
		return fprintf(stderr, "add: %s\n", santa_error(c)), 1;
	santa_rule_free(r);
	printf("added %llu\n", (unsigned long long)id);
	fflush(stdout);
	while (fgets(line, sizeof line, stdin)) {
		errno = 0;
		if (santa_list_rules(c, udp, 0, &infos, &n) < 0) {
			printf("error errno=%d %s\n", errno, santa_error(c));
		} else {
			printf("listed");
			for (size_t i = 0; i < n; i++)
				printf(" %llu", (unsigned long long)infos[i].id);
			printf("\n");
			santa_rule_info_free(infos);
		}
		fflush(stdout);
	}
	santa_close(c);
	return 0;
}
