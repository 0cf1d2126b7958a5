/*
 * The codec's public entry points: argument checks, the choice of instruction
 * set, and the split of each call between a vector kernel and the scalar one.
 */
#include "common/codec.h"

#include "common/codec_kernels.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/pack.h"
#include "common/scale.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct kernels {
	size_t (*quantize)(const struct aps_format *f, const float *x, size_t n, int k,
	                   uint8_t *out, struct aps_codec_stats *st);
	size_t (*decode)(const struct aps_format *f, const uint8_t *codes, size_t n, int k,
	                 float *out, bool accumulate);
	float (*maxabs)(const float *x, size_t n, bool *nonfinite);
	size_t (*divide)(float *x, size_t n, float d);
	size_t (*quantize_blocks)(const struct aps_format *f, const float *x, size_t n,
	                          size_t block, uint8_t *out, int8_t *exps,
	                          struct aps_codec_stats *st);
	size_t (*decode_blocks)(const struct aps_format *f, const uint8_t *codes,
	                        const int8_t *exps, size_t n, size_t block, float *out,
	                        bool accumulate);
};

/* Read by every thread that codes (apsd's engine threads, a client's I/O thread):
 * the first to look picks it, the same value whoever it is. */
static _Atomic enum aps_codec_isa current_isa = APS_ISA_AUTO;

static const char *const isa_names[] = {
	[APS_ISA_AUTO] = "auto",
	[APS_ISA_SCALAR] = "scalar",
	[APS_ISA_AVX2] = "avx2",
	[APS_ISA_AVX512] = "avx512",
};

static bool cpu_has(enum aps_codec_isa isa)
{
	switch (isa) {
	case APS_ISA_AUTO:
	case APS_ISA_SCALAR:
		return true;
#if defined(APS_HAVE_X86_KERNELS)
	case APS_ISA_AVX2:
		return __builtin_cpu_supports("avx2");
	case APS_ISA_AVX512:
		return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		       __builtin_cpu_supports("avx512vl");
#else
	default:
		return false;
#endif
	}
	return false;
}

static enum aps_codec_isa best_isa(void)
{
	if (cpu_has(APS_ISA_AVX512))
		return APS_ISA_AVX512;
	if (cpu_has(APS_ISA_AVX2))
		return APS_ISA_AVX2;
	return APS_ISA_SCALAR;
}

static enum aps_codec_isa isa_from_env(void)
{
	const char *want = getenv("APS_CODEC_ISA");

	if (want == NULL)
		return best_isa();
	for (int i = APS_ISA_SCALAR; i <= APS_ISA_AVX512; i++) {
		if (strcmp(want, isa_names[i]) == 0 && cpu_has((enum aps_codec_isa)i))
			return (enum aps_codec_isa)i;
	}
	return best_isa();
}

enum aps_codec_isa aps_codec_get_isa(void)
{
	enum aps_codec_isa isa = atomic_load_explicit(&current_isa, memory_order_relaxed);

	if (isa == APS_ISA_AUTO) {
		isa = isa_from_env();
		atomic_store_explicit(&current_isa, isa, memory_order_relaxed);
	}
	return isa;
}

int aps_codec_set_isa(enum aps_codec_isa isa)
{
	if (isa < APS_ISA_AUTO || isa > APS_ISA_AVX512 || !cpu_has(isa))
		return APS_EINVAL;
	atomic_store_explicit(&current_isa, isa == APS_ISA_AUTO ? best_isa() : isa,
	                      memory_order_relaxed);
	return 0;
}

const char *aps_codec_isa_name(enum aps_codec_isa isa)
{
	if (isa < APS_ISA_AUTO || isa > APS_ISA_AVX512)
		return "unknown";
	return isa_names[isa];
}

static const struct kernels *vector_kernels(void)
{
#if defined(APS_HAVE_X86_KERNELS)
	static const struct kernels avx2 = { aps_avx2_quantize,        aps_avx2_decode,
		                             aps_avx2_maxabs,          aps_avx2_divide,
		                             aps_avx2_quantize_blocks, aps_avx2_decode_blocks };
	static const struct kernels avx512 = {
		aps_avx512_quantize, aps_avx512_decode,          aps_avx512_maxabs,
		aps_avx512_divide,   aps_avx512_quantize_blocks, aps_avx512_decode_blocks
	};

	switch (aps_codec_get_isa()) {
	case APS_ISA_AVX2:
		return &avx2;
	case APS_ISA_AVX512:
		return &avx512;
	default:
		break;
	}
#endif
	return NULL;
}

static bool scale_ok(int k)
{
	return k >= -APS_CODEC_SCALE_MAX && k <= APS_CODEC_SCALE_MAX;
}

int aps_codec_quantize(const struct aps_format *f, const float *x, size_t n,
                       const struct aps_quant_opts *opts, uint8_t *out, size_t out_len,
                       struct aps_codec_stats *stats)
{
	const struct kernels *vk = vector_kernels();
	struct aps_quant_opts tail_opts;
	struct aps_codec_stats st = { 0 };
	size_t done = 0;

	if (f == NULL || opts == NULL || (n > 0 && (x == NULL || out == NULL)))
		return APS_EINVAL;
	if (!scale_ok(opts->scale_exp))
		return APS_ERANGE;
	if (out_len < aps_format_packed_size(f, n))
		return APS_ESHORT;
	if (vk != NULL && opts->rounding == APS_ROUND_NEAREST)
		done = vk->quantize(f, x, n, opts->scale_exp, out, &st);
	tail_opts = *opts;
	tail_opts.index0 += done;
	aps_scalar_quantize(f, x + done, n - done, &tail_opts,
	                    out + aps_format_packed_size(f, done), &st);
	if (stats != NULL)
		*stats = st;
	return 0;
}

static int decode(const struct aps_format *f, const uint8_t *codes, size_t codes_len, size_t n,
                  int k, float *out, bool accumulate)
{
	const struct kernels *vk = vector_kernels();
	size_t done = 0;

	if (f == NULL || (n > 0 && (codes == NULL || out == NULL)))
		return APS_EINVAL;
	if (!scale_ok(k))
		return APS_ERANGE;
	if (codes_len < aps_format_packed_size(f, n))
		return APS_ESHORT;
	if (vk != NULL)
		done = vk->decode(f, codes, n, k, out, accumulate);
	aps_scalar_decode(f, codes + aps_format_packed_size(f, done), n - done, k, out + done,
	                  accumulate);
	return 0;
}

int aps_codec_dequantize(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                         size_t n, int scale_exp, float *out)
{
	return decode(f, codes, codes_len, n, scale_exp, out, false);
}

int aps_codec_accumulate(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                         size_t n, int scale_exp, float *acc)
{
	return decode(f, codes, codes_len, n, scale_exp, acc, true);
}

bool aps_codec_block_ok(size_t block)
{
	return block == 16 || block == 32 || block == 64;
}

size_t aps_codec_block_count(size_t n, size_t block)
{
	return block == 0 ? 0 : (n + block - 1) / block;
}

int aps_codec_quantize_blocks(const struct aps_format *f, const float *x, size_t n, size_t block,
                              const struct aps_quant_opts *opts, uint8_t *out, size_t out_len,
                              int8_t *exps, size_t exps_len, struct aps_codec_stats *stats)
{
	const struct kernels *vk = vector_kernels();
	struct aps_codec_stats st = { 0 };
	struct aps_quant_opts o;
	bool nonfinite = false;
	size_t b = 0;

	if (f == NULL || opts == NULL || !aps_codec_block_ok(block) ||
	    (n > 0 && (x == NULL || out == NULL || exps == NULL)))
		return APS_EINVAL;
	if (out_len < aps_format_packed_size(f, n) || exps_len < aps_codec_block_count(n, block))
		return APS_ESHORT;
	if (vk != NULL && opts->rounding == APS_ROUND_NEAREST)
		b = vk->quantize_blocks(f, x, n, block, out, exps, &st) / block;
	/* The rest block by block, the last one maybe short: block * bits is whole bytes. */
	for (o = *opts; b * block < n; b++) {
		size_t at = b * block, len = n - at < block ? n - at : block;
		o.scale_exp = aps_scale_block(f, aps_scalar_maxabs(x + at, len, &nonfinite));
		o.index0 = opts->index0 + at;
		exps[b] = (int8_t)o.scale_exp;
		aps_scalar_quantize(f, x + at, len, &o, out + at * f->bits / 8, &st);
	}
	if (stats != NULL)
		*stats = st;
	return 0;
}

static int decode_blocks(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                         const int8_t *exps, size_t exps_len, size_t n, size_t block, float *out,
                         bool accumulate)
{
	const struct kernels *vk = vector_kernels();
	size_t b = 0;

	if (f == NULL || !aps_codec_block_ok(block) ||
	    (n > 0 && (codes == NULL || exps == NULL || out == NULL)))
		return APS_EINVAL;
	if (codes_len < aps_format_packed_size(f, n) || exps_len < aps_codec_block_count(n, block))
		return APS_ESHORT;
	if (vk != NULL)
		b = vk->decode_blocks(f, codes, exps, n, block, out, accumulate) / block;
	for (; b * block < n; b++) {
		size_t at = b * block, len = n - at < block ? n - at : block;
		aps_scalar_decode(f, codes + at * f->bits / 8, len, exps[b], out + at, accumulate);
	}
	return 0;
}

int aps_codec_dequantize_blocks(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                                const int8_t *exps, size_t exps_len, size_t n, size_t block,
                                float *out)
{
	return decode_blocks(f, codes, codes_len, exps, exps_len, n, block, out, false);
}

int aps_codec_accumulate_blocks(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                                const int8_t *exps, size_t exps_len, size_t n, size_t block,
                                float *acc)
{
	return decode_blocks(f, codes, codes_len, exps, exps_len, n, block, acc, true);
}

size_t aps_codec_payload_block(const struct aps_format *f, size_t job_block)
{
	return aps_format_is_fp32(f) ? 0 : job_block;
}

size_t aps_codec_payload_size(const struct aps_format *f, size_t n, size_t block)
{
	return aps_format_packed_size(f, n) + aps_codec_block_count(n, block);
}

int aps_codec_encode_payload(const struct aps_format *f, const float *x, size_t n, size_t block,
                             const struct aps_quant_opts *opts, uint8_t *out, size_t out_len,
                             struct aps_codec_stats *stats)
{
	size_t codes;

	if (f == NULL)
		return APS_EINVAL;
	codes = aps_format_packed_size(f, n);
	if (block == 0)
		return aps_codec_quantize(f, x, n, opts, out, out_len, stats);
	if (out_len < codes)
		return APS_ESHORT;
	return aps_codec_quantize_blocks(f, x, n, block, opts, out, codes,
	                                 (int8_t *)(void *)(out + codes), out_len - codes, stats);
}

int aps_codec_decode_payload(const struct aps_format *f, const uint8_t *p, size_t len, size_t n,
                             int scale_exp, size_t block, float *out, bool accumulate)
{
	size_t codes;

	if (f == NULL || p == NULL)
		return APS_EINVAL;
	if (block == 0)
		return decode(f, p, len, n, scale_exp, out, accumulate);
	codes = aps_format_packed_size(f, n);
	if (len < codes)
		return APS_ESHORT;
	return decode_blocks(f, p, codes, (const int8_t *)(const void *)(p + codes), len - codes, n,
	                     block, out, accumulate);
}

float aps_codec_scan(const float *x, size_t n, bool *nonfinite)
{
	const struct kernels *vk = vector_kernels();

	*nonfinite = false;
	if (x == NULL || n == 0)
		return 0.0f;
	if (vk != NULL)
		return vk->maxabs(x, n, nonfinite);
	return aps_scalar_maxabs(x, n, nonfinite);
}

float aps_codec_maxabs(const float *x, size_t n)
{
	bool nonfinite;

	return aps_codec_scan(x, n, &nonfinite);
}

/* v repeated in every lane of width bits across a 64-bit word. */
static uint64_t every_lane(uint64_t v, unsigned bits)
{
	uint64_t w = 0;

	for (unsigned at = 0; at < 64; at += bits)
		w |= v << at;
	return w;
}

/* Magnitude of the first non-finite code: inf (IEEE-style) or the one NaN (fn). */
static uint32_t first_nonfinite(const struct aps_format *f)
{
	return f->layout == APS_LAYOUT_FN ? f->nan_code : f->inf_code;
}

/* The lane test that finds codes at or past the first non-finite magnitude: for
 * code widths that tile a word, and fn formats whose one NaN is the top magnitude. */
static bool nonfinite_lanes(const struct aps_format *f, struct aps_crc32c_lanes *l)
{
	uint64_t top = f->sign_bit, lo = first_nonfinite(f);

	if (64 % f->bits != 0 || (f->layout == APS_LAYOUT_FN && f->nan_code != top - 1) || lo == 0)
		return false;
	l->mask = every_lane(top - 1, f->bits);
	l->add = every_lane(top - lo, f->bits);
	l->high = every_lane(top, f->bits);
	return true;
}

/* A code is inf or NaN when its magnitude reaches the inf code (IEEE-style) or is
 * the one NaN code (fn): plain compares the compiler vectorises over bytes. */
static size_t count_nonfinite8(const struct aps_format *f, const uint8_t *codes, size_t n)
{
	uint8_t lo = (uint8_t)first_nonfinite(f);
	bool fn = f->layout == APS_LAYOUT_FN;
	size_t count = 0;

	for (size_t i = 0; i < n; i++)
		count += (uint8_t)(codes[i] & 0x7f) >= lo && (!fn || (codes[i] & 0x7f) == lo);
	return count;
}

/* Two 4-bit codes a byte, low nibble first (DESIGN.md packing). */
static size_t count_nonfinite4(const struct aps_format *f, const uint8_t *codes, size_t n)
{
	uint8_t lo = (uint8_t)first_nonfinite(f);
	bool fn = f->layout == APS_LAYOUT_FN;
	size_t count = 0;

	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)((codes[i / 2] >> (4 * (i & 1))) & 0x7);
		count += c >= lo && (!fn || c == lo);
	}
	return count;
}

static size_t count_nonfinite16(const struct aps_format *f, const uint8_t *codes, size_t n)
{
	uint16_t lo = (uint16_t)first_nonfinite(f);
	bool fn = f->layout == APS_LAYOUT_FN;
	size_t count = 0;

	for (size_t i = 0; i < n; i++) {
		uint16_t c = (uint16_t)((codes[2 * i] | codes[2 * i + 1] << 8) & 0x7fff);
		count += c >= lo && (!fn || c == lo);
	}
	return count;
}

/* The count, code by code. */
static size_t count_nonfinite(const struct aps_format *f, const uint8_t *codes, size_t n)
{
	struct aps_bitreader r = { .in = codes };
	size_t count = 0;

	if (f->layout == APS_LAYOUT_MX)
		return 0; /* every code is finite */
	if (f->bits == 4)
		return count_nonfinite4(f, codes, n);
	if (f->bits == 8)
		return count_nonfinite8(f, codes, n);
	if (f->bits == 16)
		return count_nonfinite16(f, codes, n);
	if (aps_format_is_fp32(f)) {
		/* payload frames need not be aligned: read the words with memcpy */
		for (size_t i = 0; i < n; i++) {
			uint32_t w;
			memcpy(&w, codes + 4 * i, sizeof(w));
			count += (w & 0x7f800000u) == 0x7f800000u;
		}
		return count;
	}
	for (size_t i = 0; i < n; i++)
		count += aps_format_code_is_nonfinite(f, aps_bitreader_get(&r, f->bits));
	return count;
}

size_t aps_codec_crc_nonfinite(const struct aps_format *f, const uint8_t *codes, size_t len,
                               size_t n, uint32_t *crc)
{
	struct aps_crc32c_lanes lanes;
	uint64_t flag;

	if (!nonfinite_lanes(f, &lanes)) {
		*crc = aps_crc32c(0, codes, len);
		return count_nonfinite(f, codes, n);
	}
	*crc = aps_crc32c_lanes(0, codes, len, &lanes, &flag);
	/* A flag may come from a padding nibble: count the codes themselves. */
	return flag == 0 ? 0 : count_nonfinite(f, codes, n);
}

size_t aps_codec_count_nonfinite(const struct aps_format *f, const uint8_t *codes, size_t n)
{
	struct aps_crc32c_lanes lanes;

	/* Payloads are checked whole and are almost always finite: the fast test first. */
	if (nonfinite_lanes(f, &lanes) &&
	    aps_crc32c_lanes_only(codes, aps_format_packed_size(f, n), &lanes) == 0)
		return 0;
	return count_nonfinite(f, codes, n);
}

size_t aps_codec_count_nonfinite_f32(const float *x, size_t n)
{
	const uint32_t *bits = (const uint32_t *)(const void *)x;
	size_t count = 0;

	for (size_t i = 0; i < n; i++)
		count += (bits[i] & 0x7f800000u) == 0x7f800000u;
	return count;
}

void aps_codec_divide(float *x, size_t n, float d)
{
	const struct kernels *vk = vector_kernels();
	size_t done = vk != NULL ? vk->divide(x, n, d) : 0;

	for (size_t i = done; i < n; i++)
		x[i] /= d;
}
