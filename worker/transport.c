/*
 * DEALER socket I/O for the blocking client: send a multipart message, wait
 * for one with zmq_poll. Frames of the last received message are kept here
 * until the next receive, so that the caller reads the payload in place.
 *
 * The socket has a random routing id of its own for its whole life, so that
 * apsd knows it again when ZeroMQ reconnects it after its connection closed;
 * a socket monitor tells when that happened (APS_TRANSPORT_RECONNECTED).
 */
#include "worker/transport.h"

#include "common/err.h"
#include "worker/aps.h"

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

struct aps_transport {
	void *zctx, *sock;
	void *monitor;     /* PAIR socket reading the DEALER's connection events */
	bool disconnected; /* the connection closed; ZeroMQ is reconnecting */
	zmq_msg_t frame[MAX_FRAMES];
	size_t nkept;
};

static int set_int(void *sock, int opt, int value)
{
	return zmq_setsockopt(sock, opt, &value, sizeof(value));
}

static int set_curve(void *sock, const struct aps_transport_curve *curve)
{
	if (curve == NULL || curve->server_key == NULL)
		return 0;
	if (zmq_setsockopt(sock, ZMQ_CURVE_SERVERKEY, curve->server_key, 40) < 0 ||
	    zmq_setsockopt(sock, ZMQ_CURVE_PUBLICKEY, curve->public_key, 40) < 0 ||
	    zmq_setsockopt(sock, ZMQ_CURVE_SECRETKEY, curve->secret_key, 40) < 0)
		return APS_EINVAL;
	return 0;
}

int aps_curve_keypair(char *public_key, char *secret_key)
{
	if (public_key == NULL || secret_key == NULL)
		return APS_EINVAL;
	return zmq_curve_keypair(public_key, secret_key) < 0 ? APS_ESYS : 0;
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

	snprintf(addr, sizeof(addr), "inproc://aps-transport-%p", (void *)t);
	if (zmq_socket_monitor(t->sock, addr, ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) < 0)
		return APS_ECONN;
	t->monitor = zmq_socket(t->zctx, ZMQ_PAIR);
	if (t->monitor == NULL)
		return APS_ECONN;
	set_int(t->monitor, ZMQ_LINGER, 0);
	return zmq_connect(t->monitor, addr) < 0 ? APS_ECONN : 0;
}

static void close_monitor(struct aps_transport *t)
{
	if (t->monitor == NULL)
		return;
	zmq_socket_monitor(t->sock, NULL, 0);
	zmq_close(t->monitor);
	t->monitor = NULL;
}

int aps_transport_open(struct aps_transport **out, const char *endpoint, int heartbeat_ms,
                       const struct aps_transport_curve *curve)
{
	int ret = APS_ECONN;

	struct aps_transport *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return APS_ENOMEM;
	t->zctx = zmq_ctx_new();
	if (t->zctx == NULL)
		goto err_free;
	t->sock = zmq_socket(t->zctx, ZMQ_DEALER);
	if (t->sock == NULL)
		goto err_term;
	set_int(t->sock, ZMQ_LINGER, 0);
	/* A full pipe (the daemon gone) must fail a send, not block the I/O thread. */
	set_int(t->sock, ZMQ_SNDTIMEO, heartbeat_ms > 0 ? heartbeat_ms : 1000);
	if (heartbeat_ms > 0) {
		set_int(t->sock, ZMQ_HEARTBEAT_IVL, heartbeat_ms);
		set_int(t->sock, ZMQ_HEARTBEAT_TIMEOUT, 5 * heartbeat_ms);
	}
	if (set_curve(t->sock, curve) < 0) {
		ret = APS_EINVAL;
		goto err_close;
	}
	if (set_routing_id(t->sock) < 0 || open_monitor(t) < 0)
		goto err_close;
	if (zmq_connect(t->sock, endpoint) < 0)
		goto err_close;
	*out = t;
	return 0;
err_close:
	close_monitor(t);
	zmq_close(t->sock);
err_term:
	zmq_ctx_term(t->zctx);
err_free:
	free(t);
	return ret;
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
	drop_frames(t);
	close_monitor(t);
	set_int(t->sock, ZMQ_LINGER, linger_ms);
	zmq_close(t->sock);
	zmq_ctx_term(t->zctx);
	free(t);
}

int aps_transport_send(struct aps_transport *t, const uint8_t *hdr, size_t hdr_len,
                       const void *payload, size_t payload_len, bool has_payload)
{
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

	if (zmq_send(t->sock, hdr, hdr_len, ZMQ_SNDMORE) < 0)
		return APS_ECONN;
	zmq_msg_init_data(&m, (void *)data, len, free_sbuf_cb, aps_sbuf_ref(buf));
	if (zmq_msg_send(&m, t->sock, 0) < 0) {
		zmq_msg_close(&m);
		return APS_ECONN;
	}
	return 0;
}

/* Reads the monitor's events; true when a closed connection came back. */
static bool read_events(struct aps_transport *t)
{
	bool back = false;
	zmq_msg_t part;

	for (;;) {
		uint16_t event = 0;
		int more;
		zmq_msg_init(&part);
		if (zmq_msg_recv(&part, t->monitor, ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(&part);
			return back;
		}
		if (zmq_msg_size(&part) >= sizeof(event))
			memcpy(&event, zmq_msg_data(&part), sizeof(event));
		more = zmq_msg_more(&part);
		zmq_msg_close(&part);
		while (more) { /* the endpoint's address */
			zmq_msg_init(&part);
			more = zmq_msg_recv(&part, t->monitor, 0) >= 0 && zmq_msg_more(&part);
			zmq_msg_close(&part);
		}
		if (event == ZMQ_EVENT_DISCONNECTED)
			t->disconnected = true;
		else if (event == ZMQ_EVENT_CONNECTED && t->disconnected) {
			t->disconnected = false;
			back = true;
		}
	}
}

int aps_transport_poll(struct aps_transport *t, int wake_fd, int timeout_ms)
{
	zmq_pollitem_t items[3] = { { .socket = t->sock, .events = ZMQ_POLLIN },
		                    { .fd = wake_fd, .events = ZMQ_POLLIN },
		                    { .socket = t->monitor, .events = ZMQ_POLLIN } };
	int n;

	do {
		n = zmq_poll(items, 3, timeout_ms);
	} while (n < 0 && errno == EINTR);
	if (n < 0)
		return APS_ECONN;
	return ((items[0].revents & ZMQ_POLLIN) ? APS_TRANSPORT_READABLE : 0) |
	       ((items[1].revents & ZMQ_POLLIN) ? APS_TRANSPORT_WOKEN : 0) |
	       ((items[2].revents & ZMQ_POLLIN) && read_events(t) ? APS_TRANSPORT_RECONNECTED : 0);
}

/* Reads every frame of a waiting message, keeping the first MAX_FRAMES. */
static size_t read_frames(struct aps_transport *t)
{
	size_t total = 0;
	int more = 1;

	while (more) {
		zmq_msg_t extra, *m = t->nkept < MAX_FRAMES ? &t->frame[t->nkept] : &extra;
		zmq_msg_init(m);
		if (zmq_msg_recv(m, t->sock, 0) < 0) {
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

int aps_transport_recv(struct aps_transport *t, int timeout_ms, struct aps_rxmsg *out)
{
	zmq_pollitem_t items[2] = { { .socket = t->sock, .events = ZMQ_POLLIN },
		                    { .socket = t->monitor, .events = ZMQ_POLLIN } };
	struct timespec now;
	int64_t deadline_ms;
	int n;

	drop_frames(t);
	clock_gettime(CLOCK_MONOTONIC, &now);
	deadline_ms = now.tv_sec * 1000 + now.tv_nsec / 1000000 + timeout_ms;
	for (;;) {
		n = zmq_poll(items, 2, timeout_ms);
		if (n < 0 && errno != EINTR)
			return APS_ECONN;
		if (n > 0 && (items[0].revents & ZMQ_POLLIN))
			break;
		if (n > 0 && (items[1].revents & ZMQ_POLLIN) && read_events(t))
			return APS_TRANSPORT_RECV_RECONNECTED;
		clock_gettime(CLOCK_MONOTONIC, &now);
		timeout_ms = (int)(deadline_ms - (now.tv_sec * 1000 + now.tv_nsec / 1000000));
		if (timeout_ms <= 0)
			return 0;
	}
	out->nframes = read_frames(t);
	out->hdr = t->nkept > 0 ? zmq_msg_data(&t->frame[0]) : NULL;
	out->hdr_len = t->nkept > 0 ? zmq_msg_size(&t->frame[0]) : 0;
	out->payload = t->nkept > 1 ? zmq_msg_data(&t->frame[1]) : NULL;
	out->payload_len = t->nkept > 1 ? zmq_msg_size(&t->frame[1]) : 0;
	return 1;
}

const char *aps_transport_strerror(void)
{
	return zmq_strerror(errno);
}
