/*
 * Unit tests of the results kept for ranks that reconnect (server/replay.h):
 * a chunk's result is found at its own step only, a later step replaces it,
 * and the payload's reference is held exactly as long as the entry.
 */
#include "common/err.h"
#include "common/sbuf.h"
#include "server/replay.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static unsigned refs(const struct aps_sbuf *b)
{
	return atomic_load(&b->refs);
}

static void test_replay_finds_a_chunk_at_its_step_only(void **state)
{
	struct aps_replay r = { 0 };
	struct aps_sbuf *p = aps_sbuf_new(16);
	const uint8_t hdr[] = { 1, 2, 3 };

	(void)state;
	assert_null(aps_replay_find(&r, 0, 0)); /* nothing kept yet */
	assert_int_equal(aps_replay_keep(&r, 4, 2, 7, hdr, sizeof(hdr), p), 0);
	const struct aps_replay_entry *e = aps_replay_find(&r, 2, 7);
	assert_non_null(e);
	assert_int_equal(e->hdr_len, 3);
	assert_memory_equal(e->hdr, hdr, 3);
	assert_ptr_equal(e->payload, p);
	assert_null(aps_replay_find(&r, 2, 6));
	assert_null(aps_replay_find(&r, 2, 8));
	assert_null(aps_replay_find(&r, 1, 7)); /* another chunk */
	assert_null(aps_replay_find(&r, 4, 7)); /* beyond the table */
	assert_int_equal(aps_replay_keep(&r, 4, 4, 7, hdr, sizeof(hdr), p), APS_EINVAL);
	aps_replay_fini(&r);
	aps_sbuf_unref(p);
}

static void test_replay_holds_the_payload_until_replaced(void **state)
{
	struct aps_replay r = { 0 };
	struct aps_sbuf *a = aps_sbuf_new(8), *b = aps_sbuf_new(8);
	const uint8_t hdr[] = { 9 };

	(void)state;
	assert_int_equal(aps_replay_keep(&r, 1, 0, 3, hdr, 1, a), 0);
	assert_int_equal(refs(a), 2);
	assert_int_equal(aps_replay_keep(&r, 1, 0, 4, hdr, 1, b), 0);
	assert_int_equal(refs(a), 1); /* the step before is let go */
	assert_int_equal(refs(b), 2);
	assert_null(aps_replay_find(&r, 0, 3));
	assert_non_null(aps_replay_find(&r, 0, 4));
	aps_replay_fini(&r);
	assert_int_equal(refs(b), 1);
	assert_null(aps_replay_find(&r, 0, 4));
	aps_replay_fini(&r); /* twice is harmless */
	aps_sbuf_unref(a);
	aps_sbuf_unref(b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_replay_finds_a_chunk_at_its_step_only),
		cmocka_unit_test(test_replay_holds_the_payload_until_replaced),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
