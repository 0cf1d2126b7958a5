/*
 * Unit tests of format names and fields (common/format.h), packing
 * (common/pack.h) and the error table (common/err.h).
 */
#include "common/err.h"
#include "common/format.h"
#include "common/pack.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static void test_format_parses_named_and_generic(void **state)
{
	struct aps_format f;

	(void)state;
	assert_int_equal(aps_format_parse("e4m3fn", &f), 0);
	assert_int_equal(f.layout, APS_LAYOUT_FN);
	assert_int_equal(f.bits, 8);
	assert_int_equal(f.emax, 8);
	assert_int_equal(aps_format_parse("e4m3", &f), 0);
	assert_int_equal(f.layout, APS_LAYOUT_IEEE);
	assert_int_equal(f.emax, 7);
	assert_int_equal(aps_format_parse("e3m0", &f), 0);
	assert_int_equal(f.bits, 4);
	assert_int_equal(aps_format_parse("e2m13", &f), 0);
	assert_int_equal(f.bits, 16);
	assert_string_equal(f.name, "e2m13");
	assert_int_equal(aps_format_parse("e2m1", &f), 0);
	assert_true(f.max_finite == 3.0f); /* IEEE-style e2m1, not OCP MX FP4 */
	assert_int_equal(aps_format_parse("fp32", &f), 0);
	assert_int_equal(f.bits, 32);
	assert_string_equal(f.name, "fp32");
}

static void test_format_rejects_bad_names(void **state)
{
	static const char *const bad[] = { "",        "e1m3",    "e9m1",   "e4m12", "e04m3",
		                           "e4m3x",   "e4m3fnx", "e3m0fn", "e+4m3", "E4M3",
		                           "fp8",     "e4m",     "e8m7fn", "e4m3 ", "e8m2mx",
		                           "e4m3mxx", "fp6",     "FP4",    "fp4 " };
	struct aps_format f;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (aps_format_parse(bad[i], &f) != APS_EFORMAT)
			fail_msg("'%s' was accepted", bad[i]);
	}
	assert_int_equal(aps_format_parse(NULL, &f), APS_EINVAL);
}

/*
 * The OCP MX v1.0 element formats, from the specification's own tables
 * (section 5.3.3: FP6 and FP4 encodings), written out here by hand rather
 * than derived from the code under test.
 */
static void test_format_mx_elements_match_the_ocp_tables(void **state)
{
	/* FP4 E2M1: codes 0..7 (the sign bit is code 8). */
	static const float fp4[8] = { 0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f };
	/* FP6 E2M3: exponent bias 1, subnormals 0.125 apart, max 7.5. */
	static const float e2m3[32] = { 0, 0.125, 0.25, 0.375, 0.5, 0.625, 0.75, 0.875,
		                        1, 1.125, 1.25, 1.375, 1.5, 1.625, 1.75, 1.875,
		                        2, 2.25,  2.5,  2.75,  3,   3.25,  3.5,  3.75,
		                        4, 4.5,   5,    5.5,   6,   6.5,   7,    7.5 };
	/* FP6 E3M2: exponent bias 3, subnormals 0.0625 apart, max 28. */
	static const float e3m2[32] = { 0,   0.0625, 0.125, 0.1875, 0.25, 0.3125, 0.375, 0.4375,
		                        0.5, 0.625,  0.75,  0.875,  1,    1.25,   1.5,   1.75,
		                        2,   2.5,    3,     3.5,    4,    5,      6,     7,
		                        8,   10,     12,    14,     16,   20,     24,    28 };
	static const struct {
		const char *name;
		const float *table;
		unsigned bits;
		float max, min_normal, min_subnormal;
	} mx[] = {
		{ "fp4", fp4, 4, 6.0f, 1.0f, 0.5f },
		{ "fp6e2m3", e2m3, 6, 7.5f, 1.0f, 0.125f },
		{ "fp6e3m2", e3m2, 6, 28.0f, 0.25f, 0.0625f },
	};
	struct aps_format f;

	(void)state;
	for (size_t i = 0; i < sizeof(mx) / sizeof(mx[0]); i++) {
		unsigned half = 1u << (mx[i].bits - 1);
		assert_int_equal(aps_format_parse(mx[i].name, &f), 0);
		assert_string_equal(f.name, mx[i].name);
		assert_int_equal(f.layout, APS_LAYOUT_MX);
		assert_int_equal(f.bits, mx[i].bits);
		assert_true(f.max_finite == mx[i].max);
		assert_true(f.min_normal == mx[i].min_normal);
		assert_true(f.min_subnormal == mx[i].min_subnormal);
		for (uint32_t c = 0; c < 2 * half; c++) {
			double want = c < half ? mx[i].table[c] : -mx[i].table[c - half];
			double got = aps_format_decode(&f, c);
			if (got != want || signbit(got) != (c >= half))
				fail_msg("%s code %#x: %g, the OCP table says %g", f.name, c, got,
				         want);
			assert_false(aps_format_code_is_nonfinite(&f, c)); /* no inf, no NaN */
		}
	}
	/* The generic spelling names the same format; e2m1 stays IEEE-style. */
	assert_int_equal(aps_format_parse("e2m1mx", &f), 0);
	assert_string_equal(f.name, "fp4");
	assert_int_equal(aps_format_parse("e3m3mx", &f), 0);
	assert_true(f.max_finite == 30.0f); /* 1.875 x 2^4 */
	assert_int_equal(aps_format_parse("e2m1", &f), 0);
	assert_true(f.max_finite == 3.0f);
}

static void test_format_packed_size(void **state)
{
	struct aps_format f;

	(void)state;
	aps_format_parse("e3m0", &f);
	assert_int_equal(aps_format_packed_size(&f, 7), 4);
	aps_format_parse("e2m0", &f);
	assert_int_equal(aps_format_packed_size(&f, 3), 2);
	aps_format_parse("fp16", &f);
	assert_int_equal(aps_format_packed_size(&f, 3), 6);
}

static void test_pack_roundtrips_every_width(void **state)
{
	enum {
		N = 1003
	};
	static uint32_t codes[N], back[N];
	static uint8_t packed[4 * N + 8];
	uint64_t s = 88172645463325252ULL;

	(void)state;
	for (unsigned bits = 3; bits <= 16; bits++) {
		for (size_t n = 1; n <= N; n += (n < 40 ? 1 : 97)) {
			for (size_t i = 0; i < n; i++) {
				s ^= s << 13, s ^= s >> 7, s ^= s << 17;
				codes[i] = (uint32_t)s & ((1u << bits) - 1);
			}
			memset(packed, 0xee, sizeof(packed));
			aps_pack_codes(codes, n, bits, packed);
			/* nothing past the packed size is touched */
			assert_int_equal(packed[aps_pack_size(n, bits)], 0xee);
			aps_unpack_codes(packed, n, bits, back);
			assert_memory_equal(codes, back, n * sizeof(uint32_t));
		}
	}
}

/* Code i sits at bits [i*w, (i+1)*w) of a little-endian stream. */
static void test_pack_layout_is_little_endian(void **state)
{
	const uint32_t codes[3] = { 0x5, 0x3, 0x7 };
	uint8_t out[2];

	(void)state;
	aps_pack_codes(codes, 3, 3, out);
	/* 101 | 011 << 3 | 111 << 6 = 0b111011101 */
	assert_int_equal(out[0], 0xdd);
	assert_int_equal(out[1], 0x01);
}

static void test_err_table(void **state)
{
	(void)state;
	assert_string_equal(aps_strerror(APS_ETIMEDOUT), "timed out");
	assert_string_equal(aps_err_name(APS_EFORMAT), "APS_EFORMAT");
	assert_string_equal(aps_strerror(12345), "unknown error");
	assert_null(aps_err_name(-9999));
	assert_int_equal(APS_EINVAL, -1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_format_parses_named_and_generic),
		cmocka_unit_test(test_format_rejects_bad_names),
		cmocka_unit_test(test_format_mx_elements_match_the_ocp_tables),
		cmocka_unit_test(test_format_packed_size),
		cmocka_unit_test(test_pack_roundtrips_every_width),
		cmocka_unit_test(test_pack_layout_is_little_endian),
		cmocka_unit_test(test_err_table),
	};
	return cmocka_run_group_tests_name("format", tests, NULL, NULL);
}
