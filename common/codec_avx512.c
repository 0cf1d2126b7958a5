/*
 * AVX-512 (F, BW, VL) primitives for the vector codec in codec_simd.inc
 * (16 lanes, masks in k registers). Called only after a run-time CPU check.
 */
#include "common/codec_kernels.h"
#include "common/scale.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define VL           16
#define KERNEL(name) aps_avx512_##name

typedef __m512i vint;
typedef __m512 vflt;
typedef __mmask16 vmask;
typedef uint64_t counter;

static inline vint vi_set1(uint32_t v)
{
	return _mm512_set1_epi32((int)v);
}

static inline vflt vf_set1(float v)
{
	return _mm512_set1_ps(v);
}

static inline vint vi_load(const void *p)
{
	return _mm512_loadu_si512(p);
}

static inline vflt vf_load(const float *p)
{
	return _mm512_loadu_ps(p);
}

static inline void vi_store(void *p, vint v)
{
	_mm512_storeu_si512(p, v);
}

static inline void vf_store(float *p, vflt v)
{
	_mm512_storeu_ps(p, v);
}

static inline vint vi_add(vint a, vint b)
{
	return _mm512_add_epi32(a, b);
}

static inline vint vi_sub(vint a, vint b)
{
	return _mm512_sub_epi32(a, b);
}

static inline vint vi_and(vint a, vint b)
{
	return _mm512_and_si512(a, b);
}

static inline vint vi_or(vint a, vint b)
{
	return _mm512_or_si512(a, b);
}

static inline vint vi_srl(vint a, int n)
{
	return _mm512_srl_epi32(a, _mm_cvtsi32_si128(n));
}

static inline vint vi_sll(vint a, int n)
{
	return _mm512_sll_epi32(a, _mm_cvtsi32_si128(n));
}

static inline vint vi_max(vint a, vint b)
{
	return _mm512_max_epi32(a, b);
}

/* The largest lane (signed compare: callers hold non-negative values). */
static inline uint32_t vi_hmax(vint a)
{
	return (uint32_t)_mm512_reduce_max_epi32(a);
}

static inline vflt vf_mul(vflt a, vflt b)
{
	return _mm512_mul_ps(a, b);
}

static inline vflt vf_add(vflt a, vflt b)
{
	return _mm512_add_ps(a, b);
}

static inline vflt vf_sub(vflt a, vflt b)
{
	return _mm512_sub_ps(a, b);
}

static inline vflt vf_div(vflt a, vflt b)
{
	return _mm512_div_ps(a, b);
}

static inline vflt vi_as_f(vint a)
{
	return _mm512_castsi512_ps(a);
}

static inline vint vf_as_i(vflt a)
{
	return _mm512_castps_si512(a);
}

static inline vmask vm_gt(vint a, vint b)
{
	return _mm512_cmpgt_epi32_mask(a, b);
}

static inline vmask vm_eq(vint a, vint b)
{
	return _mm512_cmpeq_epi32_mask(a, b);
}

static inline vmask vm_or(vmask a, vmask b)
{
	return (vmask)(a | b);
}

/* a and not b */
static inline vmask vm_andnot(vmask a, vmask b)
{
	return (vmask)(a & ~b);
}

/* m ? b : a */
static inline vint vi_select(vmask m, vint a, vint b)
{
	return _mm512_mask_blend_epi32(m, a, b);
}

static inline counter counter_zero(void)
{
	return 0;
}

static inline void counter_add(counter *c, vmask m)
{
	*c += (uint64_t)__builtin_popcount(m);
}

static inline uint64_t counter_total(counter c)
{
	return c;
}

static inline void store_codes8(uint8_t *p, vint v)
{
	_mm_storeu_si128((__m128i *)p, _mm512_cvtepi32_epi8(v));
}

static inline void store_codes4(uint8_t *p, vint v)
{
	__m128i pairs = _mm_maddubs_epi16(_mm512_cvtepi32_epi8(v), _mm_set1_epi16(0x1001));

	_mm_storel_epi64((__m128i *)p, _mm_packus_epi16(pairs, pairs));
}

static inline void store_codes16(uint8_t *p, vint v)
{
	_mm256_storeu_si256((__m256i *)p, _mm512_cvtepi32_epi16(v));
}

static inline vint load_codes8(const uint8_t *p)
{
	return _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)p));
}

static inline vint load_codes4(const uint8_t *p)
{
	__m128i b = _mm_loadl_epi64((const __m128i *)p);
	__m128i lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
	__m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));

	return _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
}

static inline vint load_codes16(const uint8_t *p)
{
	return _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p));
}

#include "common/codec_simd.inc"
