/*
 * The checks on every message a peer sends: decoding of the header frame
 * (protobuf-c, freed before return) and every stateless rule on its fields
 * and its payload frame, each failure named by a fault kind and one line of
 * text. It keeps no state: whether a job, rank, tensor or step is the
 * expected one is decided by the daemon's sessions and rounds.
 */
#include "proto/validate.h"

#include "common/codec.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/scale.h"
#include "proto/envelope.h"

#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#define DEFAULT_MAX_HEADER   (16u * 1024)
#define DEFAULT_MAX_RANKS    4096u
#define DEFAULT_MAX_TENSORS  65536u
#define DEFAULT_MAX_ELEMENTS APS_MSG_ELEMENTS_MAX

/* Fields a type must carry. */
#define NEED_IDENTITY (1u << 0) /* job, rank, world_size */
#define NEED_NAME     (1u << 1) /* tensor_name */
#define NEED_COUNT    (1u << 2) /* total_count >= 1 */
#define NEED_CHUNK    (1u << 3) /* chunk_count >= 1 */
#define NEED_FORMAT   (1u << 4) /* format */
#define NEED_ERROR    (1u << 5) /* error_code < 0 and error_text */
#define NEED_IDS      (1u << 6) /* 1.. tensor_ids, as many exponents */

enum payload_rule {
	PAYLOAD_NONE,
	PAYLOAD_CODES, /* packed codes in the message's format, unless flagged SKIP */
	PAYLOAD_FP32,  /* fp32 words: always from the daemon, from rank 0 only */
};

struct type_rule {
	bool from_worker;
	bool from_server;
	unsigned needs;
	enum payload_rule payload;
};

#define ID  NEED_IDENTITY
#define DAT (NEED_IDENTITY | NEED_COUNT | NEED_CHUNK)

static const struct type_rule rules[APS_MSG_TYPE_COUNT] = {
	[APS_MSG_HELLO] = { true, false, ID, PAYLOAD_NONE },
	[APS_MSG_WELCOME] = { false, true, ID, PAYLOAD_NONE },
	[APS_MSG_REGISTER] = { true, false, ID | NEED_NAME | NEED_COUNT, PAYLOAD_NONE },
	[APS_MSG_REGISTERED] = { false, true, ID | NEED_NAME | NEED_COUNT | NEED_FORMAT,
	                         PAYLOAD_NONE },
	[APS_MSG_PUSH] = { true, false, DAT | NEED_FORMAT, PAYLOAD_CODES },
	[APS_MSG_RESULT] = { false, true, DAT | NEED_FORMAT, PAYLOAD_CODES },
	[APS_MSG_BROADCAST] = { true, true, DAT, PAYLOAD_FP32 },
	[APS_MSG_BARRIER] = { true, true, ID, PAYLOAD_NONE },
	[APS_MSG_HEARTBEAT] = { true, true, ID, PAYLOAD_NONE },
	[APS_MSG_BYE] = { true, true, ID, PAYLOAD_NONE },
	[APS_MSG_ERROR] = { false, true, NEED_ERROR, PAYLOAD_NONE },
	[APS_MSG_EXPONENTS] = { true, false, ID | NEED_IDS, PAYLOAD_NONE },
	[APS_MSG_SCALES] = { false, true, ID | NEED_IDS, PAYLOAD_NONE },
	[APS_MSG_PULL] = { true, false, ID, PAYLOAD_NONE },
	[APS_MSG_WEIGHTS] = { false, true, DAT, PAYLOAD_FP32 },
	[APS_MSG_AGAIN] = { false, true, DAT, PAYLOAD_NONE },
};

#undef ID
#undef DAT

/* One parse: inputs, the message being built and where faults go. */
struct check {
	const struct aps_msg_limits *lim;
	struct aps_msg_fault *fault;
	const struct type_rule *rule;
	const char *what; /* type name that prefixes every fault text */
	struct aps_msg msg;
	struct aps_format fmt; /* of the payload, once check_format passed */
	uint64_t wire_len;     /* Envelope.payload_len */
	uint32_t wire_crc;     /* Envelope.payload_crc32c */
	const uint8_t *payload;
	size_t payload_len;
	bool has_payload;
};

__attribute__((format(printf, 3, 4))) static int fail(struct check *c, enum aps_msg_fault_kind kind,
                                                      const char *fmt, ...)
{
	va_list ap;
	int n;

	if (c->fault == NULL)
		return APS_EPROTO;
	c->fault->kind = kind;
	n = snprintf(c->fault->text, sizeof(c->fault->text), "%s: ", c->what);
	if (n < 0 || (size_t)n >= sizeof(c->fault->text))
		return APS_EPROTO;
	va_start(ap, fmt);
	vsnprintf(c->fault->text + n, sizeof(c->fault->text) - (size_t)n, fmt, ap);
	va_end(ap);
	return APS_EPROTO;
}

void aps_msg_limits_init(struct aps_msg_limits *lim)
{
	memset(lim, 0, sizeof(*lim));
	lim->max_header = DEFAULT_MAX_HEADER;
	lim->max_ranks = DEFAULT_MAX_RANKS;
	lim->max_tensors = DEFAULT_MAX_TENSORS;
	lim->max_elements = DEFAULT_MAX_ELEMENTS;
	lim->from_server = false;
}

static const char *const fault_names[APS_MSG_FAULT_COUNT] = { [APS_MSG_FAULT_NONE] = "none",
#define APS_MSG_FAULT_NAME(name, stat, text) [APS_MSG_FAULT_##name] = stat,
	                                                      APS_MSG_FAULT_MAP(APS_MSG_FAULT_NAME)
#undef APS_MSG_FAULT_NAME
};

static const char *const fault_texts[APS_MSG_FAULT_COUNT] = { [APS_MSG_FAULT_NONE] = "no fault",
#define APS_MSG_FAULT_TEXT(name, stat, text) [APS_MSG_FAULT_##name] = text,
	                                                      APS_MSG_FAULT_MAP(APS_MSG_FAULT_TEXT)
#undef APS_MSG_FAULT_TEXT
};

const char *aps_msg_fault_name(enum aps_msg_fault_kind kind)
{
	if ((unsigned)kind >= APS_MSG_FAULT_COUNT)
		return "unknown";
	return fault_names[kind];
}

const char *aps_msg_fault_text(enum aps_msg_fault_kind kind)
{
	if ((unsigned)kind >= APS_MSG_FAULT_COUNT)
		return "unknown fault";
	return fault_texts[kind];
}

/* Bytes in [lo, 0x7e] only: visible ASCII (lo = '!') or printable (lo = ' '). */
static bool ascii_only(const char *s, char lo)
{
	for (; *s; s++) {
		if (*s < lo || *s > '~')
			return false;
	}
	return true;
}

static int check_version_and_type(struct check *c, const Aps__Envelope *env)
{
	int type = (int)env->type;

	c->what = aps_msg_type_name(type);
	/* An ERROR is read whatever its version, so that "wrong version" reaches the user. */
	if (env->version_major != APS_PROTO_VERSION_MAJOR && type != APS_MSG_ERROR)
		return fail(c, APS_MSG_FAULT_BAD_VERSION,
		            "protocol version %" PRIu32 ".%" PRIu32 ", this peer speaks %d.%d",
		            env->version_major, env->version_minor, APS_PROTO_VERSION_MAJOR,
		            APS_PROTO_VERSION_MINOR);
	if (type <= APS_MSG_UNSPECIFIED || type >= APS_MSG_TYPE_COUNT)
		return fail(c, APS_MSG_FAULT_BAD_TYPE, "message type %d is unknown", type);
	c->rule = &rules[type];
	if (!c->rule->from_worker && !c->rule->from_server)
		return fail(c, APS_MSG_FAULT_BAD_TYPE, "type is reserved for global mode");
	if (!(c->lim->from_server ? c->rule->from_server : c->rule->from_worker))
		return fail(c, APS_MSG_FAULT_BAD_TYPE, "a %s may not send this type",
		            c->lim->from_server ? "daemon" : "worker");
	if ((int)env->about_type < 0 || (int)env->about_type >= APS_MSG_TYPE_COUNT ||
	    (env->about_type != 0 && type != APS_MSG_ERROR))
		return fail(c, APS_MSG_FAULT_BAD_TYPE, "about type %d is not one an ERROR answers",
		            (int)env->about_type);
	return 0;
}

/* Optimize mode (1.4): the spec only on HELLO/WELCOME, a learning rate only on a PUSH. */
static int check_optimizer(struct check *c, const Aps__Envelope *env)
{
	int type = (int)env->type;

	if (strlen(env->optimizer) > APS_MSG_OPTIM_MAX || !ascii_only(env->optimizer, '!'))
		return fail(c, APS_MSG_FAULT_BAD_OPTIMIZER,
		            "optimizer is not 1..%d visible ASCII bytes", APS_MSG_OPTIM_MAX);
	if (env->optimizer[0] != '\0' && type != APS_MSG_HELLO && type != APS_MSG_WELCOME)
		return fail(c, APS_MSG_FAULT_BAD_OPTIMIZER, "optimizer on a %s", c->what);
	if (!isfinite(env->lr) || env->lr < 0)
		return fail(c, APS_MSG_FAULT_BAD_OPTIMIZER,
		            "learning rate %g is not finite and >= 0", (double)env->lr);
	if (env->lr != 0 && type != APS_MSG_PUSH)
		return fail(c, APS_MSG_FAULT_BAD_OPTIMIZER, "learning rate on a %s", c->what);
	return 0;
}

/* 1.6: a session token only on WELCOME and HELLO, a job token only on HELLO;
 * 1.9: a refusal's retry time only on ERROR. */
static int check_tokens(struct check *c, const Aps__Envelope *env)
{
	int type = (int)env->type;
	bool hello = type == APS_MSG_HELLO, welcome = type == APS_MSG_WELCOME;

	if (env->session.len != 0 && env->session.len != APS_MSG_SESSION_LEN)
		return fail(c, APS_MSG_FAULT_BAD_TOKEN, "session token of %zu bytes, not %d",
		            env->session.len, APS_MSG_SESSION_LEN);
	if (env->session.len != 0 && !hello && !welcome)
		return fail(c, APS_MSG_FAULT_BAD_TOKEN, "session token on a %s", c->what);
	if (strlen(env->job_token) > APS_MSG_TOKEN_MAX || !ascii_only(env->job_token, '!'))
		return fail(c, APS_MSG_FAULT_BAD_TOKEN,
		            "job token is not 1..%d visible ASCII bytes", APS_MSG_TOKEN_MAX);
	if (env->job_token[0] != '\0' && !hello)
		return fail(c, APS_MSG_FAULT_BAD_TOKEN, "job token on a %s", c->what);
	if ((env->max_message_bytes != 0 || env->keepalive_ms != 0) && !welcome)
		return fail(c, APS_MSG_FAULT_BAD_TOKEN, "a WELCOME's limits on a %s", c->what);
	if (env->retry_after_ms != 0 && type != APS_MSG_ERROR)
		return fail(c, APS_MSG_FAULT_BAD_TOKEN, "a refusal's retry time on a %s", c->what);
	return 0;
}

/* What struct aps_msg cannot hold: long strings, long lists, unknown enums. */
static int check_envelope(struct check *c, const Aps__Envelope *env)
{
	int ret = check_version_and_type(c, env);

	if (ret < 0)
		return ret;
	if (strlen(env->job) > APS_MSG_JOB_MAX || !ascii_only(env->job, '!'))
		return fail(c, APS_MSG_FAULT_BAD_JOB, "job name is not 1..%d visible ASCII bytes",
		            APS_MSG_JOB_MAX);
	if (strlen(env->tensor_name) > APS_MSG_NAME_MAX || !ascii_only(env->tensor_name, '!'))
		return fail(c, APS_MSG_FAULT_BAD_TENSOR,
		            "tensor name is not 1..%d visible ASCII bytes", APS_MSG_NAME_MAX);
	if (strlen(env->format) >= APS_FORMAT_NAME_MAX || !ascii_only(env->format, '!') ||
	    strlen(env->next_format) >= APS_FORMAT_NAME_MAX || !ascii_only(env->next_format, '!'))
		return fail(c, APS_MSG_FAULT_BAD_FORMAT, "format name is not a format");
	if (strlen(env->error_text) > APS_MSG_TEXT_MAX || !ascii_only(env->error_text, ' '))
		return fail(c, APS_MSG_FAULT_BAD_ERROR, "error text is not one line of <= %d bytes",
		            APS_MSG_TEXT_MAX);
	if (env->n_waiting_for > APS_MSG_LIST_MAX || env->n_exponents > APS_MSG_LIST_MAX ||
	    env->n_tensor_ids > APS_MSG_LIST_MAX)
		return fail(c, APS_MSG_FAULT_TOO_LARGE,
		            "%zu awaited ranks, %zu exponents and %zu tensor ids, limit %d",
		            env->n_waiting_for, env->n_exponents, env->n_tensor_ids,
		            APS_MSG_LIST_MAX);
	if ((unsigned)env->scaling > (unsigned)APS__SCALING_MODE__SCALING_BLOCK)
		return fail(c, APS_MSG_FAULT_BAD_SCALE, "scaling mode %d is unknown",
		            (int)env->scaling);
	ret = check_tokens(c, env);
	return ret < 0 ? ret : check_optimizer(c, env);
}

static bool anonymous(const struct aps_msg *m)
{
	return m->job[0] == '\0' && m->rank == 0 && m->world_size == 0 && m->n_waiting_for == 0;
}

/* Every type but an anonymous ERROR names its job, rank and world size. */
static int check_identity(struct check *c)
{
	const struct aps_msg *m = &c->msg;

	if (!(c->rule->needs & NEED_IDENTITY) && anonymous(m))
		return 0;
	if (m->job[0] == '\0')
		return fail(c, APS_MSG_FAULT_BAD_JOB, "job name is empty");
	if (m->world_size < 1 || m->world_size > c->lim->max_ranks)
		return fail(c, APS_MSG_FAULT_BAD_RANK,
		            "world size %" PRIu32 " is not in 1..%" PRIu32, m->world_size,
		            c->lim->max_ranks);
	if (m->rank >= m->world_size)
		return fail(c, APS_MSG_FAULT_BAD_RANK,
		            "rank %" PRIu32 " is not below world size %" PRIu32, m->rank,
		            m->world_size);
	for (uint32_t i = 0; i < m->n_waiting_for; i++) {
		if (m->waiting_for[i] >= m->world_size)
			return fail(c, APS_MSG_FAULT_BAD_RANK,
			            "awaited rank %" PRIu32 " is not below world size %" PRIu32,
			            m->waiting_for[i], m->world_size);
	}
	return 0;
}

static int check_tensor_and_step(struct check *c)
{
	const struct aps_msg *m = &c->msg;

	if (m->tensor_id >= c->lim->max_tensors)
		return fail(c, APS_MSG_FAULT_BAD_TENSOR,
		            "tensor id %" PRIu32 " is not below %" PRIu32, m->tensor_id,
		            c->lim->max_tensors);
	if ((c->rule->needs & NEED_NAME) && m->tensor_name[0] == '\0')
		return fail(c, APS_MSG_FAULT_BAD_TENSOR, "tensor name is empty");
	if ((c->rule->needs & NEED_IDS) != 0 &&
	    (m->n_tensor_ids == 0 || m->n_tensor_ids != m->n_exponents))
		return fail(c, APS_MSG_FAULT_BAD_TENSOR,
		            "%" PRIu32 " tensor ids and %" PRIu32
		            " exponents: needs 1 or more, as many",
		            m->n_tensor_ids, m->n_exponents);
	if ((c->rule->needs & NEED_IDS) == 0 && m->n_tensor_ids != 0)
		return fail(c, APS_MSG_FAULT_BAD_TENSOR, "tensor ids on a %s", c->what);
	for (uint32_t i = 0; i < m->n_tensor_ids; i++) {
		if (m->tensor_ids[i] >= c->lim->max_tensors)
			return fail(c, APS_MSG_FAULT_BAD_TENSOR,
			            "tensor id %" PRIu32 " is not below %" PRIu32, m->tensor_ids[i],
			            c->lim->max_tensors);
	}
	/* Steps fit int64 so that the daemon may subtract them. */
	if (m->step > (uint64_t)INT64_MAX)
		return fail(c, APS_MSG_FAULT_BAD_STEP, "step %" PRIu64 " is above 2^63 - 1",
		            m->step);
	return 0;
}

/* The payload's format: BROADCAST is fp32 whatever it says, others their own. */
static int check_format(struct check *c)
{
	const struct aps_msg *m = &c->msg;
	bool fp32_only = c->rule->payload == PAYLOAD_FP32;
	struct aps_format next;

	if (m->format[0] == '\0' && (c->rule->needs & NEED_FORMAT))
		return fail(c, APS_MSG_FAULT_BAD_FORMAT, "format is missing");
	if (m->format[0] != '\0' && aps_format_parse(m->format, &c->fmt) < 0)
		return fail(c, APS_MSG_FAULT_BAD_FORMAT, "format '%s' is unknown", m->format);
	if (fp32_only && m->format[0] != '\0' && !aps_format_is_fp32(&c->fmt))
		return fail(c, APS_MSG_FAULT_BAD_FORMAT, "format is %s, must be fp32", m->format);
	if (fp32_only || m->format[0] == '\0')
		c->fmt = aps_format_fp32();
	if (m->next_format[0] != '\0' &&
	    (m->type != APS_MSG_RESULT || aps_format_parse(m->next_format, &next) < 0))
		return fail(c, APS_MSG_FAULT_BAD_FORMAT, "next format '%s' is not one for a RESULT",
		            m->next_format);
	c->msg.fmt = c->fmt;
	if (m->next_format[0] != '\0')
		c->msg.next_fmt = next;
	return 0;
}

static int check_chunk(struct check *c)
{
	const struct aps_msg *m = &c->msg;

	if (m->total_count > c->lim->max_elements)
		return fail(c, APS_MSG_FAULT_TOO_LARGE,
		            "tensor of %" PRIu64 " elements, limit %" PRIu64, m->total_count,
		            c->lim->max_elements);
	if (m->chunk_count > m->total_count || m->chunk_offset > m->total_count - m->chunk_count)
		return fail(c, APS_MSG_FAULT_BAD_CHUNK,
		            "chunk of %" PRIu64 " elements at %" PRIu64 " overruns %" PRIu64,
		            m->chunk_count, m->chunk_offset, m->total_count);
	if ((c->rule->needs & NEED_COUNT) && m->total_count == 0)
		return fail(c, APS_MSG_FAULT_BAD_CHUNK, "tensor has 0 elements");
	if ((c->rule->needs & NEED_CHUNK) && m->chunk_count == 0)
		return fail(c, APS_MSG_FAULT_BAD_CHUNK, "chunk has 0 elements");
	return 0;
}

/* block_size: a size the codec knows, only where it means something (aps.proto). */
static int check_block(struct check *c)
{
	const struct aps_msg *m = &c->msg;
	bool data = c->rule->payload == PAYLOAD_CODES;

	if (m->block_size == 0)
		return 0;
	if (!aps_codec_block_ok(m->block_size))
		return fail(c, APS_MSG_FAULT_BAD_SCALE,
		            "block size %" PRIu32 " is not 16, 32 or 64", m->block_size);
	if (!data && m->type != APS_MSG_HELLO && m->type != APS_MSG_WELCOME)
		return fail(c, APS_MSG_FAULT_BAD_SCALE, "block size on a %s", c->what);
	if (data && (m->scale_exp != 0 || m->chunk_offset % m->block_size != 0))
		return fail(c, APS_MSG_FAULT_BAD_SCALE,
		            "block-scaled chunk at %" PRIu64 " with scale exponent %" PRId32
		            " (needs a multiple of %" PRIu32 " and 0)",
		            m->chunk_offset, m->scale_exp, m->block_size);
	return 0;
}

static bool scale_in_range(int32_t k)
{
	return k >= -APS_CODEC_SCALE_MAX && k <= APS_CODEC_SCALE_MAX;
}

static int check_scale_flags_error(struct check *c)
{
	const struct aps_msg *m = &c->msg;
	bool is_error = c->rule->needs & NEED_ERROR;

	if (!scale_in_range(m->scale_exp))
		return fail(c, APS_MSG_FAULT_BAD_SCALE, "scale exponent %" PRId32 " is beyond +-%d",
		            m->scale_exp, APS_CODEC_SCALE_MAX);
	for (uint32_t i = 0; i < m->n_exponents; i++) {
		if (!scale_in_range(m->exponents[i]))
			return fail(c, APS_MSG_FAULT_BAD_SCALE,
			            "exponent %" PRId32 " is beyond +-%d", m->exponents[i],
			            APS_CODEC_SCALE_MAX);
	}
	if (m->flags & ~APS_MSG_FLAGS_KNOWN)
		return fail(c, APS_MSG_FAULT_BAD_FLAGS, "unknown flags 0x%" PRIx32,
		            m->flags & ~APS_MSG_FLAGS_KNOWN);
	if ((m->flags & APS_MSG_FLAG_RESUMED) && m->type != APS_MSG_WELCOME)
		return fail(c, APS_MSG_FAULT_BAD_FLAGS, "RESUMED on a %s (a WELCOME's only)",
		            c->what);
	if ((m->flags & APS_MSG_FLAG_RESUME) && (m->type != APS_MSG_HELLO || !m->has_session))
		return fail(c, APS_MSG_FAULT_BAD_FLAGS,
		            "RESUME on a %s (a HELLO's only, with a session token)", c->what);
	if ((m->flags & APS_MSG_FLAG_ALIVE) && m->type != APS_MSG_HEARTBEAT)
		return fail(c, APS_MSG_FAULT_BAD_FLAGS, "ALIVE on a %s (a HEARTBEAT's only)",
		            c->what);
	if (is_error && (m->error_code >= 0 || m->error_text[0] == '\0'))
		return fail(c, APS_MSG_FAULT_BAD_ERROR,
		            "needs a negative code and a text, has %" PRId32, m->error_code);
	if (!is_error && (m->error_code != 0 || m->error_text[0] != '\0'))
		return fail(c, APS_MSG_FAULT_BAD_ERROR, "error code %" PRId32 " on a non-ERROR",
		            m->error_code);
	return 0;
}

static bool expects_payload(const struct check *c)
{
	switch (c->rule->payload) {
	case PAYLOAD_CODES:
		return !(c->msg.flags & APS_MSG_FLAG_SKIP);
	case PAYLOAD_FP32:
		return c->lim->from_server || c->msg.rank == 0;
	case PAYLOAD_NONE:
	default:
		return false;
	}
}

/* A block exponent is int8 within +-APS_SCALE_BLOCK_MAX: -128 would overflow 2^-k. */
static int check_block_exponents(struct check *c)
{
	const struct aps_msg *m = &c->msg;
	size_t at = aps_format_packed_size(&c->fmt, (size_t)m->chunk_count);
	const int8_t *exps = (const int8_t *)(const void *)(c->payload + at);
	size_t n = aps_codec_block_count((size_t)m->chunk_count, m->block_size);

	for (size_t b = 0; b < n; b++) {
		if (exps[b] < -APS_SCALE_BLOCK_MAX)
			return fail(c, APS_MSG_FAULT_BAD_SCALE, "block %zu has exponent %d", b,
			            exps[b]);
	}
	return 0;
}

/* Length against the header and the count, then CRC, then the codes (CRC and codes
 * in one pass over the bytes). */
static int check_payload_bytes(struct check *c)
{
	const struct aps_msg *m = &c->msg;
	size_t need, bad;
	uint32_t crc;

	/* Limits may allow counts whose size in bytes would overflow size_t. */
	if (m->chunk_count > (SIZE_MAX - 7) / c->fmt.bits)
		return fail(c, APS_MSG_FAULT_TOO_LARGE, "chunk of %" PRIu64 " elements",
		            m->chunk_count);
	need = aps_format_packed_size(&c->fmt, (size_t)m->chunk_count) +
	       aps_codec_block_count((size_t)m->chunk_count, m->block_size);
	if (c->wire_len != c->payload_len)
		return fail(c, APS_MSG_FAULT_BAD_LENGTH,
		            "payload is %zu bytes, header says %" PRIu64, c->payload_len,
		            c->wire_len);
	if (c->payload_len != need)
		return fail(c, APS_MSG_FAULT_BAD_LENGTH,
		            "payload is %zu bytes, %" PRIu64 " %s codes%s need %zu", c->payload_len,
		            m->chunk_count, c->fmt.name, m->block_size ? " and exponents" : "",
		            need);
	if (m->flags & APS_MSG_FLAG_NO_CRC) {
		if (c->wire_crc != 0)
			return fail(c, APS_MSG_FAULT_BAD_CRC,
			            "payload flagged NO_CRC has CRC32C 0x%08" PRIx32
			            " in its header",
			            c->wire_crc);
		bad = aps_codec_count_nonfinite(&c->fmt, c->payload, (size_t)m->chunk_count);
		crc = 0;
	} else {
		bad = aps_codec_crc_nonfinite(&c->fmt, c->payload, c->payload_len,
		                              (size_t)m->chunk_count, &crc);
	}
	if (crc != c->wire_crc)
		return fail(c, APS_MSG_FAULT_BAD_CRC,
		            "payload CRC32C is 0x%08" PRIx32 ", header says 0x%08" PRIx32, crc,
		            c->wire_crc);
	if (bad > 0)
		return fail(c, APS_MSG_FAULT_NONFINITE, "payload holds %zu inf or NaN %s codes",
		            bad, c->fmt.name);
	return check_block_exponents(c);
}

static int check_payload(struct check *c)
{
	bool expected = expects_payload(c);

	if (expected && !c->has_payload)
		return fail(c, APS_MSG_FAULT_MISSING_PAYLOAD, "payload frame is missing");
	if (!expected && c->has_payload)
		return fail(c, APS_MSG_FAULT_UNEXPECTED_PAYLOAD, "has a payload frame of %zu bytes",
		            c->payload_len);
	if (!expected && (c->wire_len != 0 || c->wire_crc != 0))
		return fail(c, APS_MSG_FAULT_BAD_LENGTH,
		            "header describes a %" PRIu64 "-byte payload that is not there",
		            c->wire_len);
	if (!expected)
		return 0;
	return check_payload_bytes(c);
}

static int check_fields(struct check *c)
{
	int ret = check_identity(c);

	if (ret == 0)
		ret = check_tensor_and_step(c);
	if (ret == 0)
		ret = check_format(c);
	if (ret == 0)
		ret = check_chunk(c);
	if (ret == 0)
		ret = check_scale_flags_error(c);
	if (ret == 0)
		ret = check_block(c);
	if (ret == 0)
		ret = check_payload(c);
	return ret;
}

/* Unpacks, checks what the C struct cannot hold, copies, frees. */
static int decode(struct check *c, const uint8_t *hdr, size_t hdr_len)
{
	static const uint8_t empty[1];
	Aps__Envelope *env;
	int ret;

	if (hdr_len > c->lim->max_header)
		return fail(c, APS_MSG_FAULT_TOO_LARGE, "header is %zu bytes, limit %zu", hdr_len,
		            c->lim->max_header);
	env = aps__envelope__unpack(NULL, hdr_len, hdr_len ? hdr : empty);
	if (env == NULL)
		return fail(c, APS_MSG_FAULT_BAD_HEADER, "%zu bytes are not an Envelope", hdr_len);
	ret = check_envelope(c, env);
	if (ret == 0) {
		aps_envelope_to_msg(env, &c->msg);
		c->wire_len = env->payload_len;
		c->wire_crc = env->payload_crc32c;
	}
	aps__envelope__free_unpacked(env, NULL);
	return ret;
}

int aps_msg_parse(const struct aps_msg_limits *lim, const uint8_t *hdr, size_t hdr_len,
                  const uint8_t *payload, size_t payload_len, bool has_payload, struct aps_msg *out,
                  struct aps_msg_fault *fault)
{
	struct check c = { .lim = lim, .fault = fault, .what = "header" };
	int ret;

	if (lim == NULL || out == NULL || (hdr == NULL && hdr_len > 0) ||
	    (has_payload && payload == NULL && payload_len > 0))
		return APS_EINVAL;
	c.has_payload = has_payload;
	c.payload = has_payload ? payload : NULL;
	c.payload_len = has_payload ? payload_len : 0;
	if (fault != NULL)
		memset(fault, 0, sizeof(*fault));
	ret = decode(&c, hdr, hdr_len);
	if (ret == 0)
		ret = check_fields(&c);
	if (ret < 0)
		return ret;
	c.msg.payload = c.payload;
	c.msg.payload_len = c.payload_len;
	*out = c.msg;
	return 0;
}
