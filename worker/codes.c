/*
 * Calls on codes the caller made (aps.h, "Calls on codes"): a codec that runs
 * where the gradient lives (a GPU) hands the client its codes in the wire's
 * layout and takes the result back as codes, so that only codes cross to host
 * memory. The client checks them as it checks its own (format, lengths,
 * exponents, no inf or NaN code), copies them into the call's buffer, and from
 * there they travel as any call's do: chunk by chunk, again after a
 * reconnect. Result chunks are stored as they come, not decoded.
 */
#include "worker/client_impl.h"

#include "common/codec.h"
#include "common/err.h"
#include "common/scale.h"
#include "worker/api_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* count elements of f in chunks of per (block: elements per block, 0: none). */
static void layout_of(const struct aps_format *f, uint64_t count, size_t per, size_t block,
                      struct aps_codes_layout *l)
{
	uint64_t last;

	memset(l, 0, sizeof(*l));
	snprintf(l->format, sizeof(l->format), "%s", f->name);
	l->count = count;
	l->chunk_elems = per ? per : count;
	l->chunks =
	        l->chunk_elems == 0 ? 1 : (uint32_t)((count + l->chunk_elems - 1) / l->chunk_elems);
	l->block = (uint32_t)block;
	l->chunk_bytes = aps_codec_payload_size(f, l->chunk_elems, block);
	last = count - (uint64_t)(l->chunks - 1) * l->chunk_elems;
	l->bytes =
	        (uint64_t)(l->chunks - 1) * l->chunk_bytes + aps_codec_payload_size(f, last, block);
}

/* A tensor's send layout in f and result layout in down (either out may be NULL). */
static void layouts_of(const struct aps_client *c, const struct aps_format *f,
                       const struct aps_format *down, uint64_t count, size_t per,
                       struct aps_codes_layout *send, struct aps_codes_layout *result)
{
	if (send != NULL)
		layout_of(f, count, per, aps_codec_payload_block(f, c->block), send);
	if (result != NULL)
		layout_of(down, count, per, aps_codec_payload_block(down, c->block), result);
}

/* The format the daemon answers a tensor in f with: the job's downlink, or f (lock). */
static struct aps_format result_format(const struct aps_client *c, const struct aps_format *f)
{
	return c->downlink_fixed ? c->downlink : *f;
}

/* The tensor's count and the result format of f, or APS_EINVAL (not registered). */
static int tensor_facts(struct aps_client *c, uint32_t tensor_id, uint64_t *count,
                        struct aps_format *down)
{
	int ret = 0;

	pthread_mutex_lock(&c->lock);
	if (tensor_id >= c->n_tensors || c->tensors[tensor_id].count == 0) {
		ret = aps_api_fail(APS_EINVAL, "tensor id %u is not registered", tensor_id);
	} else {
		*count = c->tensors[tensor_id].count;
		*down = result_format(c, &c->tensors[tensor_id].format);
	}
	pthread_mutex_unlock(&c->lock);
	return ret;
}

/* What codes calls need of the client itself: 0, or APS_EINVAL with the message. */
static int check_client(const struct aps_client *c)
{
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	if (c->scaling == APS_SCALING_GLOBAL)
		return aps_api_fail(APS_EINVAL, "codes calls do not take global scaling: its "
		                                "exponent is agreed before the tensor is encoded");
	if (c->error_feedback)
		return aps_api_fail(APS_EINVAL, "codes calls do not take error_feedback: the "
		                                "caller keeps the residual of the codes it made");
	return 0;
}

int aps_conn_codes_layout(aps_client *c, uint32_t tensor_id, struct aps_codes_layout *send,
                          struct aps_codes_layout *result)
{
	struct client_tensor *t;
	int ret = check_client(c);

	if (ret < 0)
		return ret;
	pthread_mutex_lock(&c->lock);
	t = tensor_id < c->n_tensors ? &c->tensors[tensor_id] : NULL;
	if (t == NULL || t->count == 0) {
		ret = aps_api_fail(APS_EINVAL, "tensor id %u is not registered", tensor_id);
	} else if (t->busy != NULL) {
		ret = aps_api_fail(APS_EBUSY,
		                   "tensor '%.200s' has a call in flight: its next format is "
		                   "known when it is waited for",
		                   t->name);
	} else {
		struct aps_format down = result_format(c, &t->format);
		layouts_of(c, &t->format, &down, t->count, t->chunk_elems, send, result);
	}
	pthread_mutex_unlock(&c->lock);
	return ret < 0 ? ret : aps_api_ok();
}

/* The codes of a call hold no inf or NaN code and block exponents the daemon takes. */
static int check_codes(const struct aps_request *r, const struct aps_codes_layout *l,
                       const uint8_t *codes)
{
	for (uint32_t i = 0; i < l->chunks; i++) {
		const uint8_t *at = codes + (uint64_t)i * l->chunk_bytes;
		size_t n = i + 1 < l->chunks ? l->chunk_elems
		                             : l->count - (uint64_t)i * l->chunk_elems;
		size_t bad = aps_codec_count_nonfinite(&r->fmt, at, n);

		if (bad > 0)
			return aps_api_fail(
			        APS_ENONFINITE,
			        "the codes of tensor '%.200s' hold %zu NaN or inf codes in "
			        "chunk %u; nothing was sent",
			        r->name, bad, i);
		if (l->block == 0)
			continue;
		const int8_t *exps = (const int8_t *)(at + aps_format_packed_size(&r->fmt, n));
		for (size_t b = 0; b < aps_codec_block_count(n, l->block); b++) {
			if (exps[b] < -APS_SCALE_BLOCK_MAX)
				return aps_api_fail(
				        APS_EINVAL,
				        "tensor '%.200s': block %zu of chunk %u has exponent "
				        "%d, beyond -%d",
				        r->name, b, i, exps[b], APS_SCALE_BLOCK_MAX);
		}
	}
	return 0;
}

/* The call's buffers against the layouts of r's tensor at this step. */
static int check_call(const struct aps_client *c, const struct aps_request *r,
                      const struct aps_codes_call *call, const struct aps_format *down,
                      struct aps_codes_layout *send, struct aps_codes_layout *result)
{
	layouts_of(c, &r->fmt, down, r->count, r->chunk_elems, send, result);
	if (strcmp(call->format, send->format) != 0)
		return aps_api_fail(APS_EMISMATCH,
		                    "tensor '%.200s' travels in %s at this step, the codes are "
		                    "'%.32s' (ask aps_client_codes_layout before each call)",
		                    r->name, send->format, call->format);
	if (call->codes_len != send->bytes)
		return aps_api_fail(APS_EINVAL,
		                    "tensor '%.200s' takes %llu bytes of codes in %s, the call "
		                    "passes %llu",
		                    r->name, (unsigned long long)send->bytes, send->format,
		                    (unsigned long long)call->codes_len);
	if (call->result_len < result->bytes || call->n_result_exps < result->chunks)
		return aps_api_fail(APS_EINVAL,
		                    "tensor '%.200s' answers in %llu bytes of %s and %u exponents, "
		                    "the call has room for %llu and %u",
		                    r->name, (unsigned long long)result->bytes, result->format,
		                    result->chunks, (unsigned long long)call->result_len,
		                    call->n_result_exps);
	if (send->block != 0 ? call->scale_exp != 0
	                     : call->scale_exp < -APS_CODEC_SCALE_MAX ||
	                               call->scale_exp > APS_CODEC_SCALE_MAX)
		return aps_api_fail(APS_EINVAL,
		                    "scale exponent %d: within +-%d (0 with block scaling, whose "
		                    "exponents are in the codes)",
		                    call->scale_exp, APS_CODEC_SCALE_MAX);
	if (call->n_flushed > send->chunks || (call->n_flushed > 0 && call->flushed == NULL))
		return aps_api_fail(APS_EINVAL,
		                    "tensor '%.200s': %u flushed counts for %u chunks%s", r->name,
		                    call->n_flushed, send->chunks,
		                    call->flushed == NULL ? " and no array" : "");
	for (uint32_t i = 0; i < call->n_flushed; i++) {
		if (call->flushed[i] > send->chunk_elems)
			return aps_api_fail(APS_EINVAL,
			                    "tensor '%.200s': chunk %u has %llu values flushed of "
			                    "%llu",
			                    r->name, i, (unsigned long long)call->flushed[i],
			                    (unsigned long long)send->chunk_elems);
	}
	return check_codes(r, send, call->codes);
}

int aps_conn_codes_start(aps_client *c, uint32_t tensor_id, const struct aps_codes_call *call,
                         bool update, float lr, int32_t timeout_ms, aps_request **out)
{
	struct aps_codes_layout send, result;
	struct aps_request *r = NULL; /* set by aps_request_data when it returns 0 */
	struct aps_format down;
	uint64_t count = 0;
	int ret = check_client(c);

	if (ret < 0)
		return ret;
	if (out == NULL || call == NULL || call->format == NULL || call->result == NULL ||
	    call->result_exps == NULL)
		return aps_api_fail(APS_EINVAL, "request, call, format, result or result_exps is "
		                                "NULL");
	if (update != aps_client_optimize_mode(c))
		return aps_api_fail(APS_EINVAL, update ? "the job is in all-reduce mode: name an "
		                                         "optimizer to step on the daemon"
		                                       : "the job is in optimize mode: use "
		                                         "aps_client_step_codes_start");
	if ((ret = tensor_facts(c, tensor_id, &count, &down)) < 0)
		return ret;
	ret = aps_request_data(c, REQ_ALLREDUCE, tensor_id, NULL, call->codes, count, timeout_ms,
	                       &r);
	if (ret < 0)
		return ret;
	if ((ret = check_call(c, r, call, &down, &send, &result)) < 0 ||
	    (ret = aps_request_alloc_codes(c, r)) < 0) {
		aps_request_free(r);
		return ret == APS_ENOMEM ? aps_api_fail(ret, "out of memory for the codes") : ret;
	}
	memcpy(r->codes->data, call->codes, send.bytes);
	for (uint32_t i = 0; i < call->n_flushed; i++)
		r->flushed[i] = call->flushed[i];
	atomic_store_explicit(&r->encoded, send.chunks, memory_order_release);
	r->scale_exp = call->scale_exp;
	r->update = update;
	r->lr = lr;
	r->out_codes = call->result;
	r->out_len = call->result_len;
	r->out_exps = call->result_exps;
	r->out_fmt = down;
	r->out_block = result.block;
	return aps_request_submit(c, r, out);
}
