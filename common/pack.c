/*
 * Whole-array packing over the bit stream helpers of pack.h.
 */
#include "common/pack.h"

void aps_pack_codes(const uint32_t *codes, size_t n, unsigned bits, uint8_t *out)
{
	struct aps_bitwriter w = { .out = out };

	for (size_t i = 0; i < n; i++)
		aps_bitwriter_put(&w, codes[i], bits);
	aps_bitwriter_flush(&w);
}

void aps_unpack_codes(const uint8_t *in, size_t n, unsigned bits, uint32_t *codes)
{
	struct aps_bitreader r = { .in = in };

	for (size_t i = 0; i < n; i++)
		codes[i] = aps_bitreader_get(&r, bits);
}
