/*
 * CRC32C of byte buffers: the SSE4.2 instruction path, the portable
 * slicing-by-8 path and the run-time choice between them. Framing and the
 * decision of what to checksum belong to proto/.
 */
#include "common/crc32c.h"

#include <string.h>

#if defined(__x86_64__) /* the 64-bit crc32 instruction */
#define APS_CRC32C_X86 1
#include <immintrin.h>
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82F63B78u

/* slicing[k][b]: CRC of byte b followed by k zero bytes. */
static uint32_t slicing[8][256];

/* The SSE4.2 path runs three chains over three stripes of STRIPE bytes at once (the
 * instruction's latency is three times its throughput), then joins them: a chain's
 * register carried over STRIPE zero bytes is shift_stripe() of it. */
#define STRIPE 4096
static uint32_t stripe_shift[4][256];

/* The register advanced over one zero byte, then n of them. */
static uint32_t zeros(uint32_t c, size_t n)
{
	while (n-- > 0)
		c = (c >> 8) ^ slicing[0][c & 0xff];
	return c;
}

/* Advancing over zeros is linear in the register: the shift of each bit, then of
 * each byte value at each of the register's four bytes. */
static void stripe_shift_init(void)
{
	uint32_t bit[32];

	for (int i = 0; i < 32; i++)
		bit[i] = zeros(1u << i, STRIPE);
	for (int k = 0; k < 4; k++)
		for (uint32_t b = 0; b < 256; b++) {
			uint32_t c = 0;
			for (int j = 0; j < 8; j++)
				if (b & (1u << j))
					c ^= bit[8 * k + j];
			stripe_shift[k][b] = c;
		}
}

/* Runs before main: fills the tables once, so that no call races to do it. */
__attribute__((constructor)) static void crc32c_init(void)
{
	for (uint32_t b = 0; b < 256; b++) {
		uint32_t c = b;

		for (int i = 0; i < 8; i++)
			c = (c & 1) ? (c >> 1) ^ CRC32C_POLY : c >> 1;
		slicing[0][b] = c;
	}
	for (uint32_t b = 0; b < 256; b++) {
		for (int k = 1; k < 8; k++)
			slicing[k][b] =
			        (slicing[k - 1][b] >> 8) ^ slicing[0][slicing[k - 1][b] & 0xff];
	}
	stripe_shift_init();
#ifdef APS_CRC32C_X86
	__builtin_cpu_init();
#endif
}

static uint32_t load_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint32_t aps_crc32c_portable(uint32_t crc, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	crc = ~crc;
	for (; len >= 8; len -= 8, p += 8) {
		uint32_t lo = crc ^ load_le32(p);

		crc = slicing[7][lo & 0xff] ^ slicing[6][(lo >> 8) & 0xff] ^
		      slicing[5][(lo >> 16) & 0xff] ^ slicing[4][lo >> 24] ^ slicing[3][p[4]] ^
		      slicing[2][p[5]] ^ slicing[1][p[6]] ^ slicing[0][p[7]];
	}
	for (; len > 0; len--, p++)
		crc = (crc >> 8) ^ slicing[0][(crc ^ *p) & 0xff];
	return ~crc;
}

#ifdef APS_CRC32C_X86

bool aps_crc32c_has_sse42(void)
{
	return __builtin_cpu_supports("sse4.2");
}

static uint64_t load64(const uint8_t *p)
{
	uint64_t w;

	memcpy(&w, p, sizeof(w));
	return w;
}

static inline __attribute__((always_inline)) uint64_t lane_test(uint64_t w,
                                                                const struct aps_crc32c_lanes *l)
{
	return ((w & l->mask) + l->add) & l->high;
}

__attribute__((target("sse4.2"))) static uint32_t stripe_join(uint32_t c0, uint32_t c1, uint32_t c2)
{
	uint32_t c = c0;

	c = stripe_shift[0][c & 0xff] ^ stripe_shift[1][(c >> 8) & 0xff] ^
	    stripe_shift[2][(c >> 16) & 0xff] ^ stripe_shift[3][c >> 24];
	c ^= c1;
	c = stripe_shift[0][c & 0xff] ^ stripe_shift[1][(c >> 8) & 0xff] ^
	    stripe_shift[2][(c >> 16) & 0xff] ^ stripe_shift[3][c >> 24];
	return c ^ c2;
}

/* The one loop of both SSE4.2 entry points: inlined, so that the lane test vanishes
 * where lanes is NULL. The last partial word is tested padded with zeros. */
__attribute__((target("sse4.2"))) static inline __attribute__((always_inline)) uint32_t
crc_sse42(uint32_t crc, const uint8_t *p, size_t len, const struct aps_crc32c_lanes *l,
          uint64_t *flag)
{
	uint64_t f = 0;
	uint32_t c = ~crc;

	for (; len >= 3 * STRIPE; len -= 3 * STRIPE, p += 3 * STRIPE) {
		uint64_t c0 = c, c1 = 0, c2 = 0;
		for (size_t i = 0; i < STRIPE; i += 8) {
			uint64_t w0 = load64(p + i), w1 = load64(p + STRIPE + i),
			         w2 = load64(p + 2 * STRIPE + i);
			c0 = _mm_crc32_u64(c0, w0);
			c1 = _mm_crc32_u64(c1, w1);
			c2 = _mm_crc32_u64(c2, w2);
			if (l != NULL)
				f |= lane_test(w0, l) | lane_test(w1, l) | lane_test(w2, l);
		}
		c = stripe_join((uint32_t)c0, (uint32_t)c1, (uint32_t)c2);
	}
	for (; len >= 8; len -= 8, p += 8) {
		uint64_t w = load64(p);
		c = (uint32_t)_mm_crc32_u64(c, w);
		if (l != NULL)
			f |= lane_test(w, l);
	}
	if (len > 0 && l != NULL) {
		uint64_t w = 0;
		memcpy(&w, p, len);
		f |= lane_test(w, l);
	}
	for (; len > 0; len--, p++)
		c = _mm_crc32_u8(c, *p);
	if (flag != NULL)
		*flag = f;
	return ~c;
}

__attribute__((target("sse4.2"))) uint32_t aps_crc32c_sse42(uint32_t crc, const void *buf,
                                                            size_t len)
{
	return crc_sse42(crc, buf, len, NULL, NULL);
}

__attribute__((target("sse4.2"))) static uint32_t crc_lanes_sse42(uint32_t crc, const void *buf,
                                                                  size_t len,
                                                                  const struct aps_crc32c_lanes *l,
                                                                  uint64_t *flag)
{
	return crc_sse42(crc, buf, len, l, flag);
}

/* With AVX2: the lane test on 32 bytes of each stripe at once, beside the twelve crc32
 * instructions of those 96 bytes (the scalar test was the pace); the rest as above. */
__attribute__((target("sse4.2,avx2"))) static uint32_t
crc_lanes_avx2(uint32_t crc, const uint8_t *p, size_t len, const struct aps_crc32c_lanes *l,
               uint64_t *flag)
{
	const __m256i mask = _mm256_set1_epi64x((long long)l->mask),
	              add = _mm256_set1_epi64x((long long)l->add),
	              high = _mm256_set1_epi64x((long long)l->high);
	__m256i acc = _mm256_setzero_si256();
	uint64_t c = (uint32_t)~crc, rest;
	uint64_t lanes[4];

	for (; len >= 3 * STRIPE; len -= 3 * STRIPE, p += 3 * STRIPE) {
		uint64_t c0 = c, c1 = 0, c2 = 0;
		for (size_t i = 0; i < STRIPE; i += 32) {
			for (int s = 0; s < 3; s++) {
				__m256i v =
				        _mm256_loadu_si256((const __m256i *)(p + s * STRIPE + i));
				acc = _mm256_or_si256(
				        acc,
				        _mm256_and_si256(
				                _mm256_add_epi64(_mm256_and_si256(v, mask), add),
				                high));
			}
			for (size_t j = i; j < i + 32; j += 8) {
				c0 = _mm_crc32_u64(c0, load64(p + j));
				c1 = _mm_crc32_u64(c1, load64(p + STRIPE + j));
				c2 = _mm_crc32_u64(c2, load64(p + 2 * STRIPE + j));
			}
		}
		c = stripe_join((uint32_t)c0, (uint32_t)c1, (uint32_t)c2);
	}
	_mm256_storeu_si256((__m256i *)lanes, acc);
	c = ~crc_sse42(~(uint32_t)c, p, len, l, &rest);
	*flag = lanes[0] | lanes[1] | lanes[2] | lanes[3] | rest;
	return ~(uint32_t)c;
}

#else

bool aps_crc32c_has_sse42(void)
{
	return false;
}

uint32_t aps_crc32c_sse42(uint32_t crc, const void *buf, size_t len)
{
	return aps_crc32c_portable(crc, buf, len);
}

static uint32_t crc_lanes_sse42(uint32_t crc, const void *buf, size_t len,
                                const struct aps_crc32c_lanes *l, uint64_t *flag)
{
	(void)crc, (void)buf, (void)len, (void)l, (void)flag;
	return 0; /* never called: aps_crc32c_has_sse42() is false */
}

#endif

uint32_t aps_crc32c(uint32_t crc, const void *buf, size_t len)
{
	if (aps_crc32c_has_sse42())
		return aps_crc32c_sse42(crc, buf, len);
	return aps_crc32c_portable(crc, buf, len);
}

uint64_t aps_crc32c_lanes_only(const void *buf, size_t len, const struct aps_crc32c_lanes *l)
{
	const uint8_t *p = buf;
	uint64_t f = 0, w;

	for (; len >= 8; len -= 8, p += 8) {
		memcpy(&w, p, sizeof(w));
		f |= ((w & l->mask) + l->add) & l->high;
	}
	if (len > 0) {
		w = 0;
		memcpy(&w, p, len);
		f |= ((w & l->mask) + l->add) & l->high;
	}
	return f;
}

uint32_t aps_crc32c_lanes(uint32_t crc, const void *buf, size_t len,
                          const struct aps_crc32c_lanes *lanes, uint64_t *flag)
{
#ifdef APS_CRC32C_X86
	if (aps_crc32c_has_sse42() && __builtin_cpu_supports("avx2"))
		return crc_lanes_avx2(crc, buf, len, lanes, flag);
#endif
	if (aps_crc32c_has_sse42())
		return crc_lanes_sse42(crc, buf, len, lanes, flag);
	/* Without SSE4.2: the table path, then the lane test in a pass of its own. */
	*flag = aps_crc32c_lanes_only(buf, len, lanes);
	return aps_crc32c_portable(crc, buf, len);
}
