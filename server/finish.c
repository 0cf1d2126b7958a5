/*
 * What a round, an exponent exchange or a barrier sends once it is complete:
 * a chunk's result to every rank (and the precision policy's next format),
 * the SCALES of finished exchanges, the barrier's release. A push completes
 * a chunk (handlers.c); a rank that leaves an elastic job can complete all
 * three (leave.c).
 */
#include "server/finish.h"

#include "server/ckpt_copy.h"
#include "server/optimize.h"
#include "server/outbox.h"
#include "server/resend.h"
#include "server/server_impl.h"
#include "server/tally.h"

#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Sends one chunk's result to every rank: one header, one shared payload. */
static void fan_out(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                    uint64_t step, struct aps_round_result *res, enum aps_msg_type type,
                    const char *next_format)
{
	struct aps_msg r;

	aps_outbox_init(&r, type, job, 0);
	r.tensor_id = t->id;
	r.step = step;
	r.chunk_offset = res->offset;
	r.chunk_count = res->count;
	r.total_count = t->count;
	snprintf(r.format, sizeof(r.format), "%s", res->fmt.name);
	r.scale_exp = res->scale_exp;
	r.block_size = res->block;
	r.scaling = (int)job->scaling;
	r.flushed = res->stats.flushed;
	r.flags = res->lowp_sum ? APS_MSG_FLAG_LOWP_SUM : 0;
	if (job->no_crc)
		r.flags |= APS_MSG_FLAG_NO_CRC;
	if (type == APS_MSG_RESULT && job->optim.kind != APS_OPTIM_NONE)
		r.flags |= APS_MSG_FLAG_UPDATE; /* the payload is added to the weights */
	snprintf(r.next_format, sizeof(r.next_format), "%s", next_format);
	uint64_t t0 = srv->opts.trace != NULL ? aps_trace_now() : 0;
	uint8_t hdr[APS_SERVER_HEADER_MAX];
	size_t len;

	/* One header for every rank, with the CRC taken where the payload was encoded. */
	r.payload = res->payload->data;
	r.payload_len = res->payload->len;
	if (aps_msg_pack_with_crc(&r, res->crc, hdr, sizeof(hdr), &len) < 0)
		return;
	for (uint32_t rank = 0; rank < job->world_size; rank++) {
		struct aps_session *s = job->ranks[rank];
		if (s == NULL || job->absent[rank])
			continue;
		aps_outbox_send_packed(srv, s, t, hdr, len, res->payload);
		s->bytes_out += res->payload->len;
		t->stats.bytes_out += res->payload->len;
	}
	aps_resend_keep(srv, t, step, res, hdr, len);
	aps_trace_stage(srv->opts.trace, "send", t0,
	                &(struct aps_trace_at){ job->name, t->name, step,
	                                        (uint32_t)(res->offset / t->round.chunk_elems) });
}

/* What the stats socket shows of a finished chunk, and of a finished step. */
static void note_result(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                        const struct aps_round_result *res, uint64_t flushed)
{
	struct aps_tensor_stats *st = &t->stats;

	st->down_scale_exp = res->scale_exp;
	st->overflow += res->stats.overflow;
	if (!res->step_done)
		return;
	st->steps++;
	st->flushed_fraction = (double)flushed / ((double)t->count * job->world_size);
	st->rel_error = res->rel_error;
	aps_latency_add(&srv->latency, uv_hrtime() - st->step_started_ns);
}

/* After a step: the format of the next one, or "" when it stays. */
static const char *decide_format(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                                 uint64_t step)
{
	const char *before = t->policy.current.name;
	char from[APS_FORMAT_NAME_MAX];

	snprintf(from, sizeof(from), "%s", before);
	if (!aps_policy_observe(&job->policy, &t->policy, step, t->stats.flushed_fraction,
	                        t->stats.rel_error))
		return "";
	srv->counters.policy_switches++;
	aps_log_info("policy",
	             "switch job=%s tensor=%.80s step=%llu from=%s to=%s reason=%s "
	             "flushed=%.4f error=%.4f",
	             job->name, t->name, (unsigned long long)step + 1, from, t->policy.current.name,
	             t->policy.reason, t->stats.flushed_fraction, t->stats.rel_error);
	return t->policy.current.name;
}

/* What follows a chunk's result, wherever it was encoded (ret < 0: out of memory). */
static void chunk_done(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                       uint64_t arrived_ns, int ret, struct aps_round_result *res)
{
	if (ret < 0) {
		aps_round_abort(&t->round);
		aps_tensor_forget_answers(t);
		aps_outbox_error_job(srv, job, ret, "out of memory for a result");
		return;
	}
	bool broadcast = res->kind == APS_ROUND_BROADCAST;

	note_result(srv, job, t, res, res->flushed);
	fan_out(srv, job, t, res->step, res, broadcast ? APS_MSG_BROADCAST : APS_MSG_RESULT,
	        res->step_done && !broadcast && job->optim.kind == APS_OPTIM_NONE
	                ? decide_format(srv, job, t, res->step)
	                : "");
	aps_optimize_chunk_done(srv, job, t, res, broadcast);
	aps_sbuf_unref(res->payload);
	if (!res->step_done)
		return;
	job->rounds_completed++;
	srv->counters.rounds++;
	/* tail_us: from the arrival of the last push to the last RESULT handed to ZeroMQ */
	aps_log_debug("server", "round job=%s tensor=%.80s step=%llu chunks=%u tail_us=%.1f",
	              job->name, t->name, (unsigned long long)res->step, t->round.n_chunks,
	              (double)(uv_hrtime() - arrived_ns) / 1e3);
}

/* A chunk encoded on an engine thread. */
struct engine_finish {
	struct aps_server *srv;
	struct aps_job *job;
	struct aps_tensor *t;
	uint64_t arrived_ns;
};

static void on_engine_finish(void *ctx, int ret, struct aps_round_result *res, bool cancelled)
{
	struct engine_finish *f = ctx;

	if (!cancelled)
		chunk_done(f->srv, f->job, f->t, f->arrived_ns, ret, res);
	free(f);
}

/*
 * While the job's snapshot is copied its weights must not change: the chunk's
 * finish, which steps them, waits, newest first (a scan for one already
 * waiting cost the loop a step per deferred chunk: a chunk asked twice, by a
 * recheck, is finished once, the second finds it finished). Returns false when
 * it cannot wait (no memory): the copy is waited for, and the chunk finishes now.
 */
static bool defer(struct aps_job *job, struct aps_tensor *t, uint32_t chunk, uint64_t arrived_ns)
{
	struct aps_deferred_finish *d = malloc(sizeof(*d));

	if (d == NULL) {
		aps_ckpt_copy_wait(job->copying);
		return false;
	}
	*d = (struct aps_deferred_finish){ job->deferred, t, chunk, t->round.step, arrived_ns };
	job->deferred = d;
	return true;
}

void aps_finish_deferred(struct aps_server *srv, struct aps_job *job)
{
	struct aps_deferred_finish *d = job->deferred, *next, *oldest = NULL;

	job->deferred = NULL;         /* a finish may start another snapshot, and defer again */
	for (; d != NULL; d = next) { /* in the order they came */
		next = d->next;
		d->next = oldest;
		oldest = d;
	}
	for (d = oldest; d != NULL; d = next) {
		next = d->next;
		if (d->t->round.step == d->step && aps_round_chunk_complete(&d->t->round, d->chunk))
			aps_finish_chunk(srv, job, d->t, d->chunk, d->arrived_ns);
		free(d);
	}
}

/* arrived_ns: when the push that completed the chunk arrived (uv_hrtime). */
void aps_finish_chunk(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                      uint32_t chunk, uint64_t arrived_ns)
{
	const struct aps_format *down = job->downlink_auto ? NULL : &job->downlink;
	struct aps_round_result res;
	int ret;

	if (job->copying != NULL && defer(job, t, chunk, arrived_ns))
		return;
	if (aps_round_offloaded(&t->round)) {
		struct engine_finish *f = malloc(sizeof(*f));
		if (f != NULL) {
			*f = (struct engine_finish){ srv, job, t, arrived_ns };
			if (aps_round_finish_async(&t->round, chunk, down, job->scaling,
			                           on_engine_finish, f) == 0)
				return;
			free(f);
		}
	}
	ret = aps_round_finish_chunk(&t->round, chunk, down, job->scaling, &res);
	chunk_done(srv, job, t, arrived_ns, ret, &res);
}

/*
 * REGISTEREDs to a rank back that may wait in the bridge at once: its pipe
 * takes what it can, one batch more waits, and the next goes once that one has
 * left (at a tick). All at once, 6000 tensors' passed the bridge's 4096 a peer
 * and dropped the rank as a slow reader, at every comeback (helper-38,
 * 2026-12-08): its client had to reconnect and send its barrier again.
 */
#define STEPS_BATCH 512

static void send_barrier(struct aps_server *srv, struct aps_job *job, struct aps_session *s,
                         uint64_t step)
{
	struct aps_msg r;

	aps_outbox_init(&r, APS_MSG_BARRIER, job, s->rank);
	r.step = step;
	aps_outbox_send(srv, &s->peer, &r, NULL);
}

/* Tells s, back in an elastic job, the step of every tensor it registered, as far
 * as the bridge takes them; once all are out, the barrier that let it in. */
static void send_steps(struct aps_server *srv, struct aps_session *s)
{
	struct aps_job *job = s->job;
	struct aps_tally *tally = job->steps_unsent;

	while (s->steps_next < job->n_tensors) {
		if (tally != NULL && aps_tally_unsent(tally, s->rank) > 0)
			return; /* the last batch waits for its pipe: a tick goes on */
		for (uint32_t sent = 0; sent < STEPS_BATCH && s->steps_next < job->n_tensors;
		     s->steps_next++) {
			struct aps_tensor *t = job->tensors[s->steps_next];
			if (t->registered[s->rank]) {
				aps_outbox_registered(srv, job, s, t, tally);
				sent++;
			}
		}
	}
	s->steps_due = false;
	send_barrier(srv, job, s, s->steps_barrier);
}

static void start_steps(struct aps_server *srv, struct aps_job *job, struct aps_session *s,
                        uint64_t barrier)
{
	if (job->steps_unsent == NULL &&
	    (job->steps_unsent = aps_tally_new(job->world_size)) != NULL)
		job->overhead_bytes += aps_tally_size(job->world_size);
	s->steps_due = true;
	s->steps_next = 0;
	s->steps_barrier = barrier;
	aps_log_info("server", "rank back job=%s rank=%u members=%u tensors=%u", job->name, s->rank,
	             aps_job_members(job), job->n_tensors);
	send_steps(srv, s);
}

void aps_finish_steps_tick(struct aps_server *srv)
{
	for (struct aps_job *job = srv->jobs.jobs; job != NULL; job = job->next) {
		for (uint32_t r = 0; job->steps_unsent != NULL && r < job->world_size; r++) {
			struct aps_session *s = job->ranks[r];
			if (s != NULL && s->steps_due && s->detached_ms == 0) /* away: once back */
				send_steps(srv, s);
		}
	}
}

/*
 * A barrier is complete when every rank is in it; in an elastic job, every
 * connected rank (a lost one is not waited for). Ranks back in an elastic job
 * take part in its rounds from then on.
 */
void aps_finish_barrier(struct aps_server *srv, struct aps_job *job)
{
	if (job->barrier_arrived == 0)
		return;
	for (uint32_t rank = 0; rank < job->world_size; rank++) {
		bool waited = job->ranks[rank] != NULL || !job->absent[rank];
		if (waited && !job->barrier_has[rank])
			return;
	}
	for (uint32_t rank = 0; rank < job->world_size; rank++) {
		if (job->ranks[rank] == NULL)
			continue;
		/* A rank that is back learns its tensors' steps before the barrier returns. */
		if (job->absent[rank]) {
			job->absent[rank] = false;
			start_steps(srv, job, job->ranks[rank], job->barrier_step);
		} else {
			send_barrier(srv, job, job->ranks[rank], job->barrier_step);
		}
	}
	memset(job->barrier_has, 0, job->world_size * sizeof(*job->barrier_has));
	job->barrier_arrived = 0;
	job->barrier_step++;
	srv->counters.barriers++;
}

void aps_finish_recheck(struct aps_server *srv, struct aps_job *job)
{
	uint64_t now = uv_hrtime();
	struct aps_msg scales;

	aps_outbox_init(&scales, APS_MSG_SCALES, job, 0);
	for (uint32_t i = 0; i < job->n_tensors; i++) {
		struct aps_tensor *t = job->tensors[i];
		int32_t max;
		for (uint32_t c = 0; c < t->round.n_chunks && aps_round_busy(&t->round); c++) {
			if (aps_round_recheck(&t->round, c))
				aps_finish_chunk(srv, job, t, c, now);
			else
				aps_outbox_again(srv, job, t, c);
		}
		if (t->exp_arrived == 0 || aps_tensor_exponents_complete(job, t, &max) != 1)
			continue;
		if (scales.n_tensor_ids == APS_MSG_LIST_MAX) {
			aps_outbox_scales(srv, job, &scales);
			scales.n_tensor_ids = 0;
		}
		scales.tensor_ids[scales.n_tensor_ids] = t->id;
		scales.exponents[scales.n_tensor_ids++] = max;
	}
	aps_outbox_scales(srv, job, &scales);
	aps_finish_barrier(srv, job);
}
