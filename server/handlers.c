/*
 * One handler per message type a worker sends. Each gets a message the
 * validator has checked and a session that is allowed to send it (server.c),
 * applies it to the job, and answers: a reply, a result to every rank, or an
 * ERROR that says what was wrong. State a peer cannot be trusted with (which
 * tensors exist, which step a round is at) is checked here.
 */
#include "server/handlers.h"
#include "server/resend.h"

#include "server/finish.h"
#include "server/leave.h"
#include "server/optimize.h"
#include "server/outbox.h"
#include "server/server_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

/* A new tensor: its timeline label and its precision policy from the requested format. */
static void init_tensor(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                        const struct aps_format *requested)
{
	t->round.trace = srv->opts.trace;
	t->round.engine = srv->engine;
	t->job = job;
	t->round.share = &job->held->share;
	t->round.owner = t;
	t->round.lane = t->id; /* a tensor's first chunk on its own thread, the next on the next */
	t->round.label = t->name;
	t->round.job_label = job->name;
	t->round.measure_error = job->policy.automatic && job->optim.kind == APS_OPTIM_NONE;
	aps_policy_init(&job->policy, t->name, t->count, requested, &t->policy);
}

/* "0, 2, 3": the ranks that registered t so far. */
static void registered_ranks(const struct aps_job *job, const struct aps_tensor *t, char *buf,
                             size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (uint32_t r = 0; r < job->world_size && used + 12 < len; r++) {
		if (t->registered[r])
			used += (size_t)snprintf(buf + used, len - used, "%s%u", used ? ", " : "",
			                         r);
	}
}

static void registration_mismatch(struct aps_server *srv, struct aps_job *job,
                                  const struct aps_tensor *t, const struct aps_msg *m)
{
	char ranks[96], text[APS_MSG_TEXT_MAX + 1];

	srv->counters.bad_state++;
	registered_ranks(job, t, ranks, sizeof(ranks));
	snprintf(text, sizeof(text),
	         "tensor '%.80s': rank(s) %s registered %llu elements, rank %u registers %llu",
	         t->name, ranks, (unsigned long long)t->count, m->rank,
	         (unsigned long long)m->total_count);
	aps_outbox_error_job(srv, job, APS_EMISMATCH, text);
}

/*
 * A REGISTER states the step the rank is at: 0 for a new tensor, more when
 * workers join a restarted daemon again. Ranks at different steps cannot go
 * on: one of them got a result the others lost.
 */
static void step_mismatch(struct aps_server *srv, struct aps_job *job, const struct aps_tensor *t,
                          const struct aps_msg *m)
{
	char text[APS_MSG_TEXT_MAX + 1];

	srv->counters.bad_state++;
	snprintf(text, sizeof(text),
	         "tensor '%.80s': rank %u is at step %llu, the others at step %llu (a result "
	         "some ranks got was lost, as when apsd restarts mid-round): start the job again",
	         t->name, m->rank, (unsigned long long)m->step, (unsigned long long)t->round.step);
	/* For good: ranks that join later are refused at HELLO, not left to time out. */
	if (job->departed[0] == '\0')
		snprintf(job->departed, sizeof(job->departed), "%s", text);
	aps_outbox_error_job(srv, job, APS_EMISMATCH, text);
}

/*
 * A new tensor must fit max_job_bytes, max_address_bytes (the jobs started
 * from its job's address together: one address cannot register the whole of
 * max_total_bytes, which costs it nothing until it pushes) and max_total_bytes
 * (every job together): 0, or APS_ERANGE after an ERROR. Per element a job
 * holds 4 fp32 bytes of sum, in optimize mode weights, view and state, and
 * with reconnects the last result kept.
 */
static int check_memory(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	const struct aps_job *job = s->job;
	bool kept = srv->opts.reconnect_grace_ms > 0;
	uint64_t per =
	        4 * (1 + kept +
	             (job->optim.kind != APS_OPTIM_NONE ? 2 + aps_optim_slots(&job->optim) : 0));
	uint64_t total, mine, limit = srv->opts.max_job_bytes;
	uint64_t max = srv->opts.max_total_bytes, max_mine = srv->opts.max_address_bytes;
	const char *name = "max_job_bytes";

	/* Counts < 2^32 elements and ranks < 2^13: the sum cannot overflow. */
	/* max_job_bytes bounds a job's values; max_total_bytes, the daemon's memory,
	 * also what every tensor keeps per rank (~100 bytes a rank). */
	uint64_t values = m->total_count * per;
	uint64_t need = values + aps_job_tensor_overhead(job, m->total_count);
	/* what it takes of the job's checkpoint is counted already, until it takes it */
	uint64_t taken = aps_optimize_resumed_bytes(job, m->tensor_name, m->total_count);

	total = aps_jobs_bytes(&srv->jobs, job->origin, &mine) + srv->ckpt_reading - taken;
	mine -= taken;
	if (max != 0 && max_mine >= max) /* the total binds first */
		max_mine = 0;
	if (job->tensor_bytes + values <= limit) {
		if (max_mine != 0 && mine + need > max_mine) {
			name = "max_address_bytes";
			limit = max_mine;
		} else if (max != 0 && total + need > max) {
			name = "max_total_bytes";
			limit = max;
		} else {
			return 0;
		}
	}
	srv->counters.bad_state++;
	srv->counters.refused_memory++;
	/* the limit first: an error's text is cut at 255 bytes */
	aps_outbox_error(srv, &s->peer, APS_ERANGE, m,
	                 "cannot register tensor '%.60s' (%llu elements): %s is %llu; job "
	                 "'%.40s' would hold %llu fp32 bytes and %llu of bookkeeping; the jobs "
	                 "from %s %llu bytes, every job %llu",
	                 m->tensor_name, (unsigned long long)m->total_count, name,
	                 (unsigned long long)limit, job->name,
	                 (unsigned long long)(job->tensor_bytes + values),
	                 (unsigned long long)(job->overhead_bytes + need - values), job->origin,
	                 (unsigned long long)(mine + need), (unsigned long long)(total + need));
	return APS_ERANGE;
}

void aps_handle_register(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	struct aps_job *job = s->job;
	struct aps_tensor *t = aps_job_tensor_by_name(job, m->tensor_name);
	bool kept = srv->opts.reconnect_grace_ms > 0;
	int ret;

	if (t != NULL && t->count != m->total_count)
		return registration_mismatch(srv, job, t, m);
	if (t == NULL && check_memory(srv, s, m) < 0)
		return;
	bool rejoin = (m->flags & APS_MSG_FLAG_REJOIN) != 0;

	if (rejoin && t != NULL && m->step != t->round.step && !job->absent[s->rank])
		return step_mismatch(srv, job, t, m);
	if (t == NULL) {
		ret = aps_job_add_tensor(job, m->tensor_name, m->total_count, srv->opts.max_tensors,
		                         &t);
		if (ret == 0) {
			init_tensor(srv, job, t, &m->fmt);
			t->round.step = rejoin ? m->step : 0; /* where workers that rejoin are */
			job->tensor_bytes += kept ? t->count * sizeof(float) : 0;
		}
		if (ret == 0)
			ret = aps_optimize_register(srv, job, t);
		if (ret < 0) {
			aps_outbox_error(srv, &s->peer, ret, m,
			                 "cannot register tensor '%.80s': %s", m->tensor_name,
			                 ret == APS_ERANGE ? "too many tensors" : "out of memory");
			return;
		}
	}
	t->registered[s->rank] = true;
	aps_outbox_registered(srv, job, s, t, NULL);
}

/* The tensor and chunk a PUSH or BROADCAST is about, or NULL after an ERROR. */
static struct aps_tensor *pushed_chunk(struct aps_server *srv, struct aps_session *s,
                                       const struct aps_msg *m, uint32_t *chunk)
{
	struct aps_tensor *t = aps_job_tensor(s->job, m->tensor_id);
	int64_t c;

	if (t == NULL || !t->registered[s->rank]) {
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m,
		                 "tensor id %u is not registered by rank %u of job '%s'",
		                 m->tensor_id, s->rank, s->job->name);
		return NULL;
	}
	/* A broadcast request without data names its chunk too. */
	c = aps_round_chunk_of(&t->round, m->chunk_offset, m->chunk_count);
	if (m->total_count != t->count || c < 0) {
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m,
		                 "tensor '%.80s' (%llu elements) travels in chunks of %zu: "
		                 "offset %llu count %llu is not one",
		                 t->name, (unsigned long long)t->count, t->round.chunk_elems,
		                 (unsigned long long)m->chunk_offset,
		                 (unsigned long long)m->chunk_count);
		return NULL;
	}
	*chunk = (uint32_t)c;
	return t;
}

static int contribution_of(struct aps_inmsg *in, const struct aps_session *s,
                           const struct aps_msg *m, struct aps_contribution *c)
{
	memset(c, 0, sizeof(*c));
	if (m->payload == NULL)
		return 0;
	c->askable = s->minor >= APS_PROTO_VERSION_MINOR_AGAIN;
	c->fmt = m->fmt;
	c->scale_exp = m->scale_exp;
	c->block = m->block_size;
	c->flushed = m->flushed;
	return aps_zbridge_take_payload(in, &c->payload);
}

/* A push taken: started says it began its step. */
static void note_push(struct aps_tensor *t, uint32_t rank, uint32_t chunk, const struct aps_msg *m,
                      uint64_t arrived_ns, bool started)
{
	struct aps_tensor_stats *st = &t->stats;

	if (started)
		st->step_started_ns = arrived_ns;
	st->bytes_in += m->payload_len;
	st->elements_in += m->payload != NULL ? m->chunk_count : 0;
	if (rank == 0 && chunk == 0 && m->payload != NULL) {
		snprintf(st->format, sizeof(st->format), "%s", m->format);
		st->scale_exp = m->scale_exp;
	}
}

/* Whether rank has sent nothing of t's step yet: its first push of the step, after
 * which a client that reads has every answer of the step before (tally.h). Looked
 * at only when some answer is not sent, then in every chunk. */
static bool starts_step(const struct aps_tensor *t, uint32_t rank, uint64_t step)
{
	if (aps_tally_unsent(t->unsent, rank) <= 1 || step != t->round.step)
		return false;
	for (uint32_t c = 0; c < t->round.n_chunks; c++) {
		if (aps_round_sent(&t->round, rank, step, c))
			return false;
	}
	return true;
}

/* Drops t's step: every rank's call of it fails APS_ENOMEM saying why, and they
 * make their calls again together. */
static void fail_step(struct aps_server *srv, struct aps_tensor *t, const char *why)
{
	struct aps_job *job = t->job;
	struct aps_msg about;

	aps_msg_init(&about, APS_MSG_PUSH);
	snprintf(about.job, sizeof(about.job), "%s", job->name);
	about.world_size = job->world_size;
	about.tensor_id = t->id;
	about.step = t->round.step;
	aps_job_abort_tensor(job, t);
	for (uint32_t r = 0; r < job->world_size; r++) {
		if (job->ranks[r] == NULL)
			continue;
		about.rank = r;
		aps_outbox_error(srv, &job->ranks[r]->peer, APS_ENOMEM, &about, "%s", why);
	}
}

/*
 * A push that came before a lower rank's while max_held_bytes of such pushes
 * are held was not kept: its rank is asked for it again (AGAIN) when its turn
 * comes. A client older than AGAIN would wait forever, and its call made again
 * would find its other chunks of the step taken: the tensor's step fails for
 * every rank.
 */
static void declined(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                     const struct aps_msg *m)
{
	char why[2 * APS_MSG_TEXT_MAX]; /* the ERROR keeps what fits */

	srv->counters.pushes_declined++;
	if (s->minor >= APS_PROTO_VERSION_MINOR_AGAIN)
		return;
	snprintf(why, sizeof(why),
	         "tensor '%.80s' step %llu: apsd holds max_held_bytes = %llu of pushes that "
	         "came before a lower rank's, and rank %u's client (protocol 1.%u) cannot be "
	         "asked for its own again (1.%d): call again",
	         t->name, (unsigned long long)m->step, (unsigned long long)srv->held.limit, s->rank,
	         s->minor, APS_PROTO_VERSION_MINOR_AGAIN);
	fail_step(srv, t, why);
}

void aps_handle_drop_held_step(void *ctx, struct aps_round *r)
{
	struct aps_tensor *t = r->owner;
	char why[2 * APS_MSG_TEXT_MAX]; /* the ERROR keeps what fits */

	snprintf(why, sizeof(why),
	         "tensor '%.64s' step %llu: apsd gave what this step held to another job's "
	         "pushes (max_held_bytes = %llu, shared), and this job's clients older than "
	         "protocol 1.%d cannot be asked for theirs again: call again",
	         t->name, (unsigned long long)r->step,
	         (unsigned long long)((struct aps_server *)ctx)->held.limit,
	         APS_PROTO_VERSION_MINOR_AGAIN);
	fail_step(ctx, t, why);
}

void aps_handle_push(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m,
                     struct aps_inmsg *in)
{
	enum aps_round_kind kind =
	        m->type == APS_MSG_BROADCAST ? APS_ROUND_BROADCAST : APS_ROUND_ALLREDUCE;
	uint64_t arrived_ns = uv_hrtime();
	struct aps_contribution c;
	uint32_t chunk;
	struct aps_tensor *t = pushed_chunk(srv, s, m, &chunk);
	char why[160];
	bool started;
	int ret;

	if (t == NULL) {
		srv->counters.bad_state++;
		return;
	}
	if (aps_resend_push(srv, s, t, chunk, m))
		return;
	if (starts_step(t, s->rank, m->step) && aps_outbox_unread(srv, s, t, 1))
		return; /* its last step's answers unread (tally.h) */
	if (m->payload != NULL && ((m->flags & APS_MSG_FLAG_NO_CRC) != 0) != s->job->no_crc) {
		srv->counters.bad_state++;
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m,
		                 "job '%.64s' sends payloads %s CRC32C: this one %s", s->job->name,
		                 s->job->no_crc ? "without" : "with",
		                 s->job->no_crc ? "has one" : "has none");
		return;
	}
	if (!aps_optimize_check_push(srv, s, t, m))
		return;
	if (contribution_of(in, s, m, &c) < 0) {
		aps_outbox_error(srv, &s->peer, APS_ENOMEM, m, "out of memory");
		return;
	}
	started = !aps_round_busy(&t->round);
	ret = aps_round_add(&t->round, s->rank, m->step, chunk, kind, &c, why, sizeof(why));
	if (ret != 0) {
		if (c.payload.release != NULL)
			c.payload.release(c.payload.ctx);
		if (ret == APS_ROUND_ADD_DECLINED)
			return declined(srv, s, t, m);
		srv->counters.bad_state++;
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m, "tensor '%.80s': %s", t->name, why);
		return;
	}
	note_push(t, s->rank, chunk, m, arrived_ns, started);
	if (aps_round_chunk_complete(&t->round, chunk))
		aps_finish_chunk(srv, s->job, t, chunk, arrived_ns);
	else
		aps_outbox_again(srv, s->job, t, chunk);
}

/* Global mode: a rank's exponents for a batch of tensors; the max of every tensor
 * whose exchange this completes goes to every rank in one SCALES. */
void aps_handle_exponents(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	struct aps_job *job = s->job;
	struct aps_msg r, again;

	aps_outbox_init(&r, APS_MSG_SCALES, job, 0);
	aps_outbox_init(&again, APS_MSG_SCALES, job, s->rank);
	for (uint32_t i = 0; i < m->n_tensor_ids; i++) {
		struct aps_tensor *t = aps_job_tensor(job, m->tensor_ids[i]);
		int32_t max;
		if (t != NULL && t->registered[s->rank] && aps_resend_exponent(srv, s, t, &again))
			continue;
		int ret = t == NULL || !t->registered[s->rank]
		                  ? APS_EINVAL
		                  : aps_tensor_add_exponent(job, t, s->rank, m->exponents[i], &max);
		if (ret < 0) {
			srv->counters.bad_state++;
			aps_outbox_error(srv, &s->peer, APS_EPROTO, m,
			                 "exponent for tensor id %u: %s", m->tensor_ids[i],
			                 t == NULL ? "not registered"
			                           : "this rank already sent one");
			continue;
		}
		if (ret == 0)
			continue;
		r.tensor_ids[r.n_tensor_ids] = m->tensor_ids[i];
		r.exponents[r.n_tensor_ids++] = max;
	}
	aps_outbox_scales(srv, job, &r);
	again.n_exponents = again.n_tensor_ids;
	if (again.n_tensor_ids > 0)
		aps_outbox_send(srv, &s->peer, &again, NULL);
}

void aps_handle_barrier(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	struct aps_job *job = s->job;

	if (aps_resend_barrier(srv, s, m))
		return;
	if (s->steps_due) { /* back in an elastic job: told its steps, then barrier steps_barrier */
		srv->counters.bad_state++;
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m,
		                 "barrier %llu: this rank has not had the answer to barrier %llu "
		                 "yet (apsd still tells it its tensors' steps)",
		                 (unsigned long long)m->step, (unsigned long long)s->steps_barrier);
		return;
	}
	if (m->step != job->barrier_step || job->barrier_has[s->rank]) {
		srv->counters.bad_state++;
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m,
		                 "barrier %llu: the job is at barrier %llu%s",
		                 (unsigned long long)m->step, (unsigned long long)job->barrier_step,
		                 job->barrier_has[s->rank] ? " and this rank is in it" : "");
		return;
	}
	job->barrier_has[s->rank] = true;
	job->barrier_arrived++;
	aps_finish_barrier(srv, job);
}

/*
 * A waiting rank's heartbeat: answered with the ranks its wait depends on,
 * unless replies already wait for its pipe: then the answer would only pile up
 * behind them (a client of 1.11 or older asks about every call in flight each
 * second: 20000 calls' answers passed the bridge's 4096 a peer and dropped an
 * honest rank as a slow reader, 2026-12-08). Its next heartbeat asks again.
 */
void aps_handle_heartbeat(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	struct aps_job *job = s->job;
	struct aps_tensor *t = aps_job_tensor(job, m->tensor_id);
	struct aps_msg r;

	aps_outbox_init(&r, APS_MSG_HEARTBEAT, job, s->rank);
	if (m->flags & APS_MSG_FLAG_ALIVE) {
		r.flags = APS_MSG_FLAG_ALIVE; /* about no call: the client hears apsd lives */
		aps_outbox_send(srv, &s->peer, &r, NULL);
		return;
	}
	if (aps_outbox_backed_up(srv, s))
		return;
	r.tensor_id = m->tensor_id;
	r.step = m->step;
	if (strcmp(m->tensor_name, "@barrier") == 0) {
		/* named as it was asked: a client finds its barrier by the name */
		snprintf(r.tensor_name, sizeof(r.tensor_name), "@barrier");
		for (uint32_t i = 0; i < job->world_size && r.n_waiting_for < APS_MSG_LIST_MAX;
		     i++) {
			if (!job->barrier_has[i])
				r.waiting_for[r.n_waiting_for++] = i;
		}
	} else if (t != NULL && t->round.step == m->step) {
		size_t n = aps_round_missing(&t->round, r.waiting_for, APS_MSG_LIST_MAX);
		r.n_waiting_for = (uint32_t)(n < APS_MSG_LIST_MAX ? n : APS_MSG_LIST_MAX);
	}
	aps_outbox_send(srv, &s->peer, &r, NULL);
}

void aps_handle_bye(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	(void)m;
	aps_leave_left(srv, s, "it left the job");
	aps_jobs_drop_session(&srv->jobs, s);
}
