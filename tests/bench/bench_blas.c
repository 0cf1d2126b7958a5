/*
 * OpenBLAS against the codec's kernels (issue 4): for each input size, the time
 * of max-abs, fp32 accumulate, in-place scaling and division, and e4m3
 * decode-accumulate, done by the codec or a loop and done by OpenBLAS, as
 * elements per second and as a ratio to a memcpy of the same fp32 buffer
 * measured in the same run. One thread for both. Before timing it prints what
 * isamax does with NaN and inf, and whether the BLAS results are bit-identical
 * to the codec's; it changes nothing in the tree and decides nothing
 * (docs/BENCHMARKS.md does).
 */
#include "common/codec.h"
#include "common/err.h"
#include "common/format.h"
#include "common/scale.h"
#include "tests/bench/bench_util.h"

#include <cblas.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SAMPLE_FLOATS (1u << 20) /* a timed sample covers at least this many elements */
#define MIN_SAMPLES   5
#define MAX_SAMPLES   30
#define BUDGET_S      0.2 /* stop sampling after this long once MIN_SAMPLES are in */
#define CHECK_FLOATS  (1u << 20)
#define SCALE_EXP     3    /* scaling rows: alternately times 2^3 and 2^-3 */
#define DIVISOR       3.0f /* divide rows: N, not a power of two */

static const size_t sizes[] = { 1024, 256 * 1024, 64 * 1024 * 1024 }; /* floats */

/* The buffers of one size; x is never written except by the in-place rows. */
struct bufs {
	size_t n;       /* elements */
	float *x;       /* gradient-like input, n floats */
	float *acc;     /* accumulator, n floats */
	float *tmp;     /* dequantize target of the two-pass e4m3 row, n floats */
	float *out;     /* memcpy target, n floats */
	uint8_t *codes; /* e4m3 codes of x, n bytes */
};

struct job {
	struct bufs *b;
	struct aps_format fp32;
	struct aps_format e4m3;
	int k_fp32; /* scale exponent of the fp32 accumulate rows */
	int k_e4m3; /* local APS exponent of x in e4m3 */
	bool flip;  /* in-place rows alternate a factor and its inverse */
	float sink; /* keeps max-abs results alive */
	int ret;    /* first codec error, 0 if none */
};

struct row {
	const char *op;
	const char *impl;
	void (*fn)(struct job *);
	int k;     /* k_fp32 for the fp32 accumulate rows */
	bool avx2; /* needs AVX2 */
};

static void fail(const char *what, int ret)
{
	fprintf(stderr, "bench_blas: %s: %s\n", what, aps_strerror(ret));
	exit(1);
}

static void note(struct job *j, int ret)
{
	if (ret < 0 && j->ret == 0)
		j->ret = ret;
}

/* What the tree compiles today: -O2 leaves this loop scalar (gcc 12, unknown trip count). */
static void scale_plain(float *x, size_t n, float s)
{
	for (size_t i = 0; i < n; i++)
		x[i] *= s;
}

/* Fixed-length inner loops: gcc's -O2 cost model vectorizes these. */
static void scale_blocks(float *x, size_t n, float s)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		for (size_t j = 0; j < 16; j++)
			x[i + j] *= s;
	}
	for (; i < n; i++)
		x[i] *= s;
}

__attribute__((target("avx2"))) static void scale_blocks_avx2(float *x, size_t n, float s)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		for (size_t j = 0; j < 16; j++)
			x[i + j] *= s;
	}
	for (; i < n; i++)
		x[i] *= s;
}

/* The loop of divide() in server/round.c. */
static void divide_plain(float *x, size_t n, float d)
{
	for (size_t i = 0; i < n; i++)
		x[i] /= d;
}

static void divide_blocks(float *x, size_t n, float d)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		for (size_t j = 0; j < 16; j++)
			x[i + j] /= d;
	}
	for (; i < n; i++)
		x[i] /= d;
}

__attribute__((target("avx2"))) static void divide_blocks_avx2(float *x, size_t n, float d)
{
	size_t i = 0;

	for (; i + 16 <= n; i += 16) {
		for (size_t j = 0; j < 16; j++)
			x[i + j] /= d;
	}
	for (; i < n; i++)
		x[i] /= d;
}

static float next_factor(struct job *j)
{
	j->flip = !j->flip;
	return j->flip ? ldexpf(1.0f, SCALE_EXP) : ldexpf(1.0f, -SCALE_EXP);
}

static float next_divisor(struct job *j)
{
	j->flip = !j->flip;
	return j->flip ? DIVISOR : 1.0f / DIVISOR;
}

static void op_memcpy(struct job *j)
{
	memcpy(j->b->out, j->b->x, j->b->n * sizeof(float));
}

static void op_maxabs_codec(struct job *j)
{
	j->sink += aps_codec_maxabs(j->b->x, j->b->n);
}

static void op_maxabs_blas(struct job *j)
{
	j->sink += fabsf(j->b->x[cblas_isamax((blasint)j->b->n, j->b->x, 1)]);
}

static void op_acc_fp32_codec(struct job *j)
{
	struct bufs *b = j->b;

	note(j, aps_codec_accumulate(&j->fp32, (const uint8_t *)b->x, 4 * b->n, b->n, j->k_fp32,
	                             b->acc));
}

static void op_acc_fp32_blas(struct job *j)
{
	cblas_saxpy((blasint)j->b->n, ldexpf(1.0f, -j->k_fp32), j->b->x, 1, j->b->acc, 1);
}

static void op_sscal(struct job *j)
{
	cblas_sscal((blasint)j->b->n, next_factor(j), j->b->x, 1);
}

static void op_scale_plain(struct job *j)
{
	scale_plain(j->b->x, j->b->n, next_factor(j));
}

static void op_scale_blocks(struct job *j)
{
	scale_blocks(j->b->x, j->b->n, next_factor(j));
}

static void op_scale_blocks_avx2(struct job *j)
{
	scale_blocks_avx2(j->b->x, j->b->n, next_factor(j));
}

static void op_divide_plain(struct job *j)
{
	divide_plain(j->b->x, j->b->n, next_divisor(j));
}

static void op_divide_blocks(struct job *j)
{
	divide_blocks(j->b->x, j->b->n, next_divisor(j));
}

static void op_divide_blocks_avx2(struct job *j)
{
	divide_blocks_avx2(j->b->x, j->b->n, next_divisor(j));
}

static void op_divide_sscal(struct job *j)
{
	cblas_sscal((blasint)j->b->n, 1.0f / next_divisor(j), j->b->x, 1);
}

static void op_acc_e4m3_codec(struct job *j)
{
	struct bufs *b = j->b;

	note(j, aps_codec_accumulate(&j->e4m3, b->codes, b->n, b->n, j->k_e4m3, b->acc));
}

static void op_acc_e4m3_blas(struct job *j)
{
	struct bufs *b = j->b;

	note(j, aps_codec_dequantize(&j->e4m3, b->codes, b->n, b->n, j->k_e4m3, b->tmp));
	cblas_saxpy((blasint)b->n, 1.0f, b->tmp, 1, b->acc, 1);
}

static const struct row rows[] = {
	{ "max-abs", "aps_codec_maxabs", op_maxabs_codec, 0, false },
	{ "max-abs", "fabsf(x[cblas_isamax])", op_maxabs_blas, 0, false },
	{ "fp32 accumulate k=0", "aps_codec_accumulate", op_acc_fp32_codec, 0, false },
	{ "fp32 accumulate k=0", "cblas_saxpy", op_acc_fp32_blas, 0, false },
	{ "fp32 accumulate k=3", "aps_codec_accumulate", op_acc_fp32_codec, 3, false },
	{ "fp32 accumulate k=3", "cblas_saxpy", op_acc_fp32_blas, 3, false },
	{ "scale by 2^+-3", "cblas_sscal", op_sscal, 0, false },
	{ "scale by 2^+-3", "loop, -O2 (scalar)", op_scale_plain, 0, false },
	{ "scale by 2^+-3", "loop in blocks of 16, -O2 (SSE2)", op_scale_blocks, 0, false },
	{ "scale by 2^+-3", "same, target(\"avx2\")", op_scale_blocks_avx2, 0, true },
	{ "divide by N=3", "loop of round.c, -O2 (scalar)", op_divide_plain, 0, false },
	{ "divide by N=3", "loop in blocks of 16, -O2 (SSE2)", op_divide_blocks, 0, false },
	{ "divide by N=3", "same, target(\"avx2\")", op_divide_blocks_avx2, 0, true },
	{ "divide by N=3", "cblas_sscal(1/N) (other bits)", op_divide_sscal, 0, false },
	{ "e4m3 accumulate", "aps_codec_accumulate (fused)", op_acc_e4m3_codec, 0, false },
	{ "e4m3 accumulate", "aps_codec_dequantize + cblas_saxpy", op_acc_e4m3_blas, 0, false },
};

#define ROW_COUNT (sizeof(rows) / sizeof(rows[0]))

/* Seconds per call of op, over one sample of inner calls. */
static double sample(void (*op)(struct job *), struct job *j, size_t inner)
{
	double t0 = bench_now();

	for (size_t i = 0; i < inner; i++)
		op(j);
	return (bench_now() - t0) / (double)inner;
}

/* Best time of one call of op in seconds, after one warm-up sample. */
static double measure(void (*op)(struct job *), struct job *j)
{
	size_t inner = j->b->n >= SAMPLE_FLOATS ? 1 : SAMPLE_FLOATS / j->b->n;
	double best = INFINITY;
	double start;

	sample(op, j, inner);
	start = bench_now();
	for (int s = 0; s < MAX_SAMPLES; s++) {
		best = fmin(best, sample(op, j, inner));
		if (s + 1 >= MIN_SAMPLES && bench_now() - start > BUDGET_S)
			break;
	}
	if (j->ret < 0)
		fail("codec", j->ret);
	return best;
}

static void *alloc_touched(size_t bytes)
{
	void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);

	if (p == NULL)
		fail("aligned_alloc", APS_ENOMEM);
	memset(p, 0, bytes);
	return p;
}

static void bufs_init(struct bufs *b, size_t n)
{
	b->n = n;
	b->x = alloc_touched(n * sizeof(float));
	b->acc = alloc_touched(n * sizeof(float));
	b->tmp = alloc_touched(n * sizeof(float));
	b->out = alloc_touched(n * sizeof(float));
	b->codes = alloc_touched(n);
	bench_fill(b->x, n, UINT64_C(0x5eed) + n, 1e-3);
	bench_fill(b->acc, n, UINT64_C(0xacc) + n, 1e-3);
}

static void bufs_free(struct bufs *b)
{
	free(b->codes);
	free(b->out);
	free(b->tmp);
	free(b->acc);
	free(b->x);
}

/* The formats, x's local exponent in e4m3 and x's e4m3 codes. */
static void job_init(struct job *j, struct bufs *b)
{
	struct aps_quant_opts qo = { .rounding = APS_ROUND_NEAREST };
	int ret = aps_format_parse("e4m3", &j->e4m3);

	j->b = b;
	if (ret == 0)
		ret = aps_format_parse("fp32", &j->fp32);
	if (ret == 0)
		ret = aps_scale_local(&j->e4m3, aps_codec_maxabs(b->x, b->n), &j->k_e4m3);
	qo.scale_exp = j->k_e4m3;
	if (ret == 0)
		ret = aps_codec_quantize(&j->e4m3, b->x, b->n, &qo, b->codes, b->n, NULL);
	if (ret < 0)
		fail("e4m3 codes", ret);
}

static void print_row(const struct row *r, size_t n, double t, double t_copy)
{
	printf("| %s | %s | %.2f | %.2f |\n", r->op, r->impl, (double)n / t * 1e-9, t / t_copy);
	fflush(stdout);
}

static void run_size(size_t n)
{
	struct bufs b;
	struct job j = { 0 };
	double t_copy;

	bufs_init(&b, n);
	job_init(&j, &b);
	t_copy = measure(op_memcpy, &j);
	printf("\n### %zu floats (%g MiB fp32)\n\n", n, (double)(n * sizeof(float)) / (1 << 20));
	printf("memcpy of the fp32 buffer: %.2f us, %.2f Ge/s; e4m3 k=%d\n\n", t_copy * 1e6,
	       (double)n / t_copy * 1e-9, j.k_e4m3);
	printf("| operation | implementation | Ge/s | x copy |\n|---|---|--:|--:|\n");
	for (size_t i = 0; i < ROW_COUNT; i++) {
		if (rows[i].avx2 && !__builtin_cpu_supports("avx2"))
			continue;
		j.k_fp32 = rows[i].k;
		print_row(&rows[i], n, measure(rows[i].fn, &j), t_copy);
	}
	if (j.sink < 0.0f)
		printf("(unreachable)\n");
	bufs_free(&b);
}

/*
 * For each position of one NaN in n ones with a 5 in the middle: how often
 * isamax returns the NaN rather than the 5.
 */
static void check_isamax_nan(float *v, size_t n)
{
	size_t hits = 0;

	for (size_t at = 0; at < n; at++) {
		for (size_t i = 0; i < n; i++)
			v[i] = 1.0f;
		v[at == n / 2 ? n / 2 + 1 : n / 2] = 5.0f;
		v[at] = NAN;
		hits += isnan(v[cblas_isamax((blasint)n, v, 1)]);
	}
	printf("- isamax, n=%zu, one NaN (every position in turn) and a 5: returns the NaN for %zu "
	       "of %zu positions; aps_codec_maxabs returns %g\n",
	       n, hits, n, (double)aps_codec_maxabs(v, n));
}

static void check_isamax(void)
{
	static const size_t lens[] = { 7, 16, 64, 1000 };
	float v[1000];
	size_t i;

	for (size_t l = 0; l < sizeof(lens) / sizeof(lens[0]); l++)
		check_isamax_nan(v, lens[l]);
	for (i = 0; i < 64; i++)
		v[i] = 1.0f;
	v[40] = 5.0f;
	v[10] = -INFINITY;
	i = cblas_isamax(64, v, 1);
	printf("- isamax, n=64, -inf at 10 and a 5 at 40: index %zu (|x| = %g); "
	       "aps_codec_maxabs returns %g\n",
	       i, (double)fabsf(v[i]), (double)aps_codec_maxabs(v, 64));
}

static size_t count_diff(const float *a, const float *b, size_t n)
{
	size_t d = 0;

	for (size_t i = 0; i < n; i++)
		d += memcmp(&a[i], &b[i], sizeof(float)) != 0;
	return d;
}

static size_t diff_fma(const float *x, const float *acc0, float alpha, const float *y, size_t n)
{
	size_t d = 0;

	for (size_t i = 0; i < n; i++) {
		float f = fmaf(alpha, x[i], acc0[i]);

		d += memcmp(&f, &y[i], sizeof(float)) != 0;
	}
	return d;
}

/* Codec accumulate against saxpy from the same acc0, and saxpy against fmaf. */
static void diff_fp32_accumulate(const char *data, const struct bufs *b, int k)
{
	struct aps_format fp32;
	float alpha = ldexpf(1.0f, -k);
	int ret;

	aps_format_parse("fp32", &fp32);
	memcpy(b->acc, b->tmp, b->n * sizeof(float));
	memcpy(b->out, b->tmp, b->n * sizeof(float));
	ret = aps_codec_accumulate(&fp32, (const uint8_t *)b->x, 4 * b->n, b->n, k, b->acc);
	if (ret < 0)
		fail("fp32 accumulate", ret);
	cblas_saxpy((blasint)b->n, alpha, b->x, 1, b->out, 1);
	printf("- fp32 accumulate, %s, k=%d: codec and saxpy differ in %zu of %zu elements; "
	       "saxpy and fmaf(2^-k, x, acc) in %zu\n",
	       data, k, count_diff(b->acc, b->out, b->n), b->n,
	       diff_fma(b->x, b->tmp, alpha, b->out, b->n));
}

static size_t diff_e4m3_accumulate(struct bufs *b)
{
	struct job j = { 0 };

	job_init(&j, b);
	memcpy(b->out, b->acc, b->n * sizeof(float));
	op_acc_e4m3_codec(&j);
	note(&j, aps_codec_dequantize(&j.e4m3, b->codes, b->n, b->n, j.k_e4m3, b->tmp));
	if (j.ret < 0)
		fail("e4m3 accumulate", j.ret);
	cblas_saxpy((blasint)b->n, 1.0f, b->tmp, 1, b->out, 1);
	return count_diff(b->acc, b->out, b->n);
}

static size_t diff_divide(struct bufs *b)
{
	memcpy(b->out, b->x, b->n * sizeof(float));
	memcpy(b->tmp, b->x, b->n * sizeof(float));
	divide_plain(b->out, b->n, DIVISOR);
	cblas_sscal((blasint)b->n, 1.0f / DIVISOR, b->tmp, 1);
	return count_diff(b->out, b->tmp, b->n);
}

/* Gradient data, and tiny data whose products x * 2^-3 are subnormal; acc0 is in tmp. */
static void check_identity(void)
{
	struct bufs b;
	const double scales[2][2] = { { 1e-3, 1e-3 }, { 1e-35, 1e-37 } };
	const char *names[2] = { "gradient data (|x| ~ 1e-3)", "tiny data (|x| ~ 1e-38)" };

	bufs_init(&b, CHECK_FLOATS);
	for (int s = 0; s < 2; s++) {
		bench_fill(b.x, b.n, 1, scales[s][0]);
		bench_fill(b.tmp, b.n, 2, scales[s][1]);
		for (int k = 0; k <= 3; k += 3)
			diff_fp32_accumulate(names[s], &b, k);
	}
	bench_fill(b.x, b.n, 1, 1e-3);
	bench_fill(b.acc, b.n, 2, 1e-3);
	printf("- e4m3 accumulate, fused vs dequantize + saxpy: %zu of %zu elements differ\n",
	       diff_e4m3_accumulate(&b), b.n);
	printf("- x / %g vs sscal(1 / %g): %zu of %zu elements differ\n", (double)DIVISOR,
	       (double)DIVISOR, diff_divide(&b), b.n);
	bufs_free(&b);
}

static void cpu_model(char *buf, size_t len)
{
	FILE *fp = fopen("/proc/cpuinfo", "r");
	char line[256];

	snprintf(buf, len, "unknown");
	while (fp != NULL && fgets(line, sizeof(line), fp) != NULL) {
		char *colon = strchr(line, ':');

		if (strncmp(line, "model name", 10) == 0 && colon != NULL) {
			snprintf(buf, len, "%s", colon + 2);
			buf[strcspn(buf, "\n")] = '\0';
			break;
		}
	}
	if (fp != NULL)
		fclose(fp);
}

static void print_header(void)
{
	char model[128];

	cpu_model(model, sizeof(model));
	printf("bench_blas: cpu \"%s\", codec isa %s, %s, core %s, %d thread, best of %d-%d "
	       "samples, Ge/s = 1e9 elements/s, x copy = time / memcpy time\n\n",
	       model, aps_codec_isa_name(aps_codec_get_isa()), openblas_get_config(),
	       openblas_get_corename(), openblas_get_num_threads(), MIN_SAMPLES, MAX_SAMPLES);
}

int main(int argc, char **argv)
{
	(void)argv;
	if (argc > 1) {
		fprintf(stderr, "usage: bench_blas\n");
		return 2;
	}
	openblas_set_num_threads(1);
	print_header();
	check_isamax();
	check_identity();
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		run_size(sizes[i]);
	return 0;
}
