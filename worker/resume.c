/*
 * The connection's life, on the I/O thread (docs/RELIABILITY.md). A socket is
 * one connection: when it closes (the transport says LOST), or apsd says
 * nothing for the keepalive_ms its WELCOME named, the client renews the
 * transport (a new socket with a new routing id, at most one every 100 ms)
 * and says HELLO flagged RESUME with its session's token. apsd moves the session to the new
 * connection and answers WELCOME flagged RESUMED; the client then sends every call in flight again,
 * each from where it is: the data chunks whose results have not arrived, the exponents of an
 * exchange not answered, the barrier, the registration or the pull. apsd answers what it had seen
 * again and drops what it holds, so nothing is counted twice (server/resend.c); a result that
 * arrives twice is taken once (iothread.c). A client with nothing to say says HEARTBEAT flagged
 * ALIVE, so that apsd knows it lives.
 */
#include "worker/client_impl.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A new connection at most every RENEW_MS (ZeroMQ's own reconnect interval): a
 * rank has reconnect_grace_ms (1.5 s) to be back, whatever cut its connections. */
#define RENEW_MS         100
#define KEEPALIVE_DEF_MS 5000 /* apsd's default heartbeat_timeout_ms */

void aps_resume_welcomed(struct aps_client *c, const struct aps_msg *w)
{
	c->has_session = true; /* joined: the session can be taken back by its token */
	c->max_message_bytes = w->max_message_bytes;
	c->keepalive_ms = w->keepalive_ms > 0 ? (int)w->keepalive_ms : KEEPALIVE_DEF_MS;
}

static void say_resume(struct aps_client *c)
{
	struct aps_msg m;

	aps_client_msg(c, &m, APS_MSG_HELLO);
	m.flags = APS_MSG_FLAG_RESUME;
	memcpy(m.session, c->session, sizeof(m.session));
	m.has_session = true;
	c->resuming = aps_client_send(c, &m, NULL, NULL, 0) == 0;
}

void aps_resume_lost(struct aps_client *c, const char *why)
{
	int64_t now = aps_client_now_ms();

	int64_t due;

	if (c->renew_due_ms != 0)
		return;
	due = c->last_renew_ms + RENEW_MS;
	c->renew_due_ms = due > now ? due : now;
	aps_client_log(c, 1, "%s: a new connection to apsd at %s goes in %lld ms", why, c->endpoint,
	               (long long)(c->renew_due_ms - now));
	aps_transport_drop(c->tr);
}

static void renew(struct aps_client *c, int64_t now)
{
	c->renew_due_ms = 0;
	c->send_lost = NULL;
	c->last_renew_ms = now;
	if (aps_transport_renew(c->tr) < 0) {
		aps_client_fail_for_good(c, APS_ECONN, "cannot open a new connection to apsd");
		return;
	}
	c->last_recv_ms = now; /* the new connection gets a whole keepalive_ms */
	/* Without a session (joining again after apsd restarted) rejoin.c says HELLO. */
	if (c->has_session)
		say_resume(c);
}

static void keep_alive(struct aps_client *c)
{
	struct aps_msg m;

	aps_client_msg(c, &m, APS_MSG_HEARTBEAT);
	m.flags = APS_MSG_FLAG_ALIVE;
	aps_client_send(c, &m, NULL, NULL, 0);
}

int aps_resume_timers(struct aps_client *c, int64_t now)
{
	int ka = c->keepalive_ms / 3 < c->heartbeat_ms ? c->keepalive_ms / 3 : c->heartbeat_ms;
	int64_t next;
	char why[96];

	if (c->send_lost != NULL) {
		aps_resume_lost(c, c->send_lost);
		c->send_lost = NULL;
	}
	if (c->renew_due_ms != 0 && now >= c->renew_due_ms)
		renew(c, now);
	if (c->renew_due_ms != 0)
		return (int)(c->renew_due_ms - now);
	if (!c->has_session)
		return c->heartbeat_ms;
	if (now - c->last_recv_ms >= c->keepalive_ms) {
		snprintf(why, sizeof(why), "apsd said nothing for %lld ms",
		         (long long)(now - c->last_recv_ms));
		aps_resume_lost(c, why);
		return 0;
	}
	if (now - c->last_sent_ms >= ka)
		keep_alive(c);
	next = c->last_sent_ms + ka < c->last_recv_ms + c->keepalive_ms
	               ? c->last_sent_ms + ka
	               : c->last_recv_ms + c->keepalive_ms;
	return next > now ? (int)(next - now) : 0;
}

bool aps_resume_refused(struct aps_client *c, const struct aps_msg *m)
{
	char text[APS_CLIENT_ERROR_MAX];

	if (!c->resuming || m->about_type != APS_MSG_HELLO || m->error_code != APS_ENOSESSION)
		return false;
	c->resuming = false;
	c->has_session = false;
	if (c->rejoin) {
		aps_rejoin_begin(c, m->error_text);
		return true;
	}
	snprintf(text, sizeof(text),
	         "the connection to apsd was lost and it did not take rank %u "
	         "back: %.200s",
	         c->rank, m->error_text);
	aps_client_fail_for_good(c, APS_ENOSESSION, text);
	return true;
}

static int resend(struct aps_client *c, struct aps_request *r)
{
	switch (r->kind) {
	case REQ_REGISTER:
	case REQ_BARRIER:
		return aps_outbox_simple(c, r);
	case REQ_PULL:
		return aps_outbox_pull(c, r);
	case REQ_ALLREDUCE:
	case REQ_BROADCAST:
		return r->state == REQ_SENT ? aps_outbox_chunks(c, r) : 0;
	default:
		return 0;
	}
}

void aps_resume_calls(struct aps_client *c)
{
	struct aps_request **exchange = NULL;
	uint32_t n = 0, n_active = 0;
	int ret = 0;

	c->resuming = false;
	for (struct aps_request *r = c->active; r != NULL; r = r->next)
		n_active++;
	aps_client_log(c, 2, "apsd took rank %u of job '%s' back: %u calls in flight go again",
	               c->rank, c->job, n_active);
	if (n_active > 0 && (exchange = malloc(n_active * sizeof(*exchange))) == NULL) {
		aps_client_fail_calls(c, APS_ENOMEM, "out of memory resending calls");
		return;
	}
	aps_rejoin_resumed(c);
	for (struct aps_request *r = c->active; r != NULL && ret == 0; r = r->next) {
		if (r->state == REQ_EXCHANGE)
			exchange[n++] = r;
		else
			ret = resend(c, r);
	}
	if (ret == 0 && n > 0)
		ret = aps_outbox_exponents(c, exchange, n);
	free(exchange);
	if (ret < 0)
		aps_client_fail_calls(c, APS_ECONN, "send to the daemon failed after a reconnect");
}
