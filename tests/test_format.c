/*
 * Unit tests of format names and fields (common/format.h), packing
 * (common/pack.h) and the error table (common/err.h).
 */
#include "common/err.h"
#include "common/format.h"
#include "common/pack.h"

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
	assert_true(f.fn);
	assert_int_equal(f.bits, 8);
	assert_int_equal(f.emax, 8);
	assert_int_equal(aps_format_parse("e4m3", &f), 0);
	assert_false(f.fn);
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
	static const char *const bad[] = { "",      "e1m3",    "e9m1",   "e4m12", "e04m3",
		                           "e4m3x", "e4m3fnx", "e3m0fn", "e+4m3", "E4M3",
		                           "fp8",   "e4m",     "e8m7fn", "e4m3 " };
	struct aps_format f;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		if (aps_format_parse(bad[i], &f) != APS_EFORMAT)
			fail_msg("'%s' was accepted", bad[i]);
	}
	assert_int_equal(aps_format_parse(NULL, &f), APS_EINVAL);
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
		cmocka_unit_test(test_format_packed_size),
		cmocka_unit_test(test_pack_roundtrips_every_width),
		cmocka_unit_test(test_pack_layout_is_little_endian),
		cmocka_unit_test(test_err_table),
	};
	return cmocka_run_group_tests_name("format", tests, NULL, NULL);
}
