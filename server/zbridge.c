/*
 * ZeroMQ inside libuv: the bridge's ROUTER socket, its life and its reset
 * (messages in and out are zbridge_pump.c's). The socket is watched by a
 * monitor that says which descriptor each connection has (conns.h).
 *
 * What libzmq 4.3 gets wrong with hostile peers, and what this file does
 * instead (docs/RELIABILITY.md): no ZMTP heartbeats (an engine whose input
 * had stopped aborts the process on its next heartbeat once its peer hangs
 * up: libzmq issues 3937, 4364, 4767), liveness is the protocol's
 * (HEARTBEAT flagged ALIVE, server.c); no ROUTER_HANDOVER (the engine of a
 * connection taken over is never freed: a descriptor per takeover), a session
 * is taken back by its token instead. A connection that reuses a live routing
 * id is still parked by libzmq and, once flooded and closed, never freed:
 * conns.c finds such stuck connections and this file then resets the
 * listener, which frees them with every other connection (each client
 * reconnects and takes its session back). Parked connections that closed in
 * time cannot be told from connections that closed without a word; what they
 * may hold is counted in bytes (conns.h) and an address whose connections
 * keep closing so is turned away at the handshake (admission.h), so that a
 * stranger's flood costs no reset.
 */
#include "server/hostlimits.h"
#include "server/netlist.h"
#include "server/zbridge_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <zmq.h>

#define TICK_MS 250
/* libzmq's reaper frees a closed socket's pipes later, on its own thread: after a
 * reset the heap is trimmed at every tick for this long, not only once. */
#define RESET_TRIM_MS 3000
/* The same after a connection that read too much before it spoke was dropped
 * (what libzmq parsed of a large handshake is freed on its I/O thread, up to a
 * second later), but once a second at most: a trim walks the heap under
 * malloc's lock (30 ms once a 4 MB handshake's 500000 properties were freed). */
#define UNHEARD_TRIM_EVERY_MS 1000
/* A flood on a parked connection costs one listener reset, at most this often. */
#define RESET_INTERVAL_MS 10000
#define STUCK_URGENT      64             /* descriptors: reset now */
#define PARKED_MAX_BYTES  (64ULL << 20)  /* parked connections may hold this much: reset */
#define PARKED_URGENT     (512ULL << 20) /* even within RESET_INTERVAL_MS */
#define PARKED_LINGER     8              /* parked this many for LINGER_MS: reset */
/* A few parked ones cost little (about 11 KiB each): they wait for a reset this long.
 * Connections that close without a word are counted as parked, though most are not
 * (scanners, workers killed before their HELLO); admission.h turns their address
 * away before it can cost a reset every RESET_INTERVAL_MS. */
#define LINGER_MS       600000
#define RESET_URGENT_MS 2000 /* even then, at most one reset in this time */
/* What a parked connection can hold: its pipe's messages (each up to max_message_bytes). */
#define ROUTER_RCVHWM 256
#define RESET_POLL_MS 10
#define MONITOR_EVENTS                                                           \
	(ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_ACCEPT_FAILED | ZMQ_EVENT_DISCONNECTED | \
	 ZMQ_EVENT_HANDSHAKE_SUCCEEDED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |  \
	 ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)

static int set_int(void *sock, int opt, int value)
{
	return zmq_setsockopt(sock, opt, &value, sizeof(value));
}

/* The ZAP handler (started once) on the ROUTER: it refuses addresses outside
 * allow_from or turned away and, with CURVE, keys not allowed. Without any of
 * them it is not asked. */
static int enable_zap(struct aps_zbridge *b, void *router)
{
	const struct aps_zbridge_opts *o = &b->opts;
	bool curve = o->curve_secret != NULL;
	int ret = 0;

	if (!curve && o->max_silent_closes == 0 && b->allow_from.n == 0)
		return 0;
	if (b->zap == NULL)
		ret = aps_zap_start(&b->zap, b->zctx, b->loop, b, curve, o->curve_allow,
		                    o->n_curve_allow);
	if (ret < 0) {
		aps_log_error("zbridge", "cannot start the ZAP handler: %s", aps_strerror(ret));
		return ret;
	}
	if (curve) {
		set_int(router, ZMQ_CURVE_SERVER, 1);
		if (zmq_setsockopt(router, ZMQ_CURVE_SECRETKEY, o->curve_secret, 40) < 0) {
			aps_log_error("zbridge", "the CURVE secret key is not a Z85 key");
			return APS_EINVAL;
		}
	}
	return zmq_setsockopt(router, ZMQ_ZAP_DOMAIN, "apsd", 4) < 0 ? APS_ECONN : 0;
}

/* allow_from, at accept: libzmq closes a connection from elsewhere before it
 * reads a byte of it. The ZAP handler refuses only once libzmq has parsed the
 * handshake, and 4 MB of handshake properties cost its I/O thread 0.7 s: 47
 * from outside allow_from in 6 s cut an honest job from 1150 to 4-11 steps a
 * second (an attack, 2026-12-07). 127.0.0.1 and ::1 come in, as at ZAP. */
/* One accept filter; APS_ECONN when libzmq takes none. */
static int add_filter(void *router, const char *net)
{
	if (zmq_setsockopt(router, ZMQ_TCP_ACCEPT_FILTER, net, strlen(net)) == 0)
		return 0;
	aps_log_error("zbridge", "libzmq takes no accept filter %s: %s", net,
	              zmq_strerror(zmq_errno()));
	return APS_ECONN;
}

/* Bit i (0: the first) of a 16-byte address. */
static unsigned bit_of(const uint8_t a[16], unsigned i)
{
	return (a[i / 8] >> (7 - i % 8)) & 1u;
}

/*
 * An IPv6 network as filters that leave out the IPv4-mapped addresses
 * (::ffff:0:0/96), which allow_from's IPv6 networks do not hold (netlist.h: a
 * mapped peer is its IPv4 address): ::/0 let every IPv4 peer past accept, and
 * the ZAP handler refused it only after its handshake was parsed. A network
 * that holds the mapped ones is written as the 96 - prefix networks beside
 * them within it.
 */
static int add_ipv6_filter(void *router, const struct aps_net *n)
{
	static const uint8_t mapped[16] = { [10] = 0xff, [11] = 0xff };
	char net[INET6_ADDRSTRLEN + 8], addr[INET6_ADDRSTRLEN];
	uint8_t side[16];
	unsigned i;

	for (i = 0; i < n->prefix && i < 96 && bit_of(n->addr, i) == bit_of(mapped, i); i++)
		;
	if (i < n->prefix || n->prefix > 96) { /* holds none of them */
		aps_netlist_format(n, net, sizeof(net));
		return add_filter(router, net);
	}
	for (i = n->prefix; i < 96; i++) { /* mapped's first i bits, then the other bit i */
		memcpy(side, mapped, sizeof(side));
		side[i / 8] ^= (uint8_t)(0x80u >> (i % 8));
		inet_ntop(AF_INET6, side, addr, sizeof(addr));
		snprintf(net, sizeof(net), "%s/%u", addr, i + 1);
		if (add_filter(router, net) < 0)
			return APS_ECONN;
	}
	return 0;
}

/*
 * allow_from as libzmq's accept filters, and the host's own addresses. An IPv4
 * listener sees no IPv6 peer: its IPv6 networks are not filters (libzmq takes
 * none, and apsd did not start). An IPv6 one sees an IPv4 peer as IPv4-mapped
 * (::ffff:10.1.2.3), and reads an IPv4 filter as such an address, its prefix
 * counted from the first bit (10.0.0.0/8 let in every IPv4 peer): each IPv4
 * network is written mapped, its prefix 96 bits longer, and each IPv6 one
 * without the mapped addresses (add_ipv6_filter).
 */
static int set_accept_filters(const struct aps_netlist *nets, void *router, bool ipv6)
{
	char net[INET6_ADDRSTRLEN + 8], addr[INET_ADDRSTRLEN];

	if (nets->n == 0)
		return 0;
	for (size_t i = 0; i < nets->n; i++) {
		const struct aps_net *n = &nets->nets[i];
		if (n->family == AF_INET6 && !ipv6)
			continue;
		if (n->family == AF_INET6) {
			if (add_ipv6_filter(router, n) < 0)
				return APS_ECONN;
			continue;
		}
		if (ipv6) {
			inet_ntop(AF_INET, n->addr, addr, sizeof(addr));
			snprintf(net, sizeof(net), "::ffff:%s/%u", addr, 96 + n->prefix);
		} else {
			aps_netlist_format(n, net, sizeof(net));
		}
		if (add_filter(router, net) < 0)
			return APS_ECONN;
	}
	if (ipv6)
		return add_filter(router, "::1/128") < 0 ||
		                       add_filter(router, "::ffff:127.0.0.1/128") < 0
		               ? APS_ECONN
		               : 0;
	return add_filter(router, "127.0.0.1/32");
}

/* ROUTER options: no ZMTP heartbeats and no handover (see the top of this file). */
static void set_router_options(const struct aps_zbridge_opts *o, void *router)
{
	int64_t max_msg = o->max_message_bytes;

	set_int(router, ZMQ_ROUTER_MANDATORY, 1);
	set_int(router, ZMQ_LINGER, 0);
	set_int(router, ZMQ_RCVHWM, ROUTER_RCVHWM);
	/* A peer whose host vanished without a word is found by the protocol's liveness;
	 * TCP keepalive frees the connections that no session watches. */
	set_int(router, ZMQ_TCP_KEEPALIVE, 1);
	set_int(router, ZMQ_TCP_KEEPALIVE_IDLE, 60);
	set_int(router, ZMQ_TCP_KEEPALIVE_INTVL, 10);
	set_int(router, ZMQ_TCP_KEEPALIVE_CNT, 3);
	if (max_msg > 0)
		zmq_setsockopt(router, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg));
}

static int open_monitor(struct aps_zbridge *b)
{
	static unsigned serial;
	char addr[80];

	snprintf(addr, sizeof(addr), "inproc://apsd-monitor-%p-%u", (void *)b, serial++);
	if (zmq_socket_monitor(b->router, addr, MONITOR_EVENTS) < 0)
		return APS_ECONN;
	b->monitor = zmq_socket(b->zctx, ZMQ_PAIR);
	if (b->monitor == NULL)
		return APS_ECONN;
	/* No bound: libzmq's I/O thread sends the events with blocking sends. */
	set_int(b->monitor, ZMQ_RCVHWM, 0);
	set_int(b->monitor, ZMQ_LINGER, 0);
	if (zmq_connect(b->monitor, addr) < 0)
		return APS_ECONN;
	return 0;
}

/* One of the bridge's handles closed; the last one frees the bridge. */
static void handle_gone(struct aps_zbridge *b)
{
	if (--b->open_handles == 0) {
		aps_conns_free(&b->conns);
		free(b);
	}
}

static void free_handle_cb(uv_handle_t *h)
{
	struct aps_zbridge *b = h->data;

	free(h);
	handle_gone(b);
}

static int start_poll(struct aps_zbridge *b, void *sock, uv_poll_t **out)
{
	uv_poll_t *poll = malloc(sizeof(*poll));
	int fd;
	size_t len = sizeof(fd);

	if (poll == NULL)
		return APS_ENOMEM;
	if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) < 0 || uv_poll_init(b->loop, poll, fd) < 0) {
		free(poll);
		return APS_ECONN;
	}
	poll->data = b;
	b->open_handles++;
	*out = poll;
	return uv_poll_start(poll, UV_READABLE, aps__zbridge_on_ready) < 0 ? APS_ECONN : 0;
}

/* Stops watching a socket's fd before the socket (and the fd) goes away. */
static void stop_poll(uv_poll_t **poll)
{
	if (*poll == NULL)
		return;
	uv_poll_stop(*poll);
	uv_close((uv_handle_t *)*poll, free_handle_cb);
	*poll = NULL;
}

/* A listening socket's address as ZMQ_LAST_ENDPOINT writes it; "" when not one. */
static void listener_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[INET6_ADDRSTRLEN];
	int listening = 0;
	socklen_t ol = sizeof(listening);

	buf[0] = '\0';
	if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &ol) < 0 || !listening ||
	    getsockname(fd, (struct sockaddr *)&ss, &sl) < 0)
		return;
	if (ss.ss_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)&ss;
		inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
		snprintf(buf, len, "tcp://%s:%d", host, ntohs(in->sin_port));
	} else if (ss.ss_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
		snprintf(buf, len, "tcp://[%s]:%d", host, ntohs(in6->sin6_port));
	} else if (ss.ss_family == AF_UNIX) {
		snprintf(buf, len, "ipc://%.200s", ((const struct sockaddr_un *)&ss)->sun_path);
	}
}

/* A duplicate of the listening socket ZeroMQ made for endpoint, found among the
 * process's descriptors; -1 when there is none (inproc, an odd address form). */
static int keep_listener(const char *endpoint)
{
	struct rlimit rl;
	char name[256];
	int max = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536 ? (int)rl.rlim_cur
	                                                                    : 65536;

	for (int fd = 0; fd < max; fd++) {
		listener_name(fd, name, sizeof(name));
		if (name[0] == '\0' || strcmp(name, endpoint) != 0)
			continue;
		/* ZeroMQ's accept blocks on a blocking listening socket: with two
		 * listeners on it for a moment (a reset), the one that loses the race
		 * would wait for the next connection. The flag is the socket's, shared by
		 * every descriptor of it. */
		int flags = fcntl(fd, F_GETFL);
		if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
			return -1;
		return fcntl(fd, F_DUPFD_CLOEXEC, 0);
	}
	return -1;
}

/* A new ROUTER socket on the endpoint (on the kept listening socket after a reset),
 * with its monitor, watched by the loop. */
static int open_socket(struct aps_zbridge *b, const char *endpoint)
{
	size_t len = sizeof(b->endpoint);
	int ret = APS_ECONN;
	int fd = b->listen_fd >= 0 ? fcntl(b->listen_fd, F_DUPFD_CLOEXEC, 0) : -1;
	bool ipv6 = strncmp(endpoint, "tcp://[", 7) == 0;

	b->router = zmq_socket(b->zctx, ZMQ_ROUTER);
	if (b->router == NULL) {
		if (fd >= 0)
			close(fd);
		return APS_ECONN;
	}
	set_router_options(&b->opts, b->router);
	if (fd >= 0 && set_int(b->router, ZMQ_USE_FD, fd) < 0) {
		close(fd);
		fd = -1;
	}
	/* The monitor before the bind: after a reset, clients wait in the backlog and
	 * are accepted at once; an accept the monitor did not see leaves its
	 * connection unknown, and its HELLO dropped as a closed connection's. */
	/* IPv6 where the endpoint says so (tcp://[::]:5555 listens on IPv4 too); a
	 * star stays IPv4, as libzmq has it. Before the filters: they are read for it. */
	set_int(b->router, ZMQ_IPV6, ipv6);
	if (set_accept_filters(&b->allow_from, b->router, ipv6) < 0 ||
	    enable_zap(b, b->router) < 0 || open_monitor(b) < 0) {
		if (fd >= 0)
			close(fd); /* not taken by ZeroMQ: only a bind takes it */
		return APS_ECONN;
	}
	if (zmq_bind(b->router, endpoint) < 0) {
		if (fd >= 0)
			close(fd); /* not taken by ZeroMQ */
		aps_log_error("zbridge", "cannot listen endpoint=%s reason=\"%s\"", endpoint,
		              zmq_strerror(errno));
		return APS_ECONN;
	}
	if (endpoint != b->endpoint &&
	    zmq_getsockopt(b->router, ZMQ_LAST_ENDPOINT, b->endpoint, &len) < 0)
		snprintf(b->endpoint, sizeof(b->endpoint), "%s", endpoint);
	if (b->listen_fd < 0)
		b->listen_fd = keep_listener(b->endpoint);
	ret = start_poll(b, b->router, &b->router_poll);
	if (ret == 0)
		ret = start_poll(b, b->monitor, &b->monitor_poll);
	/* Messages may already wait: the fd only signals changes. */
	aps__zbridge_schedule_drain(b);
	return ret;
}

/*
 * Closes the socket and its monitor. The monitor is stopped first: libzmq
 * sends its events with blocking sends, and an event of a socket being torn
 * down into a monitor nobody reads any more would block the thread that
 * sends it (the reaper's MONITOR_STOPPED did, and every socket a reset
 * closed after that stayed, descriptors and all).
 */
static void close_socket(struct aps_zbridge *b, int linger_ms)
{
	stop_poll(&b->router_poll);
	stop_poll(&b->monitor_poll);
	if (b->router != NULL) {
		zmq_socket_monitor(b->router, NULL, 0);
		set_int(b->router, ZMQ_LINGER, linger_ms);
		zmq_close(b->router);
		b->router = NULL;
	}
	if (b->monitor != NULL)
		zmq_close(b->monitor);
	b->monitor = NULL;
}

/* A new socket on the endpoint, retried until the old one has let it go (at once
 * on the listening socket kept, ZMQ_USE_FD; else when ZeroMQ has closed it). */
static void on_reset_timer(uv_timer_t *t)
{
	struct aps_zbridge *b = t->data;
	uint64_t now = aps__zbridge_now_ms(b);

	if (open_socket(b, b->endpoint) < 0) {
		close_socket(b, 0);
		if (now - b->last_reset_ms >= RESET_WAIT_MS && !b->reset_logged) {
			aps_log_error("zbridge", "cannot listen again endpoint=%s: retrying",
			              b->endpoint);
			b->reset_logged = true;
		}
		return;
	}
	uv_timer_stop(t);
	b->reset_logged = false;
	malloc_trim(0); /* what the old socket held goes back to the system */
	b->trim_until_ms = now + RESET_TRIM_MS;
	aps_log_info("zbridge", "listening again endpoint=%s after_ms=%llu", b->endpoint,
	             (unsigned long long)(now - b->last_reset_ms));
}

/*
 * The socket goes, with every connection and every pipe libzmq holds for them
 * (only closing the socket frees a parked connection's), and a new one binds
 * the endpoint once the old one has let it go. Every client reconnects and
 * takes its session back.
 */
static void reset_socket(struct aps_zbridge *b, const char *why)
{
	aps_log_warn("zbridge",
	             "resetting the socket endpoint=%s reason=\"%s\": every worker reconnects",
	             b->endpoint, why);
	b->cnt.listener_resets++;
	b->last_reset_ms = aps__zbridge_now_ms(b);
	b->parked_since_ms = 0;
	b->heap_floor = 0; /* from the next tick: the reset frees what was parked */
	b->heap_next = 0;
	close_socket(b, 0);
	aps_conns_forget_all(&b->conns);
	b->cnt.dropped += aps_outq_clear(&b->outq);
	aps__zbridge_report_closed(b);
	uv_timer_start(&b->reset_timer, on_reset_timer, RESET_POLL_MS, RESET_POLL_MS);
}

/* One line for the connections a tick dropped for one reason (none: no line). */
static void log_dropped(uint64_t count, const char *why, uint64_t limit, const char *unit)
{
	if (count > 0)
		aps_log_warn("zbridge", "dropped connections count=%llu reason=\"%s %llu %s\"",
		             (unsigned long long)count, why, (unsigned long long)limit, unit);
}

/* The heap's lowest point in use since the last reset: what parked connections
 * hold shows as growth from it. Looked at every tick, parked or not: a flood
 * that parks within one tick must not set the floor. (A job that grows after
 * the floor bears out a wrong guess too: then apsd resets, as before.) Returns
 * the least of the last ticks' readings: what stays, not a moment's peak (a
 * large handshake being parsed holds 100 MB for a second; one every 0.5 s from
 * new addresses, read at a peak, would bear out a reset that nothing parked
 * called for). */
static uint64_t watch_heap(struct aps_zbridge *b)
{
	uint64_t heap = aps_hostlimits_heap_in_use(), least = heap;

	if (heap != 0 && (b->heap_floor == 0 || heap < b->heap_floor))
		b->heap_floor = heap;
	b->heap_recent[b->heap_next++ % APS_ZBRIDGE_HEAP_WINDOW] = heap;
	for (size_t i = 0; i < APS_ZBRIDGE_HEAP_WINDOW && i < b->heap_next; i++)
		least = b->heap_recent[i] < least ? b->heap_recent[i] : least;
	return least;
}

/* Whether the heap grew by half of what parked connections are said to hold.
 * The guess counts every byte ZeroMQ read of a connection that closed without
 * a message, but libzmq frees an unfinished message (or a large handshake's
 * properties) at the close: 8 such connections of 8 MiB each, from new
 * addresses, reset the socket every 10 s and cut every worker for nothing (an
 * attack, 2026-12-06). */
static bool heap_bears_out(struct aps_zbridge *b, uint64_t heap, uint64_t held, uint64_t now)
{
	uint64_t grown = heap > b->heap_floor ? heap - b->heap_floor : 0;

	if (heap == 0 || b->heap_floor == 0 || grown >= held / 2)
		return true;
	if (aps_log_gate_open(&b->unborne_log, now, 60000))
		aps_log_info(
		        "zbridge",
		        "no reset: parked connections may hold %llu KiB, but the heap grew "
		        "%llu KiB since the last reset (connections that closed with a message "
		        "half sent, or a large handshake: libzmq freed it)",
		        (unsigned long long)(held >> 10), (unsigned long long)(grown >> 10));
	return false;
}

static void on_tick(uv_timer_t *t)
{
	struct aps_zbridge *b = t->data;
	uint64_t now = aps__zbridge_now_ms(b);
	size_t stuck, parked;
	uint64_t held, heap;
	char why[200];

	uint64_t unjoined = b->conns.cnt.unjoined_dropped;
	uint64_t unfinished = b->conns.cnt.unfinished;
	uint64_t unheard = b->unheard_logged; /* drops at a message, since the last tick, too */

	if (b->router == NULL)
		return;
	if (b->trim_until_ms != 0) { /* what the reaper freed since the reset goes back too */
		malloc_trim(0);
		if (now >= b->trim_until_ms)
			b->trim_until_ms = 0;
	}
	aps__zbridge_read_monitor(b);
	if (b->zap != NULL)
		aps_zap_judge_all(b->zap, now);
	if (aps_zap_may_judge(b, now)) /* the lower bound first, where it can be judged */
		aps_conns_drop_unheard(&b->conns, now);
	stuck = aps_conns_tick(&b->conns, now);
	parked = aps_conns_parked(&b->conns);
	held = aps_conns_parked_bytes(&b->conns);
	heap = watch_heap(b); /* the floor, and the least of the last ticks for the reset below */
	log_dropped(b->conns.cnt.unfinished - unfinished, "read over",
	            b->conns.max_unfinished_bytes,
	            "bytes of a message never finished (frames flagged MORE)");
	if (b->conns.cnt.unheard != unheard) {
		aps_log_warn("zbridge",
		             "dropped connections count=%llu last=%s reason=\"read over %d bytes "
		             "before a message (a handshake that large, a connection parked, or a "
		             "client that did not wait for its WELCOME)\"",
		             (unsigned long long)(b->conns.cnt.unheard - unheard),
		             b->conns.unheard_address, APS_CONNS_UNHEARD_MAX);
		b->unheard_logged = b->conns.cnt.unheard;
		b->unheard_trim_until_ms = now + RESET_TRIM_MS;
	}
	if (b->unheard_trim_until_ms != 0 && now - b->unheard_trim_ms >= UNHEARD_TRIM_EVERY_MS) {
		malloc_trim(0);
		b->unheard_trim_ms = now;
		if (now >= b->unheard_trim_until_ms)
			b->unheard_trim_until_ms = 0;
	}
	log_dropped(b->conns.cnt.unjoined_dropped - unjoined,
	            "not joined a job within "
	            "join_timeout_ms =",
	            b->conns.join_timeout_ms, "ms");
	aps__zbridge_schedule_drain(
	        b); /* which reports the closes, after the messages before them */
	if (parked > 0 && b->parked_since_ms == 0)
		b->parked_since_ms = now;
	/* A few parked ones are cleared too, in time: what they hold goes back. */
	bool lingering = parked >= PARKED_LINGER && now - b->parked_since_ms >= LINGER_MS;
	if (stuck == 0 && held < PARKED_MAX_BYTES && !lingering)
		return;
	/* At most one reset in RESET_INTERVAL_MS, unless what is held grows past a bound. */
	if (b->last_reset_ms != 0 && now - b->last_reset_ms < RESET_INTERVAL_MS &&
	    (stuck < STUCK_URGENT && held < PARKED_URGENT))
		return;
	if (b->last_reset_ms != 0 && now - b->last_reset_ms < RESET_URGENT_MS)
		return;
	if (stuck == 0 && !heap_bears_out(b, heap, held, now))
		return;
	snprintf(why, sizeof(why),
	         "%zu connections ZeroMQ will never close, %zu it may have parked holding up to "
	         "%llu KiB: peers that reused a live routing id",
	         stuck, parked, (unsigned long long)(held >> 10));
	reset_socket(b, why);
}

static void init_handles(struct aps_zbridge *b)
{
	uv_idle_init(b->loop, &b->idle);
	b->idle.data = b;
	uv_timer_init(b->loop, &b->flush_timer);
	b->flush_timer.data = b;
	uv_timer_init(b->loop, &b->tick_timer);
	b->tick_timer.data = b;
	uv_timer_init(b->loop, &b->reset_timer);
	b->reset_timer.data = b;
	b->open_handles += 4;
}

int aps_zbridge_new(struct aps_zbridge **out, uv_loop_t *loop, const struct aps_zbridge_opts *o,
                    const struct aps_zbridge_ops *ops, void *ctx)
{
	struct aps_zbridge *b = calloc(1, sizeof(*b));
	int ret = APS_ENOMEM;
	char why[200];

	if (b == NULL)
		return ret;
	b->loop = loop;
	b->ops = *ops;
	b->ctx = ctx;
	b->opts = *o;
	if (o->allow_from != NULL &&
	    aps_netlist_parse(&b->allow_from, o->allow_from, why, sizeof(why)) < 0) {
		aps_log_error("zbridge", "allow_from: %s", why);
		free(b);
		return APS_EINVAL;
	}
	b->listen_fd = -1;
	b->drain_batch = o->drain_batch > 0 ? o->drain_batch : 256;
	b->max_message_bytes = o->max_message_bytes;
	aps_conns_init(&b->conns, o->max_connections, o->join_timeout_ms);
	b->conns.max_per_address = o->max_connections_per_address;
	aps_admission_init(&b->admission, o->max_silent_closes);
	if (o->max_message_bytes > 0) /* a header frame, a payload frame, and slack */
		b->conns.max_unfinished_bytes = 2 * (uint64_t)o->max_message_bytes + (1u << 20);
	b->zctx = zmq_ctx_new();
	if (b->zctx == NULL) {
		free(b);
		return ret;
	}
	if (o->io_threads > 0)
		zmq_ctx_set(b->zctx, ZMQ_IO_THREADS, (int)o->io_threads);
	init_handles(b);
	ret = open_socket(b, o->endpoint);
	if (ret < 0) {
		aps_zbridge_free(b, 0);
		return ret;
	}
	uv_timer_start(&b->tick_timer, on_tick, TICK_MS, TICK_MS);
	*out = b;
	return 0;
}

static void on_handle_closed(uv_handle_t *h)
{
	handle_gone(h->data);
}

void aps_zbridge_free(struct aps_zbridge *b, int linger_ms)
{
	if (b == NULL)
		return;
	uv_handle_t *handles[] = { (uv_handle_t *)&b->idle, (uv_handle_t *)&b->flush_timer,
		                   (uv_handle_t *)&b->tick_timer, (uv_handle_t *)&b->reset_timer };

	aps__zbridge_flush_queue(b);
	b->cnt.dropped += aps_outq_clear(&b->outq);
	aps_zbridge_counters(b); /* the last figures, for whoever copies them */
	close_socket(b, linger_ms);
	aps_zap_stop(b->zap);
	b->zap = NULL;
	if (b->listen_fd >= 0)
		close(b->listen_fd);
	b->listen_fd = -1;
	zmq_ctx_term(b->zctx);
	b->zctx = NULL;
	for (size_t i = 0; i < sizeof(handles) / sizeof(handles[0]); i++) {
		if (!uv_is_closing(handles[i]))
			uv_close(handles[i], on_handle_closed);
	}
}
