/*
 * The client's I/O thread: the only user of the socket once the client has
 * joined, but for a caller that waits for its lone call and does the thread's
 * work itself meanwhile (aps_client_drive: the I/O role). It takes new
 * requests from the queue and sends them (a tensor in chunks of the daemon's
 * size; global-mode exponents batched into one EXPONENTS per wake-up), matches
 * every reply to its request, decodes results into the caller's buffer chunk
 * by chunk, heartbeats for requests that wait, and fails those whose deadline
 * passed without progress.
 */
#include "worker/client_impl.h"

#include "common/codec.h"
#include "common/err.h"
#include "common/rules.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_WAIT_MS 1000
/* Calls in flight that ask apsd what they wait for (HEARTBEAT), every heartbeat_ms:
 * the oldest, which time out first, and barriers. Every call asked before: 20000
 * calls in flight sent 20000 heartbeats a second, each answer found its call by a
 * walk of the list, and apsd's answers dropped the rank as a slow reader
 * (2026-12-08). */
#define HEARTBEAT_CALLS 32
/* Messages read per turn of the loop, and batches read before a close. */
#define RECV_BATCH    256
#define CLOSE_BATCHES 16

static void describe(const struct aps_request *r, char *buf, size_t len)
{
	static const char *const kinds[] = { "registering", "all-reduce of", "broadcast of",
		                             "barrier", "pull of" };

	if (r->kind == REQ_BARRIER)
		snprintf(buf, len, "barrier %llu", (unsigned long long)r->step);
	else if (r->kind == REQ_REGISTER)
		snprintf(buf, len, "registering '%.200s'", r->name);
	else
		snprintf(buf, len, "%s '%.200s' step %llu", kinds[r->kind], r->name,
		         (unsigned long long)r->step);
}

/* Calls of a tensor: indexed by its id (c->active_ids). */
static bool of_a_tensor(const struct aps_request *r)
{
	return r->kind == REQ_ALLREDUCE || r->kind == REQ_BROADCAST || r->kind == REQ_PULL;
}

static void index_active(struct aps_client *c, struct aps_request *r)
{
	if (!of_a_tensor(r) || r->tensor_id >= (1u << 22)) /* ids a daemon gave: not trusted */
		return;
	if (r->tensor_id >= c->n_active_ids) {
		size_t n = c->n_active_ids ? c->n_active_ids : 64;
		while (n <= r->tensor_id)
			n *= 2;
		struct aps_request **grown = realloc(c->active_ids, n * sizeof(*grown));
		if (grown == NULL)
			return; /* find() walks the list */
		memset(grown + c->n_active_ids, 0, (n - c->n_active_ids) * sizeof(*grown));
		c->active_ids = grown;
		c->n_active_ids = (uint32_t)n;
	}
	c->active_ids[r->tensor_id] = r;
}

static void unlink_active(struct aps_client *c, struct aps_request *r)
{
	if (!r->in_active)
		return;
	if (r->prev != NULL)
		r->prev->next = r->next;
	else
		c->active = r->next;
	if (r->next != NULL)
		r->next->prev = r->prev;
	r->in_active = false;
	if (of_a_tensor(r) && r->tensor_id < c->n_active_ids && c->active_ids[r->tensor_id] == r)
		c->active_ids[r->tensor_id] = NULL;
}

/* Ends an active request: out of the active list, then done for its waiter. */
static void finish(struct aps_client *c, struct aps_request *r, int result, const char *text)
{
	unlink_active(c, r);
	pthread_mutex_lock(&c->lock);
	aps_request_finish_locked(c, r, result, text);
	pthread_mutex_unlock(&c->lock);
}

static void activate(struct aps_client *c, struct aps_request *r, enum request_state state)
{
	int64_t now = aps_client_now_ms();

	r->state = state;
	r->deadline_ms = now + r->timeout_ms;
	r->next_heartbeat_ms = now + c->heartbeat_ms;
	r->asked = false;
	r->prev = NULL;
	r->next = c->active;
	if (c->active != NULL)
		c->active->prev = r;
	c->active = r;
	r->in_active = true;
	index_active(c, r);
	if (r->next_heartbeat_ms < c->calls_due_ms || r->deadline_ms < c->calls_due_ms)
		c->calls_due_ms = r->next_heartbeat_ms < r->deadline_ms ? r->next_heartbeat_ms
		                                                        : r->deadline_ms;
}

static int start_one(struct aps_client *c, struct aps_request *r, bool *exchange)
{
	*exchange = false;
	if (r->kind == REQ_PULL) {
		activate(c, r, REQ_SENT);
		return aps_outbox_pull(c, r);
	}
	if (r->kind == REQ_REGISTER || r->kind == REQ_BARRIER) {
		if (r->kind == REQ_BARRIER)
			r->step = c->barrier_step++;
		activate(c, r, REQ_SENT);
		return aps_outbox_simple(c, r);
	}
	if (r->kind == REQ_ALLREDUCE && (r->codes == NULL || r->reexchange)) {
		activate(c, r, REQ_EXCHANGE);
		*exchange = true;
		return 0;
	}
	activate(c, r, REQ_SENT);
	return aps_outbox_chunks(c, r);
}

/* The chunks that callers coded since the last wake-up (request.c stream). */
static void send_coded(struct aps_client *c)
{
	struct aps_request *r, *next;

	if (!atomic_exchange_explicit(&c->coded, false, memory_order_acq_rel))
		return;
	for (r = c->active; r != NULL; r = next) {
		next = r->next;
		if (r->state == REQ_SENT && aps_request_unsent(r) && aps_outbox_more(c, r) < 0)
			finish(c, r, APS_ECONN, "send to the daemon failed");
	}
}

/* Sends what the callers queued or coded since the last wake-up; false once closing. */
static bool start_new(struct aps_client *c)
{
	struct aps_request *r, *next, **batch = NULL;
	uint32_t n = 0, cap = 0;
	bool stopping, exchange;

	pthread_mutex_lock(&c->lock);
	r = c->rejoining ? NULL : c->queue; /* calls wait while the client joins again */
	if (r != NULL)
		c->queue = NULL;
	stopping = c->stopping;
	/* A job-wide error that came while these were queued is theirs. */
	for (; r != NULL && c->pending < 0; r = next) {
		next = r->next;
		aps_request_finish_locked(c, r, c->pending, c->pending_text);
		if (next == NULL)
			c->pending = 0;
	}
	pthread_mutex_unlock(&c->lock);
	for (; r != NULL; r = next) {
		next = r->next;
		if (start_one(c, r, &exchange) < 0)
			finish(c, r, APS_ECONN, "send to the daemon failed");
		if (!exchange)
			continue;
		if (n == cap) {
			uint32_t bigger = cap ? 2 * cap : 64;
			struct aps_request **grown = realloc(batch, bigger * sizeof(*batch));
			if (grown == NULL) {
				finish(c, r, APS_ENOMEM, "out of memory");
				continue;
			}
			batch = grown;
			cap = bigger;
		}
		batch[n++] = r;
	}
	if (n > 0 && aps_outbox_exponents(c, batch, n) < 0)
		aps_client_fail_calls(c, APS_ECONN, "send to the daemon failed");
	free(batch);
	send_coded(c);
	return !stopping;
}

static struct aps_request *find(struct aps_client *c, enum request_kind kind, uint32_t tensor_id,
                                uint64_t step)
{
	struct aps_request *hit = kind != REQ_BARRIER && tensor_id < c->n_active_ids
	                                  ? c->active_ids[tensor_id]
	                                  : NULL;

	/* the newest call of the tensor, as the walk below finds first */
	if (hit != NULL && hit->kind == kind && (kind == REQ_PULL || hit->step == step))
		return hit;
	for (struct aps_request *r = c->active; r != NULL; r = r->next) {
		if (r->kind != kind)
			continue;
		if (kind == REQ_PULL && r->tensor_id == tensor_id)
			return r; /* a pull has no step: one at a time per tensor */
		if (kind == REQ_BARRIER ? r->step == step
		                        : r->tensor_id == tensor_id && r->step == step)
			return r;
	}
	return NULL;
}

/*
 * An unasked REGISTERED: this rank is back in an elastic job, and apsd says
 * at which step the tensor goes on.
 */
static void resync_step(struct aps_client *c, const struct aps_msg *m)
{
	pthread_mutex_lock(&c->lock);
	if (m->tensor_id < c->n_tensors && c->tensors[m->tensor_id].busy == NULL &&
	    strcmp(c->tensors[m->tensor_id].name, m->tensor_name) == 0) {
		struct client_tensor *t = &c->tensors[m->tensor_id];
		t->step = m->step;
		if (m->format[0] != '\0')
			t->format = m->fmt; /* the policy may have moved it */
	}
	pthread_mutex_unlock(&c->lock);
}

static void on_registered(struct aps_client *c, const struct aps_msg *m)
{
	struct aps_request *r = c->active;

	while (r != NULL && !(r->kind == REQ_REGISTER && strcmp(r->name, m->tensor_name) == 0))
		r = r->next;
	if (r == NULL && c->rejoining)
		return aps_rejoin_on_message(c, m);
	if (r == NULL)
		return resync_step(c, m);
	pthread_mutex_lock(&c->lock);
	if (m->tensor_id >= c->n_tensors) {
		struct client_tensor *t = realloc(c->tensors, (m->tensor_id + 1) * sizeof(*t));
		if (t == NULL) {
			pthread_mutex_unlock(&c->lock);
			return finish(c, r, APS_ENOMEM, "out of memory");
		}
		memset(t + c->n_tensors, 0, (m->tensor_id + 1 - c->n_tensors) * sizeof(*t));
		c->tensors = t;
		c->n_tensors = m->tensor_id + 1;
	}
	struct client_tensor *t = &c->tensors[m->tensor_id];
	snprintf(t->name, sizeof(t->name), "%s", m->tensor_name);
	t->count = m->total_count;
	t->chunk_elems = m->chunk_count ? m->chunk_count : m->total_count;
	t->updates = m->updates;
	t->format = m->format[0] != '\0' ? m->fmt : c->format;
	t->step = m->step; /* 0, unless the job went on while this rank was away */
	r->tensor_id = m->tensor_id;
	pthread_mutex_unlock(&c->lock);
	finish(c, r, 0, NULL);
}

/* The daemon's precision policy moved the tensor: every rank switches at the next step. */
static void switch_format(struct aps_client *c, const struct aps_request *r,
                          const struct aps_format *f)
{
	pthread_mutex_lock(&c->lock);
	c->tensors[r->tensor_id].format = *f;
	pthread_mutex_unlock(&c->lock);
	aps_client_log(c, 2, "tensor '%s' travels in %s from step %llu", r->name, f->name,
	               (unsigned long long)r->step + 1);
}

/* The index of the chunk m answers: false when m is not one of r's chunks. */
static bool chunk_of(const struct aps_request *r, const struct aps_msg *m, uint32_t *chunk)
{
	size_t per = r->chunk_elems ? r->chunk_elems : r->count;

	if (r->got == NULL || per == 0 || m->chunk_offset % per != 0)
		return false;
	*chunk = (uint32_t)(m->chunk_offset / per);
	/* Every chunk whole: a short one would leave the rest of it unwritten. */
	return *chunk < r->chunks &&
	       m->chunk_count ==
	               (r->count - m->chunk_offset < per ? r->count - m->chunk_offset : per);
}

/* Chunk m of r's result into the caller's buffers: NULL, or why it does not fit. */
static const char *store_result(const struct aps_client *c, struct aps_request *r,
                                const struct aps_msg *m, uint32_t chunk)
{
	float *out;

	if (r->out_codes != NULL) /* a codes call: the caller decodes */
		return aps_request_take_codes(r, m, chunk) < 0
		               ? "a result chunk does not fit the codes call's result layout"
		               : NULL;
	out = r->buf + m->chunk_offset;
	/* Optimize mode: the update is added, exactly as the daemon adds it to its view. */
	if (aps_codec_decode_payload(&m->fmt, m->payload, m->payload_len, m->chunk_count,
	                             m->scale_exp, m->block_size,
	                             r->update ? r->weights + m->chunk_offset : out, r->update) < 0)
		return "a result chunk is too short";
	/* The paper's lowp sum arrives as the sum: the mean is ours to take, in fp32. */
	if (m->flags & APS_MSG_FLAG_LOWP_SUM)
		aps_codec_divide(out, m->chunk_count, (float)c->world_size);
	return NULL;
}

/*
 * A message from apsd that is dropped (bad, or for no call): the first says so
 * at once, then one line a second at most counts the others.
 */
static void drop_noted(struct aps_client *c, int level, const char *fmt, ...)
{
	int64_t now = aps_client_now_ms();
	char line[256];
	va_list ap;

	c->dropped++;
	if (now < c->dropped_next_log_ms)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (c->dropped > 1) /* a line was logged at dropped_next_log_ms - 1000 */
		aps_client_log(c, level, "%s (one of %llu messages dropped in %lld ms)", line,
		               (unsigned long long)c->dropped,
		               (long long)(now - c->dropped_next_log_ms + 1000));
	else
		aps_client_log(c, level, "%s", line);
	c->dropped = 0;
	c->dropped_next_log_ms = now + 1000;
}

/* One chunk of a RESULT (or of a broadcast) into the caller's buffer. */
static void on_result(struct aps_client *c, const struct aps_msg *m)
{
	enum request_kind kind = m->type == APS_MSG_RESULT ? REQ_ALLREDUCE : REQ_BROADCAST;
	struct aps_request *r = find(c, kind, m->tensor_id, m->step);
	const char *wrong;
	uint32_t chunk;

	if (r == NULL) {
		drop_noted(c, 3, "ignored a result for tensor %u step %llu", m->tensor_id,
		           (unsigned long long)m->step);
		return;
	}
	if (m->total_count != r->count || m->chunk_offset + m->chunk_count > r->count ||
	    m->format[0] == '\0' || m->payload == NULL || !chunk_of(r, m, &chunk))
		return finish(c, r, APS_EPROTO, "a result does not match its tensor");
	if (r->got[chunk] & CHUNK_ANSWERED)
		return; /* answered again after a reconnect: it is here already */
	r->got[chunk] |= CHUNK_ANSWERED;
	if (r->update != ((m->flags & APS_MSG_FLAG_UPDATE) != 0) && m->type == APS_MSG_RESULT)
		return finish(c, r, APS_EPROTO, "a result is not the kind the call expects");
	uint64_t t0 = c->trace != NULL ? aps_trace_now() : 0;
	if ((wrong = store_result(c, r, m, chunk)) != NULL)
		return finish(c, r, APS_EPROTO, wrong);
	if (m->next_format[0] != '\0')
		switch_format(c, r, &m->next_fmt);
	aps_trace_stage(
	        c->trace, "dequantize", t0,
	        &(struct aps_trace_at){ c->job, r->name, r->step,
	                                (uint32_t)(m->chunk_offset /
	                                           (r->chunk_elems ? r->chunk_elems : r->count)) });
	r->deadline_ms = aps_client_now_ms() + r->timeout_ms;
	if (++r->chunks_done < r->chunks)
		return;
	aps_trace_stage(c->trace, "wait", r->sent_ns,
	                &(struct aps_trace_at){ c->job, r->name, r->step, r->chunks });
	finish(c, r, 0, NULL);
}

/* Optimize mode: one chunk of the master weights a pull asked for. */
static void on_weights(struct aps_client *c, const struct aps_msg *m)
{
	struct aps_request *r = find(c, REQ_PULL, m->tensor_id, 0);
	uint32_t chunk;

	if (r == NULL)
		return;
	if (m->total_count != r->count || m->chunk_offset + m->chunk_count > r->count ||
	    m->payload == NULL || m->payload_len != m->chunk_count * sizeof(float) ||
	    !chunk_of(r, m, &chunk))
		return finish(c, r, APS_EPROTO, "weights that do not match their tensor");
	if (r->got[chunk] & CHUNK_ANSWERED)
		return;
	r->got[chunk] |= CHUNK_ANSWERED;
	memcpy(r->buf + m->chunk_offset, m->payload, m->payload_len);
	r->step = m->updates; /* what aps_client_pull reports */
	r->deadline_ms = aps_client_now_ms() + r->timeout_ms;
	if (++r->chunks_done == r->chunks)
		finish(c, r, 0, NULL);
}

/*
 * Global mode: r's codes batch by batch, each batch sent while the next is
 * coded. This thread reads no results meanwhile: a tensor of more chunks than
 * half the socket's receive queue (ZeroMQ's RCVHWM, 1000 messages) is coded
 * whole first, as its results would fill the queue and then apsd's outbox.
 */
#define STREAM_CHUNKS_MAX 500

static void encode_and_send(struct aps_client *c, struct aps_request *r)
{
	uint32_t chunks = aps_request_chunks(r);
	uint32_t batch = chunks <= STREAM_CHUNKS_MAX ? aps_request_stream_batch(c, r) : chunks;
	uint64_t t0 = c->trace != NULL ? aps_trace_now() : 0;

	if (aps_request_alloc_codes(c, r) < 0) {
		finish(c, r, APS_ENOMEM, "out of memory for the codes");
		return;
	}
	for (uint32_t i = 0; i < chunks; i += batch) {
		aps_request_encode_chunks(c, r, i, chunks - i < batch ? chunks : i + batch);
		if (aps_outbox_more(c, r) < 0) {
			finish(c, r, APS_ECONN, "send to the daemon failed");
			return;
		}
	}
	aps_trace_stage(c->trace, "quantize", t0,
	                &(struct aps_trace_at){ c->job, r->name, r->step, 0 });
}

/*
 * Global mode: the shared exponents; each waiting tensor encodes and sends. A
 * call that goes again after a rejoin (rejoin.c) sends the codes it has: the
 * ranks' maxima are those of the first exchange, so the exponent is too, and
 * its buffer may hold results already; another exponent means the ranks are
 * not at one step any more.
 */
static void on_scales(struct aps_client *c, const struct aps_msg *m)
{
	char text[APS_CLIENT_ERROR_MAX];

	for (uint32_t i = 0; i < m->n_tensor_ids; i++) {
		struct aps_request *r = c->active;
		int scale_exp;
		while (r != NULL && !(r->state == REQ_EXCHANGE && r->tensor_id == m->tensor_ids[i]))
			r = r->next;
		if (r == NULL)
			continue;
		scale_exp = m->exponents[i] == WIRE_ZERO_EXPONENT
		                    ? 0
		                    : aps_scale_from_global_exponent(&r->fmt, m->exponents[i]);
		r->state = REQ_SENT;
		r->deadline_ms = aps_client_now_ms() + r->timeout_ms;
		if (!r->reexchange) {
			r->scale_exp = scale_exp;
			encode_and_send(c, r);
			continue;
		}
		r->reexchange = false;
		if (scale_exp != r->scale_exp) {
			snprintf(
			        text, sizeof(text),
			        "joined again, the job's ranks agreed on scale exponent %d for '%.100s' "
			        "step %llu where they had agreed on %d: they are not at one step any "
			        "more; start the job again",
			        scale_exp, r->name, (unsigned long long)r->step, r->scale_exp);
			finish(c, r, APS_EMISMATCH, text);
		} else if (aps_outbox_chunks(c, r) < 0) {
			finish(c, r, APS_ECONN, "send to the daemon failed");
		}
	}
}

static void on_heartbeat(struct aps_client *c, const struct aps_msg *m)
{
	bool barrier = strcmp(m->tensor_name, "@barrier") == 0;
	struct aps_request *r = c->active;

	if (m->flags & APS_MSG_FLAG_ALIVE)
		return; /* the answer to a keepalive: apsd lives, that was all */
	for (; r != NULL; r = r->next) {
		if (barrier ? r->kind == REQ_BARRIER && r->step == m->step
		            : r->kind != REQ_BARRIER && r->tensor_id == m->tensor_id &&
		                      r->step == m->step)
			break;
	}
	if (r == NULL)
		return;
	r->n_waiting = m->n_waiting_for < APS_CLIENT_WAITING_MAX ? m->n_waiting_for
	                                                         : APS_CLIENT_WAITING_MAX;
	memcpy(r->waiting, m->waiting_for, r->n_waiting * sizeof(r->waiting[0]));
	r->heard = true;
}

/* apsd did not keep a push that came before a lower rank's (its max_held_bytes):
 * now that push's turn has come, it is sent again. */
static void on_again(struct aps_client *c, const struct aps_msg *m)
{
	struct aps_request *r = find(c, REQ_ALLREDUCE, m->tensor_id, m->step);
	uint32_t chunk;

	if (r == NULL || !chunk_of(r, m, &chunk)) {
		drop_noted(c, 3, "ignored an AGAIN for tensor %u step %llu", m->tensor_id,
		           (unsigned long long)m->step);
		return;
	}
	int sent = aps_outbox_chunk_again(c, r, chunk);
	if (sent == APS_OUTBOX_ASKED_BEFORE)
		drop_noted(c, 3, "ignored an AGAIN for '%.100s' chunk %u: apsd asked for it before",
		           r->name, chunk);
	else if (sent < 0)
		aps_client_log(c, 3,
		               "AGAIN for '%.100s' chunk %u: the connection is down, the "
		               "call goes again when it is back",
		               r->name, chunk);
}

/* The request an ERROR answers, by the type it names (protocol 1.3). */
static struct aps_request *about(struct aps_client *c, const struct aps_msg *m)
{
	switch (m->about_type) {
	case APS_MSG_PUSH:
	case APS_MSG_EXPONENTS:
		return find(c, REQ_ALLREDUCE, m->tensor_id, m->step);
	case APS_MSG_BROADCAST:
		return find(c, REQ_BROADCAST, m->tensor_id, m->step);
	case APS_MSG_PULL:
		return find(c, REQ_PULL, m->tensor_id, 0);
	case APS_MSG_BARRIER:
		return find(c, REQ_BARRIER, 0, m->step);
	case APS_MSG_REGISTER:
		for (struct aps_request *r = c->active; r != NULL; r = r->next) {
			if (r->kind == REQ_REGISTER)
				return r; /* registrations are answered in order */
		}
		return NULL;
	default:
		return NULL;
	}
}

/* An ERROR about one call fails that call; one about the job fails them all. */
static void on_error(struct aps_client *c, const struct aps_msg *m)
{
	struct aps_request *r = NULL;

	if (aps_resume_refused(c, m) || aps_rejoin_on_error(c, m))
		return;

	if (m->error_code != APS_EPEERLOST && m->error_code != APS_EMISMATCH)
		r = about(c, m);
	if (r != NULL)
		finish(c, r, m->error_code, m->error_text);
	else
		aps_client_fail_calls(c, m->error_code, m->error_text);
}

static void on_message(struct aps_client *c, const struct aps_msg *m)
{
	switch (m->type) {
	case APS_MSG_REGISTERED:
		on_registered(c, m);
		break;
	case APS_MSG_RESULT:
	case APS_MSG_BROADCAST:
		on_result(c, m);
		break;
	case APS_MSG_SCALES:
		on_scales(c, m);
		break;
	case APS_MSG_WEIGHTS:
		on_weights(c, m);
		break;
	case APS_MSG_BARRIER: {
		struct aps_request *r = find(c, REQ_BARRIER, 0, m->step);
		if (r != NULL)
			finish(c, r, 0, NULL);
		break;
	}
	case APS_MSG_HEARTBEAT:
		on_heartbeat(c, m);
		break;
	case APS_MSG_ERROR:
		on_error(c, m);
		break;
	case APS_MSG_AGAIN:
		on_again(c, m);
		break;
	case APS_MSG_BYE:
		if (c->rejoin)
			aps_rejoin_begin(c, "apsd is shutting down");
		else
			aps_client_fail_for_good(c, APS_ECONN, "apsd is shutting down");
		break;
	case APS_MSG_WELCOME:
		aps_resume_welcomed(c, m);
		pthread_mutex_lock(&c->lock); /* a restarted apsd may have another downlink */
		c->downlink_fixed = m->format[0] != '\0';
		c->downlink = m->fmt;
		pthread_mutex_unlock(&c->lock);
		if (m->flags & APS_MSG_FLAG_RESUMED)
			aps_resume_calls(c);
		else
			aps_rejoin_on_message(c, m);
		break;
	default:
		aps_client_log(c, 3, "ignored a %s", aps_msg_type_name(m->type));
		break;
	}
}

/*
 * Reads what the socket holds, at most RECV_BATCH messages, so that a peer
 * that floods it cannot keep the loop from its timers (a call's deadline);
 * true if messages may be left.
 */
static bool receive_some(struct aps_client *c)
{
	struct aps_msg_fault fault;
	struct aps_rxmsg rx;
	struct aps_msg m;
	int got, n = 0;

	while (n++ < RECV_BATCH && (got = aps_transport_recv(c->tr, 0, &rx)) > 0) {
		if (got == APS_TRANSPORT_RECV_LOST || got == APS_TRANSPORT_RECV_NOCONN) {
			aps_resume_lost(c, got == APS_TRANSPORT_RECV_LOST
			                           ? "the connection to apsd closed"
			                           : "apsd cannot be reached");
			return false;
		}
		if (got == APS_TRANSPORT_RECV_REFUSED) {
			aps_client_fail_for_good(c, APS_EACCES, aps_transport_refusal(c->tr));
			return false;
		}
		c->last_recv_ms = c->last_msg_ms = aps_client_now_ms();
		if (aps_msg_parse(&c->limits, rx.hdr, rx.hdr_len, rx.payload, rx.payload_len,
		                  rx.payload != NULL, &m, &fault) < 0) {
			drop_noted(c, 1, "bad message from apsd: %s", fault.text);
			continue;
		}
		on_message(c, &m);
	}
	return n > RECV_BATCH;
}

static void timed_out(struct aps_client *c, struct aps_request *r)
{
	char what[240], ranks[96] = "", text[APS_CLIENT_ERROR_MAX + 256];
	size_t used = 0;

	describe(r, what, sizeof(what));
	for (uint32_t i = 0; i < r->n_waiting && used + 12 < sizeof(ranks); i++)
		used += (size_t)snprintf(ranks + used, sizeof(ranks) - used, "%s%u", i ? ", " : "",
		                         r->waiting[i]);
	bool answers = c->last_msg_ms >= r->deadline_ms - r->timeout_ms;

	if (!r->heard && answers && r->asked)
		snprintf(
		        text, sizeof(text),
		        "%s: no progress within %d ms; apsd answers, but not this call's heartbeats "
		        "(its replies to this client waited for the client to read)",
		        what, r->timeout_ms);
	else if (!r->heard && answers)
		snprintf(text, sizeof(text),
		         "%s: no progress within %d ms; apsd answers, and was asked what the %d "
		         "oldest of the calls in flight wait for, not this one",
		         what, r->timeout_ms, HEARTBEAT_CALLS);
	else if (!r->heard)
		snprintf(text, sizeof(text),
		         "%s: no answer from apsd at %.120s within %d ms (is the daemon running?)",
		         what, c->endpoint, r->timeout_ms);
	else
		snprintf(text, sizeof(text),
		         "%s: no progress within %d ms; apsd still waits for %s %s", what,
		         r->timeout_ms, r->n_waiting == 1 ? "rank" : "ranks",
		         used ? ranks : "(none: the result is on its way)");
	finish(c, r, APS_ETIMEDOUT, text);
}

static void heartbeat(struct aps_client *c, struct aps_request *r)
{
	struct aps_msg hb;

	aps_client_msg(c, &hb, APS_MSG_HEARTBEAT);
	hb.tensor_id = r->kind == REQ_BARRIER ? 0 : r->tensor_id;
	hb.step = r->step;
	if (r->kind == REQ_BARRIER)
		snprintf(hb.tensor_name, sizeof(hb.tensor_name), "@barrier");
	aps_client_send(c, &hb, NULL, NULL, 0);
	r->asked = true;
}

/* The calls' deadlines and heartbeats; returns when the next one is due. Only
 * the HEARTBEAT_CALLS oldest calls (the tail of the list, newest first) and
 * barriers ask. */
static int64_t run_calls(struct aps_client *c, int64_t now)
{
	int64_t next = now + MAX_WAIT_MS;
	struct aps_request *r = c->active, *following;
	size_t n = 0, i = 0;

	for (const struct aps_request *q = c->active; q != NULL; q = q->next)
		n++;
	for (; r != NULL; r = following, i++) {
		following = r->next;
		if (now >= r->deadline_ms) {
			timed_out(c, r);
			continue;
		}
		if (now >= r->next_heartbeat_ms) {
			/* a barrier too: it may have a shorter timeout than the oldest calls */
			if (i + HEARTBEAT_CALLS >= n || r->kind == REQ_BARRIER)
				heartbeat(c, r);
			r->next_heartbeat_ms = now + c->heartbeat_ms;
		}
		next = r->deadline_ms < next ? r->deadline_ms : next;
		next = r->next_heartbeat_ms < next ? r->next_heartbeat_ms : next;
	}
	return next;
}

/* Deadlines and heartbeats; returns the milliseconds until the next one is due.
 * The calls are walked only when one is due (a walk a turn of the loop cost 5 %
 * of a rank's CPU with 20000 calls in flight). */
static int run_timers(struct aps_client *c)
{
	int64_t now = aps_client_now_ms(), next;

	if (now >= c->calls_due_ms)
		c->calls_due_ms = run_calls(c, now);
	next = c->calls_due_ms < now + MAX_WAIT_MS ? c->calls_due_ms : now + MAX_WAIT_MS;
	if (c->rejoining) {
		int64_t due = now + aps_rejoin_timers(c, now);
		next = due < next ? due : next;
	}
	int64_t due = now + aps_resume_timers(c, now);
	next = due < next ? due : next;
	return next > now ? (int)(next - now) : 0;
}

/*
 * What a poll of the socket found; false once the loop must end. *woken: the
 * I/O thread must look again when a caller holds the role (a wake-up meant for
 * it was read here, or messages are left on the socket, which its descriptor
 * does not signal again).
 */
static bool handle(struct aps_client *c, int ready, bool *woken)
{
	uint64_t wakeups;

	if (ready < 0) {
		aps_client_fail_for_good(c, APS_ECONN, "the connection to apsd failed");
		return false;
	}
	if (ready & APS_TRANSPORT_WOKEN &&
	    read(c->wake_fd, &wakeups, sizeof(wakeups)) == (ssize_t)sizeof(wakeups))
		*woken = true;
	if (ready & APS_TRANSPORT_REFUSED) {
		aps_client_fail_for_good(c, APS_EACCES, aps_transport_refusal(c->tr));
		return true;
	}
	/* What arrived before the close is read before the socket goes: apsd's
	 * BYE when it stops, results sent just before a reset (the receive
	 * queue holds at most ZeroMQ's RCVHWM of 1000 messages). */
	if (ready & (APS_TRANSPORT_READABLE | APS_TRANSPORT_LOST | APS_TRANSPORT_NOCONN)) {
		int batches =
		        ready & (APS_TRANSPORT_LOST | APS_TRANSPORT_NOCONN) ? CLOSE_BATCHES : 1;
		bool more;
		while ((more = receive_some(c)) && --batches > 0)
			;
		*woken = *woken || more;
	}
	if (ready & APS_TRANSPORT_LOST)
		aps_resume_lost(c, "the connection to apsd closed");
	else if (ready & APS_TRANSPORT_NOCONN)
		aps_resume_lost(c, "apsd cannot be reached");
	return true;
}

/*
 * The I/O thread's wait is quiet when the connection is settled and no call in
 * flight needs it to watch the socket: none, or one lone call that its caller
 * sent and waits for itself (aps_client_drive). It then watches its wake-up
 * and the monitor (the connection's events) but not the socket's messages,
 * and looks at them at least this often (with a lone call, without): a lone
 * call's reply wakes only its caller. What the socket holds meanwhile (a BYE,
 * a job's error, keepalive answers, the reply of a lone call whose caller
 * computes before it waits) is read at the next look, by a caller, or by
 * aps_request_done.
 */
#define QUIET_LOOK_MS      50
#define QUIET_IDLE_LOOK_MS 250

static bool quiet(struct aps_client *c)
{
	const struct aps_request *r = c->active;
	bool lone_sent;

	if (!c->has_session || c->resuming || c->rejoining || c->renew_due_ms != 0)
		return false;
	if (r == NULL)
		return true;
	if (r->next != NULL || r->state != REQ_SENT)
		return false;
	pthread_mutex_lock(&c->lock);
	lone_sent = !r->coding && c->calls == 1;
	pthread_mutex_unlock(&c->lock);
	return lone_sent;
}

/*
 * The I/O thread's wait, outside the role so that a caller may take it
 * meanwhile: the socket is used only with the role held, while waiting only
 * its descriptors are watched. When they signal while a caller holds the role,
 * the thread waits for the caller to give it back (give_back_role).
 */
static int wait_released(struct aps_client *c, int timeout_ms)
{
	struct pollfd fds[3];
	int ready = aps_transport_poll(c->tr, c->wake_fd, 0), n;
	bool quietly;

	if (ready != 0 || timeout_ms == 0)
		return ready;
	quietly = quiet(c);
	n = aps_transport_pollfds(c->tr, c->wake_fd, !quietly, fds);
	if (quietly) {
		int look_ms = c->active != NULL ? QUIET_LOOK_MS : QUIET_IDLE_LOOK_MS;
		timeout_ms = timeout_ms < look_ms ? timeout_ms : look_ms;
	}
	c->io_sleeps_until_ms = aps_client_now_ms() + timeout_ms;
	atomic_store_explicit(&c->io_quiet, quietly, memory_order_relaxed);
	pthread_mutex_unlock(&c->io_role);
	while (poll(fds, (nfds_t)n, timeout_ms) < 0 && errno == EINTR)
		;
	pthread_mutex_lock(&c->io_role);
	atomic_store_explicit(&c->io_quiet, false, memory_order_relaxed);
	c->io_sleeps_until_ms = 0;
	return aps_transport_poll(c->tr, c->wake_fd, 0);
}

/*
 * A caller gives the role back. An I/O thread asleep on the socket's
 * descriptors would not see what they signalled while the caller used the
 * socket: that is read now (a quiet one looks itself, an awake one reads
 * before it sleeps). The I/O thread is woken where it must look again (a
 * wake-up meant for it was read, a timer of the calls sent meanwhile is due
 * before it wakes, or it waits quietly and must not: a global exponent
 * exchange, a second call, a connection to renew).
 */
static void give_back_role(struct aps_client *c, bool woken)
{
	bool asleep = c->io_sleeps_until_ms != 0, wake = woken;
	bool quietly = asleep && atomic_load_explicit(&c->io_quiet, memory_order_relaxed);
	int ready = asleep && !quietly ? aps_transport_poll(c->tr, c->wake_fd, 0) : 0;

	if (ready != 0 && !handle(c, ready, &wake))
		wake = true;
	if (asleep &&
	    (aps_client_now_ms() + run_timers(c) < c->io_sleeps_until_ms || (quietly && !quiet(c))))
		wake = true;
	pthread_mutex_unlock(&c->io_role);
	if (wake)
		aps_client_wake(c);
}

/*
 * One turn of the I/O loop: what callers queued, what is due, then what came
 * (waiting for it up to the next timer); false once the loop ends. mine: the
 * call of a waiting caller whose turn it is (it holds the role throughout), no
 * wait once that call is done; NULL: the I/O thread's. *woken as handle's.
 */
static bool io_turn(struct aps_client *c, struct aps_request *mine, bool *woken)
{
	int ready, timeout_ms;
	bool done;

	if (!start_new(c))
		return false;
	timeout_ms = run_timers(c);
	if (mine == NULL) {
		ready = wait_released(c, timeout_ms);
	} else {
		pthread_mutex_lock(&c->lock);
		done = mine->done; /* its deadline may have passed just now */
		pthread_mutex_unlock(&c->lock);
		if (done)
			return true;
		ready = aps_transport_poll(c->tr, c->wake_fd, timeout_ms);
	}
	return handle(c, ready, woken);
}

void *aps_client_io_main(void *arg)
{
	struct aps_client *c = arg;
	bool woken = false;

	pthread_mutex_lock(&c->io_role);
	while (io_turn(c, NULL, &woken))
		;
	aps_client_fail_for_good(c, APS_ECLOSED, "the client was closed");
	pthread_mutex_unlock(&c->io_role);
	return NULL;
}

void aps_client_kick(struct aps_client *c)
{
	if (pthread_mutex_trylock(&c->io_role) != 0) {
		aps_client_wake(c); /* the I/O thread is at work: it sends them */
		return;
	}
	give_back_role(c, !start_new(c)); /* closing: the I/O thread ends the loop */
}

/* r is not done and is the only call queued or in flight (lock). */
static bool lone(const struct aps_client *c, const struct aps_request *r)
{
	return !r->done && !r->coding && !c->rejoining && !c->stopping && c->calls == 1;
}

void aps_client_drive(struct aps_client *c, struct aps_request *r)
{
	bool go, unwatched, woken = false;

	pthread_mutex_lock(&c->lock);
	go = lone(c, r);
	unwatched = !go && !r->done;
	pthread_mutex_unlock(&c->lock);
	if (!go) { /* r's replies are the I/O thread's: a quiet one must watch for them */
		if (unwatched && atomic_load_explicit(&c->io_quiet, memory_order_relaxed))
			aps_client_wake(c);
		return;
	}
	/* The I/O thread gives the role up as soon as it waits for the socket. */
	pthread_mutex_lock(&c->io_role);
	while (go) {
		pthread_mutex_lock(&c->lock);
		go = lone(c, r);
		pthread_mutex_unlock(&c->lock);
		if (go && !io_turn(c, r, &woken)) {
			go = false;
			woken = true; /* closing: the I/O thread ends the loop */
		}
	}
	give_back_role(c, woken);
}

void aps_client_look(struct aps_client *c)
{
	bool woken = false;
	int ready;

	if (pthread_mutex_trylock(&c->io_role) != 0)
		return; /* another thread does the I/O */
	if (!start_new(c))
		woken = true; /* closing: the I/O thread ends the loop */
	else if ((ready = aps_transport_poll(c->tr, c->wake_fd, 0)) != 0 &&
	         !handle(c, ready, &woken))
		woken = true;
	give_back_role(c, woken);
}
