/*
 * Unit tests of the public codec ABI (worker/aps.h) as a user links it:
 * against libaps.so, through exported symbols only.
 */
#include "aps.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void test_api_roundtrip_with_exponent(void **state)
{
	float x[100], y[100];
	uint8_t codes[100];
	struct aps_quantize_stats st;
	struct aps_quantize_opts o = { 0 };
	int32_t k;

	(void)state;
	for (int i = 0; i < 100; i++)
		x[i] = (float)(i - 50) * 1e-6f;
	assert_int_equal(aps_exponent("e4m3", x, 100, 1, APS_SCALING_MODE_LOCAL, &k), 0);
	o.scale_exp = k;
	assert_int_equal(aps_quantize("e4m3", x, 100, &o, codes, sizeof(codes), &st), 0);
	assert_int_equal(st.overflow, 0);
	assert_int_equal(st.flushed, 0);
	assert_true(st.maxabs == 50e-6f);
	assert_int_equal(aps_dequantize("e4m3", codes, sizeof(codes), 100, k, y), 0);
	for (int i = 0; i < 100; i++)
		assert_true(fabsf(y[i] - x[i]) <= fabsf(x[i]) / 16);
	memcpy(x, y, sizeof(x));
	assert_int_equal(aps_accumulate("e4m3", codes, sizeof(codes), 100, k, y), 0);
	for (int i = 0; i < 100; i++)
		assert_true(y[i] == 2 * x[i]);
}

static void test_api_errors_carry_a_message(void **state)
{
	float x[4] = { 0 };
	uint8_t codes[4];
	struct aps_format_info info;

	(void)state;
	assert_int_equal(aps_format_info("e9m9", &info), APS_EFORMAT);
	assert_non_null(strstr(aps_last_error(), "'e9m9' is not a format"));
	assert_int_equal(aps_quantize("e4m3", x, 4, NULL, codes, 3, NULL), APS_ESHORT);
	assert_non_null(strstr(aps_last_error(), "need 4 bytes"));
	assert_int_equal(aps_quantize("e4m3", x, 4, NULL, codes, 4, NULL), 0);
	assert_string_equal(aps_last_error(), "");
	assert_int_equal(aps_dequantize("e4m3", codes, 4, 4, 999, x), APS_ERANGE);
	assert_int_equal(aps_quantize("e4m3", NULL, 4, NULL, codes, 4, NULL), APS_EINVAL);
	assert_int_equal(aps_exponent("e4m3", x, 4, 0, APS_SCALING_MODE_GLOBAL, &(int32_t){ 0 }),
	                 APS_EINVAL);
	assert_int_equal(aps_packed_size("e3m0", 3), 2);
	assert_string_equal(aps_strerror(APS_ESHORT), "buffer too short");
}

/* Options checked before anything connects (no daemon needed). */
static void test_api_client_options_are_checked_first(void **state)
{
	struct aps_client_opts o;
	aps_client *c = NULL;
	char long_token[130];

	(void)state;
	aps_client_opts_init(&o);
	o.endpoint = "tcp://127.0.0.1:1";
	o.job_token = "two words";
	assert_int_equal(aps_client_new(&c, &o), APS_EINVAL);
	assert_non_null(strstr(aps_last_error(), "job_token must be 1 to 128 visible ASCII"));
	memset(long_token, 'x', 129);
	long_token[129] = '\0';
	o.job_token = long_token;
	assert_int_equal(aps_client_new(&c, &o), APS_EINVAL);
	assert_null(c);
	assert_string_equal(aps_err_name(APS_EACCES), "APS_EACCES");
	assert_string_equal(aps_strerror(APS_EACCES), "not allowed");
}

/* Codes calls check their client and buffers first: a NULL one is an error, never a crash. */
static void test_api_codes_calls_check_their_arguments(void **state)
{
	struct aps_codes_layout send;
	struct aps_codes_call call = { 0 };
	aps_request *req = NULL;

	(void)state;
	assert_int_equal(aps_client_codes_layout(NULL, 0, &send, NULL), APS_EINVAL);
	assert_int_equal(aps_client_allreduce_codes_start(NULL, 0, &call, 0, &req), APS_EINVAL);
	assert_int_equal(aps_client_step_codes_start(NULL, 0, &call, 0.1f, 0, &req), APS_EINVAL);
	assert_int_equal(aps_client_step_codes_start(NULL, 0, &call, -1.0f, 0, &req), APS_EINVAL);
	assert_non_null(strstr(aps_last_error(), "learning rate"));
	assert_null(req);
}

/* Codec calls that take no error code still say what was wrong with their arguments. */
static void test_api_codec_helpers_refuse_bad_arguments(void **state)
{
	uint8_t codes[64] = { 0 };
	int8_t exps[2] = { 0, -128 };
	float out[64];
	int32_t k = 0;

	(void)state;
	assert_true(isnan(aps_maxabs(NULL, 4)));
	assert_non_null(strstr(aps_last_error(), "NULL"));
	assert_true(aps_maxabs(NULL, 0) == 0.0f);
	assert_int_equal(aps_block_count(10, 0), 0);
	assert_non_null(strstr(aps_last_error(), "block size 0"));
	assert_int_equal(aps_block_count(10, 17), 0);
	assert_int_equal(aps_block_count(UINT64_MAX, 32), UINT64_MAX / 32 + 1);
	assert_string_equal(aps_last_error(), "");
	assert_int_equal(aps_block_count(65, 32), 3);
	/* -128 is no exponent block scaling gives: 2^128 is past fp32. */
	assert_int_equal(aps_dequantize_blocks("e4m3", codes, 64, exps, 2, 64, 32, out),
	                 APS_ERANGE);
	assert_non_null(strstr(aps_last_error(), "-128"));
	assert_int_equal(aps_accumulate_blocks("e4m3", codes, 64, exps, 2, 64, 32, out),
	                 APS_ERANGE);
	assert_int_equal(aps_dequantize_blocks("e4m3", codes, 64, exps, 2, 32, 32, out), 0);
	/* aps_exponent checks every argument before it reads x. */
	assert_int_equal(aps_exponent("e4m3", (const float *)codes, 4, 1, 7, &k), APS_EINVAL);
	assert_non_null(strstr(aps_last_error(), "scaling mode 7"));
	assert_int_equal(
	        aps_exponent("e4m3", (const float *)codes, 4, 1, APS_SCALING_MODE_BLOCK, &k),
	        APS_EINVAL);
	assert_non_null(strstr(aps_last_error(), "aps_quantize_blocks"));
	assert_int_equal(aps_exponent("e4m3", (const float *)codes, UINT64_MAX, 1,
	                              APS_SCALING_MODE_NONE, &k),
	                 APS_ERANGE);
	assert_int_equal(aps_exponent(NULL, (const float *)codes, 4, 1, 1, &k), APS_EINVAL);
	assert_int_equal(aps_exponent("e4m3", (const float *)codes, 4, 1, 1, NULL), APS_EINVAL);
}

/* aps_curve_keypair's failures carry a message like every other call's. */
static void test_api_curve_keypair_says_why_it_failed(void **state)
{
	char key[41];

	(void)state;
	assert_int_equal(aps_packed_size("e4m3", 1), 1); /* clears the last message */
	assert_int_equal(aps_curve_keypair(NULL, key), APS_EINVAL);
	assert_non_null(strstr(aps_last_error(), "key buffer is NULL"));
	assert_int_equal(aps_packed_size("e4m3", 1), 1);
	assert_int_equal(aps_curve_keypair(key, NULL), APS_EINVAL);
	assert_non_null(strstr(aps_last_error(), "key buffer is NULL"));
}

/* Filling NULL options is a no-op, not a crash. */
static void test_api_opts_init_of_null_is_a_no_op(void **state)
{
	(void)state;
	aps_client_opts_init(NULL);
}

/* One option of o changed by set is refused with code, before anything connects: the
 * endpoint is a closed port, so a check that was not made would be APS_ECONN. */
#define REFUSED(code, text, set)                                 \
	do {                                                     \
		struct aps_client_opts o;                        \
		aps_client *c = NULL;                            \
		aps_client_opts_init(&o);                        \
		o.endpoint = "tcp://127.0.0.1:1";                \
		o.connect_timeout_ms = 100;                      \
		set;                                             \
		assert_int_equal(aps_client_new(&c, &o), code);  \
		assert_non_null(strstr(aps_last_error(), text)); \
		assert_null(c);                                  \
	} while (0)

#define KEY40 "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7"

/* Options the daemon would refuse, or that would mean something else than they say. */
static void test_api_client_options_within_the_daemons_limits(void **state)
{
	(void)state;
	REFUSED(APS_EINVAL, "visible ASCII", o.job = "caf\xc3\xa9");
	REFUSED(APS_EINVAL, "visible ASCII", o.job = "two words");
	REFUSED(APS_EINVAL, "world of 65537", o.world_size = 65537);
	REFUSED(APS_EINVAL, "port 99999", o.endpoint = "tcp://127.0.0.1:99999");
	REFUSED(APS_EINVAL, "port 0", o.endpoint = "tcp://127.0.0.1:0");
	REFUSED(APS_EINVAL, "tcp://HOST:PORT", o.endpoint = "tcp://127.0.0.1");
	REFUSED(APS_EINVAL, "tcp://HOST:PORT", o.endpoint = "tcp://127.0.0.1:55x");
	REFUSED(APS_EINVAL, "port 70000", o.endpoint = "tcp://127.0.0.1:1,tcp://127.0.0.1:70000");
	REFUSED(APS_EINVAL, "ipc://PATH", o.endpoint = "foo://x");
	REFUSED(APS_EINVAL, "ipc://PATH", o.endpoint = "ipc://");
	REFUSED(APS_EFORMAT, "'e9m9' is not a format", o.rules = "fc.*=e9m9");
	REFUSED(APS_EINVAL, "empty", o.rules = "fc.*=fp16,,*.bias=fp32");
	REFUSED(APS_EINVAL, "empty", o.rules = "fc.*=fp16,");
	REFUSED(APS_EINVAL, "policy_auto 2", o.policy_auto = 2);
	REFUSED(APS_EINVAL, "error_feedback -1", o.error_feedback = -1);
	REFUSED(APS_EINVAL, "rejoin 5", o.rejoin = 5);
	/* A trace file is opened before joining, and one that cannot be is an error. */
	REFUSED(APS_ESYS, "cannot write the trace file /nonexistent/t.json",
	        o.trace = "/nonexistent/t.json");
	REFUSED(APS_EINVAL, "visible ASCII", o.optimizer = "sgd, momentum=0.9");
	/* CURVE: all three keys or none; a server key alone would not be plain text either */
	REFUSED(APS_EINVAL, "all three", (o.curve_public_key = KEY40, o.curve_secret_key = KEY40));
	REFUSED(APS_EINVAL, "all three", o.curve_server_key = KEY40);
	REFUSED(APS_EINVAL, "curve_public_key is not a Z85 key",
	        (o.curve_server_key = KEY40, o.curve_public_key = "short",
	         o.curve_secret_key = KEY40));
	REFUSED(APS_EINVAL, "curve_secret_key is not a Z85 key",
	        (o.curve_server_key = KEY40, o.curve_public_key = KEY40,
	         o.curve_secret_key = "rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf\""));
}

static void test_api_format_info(void **state)
{
	struct aps_format_info info;

	(void)state;
	assert_int_equal(aps_format_info("e5m2", &info), 0);
	assert_string_equal(info.name, "e5m2");
	assert_int_equal(info.bits, 8);
	assert_true(info.max == 57344.0f);
	assert_true(info.min_subnormal == 0x1p-16f);
	assert_non_null(aps_version());
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_api_roundtrip_with_exponent),
		cmocka_unit_test(test_api_errors_carry_a_message),
		cmocka_unit_test(test_api_format_info),
		cmocka_unit_test(test_api_codes_calls_check_their_arguments),
		cmocka_unit_test(test_api_client_options_are_checked_first),
		cmocka_unit_test(test_api_codec_helpers_refuse_bad_arguments),
		cmocka_unit_test(test_api_curve_keypair_says_why_it_failed),
		cmocka_unit_test(test_api_opts_init_of_null_is_a_no_op),
		cmocka_unit_test(test_api_client_options_within_the_daemons_limits),
	};
	return cmocka_run_group_tests_name("api", tests, NULL, NULL);
}
