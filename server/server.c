/*
 * The daemon's spine: creates the bridge, turns each received message into a
 * checked struct aps_msg (proto/validate.c is the only gate), finds the
 * sender's session and hands the message to its handler (handlers.c, join.c
 * for HELLO, optimize.c for PULL), and runs the clock that checks graces,
 * silences (reconnect.c) and job deadlines (join.c). Sending is outbox.c's,
 * what a rank's loss does leave.c's.
 */
#include "server/finish.h"
#include "server/handlers.h"
#include "server/join.h"
#include "server/leave.h"
#include "server/optimize.h"
#include "server/outbox.h"
#include "server/reconnect.h"
#include "server/server_impl.h"

#include "server/resend.h"

#include "common/err.h"
#include "common/log.h"

#include <malloc.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TICK_MS  50   /* how often graces, silences and job deadlines are checked */
#define STALL_MS 1000 /* a tick this late: the loop was held up */

static uint64_t now_ms(const struct aps_server *srv)
{
	return uv_now(srv->loop) > 0 ? uv_now(srv->loop) : 1;
}

/* A collective call of a job that lost a rank: it could only time out. */
static bool job_incomplete(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	switch (m->type) {
	case APS_MSG_PUSH:
	case APS_MSG_BROADCAST:
	case APS_MSG_BARRIER:
	case APS_MSG_EXPONENTS:
		break;
	default:
		return false;
	}
	if (s->job == NULL)
		return false;
	if (s->job->absent[s->rank] && m->type != APS_MSG_BARRIER) {
		srv->counters.bad_state++;
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m,
		                 "rank %u is back in job '%s': it takes part from the job's "
		                 "next barrier on (call barrier first)",
		                 s->rank, s->job->name);
		return true;
	}
	if (s->job->departed[0] == '\0' || aps_resend_answerable(s, m))
		return false;
	srv->counters.refused_incomplete++;
	aps_outbox_error(srv, &s->peer,
	                 s->job->departed_code != 0 ? s->job->departed_code : APS_EPEERLOST, m,
	                 "%s", s->job->departed);
	return true;
}

/*
 * A message from a session's routing id on another connection. A client's
 * routing id is its socket's, one connection long, so this is a late message
 * of the session's old connection, counted on the new one because its
 * descriptor number was reused by then (ZMQ_SRCFD names a number, not a
 * connection), or a stranger who knows the id. Either way it is dropped: the
 * client sends its calls again once its session is back.
 */
static void stale(struct aps_server *srv)
{
	srv->counters.stale_messages++;
}

/* Only a joined session may send anything but HELLO, only as itself, and before
 * its WELCOME (its job's checkpoint being read) only HEARTBEAT and BYE. */
static bool session_may_send(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m,
                             const struct aps_peer *peer)
{
	if (m->type == APS_MSG_HELLO)
		return true;
	if (s != NULL && s->job != NULL && s->rank == m->rank &&
	    strcmp(s->job->name, m->job) == 0) {
		if (s->job->loading == NULL || m->type == APS_MSG_BYE ||
		    m->type == APS_MSG_HEARTBEAT)
			return true;
		srv->counters.bad_state++;
		aps_outbox_error(srv, peer, APS_EPROTO, m,
		                 "%s before the WELCOME: job '%s' is reading its checkpoint",
		                 aps_msg_type_name(m->type), s->job->name);
		return false;
	}
	srv->counters.bad_session++;
	if (s == NULL || s->job == NULL)
		aps_outbox_error(srv, peer, APS_ENOSESSION, m,
		                 "%s from a connection that has not joined (apsd restarted, or "
		                 "no HELLO): rank %u of job '%s' must join again",
		                 aps_msg_type_name(m->type), m->rank, m->job);
	else
		aps_outbox_error(srv, peer, APS_EPROTO, m,
		                 "%s as rank %u of job '%s' from rank %u of job '%s'",
		                 aps_msg_type_name(m->type), m->rank, m->job, s->rank,
		                 s->job->name);
	return false;
}

static void dispatch(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m,
                     struct aps_inmsg *in)
{
	switch (m->type) {
	case APS_MSG_HELLO:
		aps_handle_hello(srv, s, m);
		break;
	case APS_MSG_REGISTER:
		aps_handle_register(srv, s, m);
		break;
	case APS_MSG_PUSH:
	case APS_MSG_BROADCAST:
		aps_handle_push(srv, s, m, in);
		break;
	case APS_MSG_BARRIER:
		aps_handle_barrier(srv, s, m);
		break;
	case APS_MSG_EXPONENTS:
		aps_handle_exponents(srv, s, m);
		break;
	case APS_MSG_HEARTBEAT:
		aps_handle_heartbeat(srv, s, m);
		break;
	case APS_MSG_BYE:
		aps_handle_bye(srv, s, m);
		break;
	case APS_MSG_PULL:
		aps_handle_pull(srv, s, m);
		break;
	default:
		aps_outbox_error(srv, &s->peer, APS_EPROTO, m, "%s is not served yet",
		                 aps_msg_type_name(m->type));
		break;
	}
}

static void on_message(void *ctx, struct aps_inmsg *in)
{
	struct aps_server *srv = ctx;
	struct aps_msg_fault fault;
	struct aps_session *s;
	struct aps_msg m;

	if (in->nframes > 2) {
		srv->counters.bad_frames++;
		aps_outbox_error(srv, &in->peer, APS_EPROTO, NULL,
		                 "message has %zu frames, at most 2 (header, payload)",
		                 in->nframes);
		return;
	}
	uint64_t t0 = srv->opts.trace != NULL ? aps_trace_now() : 0;

	if (aps_msg_parse(&srv->limits, in->hdr, in->hdr_len, in->payload, in->payload_len,
	                  in->payload != NULL, &m, &fault) < 0) {
		srv->counters.faults[fault.kind]++;
		aps_outbox_error(srv, &in->peer, APS_EPROTO, NULL, "%s", fault.text);
		return;
	}
	aps_trace_stage(srv->opts.trace, "receive", t0,
	                &(struct aps_trace_at){ m.job, aps_msg_type_name(m.type), m.step,
	                                        (uint32_t)m.tensor_id });
	if (m.type == APS_MSG_HELLO && aps_reconnect_hello(srv, in, &m))
		return; /* a session taken back by its token, from any connection */
	s = aps_jobs_find_session(&srv->jobs, &in->peer);
	if (s != NULL && s->msgs_in > 0 && in->conn != s->conn)
		return stale(srv); /* its routing id proves nothing */
	if (s != NULL && s->job != NULL && s->detached_ms != 0)
		return stale(srv); /* a late message of its closed connection */
	if (s == NULL && m.type != APS_MSG_HELLO && aps_reconnect_moved_from(srv, &in->peer))
		return stale(srv); /* a late message of a connection the session left */
	if (!session_may_send(srv, s, &m, &in->peer))
		return;
	if (s == NULL && (s = aps_jobs_session(&srv->jobs, &in->peer)) == NULL) {
		aps_outbox_error(srv, &in->peer, APS_ENOMEM, &m, "out of memory");
		return;
	}
	if (s->msgs_in == 0) {
		/* A session is one client: its routing id, on its first connection. */
		s->conn = in->conn;
		s->joined_ms = now_ms(srv);
		snprintf(s->address, sizeof(s->address), "%s", in->address);
		snprintf(s->user, sizeof(s->user), "%s", in->user);
	}
	s->last_seen_ms = now_ms(srv);
	s->msgs_in++;
	s->bytes_in += in->hdr_len + in->payload_len;
	if (!job_incomplete(srv, s, &m))
		dispatch(srv, s, &m, in);
}

static void on_disconnect(void *ctx, uint64_t conn)
{
	struct aps_server *srv = ctx;
	struct aps_session *s = srv->jobs.sessions, *next;

	for (; s != NULL; s = next) {
		next = s->next;
		if (s->conn != conn || s->detached_ms != 0)
			continue;
		if (s->job != NULL && srv->opts.reconnect_grace_ms > 0 && !srv->stopping) {
			aps_reconnect_detach(srv, s, "connection closed");
			continue;
		}
		if (s->job != NULL)
			aps_leave_lost(srv, s, "connection closed");
		aps_jobs_drop_session(&srv->jobs, s);
	}
}

static void on_tick(uv_timer_t *timer)
{
	struct aps_server *srv = timer->data;
	uint64_t now = now_ms(srv), last = srv->last_tick_ms;

	srv->last_tick_ms = now;
	/* The loop was held up (a long step, a trim): what waits to be read is not
	 * silence, and a rank whose connection closed could not be taken back
	 * meanwhile. The time held up is not counted against anyone: before, a
	 * stall of 9.7 s ended every rank of every job ("connection silent for
	 * 9724 ms", an attack on the metrics endpoint, 2026-12-07). */
	if (last != 0 && now - last > STALL_MS) {
		uint64_t held = now - last - TICK_MS;
		for (struct aps_session *s = srv->jobs.sessions; s != NULL; s = s->next) {
			s->last_seen_ms =
			        s->last_seen_ms + held < now ? s->last_seen_ms + held : now;
			if (s->detached_ms != 0)
				s->detached_ms =
				        s->detached_ms + held < now ? s->detached_ms + held : now;
		}
		aps_log_warn("server", "the loop was held up for %llu ms: not counted as silence",
		             (unsigned long long)(now - last));
	}
	aps_reconnect_tick(srv, now);
	aps_finish_steps_tick(srv);
	aps_leave_trim(srv);
	aps_join_tick(srv, now);
	aps_trace_flush_due(srv->opts.trace);
}

static int init_downlink(struct aps_server *srv)
{
	const char *d = srv->opts.downlink;

	srv->default_downlink_auto = d == NULL || strcmp(d, "auto") == 0;
	if (srv->default_downlink_auto)
		return 0;
	return aps_format_parse(d, &srv->default_downlink) < 0 ? APS_ECONFIG : 0;
}

/* The jobs the daemon has: their checkpoint files are not removed to make room. */
static int live_jobs(void *ctx, char ***names, size_t *n)
{
	struct aps_server *srv = ctx;
	size_t i = 0;

	*names = calloc(srv->jobs.n_jobs + 1, sizeof(**names));
	*n = 0;
	if (*names == NULL)
		return APS_ENOMEM;
	for (const struct aps_job *job = srv->jobs.jobs; job != NULL; job = job->next) {
		if (((*names)[i] = strdup(job->name)) == NULL)
			return APS_ENOMEM;
		*n = ++i;
	}
	return 0;
}

/* The files a write removed to make room, one line each (the first few). */
static void log_evicted(struct aps_server *srv, const struct aps_ckpt *ck,
                        const struct aps_ckpt_room *room)
{
	uint32_t shown =
	        room->n_evicted < APS_CKPT_ROOM_SHOWN ? room->n_evicted : APS_CKPT_ROOM_SHOWN;

	srv->counters.checkpoints_evicted += room->n_evicted;
	for (uint32_t i = 0; i < shown; i++) {
		const struct aps_ckpt_evicted *e = &room->shown[i];
		aps_log_warn("checkpoint",
		             "evicted job=%s step=%llu bytes=%llu writer=\"%s\" for=%s "
		             "reason=\"checkpoint_max_bytes: the files of ended jobs, the "
		             "largest writer's oldest first\"",
		             e->job[0] != '\0' ? e->job : "(unreadable)",
		             (unsigned long long)e->step, (unsigned long long)e->bytes, e->writer,
		             ck->job);
	}
	if (room->n_evicted > shown)
		aps_log_warn(
		        "checkpoint", "evicted files=%u bytes=%llu for=%s (lines for %u of them)",
		        room->n_evicted, (unsigned long long)room->evicted_bytes, ck->job, shown);
}

static void on_checkpoint(void *ctx, const struct aps_ckpt *ck, int ret, const char *why,
                          const struct aps_ckpt_room *room, double seconds)
{
	struct aps_server *srv = ctx;
	struct aps_job *job;

	if (room != NULL)
		log_evicted(srv, ck, room);

	if (ret < 0) {
		srv->counters.checkpoint_failures++;
		aps_log_error("checkpoint", "failed job=%s step=%llu reason=\"%s\"", ck->job,
		              (unsigned long long)ck->step, why);
		if ((job = aps_jobs_find(&srv->jobs, ck->job)) != NULL)
			job->unsaved = true; /* its next chance writes it */
		return;
	}
	srv->counters.checkpoints++;
	aps_log_info("checkpoint", "written job=%s step=%llu tensors=%u seconds=%.3f", ck->job,
	             (unsigned long long)ck->step, ck->n_tensors, seconds);
}

/* A job's snapshot was copied (optimize.c): it is queued for its write, and its
 * finishes that waited for the copy run now. */
static void on_snapshot_copied(void *ctx, const struct aps_ckpt_copy *c, struct aps_ckpt *ck,
                               int ret)
{
	struct aps_server *srv = ctx;
	struct aps_job *job = aps_jobs_find(&srv->jobs, ck->job);

	if (ret < 0) {
		srv->counters.checkpoint_failures++;
		aps_log_error("checkpoint", "out of memory for a snapshot job=%s", ck->job);
		aps_ckpt_free(ck);
		free(ck);
	} else {
		aps_ckpt_queue_push(srv->ckpt, ck);
	}
	if (job == NULL || job->copying != c)
		return; /* it ended meanwhile (and waited for the copy) */
	job->copying = NULL;
	job->unsaved |= ret < 0;
	if (!srv->stopping) /* stopping: no bridge to send results on, its ranks heard BYE */
		aps_finish_deferred(srv, job);
}

int aps_server_new(struct aps_server **out, uv_loop_t *loop, const struct aps_server_opts *o)
{
	static const struct aps_zbridge_ops ops = { on_message, on_disconnect };
	struct aps_zbridge_opts zo = {
		.endpoint = o->endpoint,
		.max_message_bytes = o->max_message_bytes,
		.drain_batch = o->drain_batch,
		.io_threads = o->io_threads,
		.max_connections = o->max_connections,
		.max_connections_per_address = o->max_connections_per_address,
		.join_timeout_ms = o->join_timeout_ms,
		.max_silent_closes = o->max_silent_closes,
		.curve_secret = o->curve_secret,
		.curve_allow = o->curve_allow,
		.n_curve_allow = o->n_curve_allow,
		.allow_from = o->allow_from,
	};
	struct aps_server *srv = calloc(1, sizeof(*srv));
	int ret;

	if (srv == NULL)
		return APS_ENOMEM;
	srv->loop = loop;
	srv->opts = *o;
	srv->started_ms = uv_now(loop);
	aps_msg_limits_init(&srv->limits);
	srv->limits.max_ranks = o->max_ranks;
	srv->limits.max_tensors = o->max_tensors;
	srv->held.limit = o->max_held_bytes;
	srv->held.drop_step = aps_handle_drop_held_step;
	srv->held.ctx = srv;
	srv->snapshot_copied = on_snapshot_copied;
	ret = init_downlink(srv);
	if (ret == 0 && o->checkpoint_dir != NULL && o->checkpoint_dir[0] != '\0')
		ret = aps_ckpt_queue_new(&srv->ckpt, loop, o->checkpoint_dir, o->checkpoint_keep,
		                         o->checkpoint_max_bytes, live_jobs, on_checkpoint, srv);
	if (ret == 0 && srv->ckpt != NULL)
		ret = aps_ckpt_loader_new(&srv->loader, loop);
	srv->tick_timer = ret == 0 ? malloc(sizeof(*srv->tick_timer)) : NULL;
	if (ret == 0 && srv->tick_timer == NULL)
		ret = APS_ENOMEM;
	if (ret == 0 && o->threads > 1 &&
	    (ret = aps_engine_new(&srv->engine, loop, o->threads)) == APS_ESYS) {
		aps_log_warn("apsd",
		             "threads=%u: a thread could not start (RLIMIT_NPROC?): "
		             "the event loop sums, as threads=1",
		             o->threads);
		ret = 0;
	}
	if (ret == 0)
		ret = aps_zbridge_new(&srv->bridge, loop, &zo, &ops, srv);
	if (ret < 0) {
		aps_engine_close(srv->engine);
		aps_engine_free(srv->engine);
		free(srv->tick_timer);
		aps_ckpt_queue_free(srv->ckpt);
		aps_ckpt_loader_free(srv->loader);
		free(srv);
		return ret;
	}
	uv_timer_init(loop, srv->tick_timer);
	srv->tick_timer->data = srv;
	uv_timer_start(srv->tick_timer, on_tick, TICK_MS, TICK_MS);
	*out = srv;
	return 0;
}

static void free_handle_cb(uv_handle_t *h)
{
	free(h);
}

void aps_server_stop(struct aps_server *srv)
{
	struct aps_msg bye;

	if (srv->stopping)
		return;
	srv->stopping = true;
	for (struct aps_job *job = srv->jobs.jobs; job != NULL; job = job->next)
		aps_optimize_checkpoint(srv, job, "stopping", APS_SNAPSHOT_STOP);
	for (struct aps_session *s = srv->jobs.sessions; s != NULL; s = s->next) {
		if (s->job == NULL)
			continue;
		aps_msg_init(&bye, APS_MSG_BYE);
		snprintf(bye.job, sizeof(bye.job), "%s", s->job->name);
		bye.rank = s->rank;
		bye.world_size = s->job->world_size;
		aps_outbox_send(srv, &s->peer, &bye, NULL);
	}
	srv->bridge_counters = *aps_zbridge_counters(srv->bridge);
	aps_zbridge_free(srv->bridge, 1000);
	srv->bridge = NULL;
	/* Its own memory: the handle may close after the server is freed. */
	uv_close((uv_handle_t *)srv->tick_timer, free_handle_cb);
	srv->tick_timer = NULL;
	aps_engine_close(srv->engine);
}

const char *aps_server_endpoint(const struct aps_server *srv)
{
	return aps_zbridge_endpoint(srv->bridge);
}

void aps_server_free(struct aps_server *srv)
{
	if (srv == NULL)
		return;
	aps_server_stop(srv);
	aps_jobs_free_all(&srv->jobs);
	aps_engine_free(srv->engine); /* after the jobs: their rounds quiesce it */
	aps_ckpt_queue_free(srv->ckpt);
	aps_ckpt_loader_free(srv->loader);
	free(srv);
}

const struct aps_server_counters *aps_server_counters(const struct aps_server *srv)
{
	return &srv->counters;
}

/* Appends " name=value" to line while it fits. */
static void add_count(char *line, size_t cap, size_t *used, const char *name, uint64_t value)
{
	int n;

	if (*used >= cap)
		return;
	n = snprintf(line + *used, cap - *used, " %s=%llu", name, (unsigned long long)value);
	*used = n < 0 ? cap : *used + (size_t)n;
}

void aps_server_log_counters(const struct aps_server *srv)
{
	const struct aps_server_counters *c = &srv->counters;
	const struct aps_zbridge_counters *z = &srv->bridge_counters;
	struct aps_engine_counters e;
	char line[4096] = "";
	size_t used = 0;

#define APS_SERVER_COUNTER_PRINT(name, text) add_count(line, sizeof(line), &used, #name, c->name);
	APS_SERVER_COUNTER_MAP(APS_SERVER_COUNTER_PRINT)
#undef APS_SERVER_COUNTER_PRINT
#define APS_MSG_FAULT_PRINT(name, stat, text) \
	add_count(line, sizeof(line), &used, stat, c->faults[APS_MSG_FAULT_##name]);
	APS_MSG_FAULT_MAP(APS_MSG_FAULT_PRINT)
#undef APS_MSG_FAULT_PRINT
#define APS_BRIDGE_PRINT(name, metric, help) add_count(line, sizeof(line), &used, #name, z->name);
	APS_ZBRIDGE_COUNTER_MAP(APS_BRIDGE_PRINT)
#undef APS_BRIDGE_PRINT
	aps_engine_counters(srv->engine, &e);
	add_count(line, sizeof(line), &used, "engine_threads", e.threads);
	add_count(line, sizeof(line), &used, "engine_tasks", e.tasks);
	add_count(line, sizeof(line), &used, "engine_busy_ms", e.busy_ns / 1000000);
	aps_log_info("server", "counters%s", line);
}
