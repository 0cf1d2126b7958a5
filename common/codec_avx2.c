/*
 * AVX2 primitives for the vector codec in codec_simd.inc (8 lanes). Built
 * with -mavx2 and called only after a run-time CPU check.
 */
#include "common/codec_kernels.h"
#include "common/scale.h"

#include <immintrin.h>
#include <math.h>
#include <string.h>

#define VL           8
#define KERNEL(name) aps_avx2_##name

typedef __m256i vint;
typedef __m256 vflt;
typedef __m256i vmask;
typedef __m256i counter;

static inline vint vi_set1(uint32_t v)
{
	return _mm256_set1_epi32((int)v);
}

static inline vflt vf_set1(float v)
{
	return _mm256_set1_ps(v);
}

static inline vint vi_load(const void *p)
{
	return _mm256_loadu_si256((const __m256i *)p);
}

static inline vflt vf_load(const float *p)
{
	return _mm256_loadu_ps(p);
}

static inline void vi_store(void *p, vint v)
{
	_mm256_storeu_si256((__m256i *)p, v);
}

static inline void vf_store(float *p, vflt v)
{
	_mm256_storeu_ps(p, v);
}

static inline vint vi_add(vint a, vint b)
{
	return _mm256_add_epi32(a, b);
}

static inline vint vi_sub(vint a, vint b)
{
	return _mm256_sub_epi32(a, b);
}

static inline vint vi_and(vint a, vint b)
{
	return _mm256_and_si256(a, b);
}

static inline vint vi_or(vint a, vint b)
{
	return _mm256_or_si256(a, b);
}

static inline vint vi_srl(vint a, int n)
{
	return _mm256_srl_epi32(a, _mm_cvtsi32_si128(n));
}

static inline vint vi_sll(vint a, int n)
{
	return _mm256_sll_epi32(a, _mm_cvtsi32_si128(n));
}

static inline vint vi_max(vint a, vint b)
{
	return _mm256_max_epi32(a, b);
}

/* The largest lane (signed compare: callers hold non-negative values). */
static inline uint32_t vi_hmax(vint a)
{
	__m128i m = _mm_max_epi32(_mm256_castsi256_si128(a), _mm256_extracti128_si256(a, 1));

	m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(1, 0, 3, 2)));
	m = _mm_max_epi32(m, _mm_shuffle_epi32(m, _MM_SHUFFLE(2, 3, 0, 1)));
	return (uint32_t)_mm_cvtsi128_si32(m);
}

static inline vflt vf_mul(vflt a, vflt b)
{
	return _mm256_mul_ps(a, b);
}

static inline vflt vf_add(vflt a, vflt b)
{
	return _mm256_add_ps(a, b);
}

static inline vflt vf_sub(vflt a, vflt b)
{
	return _mm256_sub_ps(a, b);
}

static inline vflt vf_div(vflt a, vflt b)
{
	return _mm256_div_ps(a, b);
}

static inline vflt vi_as_f(vint a)
{
	return _mm256_castsi256_ps(a);
}

static inline vint vf_as_i(vflt a)
{
	return _mm256_castps_si256(a);
}

static inline vmask vm_gt(vint a, vint b)
{
	return _mm256_cmpgt_epi32(a, b);
}

static inline vmask vm_eq(vint a, vint b)
{
	return _mm256_cmpeq_epi32(a, b);
}

static inline vmask vm_or(vmask a, vmask b)
{
	return _mm256_or_si256(a, b);
}

/* a and not b */
static inline vmask vm_andnot(vmask a, vmask b)
{
	return _mm256_andnot_si256(b, a);
}

/* m ? b : a */
static inline vint vi_select(vmask m, vint a, vint b)
{
	return _mm256_blendv_epi8(a, b, m);
}

static inline counter counter_zero(void)
{
	return _mm256_setzero_si256();
}

/* A true lane is -1: subtracting it counts one. */
static inline void counter_add(counter *c, vmask m)
{
	*c = _mm256_sub_epi32(*c, m);
}

static inline uint64_t counter_total(counter c)
{
	uint32_t lanes[VL];
	uint64_t sum = 0;

	_mm256_storeu_si256((__m256i *)lanes, c);
	for (int i = 0; i < VL; i++)
		sum += lanes[i];
	return sum;
}

/* The 8 low bytes of the lanes, in order, in the low half of an xmm. */
static inline __m128i narrow8(vint v)
{
	const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
	__m256i w = _mm256_packus_epi32(v, v);

	w = _mm256_packus_epi16(w, w);
	return _mm256_castsi256_si128(_mm256_permutevar8x32_epi32(w, order));
}

static inline void store_codes8(uint8_t *p, vint v)
{
	_mm_storel_epi64((__m128i *)p, narrow8(v));
}

static inline void store_codes4(uint8_t *p, vint v)
{
	__m128i pairs = _mm_maddubs_epi16(narrow8(v), _mm_set1_epi16(0x1001));
	uint32_t word = (uint32_t)_mm_cvtsi128_si32(_mm_packus_epi16(pairs, pairs));

	memcpy(p, &word, sizeof(word));
}

static inline void store_codes16(uint8_t *p, vint v)
{
	__m256i w = _mm256_permute4x64_epi64(_mm256_packus_epi32(v, v), 0xd8);

	_mm_storeu_si128((__m128i *)p, _mm256_castsi256_si128(w));
}

static inline vint load_codes8(const uint8_t *p)
{
	return _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p));
}

static inline vint load_codes4(const uint8_t *p)
{
	uint32_t word;
	__m128i b, lo, hi;

	memcpy(&word, p, sizeof(word));
	b = _mm_cvtsi32_si128((int)word);
	lo = _mm_and_si128(b, _mm_set1_epi8(0x0f));
	hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0f));
	return _mm256_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi));
}

static inline vint load_codes16(const uint8_t *p)
{
	return _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
}

#include "common/codec_simd.inc"
