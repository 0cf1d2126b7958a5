/*
 * Calls a reconnected rank sent again (server.c says when a connection came
 * back). The client cannot know which of its messages, or of apsd's replies,
 * the closed connection lost, so it sends every call in flight again; here
 * each is matched against what apsd already has. A chunk the round holds
 * from this rank is dropped; a chunk already finished is answered with its
 * kept result (the same header and payload every other rank got); an
 * exponent exchange or a barrier already complete is answered again. Nothing
 * is counted twice, and nothing a rank missed is computed anew.
 *
 * Only sessions that reconnected get this: for any other a second PUSH of a
 * chunk is a protocol error, answered as one (handlers.c).
 */
#include "server/resend.h"

#include "server/outbox.h"
#include "server/server_impl.h"

#include "common/log.h"

#include <stdio.h>

static void replay(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                   const struct aps_replay_entry *e)
{
	/* Not counted in t->unsent: the first sends may have reached the new connection
	 * too (the client takes a chunk once and drops the other copy), and a kept result
	 * is one buffer however often it goes. */
	aps_zbridge_send(srv->bridge, &s->peer, e->hdr, e->hdr_len, e->payload);
	if (e->payload != NULL) {
		s->bytes_out += e->payload->len;
		t->stats.bytes_out += e->payload->len;
	}
}

bool aps_resend_answerable(struct aps_session *s, const struct aps_msg *m)
{
	struct aps_job *job = s->job;
	struct aps_tensor *t;
	int64_t chunk;

	if (s->reconnects == 0 || job == NULL)
		return false;
	if (m->type == APS_MSG_BARRIER)
		return m->step + 1 == job->barrier_step;
	if (m->type != APS_MSG_PUSH && m->type != APS_MSG_BROADCAST)
		return false;
	t = aps_job_tensor(job, m->tensor_id);
	if (t == NULL || !t->registered[s->rank])
		return false;
	chunk = aps_round_chunk_of(&t->round, m->chunk_offset, m->chunk_count);
	return chunk >= 0 && aps_replay_find(&t->replay, (uint32_t)chunk, m->step) != NULL;
}

bool aps_resend_push(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                     uint32_t chunk, const struct aps_msg *m)
{
	const struct aps_replay_entry *e;

	if (s->reconnects == 0)
		return false;
	e = aps_replay_find(&t->replay, chunk, m->step);
	if (e == NULL && !aps_round_has(&t->round, s->rank, m->step, chunk))
		return false; /* new to apsd: counted as usual */
	srv->counters.resent++;
	aps_log_debug("server", "resent job=%s rank=%u tensor=%.80s step=%llu chunk=%u answer=%s",
	              s->job->name, s->rank, t->name, (unsigned long long)m->step, chunk,
	              e != NULL ? "result" : "dropped");
	if (e != NULL)
		replay(srv, s, t, e);
	return true;
}

void aps_resend_keep(struct aps_server *srv, struct aps_tensor *t, uint64_t step,
                     const struct aps_round_result *res, const uint8_t *hdr, size_t len)
{
	uint32_t chunk = (uint32_t)(res->offset / t->round.chunk_elems);

	if (srv->opts.reconnect_grace_ms <= 0)
		return;
	if (aps_replay_keep(&t->replay, t->round.n_chunks, chunk, step, hdr, len, res->payload) < 0)
		aps_log_warn("server", "cannot keep a result for reconnects tensor=%.80s chunk=%u",
		             t->name, chunk);
}

bool aps_resend_exponent(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                         struct aps_msg *scales)
{
	/* The rank waits for the exchange of the step it has not pushed yet. */
	bool done = t->exp_done && t->exp_done_step == t->round.step;

	if (s->reconnects == 0 || (!t->exp_has[s->rank] && !done))
		return false;
	srv->counters.resent++;
	if (!t->exp_has[s->rank] && scales->n_tensor_ids < APS_MSG_LIST_MAX) {
		scales->tensor_ids[scales->n_tensor_ids] = t->id;
		scales->exponents[scales->n_tensor_ids++] = t->exp_done_max;
	}
	return true;
}

bool aps_resend_barrier(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	struct aps_job *job = s->job;
	struct aps_msg r;

	if (s->reconnects == 0)
		return false;
	if (s->steps_due && m->step == s->steps_barrier) { /* its BARRIER follows its steps */
		srv->counters.resent++;
		return true;
	}
	if (m->step == job->barrier_step && job->barrier_has[s->rank]) {
		srv->counters.resent++;
		return true;
	}
	if (m->step + 1 != job->barrier_step)
		return false;
	srv->counters.resent++;
	aps_msg_init(&r, APS_MSG_BARRIER);
	snprintf(r.job, sizeof(r.job), "%s", job->name);
	r.rank = s->rank;
	r.world_size = job->world_size;
	r.step = m->step;
	aps_outbox_send(srv, &s->peer, &r, NULL);
	return true;
}
