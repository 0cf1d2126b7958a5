/*
 * CRC32C of byte buffers: the SSE4.2 instruction path, the portable
 * slicing-by-8 path and the run-time choice between them. Framing and the
 * decision of what to checksum belong to proto/.
 */
#include "common/crc32c.h"

#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#define APS_CRC32C_X86 1
#include <nmmintrin.h>
#endif

#define CRC32C_POLY 0x82F63B78u

/* slicing[k][b]: CRC of byte b followed by k zero bytes. */
static uint32_t slicing[8][256];

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

__attribute__((target("sse4.2"))) uint32_t aps_crc32c_sse42(uint32_t crc, const void *buf,
                                                            size_t len)
{
	const uint8_t *p = buf;
	uint32_t c = ~crc;

#ifdef __x86_64__
	for (; len >= 8; len -= 8, p += 8) {
		uint64_t word;

		memcpy(&word, p, sizeof(word));
		c = (uint32_t)_mm_crc32_u64(c, word);
	}
#endif
	for (; len >= 4; len -= 4, p += 4) {
		uint32_t word;

		memcpy(&word, p, sizeof(word));
		c = _mm_crc32_u32(c, word);
	}
	for (; len > 0; len--, p++)
		c = _mm_crc32_u8(c, *p);
	return ~c;
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

#endif

uint32_t aps_crc32c(uint32_t crc, const void *buf, size_t len)
{
	if (aps_crc32c_has_sse42())
		return aps_crc32c_sse42(crc, buf, len);
	return aps_crc32c_portable(crc, buf, len);
}
