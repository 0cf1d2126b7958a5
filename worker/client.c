/*
 * The client's life: joining a job (HELLO/WELCOME on the caller's thread,
 * before the I/O thread exists), waiting for requests, and leaving (BYE). The socket belongs to the
 * I/O thread from the moment it starts until aps_client_close has joined it.
 */
#include "worker/client_impl.h"

#include "common/err.h"
#include "common/rules.h"
#include "worker/api_error.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#define JOIN_CLOSES_MAX 8 /* closes without an answer before joining gives up */

void aps_client_opts_init(struct aps_client_opts *o)
{
	memset(o, 0, sizeof(*o));
	o->endpoint = "tcp://127.0.0.1:5555";
	o->job = "default";
	o->world_size = 1;
	o->format = "e4m3";
	o->scaling = APS_SCALING_MODE_LOCAL;
	o->timeout_ms = 60000;
	o->heartbeat_ms = 1000;
	o->connect_timeout_ms = 10000;
}

size_t aps_client_opts_size(void)
{
	return sizeof(struct aps_client_opts);
}

/* "" (none) or 1..APS_MSG_TOKEN_MAX visible ASCII bytes. */
static bool token_ok(const char *token)
{
	size_t n = strlen(token);

	for (size_t i = 0; i < n; i++) {
		if (token[i] < '!' || token[i] > '~')
			return false;
	}
	return n <= APS_MSG_TOKEN_MAX;
}

static int check_opts(const struct aps_client_opts *o, struct aps_format *fmt,
                      struct aps_format *down)
{
	char why[160];
	if (o == NULL || o->endpoint == NULL || o->job == NULL || o->format == NULL)
		return aps_api_fail(APS_EINVAL, "options, endpoint, job and format are required");
	if (o->world_size < 1 || o->rank >= o->world_size)
		return aps_api_fail(APS_EINVAL, "rank %u is not in a world of %u", o->rank,
		                    o->world_size);
	if (o->job[0] == '\0' || strlen(o->job) > APS_MSG_JOB_MAX)
		return aps_api_fail(APS_EINVAL, "job name must have 1 to %d bytes",
		                    APS_MSG_JOB_MAX);
	if (strlen(o->endpoint) >= 256)
		return aps_api_fail(APS_EINVAL, "endpoint is longer than 255 bytes");
	if (aps_format_parse(o->format, fmt) < 0)
		return aps_api_fail(APS_EFORMAT, "'%.32s' is not a format", o->format);
	if (o->downlink != NULL && o->downlink[0] != '\0' && strcmp(o->downlink, "auto") != 0 &&
	    aps_format_parse(o->downlink, down) < 0)
		return aps_api_fail(APS_EFORMAT, "downlink '%.32s' is not a format", o->downlink);
	if (o->scaling < APS_SCALING_MODE_NONE || o->scaling > APS_SCALING_MODE_GLOBAL)
		return aps_api_fail(APS_EINVAL,
		                    "scaling %d is not none (0), local (1) or global (2)",
		                    o->scaling);
	if (o->timeout_ms <= 0 || o->heartbeat_ms <= 0)
		return aps_api_fail(APS_EINVAL, "timeout_ms and heartbeat_ms must be positive");
	if (o->connect_timeout_ms < 0)
		return aps_api_fail(APS_EINVAL, "connect_timeout_ms must be 0 (none) or positive");
	if (aps_rules_check(o->rules, why, sizeof(why)) < 0)
		return aps_api_fail(APS_EINVAL, "rules: %s", why);
	if (o->optimizer != NULL && strlen(o->optimizer) > APS_MSG_OPTIM_MAX)
		return aps_api_fail(APS_EINVAL, "optimizer is longer than %d bytes",
		                    APS_MSG_OPTIM_MAX);
	if (o->job_token != NULL && !token_ok(o->job_token))
		return aps_api_fail(APS_EINVAL,
		                    "job_token must be 1 to %d visible ASCII bytes (no spaces)",
		                    APS_MSG_TOKEN_MAX);
	/* The workers' weights would not be what a restarted daemon resumes from its checkpoint. */
	if (o->optimizer != NULL && o->optimizer[0] != '\0' && o->rejoin)
		return aps_api_fail(APS_EINVAL,
		                    "rejoin does not apply to optimize mode: after apsd restarts, "
		                    "restart the workers (the job resumes from its checkpoint)");
	return 0;
}

static void copy_opts(struct aps_client *c, const struct aps_client_opts *o,
                      const struct aps_format *fmt)
{
	c->pid = getpid();
	snprintf(c->endpoint, sizeof(c->endpoint), "%s", o->endpoint);
	snprintf(c->job, sizeof(c->job), "%s", o->job);
	c->rank = o->rank;
	c->world_size = o->world_size;
	c->format = *fmt;
	c->scaling = (enum aps_scaling)o->scaling;
	c->timeout_ms = o->timeout_ms;
	c->heartbeat_ms = o->heartbeat_ms;
	c->connect_timeout_ms = o->connect_timeout_ms;
	c->log = o->log;
	c->log_ctx = o->log_ctx;
	c->wake_fd = -1;
	c->policy_auto = o->policy_auto != 0;
	c->error_feedback = o->error_feedback != 0;
	c->rejoin = o->rejoin != 0;
	snprintf(c->rules, sizeof(c->rules), "%s", o->rules != NULL ? o->rules : "");
	snprintf(c->optimizer, sizeof(c->optimizer), "%s",
	         o->optimizer != NULL ? o->optimizer : "");
	snprintf(c->job_token, sizeof(c->job_token), "%s",
	         o->job_token != NULL ? o->job_token : "");
	aps_msg_limits_init(&c->limits);
	c->limits.from_server = true;
}

/* Joining: what await_welcome waits for. */
struct join {
	int64_t deadline;   /* the call's: timeout_ms after the first HELLO */
	int64_t connect_by; /* while no connection is up: connect_timeout_ms after the
	                       start or the last close (INT64_MAX: no limit) */
	unsigned closes;    /* connections that closed before WELCOME */
	unsigned waits;     /* connects that failed or could not start */
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

/* The connection closed (closes so far) or could not be made before WELCOME: a new
 * one after a pause that grows with tries (at most max_pause_ms), and HELLO again. */
static int join_again(struct aps_client *c, unsigned closes, unsigned tries, int max_pause_ms)
{
	struct aps_msg hello = c->hello;
	int ms = tries < 5 ? 50 << tries : 1000;
	struct timespec pause;

	/* Closed before any handshake: a daemon of another mechanism is told at once. */
	if (closes > 0 && !aps_transport_ever_handshook(c->tr) &&
	    aps_transport_mechanism_differs(c->tr))
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
		                    "before it answered (it may be at max_connections, or not take "
		                    "this client: its log says why)",
		                    c->endpoint, closes);
	aps_transport_drop(c->tr); /* not to be connected again under its old routing id */
	ms = ms < max_pause_ms ? ms : max_pause_ms;
	pause = (struct timespec){ ms / 1000, (long)(ms % 1000) * 1000000L };
	nanosleep(&pause, NULL);
	if (aps_transport_renew(c->tr) < 0)
		return aps_api_fail(APS_ECONN, "cannot connect to %s again", c->endpoint);
	/* The HELLO or its WELCOME may be lost: say it again (apsd answers a HELLO of a
	 * session it knows with WELCOME again). */
	return aps_client_send(c, &hello, NULL, NULL, 0) < 0
	               ? aps_api_fail(APS_ECONN, "cannot send to %s", c->endpoint)
	               : 0;
}

/* The connection closed, or the connect failed: a new one (0), or why not. */
static int join_link_event(struct aps_client *c, struct join *j, int got)
{
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
	return aps_api_fail(APS_ETIMEDOUT,
	                    "joining the job: apsd at %.120s took the connection but did not "
	                    "answer within timeout_ms = %d (is it stopped or overloaded, or is "
	                    "something else listening there?)",
	                    c->endpoint, c->timeout_ms);
}

/* WELCOME (1), an ERROR or a message apsd should not send first (< 0), else 0. */
static int join_message(struct aps_client *c, const struct aps_rxmsg *rx)
{
	struct aps_msg_fault fault;
	struct aps_msg m;

	if (aps_msg_parse(&c->limits, rx->hdr, rx->hdr_len, rx->payload, rx->payload_len,
	                  rx->payload != NULL, &m, &fault) < 0)
		return aps_api_fail(APS_EPROTO, "bad message from apsd: %s", fault.text);
	if (m.type == APS_MSG_ERROR)
		return aps_api_fail(m.error_code, "%s", m.error_text);
	if (m.type != APS_MSG_WELCOME)
		return 0;
	if (c->optimizer[0] != '\0' && m.optimizer[0] == '\0')
		return aps_api_fail(APS_EPROTO,
		                    "apsd at %s does not serve optimize mode (protocol %u.%u, "
		                    "optimize mode needs 1.4)",
		                    c->endpoint, m.version_major, m.version_minor);
	snprintf(c->optimizer, sizeof(c->optimizer), "%s", m.optimizer);
	c->barrier_step = m.step; /* a rank back in an elastic job joins the next one */
	aps_resume_welcomed(c, &m);
	c->last_recv_ms = aps_client_now_ms();
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
	struct join j = { .deadline = aps_client_now_ms() + c->timeout_ms };
	struct aps_rxmsg rx;
	int ret;

	arm_connect(c, &j);
	for (;;) {
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
			ret = join_message(c, &rx);
		if (ret != 0)
			return ret < 0 ? ret : 0;
	}
}

static int hello(struct aps_client *c, const struct aps_client_opts *o)
{
	struct aps_msg m;

	/* The session's token, ours for the client's life: every HELLO says it, and it
	 * takes the session back after the connection closed (resume.c). */
	if (getrandom(c->session, sizeof(c->session), 0) != (ssize_t)sizeof(c->session))
		return aps_api_fail(APS_ESYS, "no randomness for a session token (getrandom)");
	aps_client_msg(c, &m, APS_MSG_HELLO);
	memcpy(m.session, c->session, sizeof(m.session));
	m.has_session = true;
	m.scaling = (int)c->scaling;
	m.flags = c->policy_auto ? APS_MSG_FLAG_POLICY_AUTO : 0;
	snprintf(m.optimizer, sizeof(m.optimizer), "%s", c->optimizer);
	snprintf(m.job_token, sizeof(m.job_token), "%s", c->job_token);
	if (o->downlink != NULL && strcmp(o->downlink, "auto") != 0)
		snprintf(m.format, sizeof(m.format), "%s", o->downlink);
	c->hello = m; /* said again if apsd restarts (rejoin) */
	if (aps_client_send(c, &m, NULL, NULL, 0) < 0)
		return aps_api_fail(APS_ECONN, "cannot send to %s", c->endpoint);
	return await_welcome(c);
}

static void open_trace(struct aps_client *c, const struct aps_client_opts *o)
{
	const char *path = o->trace != NULL ? o->trace : getenv("APS_TRACE");
	char name[96];

	if (path == NULL || path[0] == '\0')
		return;
	snprintf(name, sizeof(name), "aps worker %s rank %u", c->job, c->rank);
	if (aps_trace_open(&c->trace, path, name) < 0)
		aps_client_log(c, 1, "cannot write the trace file %s", path);
}

static int start_io(struct aps_client *c)
{
	c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->wake_fd < 0)
		return aps_api_fail(APS_ESYS, "eventfd failed");
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->done_cv, NULL);
	if (pthread_create(&c->io, NULL, aps_client_io_main, c) != 0)
		return aps_api_fail(APS_ESYS, "cannot start the client's I/O thread");
	c->io_started = true;
	return 0;
}

static void free_client(struct aps_client *c)
{
	aps_transport_close(c->tr, 0);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	aps_trace_close(c->trace);
	for (uint32_t i = 0; i < c->n_tensors; i++)
		free(c->tensors[i].residual);
	free(c->tensors);
	free(c);
}

int aps_conn_new(aps_client **out, const struct aps_client_opts *o)
{
	struct aps_format fmt, down;
	struct aps_client *c;
	int ret;

	if ((ret = check_opts(o, &fmt, &down)) < 0)
		return ret;
	if (out == NULL)
		return aps_api_fail(APS_EINVAL, "out is NULL");
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	copy_opts(c, o, &fmt);
	ret = aps_transport_open(&c->tr, o->endpoint,
	                         &(struct aps_transport_curve){ o->curve_server_key,
	                                                        o->curve_public_key,
	                                                        o->curve_secret_key });
	if (ret < 0) {
		free(c);
		if (ret == APS_EINVAL)
			return aps_api_fail(ret, "a CURVE key is not a Z85 key of 40 characters");
		return aps_api_fail(APS_ECONN, "cannot connect to '%.200s': %s", o->endpoint,
		                    aps_transport_strerror());
	}
	ret = hello(c, o);
	if (ret == 0) {
		open_trace(c, o);
		ret = start_io(c);
	}
	if (ret < 0) {
		free_client(c);
		return ret;
	}
	*out = c;
	return aps_api_ok();
}

static void stop_io(struct aps_client *c)
{
	uint64_t one = 1;

	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	pthread_mutex_unlock(&c->lock);
	/* Even if the wake-up cannot be written, the thread sees stopping within a second. */
	if (write(c->wake_fd, &one, sizeof(one)) < 0)
		aps_client_log(c, 1, "cannot wake the I/O thread; it stops at its next tick");
	pthread_join(c->io, NULL);
}

int aps_conn_close(aps_client *c)
{
	struct aps_msg bye;

	if (c == NULL)
		return 0;
	if (c->pid != getpid()) {
		/* A forked child: the parent's thread and socket are not ours to touch. */
		for (uint32_t i = 0; i < c->n_tensors; i++)
			free(c->tensors[i].residual);
		free(c->tensors);
		free(c);
		return 0;
	}
	if (c->io_started)
		stop_io(c);
	aps_client_msg(c, &bye, APS_MSG_BYE);
	aps_client_send(c, &bye, NULL, NULL, 0);
	aps_transport_close(c->tr, 1000);
	c->tr = NULL;
	pthread_mutex_destroy(&c->lock);
	pthread_cond_destroy(&c->done_cv);
	free_client(c);
	return 0;
}
