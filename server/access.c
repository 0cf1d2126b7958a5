/*
 * Who may join a job, or start one: a job's first HELLO fixes its job token
 * and every later one must carry the same (else APS_EACCES, and the job is not
 * touched); with CURVE, the key's allowlist line may name the jobs it may join;
 * and one address starts at most max_jobs_per_address jobs that run at once,
 * so that a stranger's HELLOs to new names do not fill max_jobs for the others.
 */
#include "server/access.h"

#include "server/addrs.h"
#include "server/admission.h"
#include "server/outbox.h"
#include "server/server_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

#define REFUSAL_LOG_MS 1000 /* refusals for a token or key: one line this often */

/* Whom a job is charged to (max_jobs_per_address): an IPv4 address as it is, an
 * IPv6 one's /64 (a host may pick any address of its /64), and for ipc, whose
 * Peer-Address is "localhost:UID:GID:PID", the user (every process of a user
 * is one origin). */
void aps_access_origin(const char *address, char out[APS_JOB_ORIGIN_LEN])
{
	static const char ipc[] = "localhost:";

	if (strncmp(address, ipc, sizeof(ipc) - 1) == 0) {
		const char *uid = address + sizeof(ipc) - 1;
		snprintf(out, APS_JOB_ORIGIN_LEN, "ipc uid %.*s", (int)strcspn(uid, ":"), uid);
	} else if (address[0] == '\0' || strlen(address) >= INET6_ADDRSTRLEN) {
		snprintf(out, APS_JOB_ORIGIN_LEN, "%s", address[0] != '\0' ? address : "unknown");
	} else {
		aps_addrs_origin(address, out);
	}
}

bool aps_access_origin_local(const char *origin)
{
	return aps_admission_exempt(origin) || strncmp(origin, "ipc uid ", 8) == 0;
}

static uint32_t jobs_started_from(const struct aps_server *srv, const char *origin)
{
	uint32_t n = 0;

	for (const struct aps_job *job = srv->jobs.jobs; job != NULL; job = job->next)
		n += strcmp(job->origin, origin) == 0;
	return n;
}

int aps_access_may_start(struct aps_server *srv, const struct aps_session *s,
                         const struct aps_msg *m, char *why, size_t len)
{
	char origin[APS_JOB_ORIGIN_LEN];
	uint32_t mine;

	if (srv->opts.max_jobs_per_address == 0)
		return 0;
	aps_access_origin(s->address, origin);
	mine = jobs_started_from(srv, origin);
	if (mine < srv->opts.max_jobs_per_address)
		return 0;
	srv->counters.refused_address_jobs++;
	snprintf(why, len,
	         "cannot start job '%s': %s already started %u jobs that run, the limit of one "
	         "address (max_jobs_per_address)",
	         m->job, origin, mine);
	return APS_ERANGE;
}

/*
 * Every session of the job waits to reconnect, and a new client asks for the
 * rank of one of them: that one's process is gone, and with it (most likely)
 * the whole run, as when every rank was killed and the job started again.
 * (Sessions that wait while a HELLO asks for a free rank may be one blip's.)
 */
bool aps_access_abandoned(const struct aps_job *job)
{
	for (uint32_t r = 0; r < job->world_size; r++) {
		if (job->ranks[r] != NULL && job->ranks[r]->detached_ms == 0)
			return false;
	}
	return true;
}

/* An abandoned job's name is free when the last of its ranks' graces ends (and the
 * tick that sees it: server.c's TICK_MS, 50 ms). */
static uint32_t frees_in_ms(const struct aps_server *srv, const struct aps_job *job)
{
	uint64_t now = uv_now(srv->loop), last = 0;

	for (uint32_t r = 0; r < job->world_size; r++) {
		const struct aps_session *s = job->ranks[r];
		if (s != NULL && s->detached_ms + (uint64_t)srv->opts.reconnect_grace_ms > last)
			last = s->detached_ms + (uint64_t)srv->opts.reconnect_grace_ms;
	}
	return (uint32_t)(last > now ? last - now : 0) + 100;
}

/* Tokens of any length, compared in time that does not depend on where they differ. */
static bool same_token(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned diff = la != lb;

	for (size_t i = 0; i < APS_MSG_TOKEN_MAX; i++)
		diff |= (unsigned)(i < la ? a[i] : 0) ^ (unsigned)(i < lb ? b[i] : 0);
	return diff == 0;
}

/* The jobs a CURVE key may join, from its allowlist line ("" any). */
static const char *key_jobs(const struct aps_server *srv, const char *user)
{
	for (size_t i = 0; srv->opts.curve_jobs != NULL && i < srv->opts.n_curve_allow; i++) {
		if (strcmp(srv->opts.curve_allow[i], user) == 0)
			return srv->opts.curve_jobs[i];
	}
	return "";
}

static bool key_may_join(const struct aps_server *srv, const char *user, const char *job)
{
	char globs[512], *save = NULL; /* an allowlist line's jobs (keys.h) */

	snprintf(globs, sizeof(globs), "%s", key_jobs(srv, user));
	if (globs[0] == '\0')
		return true;
	for (char *g = strtok_r(globs, " ", &save); g != NULL; g = strtok_r(NULL, " ", &save)) {
		if (fnmatch(g, job, 0) == 0)
			return true;
	}
	return false;
}

/* A stranger's HELLOs cost one log line a second at most; refused_token counts each. */
static void log_refusal(struct aps_server *srv, const struct aps_session *s,
                        const struct aps_msg *m, const struct aps_job *job, const char *why)
{
	uint64_t now = uv_now(srv->loop);

	if (!aps_log_gate_open(&srv->refusal_log, now, REFUSAL_LOG_MS))
		return;
	aps_log_warn("server",
	             "refused a hello job=%s rank=%u address=%s holder=%s unlogged=%llu "
	             "reason=\"%s\"",
	             m->job, m->rank, s->address, job != NULL ? job->origin : "-",
	             (unsigned long long)aps_log_gate_pass(&srv->refusal_log, now), why);
}

bool aps_access_let_in(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	const struct aps_job *job = aps_jobs_find(&srv->jobs, m->job);
	bool key_may = key_may_join(srv, s->user, m->job);
	const char *why = NULL;
	char later[256] = "";
	uint32_t retry_after = 0;

	if (!key_may)
		why = "its CURVE key may not join this job (curve_allow_file)";
	else if (job != NULL && !same_token(job->token, m->job_token))
		why = m->job_token[0] == '\0' ? "the job has a job token and this HELLO has none"
		                              : "the job token differs";
	if (why == NULL)
		return true;
	/* A new run of a job whose old ranks just left: their places are kept for
	 * a reconnect (a blip must not let a stranger end the job), then freed. */
	if (job != NULL && aps_access_abandoned(job) && key_may) {
		retry_after = frees_in_ms(srv, job);
		snprintf(later, sizeof(later),
		         " (every rank of the job holding the name has left: it ends within "
		         "reconnect_grace_ms = %d ms, then a new job of that name may start)",
		         srv->opts.reconnect_grace_ms);
	} else if (job != NULL && key_may) {
		/* A run that finds its name taken is told since when (the daemon's log
		 * says from where; a stranger is not told). */
		snprintf(later, sizeof(later),
		         " (held by a job started %.1f s ago with %u of %u ranks; apsd's log "
		         "names its address)",
		         (double)(uv_now(srv->loop) - job->created_ms) / 1000.0,
		         aps_job_connected(job), job->world_size);
	}
	srv->counters.refused_token++;
	log_refusal(srv, s, m, key_may ? job : NULL, why);
	aps_outbox_refuse(srv, &s->peer, m, retry_after, "not allowed in job '%s': %s%s", m->job,
	                  why, later);
	return false;
}
