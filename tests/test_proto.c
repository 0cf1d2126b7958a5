/*
 * Unit tests of the wire protocol (proto/): every type round-trips through
 * aps_msg_pack and aps_msg_parse, and every bad field, frame and payload is
 * refused with its fault kind and never crashes the parser.
 */
#include "common/codec.h"
#include "common/err.h"
#include "common/rng.h"
#include "common/scale.h"
#include "proto/envelope.h"
#include "proto/frame.h"
#include "proto/validate.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define CHUNK   101 /* elements of the PUSH and RESULT chunk */
#define BCAST   7   /* elements of the BROADCAST chunk */
#define HDR_CAP 8192

static uint8_t codes[CHUNK];  /* finite e4m3 codes */
static float values[BCAST];   /* finite fp32 values */
static uint8_t hdr[HDR_CAP];  /* header of the message under test */
static struct aps_msg parsed; /* output of the last parse */
static struct aps_msg_fault fault;

static const struct aps_msg_limits *limits(bool from_server)
{
	static struct aps_msg_limits lim[2];

	aps_msg_limits_init(&lim[from_server]);
	lim[from_server].max_ranks = 64;
	lim[from_server].max_tensors = 100;
	lim[from_server].max_elements = 1u << 20;
	lim[from_server].from_server = from_server;
	return &lim[from_server];
}

static bool sent_by_server(enum aps_msg_type type)
{
	return type == APS_MSG_WELCOME || type == APS_MSG_REGISTERED || type == APS_MSG_RESULT ||
	       type == APS_MSG_ERROR || type == APS_MSG_SCALES || type == APS_MSG_WEIGHTS ||
	       type == APS_MSG_AGAIN;
}

static void set_chunk(struct aps_msg *m, const char *format, const void *payload, size_t n,
                      size_t bytes)
{
	m->tensor_id = 3;
	m->step = 42;
	m->chunk_offset = 100;
	m->chunk_count = n;
	m->total_count = 1000;
	strcpy(m->format, format);
	m->payload = payload;
	m->payload_len = bytes;
}

/* A valid message of each type, as its usual sender builds it. */
static void make_valid(struct aps_msg *m, enum aps_msg_type type)
{
	aps_msg_init(m, type);
	strcpy(m->job, "default");
	m->rank = 1;
	m->world_size = 4;
	m->scaling = APS_SCALING_LOCAL;
	switch (type) {
	case APS_MSG_REGISTER:
	case APS_MSG_REGISTERED:
		m->tensor_id = type == APS_MSG_REGISTERED ? 7 : 0;
		strcpy(m->tensor_name, "layers.0.attn.weight");
		m->total_count = 1000;
		strcpy(m->format, "e4m3");
		break;
	case APS_MSG_PUSH:
	case APS_MSG_RESULT:
		set_chunk(m, "e4m3", codes, CHUNK, sizeof(codes));
		m->scale_exp = -5;
		m->flushed = 9;
		break;
	case APS_MSG_HELLO:
	case APS_MSG_WELCOME:
		strcpy(m->optimizer, "sgd,momentum=0.9");
		break;
	case APS_MSG_PULL:
		m->tensor_id = 3;
		break;
	case APS_MSG_BROADCAST:
	case APS_MSG_WEIGHTS:
		m->rank = 0;
		set_chunk(m, "fp32", values, BCAST, sizeof(values));
		m->chunk_offset = 0;
		m->total_count = BCAST;
		break;
	case APS_MSG_BARRIER:
		m->step = 3;
		break;
	case APS_MSG_AGAIN: /* which chunk of which call, no payload */
		set_chunk(m, "", NULL, CHUNK, 0);
		break;
	case APS_MSG_ERROR:
		m->error_code = APS_ETIMEDOUT;
		strcpy(m->error_text, "timed out: waiting for ranks 2 3");
		m->n_waiting_for = 2;
		m->waiting_for[0] = 2;
		m->waiting_for[1] = 3;
		break;
	case APS_MSG_EXPONENTS:
	case APS_MSG_SCALES:
		m->n_tensor_ids = m->n_exponents = 2;
		m->tensor_ids[0] = 3;
		m->tensor_ids[1] = 5;
		m->exponents[0] = -7;
		m->exponents[1] = -320; /* an all-zero tensor */
		break;
	default:
		break;
	}
}

static size_t pack(const struct aps_msg *m)
{
	size_t len = 0;

	assert_int_equal(aps_msg_pack(m, hdr, sizeof(hdr), &len), 0);
	return len;
}

/* Packs m, parses it with the given payload frame; returns aps_msg_parse's code. */
static int parse_with(const struct aps_msg *m, bool from_server, const void *payload,
                      size_t payload_len, bool has_payload)
{
	size_t len = pack(m);

	return aps_msg_parse(limits(from_server), hdr, len, payload, payload_len, has_payload,
	                     &parsed, &fault);
}

static int parse_msg(const struct aps_msg *m, bool from_server)
{
	return parse_with(m, from_server, m->payload, m->payload_len, m->payload != NULL);
}

#define expect_fault(rc, want) expect_fault_at(rc, want, __LINE__)

static void expect_fault_at(int rc, enum aps_msg_fault_kind want, int line)
{
	if (rc != APS_EPROTO || fault.kind != want)
		fail_msg("line %d: rc %d, fault %s (%s), expected %s", line, rc,
		         aps_msg_fault_name(fault.kind), fault.text, aps_msg_fault_name(want));
	assert_true(strlen(fault.text) > 0);
	assert_null(strchr(fault.text, '\n'));
}

static void expect_ok_at(int rc, int line)
{
	if (rc != 0)
		fail_msg("line %d: rc %d, fault %s: %s", line, rc, aps_msg_fault_name(fault.kind),
		         fault.text);
}

#define expect_ok(rc) expect_ok_at(rc, __LINE__)

static void assert_msg_equal(const struct aps_msg *a, const struct aps_msg *b)
{
	assert_int_equal(a->version_major, b->version_major);
	assert_int_equal(a->version_minor, b->version_minor);
	assert_int_equal(a->type, b->type);
	assert_string_equal(a->job, b->job);
	assert_int_equal(a->rank, b->rank);
	assert_int_equal(a->world_size, b->world_size);
	assert_int_equal(a->tensor_id, b->tensor_id);
	assert_string_equal(a->tensor_name, b->tensor_name);
	assert_int_equal(a->step, b->step);
	assert_int_equal(a->chunk_offset, b->chunk_offset);
	assert_int_equal(a->chunk_count, b->chunk_count);
	assert_int_equal(a->total_count, b->total_count);
	assert_string_equal(a->format, b->format);
	assert_string_equal(a->next_format, b->next_format);
	assert_int_equal(a->about_type, b->about_type);
	assert_int_equal(a->scale_exp, b->scale_exp);
	assert_int_equal(a->scaling, b->scaling);
	assert_int_equal(a->flags, b->flags);
	assert_int_equal(a->flushed, b->flushed);
	assert_int_equal(a->error_code, b->error_code);
	assert_string_equal(a->error_text, b->error_text);
	assert_int_equal(a->n_waiting_for, b->n_waiting_for);
	assert_memory_equal(a->waiting_for, b->waiting_for, sizeof(a->waiting_for));
	assert_int_equal(a->n_exponents, b->n_exponents);
	assert_memory_equal(a->exponents, b->exponents, sizeof(a->exponents));
	assert_int_equal(a->n_tensor_ids, b->n_tensor_ids);
	assert_memory_equal(a->tensor_ids, b->tensor_ids, sizeof(a->tensor_ids));
	assert_string_equal(a->optimizer, b->optimizer);
	assert_true(a->lr == b->lr);
	assert_int_equal(a->updates, b->updates);
	assert_int_equal(a->has_session, b->has_session);
	assert_memory_equal(a->session, b->session, sizeof(a->session));
	assert_string_equal(a->job_token, b->job_token);
	assert_int_equal(a->max_message_bytes, b->max_message_bytes);
	assert_int_equal(a->keepalive_ms, b->keepalive_ms);
	assert_int_equal(a->retry_after_ms, b->retry_after_ms);
	assert_ptr_equal(a->payload, b->payload);
	assert_int_equal(a->payload_len, b->payload_len);
}

static int setup(void **state)
{
	(void)state;
	for (int i = 0; i < CHUNK; i++)
		codes[i] = (uint8_t)((i % 0x78) | (i & 1 ? 0x80 : 0)); /* below the inf code 0x78 */
	for (int i = 0; i < BCAST; i++)
		values[i] = (float)i * -1.25f;
	return 0;
}

static void test_proto_every_type_round_trips(void **state)
{
	(void)state;
	for (int t = APS_MSG_HELLO; t < APS_MSG_TYPE_COUNT; t++) {
		struct aps_msg m;

		make_valid(&m, (enum aps_msg_type)t);
		expect_ok(parse_msg(&m, sent_by_server((enum aps_msg_type)t)));
		assert_msg_equal(&parsed, &m);
	}
}

static void test_proto_round_trips_extremes(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	memset(m.job, 'j', APS_MSG_JOB_MAX);
	m.rank = 63;
	m.world_size = 64;
	m.tensor_id = 99;
	m.step = INT64_MAX;
	m.chunk_offset = 1000 - CHUNK;
	m.scale_exp = -APS_CODEC_SCALE_MAX;
	m.flags = APS_MSG_FLAG_LOWP_SUM;
	m.flushed = UINT64_MAX;
	m.scaling = APS_MSG_SCALING_UNSET;
	expect_ok(parse_msg(&m, false));
	assert_msg_equal(&parsed, &m);
}

static void test_proto_pack_reports_short_buffer(void **state)
{
	struct aps_msg m;
	uint8_t *buf = NULL;
	size_t len = 0, need;

	(void)state;
	make_valid(&m, APS_MSG_ERROR);
	need = aps_msg_packed_size(&m);
	assert_int_equal(aps_msg_pack(&m, hdr, need - 1, &len), APS_ESHORT);
	assert_int_equal(aps_msg_pack(&m, hdr, need, &len), 0);
	assert_true(len <= need);
	assert_int_equal(aps_msg_pack_alloc(&m, &buf, &len), 0);
	assert_memory_equal(buf, hdr, len);
	free(buf);
	m.n_waiting_for = APS_MSG_LIST_MAX + 1;
	assert_int_equal(aps_msg_packed_size(&m), 0);
	assert_int_equal(aps_msg_pack(&m, hdr, sizeof(hdr), &len), APS_EINVAL);
	assert_int_equal(aps_msg_parse(NULL, hdr, 1, NULL, 0, false, &parsed, &fault), APS_EINVAL);
}

/* Protocol 1.6: session and job tokens, a WELCOME's limits, RESUME and ALIVE; 1.9: a
 * refusal's retry time. */
static void test_proto_tokens_round_trip_where_they_belong(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_WELCOME);
	memset(m.session, 0xa5, sizeof(m.session));
	m.has_session = true;
	m.max_message_bytes = 4 << 20;
	m.keepalive_ms = 5000;
	expect_ok(parse_msg(&m, true));
	assert_msg_equal(&m, &parsed);
	make_valid(&m, APS_MSG_HELLO);
	snprintf(m.job_token, sizeof(m.job_token), "s3cret-%0120d", 7); /* 127 bytes */
	m.flags = APS_MSG_FLAG_RESUME;
	memset(m.session, 0x5a, sizeof(m.session));
	m.has_session = true;
	expect_ok(parse_msg(&m, false));
	assert_msg_equal(&m, &parsed);
	make_valid(&m, APS_MSG_HEARTBEAT);
	m.flags = APS_MSG_FLAG_ALIVE;
	expect_ok(parse_msg(&m, false));
	expect_ok(parse_msg(&m, true));
	/* 1.9: a refused HELLO's ERROR says when the job's name is free */
	make_valid(&m, APS_MSG_ERROR);
	m.retry_after_ms = 1600;
	expect_ok(parse_msg(&m, true));
	assert_msg_equal(&m, &parsed);
}

static void test_proto_rejects_tokens_and_flags_out_of_place(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_REGISTER);
	strcpy(m.job_token, "t");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TOKEN);
	make_valid(&m, APS_MSG_HELLO);
	strcpy(m.job_token, "two words");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TOKEN);
	make_valid(&m, APS_MSG_PUSH);
	m.has_session = true;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TOKEN);
	make_valid(&m, APS_MSG_HELLO);
	m.max_message_bytes = 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TOKEN);
	make_valid(&m, APS_MSG_WELCOME);
	m.retry_after_ms = 1;
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_TOKEN);
	make_valid(&m, APS_MSG_HELLO);
	m.flags = APS_MSG_FLAG_RESUME; /* and no token to resume by */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FLAGS);
	make_valid(&m, APS_MSG_BARRIER);
	m.flags = APS_MSG_FLAG_ALIVE;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FLAGS);
	make_valid(&m, APS_MSG_WELCOME);
	m.flags = APS_MSG_FLAG_RESUME;
	m.has_session = true;
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_FLAGS);
}

static void test_proto_rejects_a_session_token_of_another_length(void **state)
{
	Aps__Envelope env;
	uint8_t buf[512], token[15] = { 1 };
	size_t len;

	(void)state;
	aps__envelope__init(&env);
	env.version_major = APS_PROTO_VERSION_MAJOR;
	env.version_minor = APS_PROTO_VERSION_MINOR;
	env.type = APS__MSG_TYPE__HELLO;
	env.job = "default";
	env.world_size = 2;
	env.session.data = token;
	env.session.len = sizeof(token);
	len = aps__envelope__pack(&env, buf);
	assert_int_equal(aps_msg_parse(limits(false), buf, len, NULL, 0, false, &parsed, &fault),
	                 APS_EPROTO);
	assert_int_equal(fault.kind, APS_MSG_FAULT_BAD_TOKEN);
}

static void test_proto_rejects_version_mismatch(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_HELLO);
	m.version_major = APS_PROTO_VERSION_MAJOR + 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_VERSION);
	char want[64];
	snprintf(want, sizeof(want), "HELLO: protocol version 2.%d", APS_PROTO_VERSION_MINOR);
	assert_non_null(strstr(fault.text, want));
	m.version_major = 0;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_VERSION);
	/* Another minor is compatible; an ERROR is read from any version. */
	make_valid(&m, APS_MSG_HELLO);
	m.version_minor = 77;
	expect_ok(parse_msg(&m, false));
	make_valid(&m, APS_MSG_ERROR);
	m.version_major = 9;
	expect_ok(parse_msg(&m, true));
}

static void test_proto_rejects_bad_type(void **state)
{
	static const int bad[] = { 0, 16, 99, -1 };
	struct aps_msg m;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		make_valid(&m, APS_MSG_HEARTBEAT);
		m.type = (enum aps_msg_type)bad[i];
		expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TYPE);
	}
	make_valid(&m, APS_MSG_SCALES); /* only the daemon sends SCALES */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TYPE);
	make_valid(&m, APS_MSG_EXPONENTS);
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_TYPE);
	make_valid(&m, APS_MSG_RESULT); /* only the daemon sends RESULT */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TYPE);
	make_valid(&m, APS_MSG_ERROR);
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TYPE);
	make_valid(&m, APS_MSG_PUSH); /* and only workers send PUSH */
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_TYPE);
	make_valid(&m, APS_MSG_WEIGHTS); /* only the daemon sends WEIGHTS, */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TYPE);
	make_valid(&m, APS_MSG_PULL); /* only workers PULL */
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_TYPE);
}

/* Optimize mode (1.4): the optimizer only on HELLO/WELCOME, a finite lr >= 0 only on PUSH. */
static void test_proto_rejects_bad_optimizer_fields(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.flags = APS_MSG_FLAG_UPDATE;
	m.lr = 0.125f;
	expect_ok(parse_msg(&m, false));
	assert_true(parsed.lr == 0.125f && parsed.flags == APS_MSG_FLAG_UPDATE);
	m.lr = -1.0f;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_OPTIMIZER);
	m.lr = NAN;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_OPTIMIZER);
	m.lr = INFINITY;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_OPTIMIZER);
	make_valid(&m, APS_MSG_BARRIER);
	m.lr = 1.0f;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_OPTIMIZER);
	make_valid(&m, APS_MSG_REGISTER);
	strcpy(m.optimizer, "sgd");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_OPTIMIZER);
	make_valid(&m, APS_MSG_HELLO);
	strcpy(m.optimizer, "sgd momentum");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_OPTIMIZER);
}

static void test_proto_rejects_bad_exponent_lists(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_EXPONENTS);
	m.n_exponents = 1; /* one exponent for two tensors */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TENSOR);
	make_valid(&m, APS_MSG_EXPONENTS);
	m.n_tensor_ids = m.n_exponents = 0;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TENSOR);
	make_valid(&m, APS_MSG_EXPONENTS);
	m.tensor_ids[1] = 1u << 30;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TENSOR);
	make_valid(&m, APS_MSG_EXPONENTS);
	m.exponents[0] = 321;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	make_valid(&m, APS_MSG_PUSH); /* tensor ids belong to EXPONENTS and SCALES only */
	m.n_tensor_ids = 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TENSOR);
}

/* A caller that overfills a list gets APS_EINVAL, not a read past the struct. */
static void test_proto_pack_refuses_overlong_lists(void **state)
{
	static struct aps_msg m;
	uint8_t buf[4096];
	size_t len;

	(void)state;
	make_valid(&m, APS_MSG_EXPONENTS);
	m.n_exponents = 1;
	m.n_tensor_ids = APS_MSG_LIST_MAX + 44;
	assert_int_equal(aps_msg_packed_size(&m), 0);
	assert_int_equal(aps_msg_pack(&m, buf, sizeof(buf), &len), APS_EINVAL);
}

/* A received format is parsed once, here: the handlers read the struct. */
static void test_proto_parse_gives_the_formats_parsed(void **state)
{
	struct aps_format e4m3, fp16;
	struct aps_msg m;

	(void)state;
	aps_format_parse("e4m3", &e4m3);
	aps_format_parse("fp16", &fp16);
	make_valid(&m, APS_MSG_RESULT);
	strcpy(m.next_format, "fp16");
	expect_ok(parse_msg(&m, true));
	assert_true(aps_format_equal(&parsed.fmt, &e4m3));
	assert_int_equal(parsed.fmt.bits, 8);
	assert_true(aps_format_equal(&parsed.next_fmt, &fp16));
	make_valid(&m, APS_MSG_REGISTER);
	m.format[0] = '\0'; /* none asked for: fp32 */
	expect_ok(parse_msg(&m, false));
	assert_true(aps_format_is_fp32(&parsed.fmt));
	assert_false(aps_format_equal(&parsed.fmt, &e4m3));
}

static void test_proto_next_format_belongs_to_results(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_RESULT);
	strcpy(m.next_format, "fp16");
	expect_ok(parse_msg(&m, true));
	assert_string_equal(parsed.next_format, "fp16");
	strcpy(m.next_format, "e9m9");
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_FORMAT);
	make_valid(&m, APS_MSG_PUSH);
	strcpy(m.next_format, "fp16");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FORMAT);
	make_valid(&m, APS_MSG_HELLO);
	m.flags = APS_MSG_FLAG_POLICY_AUTO;
	expect_ok(parse_msg(&m, false));
	/* an ERROR says what it answers; nothing else may */
	make_valid(&m, APS_MSG_ERROR);
	m.about_type = APS_MSG_PUSH;
	expect_ok(parse_msg(&m, true));
	assert_int_equal(parsed.about_type, APS_MSG_PUSH);
	make_valid(&m, APS_MSG_RESULT);
	m.about_type = APS_MSG_PUSH;
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_TYPE);
}

static void test_proto_rejects_bad_job(void **state)
{
	static const char *const bad[] = { "", "two words", "tab\there", "caf\xc3\xa9", "\x7f" };
	struct aps_msg m;

	(void)state;
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		make_valid(&m, APS_MSG_HELLO);
		strcpy(m.job, bad[i]);
		expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_JOB);
	}
	make_valid(&m, APS_MSG_ERROR); /* an anonymous ERROR has no job, a named one must */
	m.rank = 0;
	m.world_size = 0;
	m.n_waiting_for = 0;
	m.job[0] = '\0';
	expect_ok(parse_msg(&m, true));
	m.world_size = 2;
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_JOB);
}

static void test_proto_rejects_bad_rank(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_HELLO);
	m.rank = m.world_size;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_RANK);
	make_valid(&m, APS_MSG_HELLO);
	m.rank = 0;
	m.world_size = 0;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_RANK);
	m.world_size = 65; /* limits() allows 64 */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_RANK);
	make_valid(&m, APS_MSG_ERROR);
	m.waiting_for[1] = 4;
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_RANK);
}

static void test_proto_rejects_bad_tensor(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.tensor_id = 100; /* limits() allows ids below 100 */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TENSOR);
	make_valid(&m, APS_MSG_REGISTER);
	m.tensor_name[0] = '\0';
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TENSOR);
	strcpy(m.tensor_name, "fc weight");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_TENSOR);
	memset(m.tensor_name, 'n', APS_MSG_NAME_MAX);
	expect_ok(parse_msg(&m, false));
}

static void test_proto_rejects_bad_step(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.step = (uint64_t)INT64_MAX + 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_STEP);
	m.step = UINT64_MAX;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_STEP);
}

static void test_proto_rejects_bad_format(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.format[0] = '\0';
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FORMAT);
	strcpy(m.format, "e9m9");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FORMAT);
	strcpy(m.format, "E4M3");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FORMAT);
	make_valid(&m, APS_MSG_BROADCAST); /* BROADCAST is fp32 */
	strcpy(m.format, "e4m3");
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FORMAT);
	m.format[0] = '\0';
	expect_ok(parse_msg(&m, false));
}

static void test_proto_rejects_bad_chunk(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.chunk_offset = 1000 - CHUNK + 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_CHUNK);
	m.chunk_offset = UINT64_MAX; /* offset + count wraps around */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_CHUNK);
	make_valid(&m, APS_MSG_PUSH);
	m.total_count = CHUNK - 1;
	m.chunk_offset = 0;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_CHUNK);
	make_valid(&m, APS_MSG_PUSH);
	m.chunk_count = 0;
	m.payload_len = 0;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_CHUNK);
	make_valid(&m, APS_MSG_REGISTER);
	m.total_count = 0;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_CHUNK);
	m.total_count = (1u << 20) + 1; /* limits() allows 2^20 elements */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_TOO_LARGE);
}

static void test_proto_rejects_bad_scale(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.scale_exp = APS_CODEC_SCALE_MAX + 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	m.scale_exp = -APS_CODEC_SCALE_MAX - 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	make_valid(&m, APS_MSG_HELLO);
	m.scaling = APS_SCALING_BLOCK + 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	make_valid(&m, APS_MSG_HELLO);
	m.n_exponents = 2;
	m.exponents[1] = INT32_MIN;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
}

static void test_proto_rejects_unknown_flags(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.flags = 1u << 6;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FLAGS);
	/* RESUMED belongs to a WELCOME (protocol 1.5) */
	make_valid(&m, APS_MSG_PUSH);
	m.flags = APS_MSG_FLAG_RESUMED;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_FLAGS);
	make_valid(&m, APS_MSG_WELCOME);
	m.flags = APS_MSG_FLAG_RESUMED;
	expect_ok(parse_msg(&m, true));
}

static void test_proto_rejects_bad_error(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_ERROR);
	m.error_code = 0;
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_ERROR);
	make_valid(&m, APS_MSG_ERROR);
	m.error_text[0] = '\0';
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_ERROR);
	strcpy(m.error_text, "two\nlines");
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_BAD_ERROR);
	make_valid(&m, APS_MSG_BYE);
	m.error_code = APS_EPROTO;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_ERROR);
}

/* Packs an envelope built by hand: fields struct aps_msg cannot hold. */
static size_t pack_raw(const Aps__Envelope *env)
{
	assert_true(aps__envelope__get_packed_size(env) <= sizeof(hdr));
	return aps__envelope__pack(env, hdr);
}

static int parse_raw(const Aps__Envelope *env, bool from_server)
{
	size_t len = pack_raw(env);

	return aps_msg_parse(limits(from_server), hdr, len, NULL, 0, false, &parsed, &fault);
}

static void test_proto_rejects_what_the_struct_cannot_hold(void **state)
{
	static char long_text[APS_MSG_NAME_MAX + 2];
	static uint32_t list[APS_MSG_LIST_MAX + 1];
	struct aps_msg m;
	Aps__Envelope env;

	(void)state;
	memset(long_text, 'x', sizeof(long_text) - 1);
	make_valid(&m, APS_MSG_REGISTER);
	aps_envelope_from_msg(&m, 0, &env);
	env.tensor_name = long_text;
	expect_fault(parse_raw(&env, false), APS_MSG_FAULT_BAD_TENSOR);
	aps_envelope_from_msg(&m, 0, &env);
	env.job = long_text + sizeof(long_text) - 2 - APS_MSG_JOB_MAX; /* 65 bytes */
	expect_fault(parse_raw(&env, false), APS_MSG_FAULT_BAD_JOB);
	aps_envelope_from_msg(&m, 0, &env);
	env.format = long_text + sizeof(long_text) - 1 - APS_FORMAT_NAME_MAX;
	expect_fault(parse_raw(&env, false), APS_MSG_FAULT_BAD_FORMAT);
	make_valid(&m, APS_MSG_ERROR);
	aps_envelope_from_msg(&m, 0, &env);
	env.error_text = long_text;
	expect_fault(parse_raw(&env, true), APS_MSG_FAULT_BAD_ERROR);
	aps_envelope_from_msg(&m, 0, &env);
	env.n_waiting_for = APS_MSG_LIST_MAX + 1;
	env.waiting_for = list;
	expect_fault(parse_raw(&env, true), APS_MSG_FAULT_TOO_LARGE);
	make_valid(&m, APS_MSG_HELLO); /* describes a payload it does not carry */
	aps_envelope_from_msg(&m, 0, &env);
	env.payload_len = 4;
	expect_fault(parse_raw(&env, false), APS_MSG_FAULT_BAD_LENGTH);
}

static void test_proto_rejects_large_header(void **state)
{
	struct aps_msg_limits lim = *limits(false);
	struct aps_msg m;
	size_t len;

	(void)state;
	make_valid(&m, APS_MSG_HELLO);
	len = pack(&m);
	lim.max_header = len - 1;
	assert_int_equal(aps_msg_parse(&lim, hdr, len, NULL, 0, false, &parsed, &fault),
	                 APS_EPROTO);
	assert_int_equal(fault.kind, APS_MSG_FAULT_TOO_LARGE);
}

static void test_proto_rejects_payload_length_mismatch(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	/* Header and frame agree, the count does not. */
	m.payload_len = CHUNK - 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_LENGTH);
	assert_string_equal(fault.text, "PUSH: payload is 100 bytes, 101 e4m3 codes need 101");
	/* Header and count agree, the frame is one byte short. */
	make_valid(&m, APS_MSG_PUSH);
	expect_fault(parse_with(&m, false, codes, CHUNK - 1, true), APS_MSG_FAULT_BAD_LENGTH);
	make_valid(&m, APS_MSG_BROADCAST);
	m.payload_len = sizeof(values) - 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_LENGTH);
}

/* A block-scaled chunk: 96 fp4 codes (48 bytes), then 3 int8 exponents of blocks of 32. */
static void test_proto_block_scaled_payloads(void **state)
{
	uint8_t p[48 + 3] = { 0 };
	struct aps_msg m;

	(void)state;
	p[48] = 5, p[49] = (uint8_t)-127, p[50] = 127;
	make_valid(&m, APS_MSG_PUSH);
	set_chunk(&m, "fp4", p, 96, sizeof(p));
	m.chunk_offset = 64;
	m.scale_exp = 0;
	m.block_size = 32;
	expect_ok(parse_msg(&m, false));
	assert_int_equal(parsed.block_size, 32);
	/* The exponents are part of the length. */
	m.payload_len = 48;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_LENGTH);
	assert_string_equal(fault.text,
	                    "PUSH: payload is 48 bytes, 96 fp4 codes and exponents need 51");
	m.payload_len = sizeof(p);
	/* -128 would scale by 2^128: never sent. */
	p[49] = 0x80;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	assert_string_equal(fault.text, "PUSH: block 1 has exponent -128");
	p[49] = 0;
	/* A chunk starts on a block, with no tensor-wide exponent besides. */
	m.chunk_offset = 48;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	m.chunk_offset = 64;
	m.scale_exp = 1;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	m.scale_exp = 0;
	m.block_size = 24;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	assert_string_equal(fault.text, "PUSH: block size 24 is not 16, 32 or 64");
	/* Where a block size means nothing. */
	make_valid(&m, APS_MSG_BARRIER);
	m.block_size = 32;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_BAD_SCALE);
	make_valid(&m, APS_MSG_HELLO);
	m.scaling = APS_SCALING_BLOCK;
	m.block_size = 64;
	expect_ok(parse_msg(&m, false));
}

static void test_proto_rejects_flipped_payload_bit(void **state)
{
	uint8_t copy[CHUNK];
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	for (size_t bit = 0; bit < 8 * sizeof(copy); bit += 37) {
		memcpy(copy, codes, sizeof(copy));
		copy[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		expect_fault(parse_with(&m, false, copy, sizeof(copy), true),
		             APS_MSG_FAULT_BAD_CRC);
	}
}

/* NO_CRC: no CRC to check (a flipped bit passes, by the job's choice), a CRC in the
 * header is refused, and inf/NaN codes are still found. */
static void test_proto_no_crc_payloads(void **state)
{
	static uint8_t copy[CHUNK];
	struct aps_msg m;
	size_t len;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	m.flags = APS_MSG_FLAG_NO_CRC;
	expect_ok(parse_msg(&m, false));
	memcpy(copy, codes, sizeof(copy));
	copy[5] ^= 0x80; /* the sign: still a finite code */
	expect_ok(parse_with(&m, false, copy, sizeof(copy), true));
	assert_int_equal(aps_msg_pack_with_crc(&m, 0x1234u, hdr, sizeof(hdr), &len), 0);
	expect_fault(aps_msg_parse(limits(false), hdr, len, m.payload, m.payload_len, true, &parsed,
	                           &fault),
	             APS_MSG_FAULT_BAD_CRC);
	memcpy(copy, codes, sizeof(copy));
	copy[3] = 0x7f; /* e4m3: NaN */
	expect_fault(parse_with(&m, false, copy, sizeof(copy), true), APS_MSG_FAULT_NONFINITE);
}

static void test_proto_rejects_missing_and_unexpected_payload(void **state)
{
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	expect_fault(parse_with(&m, false, NULL, 0, false), APS_MSG_FAULT_MISSING_PAYLOAD);
	make_valid(&m, APS_MSG_RESULT);
	expect_fault(parse_with(&m, true, NULL, 0, false), APS_MSG_FAULT_MISSING_PAYLOAD);
	make_valid(&m, APS_MSG_BROADCAST);
	expect_fault(parse_with(&m, false, NULL, 0, false), APS_MSG_FAULT_MISSING_PAYLOAD);
	make_valid(&m, APS_MSG_HELLO);
	expect_fault(parse_with(&m, false, codes, 4, true), APS_MSG_FAULT_UNEXPECTED_PAYLOAD);
	expect_fault(parse_with(&m, false, NULL, 0, true), APS_MSG_FAULT_UNEXPECTED_PAYLOAD);
	/* A skipped chunk and a non-root BROADCAST request carry no payload. */
	make_valid(&m, APS_MSG_PUSH);
	m.flags = APS_MSG_FLAG_SKIP;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_UNEXPECTED_PAYLOAD);
	m.payload = NULL;
	m.payload_len = 0;
	expect_ok(parse_msg(&m, false));
	make_valid(&m, APS_MSG_BROADCAST);
	m.rank = 2;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_UNEXPECTED_PAYLOAD);
	m.payload = NULL;
	m.payload_len = 0;
	expect_ok(parse_msg(&m, false));
	expect_fault(parse_msg(&m, true), APS_MSG_FAULT_MISSING_PAYLOAD);
}

/* A PUSH of n codes of the given width in format, one of them set to bad. */
static int parse_push_with_code(const char *format, unsigned bytes_per_code, uint32_t bad)
{
	static uint8_t buf[4 * 5];
	struct aps_msg m;

	make_valid(&m, APS_MSG_PUSH);
	memset(buf, 0, sizeof(buf));
	memcpy(buf + 3 * bytes_per_code, &bad, bytes_per_code); /* little-endian host */
	set_chunk(&m, format, buf, 5, 5 * bytes_per_code);
	return parse_msg(&m, false);
}

static void test_proto_rejects_nonfinite_codes(void **state)
{
	float nan = NAN, inf = -INFINITY, one = 1.0f;
	uint32_t nan_bits, inf_bits, one_bits;
	struct aps_msg m;

	(void)state;
	memcpy(&nan_bits, &nan, 4);
	memcpy(&inf_bits, &inf, 4);
	memcpy(&one_bits, &one, 4);
	expect_fault(parse_push_with_code("e4m3", 1, 0x78), APS_MSG_FAULT_NONFINITE); /* +inf */
	expect_fault(parse_push_with_code("e4m3", 1, 0xff), APS_MSG_FAULT_NONFINITE); /* NaN */
	expect_ok(parse_push_with_code("e4m3fn", 1, 0x78));                           /* 256 */
	expect_fault(parse_push_with_code("e4m3fn", 1, 0x7f), APS_MSG_FAULT_NONFINITE);
	expect_fault(parse_push_with_code("e5m2", 1, 0xfc), APS_MSG_FAULT_NONFINITE); /* -inf */
	expect_fault(parse_push_with_code("fp16", 2, 0x7c00), APS_MSG_FAULT_NONFINITE);
	expect_fault(parse_push_with_code("fp16", 2, 0xfe00), APS_MSG_FAULT_NONFINITE);
	expect_ok(parse_push_with_code("fp16", 2, 0x7bff));
	expect_fault(parse_push_with_code("bf16", 2, 0x7f80), APS_MSG_FAULT_NONFINITE);
	expect_fault(parse_push_with_code("fp32", 4, nan_bits), APS_MSG_FAULT_NONFINITE);
	expect_fault(parse_push_with_code("fp32", 4, inf_bits), APS_MSG_FAULT_NONFINITE);
	expect_ok(parse_push_with_code("fp32", 4, one_bits));
	make_valid(&m, APS_MSG_BROADCAST);
	values[BCAST - 1] = INFINITY;
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_NONFINITE);
	values[BCAST - 1] = 2.0f;
	expect_ok(parse_msg(&m, false));
}

static void test_proto_rejects_nonfinite_packed_codes(void **state)
{
	uint8_t buf[2] = { 0 }; /* three 4-bit e3m0 codes in a 12-bit stream */
	struct aps_msg m;

	(void)state;
	make_valid(&m, APS_MSG_PUSH);
	set_chunk(&m, "e3m0", buf, 3, sizeof(buf));
	expect_ok(parse_msg(&m, false));
	buf[1] = 0x07; /* code 2 = 0x7: e3m0 inf */
	expect_fault(parse_msg(&m, false), APS_MSG_FAULT_NONFINITE);
	buf[1] = 0x70; /* bits past the last code are not a code */
	expect_ok(parse_msg(&m, false));
}

static bool is_data(int type)
{
	return type == APS_MSG_PUSH || type == APS_MSG_RESULT || type == APS_MSG_BROADCAST;
}

static void test_proto_rejects_every_truncated_header(void **state)
{
	uint8_t full[HDR_CAP];
	struct aps_msg m;
	size_t len;

	(void)state;
	for (int t = APS_MSG_HELLO; t <= APS_MSG_ERROR; t++) {
		bool server = sent_by_server((enum aps_msg_type)t);

		make_valid(&m, (enum aps_msg_type)t);
		m.flushed = 0; /* so that the CRC is the last field encoded */
		len = pack(&m);
		memcpy(full, hdr, len);
		for (size_t cut = 0; cut < len; cut++) {
			/* Exact-size heap copy: ASan sees any read past the cut. */
			uint8_t *prefix = malloc(cut ? cut : 1);
			int rc;

			memcpy(prefix, full, cut);
			rc = aps_msg_parse(limits(server), prefix, cut, m.payload, m.payload_len,
			                   m.payload != NULL, &parsed, &fault);
			free(prefix);
			/*
			 * A prefix ending on a field boundary is a valid protobuf with the
			 * later fields at zero: a data message fails on its CRC, others
			 * may pass with trailing fields dropped, never with other values.
			 */
			if (is_data(t))
				assert_int_equal(rc, APS_EPROTO);
			else if (rc == 0)
				assert_int_equal(parsed.type, t);
			else
				assert_int_equal(rc, APS_EPROTO);
		}
	}
}

static void parse_garbage(const uint8_t *bytes, size_t len, uint64_t seed)
{
	uint8_t *copy = malloc(len ? len : 1);
	bool server = seed & 1;
	int rc;

	memcpy(copy, bytes, len);
	rc = aps_msg_parse(limits(server), copy, len, codes, (seed >> 1) % sizeof(codes),
	                   (seed >> 8) & 1, &parsed, &fault);
	free(copy);
	assert_true(rc == 0 || rc == APS_EPROTO);
	if (rc == APS_EPROTO) {
		assert_true(fault.kind > APS_MSG_FAULT_NONE && fault.kind < APS_MSG_FAULT_COUNT);
		assert_true(strlen(fault.text) < sizeof(fault.text));
	}
}

static void test_proto_survives_random_garbage(void **state)
{
	uint8_t buf[512];

	(void)state;
	for (uint64_t t = 0; t < 20000; t++) {
		size_t len = (size_t)(aps_rng_bits(11, t, 0) % sizeof(buf));

		for (size_t i = 0; i < len; i++)
			buf[i] = (uint8_t)aps_rng_bits(12, t, i);
		parse_garbage(buf, len, aps_rng_bits(13, t, 0));
	}
}

static void test_proto_survives_mutated_headers(void **state)
{
	uint8_t buf[HDR_CAP];
	struct aps_msg m;
	size_t len;

	(void)state;
	for (uint64_t t = 0; t < 20000; t++) {
		make_valid(&m, (enum aps_msg_type)(APS_MSG_HELLO + t % APS_MSG_ERROR));
		len = pack(&m);
		memcpy(buf, hdr, len);
		for (int k = 0; k < 1 + (int)(t % 4); k++) {
			uint64_t r = aps_rng_bits(14, t, (uint64_t)k);

			buf[r % len] = (uint8_t)(r >> 32);
		}
		parse_garbage(buf, len, aps_rng_bits(15, t, 0));
	}
}

static void test_proto_fault_names_are_distinct(void **state)
{
	(void)state;
	for (int i = 1; i < APS_MSG_FAULT_COUNT; i++) {
		const char *name = aps_msg_fault_name((enum aps_msg_fault_kind)i);

		assert_true(strlen(name) > 0);
		assert_true(strlen(aps_msg_fault_text((enum aps_msg_fault_kind)i)) > 0);
		for (int j = 1; j < i; j++)
			assert_string_not_equal(name,
			                        aps_msg_fault_name((enum aps_msg_fault_kind)j));
	}
	assert_string_equal(aps_msg_fault_name(APS_MSG_FAULT_BAD_CRC), "bad_crc");
	assert_string_equal(aps_msg_fault_name(APS_MSG_FAULT_COUNT), "unknown");
	assert_string_equal(aps_msg_type_name(APS_MSG_PUSH), "PUSH");
	assert_string_equal(aps_msg_type_name(1000), "UNKNOWN");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_proto_every_type_round_trips),
		cmocka_unit_test(test_proto_round_trips_extremes),
		cmocka_unit_test(test_proto_tokens_round_trip_where_they_belong),
		cmocka_unit_test(test_proto_rejects_tokens_and_flags_out_of_place),
		cmocka_unit_test(test_proto_rejects_a_session_token_of_another_length),
		cmocka_unit_test(test_proto_pack_reports_short_buffer),
		cmocka_unit_test(test_proto_rejects_version_mismatch),
		cmocka_unit_test(test_proto_rejects_bad_type),
		cmocka_unit_test(test_proto_rejects_bad_optimizer_fields),
		cmocka_unit_test(test_proto_rejects_bad_exponent_lists),
		cmocka_unit_test(test_proto_pack_refuses_overlong_lists),
		cmocka_unit_test(test_proto_parse_gives_the_formats_parsed),
		cmocka_unit_test(test_proto_next_format_belongs_to_results),
		cmocka_unit_test(test_proto_rejects_bad_job),
		cmocka_unit_test(test_proto_rejects_bad_rank),
		cmocka_unit_test(test_proto_rejects_bad_tensor),
		cmocka_unit_test(test_proto_rejects_bad_step),
		cmocka_unit_test(test_proto_rejects_bad_format),
		cmocka_unit_test(test_proto_rejects_bad_chunk),
		cmocka_unit_test(test_proto_rejects_bad_scale),
		cmocka_unit_test(test_proto_rejects_unknown_flags),
		cmocka_unit_test(test_proto_rejects_bad_error),
		cmocka_unit_test(test_proto_rejects_what_the_struct_cannot_hold),
		cmocka_unit_test(test_proto_rejects_large_header),
		cmocka_unit_test(test_proto_rejects_payload_length_mismatch),
		cmocka_unit_test(test_proto_block_scaled_payloads),
		cmocka_unit_test(test_proto_rejects_flipped_payload_bit),
		cmocka_unit_test(test_proto_rejects_missing_and_unexpected_payload),
		cmocka_unit_test(test_proto_rejects_nonfinite_codes),
		cmocka_unit_test(test_proto_no_crc_payloads),
		cmocka_unit_test(test_proto_rejects_nonfinite_packed_codes),
		cmocka_unit_test(test_proto_rejects_every_truncated_header),
		cmocka_unit_test(test_proto_survives_random_garbage),
		cmocka_unit_test(test_proto_survives_mutated_headers),
		cmocka_unit_test(test_proto_fault_names_are_distinct),
	};

	return cmocka_run_group_tests_name("proto", tests, setup, NULL);
}
