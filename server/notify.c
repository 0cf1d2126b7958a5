/*
 * sd_notify without libsystemd. This module owns one non-blocking AF_UNIX
 * datagram socket and the address NOTIFY_SOCKET names; each notification is
 * one sendto(2) with MSG_DONTWAIT, so a stuck service manager can never stall
 * the event loop. It does not own timers (main.c pings the watchdog from its
 * loop), does not log, and does not unset the environment variables.
 */
#include "server/notify.h"

#include "common/err.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* Strict positive decimal: digits only, no sign, no overflow, not 0. */
static int parse_positive(const char *s, uint64_t *out)
{
	uint64_t v = 0;

	if (s == NULL || *s == '\0')
		return APS_EINVAL;
	for (; *s != '\0'; s++) {
		unsigned d = (unsigned)(*s - '0');
		if (d > 9 || v > (UINT64_MAX - d) / 10)
			return APS_EINVAL;
		v = v * 10 + d;
	}
	if (v == 0)
		return APS_EINVAL;
	*out = v;
	return 0;
}

/* A path starts with '/'; an abstract name starts with '@', sent as a NUL. */
static int set_address(struct aps_notify *n, const char *name)
{
	size_t len = strlen(name);

	if ((name[0] != '/' && name[0] != '@') || len < 2 || len >= sizeof(n->addr.sun_path))
		return APS_EINVAL;
	n->addr.sun_family = AF_UNIX;
	memcpy(n->addr.sun_path, name, len);
	if (name[0] == '@')
		n->addr.sun_path[0] = '\0';
	n->addr_len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + len);
	return 0;
}

/* WATCHDOG_USEC applies to this process unless WATCHDOG_PID names another. */
static int read_watchdog(uint64_t *usec)
{
	const char *usec_env = getenv("WATCHDOG_USEC");
	const char *pid_env = getenv("WATCHDOG_PID");
	uint64_t value, pid;

	if (usec_env == NULL)
		return 0;
	if (parse_positive(usec_env, &value) < 0 || value == UINT64_MAX)
		return APS_EINVAL;
	if (pid_env != NULL && parse_positive(pid_env, &pid) < 0)
		return APS_EINVAL;
	if (pid_env != NULL && pid != (uint64_t)getpid())
		return 0;
	*usec = value;
	return 0;
}

/* Half the watchdog period, in milliseconds, at least 1 (0: no watchdog). */
static int ping_interval_ms(uint64_t usec)
{
	uint64_t ms = usec / 2000;

	if (usec == 0)
		return 0;
	if (ms == 0)
		return 1;
	return ms > INT_MAX ? INT_MAX : (int)ms;
}

int aps_notify_init(struct aps_notify *n)
{
	const char *name = getenv("NOTIFY_SOCKET");
	int ret;

	*n = (struct aps_notify){ .fd = -1 };
	if (name == NULL)
		return 0;
	if (set_address(n, name) < 0)
		return APS_EINVAL;
	n->fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (n->fd < 0) {
		n->sys_errno = errno;
		return APS_ESYS;
	}
	ret = read_watchdog(&n->watchdog_usec);
	if (ret < 0)
		return ret;
	return ping_interval_ms(n->watchdog_usec);
}

bool aps_notify_enabled(const struct aps_notify *n)
{
	return n->fd >= 0;
}

static int send_text(struct aps_notify *n, const char *text, size_t len)
{
	if (n->fd < 0)
		return 0;
	if (sendto(n->fd, text, len, MSG_DONTWAIT | MSG_NOSIGNAL, (const struct sockaddr *)&n->addr,
	           n->addr_len) >= 0)
		return 0;
	n->sys_errno = errno;
	return errno == EAGAIN || errno == EWOULDBLOCK ? APS_EBUSY : APS_ESYS;
}

int aps_notify_ready(struct aps_notify *n)
{
	return send_text(n, "READY=1", 7);
}

int aps_notify_stopping(struct aps_notify *n)
{
	return send_text(n, "STOPPING=1", 10);
}

int aps_notify_watchdog(struct aps_notify *n)
{
	return send_text(n, "WATCHDOG=1", 10);
}

/* MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match this reload. */
int aps_notify_reloading(struct aps_notify *n)
{
	struct timespec ts;
	char buf[64];
	int len;

	if (n->fd < 0)
		return 0;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	len = snprintf(buf, sizeof(buf), "RELOADING=1\nMONOTONIC_USEC=%llu",
	               (unsigned long long)ts.tv_sec * 1000000ULL +
	                       (unsigned long long)ts.tv_nsec / 1000ULL);
	return send_text(n, buf, (size_t)len);
}

int aps_notify_status(struct aps_notify *n, const char *fmt, ...)
{
	static const char prefix[] = "STATUS=";
	char buf[sizeof(prefix) + APS_NOTIFY_STATUS_MAX];
	size_t len = sizeof(prefix) - 1;
	va_list ap;
	int body;

	if (n->fd < 0)
		return 0;
	memcpy(buf, prefix, len);
	va_start(ap, fmt);
	body = vsnprintf(buf + len, sizeof(buf) - len, fmt, ap);
	va_end(ap);
	if (body < 0)
		return APS_EINVAL;
	len += (size_t)body < sizeof(buf) - len ? (size_t)body : sizeof(buf) - len - 1;
	for (size_t i = sizeof(prefix) - 1; i < len; i++)
		buf[i] = buf[i] == '\n' ? ' ' : buf[i];
	return send_text(n, buf, len);
}

void aps_notify_close(struct aps_notify *n)
{
	if (n->fd >= 0)
		close(n->fd);
	n->fd = -1;
}
