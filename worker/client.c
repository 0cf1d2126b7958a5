/*
 * The client's life: its options, joining a job (join.c, on the caller's thread,
 * before the I/O thread exists), the I/O thread's start, and leaving (BYE). The
 * socket belongs to the I/O thread from the moment it starts until
 * aps_client_close has joined it.
 */
#include "worker/client_impl.h"

#include "common/codec.h"
#include "common/err.h"
#include "common/rules.h"
#include "worker/api_error.h"
#include "worker/join.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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
	if (o->scaling < APS_SCALING_MODE_NONE || o->scaling > APS_SCALING_MODE_BLOCK)
		return aps_api_fail(
		        APS_EINVAL,
		        "scaling %d is not none (0), local (1), global (2) or block (3)",
		        o->scaling);
	if (o->block_size != 0 &&
	    (o->scaling != APS_SCALING_MODE_BLOCK || !aps_codec_block_ok(o->block_size)))
		return aps_api_fail(APS_EINVAL, "block_size %u: 16, 32 or 64, with scaling block",
		                    o->block_size);
	if (o->codec_threads > APS_CLIENT_CODEC_THREADS_MAX)
		return aps_api_fail(APS_EINVAL, "codec_threads %u: at most %d", o->codec_threads,
		                    APS_CLIENT_CODEC_THREADS_MAX);
	if (o->no_payload_crc != 0 && o->no_payload_crc != 1)
		return aps_api_fail(APS_EINVAL, "no_payload_crc %d: 0 or 1", o->no_payload_crc);
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
	if (c->scaling == APS_SCALING_BLOCK)
		c->block = o->block_size ? o->block_size : APS_CODEC_BLOCK_DEFAULT;
	c->codec_threads = o->codec_threads > 1 ? o->codec_threads : 1;
	c->timeout_ms = o->timeout_ms;
	c->heartbeat_ms = o->heartbeat_ms;
	c->connect_timeout_ms = o->connect_timeout_ms;
	c->log = o->log;
	c->log_ctx = o->log_ctx;
	c->wake_fd = -1;
	c->policy_auto = o->policy_auto != 0;
	c->error_feedback = o->error_feedback != 0;
	c->no_crc = o->no_payload_crc != 0;
	c->rejoin = o->rejoin != 0;
	snprintf(c->rules, sizeof(c->rules), "%s", o->rules != NULL ? o->rules : "");
	snprintf(c->optimizer, sizeof(c->optimizer), "%s",
	         o->optimizer != NULL ? o->optimizer : "");
	snprintf(c->job_token, sizeof(c->job_token), "%s",
	         o->job_token != NULL ? o->job_token : "");
	aps_msg_limits_init(&c->limits);
	c->limits.from_server = true;
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
	if (c->codec_threads > 1 && aps_pool_new(&c->pool, c->codec_threads - 1) < 0)
		return aps_api_fail(APS_ESYS, "cannot start %u codec threads", c->codec_threads);
	c->wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (c->wake_fd < 0)
		return aps_api_fail(APS_ESYS, "eventfd failed");
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->done_cv, NULL);
	pthread_mutex_init(&c->io_role, NULL);
	if (pthread_create(&c->io, NULL, aps_client_io_main, c) != 0)
		return aps_api_fail(APS_ESYS, "cannot start the client's I/O thread");
	c->io_started = true;
	return 0;
}

static void free_tensors(struct aps_client *c)
{
	for (uint32_t i = 0; i < c->n_tensors; i++) {
		free(c->tensors[i].residual);
		aps_sbuf_unref(c->tensors[i].spare);
	}
	free(c->tensors);
}

static void free_client(struct aps_client *c)
{
	aps_transport_close(c->tr, 0);
	if (c->wake_fd >= 0)
		close(c->wake_fd);
	aps_trace_close(c->trace);
	aps_pool_free(c->pool);
	free_tensors(c);
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
	ret = aps_join(c, o->downlink);
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
	pthread_mutex_lock(&c->lock);
	c->stopping = true;
	pthread_mutex_unlock(&c->lock);
	/* Even if the wake-up cannot be written, the thread sees stopping within a second. */
	if (aps_client_wake(c) < 0)
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
		free_tensors(c);
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
	pthread_mutex_destroy(&c->io_role);
	free_client(c);
	return 0;
}
