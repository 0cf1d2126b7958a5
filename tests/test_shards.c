/*
 * The shard map of a client with several daemons (worker/shards.c):
 * partitions, byte balance, determinism, and the endpoint list.
 */
#include "common/err.h"
#include "worker/shards.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void test_shards_init_rounds_partitions_to_8_elements(void **state)
{
	struct aps_shard_map m;

	(void)state;
	assert_int_equal(aps_shards_init(&m, 4, 0), 0);
	assert_int_equal(m.part_elems, APS_SHARDS_DEFAULT_BYTES / 4);
	assert_int_equal(aps_shards_init(&m, 2, 100), 0);
	assert_int_equal(m.part_elems, 24);
	assert_int_equal(aps_shards_init(&m, 2, 4), 0);
	assert_int_equal(m.part_elems, 8);
	assert_int_equal(aps_shards_init(&m, 0, 0), APS_EINVAL);
	assert_int_equal(aps_shards_init(&m, APS_SHARDS_MAX + 1, 0), APS_EINVAL);
}

static void test_shards_cut_large_tensors_into_whole_partitions(void **state)
{
	struct aps_shard_part p[8];
	struct aps_shard_map m;

	(void)state;
	aps_shards_init(&m, 3, 8192 * 4);
	assert_int_equal(aps_shards_n_parts(&m, 1), 1);
	assert_int_equal(aps_shards_n_parts(&m, 8192), 1);
	assert_int_equal(aps_shards_n_parts(&m, 8193), 2);
	aps_shards_assign(&m, 20000, 8, p);
	assert_int_equal(p[0].offset, 0);
	assert_int_equal(p[0].count, 8192);
	assert_int_equal(p[1].offset, 8192);
	assert_int_equal(p[2].offset, 16384);
	assert_int_equal(p[2].count, 20000 - 16384);
	/* three equal shards: one partition each, in order */
	assert_int_equal(p[0].shard, 0);
	assert_int_equal(p[1].shard, 1);
	assert_int_equal(p[2].shard, 2);
	assert_int_equal(m.load[0], 8192);
	assert_int_equal(m.load[2], 20000 - 16384);
}

static void test_shards_go_to_the_least_loaded_shard(void **state)
{
	struct aps_shard_part p[4];
	struct aps_shard_map m;

	(void)state;
	aps_shards_init(&m, 2, 1 << 20);
	aps_shards_assign(&m, 1000, 32, p); /* 4000 bytes on 0 */
	assert_int_equal(p[0].shard, 0);
	aps_shards_assign(&m, 100, 32, p); /* 400 on 1 */
	assert_int_equal(p[0].shard, 1);
	aps_shards_assign(&m, 100, 32, p); /* 1 is still lighter */
	assert_int_equal(p[0].shard, 1);
	aps_shards_assign(&m, 7, 4, p); /* bytes of 4-bit codes round up: 4 */
	assert_int_equal(p[0].shard, 1);
	assert_int_equal(m.load[1], 804);
}

/* ResNet-50-like sizes: balanced within one partition, the same on every "rank". */
static void test_shards_balance_bytes_and_are_deterministic(void **state)
{
	static const uint64_t sizes[] = { 9408,    64,     64,     4096,   36864,   16384,
		                          16384,   147456, 32768,  589824, 2359296, 1048576,
		                          2048000, 1000,   524288, 131072, 3 };
	struct aps_shard_map a, b;
	struct aps_shard_part pa[16], pb[16];
	uint64_t lo = UINT64_MAX, hi = 0;

	(void)state;
	aps_shards_init(&a, 4, 1 << 20);
	aps_shards_init(&b, 4, 1 << 20);
	for (int rep = 0; rep < 8; rep++) {
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
			uint32_t n = aps_shards_n_parts(&a, sizes[i]);
			aps_shards_assign(&a, sizes[i], 8, pa);
			aps_shards_assign(&b, sizes[i], 8, pb);
			for (uint32_t j = 0; j < n; j++) {
				assert_int_equal(pa[j].shard, pb[j].shard);
				assert_int_equal(pa[j].offset, pb[j].offset);
				assert_int_equal(pa[j].count, pb[j].count);
			}
		}
	}
	for (int s = 0; s < 4; s++) {
		lo = a.load[s] < lo ? a.load[s] : lo;
		hi = a.load[s] > hi ? a.load[s] : hi;
	}
	assert_true(hi - lo <= a.part_elems); /* at most one partition of 8-bit codes */
}

static void test_shards_parse_endpoint_lists(void **state)
{
	char eps[4][APS_SHARDS_ENDPOINT_MAX], longer[300];
	uint32_t n;

	(void)state;
	assert_int_equal(aps_shards_parse("tcp://a:1", eps, 4, &n), 0);
	assert_int_equal(n, 1);
	assert_string_equal(eps[0], "tcp://a:1");
	assert_int_equal(aps_shards_parse("tcp://a:1, tcp://b:2 ,ipc:///x", eps, 4, &n), 0);
	assert_int_equal(n, 3);
	assert_string_equal(eps[1], "tcp://b:2");
	assert_string_equal(eps[2], "ipc:///x");
	assert_int_equal(aps_shards_parse("tcp://a:1,", eps, 4, &n), APS_EINVAL);
	assert_int_equal(aps_shards_parse(",tcp://a:1", eps, 4, &n), APS_EINVAL);
	assert_int_equal(aps_shards_parse("a, ,b", eps, 4, &n), APS_EINVAL);
	assert_int_equal(aps_shards_parse("a,b,c,d,e", eps, 4, &n), APS_EINVAL);
	memset(longer, 'x', sizeof(longer) - 1);
	longer[sizeof(longer) - 1] = '\0';
	assert_int_equal(aps_shards_parse(longer, eps, 4, &n), APS_EINVAL);
	assert_int_equal(aps_shards_parse(NULL, eps, 4, &n), APS_EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_shards_init_rounds_partitions_to_8_elements),
		cmocka_unit_test(test_shards_cut_large_tensors_into_whole_partitions),
		cmocka_unit_test(test_shards_go_to_the_least_loaded_shard),
		cmocka_unit_test(test_shards_balance_bytes_and_are_deterministic),
		cmocka_unit_test(test_shards_parse_endpoint_lists),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
