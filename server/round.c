/*
 * Rounds: rank-ordered accumulation of contributions and the downlink
 * encoding of the result. A contribution whose lower ranks are all summed is
 * decoded straight into the accumulator (the first one writes, the others
 * add) and released at once; one that arrives early is held, without a copy,
 * until its turn. So the sum is the same bits whatever the arrival order.
 */
#include "server/round.h"

#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int aps_round_init(struct aps_round *r, uint32_t world_size, size_t count)
{
	memset(r, 0, sizeof(*r));
	r->world_size = world_size;
	r->count = count;
	r->has = calloc(world_size, sizeof(*r->has));
	r->held = calloc(world_size, sizeof(*r->held));
	r->acc = malloc((count ? count : 1) * sizeof(float));
	if (r->has == NULL || r->held == NULL || r->acc == NULL) {
		aps_round_fini(r);
		return APS_ENOMEM;
	}
	return 0;
}

static void release(struct aps_payload *p)
{
	if (p->release != NULL)
		p->release(p->ctx);
	memset(p, 0, sizeof(*p));
}

void aps_round_fini(struct aps_round *r)
{
	aps_round_abort(r);
	free(r->has);
	free(r->held);
	free(r->acc);
	memset(r, 0, sizeof(*r));
}

static void reset_step(struct aps_round *r)
{
	for (uint32_t i = 0; r->held != NULL && i < r->world_size; i++)
		release(&r->held[i].payload);
	if (r->has != NULL)
		memset(r->has, 0, r->world_size * sizeof(*r->has));
	r->kind = APS_ROUND_IDLE;
	r->arrived = 0;
	r->next_rank = 0;
	r->root_seen = false;
	r->flushed = 0;
}

void aps_round_abort(struct aps_round *r)
{
	reset_step(r);
}

/* Decodes one contribution into the accumulator: the first writes, later ones add. */
static void sum_one(struct aps_round *r, const struct aps_contribution *c, bool first)
{
	const struct aps_payload *p = &c->payload;

	if (first)
		aps_codec_dequantize(&c->fmt, p->data, p->len, r->count, c->scale_exp, r->acc);
	else
		aps_codec_accumulate(&c->fmt, p->data, p->len, r->count, c->scale_exp, r->acc);
}

/* Sums every held contribution whose turn has come, in rank order. */
static void sum_ready(struct aps_round *r)
{
	while (r->next_rank < r->world_size && r->has[r->next_rank]) {
		struct aps_contribution *c = &r->held[r->next_rank];
		sum_one(r, c, r->next_rank == 0);
		release(&c->payload);
		r->next_rank++;
	}
}

static int refuse(char *why, size_t why_len, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int refuse(char *why, size_t why_len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, why_len, fmt, ap);
	va_end(ap);
	return APS_EPROTO;
}

static int check_add(const struct aps_round *r, uint32_t rank, uint64_t step,
                     enum aps_round_kind kind, const struct aps_contribution *c, char *why,
                     size_t why_len)
{
	bool data = c->payload.data != NULL;

	if (rank >= r->world_size)
		return refuse(why, why_len, "rank %u is not below world size %u", rank,
		              r->world_size);
	if (step != r->step)
		return refuse(why, why_len, "step %llu, the tensor is at step %llu",
		              (unsigned long long)step, (unsigned long long)r->step);
	if (r->has[rank])
		return refuse(why, why_len, "rank %u already contributed to step %llu", rank,
		              (unsigned long long)step);
	if (r->kind != APS_ROUND_IDLE && r->kind != kind)
		return refuse(why, why_len, "step %llu mixes a broadcast and an all-reduce",
		              (unsigned long long)step);
	if (kind == APS_ROUND_ALLREDUCE && !data)
		return refuse(why, why_len, "rank %u pushed no data", rank);
	if (kind == APS_ROUND_BROADCAST && data && r->root_seen)
		return refuse(why, why_len, "a second rank (%u) sent broadcast data", rank);
	return 0;
}

int aps_round_add(struct aps_round *r, uint32_t rank, uint64_t step, enum aps_round_kind kind,
                  struct aps_contribution *c, char *why, size_t why_len)
{
	int ret = check_add(r, rank, step, kind, c, why, why_len);

	if (ret < 0)
		return ret;
	r->kind = kind;
	r->has[rank] = true;
	r->arrived++;
	r->flushed += c->flushed;
	if (rank == 0)
		r->first_fmt = c->fmt;
	if (kind == APS_ROUND_BROADCAST) {
		/* Only the root carries data; there is nothing to order. */
		if (c->payload.data != NULL) {
			sum_one(r, c, true);
			r->root_seen = true;
		}
		release(&c->payload);
		return 0;
	}
	r->held[rank] = *c;
	memset(&c->payload, 0, sizeof(c->payload));
	sum_ready(r);
	return 0;
}

bool aps_round_complete(const struct aps_round *r)
{
	if (r->arrived < r->world_size)
		return false;
	return r->kind == APS_ROUND_BROADCAST ? r->root_seen : r->next_rank == r->world_size;
}

static void divide(float *acc, size_t n, uint32_t world_size)
{
	float d = (float)world_size;

	if (world_size == 1)
		return;
	for (size_t i = 0; i < n; i++)
		acc[i] /= d;
}

static int encode(struct aps_round *r, enum aps_scaling scaling, struct aps_round_result *res)
{
	struct aps_quant_opts o = { 0 };
	size_t len = aps_format_packed_size(&res->fmt, r->count);

	res->maxabs = aps_codec_maxabs(r->acc, r->count);
	if (scaling != APS_SCALING_NONE && !aps_format_is_fp32(&res->fmt))
		aps_scale_local(&res->fmt, res->maxabs, &o.scale_exp);
	res->scale_exp = o.scale_exp;
	res->payload = aps_sbuf_new(len);
	if (res->payload == NULL)
		return APS_ENOMEM;
	return aps_codec_quantize(&res->fmt, r->acc, r->count, &o, res->payload->data, len,
	                          &res->stats);
}

int aps_round_finish(struct aps_round *r, const struct aps_format *down, enum aps_scaling scaling,
                     struct aps_round_result *res)
{
	int ret;

	memset(res, 0, sizeof(*res));
	if (r->kind == APS_ROUND_BROADCAST) {
		aps_format_parse("fp32", &res->fmt);
		scaling = APS_SCALING_NONE;
	} else {
		res->fmt = down != NULL ? *down : r->first_fmt;
		divide(r->acc, r->count, r->world_size);
	}
	ret = encode(r, scaling, res);
	if (ret < 0) {
		aps_sbuf_unref(res->payload);
		res->payload = NULL;
		return ret;
	}
	reset_step(r);
	r->step++;
	return 0;
}

size_t aps_round_missing(const struct aps_round *r, uint32_t *ranks, size_t cap)
{
	size_t n = 0;

	for (uint32_t i = 0; i < r->world_size; i++) {
		if (r->has[i])
			continue;
		if (n < cap)
			ranks[n] = i;
		n++;
	}
	return n;
}
