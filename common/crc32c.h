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

/* The portable table path (tests, benchmarks); same contract. */
uint32_t aps_crc32c_portable(uint32_t crc, const void *buf, size_t len);

/* The SSE4.2 path; call only when aps_crc32c_has_sse42() is true. */
uint32_t aps_crc32c_sse42(uint32_t crc, const void *buf, size_t len);

/* True when this CPU runs the SSE4.2 path. */
bool aps_crc32c_has_sse42(void);

#endif
