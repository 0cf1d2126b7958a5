/*
 * Low-precision floating-point formats (APS.md section 1).
 *
 * A format eXmY has 1 sign bit, X exponent bits and Y stored mantissa bits.
 * IEEE-style formats reserve the all-ones exponent for inf and NaN; the OCP
 * "fn" layout (e4m3fn) keeps normals there and has one NaN and no inf; the
 * OCP MX element formats (fp4, fp6e2m3, fp6e3m2) have neither inf nor NaN:
 * every code is a finite value.
 */
#ifndef APS_COMMON_FORMAT_H
#define APS_COMMON_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_FORMAT_NAME_MAX 16

/* What the all-ones exponent holds. */
enum aps_format_layout {
	APS_LAYOUT_IEEE = 0, /* inf and NaN */
	APS_LAYOUT_FN = 1,   /* normals, and one NaN (the all-ones code): e4m3fn */
	APS_LAYOUT_MX = 2,   /* normals: no inf, no NaN (OCP MX v1.0 FP4/FP6) */
};

struct aps_format {
	char name[APS_FORMAT_NAME_MAX];
	uint8_t exp_bits; /* X */
	uint8_t man_bits; /* Y */
	uint8_t bits;     /* 1 + X + Y: width of a packed code */
	enum aps_format_layout layout;
	int bias;          /* 2^(X-1) - 1 */
	int emin;          /* 1 - bias */
	int emax;          /* bias, or bias + 1 when the top exponent is normal */
	uint32_t sign_bit; /* 1 << (bits - 1) */
	uint32_t max_code; /* magnitude code of the largest finite value */
	uint32_t inf_code; /* magnitude code of inf; 0 (none) for fn and MX */
	uint32_t nan_code; /* magnitude code of the canonical NaN; for MX, that
	                      of +max: what a NaN input becomes */
	float max_finite;
	float min_normal;
	float min_subnormal; /* 0 when the format has no subnormals (Y = 0) */
};

/*
 * Parses "fp32", "bf16", "fp16", "e5m2", "e4m3", "e4m3fn", "e3m0", the MX
 * element formats "fp4", "fp6e2m3", "fp6e3m2", or a generic "eXmY" (2 <= X <= 8,
 * 1 + X + Y <= 16), "eXmYfn" or "eXmYmx". Returns 0 or APS_EFORMAT.
 */
int aps_format_parse(const char *name, struct aps_format *out);

/* True when a and b are the same format: the same fields, whatever their names. */
bool aps_format_equal(const struct aps_format *a, const struct aps_format *b);

/* fp32 (raw IEEE binary32 words), without parsing its name. */
struct aps_format aps_format_fp32(void);

/* Builds a format from its fields; same limits as aps_format_parse. */
int aps_format_make(int exp_bits, int man_bits, enum aps_format_layout layout,
                    struct aps_format *out);

/* Bytes needed to hold count packed codes. */
size_t aps_format_packed_size(const struct aps_format *f, size_t count);

/* True for the all-fp32 format (codes are raw IEEE binary32 words). */
bool aps_format_is_fp32(const struct aps_format *f);

/* True when the magnitude code is inf or NaN. */
bool aps_format_code_is_nonfinite(const struct aps_format *f, uint32_t code);

/* Exact value of a code (sign included); inf codes give +-inf, NaN codes NaN. */
double aps_format_decode(const struct aps_format *f, uint32_t code);

#endif
