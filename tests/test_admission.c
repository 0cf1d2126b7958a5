/*
 * Unit tests of which addresses may connect (server/admission.h): the limit
 * of handshakes a minute that lead to no message, those of the last 250 ms not
 * judged, the time away doubling up to an hour and forgiven after a clean
 * hour, addresses kept apart, the table's eviction, the exempt addresses and
 * "ip:port" parsing.
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

/* n handshakes from ip at now, of which spoke delivered a message. */
static void connections(struct aps_admission *a, const char *ip, int n, int spoke, uint64_t now)
{
	for (int i = 0; i < n; i++) {
		aps_admission_handshake(a, ip, now);
		if (i < spoke)
			aps_admission_spoke(a, ip, now);
	}
}

/* The addresses over the limit at now, "a b ", each forgiven. */
static const char *over(struct aps_admission *a, uint64_t now)
{
	static char list[256];
	const char *ip;

	uint32_t n;

	list[0] = '\0';
	for (size_t i = 0; (ip = aps_admission_over(a, &i, &n, now)) != NULL;) {
		snprintf(list + strlen(list), sizeof(list) - strlen(list), "%s ", ip);
		aps_admission_forgive(a, ip, now); /* as the bridge does: its count starts again */
	}
	return list;
}

static void the_limit_is_per_minute_and_per_address(void **state)
{
	struct aps_admission a;
	uint64_t t = 1000;

	(void)state;
	aps_admission_init(&a, 3);
	connections(&a, "10.0.0.1", 100, 96, t); /* 4 never spoke */
	connections(&a, "10.0.0.2", 100, 97, t); /* 3: within the limit */
	/* Handshakes of the last 250-500 ms may still speak: not judged. */
	assert_string_equal(over(&a, t + 499), "");
	assert_string_equal(over(&a, t + 500), "10.0.0.1 ");
	assert_string_equal(over(&a, t + 501), ""); /* its count starts again */
	connections(&a, "10.0.0.3", 4, 0, t + 1500);
	assert_int_equal(aps_admission_unspoken(&a, "10.0.0.3", t + 1999), 0);
	assert_int_equal(aps_admission_unspoken(&a, "10.0.0.3", t + 2000), 4);
	assert_int_equal(aps_admission_turn_away(&a, "10.0.0.3", t + 2000), MIN);
	assert_true(aps_admission_away(&a, "10.0.0.3", t + 2001));
	assert_int_equal(aps_admission_unspoken(&a, "10.0.0.3", t + 2001), 0); /* away */
	aps_admission_forgive(&a, "10.0.0.3", t + 3000); /* its workers joined */
	assert_false(aps_admission_away(&a, "10.0.0.3", t + 3001));
	assert_true(aps_admission_allows(&a, "10.0.0.3", t + 3001));
	/* A minute later the count starts again. */
	connections(&a, "10.0.0.2", 3, 0, t + MIN);
	assert_string_equal(over(&a, t + MIN + 5000), "");
	assert_int_equal(aps_admission_unspoken(&a, "10.0.0.1", t + MIN + 5000), 0);
	assert_int_equal(a.refused, 0);
}

static void a_burst_that_speaks_late_is_not_judged(void **state)
{
	struct aps_admission a;
	uint64_t t = 7000;

	(void)state;
	aps_admission_init(&a, 2);
	/* 64 workers of a node connect at once; they speak 200 ms later */
	connections(&a, "10.0.0.9", 64, 0, t);
	assert_string_equal(over(&a, t + 100), "");
	for (int i = 0; i < 64; i++)
		aps_admission_spoke(&a, "10.0.0.9", t + 200);
	assert_string_equal(over(&a, t + 30000), "");
	/* and speaks across the minute's end: the new window waits for them too */
	connections(&a, "10.0.0.9", 64, 0, t + MIN - 10);
	for (int i = 0; i < 64; i++)
		aps_admission_spoke(&a, "10.0.0.9", t + MIN + 10);
	assert_string_equal(over(&a, t + MIN + 30000), "");
	/* and spoke just before its minute ended: their first messages go on with them */
	for (int i = 0; i < 64; i++) {
		aps_admission_handshake(&a, "10.0.0.9", t + 2 * MIN - 100);
		aps_admission_spoke(&a, "10.0.0.9", t + 2 * MIN - 100);
	}
	assert_string_equal(over(&a, t + 2 * MIN + 50), "");
	assert_string_equal(over(&a, t + 2 * MIN + 600), "");
}

static void the_exempt_addresses(void **state)
{
	(void)state;
	assert_true(aps_admission_exempt("127.0.0.1"));
	assert_true(aps_admission_exempt("::1"));
	assert_true(aps_admission_exempt("localhost:1000:1000:4242")); /* ipc */
	assert_false(aps_admission_exempt("127.0.0.2"));
	assert_false(aps_admission_exempt("10.0.0.1"));
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
	/* An address away is not judged again. */
	connections(&a, "::1", 10, 0, t + 1);
	assert_string_equal(over(&a, t + 5000), "");
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

static void a_full_table_forgets_the_quiet_keeps_those_away_and_the_silent(void **state)
{
	struct aps_admission a;
	char ip[INET6_ADDRSTRLEN];

	(void)state;
	aps_admission_init(&a, 40);
	aps_admission_turn_away(&a, "192.168.0.1", 0);
	connections(&a, "192.168.0.2", 30, 0, 500); /* a stranger's count so far */
	for (int i = 0; i < 3 * APS_ADMISSION_SLOTS; i++) {
		snprintf(ip, sizeof(ip), "10.1.%d.%d", i / 256, i % 256);
		aps_admission_handshake(&a, ip, 1000 + (uint64_t)i);
	}
	assert_false(aps_admission_allows(&a, "192.168.0.1", 2000));
	/* 256 addresses of its own, one silent handshake each, did not wipe it */
	connections(&a, "192.168.0.2", 11, 0, 2000);
	assert_string_equal(over(&a, 3000), "192.168.0.2 ");
}

static void no_limit_turns_nobody_away(void **state)
{
	struct aps_admission a;

	(void)state;
	aps_admission_init(&a, 0);
	connections(&a, "10.0.0.1", 1000, 0, 1);
	assert_string_equal(over(&a, 10000), "");
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
		cmocka_unit_test(a_burst_that_speaks_late_is_not_judged),
		cmocka_unit_test(the_exempt_addresses),
		cmocka_unit_test(time_away_doubles_and_is_forgiven),
		cmocka_unit_test(a_full_table_forgets_the_quiet_keeps_those_away_and_the_silent),
		cmocka_unit_test(no_limit_turns_nobody_away),
		cmocka_unit_test(the_ip_of_an_address),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
