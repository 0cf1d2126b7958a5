/*
 * A call's messages to apsd (client_impl.h): the data chunks of an all-reduce
 * or broadcast (those whose answer has arrived are not sent again), a
 * REGISTER or BARRIER, global mode's EXPONENTS, a PULL. The I/O thread sends
 * them when a call starts, resume.c again after a reconnect.
 */
#include "worker/client_impl.h"

#include "common/codec.h"
#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Chunk i of r, a coded one. */
static int send_chunk(struct aps_client *c, struct aps_request *r, uint32_t i)
{
	size_t off, n, len, at = aps_request_chunk(r, i, &off, &n, &len);
	struct aps_msg m;

	aps_client_msg(c, &m, r->kind == REQ_BROADCAST ? APS_MSG_BROADCAST : APS_MSG_PUSH);
	m.tensor_id = r->tensor_id;
	m.step = r->step;
	m.chunk_offset = off;
	m.chunk_count = n;
	m.total_count = r->count;
	m.scale_exp = r->scale_exp;
	if (r->update) {
		m.flags |= APS_MSG_FLAG_UPDATE;
		m.lr = r->lr;
	}
	if (r->codes == NULL)
		return aps_client_send(c, &m, NULL, NULL, 0) < 0 ? APS_ECONN : 0;
	m.flushed = r->flushed[i]; /* apsd sums the chunks' counts */
	if (c->no_crc)
		m.flags |= APS_MSG_FLAG_NO_CRC;
	snprintf(m.format, sizeof(m.format), "%s", r->fmt.name);
	m.block_size = r->block;
	return aps_client_send(c, &m, r->codes, r->codes->data + at, len) < 0 ? APS_ECONN : 0;
}

/* Chunks [from, coded) of r, less those answered already. */
static int send_chunks(struct aps_client *c, struct aps_request *r, uint32_t from)
{
	uint32_t ready;

	r->chunks = aps_request_chunks(r);
	if (r->got == NULL && (r->got = calloc(r->chunks, 1)) == NULL)
		return APS_ENOMEM;
	/* A broadcast's non-root asks for every chunk; codes are ready as they are coded. */
	ready = r->codes == NULL ? r->chunks
	                         : atomic_load_explicit(&r->encoded, memory_order_acquire);
	if (from == 0)
		r->push_ns = c->trace != NULL ? aps_trace_now() : 0;
	for (uint32_t i = from; i < ready; i++) {
		r->got[i] &= ~CHUNK_ASKED; /* a new connection may decline it again */
		if (!(r->got[i] & CHUNK_ANSWERED) && send_chunk(c, r, i) < 0)
			return APS_ECONN;
	}
	if (from < ready)
		r->sent = ready;
	if (r->sent == r->chunks && from < ready) {
		aps_trace_stage(c->trace, "push", r->push_ns,
		                &(struct aps_trace_at){ c->job, r->name, r->step, r->chunks });
		r->sent_ns = aps_trace_now();
	}
	return 0;
}

int aps_outbox_chunks(struct aps_client *c, struct aps_request *r)
{
	return send_chunks(c, r, 0);
}

int aps_outbox_more(struct aps_client *c, struct aps_request *r)
{
	return send_chunks(c, r, r->sent);
}

int aps_outbox_chunk_again(struct aps_client *c, struct aps_request *r, uint32_t chunk)
{
	if (r->got == NULL || chunk >= r->sent || (r->got[chunk] & CHUNK_ANSWERED))
		return 0; /* not sent yet, or answered: nothing to send again */
	/* apsd takes a push whose turn has come, so it asks for a chunk once; a
	 * daemon that asks again would have this client send it without end. */
	if (r->got[chunk] & CHUNK_ASKED)
		return APS_OUTBOX_ASKED_BEFORE;
	r->got[chunk] |= CHUNK_ASKED;
	return send_chunk(c, r, chunk);
}

int aps_outbox_simple(struct aps_client *c, struct aps_request *r)
{
	struct aps_msg m;

	aps_client_msg(c, &m, r->kind == REQ_BARRIER ? APS_MSG_BARRIER : APS_MSG_REGISTER);
	if (r->kind == REQ_BARRIER) {
		m.step = r->step;
	} else {
		snprintf(m.tensor_name, sizeof(m.tensor_name), "%s", r->name);
		m.total_count = r->count;
		snprintf(m.format, sizeof(m.format), "%s", r->reg_fmt.name);
	}
	return aps_client_send(c, &m, NULL, NULL, 0);
}

/* Global mode: one EXPONENTS for every request of this wake-up (at most 256 a message). */
int aps_outbox_exponents(struct aps_client *c, struct aps_request **batch, uint32_t n)
{
	struct aps_msg m;

	for (uint32_t i = 0; i < n; i += APS_MSG_LIST_MAX) {
		aps_client_msg(c, &m, APS_MSG_EXPONENTS);
		for (uint32_t j = i; j < n && j < i + APS_MSG_LIST_MAX; j++) {
			int32_t e = batch[j]->exponent;
			m.tensor_ids[m.n_tensor_ids] = batch[j]->tensor_id;
			m.exponents[m.n_tensor_ids++] =
			        e == APS_SCALE_ZERO_EXPONENT ? WIRE_ZERO_EXPONENT : e;
		}
		m.n_exponents = m.n_tensor_ids;
		if (aps_client_send(c, &m, NULL, NULL, 0) < 0)
			return APS_ECONN;
	}
	return 0;
}

/* Optimize mode: asks for the master weights, answered in chunks of the daemon's size. */
int aps_outbox_pull(struct aps_client *c, struct aps_request *r)
{
	struct aps_msg m;

	r->chunks = aps_request_chunks(r);
	if (r->got == NULL && (r->got = calloc(r->chunks, 1)) == NULL)
		return APS_ENOMEM;
	aps_client_msg(c, &m, APS_MSG_PULL);
	m.tensor_id = r->tensor_id;
	return aps_client_send(c, &m, NULL, NULL, 0);
}
