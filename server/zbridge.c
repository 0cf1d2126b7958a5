/*
 * ZeroMQ inside libuv. ZMQ_FD is edge-triggered: it signals when the socket's
 * state changed, not while messages wait. So every wake-up drains ZMQ_EVENTS
 * until empty, a drain that stops at the batch limit re-arms itself through a
 * uv_idle handle, and every send (which can consume the edge) schedules a
 * drain too. Sends use ZMQ_ROUTER_MANDATORY and ZMQ_DONTWAIT: a full pipe
 * gives EAGAIN and the message waits in a FIFO, retried from a timer; a
 * peer that has gone gives EHOSTUNREACH and the message is counted as
 * unroutable. Nothing is dropped while the socket is open.
 * Disconnects come from a socket monitor as fds; each message carries the fd
 * it arrived on (ZMQ_SRCFD). The monitor's accepts and closes, read before
 * each message is handed up, turn fds into connection ids (conns.h), which
 * is how the caller maps one to the other; closes are reported once every
 * message that waited has been handed up (a BYE before its disconnect).
 */
#include "server/zbridge.h"

#include "common/err.h"
#include "common/log.h"
#include "server/conns.h"
#include "server/zbridge_zap.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define MAX_FRAMES 3 /* identity, header, payload */
/* Sends waiting for full pipes, all peers together: a peer that never reads
 * loses its replies past this, the daemon never grows without bound. */
#define QUEUE_MAX         65536
#define FLUSH_INTERVAL_MS 1

struct frames {
	zmq_msg_t part[MAX_FRAMES];
	size_t n;     /* frames kept in part[] */
	size_t total; /* frames received, kept or not */
	size_t bytes;
};

struct outmsg {
	struct outmsg *next;
	struct aps_peer peer;
	struct aps_sbuf *payload;
	size_t hdr_len;
	uint8_t hdr[];
};

struct aps_zbridge {
	uv_loop_t *loop;
	void *zctx, *router, *monitor;
	uv_poll_t router_poll, monitor_poll;
	uv_idle_t idle;
	uv_timer_t flush_timer;
	int open_handles;
	struct outmsg *queue;
	size_t queue_len;
	int drain_batch;
	struct aps_zbridge_ops ops;
	void *ctx;
	struct aps_zbridge_counters cnt;
	struct aps_zap *zap; /* NULL without CURVE */
	struct aps_conns conns;
};

static void on_idle(uv_idle_t *h);
static void on_flush_timer(uv_timer_t *t);

/* A taken payload frame lives here until released. */
struct held_frame {
	zmq_msg_t msg;
};

bool aps_peer_equal(const struct aps_peer *a, const struct aps_peer *b)
{
	return a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

const struct aps_zbridge_counters *aps_zbridge_counters(struct aps_zbridge *b)
{
	aps_zap_counts(b->zap, &b->cnt.auth_accepted, &b->cnt.auth_refused);
	return &b->cnt;
}

static bool readable(void *sock)
{
	int events = 0;
	size_t len = sizeof(events);

	if (zmq_getsockopt(sock, ZMQ_EVENTS, &events, &len) < 0)
		return false;
	return events & ZMQ_POLLIN;
}

/* Reads one whole multipart message; false when none is waiting. */
static bool recv_frames(void *sock, struct frames *f)
{
	zmq_msg_t extra;
	int more = 1;

	f->n = f->total = f->bytes = 0;
	while (more) {
		zmq_msg_t *m = f->n < MAX_FRAMES ? &f->part[f->n] : &extra;
		zmq_msg_init(m);
		if (zmq_msg_recv(m, sock, f->total ? 0 : ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(m);
			return f->total > 0;
		}
		f->total++;
		f->bytes += zmq_msg_size(m);
		more = zmq_msg_more(m);
		if (m == &extra)
			zmq_msg_close(m);
		else
			f->n++;
	}
	return true;
}

static void close_frames(struct frames *f)
{
	for (size_t i = 0; i < f->n; i++)
		zmq_msg_close(&f->part[i]);
	f->n = 0;
}

static void deliver(struct aps_zbridge *b, struct frames *f)
{
	struct aps_inmsg m = { .nframes = f->total - 1, .priv = f };
	size_t id_len = zmq_msg_size(&f->part[0]);

	b->cnt.msgs_in++;
	b->cnt.bytes_in += f->bytes;
	if (id_len == 0 || id_len > APS_PEER_ID_MAX || f->n < 2) {
		b->cnt.bad_frames++;
		return;
	}
	m.peer.len = (uint8_t)id_len;
	memcpy(m.peer.id, zmq_msg_data(&f->part[0]), id_len);
	m.conn = aps_conns_id(&b->conns, zmq_msg_get(&f->part[1], ZMQ_SRCFD));
	m.address = zmq_msg_gets(&f->part[1], "Peer-Address");
	if (m.address == NULL)
		m.address = "";
	m.hdr = zmq_msg_data(&f->part[1]);
	m.hdr_len = zmq_msg_size(&f->part[1]);
	if (f->n == 3) {
		m.payload = zmq_msg_data(&f->part[2]);
		m.payload_len = zmq_msg_size(&f->part[2]);
	}
	b->ops.on_message(b->ctx, &m);
}

static void release_held(void *ctx)
{
	struct held_frame *h = ctx;

	zmq_msg_close(&h->msg);
	free(h);
}

int aps_zbridge_take_payload(struct aps_inmsg *m, struct aps_payload *out)
{
	struct frames *f = m->priv;
	struct held_frame *h;

	if (f->n < 3)
		return APS_EINVAL;
	h = malloc(sizeof(*h));
	if (h == NULL)
		return APS_ENOMEM;
	zmq_msg_init(&h->msg);
	zmq_msg_move(&h->msg, &f->part[2]);
	*out = (struct aps_payload){ zmq_msg_data(&h->msg), zmq_msg_size(&h->msg), release_held,
		                     h };
	return 0;
}

static void schedule_drain(struct aps_zbridge *b)
{
	if (!uv_is_active((uv_handle_t *)&b->idle))
		uv_idle_start(&b->idle, on_idle);
}

/* Reads the monitor's events: accepts count at once, closes wait in b->conns. */
static void read_monitor(struct aps_zbridge *b)
{
	struct frames f;

	while (b->monitor != NULL && readable(b->monitor) && recv_frames(b->monitor, &f)) {
		uint16_t event;
		int32_t fd;
		if (f.n >= 1 && zmq_msg_size(&f.part[0]) >= 6) {
			memcpy(&event, zmq_msg_data(&f.part[0]), sizeof(event));
			memcpy(&fd, (uint8_t *)zmq_msg_data(&f.part[0]) + 2, sizeof(fd));
			if (event == ZMQ_EVENT_ACCEPTED)
				aps_conns_accepted(&b->conns, fd);
			else if (event == ZMQ_EVENT_DISCONNECTED)
				aps_conns_closed(&b->conns, fd);
		}
		close_frames(&f);
	}
}

/* Reports the connections that closed (after the messages that came before). */
static void report_closed(struct aps_zbridge *b)
{
	size_t n;
	uint64_t *ids;

	read_monitor(b);
	ids = aps_conns_take_closed(&b->conns, &n);
	for (size_t i = 0; i < n; i++)
		b->ops.on_disconnect(b->ctx, ids[i]);
	free(ids);
}

/* Drains up to drain_batch messages; re-arms through idle when more may wait. */
static void drain(struct aps_zbridge *b)
{
	struct frames f;

	/* Messages first: a peer's last ones (a BYE) arrived before its disconnect. */
	for (int i = 0; i < b->drain_batch; i++) {
		if (b->router == NULL || !readable(b->router)) {
			report_closed(b);
			uv_idle_stop(&b->idle);
			return;
		}
		if (!recv_frames(b->router, &f))
			continue;
		/* The accept of this message's connection is in the monitor by now. */
		read_monitor(b);
		deliver(b, &f);
		close_frames(&f);
	}
	schedule_drain(b);
}

static void on_router_ready(uv_poll_t *h, int status, int events)
{
	(void)status;
	(void)events;
	drain(h->data);
}

static void on_idle(uv_idle_t *h)
{
	drain(h->data);
}

static void free_sbuf_cb(void *data, void *hint)
{
	(void)data;
	aps_sbuf_unref(hint);
}

/* 0 sent, APS_EBUSY when the peer's pipe is full, APS_ECONN when it is gone. */
static int try_send(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                    size_t hdr_len, struct aps_sbuf *payload)
{
	zmq_msg_t m;

	if (zmq_send(b->router, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return errno == EAGAIN ? APS_EBUSY : APS_ECONN;
	/* The first frame went out: the rest of the message is guaranteed to follow. */
	zmq_send(b->router, hdr, hdr_len, payload != NULL ? ZMQ_SNDMORE : 0);
	if (payload != NULL) {
		zmq_msg_init_data(&m, payload->data, payload->len, free_sbuf_cb,
		                  aps_sbuf_ref(payload));
		if (zmq_msg_send(&m, b->router, 0) < 0)
			zmq_msg_close(&m);
	}
	b->cnt.msgs_out++;
	b->cnt.bytes_out += peer->len + hdr_len + (payload ? payload->len : 0);
	schedule_drain(b);
	return 0;
}

static bool peer_queued(const struct aps_zbridge *b, const struct aps_peer *peer,
                        const struct outmsg *before)
{
	for (const struct outmsg *q = b->queue; q != NULL && q != before; q = q->next) {
		if (aps_peer_equal(&q->peer, peer))
			return true;
	}
	return false;
}

static int enqueue(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                   size_t hdr_len, struct aps_sbuf *payload)
{
	struct outmsg *m, **tail = &b->queue;

	if (b->queue_len >= QUEUE_MAX) {
		if (b->cnt.dropped++ % 1000 == 0)
			aps_log_warn("zbridge",
			             "send queue full (%d messages): dropping replies to "
			             "peers that do not read",
			             QUEUE_MAX);
		return APS_ENOMEM;
	}
	m = malloc(sizeof(*m) + hdr_len);
	if (m == NULL)
		return APS_ENOMEM;
	m->next = NULL;
	m->peer = *peer;
	m->payload = payload ? aps_sbuf_ref(payload) : NULL;
	m->hdr_len = hdr_len;
	memcpy(m->hdr, hdr, hdr_len);
	while (*tail != NULL)
		tail = &(*tail)->next;
	*tail = m;
	b->queue_len++;
	b->cnt.queued++;
	if (!uv_is_active((uv_handle_t *)&b->flush_timer))
		uv_timer_start(&b->flush_timer, on_flush_timer, FLUSH_INTERVAL_MS,
		               FLUSH_INTERVAL_MS);
	return 0;
}

/* Retries queued messages in order; a peer's later messages wait for its earlier ones. */
static void flush_queue(struct aps_zbridge *b)
{
	struct outmsg **link = &b->queue;

	while (*link != NULL) {
		struct outmsg *m = *link;
		int ret = APS_EBUSY;
		if (!peer_queued(b, &m->peer, m))
			ret = try_send(b, &m->peer, m->hdr, m->hdr_len, m->payload);
		if (ret == APS_EBUSY) {
			link = &m->next;
			continue;
		}
		if (ret == APS_ECONN)
			b->cnt.unroutable++;
		*link = m->next;
		aps_sbuf_unref(m->payload);
		free(m);
		b->queue_len--;
	}
	if (b->queue == NULL)
		uv_timer_stop(&b->flush_timer);
}

static void on_flush_timer(uv_timer_t *t)
{
	flush_queue(t->data);
}

int aps_zbridge_send(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                     size_t hdr_len, struct aps_sbuf *payload)
{
	int ret;

	if (b->router == NULL)
		return APS_ECONN;
	if (peer_queued(b, peer, NULL))
		return enqueue(b, peer, hdr, hdr_len, payload);
	ret = try_send(b, peer, hdr, hdr_len, payload);
	if (ret == APS_EBUSY)
		return enqueue(b, peer, hdr, hdr_len, payload);
	if (ret == APS_ECONN)
		b->cnt.unroutable++;
	return ret;
}

static int set_int(void *sock, int opt, int value)
{
	return zmq_setsockopt(sock, opt, &value, sizeof(value));
}

/* CURVE on the ROUTER, with the ZAP handler that checks every worker's key. */
static int enable_curve(struct aps_zbridge *b, const struct aps_zbridge_opts *o)
{
	int ret = aps_zap_start(&b->zap, b->zctx, b->loop, o->curve_allow, o->n_curve_allow);

	if (ret < 0) {
		aps_log_error("zbridge", "cannot start the ZAP handler: %s", aps_strerror(ret));
		return ret;
	}
	set_int(b->router, ZMQ_CURVE_SERVER, 1);
	if (zmq_setsockopt(b->router, ZMQ_CURVE_SECRETKEY, o->curve_secret, 40) < 0 ||
	    zmq_setsockopt(b->router, ZMQ_ZAP_DOMAIN, "apsd", 4) < 0) {
		aps_log_error("zbridge", "the CURVE secret key is not a Z85 key");
		return APS_EINVAL;
	}
	return 0;
}

static int open_router(struct aps_zbridge *b, const struct aps_zbridge_opts *o)
{
	int64_t max_msg = o->max_message_bytes;

	b->router = zmq_socket(b->zctx, ZMQ_ROUTER);
	if (b->router == NULL)
		return APS_ECONN;
	set_int(b->router, ZMQ_ROUTER_MANDATORY, 1);
	/* A client that reconnects (same routing id) before its old connection is
	 * known dead takes its id over, instead of being refused until then. */
	set_int(b->router, ZMQ_ROUTER_HANDOVER, 1);
	set_int(b->router, ZMQ_LINGER, 0);
	if (o->heartbeat_ms > 0) {
		set_int(b->router, ZMQ_HEARTBEAT_IVL, o->heartbeat_ms);
		set_int(b->router, ZMQ_HEARTBEAT_TIMEOUT, o->heartbeat_timeout_ms);
		set_int(b->router, ZMQ_HEARTBEAT_TTL, o->heartbeat_timeout_ms);
	}
	if (max_msg > 0)
		zmq_setsockopt(b->router, ZMQ_MAXMSGSIZE, &max_msg, sizeof(max_msg));
	if (o->curve_secret != NULL && enable_curve(b, o) < 0)
		return APS_ECONN;
	if (zmq_bind(b->router, o->endpoint) < 0) {
		aps_log_error("zbridge", "cannot listen endpoint=%s reason=\"%s\"", o->endpoint,
		              zmq_strerror(errno));
		return APS_ECONN;
	}
	return 0;
}

static int open_monitor(struct aps_zbridge *b)
{
	char addr[64];

	snprintf(addr, sizeof(addr), "inproc://apsd-monitor-%p", (void *)b);
	if (zmq_socket_monitor(b->router, addr, ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_DISCONNECTED) < 0)
		return APS_ECONN;
	b->monitor = zmq_socket(b->zctx, ZMQ_PAIR);
	if (b->monitor == NULL || zmq_connect(b->monitor, addr) < 0)
		return APS_ECONN;
	set_int(b->monitor, ZMQ_LINGER, 0);
	return 0;
}

static int start_poll(struct aps_zbridge *b, void *sock, uv_poll_t *poll)
{
	int fd;
	size_t len = sizeof(fd);

	if (zmq_getsockopt(sock, ZMQ_FD, &fd, &len) < 0)
		return APS_ECONN;
	if (uv_poll_init(b->loop, poll, fd) < 0)
		return APS_ECONN;
	poll->data = b;
	b->open_handles++;
	return uv_poll_start(poll, UV_READABLE, on_router_ready) < 0 ? APS_ECONN : 0;
}

static void init_handles(struct aps_zbridge *b)
{
	uv_idle_init(b->loop, &b->idle);
	b->idle.data = b;
	uv_timer_init(b->loop, &b->flush_timer);
	b->flush_timer.data = b;
	b->open_handles += 2;
}

int aps_zbridge_new(struct aps_zbridge **out, uv_loop_t *loop, const struct aps_zbridge_opts *o,
                    const struct aps_zbridge_ops *ops, void *ctx)
{
	struct aps_zbridge *b = calloc(1, sizeof(*b));
	int ret = APS_ENOMEM;

	if (b == NULL)
		return ret;
	b->loop = loop;
	b->ops = *ops;
	b->ctx = ctx;
	b->drain_batch = o->drain_batch > 0 ? o->drain_batch : 256;
	b->zctx = zmq_ctx_new();
	if (b->zctx == NULL)
		goto err_free;
	init_handles(b);
	ret = open_router(b, o);
	if (ret == 0)
		ret = open_monitor(b);
	if (ret == 0)
		ret = start_poll(b, b->router, &b->router_poll);
	if (ret == 0)
		ret = start_poll(b, b->monitor, &b->monitor_poll);
	if (ret < 0)
		goto err_close;
	/* Messages may already wait: the fd only signals changes. */
	schedule_drain(b);
	*out = b;
	return 0;
err_close:
	aps_zbridge_free(b, 0);
	return ret;
err_free:
	free(b);
	return ret;
}

static void on_handle_closed(uv_handle_t *h)
{
	struct aps_zbridge *b = h->data;

	if (--b->open_handles == 0) {
		aps_conns_free(&b->conns);
		free(b);
	}
}

static void close_sockets(struct aps_zbridge *b, int linger_ms)
{
	if (b->router != NULL) {
		zmq_socket_monitor(b->router, NULL, 0);
		set_int(b->router, ZMQ_LINGER, linger_ms);
		zmq_close(b->router);
		b->router = NULL;
	}
	if (b->monitor != NULL) {
		zmq_close(b->monitor);
		b->monitor = NULL;
	}
	aps_zap_stop(b->zap);
	b->zap = NULL;
	if (b->zctx != NULL) {
		zmq_ctx_term(b->zctx);
		b->zctx = NULL;
	}
}

void aps_zbridge_free(struct aps_zbridge *b, int linger_ms)
{
	uv_handle_t *handles[] = { (uv_handle_t *)&b->idle, (uv_handle_t *)&b->flush_timer,
		                   (uv_handle_t *)&b->router_poll,
		                   (uv_handle_t *)&b->monitor_poll };

	if (b == NULL)
		return;
	/* Stop watching the sockets' fds before the sockets (and the fds) go away. */
	if (b->router_poll.loop != NULL)
		uv_poll_stop(&b->router_poll);
	if (b->monitor_poll.loop != NULL)
		uv_poll_stop(&b->monitor_poll);
	flush_queue(b);
	while (b->queue != NULL) {
		struct outmsg *m = b->queue;
		b->queue = m->next;
		aps_sbuf_unref(m->payload);
		free(m);
		b->cnt.dropped++;
	}
	close_sockets(b, linger_ms);
	for (size_t i = 0; i < sizeof(handles) / sizeof(handles[0]); i++) {
		if (handles[i]->loop != NULL && !uv_is_closing(handles[i]))
			uv_close(handles[i], on_handle_closed);
	}
}
