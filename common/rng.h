/*
 * Counter-based random bits for stochastic rounding: a pure function of
 * (seed, stream, index), so that any element can be quantized alone, in any
 * order or chunking, and give the same result.
 */
#ifndef APS_COMMON_RNG_H
#define APS_COMMON_RNG_H

#include <stdint.h>

/* The finaliser of MurmurHash3: a bijection with good avalanche. */
static inline uint64_t aps_rng_mix(uint64_t z)
{
	z ^= z >> 33;
	z *= UINT64_C(0xff51afd7ed558ccd);
	z ^= z >> 33;
	z *= UINT64_C(0xc4ceb9fe1a85ec53);
	z ^= z >> 33;
	return z;
}

static inline uint64_t aps_rng_bits(uint64_t seed, uint64_t stream, uint64_t index)
{
	uint64_t key = aps_rng_mix(seed ^ UINT64_C(0x9e3779b97f4a7c15));

	key = aps_rng_mix(key ^ stream);
	return aps_rng_mix(key ^ (index * UINT64_C(0x9e3779b97f4a7c15)));
}

#endif
