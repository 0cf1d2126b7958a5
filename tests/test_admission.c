/*
 * Unit tests of which addresses may connect (server/admission.h): the limit
 * of silent closes a minute, the time away doubling up to an hour and
 * forgiven after a clean hour, addresses kept apart, the table's eviction,
 * and "ip:port" parsing.
 */
#include "server/admission.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#define MIN 60000ULL

static void the_limit_is_per_minute_and_per_address(void **state)
{
	struct aps_admission a;
	uint64_t t = 1000;

	(void)state;
	aps_admission_init(&a, 3);
	for (int i = 0; i < 3; i++)
		assert_false(aps_admission_silent_close(&a, "10.0.0.1", t));
	assert_false(aps_admission_silent_close(&a, "10.0.0.2", t)); /* another address */
	assert_true(aps_admission_silent_close(&a, "10.0.0.1", t));  /* the fourth */
	/* A minute later the count starts again. */
	for (int i = 0; i < 3; i++)
		assert_false(aps_admission_silent_close(&a, "10.0.0.2", t + MIN));
	assert_true(aps_admission_allows(&a, "10.0.0.1", t));
	assert_int_equal(a.refused, 0);
}

static void time_away_doubles_and_is_forgiven(void **state)
{
	struct aps_admission a;
	uint64_t t = 5000;

	(void)state;
	aps_admission_init(&a, 1);
	assert_int_equal(aps_admission_turn_away(&a, "::1", t), MIN);
	assert_false(aps_admission_allows(&a, "::1", t + MIN - 1));
	assert_true(aps_admission_allows(&a, "::2", t));
	assert_true(aps_admission_allows(&a, "::1", t + MIN));
	assert_int_equal(a.refused, 1);
	/* Closes while away do not count. */
	assert_false(aps_admission_silent_close(&a, "::1", t + 1));
	assert_false(aps_admission_silent_close(&a, "::1", t + 2));
	t += MIN;
	assert_int_equal(aps_admission_turn_away(&a, "::1", t), 2 * MIN);
	t += 2 * MIN;
	for (uint64_t want = 4 * MIN; want <= 64 * MIN; want *= 2) {
		uint64_t away = aps_admission_turn_away(&a, "::1", t);
		assert_int_equal(away, want < 60 * MIN ? want : 60 * MIN);
		t += away;
	}
	assert_int_equal(aps_admission_turn_away(&a, "::1", t), 60 * MIN); /* at most an hour */
	t += 60 * MIN;
	/* An hour and more with no strike: the first time again. */
	assert_int_equal(aps_admission_turn_away(&a, "::1", t + 61 * MIN), MIN);
	assert_int_equal(a.quarantined, 9);
}

static void a_full_table_forgets_the_idle_keeps_those_away(void **state)
{
	struct aps_admission a;
	char ip[INET6_ADDRSTRLEN];

	(void)state;
	aps_admission_init(&a, 1);
	aps_admission_turn_away(&a, "192.168.0.1", 0);
	for (int i = 0; i < 3 * APS_ADMISSION_SLOTS; i++) {
		snprintf(ip, sizeof(ip), "10.1.%d.%d", i / 256, i % 256);
		aps_admission_silent_close(&a, ip, 1000 + (uint64_t)i);
	}
	assert_false(aps_admission_allows(&a, "192.168.0.1", 2000));
}

static void no_limit_turns_nobody_away(void **state)
{
	struct aps_admission a;

	(void)state;
	aps_admission_init(&a, 0);
	for (int i = 0; i < 1000; i++)
		assert_false(aps_admission_silent_close(&a, "10.0.0.1", 1));
	assert_true(aps_admission_allows(&a, "10.0.0.1", 1));
}

static void the_ip_of_an_address(void **state)
{
	char ip[INET6_ADDRSTRLEN];

	(void)state;
	assert_true(aps_admission_ip_of("127.0.0.1:5555", ip));
	assert_string_equal(ip, "127.0.0.1");
	assert_true(aps_admission_ip_of("fe80::1:40000", ip));
	assert_string_equal(ip, "fe80::1");
	assert_false(aps_admission_ip_of("local", ip));
	assert_false(aps_admission_ip_of("unknown", ip));
	assert_false(aps_admission_ip_of(":1", ip));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(the_limit_is_per_minute_and_per_address),
		cmocka_unit_test(time_away_doubles_and_is_forgiven),
		cmocka_unit_test(a_full_table_forgets_the_idle_keeps_those_away),
		cmocka_unit_test(no_limit_turns_nobody_away),
		cmocka_unit_test(the_ip_of_an_address),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
