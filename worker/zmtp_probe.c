/*
 * Asks a ZeroMQ endpoint which security mechanism it speaks, by reading the
 * first 32 bytes of its ZMTP 3 greeting on a plain socket of our own.
 *
 * Why: when a client's mechanism is not the daemon's, libzmq 4.3.4 tells it so
 * (HANDSHAKE_FAILED_PROTOCOL, mechanism mismatch) only if the daemon's whole
 * greeting reached it first. The daemon queues the rest of its greeting and
 * closes as soon as it has read ours, so about one connection in eight sees
 * nothing but the close, and the client could only say "apsd closed the
 * connection". A greeting that stops after the version makes the daemon send
 * its mechanism and wait for ours: we read it and close.
 */
#include "worker/zmtp_probe.h"

#include "common/err.h"

#include <errno.h>
#include <netdb.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define GREETING_HEAD  12 /* signature (10 bytes), major, minor */
#define MECHANISM_AT   12
#define MECHANISM_LEN  20
#define GREETING_UNTIL (MECHANISM_AT + MECHANISM_LEN)

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until fd is ready for events or the deadline passes: true if ready. */
static bool wait_fd(int fd, short events, int64_t deadline)
{
	struct pollfd p = { .fd = fd, .events = events };
	int left = (int)(deadline - now_ms());

	if (left <= 0)
		return false;
	while (poll(&p, 1, left) < 0)
		if (errno != EINTR)
			return false;
	return (p.revents & (events | POLLHUP | POLLERR)) != 0;
}

/* A non-blocking connect to addr, finished by the deadline: the descriptor or -1. */
static int connect_by(const struct sockaddr *addr, socklen_t len, int family, int64_t deadline)
{
	int fd = socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	int err = 0;
	socklen_t elen = sizeof(err);

	if (fd < 0)
		return -1;
	if (connect(fd, addr, len) == 0)
		return fd;
	if (errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) &&
	    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen) == 0 && err == 0)
		return fd;
	close(fd);
	return -1;
}

/* "host:port" of a tcp endpoint (a "source;" prefix and [v6] brackets allowed). */
static int connect_tcp(const char *where, int64_t deadline)
{
	char host[256];
	const char *semi = strchr(where, ';'), *colon;
	struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
	int fd = -1;

	if (semi != NULL)
		where = semi + 1;
	colon = strrchr(where, ':');
	if (colon == NULL || (size_t)(colon - where) >= sizeof(host))
		return -1;
	if (where[0] == '[' && colon > where + 1 && colon[-1] == ']')
		snprintf(host, sizeof(host), "%.*s", (int)(colon - where - 2), where + 1);
	else
		snprintf(host, sizeof(host), "%.*s", (int)(colon - where), where);
	if (getaddrinfo(host, colon + 1, &hints, &res) != 0)
		return -1;
	for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next)
		fd = connect_by(ai->ai_addr, ai->ai_addrlen, ai->ai_family, deadline);
	freeaddrinfo(res);
	return fd;
}

static int connect_ipc(const char *path, int64_t deadline)
{
	struct sockaddr_un sun = { .sun_family = AF_UNIX };

	if (strlen(path) >= sizeof(sun.sun_path))
		return -1;
	memcpy(sun.sun_path, path, strlen(path));
	if (path[0] == '@') /* ZeroMQ's name for Linux's abstract namespace */
		sun.sun_path[0] = '\0';
	return connect_by((const struct sockaddr *)&sun, sizeof(sun), AF_UNIX, deadline);
}

/* Reads until n bytes are in buf, the peer closes or the deadline passes. */
static size_t read_until(int fd, uint8_t *buf, size_t n, int64_t deadline)
{
	size_t got = 0;

	while (got < n && wait_fd(fd, POLLIN, deadline)) {
		ssize_t r = read(fd, buf + got, n - got);
		if (r > 0)
			got += (size_t)r;
		else if (r == 0 || (errno != EAGAIN && errno != EINTR))
			break;
	}
	return got;
}

int aps_zmtp_probe_mechanism(const char *endpoint, int timeout_ms,
                             char mechanism[APS_ZMTP_MECHANISM_LEN])
{
	/* ZMTP 3.0: 0xff, 8 bytes of padding, 0x7f, version 3.0 */
	static const uint8_t head[GREETING_HEAD] = { 0xff, 0, 0, 0, 0, 0, 0, 0, 0, 0x7f, 3, 0 };
	int64_t deadline = now_ms() + timeout_ms;
	uint8_t greeting[GREETING_UNTIL];
	int fd;
	size_t got;

	if (strncmp(endpoint, "tcp://", 6) == 0)
		fd = connect_tcp(endpoint + 6, deadline);
	else if (strncmp(endpoint, "ipc://", 6) == 0)
		fd = connect_ipc(endpoint + 6, deadline);
	else
		return APS_EINVAL;
	if (fd < 0)
		return APS_ECONN;
	/* send, not write: a daemon that closed first must not kill this process by
	 * SIGPIPE (libaps leaves the caller's signal dispositions alone) */
	got = send(fd, head, sizeof(head), MSG_NOSIGNAL) == (ssize_t)sizeof(head)
	              ? read_until(fd, greeting, sizeof(greeting), deadline)
	              : 0;
	close(fd);
	/* A ZMTP 3 peer: the signature's first and last bytes, major version 3 or more. */
	if (got < sizeof(greeting) || greeting[0] != 0xff || (greeting[9] & 1) == 0 ||
	    greeting[10] < 3)
		return APS_EPROTO;
	memcpy(mechanism, greeting + MECHANISM_AT, MECHANISM_LEN);
	mechanism[MECHANISM_LEN] = '\0';
	return 0;
}
