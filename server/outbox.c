/*
 * Every message apsd sends to a worker is built and packed here, and only
 * here are they handed to the bridge: a reply, an ERROR (counted), one ERROR
 * to a whole job or to one rank about its job, a REGISTERED, a SCALES, and a
 * result packed once for every rank.
 */
#include "server/outbox.h"

#include "server/server_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

void aps_outbox_init(struct aps_msg *m, enum aps_msg_type type, const struct aps_job *job,
                     uint32_t rank)
{
	aps_msg_init(m, type);
	snprintf(m->job, sizeof(m->job), "%s", job->name);
	m->rank = rank;
	m->world_size = job->world_size;
}

/* m packed, sent with payload; counted in tally's slot when tally is not NULL. */
static void pack_and_send(struct aps_server *srv, const struct aps_peer *peer, struct aps_msg *m,
                          struct aps_sbuf *payload, struct aps_tally *tally, uint32_t slot)
{
	uint8_t hdr[APS_SERVER_HEADER_MAX];
	size_t len;

	m->payload = payload ? payload->data : NULL;
	m->payload_len = payload ? payload->len : 0;
	if (aps_msg_pack(m, hdr, sizeof(hdr), &len) < 0) {
		aps_log_error("server", "cannot encode type=%s", aps_msg_type_name(m->type));
		return;
	}
	aps_zbridge_send_tallied(srv->bridge, peer, hdr, len, payload, tally, slot);
}

void aps_outbox_send(struct aps_server *srv, const struct aps_peer *peer, struct aps_msg *m,
                     struct aps_sbuf *payload)
{
	pack_and_send(srv, peer, m, payload, NULL, 0);
}

/* s's connection dropped: its client does not read t's answers (unsent of them, or
 * of its job's). True when it was dropped before, or is now. */
static bool drop_unread(struct aps_server *srv, struct aps_session *s, const struct aps_tensor *t,
                        uint64_t unsent, const char *whose)
{
	if (s->unread_conn == s->conn)
		return true; /* dropped already: what it sent before its close is not served */
	s->unread_conn = s->conn;
	srv->counters.unread_dropped++;
	if (aps_log_gate_open(&srv->unread_log, uv_now(srv->loop), 1000))
		aps_log_warn(
		        "server",
		        "dropped a connection job=%s rank=%u tensor=%s unsent=%llu reason=\"%s "
		        "answers are not read: they would pile up in apsd\"",
		        s->job->name, s->rank, t->name, (unsigned long long)unsent, whose);
	if (aps_zbridge_drop(srv->bridge, s->conn) < 0) /* cannot be shut: told instead */
		aps_outbox_error(srv, &s->peer, APS_EPROTO, NULL,
		                 "tensor '%.80s': a new call before its answers were read",
		                 t->name);
	return true;
}

bool aps_outbox_unread(struct aps_server *srv, struct aps_session *s, const struct aps_tensor *t,
                       uint32_t allowed)
{
	uint32_t unsent = aps_tally_unsent(t->unsent, s->rank);

	if (unsent <= allowed)
		return false;
	return drop_unread(srv, s, t, unsent, "a new call of a tensor whose");
}

/*
 * Whether s's answers waiting in the bridge pass what its job may have in flight
 * (job.h answer_msgs): the tally of each tensor bounds its own, but a job that
 * ended left its answers queued and uncounted, and a client that never read
 * could start job after job on one connection (a stranger's 30 took apsd to
 * 280 MiB, 2026-12-07). Its connection is then dropped, and nothing sent.
 */
static bool piles_up(struct aps_server *srv, struct aps_session *s, const struct aps_tensor *t)
{
	size_t waiting = aps_zbridge_tallied_waiting(srv->bridge, &s->peer);

	if (waiting < s->job->answer_msgs)
		return false;
	return drop_unread(srv, s, t, waiting, "its job's");
}

void aps_outbox_answer(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                       struct aps_msg *m, struct aps_sbuf *payload)
{
	if (!piles_up(srv, s, t))
		pack_and_send(srv, &s->peer, m, payload, t->unsent, s->rank);
}

static void fill_error(struct aps_msg *e, int code, const struct aps_msg *request)
{
	aps_msg_init(e, APS_MSG_ERROR);
	e->error_code = code;
	if (request == NULL)
		return;
	memcpy(e->job, request->job, sizeof(e->job));
	e->rank = request->rank;
	e->world_size = request->world_size;
	e->tensor_id = request->tensor_id;
	e->step = request->step;
	e->about_type = request->type == APS_MSG_ERROR ? APS_MSG_UNSPECIFIED : request->type;
}

__attribute__((format(printf, 6, 0))) static void
send_error(struct aps_server *srv, const struct aps_peer *peer, int code,
           const struct aps_msg *request, uint32_t retry_after_ms, const char *fmt, va_list ap)
{
	struct aps_msg e;

	fill_error(&e, code, request);
	e.retry_after_ms = retry_after_ms;
	vsnprintf(e.error_text, sizeof(e.error_text), fmt, ap);
	/* The text is one printable line: the validator of the peer insists. */
	for (char *c = e.error_text; *c; c++) {
		if (*c < ' ' || *c > '~')
			*c = '?';
	}
	srv->counters.errors_sent++;
	aps_log_debug("server", "error code=%s text=\"%s\"", aps_err_name(code), e.error_text);
	aps_outbox_send(srv, peer, &e, NULL);
}

void aps_outbox_error(struct aps_server *srv, const struct aps_peer *peer, int code,
                      const struct aps_msg *request, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	send_error(srv, peer, code, request, 0, fmt, ap);
	va_end(ap);
}

void aps_outbox_refuse(struct aps_server *srv, const struct aps_peer *peer,
                       const struct aps_msg *hello, uint32_t retry_after_ms, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	send_error(srv, peer, APS_EACCES, hello, retry_after_ms, fmt, ap);
	va_end(ap);
}

void aps_outbox_error_rank(struct aps_server *srv, struct aps_job *job, uint32_t rank, int code,
                           const char *text)
{
	struct aps_msg about;

	aps_msg_init(&about, APS_MSG_ERROR); /* about no type: the client fails every call */
	snprintf(about.job, sizeof(about.job), "%s", job->name);
	about.rank = rank;
	about.world_size = job->world_size;
	aps_outbox_error(srv, &job->ranks[rank]->peer, code, &about, "%s", text);
}

void aps_outbox_error_job(struct aps_server *srv, struct aps_job *job, int code, const char *text)
{
	for (uint32_t r = 0; r < job->world_size; r++) {
		if (job->ranks[r] != NULL)
			aps_outbox_error_rank(srv, job, r, code, text);
	}
}

bool aps_outbox_backed_up(struct aps_server *srv, const struct aps_session *s)
{
	return aps_zbridge_backed_up(srv->bridge, &s->peer);
}

void aps_outbox_registered(struct aps_server *srv, struct aps_job *job, struct aps_session *s,
                           const struct aps_tensor *t, struct aps_tally *tally)
{
	struct aps_msg r;

	aps_outbox_init(&r, APS_MSG_REGISTERED, job, s->rank);
	r.tensor_id = t->id;
	snprintf(r.tensor_name, sizeof(r.tensor_name), "%s", t->name);
	r.total_count = t->count;
	r.chunk_count = t->round.chunk_elems; /* the chunk size every rank must use */
	r.step = t->round.step;               /* the next step: where a rank that is back starts */
	r.updates = t->opt.updates;           /* optimize mode: what a checkpoint restored */
	snprintf(r.format, sizeof(r.format), "%s", t->policy.current.name);
	pack_and_send(srv, &s->peer, &r, NULL, tally, s->rank);
}

void aps_outbox_again(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                      uint32_t chunk)
{
	struct aps_msg m;
	uint32_t rank;

	if (!aps_round_wanted(&t->round, chunk, &rank) || job->ranks[rank] == NULL ||
	    job->ranks[rank]->minor < APS_PROTO_VERSION_MINOR_AGAIN)
		return; /* a rank not here sends its calls again when it is back */
	aps_outbox_init(&m, APS_MSG_AGAIN, job, rank);
	m.tensor_id = t->id;
	m.step = t->round.step;
	m.chunk_offset = (uint64_t)chunk * t->round.chunk_elems;
	m.chunk_count = aps_round_chunk_len(&t->round, chunk);
	m.total_count = t->count;
	srv->counters.asked_again++;
	aps_outbox_send(srv, &job->ranks[rank]->peer, &m, NULL);
}

/* The SCALES r (tensor ids and their exponents) to every member of job. */
void aps_outbox_scales(struct aps_server *srv, struct aps_job *job, struct aps_msg *r)
{
	r->n_exponents = r->n_tensor_ids;
	for (uint32_t rank = 0; r->n_tensor_ids > 0 && rank < job->world_size; rank++) {
		r->rank = rank;
		if (job->ranks[rank] != NULL && !job->absent[rank])
			aps_outbox_send(srv, &job->ranks[rank]->peer, r, NULL);
	}
}

void aps_outbox_send_packed(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                            const uint8_t *hdr, size_t len, struct aps_sbuf *payload)
{
	if (!piles_up(srv, s, t))
		aps_zbridge_send_tallied(srv->bridge, &s->peer, hdr, len, payload, t->unsent,
		                         s->rank);
}
