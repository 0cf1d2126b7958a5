/*
 * One apsd message as plain C: struct aps_msg is what server/ and worker/ fill
 * and read; they never see protobuf-c types. frame.c encodes it into the
 * header frame (frame 0, a protobuf Envelope, proto/aps.proto); the payload
 * (frame 1) travels as its own ZeroMQ frame and is only described here.
 * Bytes from a peer are decoded and checked by aps_msg_parse (proto/validate.h).
 */
#ifndef APS_PROTO_FRAME_H
#define APS_PROTO_FRAME_H

#include "common/format.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_PROTO_VERSION_MAJOR 1
#define APS_PROTO_VERSION_MINOR 11
/* The oldest minor apsd lets join: 1.6 brought keepalives and session tokens. */
#define APS_PROTO_VERSION_MINOR_JOIN 6
/* The first minor whose clients answer AGAIN: an early PUSH apsd declines waits for it. */
#define APS_PROTO_VERSION_MINOR_AGAIN 10

#define APS_MSG_JOB_MAX     64  /* bytes of a job name, NUL excluded */
#define APS_MSG_NAME_MAX    255 /* bytes of a tensor name, NUL excluded */
#define APS_MSG_TEXT_MAX    255 /* bytes of an error text, NUL excluded */
#define APS_MSG_LIST_MAX    256 /* entries of waiting_for and of exponents */
#define APS_MSG_OPTIM_MAX   127 /* bytes of an optimizer spec, NUL excluded */
#define APS_MSG_TOKEN_MAX   128 /* bytes of a job token, NUL excluded */
#define APS_MSG_SESSION_LEN 16  /* bytes of a session token */

/* What any apsd takes whatever its configuration: clients check these before joining. */
#define APS_MSG_RANKS_MAX    65536               /* world size (apsd's max_ranks at most) */
#define APS_MSG_ELEMENTS_MAX (UINT64_C(1) << 32) /* elements of a tensor */

/* Envelope.flags bits (aps.proto); every other bit is rejected. */
#define APS_MSG_FLAG_SKIP        (1u << 0) /* PUSH/RESULT: no data, no payload frame */
#define APS_MSG_FLAG_LOWP_SUM    (1u << 1) /* sum in the low-precision format */
#define APS_MSG_FLAG_POLICY_AUTO (1u << 2) /* HELLO: the automatic precision policy */
#define APS_MSG_FLAG_UPDATE      (1u << 3) /* optimize mode: PUSH a gradient, RESULT an update */
#define APS_MSG_FLAG_REJOIN      (1u << 4) /* REGISTER: step is where this rank is */
#define APS_MSG_FLAG_RESUMED     (1u << 5) /* WELCOME: the connection came back (1.5) */
#define APS_MSG_FLAG_RESUME      (1u << 6) /* HELLO: take the session `session` back (1.6) */
#define APS_MSG_FLAG_ALIVE       (1u << 7) /* HEARTBEAT: about no call, liveness only (1.6) */
/* HELLO: the job's payloads travel without CRC32C; a message with a payload: its
 * payload_crc32c was not taken and is 0 (1.8) */
#define APS_MSG_FLAG_NO_CRC (1u << 8)
#define APS_MSG_FLAGS_KNOWN                                                                       \
	(APS_MSG_FLAG_SKIP | APS_MSG_FLAG_LOWP_SUM | APS_MSG_FLAG_POLICY_AUTO |                   \
	 APS_MSG_FLAG_UPDATE | APS_MSG_FLAG_REJOIN | APS_MSG_FLAG_RESUMED | APS_MSG_FLAG_RESUME | \
	 APS_MSG_FLAG_ALIVE | APS_MSG_FLAG_NO_CRC)

/* aps_msg.scaling when the sender states no mode (the job's default). */
#define APS_MSG_SCALING_UNSET (-1)

/* Message types; the values are the MsgType numbers of aps.proto. */
#define APS_MSG_TYPE_MAP(X) \
	X(HELLO, 1)         \
	X(WELCOME, 2)       \
	X(REGISTER, 3)      \
	X(REGISTERED, 4)    \
	X(PUSH, 5)          \
	X(RESULT, 6)        \
	X(BROADCAST, 7)     \
	X(BARRIER, 8)       \
	X(HEARTBEAT, 9)     \
	X(BYE, 10)          \
	X(ERROR, 11)        \
	X(EXPONENTS, 12)    \
	X(SCALES, 13)       \
	X(PULL, 14)         \
	X(WEIGHTS, 15)      \
	X(AGAIN, 16)

enum aps_msg_type {
	APS_MSG_UNSPECIFIED = 0,
#define APS_MSG_TYPE_ENUM(name, value) APS_MSG_##name = (value),
	APS_MSG_TYPE_MAP(APS_MSG_TYPE_ENUM)
#undef APS_MSG_TYPE_ENUM
	APS_MSG_TYPE_COUNT
};

/*
 * Fields a type does not use are zero (aps_msg_init). Counts and offsets are
 * in elements. Strings are NUL-terminated.
 */
struct aps_msg {
	uint32_t version_major;
	uint32_t version_minor;
	enum aps_msg_type type;
	char job[APS_MSG_JOB_MAX + 1];
	uint32_t rank;
	uint32_t world_size;
	uint32_t tensor_id;
	char tensor_name[APS_MSG_NAME_MAX + 1];
	uint64_t step;
	uint64_t chunk_offset;
	uint64_t chunk_count;
	uint64_t total_count; /* elements of the whole tensor */
	char format[APS_FORMAT_NAME_MAX];
	char next_format[APS_FORMAT_NAME_MAX]; /* RESULT: the policy's next format, or "" */
	/* Set by aps_msg_parse, the one place a received format is a name: format
	 * (fp32 when absent, and for a type whose payload is always fp32), and
	 * next_format (when next_format[0]). Packing reads the names only. */
	struct aps_format fmt, next_fmt;
	enum aps_msg_type about_type; /* ERROR: the type it answers, or 0 */
	int32_t scale_exp;
	int scaling;    /* enum aps_scaling (common/scale.h) or APS_MSG_SCALING_UNSET */
	uint32_t flags; /* APS_MSG_FLAG_* */
	uint64_t flushed;
	int32_t error_code; /* ERROR: negative APS_E* code */
	char error_text[APS_MSG_TEXT_MAX + 1];
	uint32_t n_waiting_for;
	uint32_t waiting_for[APS_MSG_LIST_MAX]; /* ERROR: ranks still awaited */
	uint32_t n_exponents;
	int32_t exponents[APS_MSG_LIST_MAX]; /* EXPONENTS/SCALES: one per tensor_ids[i] */
	uint32_t n_tensor_ids;
	uint32_t tensor_ids[APS_MSG_LIST_MAX];
	char optimizer[APS_MSG_OPTIM_MAX + 1]; /* HELLO/WELCOME: "" all-reduce, else optimize */
	float lr;                              /* PUSH with APS_MSG_FLAG_UPDATE */
	uint64_t updates; /* REGISTERED, WEIGHTS: the tensor's optimizer updates */
	/* 1.6: WELCOME and HELLO flagged RESUME; all zero when absent */
	uint8_t session[APS_MSG_SESSION_LEN];
	bool has_session;
	char job_token[APS_MSG_TOKEN_MAX + 1]; /* HELLO: "" none */
	uint64_t max_message_bytes;            /* WELCOME */
	uint32_t keepalive_ms;                 /* WELCOME */
	/* 1.7: HELLO/WELCOME the job's block size; PUSH/RESULT non-zero when the
	 * payload is block-scaled (codes, then one int8 exponent per block) */
	uint32_t block_size;
	/* 1.9: ERROR to a HELLO refused while the job's left ranks keep their places:
	 * the job's name is free within this many ms (0: not that refusal) */
	uint32_t retry_after_ms;
	/*
	 * Frame 1, borrowed: NULL when the message has no payload frame. Packing
	 * writes payload_len and the CRC32C of these bytes into the header.
	 */
	const uint8_t *payload;
	size_t payload_len;
};

/* Zeroes m and sets type, our protocol version and APS_MSG_SCALING_UNSET. */
void aps_msg_init(struct aps_msg *m, enum aps_msg_type type);

/* "PUSH" for APS_MSG_PUSH; "UNKNOWN" for a value outside the enum. */
const char *aps_msg_type_name(int type);

/*
 * Bytes of the header frame aps_msg_pack writes for m, or 0 when m cannot be
 * encoded (list counts above APS_MSG_LIST_MAX, a payload_len without payload).
 */
size_t aps_msg_packed_size(const struct aps_msg *m);

/*
 * Encodes m into buf (cap bytes) and sets *len to the bytes written. Reads
 * the payload to checksum it. Returns 0, APS_EINVAL when m cannot be encoded,
 * or APS_ESHORT when cap < aps_msg_packed_size(m). Checks no value range:
 * that is the receiver's aps_msg_parse.
 */
int aps_msg_pack(const struct aps_msg *m, uint8_t *buf, size_t cap, size_t *len);

/* aps_msg_pack with the payload's CRC32C already known (it does not read the payload). */
int aps_msg_pack_with_crc(const struct aps_msg *m, uint32_t payload_crc, uint8_t *buf, size_t cap,
                          size_t *len);

/*
 * Like aps_msg_pack into a buffer allocated with malloc; on success *out
 * (freed by the caller with free) and *len are set. Returns 0, APS_EINVAL or
 * APS_ENOMEM.
 */
int aps_msg_pack_alloc(const struct aps_msg *m, uint8_t **out, size_t *len);

#endif
