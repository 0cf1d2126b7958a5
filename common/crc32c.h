/*
 * CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of payload frames.
 *
 * The SSE4.2 crc32 instruction is used when the CPU has it (chosen at run
 * time); a portable slicing-by-8 table path gives the same values elsewhere.
 */
#ifndef APS_COMMON_CRC32C_H
#define APS_COMMON_CRC32C_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Continues a CRC32C over len bytes of buf. Start with crc = 0; the result of
 * one call is the crc argument of the next, so that crc(a || b) ==
 * aps_crc32c(aps_crc32c(0, a), b). aps_crc32c(0, "123456789", 9) == 0xE3069283.
 */
uint32_t aps_crc32c(uint32_t crc, const void *buf, size_t len);

/*
 * A test of every 64-bit word w of a buffer, made in the CRC's own pass:
 * ((w & mask) + add) & high, ORed over the words. With lanes of b bits, mask
 * the b-1 low bits of each lane, add (1 << (b-1)) - t to each and high their
 * top bits, a lane's top bit is set when its value (top bit dropped) is at
 * least t, and no carry crosses lanes (t >= 1): "a code reaches the inf code".
 */
struct aps_crc32c_lanes {
	uint64_t mask, add, high;
};

/* aps_crc32c of buf, and *flag the lane test ORed over buf's words (the last,
 * partial word padded with zero bytes). */
uint32_t aps_crc32c_lanes(uint32_t crc, const void *buf, size_t len,
                          const struct aps_crc32c_lanes *lanes, uint64_t *flag);

/* The lane test of aps_crc32c_lanes alone, without the CRC: the OR over buf's words. */
uint64_t aps_crc32c_lanes_only(const void *buf, size_t len, const struct aps_crc32c_lanes *lanes);

/* The portable table path (tests, benchmarks); same contract. */
uint32_t aps_crc32c_portable(uint32_t crc, const void *buf, size_t len);

/* The SSE4.2 path; call only when aps_crc32c_has_sse42() is true. */
uint32_t aps_crc32c_sse42(uint32_t crc, const void *buf, size_t len);

/* True when this CPU runs the SSE4.2 path. */
bool aps_crc32c_has_sse42(void);

#endif
