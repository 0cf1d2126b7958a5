/*
 * The scalar reference codec: APS.md section 1 written out with integers, for
 * every format and width. Every vector path is tested against this file.
 *
 * A finite fp32 input is m * 2^E with an integer m < 2^24. Scaling by 2^k adds
 * to E, so x * 2^k is never rounded. The result is rint(v / spacing) * spacing
 * computed as a shift of m with round-half-even (or plus random bits for
 * stochastic rounding), and the code follows from the monotonic IEEE layout.
 */
#include "common/codec_kernels.h"

#include "common/pack.h"
#include "common/rng.h"

#include <math.h>
#include <string.h>

#define F32_ABS_MASK 0x7fffffffu
#define F32_INF_BITS 0x7f800000u

static uint32_t f32_bits(float x)
{
	uint32_t u;

	memcpy(&u, &x, sizeof(u));
	return u;
}

/* floor(log2(m)) for m > 0 */
static int ilog2_u32(uint32_t m)
{
	return 31 - __builtin_clz(m);
}

/* Rounds m * 2^-d to an integer (d > 0): half to even, or plus noise. */
static uint64_t shift_round(uint64_t m, int d, bool stochastic, uint64_t noise)
{
	if (stochastic) {
		if (d >= 64)
			return 0;
		return (m + (noise & ((UINT64_C(1) << d) - 1))) >> d;
	}
	if (d >= 40)
		return 0;
	uint64_t q = m >> d;
	uint64_t rem = m & ((UINT64_C(1) << d) - 1);
	uint64_t half = UINT64_C(1) << (d - 1);
	if (rem > half || (rem == half && (q & 1)))
		q++;
	return q;
}

/* Magnitude code of a finite non-zero |x| * 2^k; counts overflow and flushes. */
static uint32_t encode_finite(const struct aps_format *f, uint32_t xa, int k, bool stochastic,
                              uint64_t noise, struct aps_codec_stats *st)
{
	uint32_t exp_field = xa >> 23;
	uint64_t m = (xa & 0x7fffffu) | (exp_field ? 0x800000u : 0);
	int E = (exp_field ? (int)exp_field : 1) - 150 + k;
	int e = E + ilog2_u32((uint32_t)m);
	int s, d;
	uint64_t q, code;

	if (e > f->emax) {
		st->overflow++;
		return f->max_code;
	}
	s = (e > f->emin ? e : f->emin) - f->man_bits;
	d = s - E;
	q = d <= 0 ? m << -d : shift_round(m, d, stochastic, noise);
	if (q == 0) {
		st->flushed++;
		return 0;
	}
	code = ((uint64_t)(s + f->man_bits - f->emin) << f->man_bits) + q;
	if (code > f->max_code) {
		st->overflow++;
		return f->max_code;
	}
	return (uint32_t)code;
}

static uint32_t encode(const struct aps_format *f, float x, int k, bool stochastic, uint64_t noise,
                       struct aps_codec_stats *st)
{
	uint32_t bits = f32_bits(x);
	uint32_t xa = bits & F32_ABS_MASK;
	uint32_t sign = (bits >> 31) ? f->sign_bit : 0;
	float ax = fabsf(x);

	if (xa > F32_INF_BITS) {
		st->nonfinite++;
		return f->nan_code;
	}
	if (xa == F32_INF_BITS) {
		st->nonfinite++;
		return sign | f->max_code;
	}
	if (ax > st->maxabs)
		st->maxabs = ax;
	if (xa == 0)
		return sign;
	return sign | encode_finite(f, xa, k, stochastic, noise, st);
}

uint32_t aps_scalar_encode(const struct aps_format *f, float x, int k, struct aps_codec_stats *st)
{
	return encode(f, x, k, false, 0, st);
}

void aps_scalar_quantize(const struct aps_format *f, const float *x, size_t n,
                         const struct aps_quant_opts *opts, uint8_t *out,
                         struct aps_codec_stats *st)
{
	bool stochastic = opts->rounding == APS_ROUND_STOCHASTIC;
	struct aps_bitwriter w = { .out = out };

	for (size_t i = 0; i < n; i++) {
		uint64_t noise = 0;
		if (stochastic)
			noise = aps_rng_bits(opts->seed, opts->stream, opts->index0 + i);
		aps_bitwriter_put(&w, encode(f, x[i], opts->scale_exp, stochastic, noise, st),
		                  f->bits);
	}
	aps_bitwriter_flush(&w);
}

static float decode_scaled(const struct aps_format *f, uint32_t code, int k)
{
	return (float)ldexp(aps_format_decode(f, code), -k);
}

void aps_scalar_decode(const struct aps_format *f, const uint8_t *codes, size_t n, int k,
                       float *out, bool accumulate)
{
	struct aps_bitreader r = { .in = codes };
	float table[256];
	bool use_table = f->bits <= 8 && n >= 64;

	if (use_table) {
		for (uint32_t c = 0; c < (1u << f->bits); c++)
			table[c] = decode_scaled(f, c, k);
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t c = aps_bitreader_get(&r, f->bits);
		float v = use_table ? table[c] : decode_scaled(f, c, k);
		out[i] = accumulate ? out[i] + v : v;
	}
}

float aps_scalar_maxabs(const float *x, size_t n, bool *nonfinite)
{
	float m = 0.0f;

	for (size_t i = 0; i < n; i++) {
		float a = fabsf(x[i]);
		if (a > m && a <= 3.40282347e38f)
			m = a;
		else if (!(a <= 3.40282347e38f))
			*nonfinite = true;
	}
	return m;
}
