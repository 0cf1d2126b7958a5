/*
 * Codec throughput benchmark: for each input size, format and instruction set,
 * the time of quantize (with the APS max scan and the choice of k), of
 * quantize alone, of dequantize and of dequantize-accumulate, as elements per
 * second and as a ratio to a memcpy of the same fp32 buffer measured in the
 * same run. One thread. It checks nothing but the codec's return codes; the
 * unit tests own correctness.
 */
#include "common/codec.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/format.h"
#include "common/scale.h"
#include "tests/bench/bench_util.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define SAMPLE_FLOATS (1u << 20) /* a timed sample covers at least this many elements */
#define MIN_SAMPLES   3
#define MAX_SAMPLES   30
#define BUDGET_S      0.3 /* stop sampling after this long once MIN_SAMPLES are in */
#define QUICK_MAX_N   (1u << 20)

static const char *const format_names[] = {
	"fp32", "bf16", "fp16", "e5m2", "e4m3", "e4m3fn", "e3m0"
};
static const size_t sizes[] = { 1024, 256 * 1024, 64 * 1024 * 1024 }; /* floats */

struct options {
	bool quick;         /* skip sizes above QUICK_MAX_N */
	int isa;            /* one enum aps_codec_isa, or APS_ISA_AUTO for all */
	const char *format; /* one format name, or NULL for all */
};

/* The buffers of one size; every op reads x and writes out or codes. */
struct bufs {
	size_t n;       /* elements */
	float *x;       /* gradient-like input, n floats */
	float *out;     /* dequantize, accumulate and memcpy target, n floats */
	uint8_t *codes; /* packed codes, 4 * n bytes (room for fp32) */
};

struct job {
	const struct aps_format *f;
	struct bufs *b;
	int k;   /* scale exponent for quantize alone and for decoding */
	int ret; /* first error an op saw, 0 if none */
};

enum op {
	OP_QUANT_SCAN,
	OP_QUANT,
	OP_DEQUANT,
	OP_ACCUM,
	OP_COUNT,
};

static void fail(const char *what, int ret)
{
	fprintf(stderr, "bench_codec: %s: %s\n", what, aps_strerror(ret));
	exit(1);
}

static void note(struct job *j, int ret)
{
	if (ret < 0 && j->ret == 0)
		j->ret = ret;
}

static void op_memcpy(struct job *j)
{
	memcpy(j->b->out, j->b->x, j->b->n * sizeof(float));
}

/* The worker's check for inf/NaN and its max, as two passes (before 2026-12-02) ... */
static void op_scan_two_passes(struct job *j)
{
	volatile size_t bad = aps_codec_count_nonfinite_f32(j->b->x, j->b->n);
	volatile float m = aps_codec_maxabs(j->b->x, j->b->n);

	(void)bad;
	(void)m;
}

/* ... and as the one pass it makes now. */
static void op_scan_one_pass(struct job *j)
{
	bool nonfinite;
	volatile float m = aps_codec_scan(j->b->x, j->b->n, &nonfinite);

	(void)m;
}

/* The validator's check of a payload of e4m3 codes (one per element of x): CRC32C,
 * then the inf/NaN count, as two passes (as before 2026-12-03, but each pass is
 * faster now) ... */
static void op_check_two_passes(struct job *j)
{
	volatile uint32_t crc = aps_crc32c(0, j->b->codes, j->b->n);
	volatile size_t bad = aps_codec_count_nonfinite(j->f, j->b->codes, j->b->n);

	(void)crc;
	(void)bad;
}

/* ... and as the one pass it makes now; against a memcpy of the same bytes. */
static void op_check_one_pass(struct job *j)
{
	uint32_t crc;
	volatile size_t bad = aps_codec_crc_nonfinite(j->f, j->b->codes, j->b->n, j->b->n, &crc);

	(void)bad;
}

/* ... and the inf/NaN check alone (a payload flagged NO_CRC). */
static void op_check_no_crc(struct job *j)
{
	volatile size_t bad = aps_codec_count_nonfinite(j->f, j->b->codes, j->b->n);

	(void)bad;
}

static void op_memcpy_codes(struct job *j)
{
	memcpy(j->b->out, j->b->codes, j->b->n);
}

/* What a worker does per tensor: the inf/NaN and max scan, local k, quantize. */
static void op_quant_scan(struct job *j)
{
	struct aps_quant_opts qo = { .rounding = APS_ROUND_NEAREST };
	struct aps_codec_stats st;
	struct bufs *b = j->b;
	bool nonfinite;

	note(j, aps_scale_local(j->f, aps_codec_scan(b->x, b->n, &nonfinite), &qo.scale_exp));
	note(j, aps_codec_quantize(j->f, b->x, b->n, &qo, b->codes, 4 * b->n, &st));
}

static void op_quant(struct job *j)
{
	struct aps_quant_opts qo = { .scale_exp = j->k, .rounding = APS_ROUND_NEAREST };
	struct aps_codec_stats st;
	struct bufs *b = j->b;

	note(j, aps_codec_quantize(j->f, b->x, b->n, &qo, b->codes, 4 * b->n, &st));
}

static void op_dequant(struct job *j)
{
	note(j, aps_codec_dequantize(j->f, j->b->codes, 4 * j->b->n, j->b->n, j->k, j->b->out));
}

static void op_accum(struct job *j)
{
	note(j, aps_codec_accumulate(j->f, j->b->codes, 4 * j->b->n, j->b->n, j->k, j->b->out));
}

/* Block scaling (32-element blocks): the exponents after the codes, as on the wire. */
static void op_quant_blocks(struct job *j)
{
	struct aps_quant_opts qo = { .rounding = APS_ROUND_NEAREST };
	struct bufs *b = j->b;
	size_t len = aps_format_packed_size(j->f, b->n);

	note(j, aps_codec_quantize_blocks(j->f, b->x, b->n, 32, &qo, b->codes, len,
	                                  (int8_t *)(b->codes + len),
	                                  aps_codec_block_count(b->n, 32), NULL));
}

static void op_dequant_blocks(struct job *j)
{
	struct bufs *b = j->b;
	size_t len = aps_format_packed_size(j->f, b->n);

	note(j, aps_codec_dequantize_blocks(j->f, b->codes, len, (const int8_t *)(b->codes + len),
	                                    aps_codec_block_count(b->n, 32), b->n, 32, b->out));
}

static void (*const ops[OP_COUNT])(struct job *) = {
	[OP_QUANT_SCAN] = op_quant_scan,
	[OP_QUANT] = op_quant,
	[OP_DEQUANT] = op_dequant,
	[OP_ACCUM] = op_accum,
};

/* Seconds per call of op, over one sample of inner calls. */
static double sample(void (*op)(struct job *), struct job *j, size_t inner)
{
	double t0 = bench_now();

	for (size_t i = 0; i < inner; i++)
		op(j);
	return (bench_now() - t0) / (double)inner;
}

/*
 * Best time of one call of op in seconds, over samples of at least
 * SAMPLE_FLOATS elements, after one warm-up sample. A call slower than
 * BUDGET_S is timed once more only.
 */
static double measure(void (*op)(struct job *), struct job *j)
{
	size_t inner = j->b->n >= SAMPLE_FLOATS ? 1 : SAMPLE_FLOATS / j->b->n;
	int min_samples = sample(op, j, inner) > BUDGET_S ? 1 : MIN_SAMPLES;
	double best = INFINITY;
	double start = bench_now();

	for (int s = 0; s < MAX_SAMPLES; s++) {
		best = fmin(best, sample(op, j, inner));
		if (s + 1 >= min_samples && bench_now() - start > BUDGET_S)
			break;
	}
	if (j->ret < 0)
		fail(j->f->name, j->ret);
	return best;
}

static void print_table_head(void)
{
	printf("| format | isa | k | quant+scan Ge/s | x copy | quant Ge/s | x copy "
	       "| dequant Ge/s | x copy | accum Ge/s | x copy |\n");
	printf("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n");
}

static void print_row(const struct job *j, int isa, const double t[OP_COUNT], double t_copy)
{
	printf("| %s | %s | %d |", j->f->name, aps_codec_isa_name((enum aps_codec_isa)isa), j->k);
	for (int op = 0; op < OP_COUNT; op++)
		printf(" %.2f | %.2f |", (double)j->b->n / t[op] * 1e-9, t[op] / t_copy);
	printf("\n");
	fflush(stdout);
}

/* One row: k from the data, codes for the decoders, then every op timed. */
static void bench_row(struct job *j, int isa, double t_copy)
{
	double t[OP_COUNT];
	int ret = aps_scale_local(j->f, aps_codec_maxabs(j->b->x, j->b->n), &j->k);

	if (ret < 0)
		fail("aps_scale_local", ret);
	op_quant(j);
	for (int op = 0; op < OP_COUNT; op++)
		t[op] = measure(ops[op], j);
	print_row(j, isa, t, t_copy);
}

static void bench_format(const struct options *o, struct bufs *b, const char *name, double t_copy)
{
	struct aps_format f;
	struct job j = { .f = &f, .b = b };
	int ret = aps_format_parse(name, &f);

	if (ret < 0)
		fail(name, ret);
	for (int isa = APS_ISA_SCALAR; isa <= APS_ISA_AVX512; isa++) {
		if (o->isa != APS_ISA_AUTO && isa != o->isa)
			continue;
		if (aps_codec_set_isa((enum aps_codec_isa)isa) < 0)
			continue;
		bench_row(&j, isa, t_copy);
	}
}

static void print_check(struct job *j)
{
	struct aps_format f;
	struct aps_quant_opts qo = { .rounding = APS_ROUND_NEAREST };
	struct aps_codec_stats st;
	double t_two, t_one, t_alone, t_copy;

	if (aps_format_parse("e4m3", &f) < 0 ||
	    aps_scale_local(&f, aps_codec_maxabs(j->b->x, j->b->n), &qo.scale_exp) < 0 ||
	    aps_codec_quantize(&f, j->b->x, j->b->n, &qo, j->b->codes, 4 * j->b->n, &st) < 0)
		fail("e4m3 codes", APS_EINVAL);
	j->f = &f;
	t_two = measure(op_check_two_passes, j);
	t_one = measure(op_check_one_pass, j);
	t_alone = measure(op_check_no_crc, j);
	t_copy = measure(op_memcpy_codes, j);
	printf("check of a payload of %zu e4m3 codes: CRC32C then inf/NaN, two passes %.2f us; "
	       "one pass %.2f us (%.2f GB/s, %.2fx a memcpy of the codes); inf/NaN alone (no "
	       "CRC) %.2f us (%.2f GB/s)\n\n",
	       j->b->n, t_two * 1e6, t_one * 1e6, (double)j->b->n / t_one * 1e-9, t_one / t_copy,
	       t_alone * 1e6, (double)j->b->n / t_alone * 1e-9);
	j->f = NULL;
}

/*
 * Block scaling against one exponent per tensor, auto ISA: quantize (with the
 * scan and k for per-tensor) plus dequantize, as a ratio to the memcpy.
 */
static void print_blocks(const struct options *o, struct bufs *b, double t_copy)
{
	static const char *const names[] = { "fp4", "fp6e2m3", "e4m3", "e3m0" };
	struct aps_format f;
	struct job j = { .f = &f, .b = b };

	aps_codec_set_isa(APS_ISA_AUTO);
	printf("\nblock scaling (blocks of 32, auto ISA %s) against one exponent per tensor:\n\n"
	       "| format | per tensor: quant+scan + dequant us | x copy | blocks: quant us | "
	       "dequant us | sum x copy | Ge/s each way |\n|---|--:|--:|--:|--:|--:|--:|\n",
	       aps_codec_isa_name(aps_codec_get_isa()));
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (o->format != NULL && strcmp(o->format, names[i]) != 0)
			continue;
		if (aps_format_parse(names[i], &f) < 0 ||
		    aps_scale_local(&f, aps_codec_maxabs(b->x, b->n), &j.k) < 0)
			fail(names[i], APS_EFORMAT);
		op_quant(&j);
		double t_tensor = measure(op_quant_scan, &j) + measure(op_dequant, &j);
		op_quant_blocks(&j);
		double t_q = measure(op_quant_blocks, &j), t_d = measure(op_dequant_blocks, &j);
		printf("| %s | %.1f | %.2f | %.1f | %.1f | %.2f | %.2f / %.2f |\n", f.name,
		       t_tensor * 1e6, t_tensor / t_copy, t_q * 1e6, t_d * 1e6,
		       (t_q + t_d) / t_copy, (double)b->n / t_q * 1e-9, (double)b->n / t_d * 1e-9);
	}
	printf("\n");
}

static void bench_size(const struct options *o, struct bufs *b)
{
	struct job j = { .b = b };
	double t_copy = measure(op_memcpy, &j);
	double mib = (double)(b->n * sizeof(float)) / (1 << 20);

	printf("\n### %zu floats (%g MiB fp32)\n\n", b->n, mib);
	printf("memcpy of the fp32 buffer: %.2f us, %.2f Ge/s, %.1f GB/s read+write\n\n",
	       t_copy * 1e6, (double)b->n / t_copy * 1e-9,
	       2.0 * (double)(b->n * sizeof(float)) / t_copy * 1e-9);
	double t_two = measure(op_scan_two_passes, &j), t_one = measure(op_scan_one_pass, &j);
	printf("inf/NaN check and max of the fp32 buffer (auto ISA): two passes %.2f us, one "
	       "pass %.2f us (%.1fx faster, %.2fx the memcpy)\n\n",
	       t_two * 1e6, t_one * 1e6, t_two / t_one, t_one / t_copy);
	print_check(&j);
	print_blocks(o, b, t_copy);
	print_table_head();
	if (o->format != NULL) {
		bench_format(o, b, o->format, t_copy);
		return;
	}
	for (size_t i = 0; i < sizeof(format_names) / sizeof(format_names[0]); i++)
		bench_format(o, b, format_names[i], t_copy);
}

static void *alloc_touched(size_t bytes)
{
	void *p = aligned_alloc(64, (bytes + 63) / 64 * 64);

	if (p == NULL)
		fail("aligned_alloc", APS_ENOMEM);
	memset(p, 0, bytes);
	return p;
}

static void run_size(const struct options *o, size_t n)
{
	struct bufs b = { .n = n };

	b.x = alloc_touched(n * sizeof(float));
	b.out = alloc_touched(n * sizeof(float));
	b.codes = alloc_touched(4 * n);
	bench_fill(b.x, n, UINT64_C(0x5eed) + n, 1e-3);
	bench_size(o, &b);
	free(b.codes);
	free(b.out);
	free(b.x);
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

static void print_header(enum aps_codec_isa auto_isa)
{
	char model[128];

	cpu_model(model, sizeof(model));
	printf("bench_codec: cpu \"%s\", auto isa %s, 1 thread, best of %d-%d samples "
	       "(1 if a call takes over %g s), Ge/s = 1e9 elements/s, x copy = time / memcpy "
	       "time\n",
	       model, aps_codec_isa_name(auto_isa), MIN_SAMPLES, MAX_SAMPLES, BUDGET_S);
}

static int parse_isa(const char *name)
{
	for (int isa = APS_ISA_SCALAR; isa <= APS_ISA_AVX512; isa++) {
		if (strcmp(name, aps_codec_isa_name((enum aps_codec_isa)isa)) == 0)
			return isa;
	}
	fprintf(stderr, "bench_codec: --isa %s: expected scalar, avx2 or avx512\n", name);
	exit(2);
}

static void usage(FILE *to, int status)
{
	fprintf(to, "usage: bench_codec [--quick] [--isa scalar|avx2|avx512] [--format NAME]\n");
	exit(status);
}

static void parse_args(int argc, char **argv, struct options *o)
{
	struct aps_format f;

	for (int i = 1; i < argc; i++) {
		bool has_value = i + 1 < argc;

		if (strcmp(argv[i], "--quick") == 0)
			o->quick = true;
		else if (strcmp(argv[i], "--isa") == 0 && has_value)
			o->isa = parse_isa(argv[++i]);
		else if (strcmp(argv[i], "--format") == 0 && has_value)
			o->format = argv[++i];
		else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0)
			usage(stdout, 0);
		else
			usage(stderr, 2);
	}
	if (o->format != NULL && aps_format_parse(o->format, &f) < 0) {
		fprintf(stderr, "bench_codec: --format %s: unknown format\n", o->format);
		exit(2);
	}
	if (o->isa != APS_ISA_AUTO && aps_codec_set_isa((enum aps_codec_isa)o->isa) < 0) {
		fprintf(stderr, "bench_codec: --isa %s: not supported by this CPU\n",
		        aps_codec_isa_name((enum aps_codec_isa)o->isa));
		exit(2);
	}
}

int main(int argc, char **argv)
{
	struct options o = { .isa = APS_ISA_AUTO };
	enum aps_codec_isa auto_isa = aps_codec_get_isa();

	parse_args(argc, argv, &o);
	print_header(auto_isa);
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		if (!o.quick || sizes[i] <= QUICK_MAX_N)
			run_size(&o, sizes[i]);
	}
	return 0;
}
