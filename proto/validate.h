/*
 * The one gate for bytes from a peer: aps_msg_parse decodes a header frame
 * and its payload frame into a struct aps_msg and checks every field that can
 * be checked without state (ranges, identity, formats, chunk bounds, payload
 * length, CRC32C, non-finite codes). Code past it may trust those ranges;
 * whether a rank, tensor or step is the expected one is the session's and the
 * round's business.
 */
#ifndef APS_PROTO_VALIDATE_H
#define APS_PROTO_VALIDATE_H

#include "proto/frame.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/*
 * Kinds of bad message, one counter each in the daemon's stats (which
 * iterate this list). X(NAME, "stats name", "what it means").
 */
#define APS_MSG_FAULT_MAP(X)                                                                \
	X(BAD_HEADER, "bad_header", "header frame is not a protobuf Envelope")              \
	X(TOO_LARGE, "too_large", "header, list or tensor above the configured limit")      \
	X(BAD_VERSION, "bad_version", "another protocol major version")                     \
	X(BAD_TYPE, "bad_type", "unknown type, or not one this sender may send")            \
	X(BAD_JOB, "bad_job", "job name empty, too long or not visible ASCII")              \
	X(BAD_RANK, "bad_rank", "rank, world size or awaited rank out of range")            \
	X(BAD_TENSOR, "bad_tensor", "tensor id out of range or bad tensor name")            \
	X(BAD_STEP, "bad_step", "step out of range")                                        \
	X(BAD_FORMAT, "bad_format", "format missing or unknown")                            \
	X(BAD_CHUNK, "bad_chunk", "chunk offset and count outside the tensor")              \
	X(BAD_SCALE, "bad_scale", "scale exponent or scaling mode out of range")            \
	X(BAD_FLAGS, "bad_flags", "unknown flag bits")                                      \
	X(BAD_ERROR, "bad_error", "ERROR without a negative code and a one-line text")      \
	X(MISSING_PAYLOAD, "missing_payload", "data type without its payload frame")        \
	X(UNEXPECTED_PAYLOAD, "unexpected_payload", "payload frame on a type without data") \
	X(BAD_LENGTH, "bad_length", "payload length differs from header or count")          \
	X(BAD_CRC, "bad_crc", "payload CRC32C differs from the header")                     \
	X(NONFINITE, "nonfinite", "inf or NaN inside a payload")                            \
	X(BAD_OPTIMIZER, "bad_optimizer", "optimizer spec or learning rate out of range")   \
	X(BAD_TOKEN, "bad_token", "session or job token malformed, or on the wrong type")

enum aps_msg_fault_kind {
	APS_MSG_FAULT_NONE = 0,
#define APS_MSG_FAULT_ENUM(name, stat, text) APS_MSG_FAULT_##name,
	APS_MSG_FAULT_MAP(APS_MSG_FAULT_ENUM)
#undef APS_MSG_FAULT_ENUM
	APS_MSG_FAULT_COUNT
};

/* What was wrong: a kind to count and one line to send back in an ERROR. */
struct aps_msg_fault {
	enum aps_msg_fault_kind kind;
	char text[192]; /* e.g. "PUSH: payload is 100 bytes, 101 e4m3 codes need 101" */
};

/* Bounds from the configuration; aps_msg_limits_init sets the defaults. */
struct aps_msg_limits {
	size_t max_header;     /* bytes of a header frame */
	uint32_t max_ranks;    /* largest world_size */
	uint32_t max_tensors;  /* tensor ids are below this */
	uint64_t max_elements; /* largest total_count of a tensor */
	bool from_server;      /* false: the daemon parses a worker's message;
	                          true: a worker parses the daemon's */
};

/* Defaults: 16 KiB headers, 4096 ranks, 65536 tensors, 2^32 elements, from workers. */
void aps_msg_limits_init(struct aps_msg_limits *lim);

/*
 * Decodes the header frame hdr and checks it with its payload frame (present
 * when has_payload; payload may be NULL when payload_len is 0). On success
 * returns 0 and fills *out, whose payload borrows the payload argument. On a
 * bad message returns APS_EPROTO, leaves *out unspecified and, when fault is
 * not NULL, fills it. Returns APS_EINVAL for a NULL lim, hdr (with hdr_len >
 * 0) or out. Never reads outside the given buffers.
 */
int aps_msg_parse(const struct aps_msg_limits *lim, const uint8_t *hdr, size_t hdr_len,
                  const uint8_t *payload, size_t payload_len, bool has_payload, struct aps_msg *out,
                  struct aps_msg_fault *fault);

/* "bad_crc" for APS_MSG_FAULT_BAD_CRC; "none" or "unknown" otherwise. */
const char *aps_msg_fault_name(enum aps_msg_fault_kind kind);

/* One-line English description of a kind (for apsctl and logs). */
const char *aps_msg_fault_text(enum aps_msg_fault_kind kind);

#endif
