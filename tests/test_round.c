/*
 * Unit tests of the round engine (server/round.h): the rank-ordered sum is the
 * same bits in any arrival order, duplicates and wrong steps are refused,
 * broadcasts deliver the root's values, aborts release what was held.
 */
#include "common/codec.h"
#include "common/codec_kernels.h"
#include "common/err.h"
#include "server/round.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define N     1001
#define RANKS 4

static int released;

static void count_release(void *ctx)
{
	(void)ctx;
	released++;
}

struct rank_data {
	float x[N];
	uint8_t codes[4 * N];
	int k;
	struct aps_format fmt;
};

static struct rank_data ranks[RANKS];

static void make_data(const char *fmt, uint32_t seed)
{
	for (int r = 0; r < RANKS; r++) {
		struct rank_data *d = &ranks[r];
		struct aps_quant_opts o = { 0 };
		assert_int_equal(aps_format_parse(fmt, &d->fmt), 0);
		for (int i = 0; i < N; i++) {
			seed = seed * 1664525u + 1013904223u;
			d->x[i] = ((float)(seed >> 8) / 16777216.0f - 0.5f) * ldexpf(1.0f, -r * 3);
		}
		aps_scale_local(&d->fmt, aps_codec_maxabs(d->x, N), &d->k);
		o.scale_exp = d->k;
		assert_int_equal(
		        aps_codec_quantize(&d->fmt, d->x, N, &o, d->codes, sizeof(d->codes), NULL),
		        0);
	}
}

static struct aps_contribution contribution(int r, bool with_data)
{
	struct aps_contribution c = { .fmt = ranks[r].fmt, .scale_exp = ranks[r].k };

	if (with_data) {
		c.payload.data = ranks[r].codes;
		c.payload.len = aps_format_packed_size(&ranks[r].fmt, N);
		c.payload.release = count_release;
	}
	return c;
}

/* The expectation, computed apart: decode each rank, sum in rank order, divide. */
static void expected_mean(float *mean)
{
	float dec[N];

	for (int r = 0; r < RANKS; r++) {
		struct aps_format *f = &ranks[r].fmt;
		aps_codec_dequantize(f, ranks[r].codes, sizeof(ranks[r].codes), N, ranks[r].k, dec);
		for (int i = 0; i < N; i++)
			mean[i] = r == 0 ? dec[i] : mean[i] + dec[i];
	}
	for (int i = 0; i < N; i++)
		mean[i] /= (float)RANKS;
}

static void run_round(const int *order, float *out, int *k)
{
	struct aps_round r;
	struct aps_round_result res;
	char why[128];

	assert_int_equal(aps_round_init(&r, RANKS, N, 0, false), 0);
	released = 0;
	for (int i = 0; i < RANKS; i++) {
		struct aps_contribution c = contribution(order[i], true);
		assert_false(aps_round_chunk_complete(&r, 0));
		assert_int_equal(aps_round_add(&r, (uint32_t)order[i], 0, 0, APS_ROUND_ALLREDUCE,
		                               &c, why, sizeof(why)),
		                 0);
	}
	assert_true(aps_round_chunk_complete(&r, 0));
	assert_int_equal(released, RANKS);
	assert_int_equal(aps_round_finish_chunk(&r, 0, NULL, APS_SCALING_LOCAL, &res), 0);
	assert_int_equal(r.step, 1);
	*k = res.scale_exp;
	aps_codec_dequantize(&res.fmt, res.payload->data, res.payload->len, N, res.scale_exp, out);
	aps_sbuf_unref(res.payload);
	aps_round_fini(&r);
}

static void test_round_same_bits_in_any_order(void **state)
{
	static const int orders[][RANKS] = {
		{ 0, 1, 2, 3 }, { 3, 2, 1, 0 }, { 2, 0, 3, 1 }, { 1, 3, 0, 2 }
	};
	float want[N], mean[N], got[N], first[N];
	struct aps_quant_opts o = { 0 };
	uint8_t codes[N];
	int k, k0;

	(void)state;
	make_data("e4m3", 7);
	expected_mean(mean);
	/* then the downlink quantization, with the local exponent of the mean */
	aps_scale_local(&ranks[0].fmt, aps_codec_maxabs(mean, N), &o.scale_exp);
	aps_codec_quantize(&ranks[0].fmt, mean, N, &o, codes, sizeof(codes), NULL);
	aps_codec_dequantize(&ranks[0].fmt, codes, sizeof(codes), N, o.scale_exp, want);
	run_round(orders[0], first, &k0);
	assert_int_equal(k0, o.scale_exp);
	assert_memory_equal(first, want, sizeof(want));
	for (size_t i = 1; i < sizeof(orders) / sizeof(orders[0]); i++) {
		run_round(orders[i], got, &k);
		assert_memory_equal(got, first, sizeof(got));
	}
}

/*
 * max_held_bytes: with room for one early contribution, order 3, 2, 1, 0 keeps
 * rank 3's, declines rank 2's and rank 1's (nothing kept, payload the caller's),
 * and asks for each when its turn comes; the mean is the same bits, and the
 * budget is back at 0 (every held byte counted out).
 */
static void test_round_declines_early_contributions_past_the_budget(void **state)
{
	static const int order[RANKS] = { 0, 1, 2, 3 };
	struct aps_round_held budget = { 0 };
	struct aps_round_share share = { .pool = &budget };
	struct aps_round_result res;
	struct aps_round r;
	float want[N], got[N];
	uint32_t rank;
	char why[128];
	int k;

	(void)state;
	make_data("e4m3", 11);
	run_round(order, want, &k);
	budget.limit = aps_format_packed_size(&ranks[3].fmt, N); /* one contribution */
	assert_int_equal(aps_round_init(&r, RANKS, N, 0, false), 0);
	r.share = &share;
	released = 0;
	struct aps_contribution c3 = contribution(3, true), c2 = contribution(2, true),
	                        c1 = contribution(1, true), c0 = contribution(0, true);
	assert_int_equal(aps_round_add(&r, 3, 0, 0, APS_ROUND_ALLREDUCE, &c3, why, sizeof(why)), 0);
	assert_true(budget.bytes == budget.limit);
	assert_int_equal(aps_round_add(&r, 2, 0, 0, APS_ROUND_ALLREDUCE, &c2, why, sizeof(why)),
	                 APS_ROUND_ADD_DECLINED);
	assert_non_null(c2.payload.data); /* not taken: the caller releases it */
	assert_int_equal(aps_round_add(&r, 1, 0, 0, APS_ROUND_ALLREDUCE, &c1, why, sizeof(why)),
	                 APS_ROUND_ADD_DECLINED);
	assert_false(aps_round_wanted(&r, 0, &rank)); /* rank 0 is awaited, it sent nothing */
	/* rank 0's turn is now: taken whatever the budget, rank 1 is asked for */
	assert_int_equal(aps_round_add(&r, 0, 0, 0, APS_ROUND_ALLREDUCE, &c0, why, sizeof(why)), 0);
	assert_true(aps_round_wanted(&r, 0, &rank));
	assert_int_equal(rank, 1);
	assert_false(aps_round_wanted(&r, 0, &rank)); /* asked once */
	c1 = contribution(1, true);
	assert_int_equal(aps_round_add(&r, 1, 0, 0, APS_ROUND_ALLREDUCE, &c1, why, sizeof(why)), 0);
	assert_true(aps_round_wanted(&r, 0, &rank));
	assert_int_equal(rank, 2);
	c2 = contribution(2, true);
	assert_int_equal(aps_round_add(&r, 2, 0, 0, APS_ROUND_ALLREDUCE, &c2, why, sizeof(why)), 0);
	assert_true(aps_round_chunk_complete(&r, 0)); /* rank 3's held one summed last */
	assert_true(budget.bytes == 0 && r.held_bytes == 0);
	assert_int_equal(released, RANKS);
	assert_int_equal(aps_round_finish_chunk(&r, 0, NULL, APS_SCALING_LOCAL, &res), 0);
	assert_int_equal(res.scale_exp, k);
	aps_codec_dequantize(&res.fmt, res.payload->data, res.payload->len, N, res.scale_exp, got);
	assert_memory_equal(got, want, sizeof(got));
	aps_sbuf_unref(res.payload);
	/* an abort gives back what was held */
	c3 = contribution(3, true);
	assert_int_equal(aps_round_add(&r, 3, 1, 0, APS_ROUND_ALLREDUCE, &c3, why, sizeof(why)), 0);
	assert_true(budget.bytes > 0 && r.held_bytes == budget.bytes);
	aps_round_abort(&r);
	assert_true(budget.bytes == 0 && r.held_bytes == 0);
	aps_round_fini(&r);
}

/*
 * A round that holds only a declined contribution is busy (its rank's call
 * waits: a lost rank must fail it), and when every rank below it turns absent
 * (an elastic job shrinks) its rank is asked for it with nothing else kept.
 */
static void test_round_a_declined_rank_is_asked_when_the_ranks_below_leave(void **state)
{
	struct aps_round_held budget = { .limit = 1 };
	struct aps_round_share share = { .pool = &budget };
	bool absent[RANKS] = { false };
	struct aps_round r;
	uint32_t rank;
	char why[128];

	(void)state;
	make_data("e4m3", 5);
	assert_int_equal(aps_round_init(&r, RANKS, N, 0, false), 0);
	r.share = &share;
	r.absent = absent;
	struct aps_contribution c = contribution(2, true);
	assert_int_equal(aps_round_add(&r, 2, 0, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
	                 APS_ROUND_ADD_DECLINED);
	assert_true(aps_round_busy(&r));
	assert_false(aps_round_has(&r, 2, 0, 0));
	assert_true(aps_round_sent(&r, 2, 0, 0));
	uint32_t missing[RANKS];
	assert_int_equal(aps_round_missing(&r, missing, RANKS), 3); /* 0, 1, 3: not 2 */
	absent[0] = absent[1] = true;
	assert_false(aps_round_recheck(&r, 0));
	assert_true(aps_round_wanted(&r, 0, &rank));
	assert_int_equal(rank, 2);
	assert_true(budget.bytes == 0);
	aps_round_fini(&r);
}

/* Adds rank's contribution to round r (step 0, chunk 0); askable: AGAIN can ask for it. */
static int add_rank(struct aps_round *r, int rank, bool askable)
{
	struct aps_contribution c = contribution(rank, true);
	char why[128];

	c.askable = askable;
	return aps_round_add(r, (uint32_t)rank, 0, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why));
}

static int dropped;

/* aps_round_held.drop_step: what the server does, less telling the ranks. */
static void drop_step(void *ctx, struct aps_round *r)
{
	assert_ptr_equal(ctx, r);
	aps_round_abort(r);
	dropped++;
}

/*
 * Two jobs share max_held_bytes, room for two early contributions. Job A's
 * ranks 3 and 2 come early and take it all (its rank 0 does not come). Job B's
 * rank 3 comes early: B holds nothing, so A gives up its highest rank's (3)
 * for it, down to its fair part (half), and B's is kept. A's rank 3 is asked
 * for when its turn comes, and A's mean is the same bits. Contributions of
 * clients that cannot be asked again (askable false) are not given up: B's
 * rank 3 is then declined, unless the pool may drop A's step (drop_step).
 */
static void test_round_a_job_past_its_fair_part_gives_up_room(void **state)
{
	static const int order[RANKS] = { 0, 1, 2, 3 };
	struct aps_round_held pool = { 0 };
	struct aps_round_share sa = { .pool = &pool }, sb = { .pool = &pool };
	struct aps_round a, b;
	struct aps_round_result res;
	float want[N], got[N];
	uint32_t rank;
	int k;

	(void)state;
	make_data("e4m3", 23);
	run_round(order, want, &k);
	pool.limit = 2 * aps_format_packed_size(&ranks[3].fmt, N);
	assert_int_equal(aps_round_init(&a, RANKS, N, 0, false), 0);
	assert_int_equal(aps_round_init(&b, RANKS, N, 0, false), 0);
	a.share = &sa;
	b.share = &sb;
	released = 0;
	assert_int_equal(add_rank(&a, 3, true), 0);
	assert_int_equal(add_rank(&a, 2, true), 0);
	assert_true(pool.bytes == pool.limit && sa.bytes == pool.limit && pool.n_holders == 1);
	assert_int_equal(add_rank(&b, 3, true), 0); /* kept: A gave up its rank 3's */
	assert_true(pool.given_up == 1 && released == 1);
	assert_false(aps_round_has(&a, 3, 0, 0));
	assert_true(aps_round_sent(&a, 3, 0, 0)); /* its call waits for an AGAIN */
	assert_true(sa.bytes == pool.limit / 2 && sb.bytes == pool.limit / 2);
	assert_true(pool.bytes == pool.limit && pool.n_holders == 2);
	/* B is at its fair part: its next early one is declined, A keeps its half */
	assert_int_equal(add_rank(&b, 2, true), APS_ROUND_ADD_DECLINED);
	assert_true(pool.given_up == 1 && sa.bytes == pool.limit / 2);
	/* A's ranks 0 and 1 come: rank 2 held is summed, rank 3 is asked for */
	assert_int_equal(add_rank(&a, 0, true), 0);
	assert_false(aps_round_wanted(&a, 0, &rank)); /* rank 1 is awaited */
	assert_int_equal(add_rank(&a, 1, true), 0);
	assert_true(aps_round_wanted(&a, 0, &rank));
	assert_int_equal(rank, 3);
	assert_int_equal(add_rank(&a, 3, true), 0);
	assert_true(aps_round_chunk_complete(&a, 0));
	assert_true(sa.bytes == 0 && sa.rounds == NULL && pool.n_holders == 1);
	assert_int_equal(aps_round_finish_chunk(&a, 0, NULL, APS_SCALING_LOCAL, &res), 0);
	aps_codec_dequantize(&res.fmt, res.payload->data, res.payload->len, N, res.scale_exp, got);
	assert_memory_equal(got, want, sizeof(got));
	aps_sbuf_unref(res.payload);
	aps_round_abort(&b);
	assert_true(pool.bytes == 0 && pool.n_holders == 0 && pool.holders == NULL);

	/* A's clients cannot be asked again: nothing of A's is given up */
	assert_int_equal(add_rank(&a, 3, false), APS_EPROTO); /* a is at step 1 now */
	aps_round_fini(&a);
	assert_int_equal(aps_round_init(&a, RANKS, N, 0, false), 0);
	a.share = &sa;
	assert_int_equal(add_rank(&a, 3, false), 0);
	assert_int_equal(add_rank(&a, 2, false), 0);
	assert_int_equal(add_rank(&b, 3, true), APS_ROUND_ADD_DECLINED);
	assert_true(pool.given_up == 1 && sa.bytes == pool.limit);
	/* ...unless its step may be dropped: then A's round gives up all it held */
	pool.drop_step = drop_step;
	pool.ctx = &a;
	assert_int_equal(add_rank(&b, 2, true), 0);
	assert_true(pool.steps_dropped == 1 && pool.given_up == 1 && dropped == 1);
	assert_true(sa.bytes == 0 && sa.rounds == NULL && a.held_unaskable == 0);
	assert_true(pool.n_holders == 1 && pool.bytes == sb.bytes && sb.bytes == pool.limit / 2);
	assert_false(aps_round_busy(&a));
	aps_round_fini(&a);
	aps_round_fini(&b);
	assert_true(pool.bytes == 0 && pool.n_holders == 0);
}

static void test_round_fp32_is_the_exact_mean(void **state)
{
	static const int order[RANKS] = { 2, 1, 3, 0 };
	float want[N], got[N];
	int k;

	(void)state;
	make_data("fp32", 3);
	expected_mean(want);
	run_round(order, got, &k);
	assert_int_equal(k, 0);
	assert_memory_equal(got, want, sizeof(want));
}

static void test_round_refuses_duplicates_and_wrong_steps(void **state)
{
	struct aps_round r;
	struct aps_contribution c;
	char why[128];

	(void)state;
	make_data("e5m2", 1);
	assert_int_equal(aps_round_init(&r, RANKS, N, 0, false), 0);
	released = 0;
	c = contribution(2, true);
	assert_int_equal(aps_round_add(&r, 2, 0, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)), 0);
	assert_int_equal(released, 0); /* held: ranks 0 and 1 come first */
	/* what a resent push is checked against (server/resend.c) */
	assert_true(aps_round_has(&r, 2, 0, 0));
	assert_false(aps_round_has(&r, 1, 0, 0));
	assert_false(aps_round_has(&r, 2, 1, 0));
	assert_false(aps_round_has(&r, 2, 0, 1));
	assert_false(aps_round_has(&r, RANKS, 0, 0));
	c = contribution(2, true);
	assert_int_equal(aps_round_add(&r, 2, 0, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
	                 APS_EPROTO);
	assert_non_null(strstr(why, "already sent chunk 0"));
	c = contribution(1, true);
	assert_int_equal(aps_round_add(&r, 1, 1, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
	                 APS_EPROTO);
	assert_non_null(strstr(why, "at step 0"));
	assert_int_equal(aps_round_add(&r, 7, 0, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
	                 APS_EPROTO);
	c = contribution(1, false);
	assert_int_equal(aps_round_add(&r, 1, 0, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
	                 APS_EPROTO);
	c = contribution(1, false);
	assert_int_equal(aps_round_add(&r, 1, 0, 0, APS_ROUND_BROADCAST, &c, why, sizeof(why)),
	                 APS_EPROTO);
	assert_non_null(strstr(why, "mixes"));
	uint32_t missing[RANKS];
	assert_int_equal(aps_round_missing(&r, missing, RANKS), 3);
	assert_int_equal(missing[0], 0);
	assert_int_equal(missing[2], 3);
	/* an abort releases what was held and keeps the step */
	aps_round_abort(&r);
	assert_int_equal(released, 1);
	assert_int_equal(r.step, 0);
	assert_int_equal(aps_round_missing(&r, missing, RANKS), RANKS);
	aps_round_fini(&r);
}

static void test_round_broadcast_delivers_the_root(void **state)
{
	struct aps_round r;
	struct aps_round_result res;
	struct aps_contribution c;
	char why[128];

	(void)state;
	make_data("fp32", 11);
	assert_int_equal(aps_round_init(&r, RANKS, N, 0, false), 0);
	/* only rank 0 is the root: data from another rank is refused */
	c = contribution(2, true);
	assert_int_equal(aps_round_add(&r, 2, 0, 0, APS_ROUND_BROADCAST, &c, why, sizeof(why)),
	                 APS_EPROTO);
	assert_non_null(strstr(why, "only rank 0"));
	for (int rank = RANKS - 1; rank >= 0; rank--) {
		c = contribution(rank, rank == 0);
		assert_int_equal(aps_round_add(&r, (uint32_t)rank, 0, 0, APS_ROUND_BROADCAST, &c,
		                               why, sizeof(why)),
		                 0);
	}
	assert_true(aps_round_chunk_complete(&r, 0));
	assert_int_equal(aps_round_finish_chunk(&r, 0, NULL, APS_SCALING_LOCAL, &res), 0);
	assert_int_equal(res.payload->len, 4 * N);
	assert_memory_equal(res.payload->data, ranks[0].x, sizeof(ranks[0].x));
	aps_sbuf_unref(res.payload);
	aps_round_fini(&r);
}

static void test_round_downlink_format_and_no_scaling(void **state)
{
	static const int order[RANKS] = { 0, 1, 2, 3 };
	struct aps_round r;
	struct aps_round_result res;
	struct aps_format fp16;
	char why[128];

	(void)state;
	make_data("e4m3", 5);
	aps_format_parse("fp16", &fp16);
	assert_int_equal(aps_round_init(&r, RANKS, N, 0, false), 0);
	for (int i = 0; i < RANKS; i++) {
		struct aps_contribution c = contribution(order[i], true);
		aps_round_add(&r, (uint32_t)order[i], 0, 0, APS_ROUND_ALLREDUCE, &c, why,
		              sizeof(why));
	}
	assert_int_equal(aps_round_finish_chunk(&r, 0, &fp16, APS_SCALING_NONE, &res), 0);
	assert_string_equal(res.fmt.name, "fp16");
	assert_int_equal(res.scale_exp, 0);
	assert_int_equal(res.payload->len, 2 * N);
	aps_sbuf_unref(res.payload);
	aps_round_fini(&r);
}

/* Chunks of one tensor, pushed in any order, give the bits of one whole-tensor round
 * with the downlink exponent chosen per chunk. */
static void test_round_chunks_in_any_order(void **state)
{
	enum {
		CHUNK = 96,
		CHUNKS = (N + CHUNK - 1) / CHUNK
	};
	struct aps_round r;
	struct aps_round_result res;
	float mean[N], want[N], got[N];
	char why[128];
	int finished = 0;

	(void)state;
	make_data("e5m2", 21);
	expected_mean(mean);
	assert_int_equal(aps_round_init(&r, RANKS, N, CHUNK, false), 0);
	assert_int_equal(r.n_chunks, CHUNKS);
	assert_int_equal(aps_round_chunk_of(&r, 96, 96), 1);
	assert_int_equal(aps_round_chunk_of(&r, 95, 96), -1);
	assert_int_equal(aps_round_chunk_of(&r, 960, 41), 10);
	assert_int_equal(aps_round_chunk_of(&r, 960, 96), -1);
	/* ranks walk the chunks from opposite ends: chunks complete out of order */
	for (int i = 0; i < CHUNKS; i++) {
		for (int rank = RANKS - 1; rank >= 0; rank--) {
			uint32_t chunk = (uint32_t)(rank % 2 ? i : CHUNKS - 1 - i);
			size_t off = chunk * CHUNK, n = off + CHUNK > N ? N - off : CHUNK;
			struct aps_contribution c = contribution(rank, true);
			c.payload.data += aps_format_packed_size(&ranks[rank].fmt, off);
			c.payload.len = aps_format_packed_size(&ranks[rank].fmt, n);
			assert_int_equal(aps_round_add(&r, (uint32_t)rank, 0, chunk,
			                               APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
			                 0);
			if (!aps_round_chunk_complete(&r, chunk))
				continue;
			assert_int_equal(
			        aps_round_finish_chunk(&r, chunk, NULL, APS_SCALING_LOCAL, &res),
			        0);
			assert_int_equal(res.offset, off);
			aps_codec_dequantize(&res.fmt, res.payload->data, res.payload->len, n,
			                     res.scale_exp, got + off);
			aps_sbuf_unref(res.payload);
			/* the expectation of this chunk: its own local exponent */
			struct aps_quant_opts o = { 0 };
			uint8_t codes[CHUNK];
			aps_scale_local(&res.fmt, aps_codec_maxabs(mean + off, n), &o.scale_exp);
			aps_codec_quantize(&res.fmt, mean + off, n, &o, codes, sizeof(codes), NULL);
			aps_codec_dequantize(&res.fmt, codes, sizeof(codes), n, o.scale_exp,
			                     want + off);
			assert_int_equal(res.step_done, ++finished == CHUNKS);
		}
	}
	assert_int_equal(finished, CHUNKS);
	assert_int_equal(r.step, 1);
	assert_memory_equal(got, want, sizeof(want));
	aps_round_fini(&r);
}

/* The paper's lowp sum: one k for all, rounded to the format after every addition,
 * in rank order; the result is the codes of the sum. */
static void test_round_lowp_sum_is_the_rounded_rank_order_sum(void **state)
{
	static const int order[RANKS] = { 3, 1, 0, 2 };
	struct aps_format f;
	struct aps_round r;
	struct aps_round_result res;
	float x[RANKS][N], sum[N], dec[N], got[N];
	static uint8_t codes[RANKS][N], tmp[N];
	struct aps_quant_opts o = { .scale_exp = 5 };
	char why[128];

	(void)state;
	aps_format_parse("e4m3", &f);
	for (int rank = 0; rank < RANKS; rank++) {
		for (int i = 0; i < N; i++)
			x[rank][i] = (float)((i * 7 + rank * 13) % 29 - 14) / 16.0f;
		aps_codec_quantize(&f, x[rank], N, &o, codes[rank], N, NULL);
	}
	/* independently: decode raw codes, add, round to e4m3 after each addition */
	for (int rank = 0; rank < RANKS; rank++) {
		aps_codec_dequantize(&f, codes[rank], N, N, 0, dec);
		for (int i = 0; i < N; i++) {
			struct aps_codec_stats st = { 0 };
			float s = rank == 0 ? dec[i] : sum[i] + dec[i];
			uint8_t c = (uint8_t)aps_scalar_encode(&f, s, 0, &st);
			sum[i] = (float)aps_format_decode(&f, c);
		}
	}
	assert_int_equal(aps_round_init(&r, RANKS, N, 0, true), 0);
	for (int i = 0; i < RANKS; i++) {
		struct aps_contribution c = { .fmt = f,
			                      .scale_exp = 5,
			                      .payload = { codes[order[i]], N, NULL, NULL } };
		assert_int_equal(aps_round_add(&r, (uint32_t)order[i], 0, 0, APS_ROUND_ALLREDUCE,
		                               &c, why, sizeof(why)),
		                 0);
	}
	assert_int_equal(aps_round_finish_chunk(&r, 0, NULL, APS_SCALING_LOCAL, &res), 0);
	assert_true(res.lowp_sum);
	assert_int_equal(res.scale_exp, 5);
	aps_codec_dequantize(&res.fmt, res.payload->data, res.payload->len, N, 0, got);
	assert_memory_equal(got, sum, sizeof(sum));
	aps_sbuf_unref(res.payload);
	/* every rank must share the format and the exponent */
	struct aps_contribution c = { .fmt = f,
		                      .scale_exp = 5,
		                      .payload = { codes[0], N, NULL, NULL } };
	assert_int_equal(aps_round_add(&r, 0, 1, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)), 0);
	c = (struct aps_contribution){ .fmt = f,
		                       .scale_exp = 4,
		                       .payload = { tmp, N, NULL, NULL } };
	assert_int_equal(aps_round_add(&r, 1, 1, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
	                 APS_EPROTO);
	assert_non_null(strstr(why, "one format and exponent"));
	aps_round_fini(&r);
}

/*
 * Elastic jobs: rank 0 is absent from the start and rank 2 leaves after
 * sending: the mean is over ranks 1, 2, 3 in rank order, and the round
 * completes when rank 2's absence is rechecked, not before.
 */
static void test_round_absent_ranks_are_passed_over(void **state)
{
	bool absent[RANKS] = { true, false, false, false };
	struct aps_round r;
	struct aps_round_result res;
	float want[N], dec[N], got[N];
	char why[128];

	(void)state;
	make_data("fp32", 11);
	for (int r2 = 1; r2 < RANKS; r2++) {
		aps_codec_dequantize(&ranks[r2].fmt, ranks[r2].codes, sizeof(ranks[r2].codes), N,
		                     ranks[r2].k, dec);
		for (int i = 0; i < N; i++)
			want[i] = r2 == 1 ? dec[i] : want[i] + dec[i];
	}
	for (int i = 0; i < N; i++)
		want[i] /= 3.0f;
	assert_int_equal(aps_round_init(&r, RANKS, N, 0, false), 0);
	r.absent = absent;
	static const int order[] = { 3, 2, 1 };
	for (int i = 0; i < 3; i++) {
		struct aps_contribution c = contribution(order[i], true);
		assert_int_equal(aps_round_add(&r, (uint32_t)order[i], 0, 0, APS_ROUND_ALLREDUCE,
		                               &c, why, sizeof(why)),
		                 0);
	}
	assert_true(aps_round_chunk_complete(&r, 0));
	assert_int_equal(aps_round_finish_chunk(&r, 0, NULL, APS_SCALING_NONE, &res), 0);
	aps_codec_dequantize(&res.fmt, res.payload->data, res.payload->len, N, 0, got);
	assert_memory_equal(got, want, sizeof(want));
	aps_sbuf_unref(res.payload);

	/* step 1: rank 3 never sends and then leaves; the others' sum completes on recheck */
	for (int rank = 1; rank <= 2; rank++) {
		struct aps_contribution c = contribution(rank, true);
		assert_int_equal(aps_round_add(&r, (uint32_t)rank, 1, 0, APS_ROUND_ALLREDUCE, &c,
		                               why, sizeof(why)),
		                 0);
	}
	assert_false(aps_round_chunk_complete(&r, 0));
	uint32_t missing[RANKS];
	assert_int_equal(aps_round_missing(&r, missing, RANKS), 1);
	assert_int_equal(missing[0], 3);
	absent[3] = true;
	assert_true(aps_round_recheck(&r, 0));
	assert_int_equal(aps_round_finish_chunk(&r, 0, NULL, APS_SCALING_NONE, &res), 0);
	aps_codec_dequantize(&res.fmt, res.payload->data, res.payload->len, N, 0, got);
	for (int i = 0; i < N; i++) {
		float a, b;
		aps_codec_dequantize(&ranks[1].fmt, ranks[1].codes + 4 * i, 4, 1, ranks[1].k, &a);
		aps_codec_dequantize(&ranks[2].fmt, ranks[2].codes + 4 * i, 4, 1, ranks[2].k, &b);
		assert_true(got[i] == (a + b) / 2.0f);
	}
	aps_sbuf_unref(res.payload);
	aps_round_fini(&r);
}

/* A rank back in an elastic job cannot join a chunk finished without it. */
static void test_round_finished_chunk_refuses_a_late_rank(void **state)
{
	bool absent[RANKS] = { false, false, false, true };
	struct aps_round r;
	struct aps_round_result res;
	char why[128];

	(void)state;
	make_data("fp32", 5);
	assert_int_equal(aps_round_init(&r, RANKS, N, 96, false), 0);
	assert_true(r.n_chunks >= 2);
	r.absent = absent;
	for (uint32_t rank = 0; rank < 3; rank++) {
		struct aps_contribution c = contribution((int)rank, true);
		assert_int_equal(
		        aps_round_add(&r, rank, 0, 0, APS_ROUND_ALLREDUCE, &c, why, sizeof(why)),
		        0);
	}
	assert_true(aps_round_chunk_complete(&r, 0));
	assert_int_equal(aps_round_finish_chunk(&r, 0, NULL, APS_SCALING_NONE, &res), 0);
	aps_sbuf_unref(res.payload);
	absent[3] = false; /* back, while chunk 1 of the step is still open */
	struct aps_contribution late = contribution(3, true);
	assert_int_equal(aps_round_add(&r, 3, 0, 0, APS_ROUND_ALLREDUCE, &late, why, sizeof(why)),
	                 APS_EPROTO);
	assert_non_null(strstr(why, "finished without rank 3"));
	aps_round_fini(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_round_same_bits_in_any_order),
		cmocka_unit_test(test_round_fp32_is_the_exact_mean),
		cmocka_unit_test(test_round_declines_early_contributions_past_the_budget),
		cmocka_unit_test(test_round_a_job_past_its_fair_part_gives_up_room),
		cmocka_unit_test(test_round_a_declined_rank_is_asked_when_the_ranks_below_leave),
		cmocka_unit_test(test_round_refuses_duplicates_and_wrong_steps),
		cmocka_unit_test(test_round_broadcast_delivers_the_root),
		cmocka_unit_test(test_round_downlink_format_and_no_scaling),
		cmocka_unit_test(test_round_chunks_in_any_order),
		cmocka_unit_test(test_round_lowp_sum_is_the_rounded_rank_order_sum),
		cmocka_unit_test(test_round_absent_ranks_are_passed_over),
		cmocka_unit_test(test_round_finished_chunk_refuses_a_late_rank),
	};
	return cmocka_run_group_tests_name("round", tests, NULL, NULL);
}
