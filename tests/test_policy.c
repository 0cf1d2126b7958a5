/*
 * Unit tests of the precision policy (server/policy.h): rules, the
 * small-tensor rule, schedules and the hysteresis of the automatic ladder.
 */
#include "common/err.h"
#include "server/policy.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static struct aps_format fmt(const char *name)
{
	struct aps_format f;

	assert_int_equal(aps_format_parse(name, &f), 0);
	return f;
}

static void test_policy_rules_pin_by_name(void **state)
{
	struct aps_policy_config cfg;
	struct aps_tensor_policy p;
	struct aps_format e3m0 = fmt("e3m0");
	char why[128];

	(void)state;
	aps_policy_defaults(&cfg);
	snprintf(cfg.rules, sizeof(cfg.rules), "*.bias = fp32, fc.* = fp16, *=e5m2");
	assert_int_equal(aps_policy_check_rules(cfg.rules, why, sizeof(why)), 0);
	aps_policy_init(&cfg, "layer1.bias", 100000, &e3m0, &p);
	assert_string_equal(p.current.name, "fp32");
	assert_string_equal(p.reason, "rule");
	aps_policy_init(&cfg, "fc.weight", 100000, &e3m0, &p);
	assert_string_equal(p.current.name, "fp16");
	aps_policy_init(&cfg, "conv1.weight", 100000, &e3m0, &p);
	assert_string_equal(p.current.name, "e5m2"); /* the first match wins */
	/* a pinned tensor never moves, whatever it shows */
	cfg.automatic = true;
	for (uint64_t s = 0; s < 10; s++)
		assert_false(aps_policy_observe(&cfg, &p, s, 0.9, 0.9));
	assert_int_equal(aps_policy_check_rules("*.bias", why, sizeof(why)), APS_ECONFIG);
	assert_int_equal(aps_policy_check_rules("a=e9m9", why, sizeof(why)), APS_EFORMAT);
	assert_non_null(strstr(why, "'e9m9' is not a format"));
	/* an empty rule was skipped: --rules ",,," ran with none, and libaps refuses it */
	assert_int_equal(aps_policy_check_rules(",,,", why, sizeof(why)), APS_ECONFIG);
	assert_non_null(strstr(why, "an empty rule"));
	assert_int_equal(aps_policy_check_rules("a=fp16,,b=fp32", why, sizeof(why)), APS_ECONFIG);
	assert_non_null(strstr(why, "an empty rule"));
	assert_int_equal(aps_policy_check_rules("a=fp16,", why, sizeof(why)), APS_ECONFIG);
	assert_int_equal(aps_policy_check_rules("", why, sizeof(why)), 0); /* no rules */
	assert_int_equal(aps_policy_check_rules("  ", why, sizeof(why)), 0);
}

static void test_policy_small_tensors_travel_in_fp32(void **state)
{
	struct aps_policy_config cfg;
	struct aps_tensor_policy p;
	struct aps_format e4m3 = fmt("e4m3");

	(void)state;
	aps_policy_defaults(&cfg);
	aps_policy_init(&cfg, "bn.weight", 64, &e4m3, &p);
	assert_string_equal(p.current.name, "e4m3"); /* only with the automatic policy */
	cfg.automatic = true;
	aps_policy_init(&cfg, "bn.weight", 64, &e4m3, &p);
	assert_string_equal(p.current.name, "fp32");
	assert_string_equal(p.reason, "small");
	aps_policy_init(&cfg, "conv.weight", 1 << 20, &e4m3, &p);
	assert_string_equal(p.current.name, "e4m3");
}

static void test_policy_schedule_then_requested(void **state)
{
	struct aps_policy_config cfg;
	struct aps_tensor_policy p;
	struct aps_format e4m3 = fmt("e4m3");

	(void)state;
	aps_policy_defaults(&cfg);
	cfg.schedule_steps = 3;
	aps_policy_init(&cfg, "w", 1 << 20, &e4m3, &p);
	assert_string_equal(p.current.name, "fp32");
	assert_string_equal(p.reason, "schedule");
	assert_false(aps_policy_observe(&cfg, &p, 0, 0, 0));
	assert_false(aps_policy_observe(&cfg, &p, 1, 0, 0));
	/* the end of step 2 announces step 3's format */
	assert_true(aps_policy_observe(&cfg, &p, 2, 0, 0));
	assert_string_equal(p.current.name, "e4m3");
	assert_false(aps_policy_observe(&cfg, &p, 3, 0, 0));
}

static void test_policy_ladder_has_hysteresis(void **state)
{
	struct aps_policy_config cfg;
	struct aps_tensor_policy p;
	struct aps_format e3m0 = fmt("e3m0");
	uint64_t s = 0;

	(void)state;
	aps_policy_defaults(&cfg);
	cfg.automatic = true;
	cfg.window_up = 3;
	cfg.window_down = 5;
	cfg.flush_up = 0.01;
	cfg.flush_down = 0.001;
	cfg.error_up = 0.1;
	cfg.error_down = 0.02;
	aps_policy_init(&cfg, "w", 1 << 20, &e3m0, &p);
	/* two bad steps, one good: the streak starts over */
	assert_false(aps_policy_observe(&cfg, &p, s++, 0.5, 0));
	assert_false(aps_policy_observe(&cfg, &p, s++, 0.5, 0));
	assert_false(aps_policy_observe(&cfg, &p, s++, 0.0, 0));
	assert_false(aps_policy_observe(&cfg, &p, s++, 0.5, 0));
	assert_false(aps_policy_observe(&cfg, &p, s++, 0.5, 0));
	assert_true(aps_policy_observe(&cfg, &p, s++, 0.5, 0));
	assert_string_equal(p.current.name, "e4m3");
	assert_string_equal(p.reason, "flushed");
	for (int i = 0; i < 2; i++)
		assert_false(aps_policy_observe(&cfg, &p, s++, 0, 0.5));
	assert_true(aps_policy_observe(&cfg, &p, s++, 0, 0.5));
	assert_string_equal(p.current.name, "fp16");
	assert_string_equal(p.reason, "error");
	/* between the thresholds: neither up nor down, ever */
	for (int i = 0; i < 20; i++)
		assert_false(aps_policy_observe(&cfg, &p, s++, 0.005, 0.05));
	/* calm for window_down steps: one rung down */
	for (int i = 0; i < 4; i++)
		assert_false(aps_policy_observe(&cfg, &p, s++, 0, 0));
	assert_true(aps_policy_observe(&cfg, &p, s++, 0, 0));
	assert_string_equal(p.current.name, "e4m3");
	assert_string_equal(p.reason, "calm");
	for (int i = 0; i < 4; i++)
		assert_false(aps_policy_observe(&cfg, &p, s++, 0, 0));
	assert_true(aps_policy_observe(&cfg, &p, s++, 0, 0));
	assert_string_equal(p.current.name, "e3m0");
	/* never below what the workers asked for */
	for (int i = 0; i < 20; i++)
		assert_false(aps_policy_observe(&cfg, &p, s++, 0, 0));
	assert_int_equal(p.switches, 4);
}

/* A tensor that needs the wider format flaps back up right after moving down:
 * each flap doubles the calm it must show before the next try. */
static void test_policy_flapping_backs_off(void **state)
{
	struct aps_policy_config cfg;
	struct aps_tensor_policy p;
	struct aps_format e4m3 = fmt("e4m3");
	uint64_t s = 1, moves_down = 0;

	(void)state;
	aps_policy_defaults(&cfg);
	cfg.automatic = true;
	cfg.window_up = 1;
	cfg.window_down = 10;
	aps_policy_init(&cfg, "w", 1 << 20, &e4m3, &p);
	for (; s < 1000; s++) {
		bool narrow = strcmp(p.current.name, "e4m3") == 0;
		/* bad in e4m3, perfect in fp16: what the daemon sees for a wide tensor */
		const char *before = p.current.name;
		if (aps_policy_observe(&cfg, &p, s, narrow ? 0.9 : 0.0, 0.0) &&
		    strcmp(before, "fp16") == 0)
			moves_down++;
	}
	/* without the back-off: one move down every 11 steps, about 90 */
	assert_true(moves_down <= 7);
	assert_true(p.down_window >= 640);
}

static void test_policy_tops_out_at_fp32(void **state)
{
	struct aps_policy_config cfg;
	struct aps_tensor_policy p;
	struct aps_format e5m2 = fmt("e5m2");
	uint64_t s = 0;

	(void)state;
	aps_policy_defaults(&cfg);
	cfg.automatic = true;
	cfg.window_up = 1;
	aps_policy_init(&cfg, "w", 1 << 20, &e5m2, &p);
	assert_true(aps_policy_observe(&cfg, &p, s++, 1, 1));
	assert_string_equal(p.current.name, "fp16"); /* off the ladder: the next wider rung */
	assert_true(aps_policy_observe(&cfg, &p, s++, 1, 1));
	assert_string_equal(p.current.name, "fp32");
	assert_false(aps_policy_observe(&cfg, &p, s++, 1, 1));
}

/* fp4 (and the fp6 formats) step up to e4m3 first, and come back down the same way. */
static void test_policy_takes_narrow_formats_up_to_8_bits_first(void **state)
{
	static const char *const narrow[] = { "fp4", "fp6e2m3", "fp6e3m2", "e2m1" };
	struct aps_policy_config cfg;
	struct aps_tensor_policy p;

	(void)state;
	aps_policy_defaults(&cfg);
	cfg.automatic = true;
	cfg.window_up = 1;
	cfg.window_down = 1;
	for (size_t i = 0; i < sizeof(narrow) / sizeof(narrow[0]); i++) {
		struct aps_format base = fmt(narrow[i]);
		uint64_t s = 0;
		aps_policy_init(&cfg, "w", 1 << 20, &base, &p);
		assert_true(aps_policy_observe(&cfg, &p, s++, 1, 1));
		assert_string_equal(p.current.name, "e4m3");
		assert_true(aps_policy_observe(&cfg, &p, s++, 1, 1));
		assert_string_equal(p.current.name, "fp16");
		s += 100; /* past the back-off after a move */
		assert_true(aps_policy_observe(&cfg, &p, s++, 0, 0));
		assert_string_equal(p.current.name, "e4m3");
		s += 100;
		while (!aps_policy_observe(&cfg, &p, s++, 0, 0))
			assert_true(s < 10000);
		assert_string_equal(p.current.name, narrow[i]);
		assert_false(aps_policy_observe(&cfg, &p, s + 100, 0, 0)); /* the floor */
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_policy_rules_pin_by_name),
		cmocka_unit_test(test_policy_small_tensors_travel_in_fp32),
		cmocka_unit_test(test_policy_schedule_then_requested),
		cmocka_unit_test(test_policy_ladder_has_hysteresis),
		cmocka_unit_test(test_policy_flapping_backs_off),
		cmocka_unit_test(test_policy_tops_out_at_fp32),
		cmocka_unit_test(test_policy_takes_narrow_formats_up_to_8_bits_first),
	};
	return cmocka_run_group_tests_name("policy", tests, NULL, NULL);
}
