/*
 * What every part of the client does with its connection (client_impl.h):
 * the clock, the log, the identity of its messages, sending one, queueing a
 * call for the I/O thread, ending calls. The I/O thread, its recovery
 * (resume.c, rejoin.c) and the calls (request.c) build on it.
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

#define HEADER_MAX 4096 /* bytes of a header frame the client packs */

int64_t aps_client_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void aps_client_log(const struct aps_client *c, int level, const char *fmt, ...)
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

int aps_client_check(const struct aps_client *c)
{
	if (c == NULL)
		return aps_api_fail(APS_EINVAL, "client is NULL");
	if (c->pid != getpid())
		return aps_api_fail(APS_ECLOSED,
		                    "the client was created by process %d, not this one: create a "
		                    "client after fork()",
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

int aps_client_send(struct aps_client *c, struct aps_msg *m, struct aps_sbuf *buf,
                    const uint8_t *data, size_t len)
{
	uint8_t hdr[HEADER_MAX];
	size_t hdr_len;
	int ret;

	m->payload = data;
	m->payload_len = data != NULL ? len : 0;
	if (aps_msg_pack(m, hdr, sizeof(hdr), &hdr_len) < 0)
		return APS_EINVAL;
	/* A larger frame would close the connection: apsd's max_message_bytes. */
	if (c->max_message_bytes > 0 &&
	    (len > c->max_message_bytes || hdr_len > c->max_message_bytes))
		return APS_ERANGE;
	c->last_sent_ms = aps_client_now_ms();
	/* No connection now: what would go now goes again when the session is back. */
	if (c->send_lost != NULL || !aps_transport_connected(c->tr))
		return 0;
	if (data != NULL)
		ret = aps_transport_send_shared(c->tr, hdr, hdr_len, buf, data, len);
	else
		ret = aps_transport_send(c->tr, hdr, hdr_len, NULL, 0, false);
	/* A joined client's calls go again on a new connection: they do not fail;
	 * resume.c renews it before the I/O thread next waits. */
	if (ret < 0 && c->has_session) {
		c->send_lost = "a send to apsd did not go";
		return 0;
	}
	return ret;
}

int aps_client_wake(struct aps_client *c)
{
	uint64_t one = 1;

	return write(c->wake_fd, &one, sizeof(one)) < 0 ? APS_ESYS : 0;
}

void aps_client_enqueue(struct aps_client *c, struct aps_request *r)
{
	struct aps_request **tail = &c->queue;

	r->next = NULL;
	while (*tail != NULL)
		tail = &(*tail)->next;
	*tail = r;
	c->calls++;
}

void aps_request_finish_locked(struct aps_client *c, struct aps_request *r, int result,
                               const char *text)
{
	r->result = result;
	snprintf(r->error, sizeof(r->error), "%s", text != NULL ? text : "");
	if (!r->done)
		c->calls--;
	r->done = true;
	if (r->kind == REQ_ALLREDUCE || r->kind == REQ_BROADCAST || r->kind == REQ_PULL) {
		struct client_tensor *t = &c->tensors[r->tensor_id];
		if (!r->coding)
			t->busy = NULL;
		if (result == 0 && r->kind != REQ_PULL)
			t->step++;
		if (result == 0 && r->codes != NULL) { /* every chunk went: the next call's */
			aps_sbuf_unref(t->spare);
			t->spare = r->codes;
			r->codes = NULL;
		}
	}
	pthread_cond_broadcast(&c->done_cv);
}

struct aps_request *aps_client_take_active(struct aps_client *c)
{
	struct aps_request *list = c->active;

	for (struct aps_request *r = list; r != NULL; r = r->next)
		r->in_active = false;
	c->active = NULL;
	if (c->active_ids != NULL)
		memset(c->active_ids, 0, c->n_active_ids * sizeof(*c->active_ids));
	return list;
}

/* Fails every active request; with none, a job-wide error waits for the next call. */
static void fail_all(struct aps_client *c, int code, const char *text, bool fatal)
{
	pthread_mutex_lock(&c->lock);
	if (fatal && c->fatal == 0) {
		c->fatal = code;
		snprintf(c->fatal_text, sizeof(c->fatal_text), "%s", text);
	} else if (!fatal && c->active == NULL && c->pending == 0) {
		c->pending = code;
		snprintf(c->pending_text, sizeof(c->pending_text), "%s", text);
	}
	for (struct aps_request *r = aps_client_take_active(c), *next; r != NULL; r = next) {
		next = r->next;
		aps_request_finish_locked(c, r, code, text);
	}
	/* For good: what callers queued meanwhile will never be sent either. */
	while (fatal && c->queue != NULL) {
		struct aps_request *r = c->queue;
		c->queue = r->next;
		aps_request_finish_locked(c, r, code, text);
	}
	pthread_mutex_unlock(&c->lock);
}

void aps_client_fail_calls(struct aps_client *c, int code, const char *text)
{
	fail_all(c, code, text, false);
}

void aps_client_fail_for_good(struct aps_client *c, int code, const char *text)
{
	fail_all(c, code, text, true);
}

void aps_request_free(struct aps_request *r)
{
	aps_sbuf_unref(r->codes);
	free(r->flushed);
	free(r->got);
	free(r->corrected);
	free(r);
}
