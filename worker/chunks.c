/*
 * A call's chunks and their codes: where each chunk lies in the codes sent and
 * in the codes kept as a result, the buffer of the codes, and the coding of
 * the caller's floats with error feedback (on the caller's thread, over the
 * client's codec pool, or on the I/O thread once global mode's exponent is
 * known).
 */
#include "worker/client_impl.h"

#include "common/codec.h"

#include <stdlib.h>
#include <string.h>

size_t aps_request_chunk(const struct aps_request *r, uint32_t i, size_t *off, size_t *n,
                         size_t *len)
{
	size_t per = r->chunk_elems ? r->chunk_elems : r->count;

	*off = (size_t)i * per;
	*n = r->count - *off < per ? r->count - *off : per;
	*len = aps_codec_payload_size(&r->fmt, *n, r->block);
	/* Every chunk before this one has per elements (a multiple of 8: whole bytes). */
	return (size_t)i * aps_codec_payload_size(&r->fmt, per, r->block);
}

uint32_t aps_request_chunks(const struct aps_request *r)
{
	size_t per = r->chunk_elems ? r->chunk_elems : r->count;

	return per == 0 ? 1 : (uint32_t)((r->count + per - 1) / per);
}

/* Error feedback: the residual is what chunk i's quantization lost, for the next step. */
static void keep_residual(struct aps_request *r, uint32_t i)
{
	size_t off, n, len;
	size_t at = aps_request_chunk(r, i, &off, &n, &len);
	float *residual = r->residual + off;
	const float *sent = r->corrected + off;

	aps_codec_decode_payload(&r->fmt, r->codes->data + at, len, n, r->scale_exp, r->block,
	                         residual, false);
	for (size_t k = 0; k < n; k++)
		residual[k] = sent[k] - residual[k];
}

uint64_t aps_request_encode_chunk(struct aps_request *r, uint32_t i)
{
	struct aps_quant_opts o = { .scale_exp = r->scale_exp };
	struct aps_codec_stats st;
	size_t off, n, len;
	size_t at = aps_request_chunk(r, i, &off, &n, &len);

	o.index0 = off;
	aps_codec_encode_payload(&r->fmt, r->src + off, n, r->block, &o, r->codes->data + at, len,
	                         &st);
	if (r->corrected != NULL)
		keep_residual(r, i);
	return st.flushed;
}

/* codec_threads: chunks [from, to) in parts over the client's pool, the caller's thread too. */
struct encode_parts {
	struct aps_request *r;
	uint32_t from, to, parts;
};

static void encode_part(void *ctx, size_t part)
{
	struct encode_parts *e = ctx;

	for (uint32_t i = e->from + (uint32_t)part; i < e->to; i += e->parts)
		e->r->flushed[i] = aps_request_encode_chunk(e->r, i);
}

void aps_request_encode_chunks(struct aps_client *c, struct aps_request *r, uint32_t from,
                               uint32_t to)
{
	if (c->pool != NULL && to - from > 1) {
		struct encode_parts e = { r, from, to,
			                  to - from < c->codec_threads ? to - from
			                                               : c->codec_threads };
		aps_pool_run(c->pool, e.parts, encode_part, &e);
	} else {
		for (uint32_t i = from; i < to; i++)
			r->flushed[i] = aps_request_encode_chunk(r, i);
	}
	atomic_store_explicit(&r->encoded, to, memory_order_release);
}

/* A wake-up of the I/O thread or of the pool costs a few microseconds: one per
 * STREAM_ELEMS elements a thread codes, at least one chunk per thread. */
#define STREAM_ELEMS (1u << 16)

uint32_t aps_request_stream_batch(const struct aps_client *c, const struct aps_request *r)
{
	size_t per = r->chunk_elems ? r->chunk_elems : r->count;
	uint32_t each = per >= STREAM_ELEMS ? 1 : (uint32_t)(STREAM_ELEMS / per);

	return each * c->codec_threads;
}

int aps_request_alloc_codes(struct aps_client *c, struct aps_request *r)
{
	uint32_t chunks = aps_request_chunks(r);
	size_t off, n, len, at;
	struct aps_sbuf *spare;

	r->block = (uint32_t)aps_codec_payload_block(&r->fmt, c->block);
	at = aps_request_chunk(r, chunks - 1, &off, &n, &len);
	pthread_mutex_lock(&c->lock);
	spare = c->tensors[r->tensor_id].spare;
	c->tensors[r->tensor_id].spare = NULL;
	pthread_mutex_unlock(&c->lock);
	/* The last call's codes, unless ZeroMQ still holds a chunk of them. */
	if (spare != NULL && spare->len == at + len &&
	    atomic_load_explicit(&spare->refs, memory_order_acquire) == 1) {
		r->codes = spare;
	} else {
		aps_sbuf_unref(spare);
		r->codes = aps_sbuf_new(at + len);
	}
	r->flushed = calloc(chunks, sizeof(*r->flushed));
	atomic_store_explicit(&r->encoded, 0, memory_order_relaxed);
	return r->codes != NULL && r->flushed != NULL ? 0 : APS_ENOMEM;
}

int aps_request_encode(struct aps_client *c, struct aps_request *r)
{
	uint64_t t0 = c->trace != NULL ? aps_trace_now() : 0;

	if (aps_request_alloc_codes(c, r) < 0)
		return APS_ENOMEM;
	aps_request_encode_chunks(c, r, 0, aps_request_chunks(r));
	aps_trace_stage(c->trace, "quantize", t0,
	                &(struct aps_trace_at){ c->job, r->name, r->step, 0 });
	return 0;
}

bool aps_request_unsent(const struct aps_request *r)
{
	return r->codes != NULL &&
	       atomic_load_explicit(&r->encoded, memory_order_acquire) > r->sent;
}

int aps_request_take_codes(struct aps_request *r, const struct aps_msg *m, uint32_t chunk)
{
	size_t per = r->chunk_elems ? r->chunk_elems : r->count;
	size_t len = aps_codec_payload_size(&r->out_fmt, m->chunk_count, r->out_block);
	uint64_t at = (uint64_t)chunk * aps_codec_payload_size(&r->out_fmt, per, r->out_block);

	if (strcmp(m->fmt.name, r->out_fmt.name) != 0 || m->block_size != r->out_block ||
	    (m->flags & APS_MSG_FLAG_LOWP_SUM) || m->payload_len != len || at + len > r->out_len)
		return APS_EPROTO;
	memcpy(r->out_codes + at, m->payload, len);
	r->out_exps[chunk] = m->scale_exp;
	return 0;
}
