/*
 * The low-precision codec: fp32 values times 2^k to packed codes and back.
 *
 * Semantics are APS.md section 1, bit for bit, on every path: round to nearest
 * with ties to even (or stochastic rounding), subnormals, saturation judged
 * after rounding, signed zeros, canonical NaN. Codes are packed densely in a
 * little-endian bit stream (DESIGN.md). The scalar path is the reference; the
 * AVX2 and AVX-512 paths are chosen at run time and give the same bits.
 */
#ifndef APS_COMMON_CODEC_H
#define APS_COMMON_CODEC_H

#include "common/format.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Scale exponents outside this range are rejected with APS_ERANGE. */
#define APS_CODEC_SCALE_MAX 320

enum aps_rounding {
	APS_ROUND_NEAREST = 0,
	APS_ROUND_STOCHASTIC = 1,
};

struct aps_quant_opts {
	int scale_exp; /* k: values are quantized as x * 2^k */
	enum aps_rounding rounding;
	uint64_t seed;   /* stochastic rounding: run seed */
	uint64_t stream; /* stochastic rounding: tensor and step */
	uint64_t index0; /* stochastic rounding: global index of x[0] */
};

/* Per-call counts; a caller that accumulates over calls adds them up. */
struct aps_codec_stats {
	uint64_t overflow;  /* finite inputs that saturated to +-max finite */
	uint64_t nonfinite; /* inf and NaN inputs */
	uint64_t flushed;   /* non-zero finite inputs that became zero */
	float maxabs;       /* largest |x| over finite inputs (before scaling) */
};

/* Instruction sets a caller may pin the codec to (tests, benchmarks). */
enum aps_codec_isa {
	APS_ISA_AUTO = 0,
	APS_ISA_SCALAR,
	APS_ISA_AVX2,
	APS_ISA_AVX512,
};

/*
 * Quantizes n values x[i] * 2^k into packed codes in out (out_len bytes, at
 * least aps_format_packed_size(f, n)). stats may be NULL. Returns 0,
 * APS_EINVAL, APS_ESHORT or APS_ERANGE (|k| > APS_CODEC_SCALE_MAX).
 */
int aps_codec_quantize(const struct aps_format *f, const float *x, size_t n,
                       const struct aps_quant_opts *opts, uint8_t *out, size_t out_len,
                       struct aps_codec_stats *stats);

/* out[i] = decode(code i) * 2^-k, rounded once to fp32. Same errors. */
int aps_codec_dequantize(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                         size_t n, int scale_exp, float *out);

/* acc[i] += decode(code i) * 2^-k, each product rounded to fp32 before the add. */
int aps_codec_accumulate(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                         size_t n, int scale_exp, float *acc);

/*
 * Block scaling (DESIGN.md, scaling = block): x is cut into blocks of block
 * elements (16, 32 or 64; the last may be short), block b is quantized with
 * its own exponent exps[b] = aps_scale_block(f, max finite |x| of the block),
 * giving the bits aps_codec_quantize gives for that block at that exponent.
 * A block's codes start on a byte boundary, so blocks can be cut anywhere a
 * block starts. exps holds aps_codec_block_count(n, block) entries. Returns
 * 0, APS_EINVAL (also for a block size not allowed) or APS_ESHORT; only
 * rounding, seed, stream and index0 of opts are used.
 */
#define APS_CODEC_BLOCK_DEFAULT 32
bool aps_codec_block_ok(size_t block);
size_t aps_codec_block_count(size_t n, size_t block);
int aps_codec_quantize_blocks(const struct aps_format *f, const float *x, size_t n, size_t block,
                              const struct aps_quant_opts *opts, uint8_t *out, size_t out_len,
                              int8_t *exps, size_t exps_len, struct aps_codec_stats *stats);

/* out[i] = decode(code i) * 2^-exps[i / block], rounded once to fp32. Same errors. */
int aps_codec_dequantize_blocks(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                                const int8_t *exps, size_t exps_len, size_t n, size_t block,
                                float *out);

/* acc[i] += decode(code i) * 2^-exps[i / block], each product rounded first. */
int aps_codec_accumulate_blocks(const struct aps_format *f, const uint8_t *codes, size_t codes_len,
                                const int8_t *exps, size_t exps_len, size_t n, size_t block,
                                float *acc);

/*
 * A payload: n elements of f as they travel, either scaled by 2^scale_exp as
 * a whole (block == 0) or block-scaled (block > 0): the packed codes, then
 * one int8 exponent per block. A job that scales by blocks sends fp32 as it
 * is: aps_codec_payload_block says which block a payload in f uses.
 */
size_t aps_codec_payload_block(const struct aps_format *f, size_t job_block);
size_t aps_codec_payload_size(const struct aps_format *f, size_t n, size_t block);

/* Encodes x[0..n) with opts->scale_exp (block == 0) or by blocks; as aps_codec_quantize. */
int aps_codec_encode_payload(const struct aps_format *f, const float *x, size_t n, size_t block,
                             const struct aps_quant_opts *opts, uint8_t *out, size_t out_len,
                             struct aps_codec_stats *stats);

/* Decodes a payload into out (accumulate: adds to it). Returns 0, APS_EINVAL, APS_ESHORT. */
int aps_codec_decode_payload(const struct aps_format *f, const uint8_t *p, size_t len, size_t n,
                             int scale_exp, size_t block, float *out, bool accumulate);

/* Largest |x[i]| over finite values; 0 for n == 0. */
float aps_codec_maxabs(const float *x, size_t n);

/* As aps_codec_maxabs, and *nonfinite says whether some x[i] is inf or NaN (one pass). */
float aps_codec_scan(const float *x, size_t n, bool *nonfinite);

/* x[i] /= d for i < n: a true division, correctly rounded (not a multiply by 1/d). */
void aps_codec_divide(float *x, size_t n, float d);

/* Counts inf and NaN values in x[0..n). */
size_t aps_codec_count_nonfinite_f32(const float *x, size_t n);

/* Counts inf and NaN codes in a packed buffer of n codes. */
size_t aps_codec_count_nonfinite(const struct aps_format *f, const uint8_t *codes, size_t n);

/* One pass over a payload of n codes in len bytes: *crc its CRC32C, and the count of
 * its inf and NaN codes returned (aps_codec_count_nonfinite). */
size_t aps_codec_crc_nonfinite(const struct aps_format *f, const uint8_t *codes, size_t len,
                               size_t n, uint32_t *crc);

/*
 * Pins the codec to an instruction set. Returns APS_EINVAL when the CPU lacks
 * it. APS_ISA_AUTO picks the best one; the environment variable
 * APS_CODEC_ISA=scalar|avx2|avx512 sets the initial choice.
 */
int aps_codec_set_isa(enum aps_codec_isa isa);
enum aps_codec_isa aps_codec_get_isa(void);
const char *aps_codec_isa_name(enum aps_codec_isa isa);

#endif
