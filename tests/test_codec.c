/*
 * Unit tests of the codec (common/codec.h): the test values of APS.md 1, every
 * code of every format through decode and encode, the vector paths against the
 * scalar reference, the scalar reference against a literal double-precision
 * reading of the spec, counts, stochastic rounding, and argument errors.
 */
#include "common/codec.h"
#include "common/codec_kernels.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/format.h"
#include "common/pack.h"
#include "common/scale.h"

#include <float.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static const char *const named[] = { "fp32",   "bf16", "fp16", "e5m2",    "e4m3",
	                             "e4m3fn", "e3m0", "fp4",  "fp6e2m3", "fp6e3m2" };
#define N_NAMED (sizeof(named) / sizeof(named[0]))

static enum aps_codec_isa isas[3];
static int n_isas;

static int setup_isas(void **state)
{
	(void)state;
	n_isas = 0;
	for (int isa = APS_ISA_SCALAR; isa <= APS_ISA_AVX512; isa++) {
		if (aps_codec_set_isa((enum aps_codec_isa)isa) == 0)
			isas[n_isas++] = (enum aps_codec_isa)isa;
	}
	aps_codec_set_isa(APS_ISA_AUTO);
	return 0;
}

static struct aps_format fmt(const char *name)
{
	struct aps_format f;

	assert_int_equal(aps_format_parse(name, &f), 0);
	return f;
}

static uint32_t bits_of(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

static float float_of(uint32_t u)
{
	float x;

	memcpy(&x, &u, sizeof(x));
	return x;
}

/* xorshift64*: deterministic test data */
static uint64_t rng_state = 0x2545f4914f6cdd1dULL;

static uint64_t next_rand(void)
{
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dULL;
}

/* Quantizes then dequantizes one value on the current ISA. */
static float roundtrip(const struct aps_format *f, float x, int k)
{
	struct aps_quant_opts o = { .scale_exp = k };
	float in[16], out[16];
	uint8_t codes[64];

	for (int i = 0; i < 16; i++)
		in[i] = x;
	assert_int_equal(aps_codec_quantize(f, in, 16, &o, codes, sizeof(codes), NULL), 0);
	assert_int_equal(aps_codec_dequantize(f, codes, sizeof(codes), 16, k, out), 0);
	for (int i = 1; i < 16; i++)
		assert_memory_equal(&out[i], &out[0], sizeof(float));
	return out[0];
}

struct spec_case {
	const char *format;
	double in, want;
};

/* APS.md section 1, "Test values". */
static const struct spec_case spec_cases[] = {
	{ "e5m2", 57344, 57344 },
	{ "e5m2", 61439, 57344 },
	{ "e5m2", 61440, 57344 },
	{ "e5m2", 1.125, 1.0 },
	{ "e5m2", 1.375, 1.5 },
	{ "e5m2", 17.5, 16 },
	{ "e5m2", 0x1p-16, 0x1p-16 },
	{ "e5m2", 0x1p-17, 0 },
	{ "e5m2", 0x1.8p-16, 0x1p-15 },
	{ "e4m3", 247, 240 },
	{ "e4m3", 0x1p-10, 0 },
	{ "e4m3", 0x1.8p-10, 0x1p-9 },
	{ "e4m3", 1.0625, 1.0 },
	{ "e4m3", 1.1875, 1.25 },
	{ "e3m0", 3, 4 },
	{ "e3m0", 6, 8 },
	{ "e3m0", 0.125, 0 },
	{ "e3m0", 0.1251, 0.25 },
	{ "e3m0", 0.75, 1 },
	{ "e4m3fn", 448, 448 },
	{ "e4m3fn", 464, 448 },
	{ "e4m3fn", 465, 448 },
};

static void test_codec_spec_values(void **state)
{
	(void)state;
	for (int s = 0; s < n_isas; s++) {
		aps_codec_set_isa(isas[s]);
		for (size_t i = 0; i < sizeof(spec_cases) / sizeof(spec_cases[0]); i++) {
			struct aps_format f = fmt(spec_cases[i].format);
			float in = (float)spec_cases[i].in, want = (float)spec_cases[i].want;
			/* The same value reached through a scale exponent must agree. */
			for (int k = -3; k <= 3; k++) {
				float got = roundtrip(&f, ldexpf(in, -k), k);
				float want_k = ldexpf(want, -k);
				if (got != want_k || signbit(got) != signbit(want_k))
					fail_msg("%s %s: %.9g (k=%d) -> %.9g, want %.9g",
					         aps_codec_isa_name(isas[s]), f.name, (double)in, k,
					         (double)got, (double)want_k);
				assert_true(roundtrip(&f, -ldexpf(in, -k), k) == -want_k);
			}
		}
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

static void test_codec_format_limits(void **state)
{
	static const struct {
		const char *name;
		double max, min_normal, min_subnormal;
	} table[] = {
		{ "fp32", 3.4028234663852886e38, 0x1p-126, 0x1p-149 },
		{ "bf16", 3.3895313892515355e38, 0x1p-126, 0x1p-133 },
		{ "fp16", 65504, 0x1p-14, 0x1p-24 },
		{ "e5m2", 57344, 0x1p-14, 0x1p-16 },
		{ "e4m3", 240, 0x1p-6, 0x1p-9 },
		{ "e4m3fn", 448, 0x1p-6, 0x1p-9 },
		{ "e3m0", 8, 0x1p-2, 0 },
	};
	(void)state;
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		struct aps_format f = fmt(table[i].name);
		assert_true(f.max_finite == (float)table[i].max);
		assert_true(f.min_normal == (float)table[i].min_normal);
		assert_true(f.min_subnormal == (float)table[i].min_subnormal);
	}
}

/* The canonical NaN codes of APS.md 1. */
static void test_codec_nan_codes(void **state)
{
	(void)state;
	assert_int_equal(fmt("e5m2").nan_code, 0x7e);
	assert_int_equal(fmt("e4m3fn").nan_code, 0x7f);
	assert_int_equal(fmt("fp16").nan_code, 0x7e00);
	assert_int_equal(fmt("fp32").nan_code, 0x7fc00000);
	assert_int_equal(fmt("e3m0").nan_code, fmt("e3m0").inf_code);
}

/* Every code of f: decode, then encode the decoded value on every ISA. */
static void check_all_codes(const struct aps_format *f)
{
	size_t n = (size_t)1 << f->bits;
	float *values = malloc(n * sizeof(float));
	uint8_t *codes = malloc(aps_format_packed_size(f, n));
	uint8_t *again = malloc(aps_format_packed_size(f, n));
	uint32_t *want = malloc(n * sizeof(uint32_t));
	uint32_t *got = malloc(n * sizeof(uint32_t));
	struct aps_quant_opts o = { 0 };

	for (uint32_t c = 0; c < n; c++) {
		uint32_t mag = c & (f->sign_bit - 1);
		values[c] = (float)aps_format_decode(f, c);
		want[c] = c;
		if (aps_format_code_is_nonfinite(f, c)) {
			bool inf = f->layout == APS_LAYOUT_IEEE && mag == f->inf_code;
			assert_true(inf ? isinf(values[c]) : isnan(values[c]));
			/* inf saturates, NaN becomes the canonical NaN. */
			want[c] = inf ? (c & f->sign_bit) | f->max_code : f->nan_code;
		}
	}
	aps_pack_codes(want, n, f->bits, codes);
	for (int s = 0; s < n_isas; s++) {
		aps_codec_set_isa(isas[s]);
		assert_int_equal(aps_codec_quantize(f, values, n, &o, again,
		                                    aps_format_packed_size(f, n), NULL),
		                 0);
		aps_unpack_codes(again, n, f->bits, got);
		for (uint32_t c = 0; c < n; c++) {
			if (got[c] != want[c])
				fail_msg("%s %s: code %#x decodes to %.9g, encodes to %#x",
				         aps_codec_isa_name(isas[s]), f->name, c, (double)values[c],
				         got[c]);
		}
	}
	aps_codec_set_isa(APS_ISA_AUTO);
	free(values);
	free(codes);
	free(again);
	free(want);
	free(got);
}

static void test_codec_every_code_roundtrips(void **state)
{
	struct aps_format f;

	(void)state;
	for (size_t i = 1; i < N_NAMED; i++) {
		f = fmt(named[i]);
		check_all_codes(&f);
	}
	for (int x = 2; x <= 8; x++) {
		for (int y = 0; 1 + x + y <= 16; y++) {
			assert_int_equal(aps_format_make(x, y, APS_LAYOUT_IEEE, &f), 0);
			check_all_codes(&f);
			if (x < 8) {
				assert_int_equal(aps_format_make(x, y, APS_LAYOUT_MX, &f), 0);
				check_all_codes(&f);
			}
			if (y > 0 && x < 8) {
				assert_int_equal(aps_format_make(x, y, APS_LAYOUT_FN, &f), 0);
				check_all_codes(&f);
			}
		}
	}
}

/* fp32 codes: a sample of bit patterns, since 2^32 is for make test-long. */
static void test_codec_fp32_is_identity(void **state)
{
	struct aps_format f = fmt("fp32");
	enum {
		N = 4099
	};
	float in[N], out[N];
	uint8_t codes[4 * N];
	struct aps_quant_opts o = { 0 };

	(void)state;
	for (int i = 0; i < N; i++)
		in[i] = float_of((uint32_t)next_rand() & 0xff7fffffu); /* finite */
	for (int s = 0; s < n_isas; s++) {
		aps_codec_set_isa(isas[s]);
		assert_int_equal(aps_codec_quantize(&f, in, N, &o, codes, sizeof(codes), NULL), 0);
		assert_int_equal(aps_codec_dequantize(&f, codes, sizeof(codes), N, 0, out), 0);
		assert_memory_equal(in, out, sizeof(in));
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

/* APS.md 1 read literally, in double precision: the oracle for the scalar path. */
static double spec_quantize(const struct aps_format *f, float x, int k)
{
	double v = ldexp((double)x, k), spacing, r;
	int e;

	if (isnan(x))
		return f->man_bits ? NAN : INFINITY; /* Y = 0: NaN becomes the +inf code */
	if (isinf(x))
		return ldexp(copysign(f->max_finite, x), -k);
	if (v == 0)
		return v;
	frexp(v, &e);
	e -= 1; /* frexp gives v = m * 2^e with 0.5 <= |m| < 1 */
	if (e < f->emin)
		e = f->emin;
	spacing = ldexp(1.0, e - f->man_bits);
	r = nearbyint(v / spacing) * spacing;
	if (fabs(r) > f->max_finite)
		r = copysign(f->max_finite, v);
	if (r == 0)
		r = copysign(0.0, v);
	return ldexp(r, -k);
}

/* Values that stress rounding: ties between neighbours and their neighbours. */
static float edge_value(const struct aps_format *f, int k)
{
	uint32_t c = (uint32_t)next_rand() & (f->sign_bit - 1);
	double a, b, mid;

	if (c >= f->max_code)
		c = f->max_code;
	a = aps_format_decode(f, c);
	b = c == f->max_code ? 2 * f->max_finite - aps_format_decode(f, c - 1)
	                     : aps_format_decode(f, c + 1);
	mid = ldexp((a + b) / 2, -k);
	switch (next_rand() % 6) {
	case 0:
		return (float)mid;
	case 1:
		return nextafterf((float)mid, INFINITY);
	case 2:
		return nextafterf((float)mid, 0);
	case 3:
		return (float)ldexp(a, -k);
	case 4:
		return -(float)mid;
	default:
		return float_of((uint32_t)next_rand());
	}
}

static const char *const sample_formats[] = {
	"fp32", "bf16", "fp16", "e5m2", "e4m3", "e4m3fn", "e3m0", "e2m1",  "e2m5",
	"e3m4", "e6m1", "e7m0", "e5m3", "e8m0", "e6m9",   "e8m7", "e2m13", "e3m2fn",
};
static const int sample_scales[] = { 0,    1,   -1,  5,    -7,   20,  -20, 60,   -60, 100,
	                             -100, 126, 127, -126, -127, 130, 160, -200, 300 };

static void fill_edge_values(const struct aps_format *f, int k, float *x, size_t n)
{
	static const float specials[] = { 0.0f,    -0.0f,    INFINITY, -INFINITY, NAN,     -NAN,
		                          FLT_MAX, -FLT_MAX, FLT_MIN,  1e-45f,    -1e-45f, 1e-40f };

	for (size_t i = 0; i < n; i++) {
		if (next_rand() % 16 == 0)
			x[i] = specials[next_rand() % (sizeof(specials) / sizeof(specials[0]))];
		else
			x[i] = edge_value(f, k);
	}
}

static void test_codec_scalar_matches_spec(void **state)
{
	enum {
		N = 3000
	};
	float x[N], out[N];
	uint8_t codes[4 * N];

	(void)state;
	aps_codec_set_isa(APS_ISA_SCALAR);
	for (size_t fi = 0; fi < sizeof(sample_formats) / sizeof(sample_formats[0]); fi++) {
		struct aps_format f = fmt(sample_formats[fi]);
		for (size_t si = 0; si < sizeof(sample_scales) / sizeof(sample_scales[0]); si++) {
			int k = sample_scales[si];
			struct aps_quant_opts o = { .scale_exp = k };
			fill_edge_values(&f, k, x, N);
			assert_int_equal(
			        aps_codec_quantize(&f, x, N, &o, codes, sizeof(codes), NULL), 0);
			for (size_t i = 0; i < N; i++) {
				double want = spec_quantize(&f, x[i], k);
				double got = ldexp(
				        aps_format_decode(
				                &f,
				                aps_scalar_encode(&f, x[i], k,
				                                  &(struct aps_codec_stats){ 0 })),
				        -k);
				if (isnan(want) ? !isnan(got)
				                : (got != want || signbit(got) != signbit(want)))
					fail_msg("%s k=%d: %a -> %a, spec says %a", f.name, k,
					         (double)x[i], got, want);
			}
			assert_int_equal(aps_codec_dequantize(&f, codes, sizeof(codes), N, k, out),
			                 0);
			for (size_t i = 0; i < N; i++) {
				float want = (float)spec_quantize(&f, x[i], k);
				if (isnan(want) ? !isnan(out[i]) : bits_of(out[i]) != bits_of(want))
					fail_msg("%s k=%d: decode of %a is %a, want %a", f.name, k,
					         (double)x[i], (double)out[i], (double)want);
			}
		}
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

static void quantize_on(enum aps_codec_isa isa, const struct aps_format *f, const float *x,
                        size_t n, int k, uint8_t *codes, size_t len, struct aps_codec_stats *st)
{
	struct aps_quant_opts o = { .scale_exp = k };

	aps_codec_set_isa(isa);
	memset(codes, 0xa5, len);
	assert_int_equal(aps_codec_quantize(f, x, n, &o, codes, len, st), 0);
}

static void compare_isas_once(const struct aps_format *f, int k, size_t n)
{
	size_t len = aps_format_packed_size(f, n);
	float *x = malloc(n * sizeof(float)), *ref = malloc(n * sizeof(float));
	float *out = malloc(n * sizeof(float));
	uint8_t *want = malloc(len + 1), *got = malloc(len + 1);
	struct aps_codec_stats st_want, st_got;

	fill_edge_values(f, k, x, n);
	quantize_on(APS_ISA_SCALAR, f, x, n, k, want, len + 1, &st_want);
	assert_int_equal(aps_codec_dequantize(f, want, len, n, k, ref), 0);
	for (int s = 1; s < n_isas; s++) {
		quantize_on(isas[s], f, x, n, k, got, len + 1, &st_got);
		if (memcmp(want, got, len + 1) != 0)
			fail_msg("%s %s k=%d n=%zu: codes differ from scalar",
			         aps_codec_isa_name(isas[s]), f->name, k, n);
		assert_int_equal(st_want.overflow, st_got.overflow);
		assert_int_equal(st_want.nonfinite, st_got.nonfinite);
		assert_int_equal(st_want.flushed, st_got.flushed);
		assert_true(bits_of(st_want.maxabs) == bits_of(st_got.maxabs));
		assert_int_equal(aps_codec_dequantize(f, want, len, n, k, out), 0);
		for (size_t i = 0; i < n; i++) {
			if (bits_of(out[i]) != bits_of(ref[i]))
				fail_msg("%s %s k=%d: decode of code %zu is %a, scalar %a",
				         aps_codec_isa_name(isas[s]), f->name, k, i, (double)out[i],
				         (double)ref[i]);
		}
	}
	aps_codec_set_isa(APS_ISA_AUTO);
	free(x);
	free(ref);
	free(out);
	free(want);
	free(got);
}

static void test_codec_vector_matches_scalar(void **state)
{
	static const size_t sizes[] = { 1, 7, 8, 15, 16, 17, 31, 33, 100, 1027, 4099 };

	(void)state;
	for (size_t fi = 0; fi < sizeof(sample_formats) / sizeof(sample_formats[0]); fi++) {
		struct aps_format f = fmt(sample_formats[fi]);
		for (size_t si = 0; si < sizeof(sample_scales) / sizeof(sample_scales[0]); si++) {
			for (size_t zi = 0; zi < sizeof(sizes) / sizeof(sizes[0]); zi++)
				compare_isas_once(&f, sample_scales[si], sizes[zi]);
		}
	}
}

static void test_codec_accumulate_is_dequantize_plus_add(void **state)
{
	enum {
		N = 1001
	};
	float x[N], acc[N], want[N], dec[N];
	uint8_t codes[4 * N];

	(void)state;
	for (size_t fi = 0; fi < N_NAMED; fi++) {
		struct aps_format f = fmt(named[fi]);
		for (int s = 0; s < n_isas; s++) {
			aps_codec_set_isa(isas[s]);
			for (int i = 0; i < N; i++) {
				x[i] = (float)((int64_t)(next_rand() % 2001) - 1000) / 37.0f;
				acc[i] = want[i] =
				        (float)((int64_t)(next_rand() % 200) - 100) / 3.0f;
			}
			struct aps_quant_opts o = { .scale_exp = 3 };
			assert_int_equal(
			        aps_codec_quantize(&f, x, N, &o, codes, sizeof(codes), NULL), 0);
			assert_int_equal(aps_codec_dequantize(&f, codes, sizeof(codes), N, 3, dec),
			                 0);
			for (int i = 0; i < N; i++)
				want[i] += dec[i];
			assert_int_equal(aps_codec_accumulate(&f, codes, sizeof(codes), N, 3, acc),
			                 0);
			assert_memory_equal(acc, want, sizeof(acc));
		}
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

static void test_codec_counts(void **state)
{
	struct aps_format f = fmt("e4m3");
	const float x[] = { 1.0f,  300.0f, -250.0f,  INFINITY,   NAN,  1e-4f, -1e-4f, 0.0f,
		            -0.0f, 100.0f, 0x1p-10f, 0x1.8p-10f, 5.0f, -7.0f, 239.0f, 248.0f };
	struct aps_codec_stats st;
	struct aps_quant_opts o = { 0 };
	uint8_t codes[16];

	(void)state;
	for (int s = 0; s < n_isas; s++) {
		aps_codec_set_isa(isas[s]);
		assert_int_equal(aps_codec_quantize(&f, x, 16, &o, codes, sizeof(codes), &st), 0);
		assert_int_equal(st.overflow, 3); /* 300, -250, 248 */
		assert_int_equal(st.nonfinite, 2);
		assert_int_equal(st.flushed, 3); /* +-1e-4 and 2^-10 */
		assert_true(st.maxabs == 300.0f);
		assert_int_equal(codes[3], f.max_code);
		assert_int_equal(codes[4], f.nan_code);
		assert_int_equal(codes[8], 0x80); /* -0 keeps its sign */
		assert_int_equal(codes[6], 0x80); /* so does a negative flush */
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

static void test_codec_stochastic_rounding(void **state)
{
	struct aps_format f = fmt("e4m3");
	enum {
		N = 20000
	};
	static float x[N], y[N];
	static uint8_t whole[N], split[N];
	struct aps_quant_opts o = { .rounding = APS_ROUND_STOCHASTIC, .seed = 7, .stream = 3 };
	double sum = 0;

	(void)state;
	for (int i = 0; i < N; i++)
		x[i] = 1.1f; /* between 1.0 and 1.125: E[q] = 1.1 */
	assert_int_equal(aps_codec_quantize(&f, x, N, &o, whole, N, NULL), 0);
	assert_int_equal(aps_codec_quantize(&f, x, 777, &o, split, N, NULL), 0);
	o.index0 = 777;
	assert_int_equal(aps_codec_quantize(&f, x + 777, N - 777, &o, split + 777, N - 777, NULL),
	                 0);
	assert_memory_equal(whole, split, N);
	assert_int_equal(aps_codec_dequantize(&f, whole, N, N, 0, y), 0);
	for (int i = 0; i < N; i++) {
		assert_true(y[i] == 1.0f || y[i] == 1.125f);
		sum += y[i];
	}
	assert_true(fabs(sum / N - 1.1) < 0.002);
	/* Another stream gives other bits; representable values never move. */
	o.index0 = 0;
	o.stream = 4;
	assert_int_equal(aps_codec_quantize(&f, x, N, &o, split, N, NULL), 0);
	assert_memory_not_equal(whole, split, N);
	for (int i = 0; i < N; i++)
		x[i] = 1.125f;
	assert_int_equal(aps_codec_quantize(&f, x, N, &o, split, N, NULL), 0);
	for (int i = 0; i < N; i++)
		assert_int_equal(split[i], split[0]);
}

static void test_codec_rejects_bad_arguments(void **state)
{
	struct aps_format f = fmt("e3m0");
	struct aps_quant_opts o = { 0 };
	float x[9] = { 0 };
	uint8_t codes[8];

	(void)state;
	assert_int_equal(aps_codec_quantize(&f, x, 9, &o, codes, 4, NULL), APS_ESHORT);
	assert_int_equal(aps_codec_quantize(&f, x, 9, &o, codes, 5, NULL), 0);
	assert_int_equal(aps_codec_quantize(&f, NULL, 9, &o, codes, 5, NULL), APS_EINVAL);
	o.scale_exp = APS_CODEC_SCALE_MAX + 1;
	assert_int_equal(aps_codec_quantize(&f, x, 9, &o, codes, 5, NULL), APS_ERANGE);
	assert_int_equal(aps_codec_dequantize(&f, codes, 4, 9, 0, x), APS_ESHORT);
	assert_int_equal(aps_codec_dequantize(&f, codes, 5, 9, -400, x), APS_ERANGE);
	assert_int_equal(
	        aps_codec_quantize(&f, NULL, 0, &(struct aps_quant_opts){ 0 }, NULL, 0, NULL), 0);
}

static void test_codec_maxabs_ignores_nonfinite(void **state)
{
	float x[37];

	(void)state;
	for (int i = 0; i < 37; i++)
		x[i] = (float)(i - 18);
	x[3] = NAN;
	x[20] = -INFINITY;
	x[36] = 1e30f;
	x[35] = -2e30f;
	for (int s = 0; s < n_isas; s++) {
		aps_codec_set_isa(isas[s]);
		assert_true(aps_codec_maxabs(x, 37) == 2e30f);
		assert_true(aps_codec_maxabs(x, 35) == 18.0f);
		assert_true(aps_codec_maxabs(x, 0) == 0.0f);
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

/* The one-pass scan finds an inf or NaN wherever it is: vector body or tail. */
static void test_codec_scan_flags_nonfinite_anywhere(void **state)
{
	static const float bad[] = { NAN, -NAN, INFINITY, -INFINITY };
	float x[77];
	bool nonfinite;

	(void)state;
	for (int s = 0; s < n_isas; s++) {
		aps_codec_set_isa(isas[s]);
		for (int i = 0; i < 77; i++)
			x[i] = (float)(i % 13) - 6.5f;
		assert_true(aps_codec_scan(x, 77, &nonfinite) == 6.5f);
		assert_false(nonfinite);
		for (int pos = 0; pos < 77; pos++) {
			for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
				float keep = x[pos];
				x[pos] = bad[b];
				aps_codec_scan(x, 77, &nonfinite);
				assert_true(nonfinite);
				aps_codec_scan(x, (size_t)pos, &nonfinite);
				assert_false(nonfinite); /* what comes before it is finite */
				x[pos] = keep;
			}
		}
		x[40] = 3.4028235e38f; /* the largest finite float is not flagged */
		assert_true(aps_codec_scan(x, 77, &nonfinite) == 3.4028235e38f);
		assert_false(nonfinite);
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

/* The fast counts of inf and NaN codes agree with the code-by-code definition. */
static void test_codec_count_nonfinite_codes(void **state)
{
	static const char *const names[] = { "e5m2", "e4m3", "e4m3fn", "fp16",
		                             "bf16", "e3m0", "e2m5",   "e6m9" };
	static uint8_t codes[2 * 4099];

	(void)state;
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		struct aps_format f = fmt(names[k]);
		size_t n = 4099, want = 0;
		struct aps_bitreader r = { .in = codes };
		for (size_t i = 0; i < sizeof(codes); i++)
			codes[i] = (uint8_t)next_rand();
		for (size_t i = 0; i < n; i++)
			want += aps_format_code_is_nonfinite(&f, aps_bitreader_get(&r, f.bits));
		assert_true(want > 0);
		assert_int_equal(aps_codec_count_nonfinite(&f, codes, n), want);
	}
}

/* Every non-finite code of the n packed in codes made 0 (the padding stays garbage). */
static void make_finite(const struct aps_format *f, uint8_t *codes, size_t n)
{
	static uint32_t unpacked[40001];

	aps_unpack_codes(codes, n, f->bits, unpacked);
	for (size_t i = 0; i < n; i++)
		if (aps_format_code_is_nonfinite(f, unpacked[i]))
			unpacked[i] = 0;
	if (f->bits == 4 && n % 2 == 1) { /* keep the garbage nibble after the last code */
		uint8_t pad = codes[n / 2] & 0xf0;
		aps_pack_codes(unpacked, n, f->bits, codes);
		codes[n / 2] = (uint8_t)((codes[n / 2] & 0x0f) | pad);
		return;
	}
	aps_pack_codes(unpacked, n, f->bits, codes);
}

static size_t count_by_code(const struct aps_format *f, const uint8_t *codes, size_t n)
{
	struct aps_bitreader r = { .in = codes };
	size_t want = 0;

	for (size_t i = 0; i < n; i++)
		want += aps_format_code_is_nonfinite(f, aps_bitreader_get(&r, f->bits));
	return want;
}

/* One non-finite code among finite ones is found wherever it is (the fast tests of
 * whole words pass every word of finite codes). */
static void test_codec_one_nonfinite_code_is_found_anywhere(void **state)
{
	static const char *const names[] = { "e4m3", "e4m3fn", "e3m0", "bf16", "e2m5", "fp32" };
	static uint8_t codes[4 * 301];

	(void)state;
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		struct aps_format f = fmt(names[k]);
		size_t n = 301, len = aps_format_packed_size(&f, n);
		uint32_t all[301], crc;
		for (size_t i = 0; i < n; i++) /* every finite magnitude and sign in turn */
			all[i] = (uint32_t)(i % (f.max_code + 1)) | (i & 1 ? f.sign_bit : 0);
		for (size_t at = 0; at < n; at += 7) {
			uint32_t keep = all[at];
			all[at] = f.nan_code | (at & 2 ? f.sign_bit : 0);
			aps_pack_codes(all, n, f.bits, codes);
			assert_int_equal(aps_codec_count_nonfinite(&f, codes, n), 1);
			assert_int_equal(aps_codec_crc_nonfinite(&f, codes, len, n, &crc), 1);
			all[at] = keep;
		}
		aps_pack_codes(all, n, f.bits, codes);
		assert_int_equal(aps_codec_count_nonfinite(&f, codes, n), 0);
		assert_int_equal(aps_codec_crc_nonfinite(&f, codes, len, n, &crc), 0);
	}
}

/* The validator's one pass: the same CRC as aps_crc32c and the same count as
 * aps_codec_count_nonfinite, for every kind of format, with zero, one or many
 * non-finite codes, an odd count of 4-bit codes whose padding nibble is garbage,
 * and payloads long enough for the CRC's three chains. */
static void test_codec_crc_nonfinite_is_crc_and_count(void **state)
{
	static const char *const names[] = { "e5m2", "e4m3", "e4m3fn", "fp16", "bf16",
		                             "e3m0", "e2m1", "e2m5",   "e6m9", "fp32" };
	static const size_t counts[] = { 1, 7, 4099, 40001 };
	static uint8_t codes[4 * 40001];

	(void)state;
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		struct aps_format f = fmt(names[k]);
		for (size_t c = 0; c < sizeof(counts) / sizeof(counts[0]); c++) {
			size_t n = counts[c], len = aps_format_packed_size(&f, n), bad;
			uint32_t crc;
			for (int finite = 1; finite >= 0; finite--) {
				for (size_t i = 0; i < len; i++)
					codes[i] = (uint8_t)next_rand();
				if (finite)
					make_finite(&f, codes, n);
				bad = aps_codec_crc_nonfinite(&f, codes, len, n, &crc);
				assert_int_equal(crc, aps_crc32c(0, codes, len));
				assert_int_equal(bad, count_by_code(&f, codes, n));
				assert_int_equal(aps_codec_count_nonfinite(&f, codes, n), bad);
				assert_true(finite ? bad == 0 : (n < 4099 || bad > 0));
			}
		}
	}
}

/* Blocks of very different magnitudes: zero, fp32-subnormal, tiny, huge, with inf and NaN. */
static void fill_blocks(float *x, size_t n, size_t block)
{
	for (size_t i = 0; i < n; i++) {
		size_t b = i / block;
		int e = (int)(next_rand() % 60) - 30;
		float v = (float)ldexp((double)(int32_t)(next_rand() % 2000001 - 1000000) / 1e6, e);
		switch (b % 7) {
		case 0:
			x[i] = 0.0f;
			break;
		case 1:
			x[i] = float_of((uint32_t)(next_rand() & 0x807fffffu)); /* subnormal */
			break;
		case 2:
			x[i] = v * 1e-30f;
			break;
		case 3:
			x[i] = v * 1e30f;
			break;
		default:
			x[i] = (float)ldexp(v, (int)(b % 11) * 4 - 20);
			break;
		}
	}
	if (n > 3 * block + 5) {
		x[3 * block + 1] = INFINITY;
		x[3 * block + 5] = NAN;
	}
}

/*
 * Each block holds the bits aps_codec_quantize gives for it at its exponent,
 * and its exponent is the local APS rule over that block alone, on every ISA,
 * for whole and short last blocks; decoding is per block the plain decode.
 */
static void test_codec_blocks_are_per_block_aps(void **state)
{
	static const char *const fmts[] = { "fp4",  "fp6e2m3", "fp6e3m2", "e4m3", "e4m3fn",
		                            "e5m2", "e3m0",    "fp16",    "bf16" };
	static const size_t blocks[] = { 16, 32, 64 }, sizes[] = { 1, 15, 64, 1000, 4099 };
	enum {
		N = 4099
	};
	static float x[N], got[N], want[N];
	static uint8_t codes[2 * N], ref[2 * N];
	static int8_t exps[N];
	struct aps_quant_opts o = { 0 };

	(void)state;
	for (size_t fi = 0; fi < sizeof(fmts) / sizeof(fmts[0]); fi++) {
		struct aps_format f = fmt(fmts[fi]);
		for (size_t bi = 0; bi < 3; bi++) {
			size_t block = blocks[bi];
			for (size_t si = 0; si < sizeof(sizes) / sizeof(sizes[0]); si++) {
				size_t n = sizes[si], nb = aps_codec_block_count(n, block);
				fill_blocks(x, n, block);
				for (int s = 0; s < n_isas; s++) {
					struct aps_codec_stats st;
					aps_codec_set_isa(isas[s]);
					assert_int_equal(aps_codec_quantize_blocks(
					                         &f, x, n, block, &o, codes,
					                         sizeof(codes), exps, nb, &st),
					                 0);
					assert_int_equal(st.overflow,
					                 0); /* the rule never saturates */
					for (size_t b = 0; b < nb; b++) {
						size_t at = b * block,
						       len = n - at < block ? n - at : block;
						int k = aps_scale_block(
						        &f, aps_codec_maxabs(x + at, len));
						struct aps_quant_opts ok = { .scale_exp = k };
						size_t bytes = aps_format_packed_size(&f, len);
						if (exps[b] != k)
							fail_msg(
							        "%s %s block %zu/%zu: exponent %d, want %d",
							        aps_codec_isa_name(isas[s]), f.name,
							        b, block, exps[b], k);
						aps_codec_quantize(&f, x + at, len, &ok, ref,
						                   sizeof(ref), NULL);
						if (memcmp(codes + at * f.bits / 8, ref, bytes) !=
						    0)
							fail_msg(
							        "%s %s block %zu of %zu: codes differ",
							        aps_codec_isa_name(isas[s]), f.name,
							        b, block);
						aps_codec_dequantize(&f, ref, bytes, len, k,
						                     want + at);
					}
					for (size_t i = 0; i < n; i++)
						got[i] = 1.0f;
					assert_int_equal(aps_codec_dequantize_blocks(
					                         &f, codes, sizeof(codes), exps, nb,
					                         n, block, got),
					                 0);
					for (size_t i = 0; i < n; i++) {
						if (memcmp(&got[i], &want[i], sizeof(float)) != 0)
							fail_msg(
							        "%s %s: element %zu decodes to %g, want %g",
							        aps_codec_isa_name(isas[s]), f.name,
							        i, (double)got[i], (double)want[i]);
					}
					assert_int_equal(aps_codec_accumulate_blocks(
					                         &f, codes, sizeof(codes), exps, nb,
					                         n, block, got),
					                 0);
					for (size_t i = 0; i < n; i++) {
						float twice = want[i] + want[i];
						if (!isnan(twice) &&
						    memcmp(&got[i], &twice, sizeof(float)) != 0)
							fail_msg(
							        "%s %s: element %zu accumulates to %g",
							        f.name, aps_codec_isa_name(isas[s]),
							        i, (double)got[i]);
					}
				}
			}
		}
	}
	aps_codec_set_isa(APS_ISA_AUTO);
}

static void test_codec_blocks_reject_bad_arguments(void **state)
{
	struct aps_format f = fmt("fp4");
	struct aps_quant_opts o = { 0 };
	float x[64] = { 1.0f };
	uint8_t codes[32];
	int8_t exps[4];

	(void)state;
	assert_int_equal(aps_codec_quantize_blocks(&f, x, 64, 8, &o, codes, 32, exps, 4, NULL),
	                 APS_EINVAL);
	assert_int_equal(aps_codec_quantize_blocks(&f, x, 64, 48, &o, codes, 32, exps, 4, NULL),
	                 APS_EINVAL);
	assert_int_equal(aps_codec_quantize_blocks(&f, x, 64, 16, &o, codes, 32, exps, 3, NULL),
	                 APS_ESHORT);
	assert_int_equal(aps_codec_quantize_blocks(&f, x, 64, 16, &o, codes, 31, exps, 4, NULL),
	                 APS_ESHORT);
	assert_int_equal(aps_codec_dequantize_blocks(&f, codes, 32, exps, 1, 64, 32, x),
	                 APS_ESHORT);
	assert_int_equal(aps_codec_dequantize_blocks(&f, codes, 32, NULL, 2, 64, 32, x),
	                 APS_EINVAL);
	/* An all-zero block has exponent 0; a block's exponent stays within int8. */
	memset(x, 0, sizeof(x));
	x[40] = 1e-44f;
	assert_int_equal(aps_codec_quantize_blocks(&f, x, 64, 32, &o, codes, 32, exps, 2, NULL), 0);
	assert_int_equal(exps[0], 0);
	assert_int_equal(exps[1], APS_SCALE_BLOCK_MAX);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_codec_spec_values),
		cmocka_unit_test(test_codec_format_limits),
		cmocka_unit_test(test_codec_nan_codes),
		cmocka_unit_test(test_codec_every_code_roundtrips),
		cmocka_unit_test(test_codec_fp32_is_identity),
		cmocka_unit_test(test_codec_scalar_matches_spec),
		cmocka_unit_test(test_codec_vector_matches_scalar),
		cmocka_unit_test(test_codec_accumulate_is_dequantize_plus_add),
		cmocka_unit_test(test_codec_counts),
		cmocka_unit_test(test_codec_stochastic_rounding),
		cmocka_unit_test(test_codec_rejects_bad_arguments),
		cmocka_unit_test(test_codec_maxabs_ignores_nonfinite),
		cmocka_unit_test(test_codec_scan_flags_nonfinite_anywhere),
		cmocka_unit_test(test_codec_crc_nonfinite_is_crc_and_count),
		cmocka_unit_test(test_codec_one_nonfinite_code_is_found_anywhere),
		cmocka_unit_test(test_codec_count_nonfinite_codes),
		cmocka_unit_test(test_codec_blocks_are_per_block_aps),
		cmocka_unit_test(test_codec_blocks_reject_bad_arguments),
	};
	return cmocka_run_group_tests_name("codec", tests, setup_isas, NULL);
}
