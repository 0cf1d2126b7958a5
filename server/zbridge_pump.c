/*
 * The bridge's messages (zbridge.h): ZMQ_FD is edge-triggered, so every
 * wake-up drains ZMQ_EVENTS until empty, a drain that stops at the batch
 * limit re-arms itself through a uv_idle handle, and every send (which can
 * consume the edge) schedules a drain too. Sends use ZMQ_ROUTER_MANDATORY and
 * ZMQ_DONTWAIT: a full pipe gives EAGAIN and the message waits in its peer's
 * queue (outq.h), retried from a timer; a peer that has gone gives
 * EHOSTUNREACH and the message is counted as unroutable. Each message carries
 * the descriptor it arrived on (ZMQ_SRCFD); the monitor's events, read before
 * each message is handed up, keep the connection table (conns.h); closes are
 * reported once every message that waited has been handed up (a BYE before
 * its disconnect).
 */
#include "server/zbridge_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define MAX_FRAMES        3 /* identity, header, payload */
#define FLUSH_INTERVAL_MS 1

struct frames {
	zmq_msg_t part[MAX_FRAMES];
	size_t n;     /* frames kept in part[] */
	size_t total; /* frames received, kept or not */
	size_t bytes;
};

/* A taken payload frame lives here until released. */
struct held_frame {
	zmq_msg_t msg;
};

uint64_t aps__zbridge_now_ms(const struct aps_zbridge *b)
{
	return uv_now(b->loop) > 0 ? uv_now(b->loop) : 1;
}

const char *aps_zbridge_endpoint(const struct aps_zbridge *b)
{
	return b->endpoint;
}

const struct aps_zbridge_counters *aps_zbridge_counters(struct aps_zbridge *b)
{
	const struct aps_conns_counters *c = &b->conns.cnt;

	aps_zap_counts(b->zap, &b->cnt.auth_accepted, &b->cnt.auth_refused,
	               &b->cnt.handshakes_not_allowed);
	b->cnt.addresses_turned_away = b->admission.quarantined;
	b->cnt.handshakes_turned_away = b->admission.refused;
	b->cnt.connections = c->accepted;
	b->cnt.refused_connections = c->refused;
	b->cnt.refused_address_connections = c->refused_address;
	b->cnt.unjoined_dropped = c->unjoined_dropped;
	b->cnt.zmtp_refused = c->zmtp_refused;
	b->cnt.unfinished_dropped = c->unfinished;
	b->cnt.unheard_dropped = c->unheard;
	b->cnt.handshakes_failed = c->handshakes_failed;
	b->cnt.open_connections = b->conns.live;
	b->cnt.parked_bytes = aps_conns_parked_bytes(&b->conns);
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

static const char *property(zmq_msg_t *m, const char *name)
{
	const char *v = zmq_msg_gets(m, name);

	return v != NULL ? v : "";
}

static void deliver(struct aps_zbridge *b, struct frames *f)
{
	struct aps_inmsg m = { .nframes = f->total - 1, .priv = f };
	size_t id_len = zmq_msg_size(&f->part[0]);

	b->cnt.msgs_in++;
	b->cnt.bytes_in += f->bytes;
	if (id_len == 0 || id_len > APS_PEER_ID_MAX || f->n < 2) {
		b->cnt.empty_messages++;
		return;
	}
	m.peer.len = (uint8_t)id_len;
	memcpy(m.peer.id, zmq_msg_data(&f->part[0]), id_len);
	m.conn = aps_conns_id(&b->conns, zmq_msg_get(&f->part[1], ZMQ_SRCFD));
	m.address = property(&f->part[1], "Peer-Address");
	switch (aps_conns_delivered(&b->conns, m.conn, &m.peer, aps__zbridge_now_ms(b))) {
	case APS_CONNS_FIRST: /* it spoke */
		aps_admission_spoke(&b->admission, m.address, aps__zbridge_now_ms(b));
		break;
	case APS_CONNS_UNHEARD: /* dropped: it read too much before it spoke */
		return;
	case APS_CONNS_LATER:
		break;
	}
	m.user = property(&f->part[1], "User-Id");
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

void aps__zbridge_schedule_drain(struct aps_zbridge *b)
{
	if (!uv_is_active((uv_handle_t *)&b->idle))
		uv_idle_start(&b->idle, aps__zbridge_on_idle);
}

/* One line a second at most for connections over the limit, with their count. */
/* address: the one that had max_connections_per_address open; NULL: max_connections. */
static void log_refused(struct aps_zbridge *b, const char *address)
{
	uint64_t now = aps__zbridge_now_ms(b);
	unsigned long long n;

	if (!aps_log_gate_open(&b->refused_log, now, 1000))
		return;
	n = aps_log_gate_pass(&b->refused_log, now) + 1;
	if (address == NULL)
		aps_log_warn("zbridge",
		             "refused connections count=%llu reason=\"max_connections=%zu open\"",
		             n, b->conns.max);
	else
		aps_log_warn(
		        "zbridge",
		        "refused connections count=%llu address=%s reason=\"max_connections_per_address=%zu open from its address\"",
		        n, address, b->conns.max_per_address);
}

/* One line a second at most for connections ZeroMQ closed, with their count. */
static void log_zmtp_refused(struct aps_zbridge *b, const char *address)
{
	uint64_t now = aps__zbridge_now_ms(b);

	if (!aps_log_gate_open(&b->zmtp_log, now, 1000))
		return;
	aps_log_warn("zbridge",
	             "connection closed by ZeroMQ address=%s count=%llu reason=\"a frame over "
	             "max_message_bytes (%lld), or bytes that are not ZMTP\"",
	             address, (unsigned long long)aps_log_gate_pass(&b->zmtp_log, now) + 1,
	             (long long)b->max_message_bytes);
}

static void on_closed_fd(struct aps_zbridge *b, int fd)
{
	const char *address = "";
	int cause = aps_conns_closed(&b->conns, fd, &address);

	if (cause == APS_CONN_ZMTP)
		log_zmtp_refused(b, address);
	else if (cause == APS_CONN_HANDSHAKE)
		aps_log_debug("zbridge", "handshake failed address=%s", address);
}

static void log_accept_closed(struct aps_zbridge *b, int err)
{
	uint64_t now = aps__zbridge_now_ms(b);

	if (!aps_log_gate_open(&b->accept_closed_log, now, 1000))
		return;
	aps_log_warn("zbridge",
	             "closed connections at accept count=%llu reason=\"outside allow_from, or "
	             "the accept failed (%s)\"",
	             (unsigned long long)aps_log_gate_pass(&b->accept_closed_log, now) + 1,
	             strerror(err));
}

static void on_event(struct aps_zbridge *b, uint16_t event, int32_t value)
{
	switch (event) {
	case ZMQ_EVENT_ACCEPTED:
		switch (aps_conns_accepted(&b->conns, value, aps__zbridge_now_ms(b))) {
		case APS_EBUSY:
			log_refused(b, NULL);
			break;
		case APS_ERANGE:
			log_refused(b, aps_conns_address(&b->conns, value));
			break;
		}
		break;
	case ZMQ_EVENT_ACCEPT_FAILED: /* outside allow_from (libzmq closed it), or an error */
		b->cnt.accepts_closed++;
		log_accept_closed(b, value);
		break;
	case ZMQ_EVENT_DISCONNECTED:
		on_closed_fd(b, value);
		break;
	case ZMQ_EVENT_HANDSHAKE_SUCCEEDED:
		aps_conns_handshake_succeeded(&b->conns);
		break;
	case ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL:
	case ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL:
	case ZMQ_EVENT_HANDSHAKE_FAILED_AUTH:
		aps_conns_handshake_failed(&b->conns);
		break;
	default:
		break;
	}
}

/* Reads the monitor's events in order (accepts before their connections' messages). */
void aps__zbridge_read_monitor(struct aps_zbridge *b)
{
	struct frames f;

	while (b->monitor != NULL && readable(b->monitor) && recv_frames(b->monitor, &f)) {
		uint16_t event;
		int32_t value;
		if (f.n >= 1 && zmq_msg_size(&f.part[0]) >= 6) {
			memcpy(&event, zmq_msg_data(&f.part[0]), sizeof(event));
			memcpy(&value, (uint8_t *)zmq_msg_data(&f.part[0]) + 2, sizeof(value));
			on_event(b, event, value);
		}
		close_frames(&f);
	}
}

/*
 * Reports the connections that closed, once no message waits: a peer's last
 * messages (a BYE) come before its close. False when one came meanwhile (the
 * drain goes on, and reports them after it).
 */
bool aps__zbridge_report_closed(struct aps_zbridge *b)
{
	size_t n;
	uint64_t *ids;

	aps__zbridge_read_monitor(b);
	if (b->router != NULL && readable(b->router))
		return false;
	ids = aps_conns_take_closed(&b->conns, &n);
	for (size_t i = 0; i < n; i++)
		b->ops.on_disconnect(b->ctx, ids[i]);
	free(ids);
	return true;
}

/* Drains up to drain_batch messages; re-arms through idle when more may wait. */
static void drain(struct aps_zbridge *b)
{
	struct frames f;

	/* Messages first: a peer's last ones (a BYE) arrived before its disconnect. */
	for (int i = 0; i < b->drain_batch; i++) {
		if (b->router == NULL || !readable(b->router)) {
			if (!aps__zbridge_report_closed(b))
				continue;
			uv_idle_stop(&b->idle);
			return;
		}
		if (!recv_frames(b->router, &f))
			continue;
		/* The accept of this message's connection is in the monitor by now. */
		aps__zbridge_read_monitor(b);
		deliver(b, &f);
		close_frames(&f);
	}
	aps__zbridge_schedule_drain(b);
}

void aps__zbridge_on_ready(uv_poll_t *h, int status, int events)
{
	(void)status;
	(void)events;
	drain(h->data);
}

void aps__zbridge_on_idle(uv_idle_t *h)
{
	drain(h->data);
}

static void free_sbuf_cb(void *data, void *hint)
{
	(void)data;
	aps_sbuf_unref(hint);
}

/* A payload counted in a tally (tally.h): libzmq is done with it (its I/O thread). */
struct tallied {
	struct aps_sbuf *payload;
	struct aps_tally *tally;
	uint32_t slot;
};

static void free_tallied_cb(void *data, void *hint)
{
	struct tallied *t = hint;

	(void)data;
	aps_sbuf_unref(t->payload);
	aps_tally_done(t->tally, t->slot);
	free(t);
}

/* The payload frame: zero copy, the tally's count (if any) ended when libzmq frees it. */
static void send_payload(struct aps_zbridge *b, struct aps_sbuf *payload, struct aps_tally *tally,
                         uint32_t slot)
{
	struct tallied *t = tally != NULL ? malloc(sizeof(*t)) : NULL;
	zmq_msg_t m;

	if (t != NULL) {
		*t = (struct tallied){ aps_sbuf_ref(payload), tally, slot };
		if (zmq_msg_init_data(&m, payload->data, payload->len, free_tallied_cb, t) < 0) {
			free_tallied_cb(NULL, t); /* out of memory: the frame is lost, as below */
			return;
		}
	} else {
		if (tally != NULL) /* out of memory: not counted */
			aps_tally_done(tally, slot);
		if (zmq_msg_init_data(&m, payload->data, payload->len, free_sbuf_cb,
		                      aps_sbuf_ref(payload)) < 0) {
			aps_sbuf_unref(payload);
			return;
		}
	}
	if (zmq_msg_send(&m, b->router, 0) < 0)
		zmq_msg_close(&m);
}

/* 0 sent (the tally's count goes with it), APS_EBUSY when the peer's pipe is full,
 * APS_ECONN when it is gone. */
static int try_send(void *ctx, const struct aps_peer *peer, const uint8_t *hdr, size_t hdr_len,
                    struct aps_sbuf *payload, struct aps_tally *tally, uint32_t slot)
{
	struct aps_zbridge *b = ctx;

	if (zmq_send(b->router, peer->id, peer->len, ZMQ_SNDMORE | ZMQ_DONTWAIT) < 0)
		return errno == EAGAIN ? APS_EBUSY : APS_ECONN;
	/* The first frame went out: the rest of the message is guaranteed to follow. */
	zmq_send(b->router, hdr, hdr_len, payload != NULL ? ZMQ_SNDMORE : 0);
	if (payload != NULL)
		send_payload(b, payload, tally, slot);
	else if (tally != NULL)
		aps_tally_done(tally, slot);
	b->cnt.msgs_out++;
	b->cnt.bytes_out += peer->len + hdr_len + (payload ? payload->len : 0);
	aps__zbridge_schedule_drain(b);
	return 0;
}

/* A peer whose replies pile up unread: its queue goes, and its connection. */
static void drop_slow_reader(struct aps_zbridge *b, const struct aps_peer *peer)
{
	size_t lost = aps_outq_discard(&b->outq, peer);
	size_t conns = aps_conns_drop_peer(&b->conns, peer, aps__zbridge_now_ms(b));

	b->cnt.dropped += lost;
	b->cnt.slow_readers++;
	aps_log_warn("zbridge",
	             "dropped a slow reader replies_unread=%zu connections=%zu reason=\"its "
	             "replies piled up: it does not read them\"",
	             lost, conns);
}

static int enqueue(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                   size_t hdr_len, struct aps_sbuf *payload, struct aps_tally *tally, uint32_t slot)
{
	int ret = aps_outq_push(&b->outq, peer, hdr, hdr_len, payload, tally, slot);

	if (ret == APS_EBUSY && b->outq.loose >= APS_OUTQ_TOTAL_MAX) {
		/* Every queue together is full: the longest is the slowest reader. */
		const struct aps_outq_peer *worst = aps_outq_longest(&b->outq);
		struct aps_peer slow = worst->peer;
		drop_slow_reader(b, &slow);
		if (!aps_peer_equal(&slow, peer))
			ret = aps_outq_push(&b->outq, peer, hdr, hdr_len, payload, tally, slot);
	} else if (ret == APS_EBUSY) {
		drop_slow_reader(b, peer);
	}
	if (ret < 0) {
		b->cnt.dropped++;
		if (tally != NULL)
			aps_tally_done(tally, slot);
		return ret;
	}
	b->cnt.queued++;
	if (!uv_is_active((uv_handle_t *)&b->flush_timer))
		uv_timer_start(&b->flush_timer, aps__zbridge_on_flush_timer, FLUSH_INTERVAL_MS,
		               FLUSH_INTERVAL_MS);
	return 0;
}

void aps__zbridge_flush_queue(struct aps_zbridge *b)
{
	size_t sent = 0, lost = 0;

	if (b->router != NULL)
		aps_outq_flush(&b->outq, try_send, b, &sent, &lost);
	b->cnt.unroutable += lost;
	if (b->outq.total == 0)
		uv_timer_stop(&b->flush_timer);
}

void aps__zbridge_on_flush_timer(uv_timer_t *t)
{
	aps__zbridge_flush_queue(t->data);
}

int aps_zbridge_send_tallied(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                             size_t hdr_len, struct aps_sbuf *payload, struct aps_tally *tally,
                             uint32_t slot)
{
	int ret;

	if (b->router == NULL)
		return APS_ECONN;
	if (tally != NULL)
		aps_tally_start(tally, slot);
	if (aps_outq_waiting(&b->outq, peer))
		return enqueue(b, peer, hdr, hdr_len, payload, tally, slot);
	ret = try_send(b, peer, hdr, hdr_len, payload, tally, slot);
	if (ret == APS_EBUSY)
		return enqueue(b, peer, hdr, hdr_len, payload, tally, slot);
	if (ret == APS_ECONN)
		b->cnt.unroutable++;
	if (ret < 0 && tally != NULL)
		aps_tally_done(tally, slot);
	return ret;
}

int aps_zbridge_send(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                     size_t hdr_len, struct aps_sbuf *payload)
{
	return aps_zbridge_send_tallied(b, peer, hdr, hdr_len, payload, NULL, 0);
}

size_t aps_zbridge_tallied_waiting(struct aps_zbridge *b, const struct aps_peer *peer)
{
	return aps_outq_tallied(&b->outq, peer);
}

bool aps_zbridge_backed_up(struct aps_zbridge *b, const struct aps_peer *peer)
{
	return aps_outq_waiting(&b->outq, peer);
}

void aps_zbridge_admit(struct aps_zbridge *b, uint64_t conn, bool admitted)
{
	aps_conns_admit(&b->conns, conn, admitted, aps__zbridge_now_ms(b));
}

bool aps_zbridge_conn_open(struct aps_zbridge *b, uint64_t conn)
{
	return aps_conns_find(&b->conns, conn) != NULL;
}

int aps_zbridge_drop(struct aps_zbridge *b, uint64_t conn)
{
	return aps_conns_drop(&b->conns, conn, aps__zbridge_now_ms(b));
}
