/*
 * DEALER socket I/O for the client: send a multipart message, wait for one
 * (the socket's ZMQ_EVENTS, then a plain poll of its descriptors: see
 * aps_transport_poll). Frames of the last received message are kept here
 * until the next receive, so that the caller reads the payload in place.
 *
 * Each socket has a random routing id of its own and lives for one
 * connection: a socket monitor says when it was made, when it closed (LOST),
 * when the connect failed or could not start (NOCONN) or when its handshake
 * failed (REFUSED), and the client then renews the transport. No ZMTP
 * heartbeats: liveness is the protocol's (HEARTBEAT flagged ALIVE).
 */
#include "worker/transport.h"

#include "common/err.h"
#include "worker/aps.h"
#include "worker/zmtp_probe.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#define MAX_FRAMES     2
#define ROUTING_ID_LEN 16
#define KEY_LEN        40
/* A socket whose connect failed has no pipe, a full pipe takes nothing: a send
 * waits this long at most, then the connection is taken for lost (resume.c). */
#define SEND_TIMEOUT_MS    1000
#define PROBE_TIMEOUT_MS   1000               /* to read the daemon's greeting (zmtp_probe.c) */
#define RECONNECT_NEVER_MS (24 * 3600 * 1000) /* a day: the socket is renewed long before */

struct aps_transport {
	void *zctx, *sock;
	void *monitor;   /* PAIR socket reading the DEALER's connection events */
	unsigned serial; /* sockets opened: names each monitor */
	char endpoint[256];
	bool curve;
	char server_key[KEY_LEN + 1], public_key[KEY_LEN + 1], secret_key[KEY_LEN + 1];
	char refusal[320];
	unsigned handshakes; /* that succeeded, on every socket so far */
	bool handshook;      /* this socket's did */
	bool linked;         /* this socket's connection is made and not lost */
	bool tried;          /* this socket's connect got somewhere: made, closed or failed */
	struct aps_transport_tally tally; /* every socket's connects so far */
	zmq_msg_t frame[MAX_FRAMES];
	size_t nkept;
	/* The monitor's events read when its socket was opened, reported by the
	 * next receive or poll. The monitor is always read to its last event
	 * (read_events), so that its ZMQ_FD signals the next one. */
	int held;
};

static int set_int(void *sock, int opt, int value)
{
	return zmq_setsockopt(sock, opt, &value, sizeof(value));
}

static int set_curve(struct aps_transport *t)
{
	if (!t->curve)
		return 0;
	if (zmq_setsockopt(t->sock, ZMQ_CURVE_SERVERKEY, t->server_key, KEY_LEN) < 0 ||
	    zmq_setsockopt(t->sock, ZMQ_CURVE_PUBLICKEY, t->public_key, KEY_LEN) < 0 ||
	    zmq_setsockopt(t->sock, ZMQ_CURVE_SECRETKEY, t->secret_key, KEY_LEN) < 0)
		return APS_EINVAL;
	return 0;
}

/* 16 random bytes, the first never 0 (ZeroMQ reserves ids that start with 0). */
static int set_routing_id(void *sock)
{
	uint8_t id[ROUTING_ID_LEN];

	if (getrandom(id, sizeof(id), 0) != (ssize_t)sizeof(id)) {
		/* No entropy source: pid, clock and address still differ between clients. */
		struct timespec ts;
		uint64_t seed[2];
		clock_gettime(CLOCK_REALTIME, &ts);
		seed[0] = (uint64_t)getpid() << 32 ^ (uint64_t)ts.tv_nsec ^ (uintptr_t)sock;
		seed[1] = (uint64_t)ts.tv_sec;
		memcpy(id, seed, sizeof(id));
	}
	id[0] |= 0x80;
	return zmq_setsockopt(sock, ZMQ_ROUTING_ID, id, sizeof(id));
}

/* Connection events of the DEALER on an inproc PAIR of its own. */
static int open_monitor(struct aps_transport *t)
{
	char addr[64];

	snprintf(addr, sizeof(addr), "inproc://aps-transport-%p-%u", (void *)t, t->serial);
	if (zmq_socket_monitor(t->sock, addr,
	                       ZMQ_EVENT_CONNECTED | ZMQ_EVENT_CONNECT_RETRIED |
	                               ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_CLOSED |
	                               ZMQ_EVENT_HANDSHAKE_SUCCEEDED |
	                               ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
	                               ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL |
	                               ZMQ_EVENT_HANDSHAKE_FAILED_AUTH) < 0)
		return APS_ECONN;
	t->monitor = zmq_socket(t->zctx, ZMQ_PAIR);
	if (t->monitor == NULL)
		return APS_ECONN;
	set_int(t->monitor, ZMQ_LINGER, 0);
	return zmq_connect(t->monitor, addr) < 0 ? APS_ECONN : 0;
}

static void drop_frames(struct aps_transport *t);

static void close_socket(struct aps_transport *t, int linger_ms)
{
	drop_frames(t);
	if (t->monitor != NULL) {
		zmq_socket_monitor(t->sock, NULL, 0);
		zmq_close(t->monitor);
		t->monitor = NULL;
		t->held = 0;
	}
	if (t->sock != NULL) {
		set_int(t->sock, ZMQ_LINGER, linger_ms);
		zmq_close(t->sock);
		t->sock = NULL;
	}
}

static int read_events(struct aps_transport *t);

/* An IPv6 address in brackets ("tcp://[::1]:5555", "tcp://SRC:0;[fd00::7]:5555"):
 * libzmq connects to it only with ZMQ_IPV6. A host name stays IPv4: with it
 * libzmq would take the name's first address, ::1 for localhost, where apsd may
 * listen on 127.0.0.1 alone. */
static bool wants_ipv6(const char *endpoint)
{
	return strncmp(endpoint, "tcp://", 6) == 0 &&
	       (endpoint[6] == '[' || strstr(endpoint, ";[") != NULL);
}

static int open_socket(struct aps_transport *t)
{
	int ret;

	t->serial++;
	t->sock = zmq_socket(t->zctx, ZMQ_DEALER);
	if (t->sock == NULL)
		return APS_ECONN;
	set_int(t->sock, ZMQ_LINGER, 0);
	set_int(t->sock, ZMQ_SNDTIMEO, SEND_TIMEOUT_MS);
	/* Not again by itself: under its old routing id, after apsd dropped it or a
	 * blip, the new connection would not be this session's (the client renews
	 * within 100 ms). Not -1 either: without a reconnect to come, libzmq ends
	 * the connection's pipe at once and drops what apsd sent just before it
	 * closed (its BYE when it stops). */
	set_int(t->sock, ZMQ_RECONNECT_IVL, RECONNECT_NEVER_MS);
	set_int(t->sock, ZMQ_IPV6, wants_ipv6(t->endpoint));
	ret = set_curve(t);
	if (ret == 0 && (set_routing_id(t->sock) < 0 || open_monitor(t) < 0 ||
	                 zmq_connect(t->sock, t->endpoint) < 0))
		ret = APS_ECONN;
	if (ret < 0)
		close_socket(t, 0);
	else /* a new socket's ZMQ_FD signals nothing until it was read once */
		t->held = read_events(t);
	return ret;
}

static int copy_opts(struct aps_transport *t, const char *endpoint,
                     const struct aps_transport_curve *curve)
{
	if (strlen(endpoint) >= sizeof(t->endpoint))
		return APS_EINVAL;
	snprintf(t->endpoint, sizeof(t->endpoint), "%s", endpoint);
	if (curve == NULL || curve->server_key == NULL)
		return 0;
	if (curve->public_key == NULL || curve->secret_key == NULL ||
	    strlen(curve->server_key) != KEY_LEN || strlen(curve->public_key) != KEY_LEN ||
	    strlen(curve->secret_key) != KEY_LEN)
		return APS_EINVAL;
	t->curve = true;
	memcpy(t->server_key, curve->server_key, KEY_LEN + 1);
	memcpy(t->public_key, curve->public_key, KEY_LEN + 1);
	memcpy(t->secret_key, curve->secret_key, KEY_LEN + 1);
	return 0;
}

int aps_transport_open(struct aps_transport **out, const char *endpoint,
                       const struct aps_transport_curve *curve)
{
	struct aps_transport *t = calloc(1, sizeof(*t));
	int ret;

	if (t == NULL)
		return APS_ENOMEM;
	ret = copy_opts(t, endpoint, curve);
	if (ret == 0 && (t->zctx = zmq_ctx_new()) == NULL)
		ret = APS_ECONN;
	if (ret == 0)
		ret = open_socket(t);
	if (ret < 0) {
		if (t->zctx != NULL)
			zmq_ctx_term(t->zctx);
		free(t);
		return ret;
	}
	*out = t;
	return 0;
}

void aps_transport_drop(struct aps_transport *t)
{
	close_socket(t, 0);
	t->linked = false;
}

bool aps_transport_link_up(const struct aps_transport *t)
{
	return t->sock != NULL && t->linked;
}

void aps_transport_tally(const struct aps_transport *t, struct aps_transport_tally *out)
{
	*out = t->tally;
}

bool aps_transport_connected(const struct aps_transport *t)
{
	return t->sock != NULL;
}

int aps_transport_renew(struct aps_transport *t)
{
	close_socket(t, 0);
	t->handshook = false;
	t->linked = false;
	t->tried = false;
	return open_socket(t);
}

const char *aps_transport_refusal(const struct aps_transport *t)
{
	return t->refusal;
}

bool aps_transport_ever_handshook(const struct aps_transport *t)
{
	return t->handshakes > 0;
}

bool aps_transport_handshook(const struct aps_transport *t)
{
	return t->handshook;
}

bool aps_transport_curve(const struct aps_transport *t)
{
	return t->curve;
}

static void drop_frames(struct aps_transport *t)
{
	for (size_t i = 0; i < t->nkept; i++)
		zmq_msg_close(&t->frame[i]);
	t->nkept = 0;
}

void aps_transport_close(struct aps_transport *t, int linger_ms)
{
	if (t == NULL)
		return;
	close_socket(t, linger_ms);
	zmq_ctx_term(t->zctx);
	free(t);
}

int aps_transport_send(struct aps_transport *t, const uint8_t *hdr, size_t hdr_len,
                       const void *payload, size_t payload_len, bool has_payload)
{
	if (t->sock == NULL)
		return APS_ECONN;
	if (zmq_send(t->sock, hdr, hdr_len, has_payload ? ZMQ_SNDMORE : 0) < 0)
		return APS_ECONN;
	if (has_payload && zmq_send(t->sock, payload, payload_len, 0) < 0)
		return APS_ECONN;
	return 0;
}

static void free_sbuf_cb(void *data, void *hint)
{
	(void)data;
	aps_sbuf_unref(hint);
}

int aps_transport_send_shared(struct aps_transport *t, const uint8_t *hdr, size_t hdr_len,
                              struct aps_sbuf *buf, const uint8_t *data, size_t len)
{
	zmq_msg_t m;

	if (t->sock == NULL || zmq_send(t->sock, hdr, hdr_len, ZMQ_SNDMORE) < 0)
		return APS_ECONN;
	zmq_msg_init_data(&m, (void *)data, len, free_sbuf_cb, aps_sbuf_ref(buf));
	if (zmq_msg_send(&m, t->sock, 0) < 0) {
		zmq_msg_close(&m);
		return APS_ECONN;
	}
	return 0;
}

static const char *mechanism_mismatch(const struct aps_transport *t)
{
	return t->curve ? "this client uses CURVE and the daemon does not"
	                : "the daemon uses CURVE and this client does not (set its "
	                  "curve_server_key and key pair)";
}

/* Why a handshake failed, from its monitor event. */
static void note_refusal(struct aps_transport *t, uint16_t event, int32_t value)
{
	if (event == ZMQ_EVENT_DISCONNECTED || event == ZMQ_EVENT_CLOSED)
		return;
	if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH && !t->curve)
		snprintf(t->refusal, sizeof(t->refusal),
		         "apsd at %.120s turned this client's address away (status %d): it is not "
		         "in the daemon's allow_from, or too many of its connections closed "
		         "without a message (max_silent_closes); its log says which",
		         t->endpoint, (int)value);
	else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH)
		snprintf(t->refusal, sizeof(t->refusal),
		         "authentication failed: apsd at %.120s refused this client's CURVE key "
		         "(status %d; is it in the daemon's curve_allow_file?) or turned its "
		         "address away (its log says which)",
		         t->endpoint, (int)value);
	else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL &&
	         value == ZMQ_PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH)
		snprintf(t->refusal, sizeof(t->refusal),
		         "the handshake with apsd at %.120s failed: %s", t->endpoint,
		         mechanism_mismatch(t));
	else if (event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
		snprintf(t->refusal, sizeof(t->refusal),
		         "the handshake with apsd at %.120s failed (ZMTP error 0x%x): does the "
		         "daemon use CURVE, and is curve_server_key its public key?",
		         t->endpoint, (unsigned)value);
	else
		snprintf(
		        t->refusal, sizeof(t->refusal),
		        "the handshake with apsd at %.120s failed: %.40s (does the daemon use CURVE "
		        "when this client does not, or the other way round?)",
		        t->endpoint, zmq_strerror(value));
}

bool aps_transport_mechanism_differs(struct aps_transport *t, int timeout_ms)
{
	char mech[APS_ZMTP_MECHANISM_LEN];
	const char *ours = t->curve ? "CURVE" : "NULL";
	bool known = false;

	timeout_ms = timeout_ms < PROBE_TIMEOUT_MS ? timeout_ms : PROBE_TIMEOUT_MS;
	if (timeout_ms <= 0 || aps_zmtp_probe_mechanism(t->endpoint, timeout_ms, mech) < 0 ||
	    strcmp(mech, ours) == 0)
		return false;
	known = strcmp(mech, t->curve ? "NULL" : "CURVE") == 0;
	for (char *ch = mech; *ch != '\0'; ch++) /* a stranger's bytes, printed */
		if (*ch < 0x21 || *ch > 0x7e)
			*ch = '?';
	if (known)
		snprintf(t->refusal, sizeof(t->refusal),
		         "the handshake with apsd at %.120s failed: %s", t->endpoint,
		         mechanism_mismatch(t));
	else
		snprintf(t->refusal, sizeof(t->refusal),
		         "the handshake with %.120s failed: it speaks ZMTP mechanism '%.20s', this "
		         "client %s (is it apsd?)",
		         t->endpoint, mech, ours);
	return true;
}

/* What one monitor event says: a mask of APS_TRANSPORT_LOST, _NOCONN and _REFUSED. */
static int on_event(struct aps_transport *t, uint16_t event, int32_t value)
{
	switch (event) {
	case ZMQ_EVENT_CONNECTED:
		t->linked = t->tried = true;
		t->tally.made++;
		return 0;
	case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
		t->handshakes++;
		t->handshook = t->linked = t->tried = true;
		return 0;
	case ZMQ_EVENT_CONNECT_RETRIED:
		/* After nothing else on this socket: its connect could not even start (the
		 * host name does not resolve). After a close it is only that close's retry. */
		if (t->tried)
			return 0;
		t->tried = true;
		t->tally.unresolved++;
		return APS_TRANSPORT_NOCONN;
	case ZMQ_EVENT_CLOSED: /* a connect that failed: refused, or the host unreachable */
		t->tried = true;
		t->linked = false;
		t->tally.failed++;
		return APS_TRANSPORT_NOCONN;
	case 0:
		return 0;
	default:
		break;
	}
	t->tried = true;
	t->linked = false;
	note_refusal(t, event, value);
	/* A refused key or a protocol the daemon does not speak will not change;
	 * a handshake cut short (a blip, a full daemon) may. */
	if (event == ZMQ_EVENT_HANDSHAKE_FAILED_AUTH ||
	    event == ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL)
		return APS_TRANSPORT_REFUSED;
	return APS_TRANSPORT_LOST;
}

/* Reads the monitor's events: a mask of APS_TRANSPORT_LOST, _NOCONN and _REFUSED. */
static int read_events(struct aps_transport *t)
{
	int what = 0;
	zmq_msg_t part;

	for (;;) {
		uint16_t event = 0;
		int32_t value = 0;
		int more;
		zmq_msg_init(&part);
		if (zmq_msg_recv(&part, t->monitor, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&part);
			return what;
		}
		if (zmq_msg_size(&part) >= sizeof(event) + sizeof(value)) {
			memcpy(&event, zmq_msg_data(&part), sizeof(event));
			memcpy(&value, (uint8_t *)zmq_msg_data(&part) + sizeof(event),
			       sizeof(value));
		}
		more = zmq_msg_more(&part);
		zmq_msg_close(&part);
		while (more) { /* the endpoint's address */
			zmq_msg_init(&part);
			more = zmq_msg_recv(&part, t->monitor, 0) >= 0 && zmq_msg_more(&part);
			zmq_msg_close(&part);
		}
		what |= on_event(t, event, value);
	}
}

static int64_t monotonic_ms(void)
{
	struct timespec now;

	clock_gettime(CLOCK_MONOTONIC, &now);
	return now.tv_sec * 1000 + now.tv_nsec / 1000000;
}

/* The monitor's events held and, with read, those it holds now. */
static int take_events(struct aps_transport *t, bool read)
{
	int what = t->held | (read ? read_events(t) : 0);

	t->held = 0;
	return what;
}

/* Whether a message waits (ZMQ_EVENTS, which processes the socket's commands). */
static bool sock_readable(struct aps_transport *t)
{
	int events = 0;
	size_t len = sizeof(events);

	return zmq_getsockopt(t->sock, ZMQ_EVENTS, &events, &len) == 0 && (events & ZMQ_POLLIN);
}

/*
 * zmq_poll's loop for one socket, without its first pass and with the monitor
 * as a plain descriptor (what a poll costs is most of a small call's): the
 * monitor is drained to its last event whenever it is read (read_events), so
 * its ZMQ_FD signals every later one.
 */
int aps_transport_poll(struct aps_transport *t, int wake_fd, int timeout_ms)
{
	struct pollfd fds[3];
	int n = aps_transport_pollfds(t, wake_fd, true, fds);
	int64_t deadline_ms = monotonic_ms() + timeout_ms;

	for (;;) {
		int ready = 0, got;

		/* a message first: the wake-up and the monitor's descriptors stay
		 * readable until they are read, the next poll sees them */
		if (t->sock != NULL && sock_readable(t))
			return APS_TRANSPORT_READABLE | take_events(t, false);
		if (t->held != 0)
			return take_events(t, false);
		got = poll(fds, (nfds_t)n, timeout_ms);
		if (got < 0 && errno != EINTR)
			return APS_ECONN;
		if (got > 0 && (fds[0].revents & POLLIN))
			ready |= APS_TRANSPORT_WOKEN;
		if (got > 0 && n > 1 && (fds[1].revents & POLLIN))
			ready |= take_events(t, true);
		if (ready != 0)
			return ready;
		/* the socket's descriptor said it may have changed, or a signal came */
		if (timeout_ms > 0 && (timeout_ms = (int)(deadline_ms - monotonic_ms())) < 0)
			timeout_ms = 0;
		if (got == 0 && timeout_ms == 0)
			return 0;
	}
}

int aps_transport_pollfds(struct aps_transport *t, int wake_fd, bool messages, struct pollfd *fds)
{
	void *socks[2] = { t->monitor, t->sock };
	int n = 0;

	fds[n++] = (struct pollfd){ .fd = wake_fd, .events = POLLIN };
	for (int i = 0; t->sock != NULL && i < (messages ? 2 : 1); i++) {
		int fd;
		size_t len = sizeof(fd);
		if (zmq_getsockopt(socks[i], ZMQ_FD, &fd, &len) == 0)
			fds[n++] = (struct pollfd){ .fd = fd, .events = POLLIN };
	}
	return n;
}

/* Reads every frame of a waiting message, keeping the first MAX_FRAMES; 0 when
 * none waits (flags ZMQ_DONTWAIT). The frames of a message come together. */
static size_t read_frames(struct aps_transport *t, int flags)
{
	size_t total = 0;
	int more = 1;

	while (more) {
		zmq_msg_t extra, *m = t->nkept < MAX_FRAMES ? &t->frame[t->nkept] : &extra;
		zmq_msg_init(m);
		if (zmq_msg_recv(m, t->sock, total == 0 ? flags : 0) < 0) {
			zmq_msg_close(m);
			break;
		}
		total++;
		more = zmq_msg_more(m);
		if (m == &extra)
			zmq_msg_close(m);
		else
			t->nkept++;
	}
	return total;
}

/* The message read_frames kept, in out (returns 1). */
static int received(struct aps_transport *t, struct aps_rxmsg *out)
{
	out->hdr = t->nkept > 0 ? zmq_msg_data(&t->frame[0]) : NULL;
	out->hdr_len = t->nkept > 0 ? zmq_msg_size(&t->frame[0]) : 0;
	out->payload = t->nkept > 1 ? zmq_msg_data(&t->frame[1]) : NULL;
	out->payload_len = t->nkept > 1 ? zmq_msg_size(&t->frame[1]) : 0;
	return 1;
}

/* What the monitor's events (read_events) mean for a receive: 0 or why it ends. */
static int what_closed(int what)
{
	if (what & APS_TRANSPORT_REFUSED)
		return APS_TRANSPORT_RECV_REFUSED;
	if (what & APS_TRANSPORT_LOST)
		return APS_TRANSPORT_RECV_LOST;
	if (what & APS_TRANSPORT_NOCONN)
		return APS_TRANSPORT_RECV_NOCONN;
	return 0;
}

int aps_transport_recv(struct aps_transport *t, int timeout_ms, struct aps_rxmsg *out)
{
	zmq_pollitem_t items[2] = { { .socket = t->sock, .events = ZMQ_POLLIN },
		                    { .socket = t->monitor, .events = ZMQ_POLLIN } };
	int64_t deadline_ms = monotonic_ms() + timeout_ms;
	int closed;

	drop_frames(t);
	if (t->sock == NULL)
		return 0;
	/* What waits first (no poll for it): a message, then the monitor's events. */
	while ((out->nframes = read_frames(t, ZMQ_DONTWAIT)) == 0) {
		if ((closed = what_closed(take_events(t, true))) != 0)
			return closed;
		if (timeout_ms <= 0)
			return 0;
		if (zmq_poll(items, 2, timeout_ms) < 0 && errno != EINTR)
			return APS_ECONN;
		/* zmq_poll took the monitor's ZMQ_FD signal: its events are read now, or
		 * a loss that came with the message returned next (a WELCOME, then the
		 * connection reset) would wait unseen by the I/O thread's poll. */
		t->held |= read_events(t);
		timeout_ms = (int)(deadline_ms - monotonic_ms());
		if (timeout_ms < 0)
			timeout_ms = 0; /* a last look */
	}
	return received(t, out);
}

const char *aps_transport_strerror(void)
{
	return zmq_strerror(errno);
}
