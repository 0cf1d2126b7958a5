/*
 * Dense little-endian bit streams of w-bit codes (3 <= w <= 32): code i holds
 * bits [i*w, (i+1)*w) of the stream (DESIGN.md, "Formats").
 */
#ifndef APS_COMMON_PACK_H
#define APS_COMMON_PACK_H

#include <stddef.h>
#include <stdint.h>

struct aps_bitwriter {
	uint8_t *out;
	uint64_t acc;   /* pending bits, lowest first */
	unsigned nbits; /* number of pending bits, always < 8 between calls */
};

struct aps_bitreader {
	const uint8_t *in;
	uint64_t acc;
	unsigned nbits;
};

static inline void aps_bitwriter_put(struct aps_bitwriter *w, uint32_t code, unsigned bits)
{
	w->acc |= (uint64_t)code << w->nbits;
	w->nbits += bits;
	while (w->nbits >= 8) {
		*w->out++ = (uint8_t)w->acc;
		w->acc >>= 8;
		w->nbits -= 8;
	}
}

/* Writes the last partial byte (its unused high bits are zero). */
static inline void aps_bitwriter_flush(struct aps_bitwriter *w)
{
	if (w->nbits > 0)
		*w->out++ = (uint8_t)w->acc;
	w->acc = 0;
	w->nbits = 0;
}

static inline uint32_t aps_bitreader_get(struct aps_bitreader *r, unsigned bits)
{
	uint32_t code;

	while (r->nbits < bits) {
		r->acc |= (uint64_t)*r->in++ << r->nbits;
		r->nbits += 8;
	}
	code = (uint32_t)(r->acc & ((UINT64_C(1) << bits) - 1));
	r->acc >>= bits;
	r->nbits -= bits;
	return code;
}

/* Packs n codes of the given width into out (aps_pack_size(n, bits) bytes). */
void aps_pack_codes(const uint32_t *codes, size_t n, unsigned bits, uint8_t *out);

/* Unpacks n codes of the given width from in. */
void aps_unpack_codes(const uint8_t *in, size_t n, unsigned bits, uint32_t *codes);

static inline size_t aps_pack_size(size_t n, unsigned bits)
{
	return (n * bits + 7) / 8;
}

#endif
