/*
 * Format descriptions: parsing names into the constants every codec path
 * uses, and the exact value of a code. Encoding lives in codec_scalar.c.
 */
#include "common/format.h"

#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define FP32_EXP_BITS 8
#define FP32_MAN_BITS 23

static void fill_limits(struct aps_format *f)
{
	uint32_t exp_ones = (1u << f->exp_bits) - 1;
	uint32_t man_ones = (1u << f->man_bits) - 1;

	f->bits = (uint8_t)(1 + f->exp_bits + f->man_bits);
	f->bias = (1 << (f->exp_bits - 1)) - 1;
	f->emin = 1 - f->bias;
	f->emax = f->layout == APS_LAYOUT_IEEE ? f->bias : f->bias + 1;
	f->sign_bit = 1u << (f->bits - 1);
	switch (f->layout) {
	case APS_LAYOUT_FN:
		f->inf_code = 0;
		f->nan_code = (exp_ones << f->man_bits) | man_ones;
		f->max_code = f->nan_code - 1;
		break;
	case APS_LAYOUT_MX:
		f->inf_code = 0;
		f->max_code = (exp_ones << f->man_bits) | man_ones;
		f->nan_code = f->max_code; /* no NaN: it saturates to +max (APS.md 1) */
		break;
	default:
		f->inf_code = exp_ones << f->man_bits;
		/* Y = 0 has no NaN code: NaN is encoded as inf (APS.md 1). */
		f->nan_code = f->man_bits ? f->inf_code | (1u << (f->man_bits - 1)) : f->inf_code;
		f->max_code = f->inf_code - 1;
		break;
	}
	f->max_finite = (float)aps_format_decode(f, f->max_code);
	f->min_normal = (float)ldexp(1.0, f->emin);
	f->min_subnormal = f->man_bits ? (float)ldexp(1.0, f->emin - f->man_bits) : 0.0f;
}

static const struct {
	const char *name;
	int exp_bits, man_bits;
	enum aps_format_layout layout;
} named_formats[] = {
	{ "fp32", 8, 23, APS_LAYOUT_IEEE }, { "bf16", 8, 7, APS_LAYOUT_IEEE },
	{ "fp16", 5, 10, APS_LAYOUT_IEEE }, { "e5m2", 5, 2, APS_LAYOUT_IEEE },
	{ "e4m3", 4, 3, APS_LAYOUT_IEEE },  { "e4m3fn", 4, 3, APS_LAYOUT_FN },
	{ "e3m0", 3, 0, APS_LAYOUT_IEEE },  { "fp4", 2, 1, APS_LAYOUT_MX },
	{ "fp6e2m3", 2, 3, APS_LAYOUT_MX }, { "fp6e3m2", 3, 2, APS_LAYOUT_MX },
};

#define N_NAMED (sizeof(named_formats) / sizeof(named_formats[0]))

static const char *const layout_suffix[] = {
	[APS_LAYOUT_IEEE] = "",
	[APS_LAYOUT_FN] = "fn",
	[APS_LAYOUT_MX] = "mx",
};

int aps_format_make(int exp_bits, int man_bits, enum aps_format_layout layout,
                    struct aps_format *out)
{
	bool is_fp32 =
	        exp_bits == FP32_EXP_BITS && man_bits == FP32_MAN_BITS && layout == APS_LAYOUT_IEEE;
	struct aps_format f = { 0 };

	if (exp_bits < 2 || exp_bits > 8 || man_bits < 0)
		return APS_EFORMAT;
	if (layout != APS_LAYOUT_IEEE && layout != APS_LAYOUT_FN && layout != APS_LAYOUT_MX)
		return APS_EFORMAT;
	if (1 + exp_bits + man_bits > 16 && !is_fp32)
		return APS_EFORMAT;
	/* The fn layout needs a mantissa to tell NaN from the largest normal. */
	if (layout == APS_LAYOUT_FN && man_bits == 0)
		return APS_EFORMAT;
	/* With X = 8 a top binade of normals would lie beyond fp32. */
	if (layout != APS_LAYOUT_IEEE && exp_bits == 8)
		return APS_EFORMAT;
	f.exp_bits = (uint8_t)exp_bits;
	f.man_bits = (uint8_t)man_bits;
	f.layout = layout;
	fill_limits(&f);
	snprintf(f.name, sizeof(f.name), "e%dm%d%s", exp_bits, man_bits, layout_suffix[layout]);
	/* The MX element formats go by their OCP names whichever way they are made. */
	for (size_t i = 0; i < N_NAMED && layout == APS_LAYOUT_MX; i++) {
		if (named_formats[i].layout == layout && named_formats[i].exp_bits == exp_bits &&
		    named_formats[i].man_bits == man_bits)
			snprintf(f.name, sizeof(f.name), "%s", named_formats[i].name);
	}
	*out = f;
	return 0;
}

static int parse_generic(const char *name, int *exp_bits, int *man_bits,
                         enum aps_format_layout *layout)
{
	char canon[APS_FORMAT_NAME_MAX];
	int used = 0;

	if (sscanf(name, "e%2dm%2d%n", exp_bits, man_bits, &used) != 2)
		return APS_EFORMAT;
	*layout = APS_LAYOUT_IEEE;
	if (strcmp(name + used, "fn") == 0)
		*layout = APS_LAYOUT_FN;
	else if (strcmp(name + used, "mx") == 0)
		*layout = APS_LAYOUT_MX;
	else if (name[used] != '\0')
		return APS_EFORMAT;
	/* Reject "e04m3" and "e4m+3": digits only, no leading zeros. */
	snprintf(canon, sizeof(canon), "e%dm%d%s", *exp_bits, *man_bits, name + used);
	if (strcmp(canon, name) != 0)
		return APS_EFORMAT;
	return 0;
}

int aps_format_parse(const char *name, struct aps_format *out)
{
	int exp_bits, man_bits, ret;
	enum aps_format_layout layout;

	if (name == NULL || out == NULL)
		return APS_EINVAL;
	for (size_t i = 0; i < N_NAMED; i++) {
		if (strcmp(name, named_formats[i].name) != 0)
			continue;
		ret = aps_format_make(named_formats[i].exp_bits, named_formats[i].man_bits,
		                      named_formats[i].layout, out);
		if (ret == 0)
			snprintf(out->name, sizeof(out->name), "%s", name);
		return ret;
	}
	if (strlen(name) >= APS_FORMAT_NAME_MAX)
		return APS_EFORMAT;
	ret = parse_generic(name, &exp_bits, &man_bits, &layout);
	if (ret < 0)
		return ret;
	return aps_format_make(exp_bits, man_bits, layout, out);
}

size_t aps_format_packed_size(const struct aps_format *f, size_t count)
{
	return (count * f->bits + 7) / 8;
}

bool aps_format_equal(const struct aps_format *a, const struct aps_format *b)
{
	return a->exp_bits == b->exp_bits && a->man_bits == b->man_bits && a->layout == b->layout;
}

struct aps_format aps_format_fp32(void)
{
	struct aps_format f;

	(void)aps_format_make(FP32_EXP_BITS, FP32_MAN_BITS, APS_LAYOUT_IEEE, &f);
	snprintf(f.name, sizeof(f.name), "fp32"); /* as aps_format_parse names it */
	return f;
}

bool aps_format_is_fp32(const struct aps_format *f)
{
	return f->bits == 32;
}

bool aps_format_code_is_nonfinite(const struct aps_format *f, uint32_t code)
{
	uint32_t mag = code & (f->sign_bit - 1);

	switch (f->layout) {
	case APS_LAYOUT_FN:
		return mag == f->nan_code;
	case APS_LAYOUT_MX:
		return false;
	default:
		return mag >= f->inf_code;
	}
}

double aps_format_decode(const struct aps_format *f, uint32_t code)
{
	uint32_t mag = code & (f->sign_bit - 1);
	uint32_t exp_field = mag >> f->man_bits;
	uint32_t man = mag & ((1u << f->man_bits) - 1);
	double sign = (code & f->sign_bit) ? -1.0 : 1.0;

	if (aps_format_code_is_nonfinite(f, mag)) {
		if (f->layout == APS_LAYOUT_IEEE && mag == f->inf_code)
			return sign * INFINITY;
		return NAN;
	}
	if (exp_field == 0)
		return sign * ldexp((double)man, f->emin - f->man_bits);
	return sign *
	       ldexp((double)((1u << f->man_bits) | man), (int)exp_field - f->bias - f->man_bits);
}
