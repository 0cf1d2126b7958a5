/*
 * A finished chunk's result (round.h aps_round_finish_chunk and
 * aps_round_finish_async): the mean (or sum, or root's values) transformed and
 * encoded in the downlink format, on the loop thread or on the chunk's engine
 * thread; then the round's books (round.c) move on.
 */
#include "server/round.h"
#include "server/round_impl.h"

#include "common/crc32c.h"
#include "common/err.h"

#include <stdlib.h>
#include <string.h>

static int encode(const float *acc, size_t n, enum aps_scaling scaling, uint32_t block, bool crc,
                  struct aps_round_result *res)
{
	struct aps_quant_opts o = { 0 };
	size_t len;
	int ret;

	res->block = scaling == APS_SCALING_BLOCK ? aps_codec_payload_block(&res->fmt, block) : 0;
	len = aps_codec_payload_size(&res->fmt, n, res->block);
	res->maxabs = aps_codec_maxabs(acc, n);
	if (scaling != APS_SCALING_NONE && res->block == 0 && !aps_format_is_fp32(&res->fmt))
		aps_scale_local(&res->fmt, res->maxabs, &o.scale_exp);
	res->scale_exp = o.scale_exp;
	res->payload = aps_sbuf_new(len);
	if (res->payload == NULL)
		return APS_ENOMEM;
	ret = aps_codec_encode_payload(&res->fmt, acc, n, res->block, &o, res->payload->data, len,
	                               &res->stats);
	if (ret == 0 && crc)
		res->crc = aps_crc32c(0, res->payload->data, len);
	return ret;
}

/* The chunk's squared error (result against the fp32 mean) into res; scratch holds a chunk. */
static void measure_error(const float *mean, size_t n, float *scratch, struct aps_round_result *res)
{
	aps_codec_decode_payload(&res->fmt, res->payload->data, res->payload->len, n,
	                         res->scale_exp, res->block, scratch, false);
	for (size_t i = 0; i < n; i++) {
		double d = (double)scratch[i] - mean[i];
		res->err_num += d * d;
		res->err_den += (double)mean[i] * mean[i];
	}
}

/* The chunk's contribution of the lowest rank that sent one (rank 0 but in elastic jobs). */
static const struct aps_contribution *lowest(const struct aps_round *r, uint32_t chunk)
{
	size_t base = (size_t)chunk * r->world_size;
	uint32_t rank = 0;

	while (rank + 1 < r->world_size && !r->has[base + rank])
		rank++;
	return &r->held[base + rank];
}

/* What the chunk's result is encoded as, and with which scaling. */
static enum aps_scaling result_format(const struct aps_round *r, uint32_t chunk,
                                      const struct aps_format *down, enum aps_scaling scaling,
                                      struct aps_round_result *res)
{
	const struct aps_contribution *rank0 = lowest(r, chunk);

	if (r->kind == APS_ROUND_BROADCAST) {
		res->fmt = aps_format_fp32();
		return APS_SCALING_NONE;
	}
	if (r->lowp) {
		/* The codes of the sum as they are; k travels along, the client divides. */
		res->fmt = rank0->fmt;
		res->lowp_sum = true;
		return APS_SCALING_NONE;
	}
	res->fmt = down != NULL ? *down : rank0->fmt;
	return scaling;
}

/*
 * The per-byte part of finishing a chunk: the mean (or sum, or root's values)
 * transformed and encoded into res. Touches only the chunk's own accumulator,
 * so it may run on an engine thread; scratch: one chunk of floats for the
 * error measure, NULL when it is not measured.
 */
static int encode_chunk(struct aps_round *r, uint32_t chunk, const struct aps_format *down,
                        enum aps_scaling scaling, float *scratch, struct aps_round_result *res)
{
	size_t n = aps_round_chunk_len(r, chunk);
	float *acc = r->acc + (size_t)chunk * r->chunk_elems;
	uint64_t t0 = r->trace != NULL ? aps_trace_now() : 0;
	int ret;

	memset(res, 0, sizeof(*res));
	res->kind = r->kind;
	res->offset = (size_t)chunk * r->chunk_elems;
	res->count = n;
	scaling = result_format(r, chunk, down, scaling, res);
	if (r->kind == APS_ROUND_ALLREDUCE && !r->lowp)
		aps_codec_divide(acc, n, (float)r->chunks[chunk].summed);
	if (r->transform != NULL)
		r->transform(r->transform_ctx, r->kind, res->offset, acc, n);
	ret = encode(acc, n, scaling, r->block, !r->no_crc, res);
	aps_trace_stage(r->trace, "quantize", t0, &APS__ROUND_AT(r, chunk));
	if (ret == 0 && scratch != NULL)
		measure_error(acc, n, scratch, res);
	if (r->lowp)
		res->scale_exp = lowest(r, chunk)->scale_exp;
	if (ret < 0) {
		aps_sbuf_unref(res->payload);
		res->payload = NULL;
	}
	return ret;
}

static bool measures_error(const struct aps_round *r)
{
	return r->measure_error && r->kind == APS_ROUND_ALLREDUCE;
}

int aps_round_finish_chunk(struct aps_round *r, uint32_t chunk, const struct aps_format *down,
                           enum aps_scaling scaling, struct aps_round_result *res)
{
	int ret;

	if (r->in_flight > 0) /* its sums may still be on the engine */
		aps_engine_wait(r->engine, r);
	if (measures_error(r) && r->err_scratch == NULL &&
	    (r->err_scratch = malloc(r->chunk_elems * sizeof(float))) == NULL)
		return APS_ENOMEM;
	ret = encode_chunk(r, chunk, down, scaling, measures_error(r) ? r->err_scratch : NULL, res);
	if (ret < 0)
		return ret;
	r->chunks[chunk].finished = true;
	r->chunks_sealed++;
	aps__round_close_chunk(r, res);
	return 0;
}

/* A chunk's encoding on its engine thread, after its sums (the same lane). */
struct finish_task {
	struct aps_engine_task base;
	struct aps_round *r;
	uint32_t chunk;
	bool has_down;
	struct aps_format down;
	enum aps_scaling scaling;
	bool measure;
	int ret;
	struct aps_round_result res;
	aps_round_done_cb done;
	void *ctx;
};

static void run_finish(struct aps_engine_task *base, struct aps_engine_scratch *s)
{
	struct finish_task *t = (struct finish_task *)base;
	float *scratch = NULL;

	if (t->measure &&
	    (scratch = aps_engine_scratch(s, t->r->chunk_elems * sizeof(float))) == NULL) {
		t->ret = APS_ENOMEM;
		return;
	}
	t->ret = encode_chunk(t->r, t->chunk, t->has_down ? &t->down : NULL, t->scaling, scratch,
	                      &t->res);
}

static void finish_done(struct aps_engine_task *base, bool cancelled)
{
	struct finish_task *t = (struct finish_task *)base;

	t->r->in_flight--;
	if (cancelled) {
		aps_sbuf_unref(t->res.payload);
		t->done(t->ctx, APS_ECLOSED, NULL, true);
	} else {
		if (t->ret == 0)
			aps__round_close_chunk(t->r, &t->res);
		t->done(t->ctx, t->ret, &t->res, false);
	}
	free(t);
}

int aps_round_finish_async(struct aps_round *r, uint32_t chunk, const struct aps_format *down,
                           enum aps_scaling scaling, aps_round_done_cb done, void *ctx)
{
	struct finish_task *t = malloc(sizeof(*t));

	if (t == NULL)
		return APS_ENOMEM;
	*t = (struct finish_task){ .base = { .run = run_finish, .done = finish_done, .owner = r },
		                   .r = r,
		                   .chunk = chunk,
		                   .has_down = down != NULL,
		                   .scaling = scaling,
		                   .measure = measures_error(r),
		                   .done = done,
		                   .ctx = ctx };
	if (down != NULL)
		t->down = *down;
	r->chunks[chunk].finished = true;
	r->chunks_sealed++;
	r->in_flight++;
	aps_engine_submit(r->engine, r->lane + chunk, &t->base);
	return 0;
}
