/*
 * Unit tests of the APS exponent rules (common/scale.h), on hand-made cases.
 */
#include "common/codec.h"
#include "common/err.h"
#include "common/scale.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

static struct aps_format fmt(const char *name)
{
	struct aps_format f;

	assert_int_equal(aps_format_parse(name, &f), 0);
	return f;
}

static int global_k(const char *name, float maxabs, int n)
{
	struct aps_format f = fmt(name);
	int k = 12345;

	assert_int_equal(aps_scale_global(&f, maxabs, n, &k), 0);
	return k;
}

static int local_k(const char *name, float maxabs)
{
	struct aps_format f = fmt(name);
	int k = 12345;

	assert_int_equal(aps_scale_local(&f, maxabs, &k), 0);
	return k;
}

static void test_scale_global_hand_cases(void **state)
{
	(void)state;
	/* e4m3: emax = 7. N * max = 4 * 1 = 4 = 2^2 -> k = 5. */
	assert_int_equal(global_k("e4m3", 1.0f, 4), 5);
	/* 3 * 1 = 3 -> ceil(log2 3) = 2 -> k = 5. */
	assert_int_equal(global_k("e4m3", 1.0f, 3), 5);
	/* 1 worker, max 1 -> e = 0 -> k = emax. */
	assert_int_equal(global_k("e4m3", 1.0f, 1), 7);
	/* just above a power of two rounds the exponent up */
	assert_int_equal(global_k("e4m3", nextafterf(1.0f, 2.0f), 1), 6);
	/* e4m3fn: emax = bias + 1 = 8 */
	assert_int_equal(global_k("e4m3fn", 1.0f, 1), 8);
	/* e5m2: emax = 15; max 2^-20 on 10 workers: ceil(log2(10 * 2^-20)) = -16 */
	assert_int_equal(global_k("e5m2", 0x1p-20f, 10), 31);
	/* an all-zero tensor gets k = 0 */
	assert_int_equal(global_k("e4m3", 0.0f, 8), 0);
	/* fp32 subnormal max: 2^-149 * 3 workers -> ceil(log2 3) - 149 = -147 */
	assert_int_equal(global_k("e3m0", 0x1p-149f, 3), 3 + 147);
	/* N * max for a 24-bit mantissa and a large N is exact: (2^24-1) * 2^-24 * 2^20 < 2^20 */
	assert_int_equal(global_k("e4m3", 0x1.fffffep-1f, 1 << 20), 7 - 20);
}

/* Every scaled value of every worker is at most 2^emax / N (APS.md 2, step 4). */
static void test_scale_global_bound(void **state)
{
	struct aps_format f = fmt("e4m3");

	(void)state;
	for (int n = 1; n <= 64; n++) {
		for (float m = 1e-6f; m < 1e6f; m *= 1.37f) {
			int k;
			assert_int_equal(aps_scale_global(&f, m, n, &k), 0);
			assert_true(ldexp(m, k) <= ldexp(1.0, f.emax) / n);
			assert_true(ldexp(m, k + 1) > ldexp(1.0, f.emax) / n);
		}
	}
}

static void test_scale_local_hand_cases(void **state)
{
	(void)state;
	/* e4m3: max finite 240 = 1.875 * 2^7. 1.0 -> k = 7 (128). */
	assert_int_equal(local_k("e4m3", 1.0f), 7);
	/* 1.875 * 2^7 = 240 fits exactly */
	assert_int_equal(local_k("e4m3", 1.875f), 7);
	/* 1.9 * 2^7 = 243.2 rounds to 240: still no overflow */
	assert_int_equal(local_k("e4m3", 1.9f), 7);
	/* 1.95 * 2^7 = 249.6 rounds past 240: back off one */
	assert_int_equal(local_k("e4m3", 1.95f), 6);
	/* e4m3fn: 1.75 * 2^8 = 448 fits; 1.8 * 256 = 460.8 -> 448; 1.9 * 256 = 486 -> overflow */
	assert_int_equal(local_k("e4m3fn", 1.75f), 8);
	assert_int_equal(local_k("e4m3fn", 1.8f), 8);
	assert_int_equal(local_k("e4m3fn", 1.9f), 7);
	/* e3m0: max 8; 1.4 * 8 = 11.2 -> 8; 1.5 * 8 = 12 is a tie that rounds to 16 */
	assert_int_equal(local_k("e3m0", 1.4f), 3);
	assert_int_equal(local_k("e3m0", 1.5f), 2);
	assert_int_equal(local_k("e4m3", 0.0f), 0);
	assert_int_equal(local_k("fp16", 0x1p-149f), 15 + 149);
}

static void test_scale_local_is_largest_without_overflow(void **state)
{
	static const char *const names[] = { "e5m2", "e4m3", "e4m3fn", "e3m0", "fp16", "bf16" };

	(void)state;
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		struct aps_format f = fmt(names[i]);
		for (float m = 1e-30f; m < 1e30f; m *= 1.0973f) {
			struct aps_codec_stats st = { 0 };
			struct aps_quant_opts o;
			uint8_t code[2];
			int k;
			assert_int_equal(aps_scale_local(&f, m, &k), 0);
			o = (struct aps_quant_opts){ .scale_exp = k };
			aps_codec_quantize(&f, &m, 1, &o, code, sizeof(code), &st);
			assert_int_equal(st.overflow, 0);
			o.scale_exp = k + 1;
			aps_codec_quantize(&f, &m, 1, &o, code, sizeof(code), &st);
			assert_int_equal(st.overflow, 1);
		}
	}
}

static void test_scale_rejects_bad_input(void **state)
{
	struct aps_format f = fmt("e4m3");
	int k;

	(void)state;
	assert_int_equal(aps_scale_local(&f, NAN, &k), APS_EINVAL);
	assert_int_equal(aps_scale_local(&f, -1.0f, &k), APS_EINVAL);
	assert_int_equal(aps_scale_global(&f, INFINITY, 2, &k), APS_EINVAL);
	assert_int_equal(aps_scale_global(&f, 1.0f, 0, &k), APS_EINVAL);
}

static void test_scale_mode_names(void **state)
{
	enum aps_scaling mode;

	(void)state;
	assert_int_equal(aps_scaling_parse("global", &mode), 0);
	assert_int_equal(mode, APS_SCALING_GLOBAL);
	assert_int_equal(aps_scaling_parse("Local", &mode), APS_EINVAL);
	assert_string_equal(aps_scaling_name(APS_SCALING_NONE), "none");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_scale_global_hand_cases),
		cmocka_unit_test(test_scale_global_bound),
		cmocka_unit_test(test_scale_local_hand_cases),
		cmocka_unit_test(test_scale_local_is_largest_without_overflow),
		cmocka_unit_test(test_scale_rejects_bad_input),
		cmocka_unit_test(test_scale_mode_names),
	};
	return cmocka_run_group_tests_name("scale", tests, NULL, NULL);
}
