/*
 * The codec half of the public ABI (aps.h): argument checks with a detailed
 * message, then the common/ codec. Formats are named by string at this
 * boundary and parsed on each call (a few string compares).
 */
#include "worker/aps.h"

#include "common/codec.h"
#include "common/scale.h"
#include "worker/api_error.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

_Static_assert(APS_SCALING_MODE_LOCAL == (int)APS_SCALING_LOCAL, "scaling modes");
_Static_assert(APS_SCALING_MODE_GLOBAL == (int)APS_SCALING_GLOBAL, "scaling modes");
_Static_assert(APS_SCALING_MODE_BLOCK == (int)APS_SCALING_BLOCK, "scaling modes");
_Static_assert(APS_BLOCK_DEFAULT == APS_CODEC_BLOCK_DEFAULT, "block size");
_Static_assert(APS_ROUNDING_STOCHASTIC == (int)APS_ROUND_STOCHASTIC, "rounding modes");

const char *aps_version(void)
{
	return APS_VERSION;
}

static int parse_format(const char *fmt, struct aps_format *f)
{
	if (fmt == NULL)
		return aps_api_fail(APS_EINVAL, "format name is NULL");
	if (aps_format_parse(fmt, f) < 0)
		return aps_api_fail(APS_EFORMAT,
		                    "'%.32s' is not a format (fp32, bf16, fp16, e5m2, e4m3, "
		                    "e4m3fn, e3m0, fp4, fp6e2m3, fp6e3m2, or eXmY with 2<=X<=8 "
		                    "and 1+X+Y<=16)",
		                    fmt);
	return 0;
}

int aps_format_info(const char *fmt, struct aps_format_info *out)
{
	struct aps_format f;
	int ret = parse_format(fmt, &f);

	if (ret < 0)
		return ret;
	if (out == NULL)
		return aps_api_fail(APS_EINVAL, "output is NULL");
	memset(out, 0, sizeof(*out));
	memcpy(out->name, f.name, sizeof(out->name));
	out->bits = f.bits;
	out->exp_bits = f.exp_bits;
	out->man_bits = f.man_bits;
	out->fn = (uint32_t)f.layout;
	out->emax = f.emax;
	out->max = f.max_finite;
	out->min_normal = f.min_normal;
	out->min_subnormal = f.min_subnormal;
	return aps_api_ok();
}

int64_t aps_packed_size(const char *fmt, uint64_t count)
{
	struct aps_format f;
	int ret = parse_format(fmt, &f);

	if (ret < 0)
		return ret;
	if (count > (UINT64_C(1) << 58))
		return aps_api_fail(APS_ERANGE, "count %llu is too large",
		                    (unsigned long long)count);
	aps_api_ok();
	return (int64_t)aps_format_packed_size(&f, count);
}

/* Checks shared by quantize and dequantize; fills f. */
static int check_codec_args(const char *fmt, struct aps_format *f, const void *a, const void *b,
                            uint64_t n, uint64_t codes_len, int32_t k)
{
	int ret = parse_format(fmt, f);

	if (ret < 0)
		return ret;
	if (n > 0 && (a == NULL || b == NULL))
		return aps_api_fail(APS_EINVAL, "NULL buffer with %llu elements",
		                    (unsigned long long)n);
	if (n > (UINT64_C(1) << 58))
		return aps_api_fail(APS_ERANGE, "%llu elements is too many", (unsigned long long)n);
	if (k < -APS_CODEC_SCALE_MAX || k > APS_CODEC_SCALE_MAX)
		return aps_api_fail(APS_ERANGE, "scale exponent %d is outside [-%d, %d]", k,
		                    APS_CODEC_SCALE_MAX, APS_CODEC_SCALE_MAX);
	if (codes_len < aps_format_packed_size(f, n))
		return aps_api_fail(APS_ESHORT, "%llu %s codes need %zu bytes, the buffer has %llu",
		                    (unsigned long long)n, f->name, aps_format_packed_size(f, n),
		                    (unsigned long long)codes_len);
	return 0;
}

/* The codec's options from the caller's (NULL: all zero). */
static int quant_opts(const struct aps_quantize_opts *opts, struct aps_quant_opts *o)
{
	*o = (struct aps_quant_opts){ 0 };
	if (opts == NULL)
		return 0;
	if (opts->rounding != APS_ROUNDING_NEAREST && opts->rounding != APS_ROUNDING_STOCHASTIC)
		return aps_api_fail(APS_EINVAL, "rounding mode %d is unknown", opts->rounding);
	*o = (struct aps_quant_opts){ opts->scale_exp, (enum aps_rounding)opts->rounding,
		                      opts->seed, opts->stream, opts->index0 };
	return 0;
}

/* What a quantize call says: its stats, or the codec's error. */
static int quantized(int ret, const struct aps_codec_stats *st, struct aps_quantize_stats *stats)
{
	if (ret < 0)
		return aps_api_fail(ret, "quantize failed");
	if (stats != NULL)
		*stats = (struct aps_quantize_stats){ st->overflow, st->nonfinite, st->flushed,
			                              st->maxabs };
	return aps_api_ok();
}

int aps_quantize(const char *fmt, const float *x, uint64_t n, const struct aps_quantize_opts *opts,
                 uint8_t *out, uint64_t out_len, struct aps_quantize_stats *stats)
{
	struct aps_quant_opts o;
	struct aps_codec_stats st;
	struct aps_format f;
	int ret = quant_opts(opts, &o);

	if (ret == 0)
		ret = check_codec_args(fmt, &f, x, out, n, out_len, o.scale_exp);
	if (ret < 0)
		return ret;
	return quantized(aps_codec_quantize(&f, x, n, &o, out, out_len, &st), &st, stats);
}

/* Dequantize into out, or add into it: the checks are the same. */
static int decode(const char *fmt, const uint8_t *codes, uint64_t codes_len, uint64_t n,
                  int32_t scale_exp, float *out, bool accumulate)
{
	struct aps_format f;
	int ret = check_codec_args(fmt, &f, codes, out, n, codes_len, scale_exp);

	if (ret < 0)
		return ret;
	if (accumulate)
		aps_codec_accumulate(&f, codes, codes_len, n, scale_exp, out);
	else
		aps_codec_dequantize(&f, codes, codes_len, n, scale_exp, out);
	return aps_api_ok();
}

int aps_dequantize(const char *fmt, const uint8_t *codes, uint64_t codes_len, uint64_t n,
                   int32_t scale_exp, float *out)
{
	return decode(fmt, codes, codes_len, n, scale_exp, out, false);
}

int aps_accumulate(const char *fmt, const uint8_t *codes, uint64_t codes_len, uint64_t n,
                   int32_t scale_exp, float *acc)
{
	return decode(fmt, codes, codes_len, n, scale_exp, acc, true);
}

uint64_t aps_block_count(uint64_t n, uint32_t block)
{
	if (!aps_codec_block_ok(block)) {
		aps_api_fail(APS_EINVAL, "block size %u: block scaling takes 16, 32 or 64", block);
		return 0;
	}
	aps_api_ok();
	return n / block + (n % block != 0); /* ceil(n / block) without wrapping */
}

/* The block size and the exponents' buffer, after check_codec_args. */
static int check_blocks(uint64_t n, uint32_t block, const int8_t *exps, uint64_t exps_len)
{
	if (!aps_codec_block_ok(block))
		return aps_api_fail(APS_EINVAL, "block size %u: block scaling takes 16, 32 or 64",
		                    block);
	if (n > 0 && exps == NULL)
		return aps_api_fail(APS_EINVAL, "exponents buffer is NULL");
	if (exps_len < aps_codec_block_count(n, block))
		return aps_api_fail(APS_ESHORT,
		                    "%llu elements in blocks of %u need %llu exponents, "
		                    "the buffer has %llu",
		                    (unsigned long long)n, block,
		                    (unsigned long long)aps_codec_block_count(n, block),
		                    (unsigned long long)exps_len);
	return 0;
}

/* Exponents block scaling gives are within +-APS_SCALE_BLOCK_MAX: -128 would scale by
 * 2^128, past fp32. */
static int check_block_exps(uint64_t n, uint32_t block, const int8_t *exps)
{
	for (uint64_t b = 0; b < aps_codec_block_count(n, block); b++) {
		if (exps[b] < -APS_SCALE_BLOCK_MAX)
			return aps_api_fail(APS_ERANGE, "block %llu has exponent %d, beyond -%d",
			                    (unsigned long long)b, exps[b], APS_SCALE_BLOCK_MAX);
	}
	return 0;
}

int aps_quantize_blocks(const char *fmt, const float *x, uint64_t n, uint32_t block,
                        const struct aps_quantize_opts *opts, uint8_t *out, uint64_t out_len,
                        int8_t *exps, uint64_t exps_len, struct aps_quantize_stats *stats)
{
	struct aps_quant_opts o;
	struct aps_codec_stats st;
	struct aps_format f;
	int ret = quant_opts(opts, &o);

	o.scale_exp = 0; /* each block has its own */
	if (ret == 0)
		ret = check_codec_args(fmt, &f, x, out, n, out_len, 0);
	if (ret == 0)
		ret = check_blocks(n, block, exps, exps_len);
	if (ret < 0)
		return ret;
	return quantized(
	        aps_codec_quantize_blocks(&f, x, n, block, &o, out, out_len, exps, exps_len, &st),
	        &st, stats);
}

static int decode_blocks(const char *fmt, const uint8_t *codes, uint64_t codes_len,
                         const int8_t *exps, uint64_t exps_len, uint64_t n, uint32_t block,
                         float *out, bool accumulate)
{
	struct aps_format f;
	int ret = check_codec_args(fmt, &f, codes, out, n, codes_len, 0);

	if (ret == 0)
		ret = check_blocks(n, block, exps, exps_len);
	if (ret == 0)
		ret = check_block_exps(n, block, exps);
	if (ret < 0)
		return ret;
	if (accumulate)
		aps_codec_accumulate_blocks(&f, codes, codes_len, exps, exps_len, n, block, out);
	else
		aps_codec_dequantize_blocks(&f, codes, codes_len, exps, exps_len, n, block, out);
	return aps_api_ok();
}

int aps_dequantize_blocks(const char *fmt, const uint8_t *codes, uint64_t codes_len,
                          const int8_t *exps, uint64_t exps_len, uint64_t n, uint32_t block,
                          float *out)
{
	return decode_blocks(fmt, codes, codes_len, exps, exps_len, n, block, out, false);
}

int aps_accumulate_blocks(const char *fmt, const uint8_t *codes, uint64_t codes_len,
                          const int8_t *exps, uint64_t exps_len, uint64_t n, uint32_t block,
                          float *acc)
{
	return decode_blocks(fmt, codes, codes_len, exps, exps_len, n, block, acc, true);
}

float aps_maxabs(const float *x, uint64_t n)
{
	if (n > 0 && x == NULL) {
		aps_api_fail(APS_EINVAL, "NULL buffer with %llu elements", (unsigned long long)n);
		return NAN;
	}
	aps_api_ok();
	return aps_codec_maxabs(x, n);
}

/* The exponent's arguments, checked before x is read. */
static int check_exponent_args(const char *fmt, struct aps_format *f, const float *x, uint64_t n,
                               int32_t nworkers, int32_t mode, const int32_t *k)
{
	int ret = parse_format(fmt, f);

	if (ret < 0)
		return ret;
	if (k == NULL || (n > 0 && x == NULL))
		return aps_api_fail(APS_EINVAL, "NULL argument");
	if (n > (UINT64_C(1) << 58))
		return aps_api_fail(APS_ERANGE, "%llu elements is too many", (unsigned long long)n);
	if (nworkers < 1)
		return aps_api_fail(APS_EINVAL, "nworkers is %d, must be at least 1", nworkers);
	if (mode == APS_SCALING_MODE_BLOCK)
		return aps_api_fail(APS_EINVAL, "block scaling has an exponent per block: "
		                                "aps_quantize_blocks computes them");
	if (mode != APS_SCALING_MODE_NONE && mode != APS_SCALING_MODE_LOCAL &&
	    mode != APS_SCALING_MODE_GLOBAL)
		return aps_api_fail(APS_EINVAL,
		                    "scaling mode %d is unknown (none 0, local 1, global 2)", mode);
	return 0;
}

int aps_exponent(const char *fmt, const float *x, uint64_t n, int32_t nworkers, int32_t mode,
                 int32_t *k)
{
	struct aps_format f;
	float maxabs;
	int ret = check_exponent_args(fmt, &f, x, n, nworkers, mode, k);

	if (ret < 0)
		return ret;
	if (mode == APS_SCALING_MODE_NONE) {
		*k = 0;
		return aps_api_ok();
	}
	maxabs = aps_codec_maxabs(x, n);
	if (mode == APS_SCALING_MODE_LOCAL)
		ret = aps_scale_local(&f, maxabs, k);
	else
		ret = aps_scale_global(&f, maxabs, nworkers, k);
	if (ret < 0)
		return aps_api_fail(ret, "exponent of max %g failed", (double)maxabs);
	return aps_api_ok();
}
