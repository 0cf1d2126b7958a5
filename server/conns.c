/* The daemon's connections: ids, duplicates, deadlines, causes of closes (conns.h). */
#include "server/conns.h"

#include "server/admission.h"

#include "common/err.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/tcp.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define GONE_EVENTS   (POLLRDHUP | POLLHUP | POLLERR)
#define ORPHAN_SLICES 8

void aps_conns_init(struct aps_conns *t, size_t max, uint64_t join_timeout_ms)
{
	memset(t, 0, sizeof(*t));
	t->max = max;
	t->join_timeout_ms = join_timeout_ms;
}

/* ipc says nothing of what was read: a parked pipe may hold this much, or more. */
#define UNSEEN_READ_BYTES (1u << 20)

static struct aps_conn *slot_of_id(struct aps_conns *t, uint64_t id)
{
	uint64_t fd = (id & 0xffffffffu) - 1;

	if (id == 0 || fd >= t->cap || t->slots[fd].id != id)
		return NULL;
	return &t->slots[fd];
}

struct aps_conn *aps_conns_find(struct aps_conns *t, uint64_t id)
{
	return slot_of_id(t, id);
}

uint64_t aps_conns_id(const struct aps_conns *t, int fd)
{
	uint32_t accepts;

	if (fd < 0)
		return 0;
	/* The id even after the close was read: its last messages may still come. */
	accepts = (size_t)fd < t->cap ? t->slots[fd].accepts : 0;
	return (uint64_t)accepts << 32 | ((uint64_t)(uint32_t)fd + 1);
}

static int grow(struct aps_conns *t, int fd)
{
	size_t cap = (size_t)fd + 1 > 2 * t->cap ? (size_t)fd + 1 : 2 * t->cap;
	struct aps_conn *grown = realloc(t->slots, cap * sizeof(*grown));

	if (grown == NULL)
		return APS_ENOMEM;
	memset(grown + t->cap, 0, (cap - t->cap) * sizeof(*grown));
	t->slots = grown;
	t->cap = cap;
	return 0;
}

static void describe_peer(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	snprintf(buf, len, "unknown");
	if (fd < 0 || getpeername(fd, (struct sockaddr *)&ss, &sl) < 0)
		return;
	if (ss.ss_family == AF_INET) {
		struct sockaddr_in *in = (struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		port = ntohs(in->sin_port);
	} else if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		port = ntohs(in6->sin6_port);
	} else {
		snprintf(buf, len, "local");
		return;
	}
	snprintf(buf, len, "%s:%d", host, port);
}

void aps_conns_handshake_failed(struct aps_conns *t)
{
	t->handshake_failures++;
	t->cnt.handshakes_failed++;
}

void aps_conns_handshake_succeeded(struct aps_conns *t)
{
	t->handshakes++;
}

size_t aps_conns_parked(const struct aps_conns *t)
{
	uint64_t quiet = 0; /* open, no message yet: handshaken or not, it is not counted */

	for (size_t fd = 0; fd < t->cap; fd++)
		quiet += t->slots[fd].id != 0 && t->slots[fd].msgs == 0;
	if (t->handshakes <= t->delivering + quiet)
		return 0;
	return (size_t)(t->handshakes - t->delivering - quiet);
}

uint64_t aps_conns_parked_bytes(const struct aps_conns *t)
{
	size_t parked = aps_conns_parked(t);

	return parked == 0 ? 0 : parked * (uint64_t)APS_CONNS_PARKED_BYTES + t->silent_read;
}

/*
 * Looks at c's socket: what it received (TCP_INFO) and what waits unread in it
 * (FIONREAD), once per loop turn (now) at most. What waits unread changes only
 * when bytes come or ZeroMQ reads: with nothing received since a look that found
 * nothing waiting, nothing does, and FIONREAD is not asked. An idle connection
 * costs one system call a tick: 3000 idle connections, looked at with seven
 * each, took a fifth of an honest job's steps (an attack on 2026-12-07).
 */
static void look(struct aps_conn *c, uint64_t now)
{
	struct tcp_info ti;
	socklen_t len = sizeof(ti);
	int unread = 0;

	if (c->look_ms == now && now != 0)
		return;
	c->look_ms = now;
	memset(&ti, 0, sizeof(ti));
	c->look_tcp = c->dup >= 0 && getsockopt(c->dup, IPPROTO_TCP, TCP_INFO, &ti, &len) == 0 &&
	              len >= offsetof(struct tcp_info, tcpi_bytes_received) +
	                              sizeof(ti.tcpi_bytes_received);
	if (!c->look_tcp) {
		if (c->dup < 0 || ioctl(c->dup, FIONREAD, &unread) < 0 || unread < 0)
			unread = 0;
		c->unread = unread;
		return;
	}
	if (ti.tcpi_bytes_received != c->received || c->unread != 0) {
		if (ioctl(c->dup, FIONREAD, &unread) < 0 || unread < 0)
			unread = 0;
		c->unread = unread;
	}
	c->received = ti.tcpi_bytes_received;
}

/* Bytes ZeroMQ read of c, a TCP connection: received less what still waits unread
 * in the socket (as of this loop turn). False for another kind of socket. */
static bool tcp_bytes_read(struct aps_conn *c, uint64_t now, uint64_t *read)
{
	look(c, now);
	if (!c->look_tcp)
		return false;
	*read = c->received > (uint64_t)c->unread ? c->received - (uint64_t)c->unread : 0;
	return true;
}

static bool peer_gone(int fd)
{
	struct pollfd p = { .fd = fd, .events = POLLRDHUP };

	return fd >= 0 && poll(&p, 1, 0) == 1 && (p.revents & GONE_EVENTS);
}

static enum aps_conn_cause cause_of(struct aps_conns *t, const struct aps_conn *c)
{
	if (c->dropped_ms != 0)
		return APS_CONN_DROPPED;
	if (c->dup < 0 || peer_gone(c->dup))
		return APS_CONN_PEER;
	if (c->msgs == 0 && t->handshake_failures > 0) {
		t->handshake_failures--;
		return APS_CONN_HANDSHAKE;
	}
	t->cnt.zmtp_refused++;
	return APS_CONN_ZMTP;
}

static int push_closed(struct aps_conns *t, uint64_t id)
{
	if (t->n_closed == t->cap_closed) {
		size_t cap = t->cap_closed ? 2 * t->cap_closed : 16;
		uint64_t *grown = realloc(t->closed, cap * sizeof(*grown));
		if (grown == NULL)
			return APS_ENOMEM;
		t->closed = grown;
		t->cap_closed = cap;
	}
	t->closed[t->n_closed++] = id;
	return 0;
}

/* The slot's connection is over: its id is reported, its duplicate closed. */
static void retire(struct aps_conns *t, struct aps_conn *c)
{
	if (c->from != NULL)
		aps_addrs_close(&t->addrs, c->from, c->admitted);
	c->from = NULL;
	push_closed(t, c->id);
	if (c->dup >= 0)
		close(c->dup);
	c->dup = -1;
	c->id = 0;
	t->live--;
}

/* A duplicate of fd when it is (still) a connected stream socket, else -1: by the
 * time the accept is read the number may be another connection's or a file's. */
static int dup_stream(int fd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int type = 0;
	socklen_t tl = sizeof(type);
	int d = fcntl(fd, F_DUPFD_CLOEXEC, 0);

	if (d < 0)
		return -1;
	if (getsockopt(d, SOL_SOCKET, SO_TYPE, &type, &tl) < 0 || type != SOCK_STREAM ||
	    getpeername(d, (struct sockaddr *)&ss, &sl) < 0) {
		close(d);
		return -1;
	}
	return d;
}

int aps_conns_accepted(struct aps_conns *t, int fd, uint64_t now)
{
	char ip[INET6_ADDRSTRLEN];
	struct aps_conn *c;

	if (fd < 0)
		return APS_EINVAL;
	if ((size_t)fd >= t->cap && grow(t, fd) < 0)
		return APS_ENOMEM;
	c = &t->slots[fd];
	if (c->id != 0)
		retire(t, c); /* its close was never read: the number is a new connection's */
	*c = (struct aps_conn){ .accepts = c->accepts + 1, .accepted_ms = now };
	c->id = aps_conns_id(t, fd);
	c->deadline_ms = now + t->join_timeout_ms;
	c->dup = dup_stream(fd);
	describe_peer(c->dup, c->address, sizeof(c->address));
	t->live++;
	t->cnt.accepted++;
	if (t->live > t->max) {
		t->cnt.refused++;
		aps_conns_drop(t, c->id, now);
		return APS_EBUSY;
	}
	if (!aps_admission_ip_of(c->address, ip) ||
	    (c->from = aps_addrs_open(&t->addrs, ip)) == NULL)
		return 0;
	if (t->max_per_address == 0 || c->from->open <= t->max_per_address ||
	    aps_admission_exempt(ip))
		return 0;
	t->cnt.refused_address++;
	aps_conns_drop(t, c->id, now);
	return APS_ERANGE;
}

const char *aps_conns_address(const struct aps_conns *t, int fd)
{
	return fd >= 0 && (size_t)fd < t->cap ? t->slots[fd].address : "";
}

int aps_conns_closed(struct aps_conns *t, int fd, const char **address)
{
	struct aps_conn *c;
	int cause;

	if (fd < 0 || (size_t)fd >= t->cap || t->slots[fd].id == 0)
		return -1;
	c = &t->slots[fd];
	cause = (int)cause_of(t, c);
	if (address != NULL)
		*address = c->address; /* the slot keeps it until its next accept */
	if (c->msgs == 0) {
		uint64_t read = 0;
		c->look_ms = 0; /* closed now: a fresh look */
		t->silent_read += tcp_bytes_read(c, 0, &read) ? read : UNSEEN_READ_BYTES;
	}
	retire(t, c);
	return cause;
}

/* Whether c, open, is from ip (its "ip:port", admission.h). */
static bool open_from(const struct aps_conn *c, const char *ip)
{
	char its[INET6_ADDRSTRLEN];

	return c->id != 0 && aps_admission_ip_of(c->address, its) && strcmp(its, ip) == 0;
}

bool aps_conns_joined_from(struct aps_conns *t, const char *ip)
{
	const struct aps_addrs_entry *e = aps_addrs_find(&t->addrs, ip);

	return e != NULL && e->joined > 0;
}

uint32_t aps_conns_quiet_from(const struct aps_conns *t, const char *ip, uint32_t most,
                              uint64_t since_ms)
{
	uint32_t n = 0;

	for (size_t fd = 0; fd < t->cap && n < most; fd++) {
		const struct aps_conn *c = &t->slots[fd];
		n += c->msgs == 0 && c->accepted_ms >= since_ms && open_from(c, ip);
	}
	return n;
}

/* c, a TCP connection, read more than a handshake and a HELLO before its first
 * message (conns.h): it is dropped. */
static bool read_unheard(struct aps_conns *t, struct aps_conn *c, uint64_t now)
{
	uint64_t read;

	if (c->dropped_ms != 0 || c->dup < 0 || !tcp_bytes_read(c, now, &read) ||
	    read <= APS_CONNS_UNHEARD_MAX)
		return false;
	c->unheard = true;
	t->cnt.unheard++;
	snprintf(t->unheard_address, sizeof(t->unheard_address), "%s", c->address);
	aps_conns_drop(t, c->id, now);
	return true;
}

enum aps_conns_delivery aps_conns_delivered(struct aps_conns *t, uint64_t id,
                                            const struct aps_peer *peer, uint64_t now)
{
	uint64_t fd = (id & 0xffffffffu) - 1;
	struct aps_conn *c;

	/* Also when its close was read already: the last messages come after it. */
	if (id == 0 || fd >= t->cap || t->slots[fd].accepts != (uint32_t)(id >> 32))
		return APS_CONNS_LATER;
	c = &t->slots[fd];
	if (c->unheard) /* dropped at a tick, before its first message came */
		return APS_CONNS_UNHEARD;
	if (c->msgs++ != 0)
		return APS_CONNS_LATER;
	c->peer = *peer;
	t->delivering++;
	return read_unheard(t, c, now) ? APS_CONNS_UNHEARD : APS_CONNS_FIRST;
}

void aps_conns_admit(struct aps_conns *t, uint64_t id, bool admitted, uint64_t now)
{
	struct aps_conn *c = slot_of_id(t, id);
	if (c == NULL)
		return;
	if (c->from != NULL && c->admitted != admitted)
		aps_addrs_join(c->from, admitted ? 1 : -1);
	c->deadline_ms = admitted ? 0 : now + t->join_timeout_ms;
	c->admitted = admitted;
}

int aps_conns_drop(struct aps_conns *t, uint64_t id, uint64_t now)
{
	struct aps_conn *c = slot_of_id(t, id);

	if (c == NULL)
		return APS_EINVAL;
	if (c->dup < 0)
		return APS_ESYS; /* nothing to shut it with: ZeroMQ's own number may be reused */
	if (c->dropped_ms == 0)
		c->dropped_ms = now > 0 ? now : 1;
	/* ZeroMQ reads end-of-file on its own descriptor and closes the connection. */
	if (c->dup >= 0)
		shutdown(c->dup, SHUT_RDWR);
	return 0;
}

size_t aps_conns_drop_peer(struct aps_conns *t, const struct aps_peer *peer, uint64_t now)
{
	size_t n = 0;

	for (size_t fd = 0; fd < t->cap; fd++) {
		struct aps_conn *c = &t->slots[fd];
		if (c->id != 0 && c->msgs > 0 && aps_peer_equal(&c->peer, peer)) {
			aps_conns_drop(t, c->id, now);
			n++;
		}
	}
	return n;
}

/* Marks the connections whose peer has hung up (ZeroMQ should close them soon). */
static void note_gone(struct aps_conns *t, uint64_t now)
{
	struct pollfd *p = malloc((t->live ? t->live : 1) * sizeof(*p));
	size_t *slot = malloc((t->live ? t->live : 1) * sizeof(*slot));
	size_t n = 0;

	for (size_t fd = 0; p != NULL && slot != NULL && fd < t->cap && n < t->live; fd++) {
		const struct aps_conn *c = &t->slots[fd];
		if (c->id == 0 || c->dup < 0 || c->gone_ms != 0 || c->dropped_ms != 0)
			continue;
		slot[n] = fd;
		p[n++] = (struct pollfd){ .fd = c->dup, .events = POLLRDHUP };
	}
	if (n > 0 && poll(p, n, 0) > 0) {
		for (size_t i = 0; i < n; i++) {
			if (p[i].revents & GONE_EVENTS)
				t->slots[slot[i]].gone_ms = now;
		}
	}
	free(slot);
	free(p);
}

/* Bytes wait unread in the socket, and nothing came of it since the last look. */
static void note_backlog(struct aps_conn *c, uint64_t now)
{
	int queued = 0;

	if (c->dup >= 0) {
		look(c, now);
		queued = c->unread;
	}
	if (queued == 0 || (c->backlog_ms != 0 && c->msgs != c->backlog_msgs)) {
		c->backlog_ms = 0;
		if (queued == 0)
			return;
	}
	if (c->backlog_ms == 0) {
		c->backlog_ms = now;
		c->backlog_msgs = c->msgs;
	}
}

static bool stuck(struct aps_conn *c, uint64_t now)
{
	uint64_t since = c->dropped_ms ? c->dropped_ms : c->gone_ms;

	note_backlog(c, now);
	if (c->backlog_ms != 0 && now - c->backlog_ms >= APS_CONNS_STUCK_MS)
		return true;
	return since != 0 && now - since >= APS_CONNS_STUCK_MS;
}

/* ZeroMQ's descriptor no longer is the socket apsd's duplicate holds: ZeroMQ
 * closed it without an event (it does so when it terminates a listener). */
static bool orphaned(int fd, int dup)
{
	struct stat a, b;

	if (dup < 0)
		return false;
	if (fstat(dup, &b) < 0)
		return true;
	return fstat(fd, &a) < 0 || a.st_ino != b.st_ino || a.st_dev != b.st_dev;
}

/* A connection that read more than max_unfinished_bytes since the last tick at which
 * it had delivered a message sends a message without end (frames flagged MORE):
 * libzmq would keep all of it. */
static void check_unfinished(struct aps_conns *t, struct aps_conn *c, uint64_t now)
{
	uint64_t read;

	if (c->id == 0 || c->dropped_ms != 0 || c->dup < 0 || t->max_unfinished_bytes == 0)
		return;
	if (!tcp_bytes_read(c, now, &read))
		return;
	if (c->msgs != c->tick_msgs || read < c->read_mark) {
		c->tick_msgs = c->msgs;
		c->read_mark = read;
		return;
	}
	if (read - c->read_mark <= t->max_unfinished_bytes)
		return;
	t->cnt.unfinished++;
	aps_conns_drop(t, c->id, now);
}

void aps_conns_drop_unheard(struct aps_conns *t, uint64_t now)
{
	for (size_t fd = 0; fd < t->cap; fd++) {
		struct aps_conn *c = &t->slots[fd];
		if (c->id != 0 && c->msgs == 0) /* in its handshake, or parked */
			read_unheard(t, c, now);
	}
}

size_t aps_conns_tick(struct aps_conns *t, uint64_t now)
{
	size_t n_stuck = 0;

	t->ticks++;
	for (size_t fd = 0; fd < t->cap; fd++) {
		struct aps_conn *c = &t->slots[fd];
		/* two fstat each: an eighth of them a tick, each every 2 s */
		if (c->id != 0 && fd % ORPHAN_SLICES == t->ticks % ORPHAN_SLICES &&
		    orphaned((int)fd, c->dup))
			retire(t, c);
		check_unfinished(t, c, now);
	}
	for (size_t fd = 0; fd < t->cap; fd++) {
		struct aps_conn *c = &t->slots[fd];
		if (c->id == 0 || c->deadline_ms == 0 || now < c->deadline_ms || c->dropped_ms)
			continue;
		if (c->dup < 0) { /* it cannot be shut: TCP keepalive will end it */
			c->deadline_ms = 0;
			continue;
		}
		t->cnt.unjoined_dropped++;
		aps_conns_drop(t, c->id, now);
	}
	note_gone(t, now);
	for (size_t fd = 0; fd < t->cap; fd++)
		n_stuck += t->slots[fd].id != 0 && stuck(&t->slots[fd], now);
	return n_stuck;
}

void aps_conns_forget_all(struct aps_conns *t)
{
	for (size_t fd = 0; fd < t->cap; fd++) {
		if (t->slots[fd].id != 0)
			retire(t, &t->slots[fd]);
	}
	t->handshake_failures = t->handshakes = t->delivering = t->silent_read = 0;
}

uint64_t *aps_conns_take_closed(struct aps_conns *t, size_t *n)
{
	uint64_t *ids = t->closed;

	*n = t->n_closed;
	t->closed = NULL;
	t->n_closed = t->cap_closed = 0;
	return ids;
}

void aps_conns_free(struct aps_conns *t)
{
	for (size_t fd = 0; fd < t->cap; fd++) {
		if (t->slots[fd].id != 0 && t->slots[fd].dup >= 0)
			close(t->slots[fd].dup);
	}
	free(t->slots);
	free(t->closed);
	aps_addrs_free(&t->addrs);
	memset(t, 0, sizeof(*t));
}
