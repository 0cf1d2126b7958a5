/*
 * The blocking client: joining a job (HELLO/WELCOME), registering tensors,
 * leaving, and the one loop every call waits in. A wait sends a HEARTBEAT
 * each heartbeat interval; the daemon answers with the ranks the call still
 * waits for, which is what a timeout reports.
 */
#include "worker/client_impl.h"

#include "common/err.h"
#include "worker/api_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define HEADER_MAX 4096

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
}

/* Hands one line to the user's log callback, if any; the library never prints. */
static void client_log(const struct aps_client *c, int level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static void client_log(const struct aps_client *c, int level, const char *fmt, ...)
{
	char line[320];
	va_list ap;

	if (c->log == NULL)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	c->log(c->log_ctx, level, line);
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int aps_client_check(const struct aps_client *c)
{
	if (c == NULL)
		return aps_api_fail(APS_EINVAL, "client is NULL");
	if (c->pid != getpid())
		return aps_api_fail(APS_ECLOSED,
		                    "the client was created by process %d, not this "
		                    "one: create a client after fork()",
		                    (int)c->pid);
	return 0;
}

void aps_client_msg(const struct aps_client *c, struct aps_msg *m, enum aps_msg_type type)
{
	aps_msg_init(m, type);
	memcpy(m->job, c->job, sizeof(m->job));
	m->rank = c->rank;
	m->world_size = c->world_size;
}

int aps_client_send(struct aps_client *c, struct aps_msg *m, const void *payload,
                    size_t payload_len)
{
	uint8_t hdr[HEADER_MAX];
	size_t len;

	m->payload = payload;
	m->payload_len = payload_len;
	if (aps_msg_pack(m, hdr, sizeof(hdr), &len) < 0)
		return aps_api_fail(APS_EINVAL, "cannot encode a %s", aps_msg_type_name(m->type));
	if (aps_transport_send(c->tr, hdr, len, payload, payload_len, payload != NULL) < 0)
		return aps_api_fail(APS_ECONN, "send to %s failed: %s", c->endpoint,
		                    aps_transport_strerror());
	return 0;
}

static void heartbeat(struct aps_client *c, const struct client_wait *w)
{
	struct aps_msg hb;

	aps_client_msg(c, &hb, APS_MSG_HEARTBEAT);
	hb.tensor_id = w->tensor_id;
	hb.step = w->step;
	if (w->barrier)
		snprintf(hb.tensor_name, sizeof(hb.tensor_name), "@barrier");
	aps_client_send(c, &hb, NULL, 0);
}

static bool is_reply(const struct aps_msg *m, const struct client_wait *w)
{
	if (m->type != w->type)
		return false;
	if (w->by_name)
		return strcmp(m->tensor_name, w->name) == 0;
	if (w->type == APS_MSG_WELCOME)
		return true;
	return m->step == w->step && (w->barrier || m->tensor_id == w->tensor_id);
}

static int timed_out(const struct aps_client *c, const struct client_wait *w,
                     const struct aps_msg *last_hb, int timeout_ms)
{
	char ranks[160] = "";
	size_t used = 0;

	if (last_hb == NULL)
		return aps_api_fail(APS_ETIMEDOUT,
		                    "%s: no answer from apsd at %s within %d ms "
		                    "(is the daemon running?)",
		                    w->what, c->endpoint, timeout_ms);
	for (uint32_t i = 0; i < last_hb->n_waiting_for && used < sizeof(ranks) - 12; i++)
		used += (size_t)snprintf(ranks + used, sizeof(ranks) - used, "%s%u", i ? ", " : "",
		                         last_hb->waiting_for[i]);
	return aps_api_fail(APS_ETIMEDOUT, "%s: no result within %d ms; apsd still waits for %s %s",
	                    w->what, timeout_ms, last_hb->n_waiting_for == 1 ? "rank" : "ranks",
	                    used ? ranks : "(none: the round is complete)");
}

/* Handles one received message: 1 the reply, 0 keep waiting, <0 the call failed. */
static int consider(struct aps_client *c, const struct client_wait *w, const struct aps_rxmsg *rx,
                    struct aps_msg *last_hb, bool *have_hb)
{
	struct aps_msg_fault fault;
	struct aps_msg *m = &c->reply;

	if (aps_msg_parse(&c->limits, rx->hdr, rx->hdr_len, rx->payload, rx->payload_len,
	                  rx->payload != NULL, m, &fault) < 0)
		return aps_api_fail(APS_EPROTO, "bad message from apsd: %s", fault.text);
	if (m->type == APS_MSG_ERROR)
		return aps_api_fail(m->error_code, "%s", m->error_text);
	if (m->type == APS_MSG_BYE)
		return aps_api_fail(APS_ECONN, "%s: apsd at %s is shutting down", w->what,
		                    c->endpoint);
	if (m->type == APS_MSG_HEARTBEAT) {
		*last_hb = *m;
		*have_hb = true;
		return 0;
	}
	if (is_reply(m, w))
		return 1;
	client_log(c, 3, "ignored %s tensor=%u step=%llu while waiting for %s",
	           aps_msg_type_name(m->type), m->tensor_id, (unsigned long long)m->step, w->what);
	return 0;
}

int aps_client_await(struct aps_client *c, const struct client_wait *w, int timeout_ms,
                     const uint8_t **payload, size_t *payload_len)
{
	int64_t deadline = now_ms() + timeout_ms, next_hb = now_ms() + c->heartbeat_ms;
	static _Thread_local struct aps_msg last_hb;
	bool have_hb = false;
	struct aps_rxmsg rx;

	for (;;) {
		int64_t now = now_ms(), wait = (deadline < next_hb ? deadline : next_hb) - now;
		int got = aps_transport_recv(c->tr, wait > 0 ? (int)wait : 0, &rx);
		if (got < 0)
			return aps_api_fail(APS_ECONN, "receive from %s failed: %s", c->endpoint,
			                    aps_transport_strerror());
		if (got > 0) {
			int ret = consider(c, w, &rx, &last_hb, &have_hb);
			if (ret < 0)
				return ret;
			if (ret > 0) {
				*payload = rx.payload;
				*payload_len = rx.payload_len;
				return 0;
			}
		}
		now = now_ms();
		if (now >= deadline)
			return timed_out(c, w, have_hb ? &last_hb : NULL, timeout_ms);
		if (now >= next_hb) {
			client_log(c, 3, "%s: still waiting after %lld ms", w->what,
			           (long long)(now - deadline + timeout_ms));
			heartbeat(c, w);
			next_hb = now + c->heartbeat_ms;
		}
	}
}

static int check_opts(const struct aps_client_opts *o, struct aps_format *fmt,
                      struct aps_format *down)
{
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
	if (o->scaling != APS_SCALING_MODE_NONE && o->scaling != APS_SCALING_MODE_LOCAL)
		return aps_api_fail(APS_EINVAL,
		                    "scaling %d: only none (0) and local (1) are "
		                    "served in this release",
		                    o->scaling);
	if (o->timeout_ms <= 0 || o->heartbeat_ms <= 0)
		return aps_api_fail(APS_EINVAL, "timeout_ms and heartbeat_ms must be positive");
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
	c->log = o->log;
	c->log_ctx = o->log_ctx;
	aps_msg_limits_init(&c->limits);
	c->limits.from_server = true;
}

static int hello(struct aps_client *c, const struct aps_client_opts *o)
{
	struct client_wait w = { .type = APS_MSG_WELCOME, .what = "joining the job" };
	const uint8_t *payload;
	size_t len;
	struct aps_msg m;
	int ret;

	aps_client_msg(c, &m, APS_MSG_HELLO);
	m.scaling = (int)c->scaling;
	if (o->downlink != NULL && strcmp(o->downlink, "auto") != 0)
		snprintf(m.format, sizeof(m.format), "%s", o->downlink);
	ret = aps_client_send(c, &m, NULL, 0);
	if (ret == 0)
		ret = aps_client_await(c, &w, c->timeout_ms, &payload, &len);
	return ret;
}

int aps_client_new(aps_client **out, const struct aps_client_opts *o)
{
	struct aps_format fmt, down;
	struct aps_client *c;
	int ret = check_opts(o, &fmt, &down);

	if (ret < 0)
		return ret;
	if (out == NULL)
		return aps_api_fail(APS_EINVAL, "out is NULL");
	c = calloc(1, sizeof(*c));
	if (c == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	copy_opts(c, o, &fmt);
	if (aps_transport_open(&c->tr, o->endpoint, c->heartbeat_ms) < 0) {
		free(c);
		return aps_api_fail(APS_ECONN, "cannot connect to '%.200s': %s", o->endpoint,
		                    aps_transport_strerror());
	}
	ret = hello(c, o);
	if (ret < 0) {
		aps_transport_close(c->tr, 0);
		free(c);
		return ret;
	}
	*out = c;
	return aps_api_ok();
}

static int add_tensor(struct aps_client *c, uint32_t id, const char *name, uint64_t count)
{
	if (id >= c->n_tensors) {
		struct client_tensor *t = realloc(c->tensors, (id + 1) * sizeof(*t));
		if (t == NULL)
			return aps_api_fail(APS_ENOMEM, "out of memory");
		memset(t + c->n_tensors, 0, (id + 1 - c->n_tensors) * sizeof(*t));
		c->tensors = t;
		c->n_tensors = id + 1;
	}
	snprintf(c->tensors[id].name, sizeof(c->tensors[id].name), "%s", name);
	c->tensors[id].count = count;
	c->tensors[id].registered = true;
	return 0;
}

int aps_client_register(aps_client *c, const char *name, uint64_t count, uint32_t *tensor_id)
{
	struct client_wait w = { .type = APS_MSG_REGISTERED, .by_name = true, .name = name };
	char what[300];
	const uint8_t *payload;
	size_t len;
	struct aps_msg m;
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	if (name == NULL || name[0] == '\0' || strlen(name) > APS_MSG_NAME_MAX || count == 0 ||
	    tensor_id == NULL)
		return aps_api_fail(APS_EINVAL,
		                    "a tensor needs a name of 1 to %d bytes, a count "
		                    "of at least 1 and an id pointer",
		                    APS_MSG_NAME_MAX);
	snprintf(what, sizeof(what), "registering '%.200s'", name);
	w.what = what;
	aps_client_msg(c, &m, APS_MSG_REGISTER);
	snprintf(m.tensor_name, sizeof(m.tensor_name), "%s", name);
	m.total_count = count;
	snprintf(m.format, sizeof(m.format), "%s", c->format.name);
	ret = aps_client_send(c, &m, NULL, 0);
	if (ret == 0)
		ret = aps_client_await(c, &w, c->timeout_ms, &payload, &len);
	if (ret < 0)
		return ret;
	ret = add_tensor(c, c->reply.tensor_id, name, count);
	if (ret < 0)
		return ret;
	*tensor_id = c->reply.tensor_id;
	return aps_api_ok();
}

int aps_client_close(aps_client *c)
{
	struct aps_msg bye;

	if (c == NULL)
		return 0;
	if (c->pid == getpid()) {
		aps_client_msg(c, &bye, APS_MSG_BYE);
		aps_client_send(c, &bye, NULL, 0);
		aps_transport_close(c->tr, 1000);
	}
	free(c->tensors);
	free(c->scratch);
	free(c);
	return 0;
}
