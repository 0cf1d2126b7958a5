/*
 * APS scale exponents (APS.md section 2): the power of two k by which a
 * tensor is multiplied before quantizing, so that its largest element lands at
 * the top of the format's range. Integer arithmetic only, no rounded log2.
 */
#ifndef APS_COMMON_SCALE_H
#define APS_COMMON_SCALE_H

#include "common/format.h"

#include <limits.h>

enum aps_scaling {
	APS_SCALING_NONE = 0,   /* k = 0: plain quantization (the baseline) */
	APS_SCALING_LOCAL = 1,  /* each worker's own largest k without overflow */
	APS_SCALING_GLOBAL = 2, /* the paper: one k for all workers */
	APS_SCALING_BLOCK = 3,  /* a local k per block of 16-64 elements (codec.h) */
};

/* Returned by aps_scale_global_exponent for an all-zero tensor. */
#define APS_SCALE_ZERO_EXPONENT INT_MIN

/*
 * One worker's exponent for global mode: ceil(log2(nworkers * maxabs)), or
 * APS_SCALE_ZERO_EXPONENT when maxabs is 0. Workers exchange it and take the
 * max. Returns 0, or APS_EINVAL for a negative or non-finite maxabs or
 * nworkers < 1.
 */
int aps_scale_global_exponent(float maxabs, int nworkers, int *exponent);

/* k = emax - exponent (0 for APS_SCALE_ZERO_EXPONENT). */
int aps_scale_from_global_exponent(const struct aps_format *f, int exponent);

/* Global mode for one set of data: emax - ceil(log2(nworkers * maxabs)). */
int aps_scale_global(const struct aps_format *f, float maxabs, int nworkers, int *k);

/* Local mode: the largest k such that maxabs * 2^k quantizes without overflow. */
int aps_scale_local(const struct aps_format *f, float maxabs, int *k);

/* Block exponents are int8 on the wire: k is kept within [-127, 127]. */
#define APS_SCALE_BLOCK_MAX 127

/*
 * Block scaling: the local rule for one block's largest finite |x| (0 for an
 * all-zero block), clamped to +-APS_SCALE_BLOCK_MAX.
 */
int aps_scale_block(const struct aps_format *f, float maxabs);

/* Parses "none", "local", "global" or "block"; returns 0 or APS_EINVAL. */
int aps_scaling_parse(const char *name, enum aps_scaling *out);
const char *aps_scaling_name(enum aps_scaling mode);

#endif
