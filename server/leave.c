/*
 * A rank that leaves its job (BYE) or is lost (its connection closed and it
 * was not back within the grace, it went silent, a new client took its
 * rank). An elastic job goes on without it and finishes what no longer waits
 * for it; any other job's rounds in progress are aborted and every other rank
 * gets APS_EPEERLOST naming it. The last rank out ends the job.
 */
#include "server/leave.h"

#include "server/finish.h"
#include "server/optimize.h"
#include "server/outbox.h"
#include "server/server_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <malloc.h>
#include <stdio.h>

static void rank_gone(struct aps_server *srv, struct aps_session *s, bool lost, const char *why)
{
	struct aps_job *job = s->job;

	if (lost) {
		srv->counters.peers_lost++;
		aps_log_warn("server", "rank lost job=%s rank=%u reason=\"%s\"", job->name, s->rank,
		             why);
	} else {
		aps_log_debug("server", "rank left job=%s rank=%u", job->name, s->rank);
	}
	job->ranks[s->rank] = NULL;
	s->job = NULL;
	if (s->detached_ms == 0)
		aps_zbridge_admit(srv->bridge, s->conn, false); /* it may join again, in time */
	if (job->elastic && aps_job_connected(job) > 0) {
		/* The job goes on without it; rounds that waited for it finish now. */
		job->absent[s->rank] = true;
		aps_job_forget_rank(job, s->rank);
		aps_log_info("server", "job shrinks job=%s members=%u", job->name,
		             aps_job_members(job));
		aps_finish_recheck(srv, job);
		return;
	}
	if (job->departed[0] == '\0')
		snprintf(job->departed, sizeof(job->departed), "rank %u of job '%s' was lost (%s)",
		         s->rank, job->name, why);
	if (aps_job_busy(job)) {
		aps_job_abort_rounds(job);
		aps_outbox_error_job(srv, job, APS_EPEERLOST, job->departed);
	}
	if (aps_job_connected(job) == 0) {
		aps_log_info("server", "job ended job=%s rounds=%llu", job->name,
		             (unsigned long long)job->rounds_completed);
		aps_optimize_checkpoint(srv, job, "job ended", APS_SNAPSHOT_END);
		aps_leave_end_job(srv, job);
	}
}

/* At most one trim a second: a stranger ending tiny jobs by the thousand would
 * otherwise throw away the pages every running job's next step reuses. */
#define TRIM_EVERY_MS 1000

void aps_leave_trim(struct aps_server *srv)
{
	uint64_t now = uv_now(srv->loop);

	if (!srv->trim_due || (srv->trimmed_ms != 0 && now - srv->trimmed_ms < TRIM_EVERY_MS))
		return;
	srv->trim_due = false;
	srv->trimmed_ms = now;
	malloc_trim(0);
}

void aps_leave_end_job(struct aps_server *srv, struct aps_job *job)
{
	aps_jobs_remove(&srv->jobs, job);
	/* The job's buffers go back to the system, not only to the allocator: now,
	 * or at the tick a second after the last trim. */
	srv->trim_due = true;
	aps_leave_trim(srv);
}

void aps_leave_lost(struct aps_server *srv, struct aps_session *s, const char *why)
{
	rank_gone(srv, s, true, why);
}

void aps_leave_left(struct aps_server *srv, struct aps_session *s, const char *why)
{
	rank_gone(srv, s, false, why);
}

void aps_leave_evict(struct aps_server *srv, struct aps_session *s)
{
	aps_leave_lost(srv, s, "connection closed, and a new client took its rank");
	aps_jobs_drop_session(&srv->jobs, s);
}
