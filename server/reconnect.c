/*
 * Sessions whose connection closed, went silent, or came back
 * (docs/RELIABILITY.md). A joined session has a token: 16 random bytes its
 * client chose and says in every HELLO, which only the two of them know.
 * When its connection closes, or says nothing for heartbeat_timeout_ms (apsd
 * then drops it), the rank keeps its place for reconnect_grace_ms and rounds
 * wait for it. A client back on a new connection says HELLO flagged RESUME
 * with the token: apsd moves the session there (and drops the old connection
 * if it still looked open: a blip apsd could not see) and answers WELCOME
 * flagged RESUMED; the client then sends its calls in flight again and
 * resend.c answers what apsd had seen of them. A HELLO said again on a new
 * connection before its WELCOME came (a blip while joining) takes the same
 * session too. A routing id proves nothing: a message from a session's
 * routing id on another connection is a stranger's. A rank not back within
 * the grace is lost, as if its connection had just closed.
 */
#include "server/reconnect.h"

#include "server/join.h"
#include "server/leave.h"
#include "server/outbox.h"
#include "server/server_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <string.h>

static uint64_t now_ms(const struct aps_server *srv)
{
	return uv_now(srv->loop) > 0 ? uv_now(srv->loop) : 1;
}

void aps_reconnect_detach(struct aps_server *srv, struct aps_session *s, const char *why)
{
	s->detached_ms = now_ms(srv);
	aps_log_warn("server", "%s job=%s rank=%u waiting_ms=%d", why, s->job->name, s->rank,
	             srv->opts.reconnect_grace_ms);
}

/* Compares all 16 bytes whatever they hold: the time says nothing of the token. */
static bool same_token(const uint8_t *a, const uint8_t *b)
{
	uint8_t diff = 0;

	for (size_t i = 0; i < APS_MSG_SESSION_LEN; i++)
		diff |= a[i] ^ b[i];
	return diff == 0;
}

static struct aps_session *find_by_token(struct aps_server *srv, const struct aps_msg *m)
{
	struct aps_job *job = aps_jobs_find(&srv->jobs, m->job);
	struct aps_session *s =
	        job != NULL && m->rank < job->world_size ? job->ranks[m->rank] : NULL;

	return s != NULL && same_token(s->token, m->session) ? s : NULL;
}

static void refuse_resume(struct aps_server *srv, const struct aps_inmsg *in,
                          const struct aps_msg *m)
{
	srv->counters.refused_resume++;
	aps_outbox_error(srv, &in->peer, APS_ENOSESSION, m,
	                 "apsd has no session of rank %u of job '%s' to take back: it was "
	                 "lost (away longer than reconnect_grace_ms = %d), or apsd "
	                 "restarted",
	                 m->rank, m->job, srv->opts.reconnect_grace_ms);
}

/* s goes on on in's connection (its old one, if it still looked open, is dropped). */
static void move(struct aps_server *srv, struct aps_session *s, const struct aps_inmsg *in)
{
	if (s->detached_ms == 0) /* a blip apsd could not see: that connection is dead */
		aps_zbridge_drop(srv->bridge, s->conn);
	aps_log_info("server", "rank reconnected job=%s rank=%u away_ms=%llu", s->job->name,
	             s->rank,
	             (unsigned long long)(s->detached_ms ? now_ms(srv) - s->detached_ms : 0));
	s->reconnects++;
	srv->counters.reconnects++;
	if (s->steps_due) /* what went to its last connection may be lost: all again */
		s->steps_next = 0;
	aps_jobs_move_session(&srv->jobs, s, &in->peer);
	s->conn = in->conn;
	s->detached_ms = 0;
	snprintf(s->address, sizeof(s->address), "%s", in->address);
	aps_zbridge_admit(srv->bridge, in->conn, true);
}

bool aps_reconnect_hello(struct aps_server *srv, struct aps_inmsg *in, const struct aps_msg *m)
{
	bool resume = (m->flags & APS_MSG_FLAG_RESUME) != 0;
	struct aps_session *s = m->has_session ? find_by_token(srv, m) : NULL;
	struct aps_session *here = aps_jobs_find_session(&srv->jobs, &in->peer);

	if (s != NULL && (aps_peer_equal(&s->moved_from, &in->peer) ||
	                  !aps_zbridge_conn_open(srv->bridge, in->conn))) {
		srv->counters.stale_messages++; /* a late HELLO of a connection the session left */
		return true;
	}
	/* With CURVE, the same key: a token does not lift a key's allowlist line. */
	if (s != NULL && strcmp(s->user, in->user) != 0)
		s = NULL;
	if (s == NULL || (here != NULL && here != s && here->job != NULL)) {
		if (resume)
			refuse_resume(srv, in, m);
		return resume; /* a first HELLO: join.c */
	}
	if (s->conn != in->conn && srv->opts.reconnect_grace_ms == 0) {
		/* No grace: nothing is taken back, the rank is lost. */
		aps_leave_lost(srv, s, "its connection was replaced");
		aps_jobs_drop_session(&srv->jobs, s);
		if (resume)
			refuse_resume(srv, in, m);
		return resume;
	}
	if (here != NULL && here != s)
		aps_jobs_drop_session(&srv->jobs, here); /* a stranger's record of this peer */
	if (s->conn != in->conn)
		move(srv, s, in);
	else
		srv->counters.resent++; /* said again on its connection: the WELCOME was lost */
	s->last_seen_ms = now_ms(srv);
	s->msgs_in++;
	aps_join_welcome(srv, s, resume ? APS_MSG_FLAG_RESUMED : 0);
	return true;
}

bool aps_reconnect_moved_from(struct aps_server *srv, const struct aps_peer *peer)
{
	return aps_jobs_find_moved(&srv->jobs, peer) != NULL;
}

/* A joined session that said nothing for heartbeat_timeout_ms: its connection is dead. */
static void silent(struct aps_server *srv, struct aps_session *s, uint64_t now)
{
	char why[96];

	snprintf(why, sizeof(why), "connection silent for %llu ms",
	         (unsigned long long)(now - s->last_seen_ms));
	srv->counters.silent_dropped++;
	aps_zbridge_drop(srv->bridge, s->conn);
	if (srv->opts.reconnect_grace_ms > 0) {
		aps_reconnect_detach(srv, s, why);
		return;
	}
	aps_leave_lost(srv, s, why);
	aps_jobs_drop_session(&srv->jobs, s);
}

void aps_reconnect_tick(struct aps_server *srv, uint64_t now)
{
	uint64_t grace = (uint64_t)srv->opts.reconnect_grace_ms;
	uint64_t timeout = (uint64_t)srv->opts.heartbeat_timeout_ms;
	struct aps_session *s = srv->jobs.sessions, *next;
	char why[96];

	snprintf(why, sizeof(why), "connection closed, not back within %llu ms",
	         (unsigned long long)grace);
	for (; s != NULL; s = next) {
		next = s->next;
		if (s->job == NULL)
			continue;
		if (s->detached_ms == 0 && now - s->last_seen_ms >= timeout &&
		    s->job->loading == NULL) { /* no keepalive is due before the WELCOME */
			silent(srv, s, now);
			continue;
		}
		if (s->detached_ms == 0 || now - s->detached_ms < grace)
			continue;
		aps_leave_lost(srv, s, why);
		aps_jobs_drop_session(&srv->jobs, s);
	}
}
