/*
 * Joining a job: the HELLO handler. A HELLO must first be let in (access.h:
 * its job token, its CURVE key's jobs, the jobs its address started). Then it
 * creates its job or must agree with it (world size, scaling, downlink,
 * policy, optimizer); a rank is taken by one session at a time. A session
 * waiting to reconnect (reconnect_grace_ms) gives its rank up to a new client,
 * and a job whose every session waits to reconnect is over when a new client
 * asks for one of their ranks (a new run). A job whose ranks have not all
 * joined within join_timeout_ms of its first HELLO ends, and frees its slot;
 * so does a job that cannot go on, join_timeout_ms after, whoever stays.
 */
#include "server/join.h"

#include "server/access.h"
#include "server/ckpt_load.h"
#include "server/ckpt_queue.h"
#include "server/leave.h"
#include "server/optimize.h"
#include "server/outbox.h"
#include "server/server_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>
#include <sys/random.h>

/* How often the ranks of a job whose checkpoint is read hear how far it is: well
 * under any timeout_ms a client would set. */
#define LOADING_TELL_MS 250

#define MISMATCH_LOG_MS 10000 /* a job's refusals for options: one line this often */

/* sum = lowp only works when every rank scales with one exponent. */
static bool lowp_needs_global(bool lowp, const struct aps_msg *m)
{
	return lowp && m->scaling != APS_MSG_SCALING_UNSET && m->scaling != (int)APS_SCALING_GLOBAL;
}

/* Chunks of a block-scaled job are a multiple of every block size (validate.c). */
#define BLOCK_ALIGN ((size_t)64)

/* The block size a HELLO asks for: APS_CODEC_BLOCK_DEFAULT when it names none. */
static uint32_t job_block(const struct aps_msg *m)
{
	return m->block_size != 0 ? m->block_size : APS_CODEC_BLOCK_DEFAULT;
}

/* The job's options as a HELLO states them; "" when they agree with the job. */
static bool options_differ(const struct aps_job *job, bool job_policy_auto, const struct aps_msg *m,
                           const char *spec, char *why, size_t len)
{
	const char *down = job->downlink_auto ? "" : job->downlink.name;

	if (lowp_needs_global(job->lowp, m))
		snprintf(why, len,
		         "this daemon sums in low precision (sum = lowp): job '%s' must use "
		         "scaling 'global', rank %u asks for '%s'",
		         job->name, m->rank, aps_scaling_name((enum aps_scaling)m->scaling));
	else if (job->world_size != m->world_size)
		snprintf(why, len, "rank %u said world_size %u, job '%s' has world size %u",
		         m->rank, m->world_size, job->name, job->world_size);
	else if (m->scaling != APS_MSG_SCALING_UNSET && (int)job->scaling != m->scaling)
		snprintf(why, len, "job '%s' uses scaling '%s', rank %u asks for '%s'", job->name,
		         aps_scaling_name(job->scaling), m->rank,
		         aps_scaling_name((enum aps_scaling)m->scaling));
	else if (job->scaling == APS_SCALING_BLOCK && m->scaling == (int)APS_SCALING_BLOCK &&
	         job->block != job_block(m))
		snprintf(why, len, "job '%s' scales blocks of %u elements, rank %u asks for %u",
		         job->name, job->block, m->rank, job_block(m));
	else if (job->no_crc != ((m->flags & APS_MSG_FLAG_NO_CRC) != 0))
		snprintf(why, len, "job '%s' sends payloads %s CRC32C, rank %u asks for them %s",
		         job->name, job->no_crc ? "without" : "with", m->rank,
		         job->no_crc ? "with" : "without");
	else if (job->policy.automatic !=
	         (job_policy_auto || (m->flags & APS_MSG_FLAG_POLICY_AUTO)))
		snprintf(why, len, "job '%s' has policy '%s', rank %u asks for the other",
		         job->name, job->policy.automatic ? "auto" : "off", m->rank);
	else if (m->format[0] != '\0' && strcmp(down, m->format) != 0)
		snprintf(why, len, "job '%s' uses downlink '%s', rank %u asks for '%s'", job->name,
		         down[0] ? down : "auto", m->rank, m->format);
	else if (strcmp(job->optim_spec, spec) != 0)
		snprintf(why, len, "job '%s' runs optimizer '%s', rank %u asks for '%s'", job->name,
		         job->optim_spec[0] ? job->optim_spec : "(none: all-reduce)", m->rank,
		         spec[0] ? spec : "(none: all-reduce)");
	else
		return false;
	return true;
}

static int create_job(struct aps_server *srv, const struct aps_session *s, const struct aps_msg *m,
                      const struct aps_optim_config *optim, struct aps_job **out)
{
	struct aps_job *job;
	int ret;

	if (srv->jobs.n_jobs >= srv->opts.max_jobs)
		return APS_ERANGE;
	ret = aps_jobs_create(&srv->jobs, m->job, m->world_size, &job);
	if (ret < 0)
		return ret;
	snprintf(job->token, sizeof(job->token), "%s", m->job_token);
	if (optim->kind != APS_OPTIM_NONE && aps_ckpt_owner_of(job->token, &job->ckpt_owner) < 0)
		aps_log_warn("checkpoint",
		             "no randomness: job=%s writes checkpoints anyone resumes", job->name);
	aps_access_origin(s->address, job->origin);
	if (s->user[0] != '\0')
		snprintf(job->ckpt_writer, sizeof(job->ckpt_writer), "key %s", s->user);
	else
		snprintf(job->ckpt_writer, sizeof(job->ckpt_writer), "%s", job->origin);
	ret = aps_jobs_share_held(&srv->jobs, job, job->origin,
	                          aps_access_origin_local(job->origin), &srv->held);
	if (ret < 0) {
		aps_jobs_remove(&srv->jobs, job);
		return ret;
	}
	job->created_ms = uv_now(srv->loop);
	job->lowp = srv->opts.lowp;
	job->no_crc = (m->flags & APS_MSG_FLAG_NO_CRC) != 0;
	job->elastic = srv->opts.elastic;
	job->policy = srv->opts.policy;
	job->policy.automatic |= (m->flags & APS_MSG_FLAG_POLICY_AUTO) != 0;
	job->chunk_elems = srv->opts.chunk_elems;
	job->scaling = m->scaling != APS_MSG_SCALING_UNSET ? (enum aps_scaling)m->scaling
	                                                   : srv->opts.scaling;
	if (job->scaling == APS_SCALING_BLOCK) {
		job->block = job_block(m);
		/* Chunks start on a block: a multiple of the largest block size. */
		job->chunk_elems = job->chunk_elems > BLOCK_ALIGN
		                           ? job->chunk_elems & ~(BLOCK_ALIGN - 1)
		                           : BLOCK_ALIGN;
	}
	job->downlink_auto = srv->default_downlink_auto;
	job->downlink = srv->default_downlink;
	if (m->format[0] != '\0') {
		job->downlink_auto = false;
		job->downlink = m->fmt;
	}
	srv->counters.jobs_started++;
	aps_log_info("server", "job started job=%s world_size=%u scaling=%s downlink=%s mode=%s%s",
	             job->name, job->world_size, aps_scaling_name(job->scaling),
	             job->downlink_auto ? "auto" : job->downlink.name,
	             optim->kind == APS_OPTIM_NONE ? "allreduce" : "optimize ", m->optimizer);
	aps_optimize_job_start(job, optim);
	*out = job;
	return 0;
}

static void refuse_hello(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m,
                         int code, const char *why)
{
	srv->counters.refused_hello++;
	aps_outbox_error(srv, &s->peer, code, m, "%s", why);
}

/*
 * Whether the job waits for the rank a refused HELLO would have been: it has
 * not filled (a rank never joined), nothing ended it, and the HELLO's rank is
 * not held (with another world size it may be past the job's ranks). A
 * stranger's HELLO to a job whose ranks are all there disturbs no one.
 */
static bool waits_for(const struct aps_job *job, const struct aps_msg *m)
{
	return !job->filled && job->departed[0] == '\0' &&
	       (m->rank >= job->world_size || job->ranks[m->rank] == NULL);
}

/*
 * A HELLO the job refuses for its world size or options while the job waits
 * for a rank: most likely that rank, launched wrong, and it will not come
 * right by itself. The ranks whose calls wait hear so now (APS_EMISMATCH)
 * instead of at their deadline, and the job cannot go on: its rounds are
 * dropped, and what its ranks send later (chunks of the failed calls still
 * on their way, calls made again, barriers) is answered with the same error,
 * as after a lost rank. Keeping the job would take those late chunks into a
 * fresh round and give the others a wrong mean. A job with no call in flight
 * is not touched: a correct rank may still come, and join_timeout_ms ends a
 * job that never fills.
 */
static uint32_t tell_waiting(struct aps_server *srv, struct aps_job *job, const char *why)
{
	char text[APS_MSG_TEXT_MAX + 1];
	uint32_t told = 0;

	if (!aps_job_busy(job)) /* no call in flight: no rank to look at one by one */
		return 0;
	snprintf(text, sizeof(text),
	         "%.136s: apsd refused that HELLO, and the job cannot go on (two launches "
	         "mixed, or one misconfigured?)",
	         why);
	for (uint32_t r = 0; r < job->world_size; r++) {
		struct aps_session *s = job->ranks[r];
		if (s == NULL || s->detached_ms != 0 || !aps_job_rank_waits(job, r))
			continue;
		aps_outbox_error_rank(srv, job, r, APS_EMISMATCH, text);
		told++;
	}
	if (told > 0) {
		snprintf(job->departed, sizeof(job->departed),
		         "a HELLO of job '%.40s' was refused (%.150s)", job->name, why);
		job->departed_code = APS_EMISMATCH;
		aps_job_abort_rounds(job);
	}
	return told;
}

/* One line per job and MISMATCH_LOG_MS for a rank that keeps trying (a launcher's
 * restarts), with how many were not logged; a refusal that failed calls, always. */
static void log_mismatch(struct aps_server *srv, struct aps_job *job, const struct aps_session *s,
                         const struct aps_msg *m, const char *why, uint32_t told)
{
	uint64_t now = uv_now(srv->loop);

	if (told == 0 && !aps_log_gate_open(&job->mismatch_log, now, MISMATCH_LOG_MS))
		return;
	aps_log_warn("server",
	             "refused a hello job=%s rank=%u world_size=%u job_world_size=%u address=%s "
	             "ranks_told=%u unlogged=%llu reason=\"%s\"",
	             job->name, m->rank, m->world_size, job->world_size, s->address, told,
	             (unsigned long long)aps_log_gate_pass(&job->mismatch_log, now), why);
}

static void refuse_mismatch(struct aps_server *srv, struct aps_job *job, struct aps_session *s,
                            const struct aps_msg *m, const char *why)
{
	uint32_t told = waits_for(job, m) ? tell_waiting(srv, job, why) : 0;

	log_mismatch(srv, job, s, m, why, told);
	refuse_hello(srv, s, m, APS_EMISMATCH, why);
}

/* Ends an abandoned job; the last rank out frees it. */
static void end_abandoned(struct aps_server *srv, struct aps_job *job)
{
	uint32_t left = aps_job_connected(job);

	for (uint32_t r = 0; left > 0 && r < job->world_size; r++) {
		if (job->ranks[r] == NULL)
			continue;
		left--;
		aps_leave_evict(srv, job->ranks[r]); /* frees job with the last */
	}
}

/* A second HELLO of a joined session: said again after a reconnect, its WELCOME
 * may be lost, and the answer is the same; as another rank or job it is refused. */
static void hello_again(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	if (s->rank == m->rank && strcmp(s->job->name, m->job) == 0) {
		srv->counters.resent++;
		aps_join_welcome(srv, s, 0);
		return;
	}
	refuse_hello(srv, s, m, APS_EPROTO, "this connection already joined a job");
}

/* Whether the job refuses m (and why): options that differ, or a rank it cannot take. */
static int job_refuses(struct aps_server *srv, struct aps_job *job, const struct aps_msg *m,
                       const char *spec, char *why, size_t len)
{
	if (options_differ(job, srv->opts.policy.automatic, m, spec, why, len))
		return APS_EMISMATCH;
	if (job->ranks[m->rank] != NULL && job->ranks[m->rank]->detached_ms != 0) {
		/* A new client for a rank whose connection closed: the old one is gone. */
		aps_leave_evict(srv, job->ranks[m->rank]);
		if (aps_jobs_find(&srv->jobs, m->job) != job)
			return 0; /* it was the last: the job ended, a new one starts */
	}
	if (job->departed[0] != '\0') {
		snprintf(why, len,
		         "job '%.40s' cannot go on (%.100s); it ends when its last rank leaves or "
		         "join_timeout_ms after: "
		         "use another job name, or wait",
		         m->job, job->departed);
		return APS_EBUSY;
	}
	if (job->ranks[m->rank] != NULL) {
		snprintf(why, len, "rank %u of job '%s' is held by a live session", m->rank,
		         m->job);
		return APS_EBUSY;
	}
	return 0;
}

/* What a new job refuses: lowp needs global scaling; there is a limit of jobs, and
 * of jobs one address started (access.h). */
static int new_job_refuses(struct aps_server *srv, const struct aps_session *s,
                           const struct aps_msg *m, char *why, size_t len)
{
	if (lowp_needs_global(srv->opts.lowp, m)) {
		snprintf(why, len,
		         "this daemon sums in low precision (sum = lowp): jobs "
		         "must use scaling 'global', rank %u asks for '%s'",
		         m->rank, aps_scaling_name((enum aps_scaling)m->scaling));
		return APS_EMISMATCH;
	}
	if (srv->jobs.n_jobs >= srv->opts.max_jobs) {
		snprintf(why, len, "cannot start job '%s': %u jobs is the limit", m->job,
		         srv->opts.max_jobs);
		return APS_ERANGE;
	}
	return aps_access_may_start(srv, s, m, why, len);
}

/* The HELLO's token (its client's choice), or one of apsd's for a client without. */
static int take_token(struct aps_session *s, const struct aps_msg *m)
{
	if (m->has_session) {
		memcpy(s->token, m->session, sizeof(s->token));
		return 0;
	}
	return getrandom(s->token, sizeof(s->token), 0) == (ssize_t)sizeof(s->token) ? 0 : APS_ESYS;
}

/* A job is filled once every rank has joined: from then on it has no deadline. */
static void joined(struct aps_server *srv, struct aps_job *job, struct aps_session *s)
{
	aps_zbridge_admit(srv->bridge, s->conn, true);
	if (!job->filled && aps_job_connected(job) == job->world_size)
		job->filled = true;
}

static void end_now(struct aps_server *srv, struct aps_job *job, int code, const char *text);

/*
 * Its checkpoint read (ckpt_load.h): the job takes it, and its ranks hear their
 * WELCOMEs now; or, refused, the job ends and they hear why. A job that ended
 * meanwhile is not looked at (another of its name has another read, or none).
 */
static void on_checkpoint_loaded(void *ctx, const struct aps_ckpt_load *l, const char *name,
                                 uint64_t bytes, int ret, struct aps_ckpt *ck, const char *path,
                                 const char *why)
{
	struct aps_server *srv = ctx;
	struct aps_job *job = aps_jobs_find(&srv->jobs, name);
	char text[APS_MSG_TEXT_MAX + 1];
	uint64_t now = uv_now(srv->loop);

	srv->ckpt_reading -= bytes; /* the job counts what it takes from here */
	if (job == NULL || job->loading != l)
		return;
	job->loading = NULL;
	if (srv->stopping) /* its ranks heard BYE; the file stays as it was */
		return;
	ret = aps_optimize_job_resume(srv, job, ret, ck, path, why, text, sizeof(text));
	if (ret == 0 && job->departed[0] != '\0') { /* a rank left during the read */
		ret = job->departed_code != 0 ? job->departed_code : APS_EPEERLOST;
		snprintf(text, sizeof(text), "%s", job->departed);
	}
	if (ret < 0) {
		srv->counters.refused_token += ret == APS_EACCES;
		srv->counters.refused_hello += aps_job_connected(job); /* each rank's HELLO */
		end_now(srv, job, ret, text);
		return;
	}
	job->created_ms = now; /* join_timeout_ms counts from here */
	for (uint32_t r = 0; r < job->world_size; r++) {
		struct aps_session *s = job->ranks[r];
		if (s == NULL || s->detached_ms != 0)
			continue;
		s->last_seen_ms = now; /* no keepalive was due before its WELCOME */
		aps_join_welcome(srv, s, 0);
	}
}

/* Reads job's checkpoint off the loop; meanwhile its ranks wait for their WELCOMEs,
 * and bytes (the file's) count against max_total_bytes until the read ends,
 * whether the job is still there or not (a stranger that started reads and left
 * took apsd to 1.4 GiB under a bound of 1 GiB). */
static int load_checkpoint(struct aps_server *srv, struct aps_job *job,
                           const struct aps_ckpt_want *want, uint64_t bytes, char *why, size_t len)
{
	int ret;

	srv->ckpt_reading += bytes; /* first: the read may end (fail) at once */
	ret = aps_ckpt_load_start(srv->loader, srv->opts.checkpoint_dir, job->name, want, bytes,
	                          on_checkpoint_loaded, srv, &job->loading);
	if (ret < 0) {
		srv->ckpt_reading -= bytes;
		snprintf(why, len, "job '%.64s': cannot start reading its checkpoint (%s)",
		         job->name, aps_strerror(ret));
		aps_log_error("checkpoint", "not resumed job=%s: %s", job->name, why);
		aps_jobs_remove(&srv->jobs, job);
		return ret;
	}
	return 0;
}

void aps_handle_hello(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	char why[APS_MSG_TEXT_MAX + 1], spec[APS_OPTIM_SPEC_MAX] = "";
	struct aps_optim_config optim;
	struct aps_ckpt_want want;
	struct aps_job *job;
	uint64_t resume_bytes = 0;
	int ret, resume = 0;

	if (s->job != NULL)
		return hello_again(srv, s, m);
	if (m->version_minor < APS_PROTO_VERSION_MINOR_JOIN) {
		snprintf(why, sizeof(why),
		         "this client speaks protocol %u.%u; apsd needs %d.%d (keepalives, session "
		         "tokens): use the libaps of apsd's release",
		         m->version_major, m->version_minor, APS_PROTO_VERSION_MAJOR,
		         APS_PROTO_VERSION_MINOR_JOIN);
		return refuse_hello(srv, s, m, APS_EPROTO, why);
	}
	if (!aps_access_let_in(srv, s, m))
		return;
	s->minor = m->version_minor;
	if (take_token(s, m) < 0)
		return refuse_hello(srv, s, m, APS_ESYS,
		                    "no randomness for a session token (getrandom failed)");
	if (aps_optimize_parse_hello(m, &optim, why, sizeof(why)) < 0)
		return refuse_hello(srv, s, m, APS_EINVAL, why);
	if (optim.kind != APS_OPTIM_NONE)
		aps_optim_describe(&optim, spec, sizeof(spec));
	if (optim.kind != APS_OPTIM_NONE && srv->opts.lowp)
		return refuse_hello(srv, s, m, APS_EMISMATCH,
		                    "this daemon sums in low precision (sum = lowp): optimize mode "
		                    "needs the fp32 sum");
	job = aps_jobs_find(&srv->jobs, m->job);
	if (job != NULL && m->rank < job->world_size && job->ranks[m->rank] != NULL &&
	    job->ranks[m->rank]->detached_ms != 0 && aps_access_abandoned(job)) {
		end_abandoned(srv, job);
		job = NULL;
	}
	ret = job != NULL ? job_refuses(srv, job, m, spec, why, sizeof(why)) : 0;
	if (ret == APS_EMISMATCH) /* before anything of the job changed */
		return refuse_mismatch(srv, job, s, m, why);
	job = aps_jobs_find(&srv->jobs, m->job); /* gone if its last rank was evicted */
	if (ret == 0 && job == NULL)
		ret = new_job_refuses(srv, s, m, why, sizeof(why));
	if (ret == 0 && job == NULL) { /* its checkpoint: another token's, or too large */
		char origin[APS_JOB_ORIGIN_LEN];
		aps_access_origin(s->address, origin);
		if (optim.kind != APS_OPTIM_NONE) /* a write's room leaves its files alone */
			aps_ckpt_queue_job_starts(srv->ckpt, m->job);
		resume = aps_optimize_resume_check(srv, m, origin, &optim, &want, &resume_bytes,
		                                   why, sizeof(why));
		srv->counters.refused_token += resume == APS_EACCES;
		ret = resume < 0 ? resume : 0;
	}
	if (ret == 0 && job == NULL && create_job(srv, s, m, &optim, &job) < 0) {
		ret = APS_ENOMEM;
		snprintf(why, sizeof(why), "out of memory");
	}
	if (ret == 0 && resume == 1)
		ret = load_checkpoint(srv, job, &want, resume_bytes, why, sizeof(why));
	if (ret < 0)
		return refuse_hello(srv, s, m, ret, why);
	s->job = job;
	s->rank = m->rank;
	job->ranks[m->rank] = s;
	joined(srv, job, s);
	aps_log_debug("server", "hello job=%s rank=%u", job->name, m->rank);
	aps_join_welcome(srv, s, 0);
}

/*
 * How far job's checkpoint read is, to s (NULL: each of its ranks connected): a
 * HEARTBEAT flagged ALIVE whose total_count is the file's KiB, chunk_offset
 * those read (0 while the read waits for its turn) and step the KiB of every
 * read apsd ran (they grow while the reads ahead of it go on). A client of
 * 1.11 takes either growing as progress. Older clients let it pass while they
 * wait for their WELCOME.
 */
static void tell_loading(struct aps_server *srv, struct aps_job *job, struct aps_session *s)
{
	uint64_t read = 0, bytes = 0, all = aps_ckpt_loader_read(srv->loader);
	uint32_t from = s != NULL ? s->rank : 0, to = s != NULL ? s->rank + 1 : job->world_size;
	struct aps_msg m;

	aps_ckpt_load_progress(job->loading, &read, &bytes);
	for (uint32_t r = from; r < to; r++) {
		struct aps_session *rank = job->ranks[r];
		if (rank == NULL || rank->detached_ms != 0)
			continue;
		aps_outbox_init(&m, APS_MSG_HEARTBEAT, job, r);
		m.flags = APS_MSG_FLAG_ALIVE;
		m.total_count = (bytes + 1023) / 1024;
		m.chunk_offset = read / 1024;
		m.step = all / 1024;
		aps_outbox_send(srv, &rank->peer, &m, NULL);
	}
}

void aps_join_welcome(struct aps_server *srv, struct aps_session *s, uint32_t flags)
{
	struct aps_job *job = s->job;
	struct aps_msg w;

	if (job->loading != NULL) /* on_checkpoint_loaded welcomes it; meanwhile, progress */
		return tell_loading(srv, job, s);

	aps_outbox_init(&w, APS_MSG_WELCOME, job, s->rank);
	w.step = job->barrier_step; /* the job's next barrier: a rank that is back joins it */
	w.scaling = (int)job->scaling;
	w.block_size = job->block;
	w.flags = flags;
	if (!job->downlink_auto)
		snprintf(w.format, sizeof(w.format), "%s", job->downlink.name);
	snprintf(w.optimizer, sizeof(w.optimizer), "%s", job->optim_spec);
	memcpy(w.session, s->token, sizeof(w.session));
	w.has_session = true;
	w.max_message_bytes = (uint64_t)srv->opts.max_message_bytes;
	w.keepalive_ms = (uint32_t)srv->opts.heartbeat_timeout_ms;
	aps_outbox_send(srv, &s->peer, &w, NULL);
}

/* "1, 2": the ranks of job that never joined. */
static void missing_ranks(const struct aps_job *job, char *buf, size_t len)
{
	size_t used = 0;

	buf[0] = '\0';
	for (uint32_t r = 0; r < job->world_size && used + 12 < len; r++) {
		if (job->ranks[r] == NULL)
			used += (size_t)snprintf(buf + used, len - used, "%s%u", used ? ", " : "",
			                         r);
	}
}

/* Ends job now: its ranks are told why (code, text), its slot is freed. */
static void end_now(struct aps_server *srv, struct aps_job *job, int code, const char *text)
{
	aps_outbox_error_job(srv, job, code, text);
	for (uint32_t r = 0; r < job->world_size; r++) {
		struct aps_session *s = job->ranks[r];
		if (s == NULL)
			continue;
		job->ranks[r] = NULL;
		s->job = NULL;
		if (s->detached_ms != 0) {
			aps_jobs_drop_session(&srv->jobs, s);
			continue;
		}
		aps_zbridge_admit(srv->bridge, s->conn, false);
	}
	aps_leave_end_job(srv, job);
}

/* A job whose ranks did not all arrive in time. */
static void expire(struct aps_server *srv, struct aps_job *job)
{
	char ranks[96], text[APS_MSG_TEXT_MAX + 1];

	missing_ranks(job, ranks, sizeof(ranks));
	snprintf(text, sizeof(text),
	         "job '%.64s' did not fill within join_timeout_ms = %llu: %s %s never joined",
	         job->name, (unsigned long long)srv->opts.join_timeout_ms,
	         strchr(ranks, ',') ? "ranks" : "rank", ranks);
	srv->counters.jobs_expired++;
	aps_log_warn("server", "job expired job=%s reason=\"%s\"", job->name, text);
	end_now(srv, job, APS_ETIMEDOUT, text);
}

/* A job that cannot go on (a rank lost, steps apart) ends when its last rank
 * leaves, or join_timeout_ms after, whoever stays: a stranger that joined a
 * job without a token must not hold it, charged to the address that started
 * it, by keeping its own rank alive. */
static void end_departed(struct aps_server *srv, struct aps_job *job)
{
	char text[APS_MSG_TEXT_MAX + 1];

	snprintf(text, sizeof(text), "%.190s; the job ended join_timeout_ms = %llu ms later",
	         job->departed, (unsigned long long)srv->opts.join_timeout_ms);
	srv->counters.jobs_expired++;
	aps_log_warn("server", "job ended job=%s rounds=%llu reason=\"%s\"", job->name,
	             (unsigned long long)job->rounds_completed, text);
	aps_optimize_checkpoint(srv, job, "job ended", APS_SNAPSHOT_END);
	end_now(srv, job, job->departed_code != 0 ? job->departed_code : APS_EPEERLOST, text);
}

void aps_join_tick(struct aps_server *srv, uint64_t now)
{
	struct aps_job *job = srv->jobs.jobs, *next;

	for (; job != NULL; job = next) {
		next = job->next;
		if (job->loading != NULL && now - job->loading_told_ms >= LOADING_TELL_MS) {
			job->loading_told_ms = now;
			tell_loading(srv, job, NULL);
		}
		if (!job->filled && job->loading == NULL &&
		    now - job->created_ms >= srv->opts.join_timeout_ms)
			expire(srv, job);
		else if (job->departed[0] != '\0' && job->departed_ms == 0)
			job->departed_ms = now;
		else if (job->departed_ms != 0 &&
		         now - job->departed_ms >= srv->opts.join_timeout_ms)
			end_departed(srv, job);
	}
}
