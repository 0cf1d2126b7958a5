/*
 * Internal interface between the codec's dispatcher (codec.c) and its kernels:
 * the scalar reference (codec_scalar.c) and the vector paths (codec_avx2.c,
 * codec_avx512.c, both built from codec_simd.inc).
 *
 * A vector kernel handles a prefix of the input whose length is a multiple of
 * 8 elements (so the rest starts on a byte boundary for every code width) and
 * returns how many elements it did; 0 means "not this format or scale", and
 * the scalar kernel does the rest with the same bits.
 */
#ifndef APS_COMMON_CODEC_KERNELS_H
#define APS_COMMON_CODEC_KERNELS_H

#include "common/codec.h"

#include <stdbool.h>

void aps_scalar_quantize(const struct aps_format *f, const float *x, size_t n,
                         const struct aps_quant_opts *opts, uint8_t *out,
                         struct aps_codec_stats *st);
void aps_scalar_decode(const struct aps_format *f, const uint8_t *codes, size_t n, int k,
                       float *out, bool accumulate);
/* Largest finite |x[i]|; *nonfinite is set when some x[i] is inf or NaN. */
float aps_scalar_maxabs(const float *x, size_t n, bool *nonfinite);

/* Encodes one value as x * 2^k with round to nearest even; counts into st. */
uint32_t aps_scalar_encode(const struct aps_format *f, float x, int k, struct aps_codec_stats *st);

#define APS_DECLARE_VECTOR_KERNELS(isa)                                                          \
	size_t aps_##isa##_quantize(const struct aps_format *f, const float *x, size_t n, int k, \
	                            uint8_t *out, struct aps_codec_stats *st);                   \
	size_t aps_##isa##_decode(const struct aps_format *f, const uint8_t *codes, size_t n,    \
	                          int k, float *out, bool accumulate);                           \
	float aps_##isa##_maxabs(const float *x, size_t n, bool *nonfinite);                     \
	size_t aps_##isa##_divide(float *x, size_t n, float d);                                  \
	size_t aps_##isa##_quantize_blocks(const struct aps_format *f, const float *x, size_t n, \
	                                   size_t block, uint8_t *out, int8_t *exps,             \
	                                   struct aps_codec_stats *st);                          \
	size_t aps_##isa##_decode_blocks(const struct aps_format *f, const uint8_t *codes,       \
	                                 const int8_t *exps, size_t n, size_t block, float *out, \
	                                 bool accumulate);

APS_DECLARE_VECTOR_KERNELS(avx2)
APS_DECLARE_VECTOR_KERNELS(avx512)

#endif
