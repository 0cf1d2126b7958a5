/*
 * APS exponent rules. The codec applies k; this module only chooses it.
 */
#include "common/scale.h"

#include "common/codec_kernels.h"
#include "common/err.h"

#include <math.h>
#include <string.h>

static bool maxabs_ok(float maxabs)
{
	return isfinite(maxabs) && maxabs >= 0.0f;
}

int aps_scale_global_exponent(float maxabs, int nworkers, int *exponent)
{
	uint32_t bits;
	uint64_t product;
	int e;

	if (!maxabs_ok(maxabs) || nworkers < 1 || exponent == NULL)
		return APS_EINVAL;
	if (maxabs == 0.0f) {
		*exponent = APS_SCALE_ZERO_EXPONENT;
		return 0;
	}
	/* maxabs = m * 2^e with an integer m < 2^24; N * m is exact in 64 bits. */
	memcpy(&bits, &maxabs, sizeof(bits));
	e = (int)(bits >> 23);
	product = (uint64_t)((bits & 0x7fffffu) | (e ? 0x800000u : 0)) * (uint64_t)nworkers;
	e = (e ? e : 1) - 150;
	/* ceil(log2(p)) for an integer p >= 1 is the bit length of p - 1. */
	*exponent = e + (product == 1 ? 0 : 64 - __builtin_clzll(product - 1));
	return 0;
}

int aps_scale_from_global_exponent(const struct aps_format *f, int exponent)
{
	if (exponent == APS_SCALE_ZERO_EXPONENT)
		return 0;
	return f->emax - exponent;
}

int aps_scale_global(const struct aps_format *f, float maxabs, int nworkers, int *k)
{
	int exponent;
	int ret = aps_scale_global_exponent(maxabs, nworkers, &exponent);

	if (ret < 0 || f == NULL || k == NULL)
		return ret < 0 ? ret : APS_EINVAL;
	*k = aps_scale_from_global_exponent(f, exponent);
	return 0;
}

int aps_scale_local(const struct aps_format *f, float maxabs, int *k)
{
	struct aps_codec_stats st = { 0 };
	int candidate;

	if (f == NULL || k == NULL || !maxabs_ok(maxabs))
		return APS_EINVAL;
	if (maxabs == 0.0f) {
		*k = 0;
		return 0;
	}
	/* Put the top element in the top binade; back off one if it rounds past max. */
	candidate = f->emax - ilogbf(maxabs);
	aps_scalar_encode(f, maxabs, candidate, &st);
	*k = st.overflow ? candidate - 1 : candidate;
	return 0;
}

int aps_scale_block(const struct aps_format *f, float maxabs)
{
	int k = 0;

	if (aps_scale_local(f, maxabs, &k) < 0)
		return 0;
	return k > APS_SCALE_BLOCK_MAX    ? APS_SCALE_BLOCK_MAX
	       : k < -APS_SCALE_BLOCK_MAX ? -APS_SCALE_BLOCK_MAX
	                                  : k;
}

static const char *const scaling_names[] = {
	[APS_SCALING_NONE] = "none",
	[APS_SCALING_LOCAL] = "local",
	[APS_SCALING_GLOBAL] = "global",
	[APS_SCALING_BLOCK] = "block",
};

int aps_scaling_parse(const char *name, enum aps_scaling *out)
{
	for (int i = 0; name != NULL && i <= APS_SCALING_BLOCK; i++) {
		if (strcmp(name, scaling_names[i]) == 0) {
			*out = (enum aps_scaling)i;
			return 0;
		}
	}
	return APS_EINVAL;
}

const char *aps_scaling_name(enum aps_scaling mode)
{
	if (mode < APS_SCALING_NONE || mode > APS_SCALING_BLOCK)
		return "unknown";
	return scaling_names[mode];
}
