/*
 * listing1.c - the Santa paper's Listing 1 with libsanta: an unprivileged UDP
 * server that has santad answer "Hello" with "COMSYS" from the kernel and
 * serves every other request itself.
 *
 *   listing1 [--socket SANTA_SOCKET_PATH] ADDR PORT
 *
 * Binds a UDP socket to ADDR:PORT (an IPv4 or IPv6 literal), adds the rule
 * and prints "ready cookie=<cookie> rule=<id>". Then it answers a datagram
 * "stats" with "hits=<requests the rule answered>" and any other datagram
 * with "app:" and its payload (a "Hello" arrives here only when santad did
 * not answer it). Exits 0 on SIGTERM or SIGINT.
 *
 * Build: cc listing1.c $(pkg-config --cflags --libs santa)
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <santa.h>

static int usage(void)
{
	fprintf(stderr, "usage: listing1 [--socket SANTA_SOCKET_PATH] ADDR PORT\n");
	return 2;
}

/* Opens a UDP socket bound to addr:port. */
static int bind_udp(const char *addr, const char *port)
{
	struct addrinfo hints = { .ai_socktype = SOCK_DGRAM, .ai_flags = AI_NUMERICHOST | AI_NUMERICSERV };
	struct addrinfo *ai;
	int fd, rc = getaddrinfo(addr, port, &hints, &ai);

	if (rc != 0) {
		fprintf(stderr, "listing1: %s port %s: %s\n", addr, port, gai_strerror(rc));
		return -1;
	}
	fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || bind(fd, ai->ai_addr, ai->ai_addrlen) < 0) {
		fprintf(stderr, "listing1: bind %s port %s: %s\n", addr, port, strerror(errno));
		if (fd >= 0)
			close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

/* Serves fd until SIGTERM or SIGINT; the signals arrive on sigfd so a signal
 * between two waits cannot be missed. */
static int serve(int fd, int sigfd, struct santa_client *c, uint64_t cookie, uint64_t rule)
{
	static const char prefix[] = "app:";
	char in[65536], out[sizeof prefix - 1 + sizeof in];
	struct sockaddr_storage peer;

	for (;;) {
		struct pollfd p[2] = { { .fd = fd, .events = POLLIN }, { .fd = sigfd, .events = POLLIN } };
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			perror("listing1: poll");
			return 1;
		}
		if (p[1].revents)
			return 0;
		socklen_t plen = sizeof peer;
		ssize_t n = recvfrom(fd, in, sizeof in, 0, (struct sockaddr *)&peer, &plen);
		if (n < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			perror("listing1: recvfrom");
			return 1;
		}
		size_t len;
		uint64_t hits;
		if (n == 5 && memcmp(in, "stats", 5) == 0) {
			if (santa_stats(c, -1, cookie, rule, &hits, NULL) == 0) {
				len = (size_t)snprintf(out, sizeof out, "hits=%llu", (unsigned long long)hits);
			} else {
				fprintf(stderr, "listing1: stats: %s\n", santa_error(c));
				len = (size_t)snprintf(out, sizeof out, "error: %s", santa_error(c));
			}
		} else {
			memcpy(out, prefix, sizeof prefix - 1);
			memcpy(out + sizeof prefix - 1, in, (size_t)n);
			len = sizeof prefix - 1 + (size_t)n;
		}
		if (sendto(fd, out, len, 0, (struct sockaddr *)&peer, plen) < 0)
			perror("listing1: sendto");
	}
}

int main(int argc, char **argv)
{
	const char *path = NULL; /* NULL: $SANTA_SOCKET or the default */
	struct santa_client *c = NULL;
	struct santa_rule *r = NULL;
	uint64_t cookie, id;
	sigset_t sigs;
	int fd = -1, sigfd = -1, status = 1;

	if (argc == 5 && strcmp(argv[1], "--socket") == 0) {
		path = argv[2];
		argv += 2;
		argc -= 2;
	} else if (argc == 4 && strncmp(argv[1], "--socket=", 9) == 0) {
		path = argv[1] + 9;
		argv++;
		argc--;
	}
	if (argc != 3)
		return usage();

	sigemptyset(&sigs);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGINT);
	if (sigprocmask(SIG_BLOCK, &sigs, NULL) < 0 || (sigfd = signalfd(-1, &sigs, SFD_CLOEXEC)) < 0) {
		perror("listing1: signalfd");
		return 1;
	}
	if ((fd = bind_udp(argv[1], argv[2])) < 0)
		goto out;
	if (!(c = santa_connect(path))) {
		fprintf(stderr, "listing1: %s\n", santa_error(NULL));
		goto out;
	}

	/* Listing 1: match "Hello" at offset 0, reply "COMSYS". */
	const struct santa_rule *rules[1];
	if (!(r = santa_rule_new(6)) || santa_rule_match(r, 0, "Hello", 5) < 0 || santa_rule_put(r, 0, "COMSYS", 6) < 0) {
		fprintf(stderr, "listing1: rule: %s\n", r && santa_rule_error(r) ? santa_rule_error(r) : strerror(errno));
		goto out;
	}
	rules[0] = r;
	/* Passing fd proves the socket is ours; bind returns its cookie. */
	if (santa_bind(c, fd, 0, 0, &cookie) < 0 || santa_add(c, fd, 0, rules, 1, &id) < 0) {
		fprintf(stderr, "listing1: santad refused: %s\n", santa_error(c));
		goto out;
	}
	printf("ready cookie=%llu rule=%llu\n", (unsigned long long)cookie, (unsigned long long)id);
	fflush(stdout);
	status = serve(fd, sigfd, c, cookie, id);
out:
	santa_rule_free(r);
	santa_close(c);
	if (fd >= 0)
		close(fd);
	close(sigfd);
	return status;
}
