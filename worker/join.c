/*
 * The client's side of joining a job: HELLO, then WELCOME awaited on the
 * caller's thread (the I/O thread does not exist yet), with the connection's
 * retries and, when it cannot be had, the reason (refused, unresolvable, no
 * answer, another security mechanism, closed again and again).
 */
#include "worker/join.h"

#include "common/err.h"
#include "worker/api_error.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#define JOIN_CLOSES_MAX 8 /* closes without an answer before joining gives up */
/* apsd tells how far a checkpoint read is every 250 ms: a join waits at least this
 * long for the read to go on, whatever its timeout_ms. */
#define LOADING_WAIT_MIN_MS 1000

/* Joining: what await_welcome waits for. */
struct join {
	int64_t deadline;     /* the call's: timeout_ms after the first HELLO */
	int64_t connect_by;   /* while no connection is up: connect_timeout_ms after the
	                         start or the last close (INT64_MAX: no limit) */
	unsigned closes;      /* connections that closed before WELCOME */
	unsigned waits;       /* connects that failed or could not start */
	int64_t hello_at;     /* HELLO again then: the job's name was held (0: not) */
	bool held;            /* the name was held: said once in the log */
	int64_t loading_said; /* when the log last said how far apsd reads the checkpoint */
	int64_t loading_read; /* KiB of it apsd said it had read (-1: it said nothing) */
	uint64_t loading_kib; /* of the file */
	uint64_t loading_all; /* KiB apsd said its reads of every job's had read */
};

static void arm_connect(const struct aps_client *c, struct join *j)
{
	j->connect_by =
	        c->connect_timeout_ms > 0 ? aps_client_now_ms() + c->connect_timeout_ms : INT64_MAX;
}

/* How long the next receive may wait: to the deadline, or while no connection is up,
 * to the connect deadline if that comes first. */
static int join_wait_ms(const struct aps_client *c, const struct join *j)
{
	int64_t until = j->deadline, now = aps_client_now_ms();

	if (!aps_transport_link_up(c->tr) && j->connect_by < until)
		until = j->connect_by;
	if (j->hello_at != 0 && j->hello_at < until)
		until = j->hello_at;
	return until > now ? (int)(until - now) : 0;
}

/* No connection could be made in time: why, as far as the connects tell. */
static int connect_failed(struct aps_client *c, const struct join *j)
{
	bool ipc = strncmp(c->endpoint, "ipc://", 6) == 0;
	bool ours = j->connect_by <= j->deadline; /* connect_timeout_ms ran out first */
	const char *limit = ours ? "connect_timeout_ms" : "timeout_ms";
	int ms = ours ? c->connect_timeout_ms : c->timeout_ms;
	struct aps_transport_tally t;

	aps_transport_tally(c->tr, &t);
	if (t.failed > 0)
		return aps_api_fail(
		        APS_ECONN,
		        "joining the job: cannot connect to apsd at %.120s within %s = "
		        "%d: connection refused (%u tries; nothing listens there%s): is "
		        "apsd running there, and is the %s right?",
		        c->endpoint, limit, ms, t.failed, ipc ? "" : ", or the host is unreachable",
		        ipc ? "socket path" : "port");
	if (t.unresolved > 0)
		return aps_api_fail(APS_ECONN,
		                    "joining the job: cannot connect to apsd at %.120s within %s = "
		                    "%d: the address does not resolve (%u tries): is the host "
		                    "name right?",
		                    c->endpoint, limit, ms, t.unresolved);
	return aps_api_fail(APS_ECONN,
	                    "joining the job: no answer from %.120s within %s = %d: no "
	                    "connection could be made (is apsd running there and the address "
	                    "right, or does a firewall drop the packets?)",
	                    c->endpoint, limit, ms);
}

/* Says HELLO on the connection now. A send that does not go is not the reason to
 * give: libzmq drops the pipe of a connection whose handshake failed (another
 * security mechanism, a refused key) before the first send may reach it, and the
 * monitor's event that follows says why; the wait for WELCOME acts on it. */
static int say_hello(struct aps_client *c, struct aps_msg *m)
{
	int ret = aps_client_send(c, m, NULL, NULL, 0);

	if (ret == APS_ECONN)
		return 0;
	return ret < 0 ? aps_api_fail(ret, "cannot send HELLO to %s", c->endpoint) : 0;
}

/* The connection closed (closes so far) or could not be made before WELCOME: a new
 * one after a pause that grows with tries (at most max_pause_ms), and HELLO again. */
static int join_again(struct aps_client *c, unsigned closes, unsigned tries, int max_pause_ms)
{
	struct aps_msg hello = c->hello;
	int ms = tries < 5 ? 50 << tries : 1000;
	struct timespec pause;

	/* Closed before any handshake: a daemon of another mechanism is told at once. */
	if (closes > 0 && !aps_transport_ever_handshook(c->tr) &&
	    aps_transport_mechanism_differs(c->tr, max_pause_ms))
		return aps_api_fail(APS_EACCES, "%s", aps_transport_refusal(c->tr));
	/* A refusal whose ERROR the reset connection lost: the handshake never worked. */
	if (closes >= JOIN_CLOSES_MAX && aps_transport_curve(c->tr) &&
	    !aps_transport_ever_handshook(c->tr))
		return aps_api_fail(APS_EACCES,
		                    "authentication failed: the CURVE handshake with apsd at %s "
		                    "never completed in %u tries (is this client's public key in "
		                    "the daemon's curve_allow_file, and curve_server_key the "
		                    "daemon's public key?)",
		                    c->endpoint, closes);
	if (closes >= JOIN_CLOSES_MAX)
		return aps_api_fail(APS_ECONN,
		                    "joining the job: apsd at %s closed the connection %u times "
		                    "before it answered (this host may be outside its allow_from, "
		                    "or it at max_connections: its log says which)",
		                    c->endpoint, closes);
	aps_transport_drop(c->tr); /* not to be connected again under its old routing id */
	ms = ms < max_pause_ms ? ms : max_pause_ms;
	pause = (struct timespec){ ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&pause, NULL);
	if (aps_transport_renew(c->tr) < 0)
		return aps_api_fail(APS_ECONN, "cannot connect to %s again", c->endpoint);
	/* The HELLO or its WELCOME may be lost: say it again (apsd answers a HELLO of a
	 * session it knows with WELCOME again). */
	return say_hello(c, &hello);
}

/* The connection closed, or the connect failed: a new one (0), or why not. */
static int join_link_event(struct aps_client *c, struct join *j, int got)
{
	j->hello_at = 0; /* join_again says HELLO */
	/* Only a connection that closed counts; nothing listening yet is a wait. */
	if (got == APS_TRANSPORT_RECV_LOST) {
		j->closes++;
		arm_connect(c, j); /* a new connection gets connect_timeout_ms again */
		return join_again(c, j->closes, j->closes, join_wait_ms(c, j));
	}
	j->waits++;
	return join_again(c, j->closes, j->waits, join_wait_ms(c, j));
}

/* Nothing came within the wait: no connection in time, no WELCOME in time, or
 * the connection came up meanwhile (0: wait on). */
static int join_timed_out(struct aps_client *c, const struct join *j)
{
	int64_t now = aps_client_now_ms();

	if (!aps_transport_link_up(c->tr) && (now >= j->connect_by || now >= j->deadline))
		return connect_failed(c, j);
	if (now < j->deadline)
		return 0;
	if (j->loading_read >= 0)
		return aps_api_fail(APS_ETIMEDOUT,
		                    "joining the job: apsd at %.120s reads the checkpoint of job "
		                    "'%s' (%.1f of %.1f MiB read), and neither it nor the reads "
		                    "ahead of it went on within timeout_ms = %d (%d at least): a "
		                    "slow or stalled disk?",
		                    c->endpoint, c->job, (double)j->loading_read / 1024.0,
		                    (double)j->loading_kib / 1024.0, c->timeout_ms,
		                    LOADING_WAIT_MIN_MS);
	return aps_api_fail(APS_ETIMEDOUT,
	                    "joining the job: apsd at %.120s took the connection but did not "
	                    "answer within timeout_ms = %d (is it stopped or overloaded, or is "
	                    "something else listening there?)",
	                    c->endpoint, c->timeout_ms);
}

/*
 * A refusal that says when the job's name is free (protocol 1.9: every rank of
 * the job holding it has left, their places kept for reconnect_grace_ms, as when
 * a job is launched again at once): HELLO again then, if that is before the
 * call's deadline (0), else the refusal.
 */
static int held_name(struct aps_client *c, struct join *j, const struct aps_msg *m)
{
	/* at least 50 ms: a daemon saying 1 ms again and again gets 20 HELLOs a second */
	int64_t at = aps_client_now_ms() + (m->retry_after_ms > 50 ? m->retry_after_ms : 50);

	if (m->error_code != APS_EACCES || m->retry_after_ms == 0 || at >= j->deadline)
		return aps_api_fail(m->error_code, "%s", m->error_text);
	if (!j->held)
		aps_client_log(c, 1,
		               "job '%s' is still held by the ranks of its last run (apsd keeps "
		               "their places for reconnect_grace_ms): joining in %u ms",
		               c->job, m->retry_after_ms);
	j->held = true;
	j->hello_at = at;
	return 0;
}

/*
 * apsd reads the job's checkpoint before its WELCOME (protocol 1.11), and says
 * how far: total_count KiB, chunk_offset of them read, step the KiB that every
 * read of apsd's has read (those ahead of this one, while it waits its turn).
 * Reads that go on are progress: the join's timeout_ms (LOADING_WAIT_MIN_MS at
 * least) counts from the last, so a checkpoint that takes longer to read than
 * timeout_ms is waited for while it is read, and one that stalls (or a daemon
 * that says the same forever) is not. The log says how far every 10 s.
 */
static int reading_checkpoint(struct aps_client *c, struct join *j, const struct aps_msg *m)
{
	int64_t now = aps_client_now_ms();
	int wait = c->timeout_ms > LOADING_WAIT_MIN_MS ? c->timeout_ms : LOADING_WAIT_MIN_MS;

	if ((int64_t)m->chunk_offset > j->loading_read || m->step > j->loading_all)
		j->deadline = now + wait;
	j->loading_read = (int64_t)m->chunk_offset;
	j->loading_kib = m->total_count;
	j->loading_all = m->step > j->loading_all ? m->step : j->loading_all;
	if (m->total_count == 0 || (j->loading_said != 0 && now - j->loading_said < 10000))
		return 0;
	j->loading_said = now;
	aps_client_log(c, 2,
	               "apsd reads the checkpoint of job '%s' before it lets rank %u in: %.1f of "
	               "%.1f MiB read",
	               c->job, c->rank, (double)m->chunk_offset / 1024.0,
	               (double)m->total_count / 1024.0);
	return 0;
}

/* WELCOME (1), an ERROR or a message apsd should not send first (< 0), else 0. */
static int join_message(struct aps_client *c, struct join *j, const struct aps_rxmsg *rx)
{
	struct aps_msg_fault fault;
	struct aps_msg m;

	if (aps_msg_parse(&c->limits, rx->hdr, rx->hdr_len, rx->payload, rx->payload_len,
	                  rx->payload != NULL, &m, &fault) < 0)
		return aps_api_fail(APS_EPROTO, "bad message from apsd: %s", fault.text);
	if (m.type == APS_MSG_ERROR)
		return held_name(c, j, &m);
	if (m.type == APS_MSG_HEARTBEAT && (m.flags & APS_MSG_FLAG_ALIVE))
		return reading_checkpoint(c, j, &m);
	if (m.type != APS_MSG_WELCOME)
		return 0;
	if (c->optimizer[0] != '\0' && m.optimizer[0] == '\0')
		return aps_api_fail(APS_EPROTO,
		                    "apsd at %s does not serve optimize mode (protocol %u.%u, "
		                    "optimize mode needs 1.4)",
		                    c->endpoint, m.version_major, m.version_minor);
	if (m.block_size != c->block)
		return aps_api_fail(APS_EPROTO,
		                    "apsd at %s scales blocks of %u elements, the client %u "
		                    "(protocol %u.%u; block scaling needs 1.7)",
		                    c->endpoint, m.block_size, c->block, m.version_major,
		                    m.version_minor);
	snprintf(c->optimizer, sizeof(c->optimizer), "%s", m.optimizer);
	c->downlink_fixed = m.format[0] != '\0';
	c->downlink = m.fmt;
	c->barrier_step = m.step; /* a rank back in an elastic job joins the next one */
	aps_resume_welcomed(c, &m);
	c->last_recv_ms = c->last_msg_ms = aps_client_now_ms();
	return 1;
}

/*
 * Waits for WELCOME on this thread: the I/O thread does not exist yet. Until a
 * connection is made (a TCP or IPC connection, before any handshake) joining
 * waits connect_timeout_ms at most, trying again while nothing listens (a daemon
 * started after its workers); a daemon that took the connection is waited for
 * up to the call's deadline.
 */
static int await_welcome(struct aps_client *c)
{
	struct join j = { .deadline = aps_client_now_ms() + c->timeout_ms, .loading_read = -1 };
	struct aps_rxmsg rx;
	int ret;

	arm_connect(c, &j);
	for (;;) {
		if (j.hello_at != 0 && aps_client_now_ms() >= j.hello_at) {
			struct aps_msg hello = c->hello;
			j.hello_at = 0;
			if ((ret = say_hello(c, &hello)) < 0)
				return ret;
		}
		int got = aps_transport_recv(c->tr, join_wait_ms(c, &j), &rx);
		if (got < 0)
			return aps_api_fail(APS_ECONN, "receive from %s failed", c->endpoint);
		if (got == APS_TRANSPORT_RECV_REFUSED)
			return aps_api_fail(APS_EACCES, "%s", aps_transport_refusal(c->tr));
		if (got == APS_TRANSPORT_RECV_LOST || got == APS_TRANSPORT_RECV_NOCONN)
			ret = join_link_event(c, &j, got);
		else if (got == 0)
			ret = join_timed_out(c, &j);
		else
			ret = join_message(c, &j, &rx);
		if (ret != 0)
			return ret < 0 ? ret : 0;
	}
}

int aps_join(struct aps_client *c, const char *downlink)
{
	struct aps_msg m;
	int ret;

	/* The session's token, ours for the client's life: every HELLO says it, and it
	 * takes the session back after the connection closed (resume.c). */
	if (getrandom(c->session, sizeof(c->session), 0) != (ssize_t)sizeof(c->session))
		return aps_api_fail(APS_ESYS, "no randomness for a session token (getrandom)");
	aps_client_msg(c, &m, APS_MSG_HELLO);
	memcpy(m.session, c->session, sizeof(m.session));
	m.has_session = true;
	m.scaling = (int)c->scaling;
	m.block_size = c->block;
	m.flags = (c->policy_auto ? APS_MSG_FLAG_POLICY_AUTO : 0) |
	          (c->no_crc ? APS_MSG_FLAG_NO_CRC : 0);
	snprintf(m.optimizer, sizeof(m.optimizer), "%s", c->optimizer);
	snprintf(m.job_token, sizeof(m.job_token), "%s", c->job_token);
	if (downlink != NULL && strcmp(downlink, "auto") != 0)
		snprintf(m.format, sizeof(m.format), "%s", downlink);
	c->hello = m; /* said again if apsd restarts (rejoin) */
	ret = say_hello(c, &m);
	return ret < 0 ? ret : await_welcome(c);
}
