/*
 * The daemon's optimizer step (optimize mode, server/optimizer.c) against a
 * memcpy of the same bytes: for each rule, seconds per step of n parameters
 * and the arrays' traffic in GB/s (SGD reads w, g, writes w; with momentum
 * also reads and writes the buffer; Adam two buffers), then the daemon's whole
 * chunk result (update, difference to the workers' view, e4m3 quantization,
 * the view's accumulate). One core, warm caches beyond the first pass.
 *
 *     build/tests/bench/bench_optimizer [ELEMENTS]   (default 16M)
 */
#include "common/codec.h"
#include "common/scale.h"
#include "server/optimizer.h"
#include "tests/bench/bench_util.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define REPS 5

static double best_of(void (*fn)(void *), void *ctx)
{
	double best = 1e30;

	for (int r = 0; r < REPS; r++) {
		double t0 = bench_now();
		fn(ctx);
		double dt = bench_now() - t0;
		best = dt < best ? dt : best;
	}
	return best;
}

struct ctx {
	struct aps_optim_config cfg;
	struct aps_optim_tensor t;
	float *g, *scratch;
	uint8_t *codes;
	size_t n;
};

static void run_copy(void *p)
{
	struct ctx *c = p;

	memcpy(c->scratch, c->g, c->n * sizeof(float));
}

static void run_update(void *p)
{
	struct ctx *c = p;

	c->t.state_t = 1; /* the momentum path of every step after the first */
	aps_optim_update(&c->cfg, c->t.weights, c->g, c->t.state, c->n, 0.01f, 2);
}

/* What the daemon does per chunk: the step, the difference, e4m3, the view. */
static void run_chunk_result(void *p)
{
	struct ctx *c = p;
	struct aps_format f;
	struct aps_quant_opts o = { 0 };
	size_t len;

	aps_format_parse("e4m3", &f);
	len = aps_format_packed_size(&f, c->n);
	memcpy(c->scratch, c->g, c->n * sizeof(float));
	c->t.lr = 0.01f;
	aps_optim_tensor_step_chunk(&c->cfg, &c->t, 0, c->scratch, c->n);
	aps_scale_local(&f, aps_codec_maxabs(c->scratch, c->n), &o.scale_exp);
	aps_codec_quantize(&f, c->scratch, c->n, &o, c->codes, len, NULL);
	aps_codec_accumulate(&f, c->codes, len, c->n, o.scale_exp, c->t.view);
}

int main(int argc, char **argv)
{
	static const char *const specs[] = { "sgd", "sgd,momentum=0.9",
		                             "sgd,momentum=0.9,nesterov=1", "adam", "adamw" };
	size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)16 << 20;
	struct ctx c = { .n = n };
	char why[160];
	double copy;

	c.g = malloc(n * sizeof(float));
	c.scratch = malloc(n * sizeof(float));
	c.codes = malloc(n);
	if (c.g == NULL || c.scratch == NULL || c.codes == NULL)
		return 1;
	bench_fill(c.g, n, 1, 1e-3);
	copy = best_of(run_copy, &c);
	printf("elements %zu, memcpy of the gradient %.2f ms (%.1f GB/s)\n", n, copy * 1e3,
	       2.0 * n * 4 / copy / 1e9);
	printf("%-30s %10s %10s %12s %16s\n", "optimizer", "update ms", "GB/s", "x memcpy",
	       "chunk result ms");
	for (size_t i = 0; i < sizeof(specs) / sizeof(specs[0]); i++) {
		if (aps_optim_parse(specs[i], &c.cfg, why, sizeof(why)) < 0 ||
		    aps_optim_tensor_init(&c.t, &c.cfg, n) < 0)
			return 1;
		bench_fill(c.t.weights, n, 2, 1.0);
		double upd = best_of(run_update, &c);
		double bytes = (3.0 + 2.0 * c.t.slots) * n * 4; /* w, g, w' and the state */
		double chunk = best_of(run_chunk_result, &c);
		printf("%-30s %10.2f %10.1f %12.2f %16.2f\n", specs[i], upd * 1e3,
		       bytes / upd / 1e9, upd / copy, chunk * 1e3);
		aps_optim_tensor_fini(&c.t);
	}
	free(c.g);
	free(c.scratch);
	free(c.codes);
	return 0;
}
