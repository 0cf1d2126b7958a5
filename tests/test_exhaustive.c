/*
 * The long test (make test-long): every fp32 bit pattern through each 8-bit
 * named format and e3m0, every vector path against the scalar reference, at
 * a few scale exponents. Codes and counts must be identical.
 */
#include "common/codec.h"
#include "common/format.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define CHUNK (1u << 20)

static void run_format(const char *name, int k)
{
	static float x[CHUNK];
	static uint8_t want[CHUNK], got[CHUNK];
	struct aps_quant_opts o = { .scale_exp = k };
	struct aps_codec_stats sw, sg;
	struct aps_format f;
	int isas_checked = 0;

	assert_int_equal(aps_format_parse(name, &f), 0);
	for (uint64_t base = 0; base < (UINT64_C(1) << 32); base += CHUNK) {
		for (uint32_t i = 0; i < CHUNK; i++) {
			uint32_t bits = (uint32_t)base + i;
			memcpy(&x[i], &bits, sizeof(bits));
		}
		aps_codec_set_isa(APS_ISA_SCALAR);
		aps_codec_quantize(&f, x, CHUNK, &o, want, sizeof(want), &sw);
		isas_checked = 0;
		for (int isa = APS_ISA_AVX2; isa <= APS_ISA_AVX512; isa++) {
			if (aps_codec_set_isa((enum aps_codec_isa)isa) < 0)
				continue;
			isas_checked++;
			aps_codec_quantize(&f, x, CHUNK, &o, got, sizeof(got), &sg);
			if (memcmp(want, got, aps_format_packed_size(&f, CHUNK)) != 0 ||
			    sw.overflow != sg.overflow || sw.flushed != sg.flushed ||
			    sw.nonfinite != sg.nonfinite)
				fail_msg("%s %s k=%d: differs in patterns %#llx..+%#x", name,
				         aps_codec_isa_name((enum aps_codec_isa)isa), k,
				         (unsigned long long)base, CHUNK);
		}
	}
	aps_codec_set_isa(APS_ISA_AUTO);
	printf("# %s k=%d: 2^32 patterns, %d vector paths match scalar\n", name, k, isas_checked);
}

static void test_exhaustive_e5m2(void **state)
{
	(void)state;
	run_format("e5m2", 0);
	run_format("e5m2", 17);
}

static void test_exhaustive_e4m3(void **state)
{
	(void)state;
	run_format("e4m3", 0);
	run_format("e4m3", -9);
}

static void test_exhaustive_e4m3fn(void **state)
{
	(void)state;
	run_format("e4m3fn", 0);
}

static void test_exhaustive_e3m0(void **state)
{
	(void)state;
	run_format("e3m0", 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_exhaustive_e5m2),
		cmocka_unit_test(test_exhaustive_e4m3),
		cmocka_unit_test(test_exhaustive_e4m3fn),
		cmocka_unit_test(test_exhaustive_e3m0),
	};
	return cmocka_run_group_tests_name("exhaustive", tests, NULL, NULL);
}
