/*
 * Unit tests of CRC32C (common/crc32c.h): known vectors on every path,
 * chaining, and the SSE4.2 and portable paths against each other.
 */
#include "common/crc32c.h"
#include "common/rng.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

typedef uint32_t (*crc_fn)(uint32_t crc, const void *buf, size_t len);

static void check_vectors(crc_fn crc)
{
	uint8_t buf[32];

	assert_int_equal(crc(0, "123456789", 9), 0xE3069283u);
	assert_int_equal(crc(0, NULL, 0), 0);
	assert_int_equal(crc(0, "a", 1), 0xC1D04330u);
	/* RFC 3720 (iSCSI), appendix B.4. */
	memset(buf, 0, sizeof(buf));
	assert_int_equal(crc(0, buf, sizeof(buf)), 0x8A9136AAu);
	memset(buf, 0xff, sizeof(buf));
	assert_int_equal(crc(0, buf, sizeof(buf)), 0x62A8AB43u);
	for (int i = 0; i < 32; i++)
		buf[i] = (uint8_t)i;
	assert_int_equal(crc(0, buf, sizeof(buf)), 0x46DD794Eu);
	for (int i = 0; i < 32; i++)
		buf[i] = (uint8_t)(31 - i);
	assert_int_equal(crc(0, buf, sizeof(buf)), 0x113FDB5Cu);
}

static void test_crc32c_known_vectors(void **state)
{
	(void)state;
	check_vectors(aps_crc32c);
	check_vectors(aps_crc32c_portable);
	if (aps_crc32c_has_sse42())
		check_vectors(aps_crc32c_sse42);
	else
		print_message("# SSE4.2 not available: instruction path skipped\n");
}

static void test_crc32c_chains_across_splits(void **state)
{
	static const char text[] = "The quick brown fox jumps over the lazy dog, twice over.";
	size_t n = sizeof(text) - 1;
	uint32_t whole = aps_crc32c(0, text, n);

	(void)state;
	for (size_t split = 0; split <= n; split++) {
		assert_int_equal(aps_crc32c(aps_crc32c(0, text, split), text + split, n - split),
		                 whole);
		assert_int_equal(aps_crc32c_portable(aps_crc32c_portable(0, text, split),
		                                     text + split, n - split),
		                 whole);
	}
}

static void test_crc32c_paths_agree_on_random_buffers(void **state)
{
	enum {
		MAX = 5000
	};
	static uint8_t buf[MAX + 8];

	(void)state;
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)aps_rng_bits(1, 2, i);
	for (uint64_t t = 0; t < 2000; t++) {
		size_t len = (size_t)(aps_rng_bits(3, 4, t) % MAX) | 1; /* odd lengths */
		size_t off = (size_t)(aps_rng_bits(5, 6, t) % 8);       /* any alignment */
		uint32_t seed = (uint32_t)aps_rng_bits(7, 8, t);
		uint32_t ref = aps_crc32c_portable(seed, buf + off, len);

		assert_int_equal(aps_crc32c(seed, buf + off, len), ref);
		if (aps_crc32c_has_sse42())
			assert_int_equal(aps_crc32c_sse42(seed, buf + off, len), ref);
	}
}

/* The SSE4.2 path joins three chains over stripes of 4096 bytes: lengths around
 * whole blocks of 3 x 4096 and across several of them, at any alignment. */
static void test_crc32c_three_chains_agree_with_the_table_path(void **state)
{
	enum {
		MAX = 5 * 3 * 4096 + 64
	};
	static uint8_t buf[MAX + 8];
	static const size_t around[] = { 3 * 4096, 6 * 4096, 4 * 3 * 4096 };

	(void)state;
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)aps_rng_bits(9, 10, i);
	for (size_t a = 0; a < sizeof(around) / sizeof(around[0]); a++)
		for (size_t len = around[a] - 9; len <= around[a] + 9; len++)
			assert_int_equal(aps_crc32c(7, buf + (len & 7), len),
			                 aps_crc32c_portable(7, buf + (len & 7), len));
	for (uint64_t t = 0; t < 200; t++) {
		size_t len = (size_t)(aps_rng_bits(11, 12, t) % MAX);
		size_t off = (size_t)(aps_rng_bits(13, 14, t) % 8);
		uint32_t seed = (uint32_t)aps_rng_bits(15, 16, t);

		assert_int_equal(aps_crc32c(seed, buf + off, len),
		                 aps_crc32c_portable(seed, buf + off, len));
	}
}

/* The lane test made in the CRC's pass: bytes at or past 0x7c (high bit dropped). */
static void test_crc32c_lanes_flag_exactly_the_words_that_pass(void **state)
{
	const struct aps_crc32c_lanes bytes = { 0x7f7f7f7f7f7f7f7full, 0x0404040404040404ull,
		                                0x8080808080808080ull };
	static uint8_t buf[3 * 3 * 4096 + 13];
	uint64_t flag;

	(void)state;
	for (size_t i = 0; i < sizeof(buf); i++)
		buf[i] = (uint8_t)(aps_rng_bits(17, 18, i) % 0x7c) | (i & 1 ? 0x80 : 0);
	assert_int_equal(aps_crc32c_lanes(3, buf, sizeof(buf), &bytes, &flag),
	                 aps_crc32c_portable(3, buf, sizeof(buf)));
	assert_true(flag == 0);
	/* one byte anywhere: in a stripe, in the single chain after them, in the tail */
	for (size_t at = 0; at < sizeof(buf); at += 1237) {
		uint8_t keep = buf[at];

		buf[at] = 0xfc;
		assert_int_equal(aps_crc32c_lanes(3, buf, sizeof(buf), &bytes, &flag),
		                 aps_crc32c_portable(3, buf, sizeof(buf)));
		assert_true(flag != 0);
		buf[at] = keep;
	}
	buf[sizeof(buf) - 1] = 0x7c;
	aps_crc32c_lanes(0, buf, sizeof(buf), &bytes, &flag);
	assert_true(flag != 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crc32c_known_vectors),
		cmocka_unit_test(test_crc32c_chains_across_splits),
		cmocka_unit_test(test_crc32c_paths_agree_on_random_buffers),
		cmocka_unit_test(test_crc32c_three_chains_agree_with_the_table_path),
		cmocka_unit_test(test_crc32c_lanes_flag_exactly_the_words_that_pass),
	};

	return cmocka_run_group_tests_name("crc32c", tests, NULL, NULL);
}
