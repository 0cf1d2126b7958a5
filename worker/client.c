/*
 * The client's life: its options, joining a job (join.c, on the caller's thread,
 * before the I/O thread exists), the I/O thread's start, and leaving (BYE). The
 * socket belongs to the I/O thread from the moment it starts until
 * aps_client_close has joined it.
 */
#include "worker/client_impl.h"

#include "common/codec.h"
#include "common/err.h"
#include "worker/api_error.h"
#include "worker/join.h"
#include "worker/options.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

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

/* Before joining: a trace file that cannot be written fails the call, not a later one. */
static int open_trace(struct aps_client *c, const struct aps_client_opts *o)
{
	const char *path = o->trace != NULL ? o->trace : getenv("APS_TRACE");
	char name[96];

	if (path == NULL || path[0] == '\0')
		return 0;
	snprintf(name, sizeof(name), "aps worker %s rank %u", c->job, c->rank);
	if (aps_trace_open(&c->trace, path, name) < 0)
		return aps_api_fail(APS_ESYS, "cannot write the trace file %.200s%s: %s", path,
		                    o->trace != NULL ? "" : " ($APS_TRACE)", strerror(errno));
	return 0;
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
	free(c->active_ids);
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

	if ((ret = aps__options_check(o, &fmt, &down)) < 0)
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
	ret = open_trace(c, o);
	if (ret == 0)
		ret = aps_join(c, o->downlink);
	if (ret == 0)
		ret = start_io(c);
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
