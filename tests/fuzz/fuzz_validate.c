/*
 * libFuzzer harness of the message validator, aps_msg_parse (docs/FUZZING.md).
 * An input is a header frame and a payload frame: bytes 0-1 (little-endian)
 * hold the header length in bits 0-13, "tight limits" in bit 14 (small enough
 * for short inputs to exceed each one) and "a payload frame is present" in
 * bit 15; the header follows (cut at the end of the input) and the payload is
 * the rest. Each frame gets its own exact-size heap copy so that ASan sees a
 * read past either. Both directions are parsed, with and without a fault
 * struct. A message that parses must pack and parse back to the same struct
 * aps_msg and pack again to the same bytes; any broken rule aborts.
 */
#include "common/err.h"
#include "proto/frame.h"
#include "proto/validate.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HAS_PAYLOAD  0x8000u
#define TIGHT_LIMITS 0x4000u
#define HDR_LEN_MASK 0x3fffu

#define CHECK(cond) check((cond), #cond, __LINE__)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The two frames of one input, each in its own heap block (NULL when empty). */
struct frames {
	uint8_t *hdr;
	size_t hdr_len;
	uint8_t *payload;
	size_t payload_len;
	bool has_payload;
	bool tight; /* parse under tight limits instead of the defaults */
};

static void check(bool ok, const char *what, int line)
{
	if (ok)
		return;
	fprintf(stderr, "fuzz_validate.c:%d: broken rule: %s\n", line, what);
	abort();
}

static uint8_t *copy_bytes(const uint8_t *p, size_t n)
{
	uint8_t *q;

	if (n == 0)
		return NULL;
	q = malloc(n);
	CHECK(q != NULL);
	memcpy(q, p, n);
	return q;
}

static void split(const uint8_t *data, size_t size, struct frames *f)
{
	unsigned word = size >= 2 ? (unsigned)data[0] | (unsigned)data[1] << 8 : 0;
	size_t rest = size >= 2 ? size - 2 : 0;

	f->hdr_len = word & HDR_LEN_MASK;
	if (f->hdr_len > rest)
		f->hdr_len = rest;
	f->has_payload = (word & HAS_PAYLOAD) != 0;
	f->tight = (word & TIGHT_LIMITS) != 0;
	f->payload_len = rest - f->hdr_len;
	f->hdr = copy_bytes(data + 2, f->hdr_len);
	f->payload = copy_bytes(data + 2 + f->hdr_len, f->payload_len);
}

/* The name of the first field where a and b differ, or NULL. */
static const char *first_difference(const struct aps_msg *a, const struct aps_msg *b)
{
#define SAME(f)     (a->f == b->f)
#define SAME_STR(f) (strcmp(a->f, b->f) == 0)
#define SAME_LIST(n, f)                              \
	(a->n == b->n && a->n <= APS_MSG_LIST_MAX && \
	 memcmp(a->f, b->f, a->n * sizeof(a->f[0])) == 0)
#define DIFF_IF_NOT(cond, name) \
	if (!(cond))            \
		return name;
	DIFF_IF_NOT(SAME(version_major) && SAME(version_minor) && SAME(type), "version or type");
	DIFF_IF_NOT(SAME_STR(job) && SAME(rank) && SAME(world_size), "identity");
	DIFF_IF_NOT(SAME(tensor_id) && SAME_STR(tensor_name) && SAME(step), "tensor or step");
	DIFF_IF_NOT(SAME(chunk_offset) && SAME(chunk_count) && SAME(total_count), "chunk");
	DIFF_IF_NOT(SAME_STR(format) && SAME(scale_exp) && SAME(scaling), "format or scale");
	DIFF_IF_NOT(SAME(flags) && SAME(flushed), "flags or flushed");
	DIFF_IF_NOT(SAME(error_code) && SAME_STR(error_text), "error");
	DIFF_IF_NOT(SAME_LIST(n_waiting_for, waiting_for), "waiting_for");
	DIFF_IF_NOT(SAME_LIST(n_exponents, exponents), "exponents");
	DIFF_IF_NOT(SAME_LIST(n_tensor_ids, tensor_ids), "tensor_ids");
	DIFF_IF_NOT(SAME(payload) && SAME(payload_len), "payload");
	return NULL;
#undef SAME
#undef SAME_STR
#undef SAME_LIST
#undef DIFF_IF_NOT
}

/* What aps_msg_parse promises about its result and its fault. */
static void check_outcome(int ret, const struct aps_msg_fault *fault)
{
	CHECK(ret == 0 || ret == APS_EPROTO);
	if (ret == 0) {
		CHECK(fault->kind == APS_MSG_FAULT_NONE);
		return;
	}
	CHECK(fault->kind > APS_MSG_FAULT_NONE && fault->kind < APS_MSG_FAULT_COUNT);
	CHECK(strcmp(aps_msg_fault_name(fault->kind), "unknown") != 0);
	CHECK(strcmp(aps_msg_fault_text(fault->kind), "unknown fault") != 0);
	CHECK(memchr(fault->text, '\0', sizeof(fault->text)) != NULL);
	CHECK(fault->text[0] != '\0');
}

static int parse(const struct aps_msg_limits *lim, const uint8_t *hdr, size_t hdr_len,
                 const struct frames *f, struct aps_msg *out)
{
	struct aps_msg_fault fault;
	struct aps_msg quiet;
	int ret = aps_msg_parse(lim, hdr, hdr_len, f->payload, f->payload_len, f->has_payload, out,
	                        &fault);

	check_outcome(ret, &fault);
	CHECK(aps_msg_parse(lim, hdr, hdr_len, f->payload, f->payload_len, f->has_payload, &quiet,
	                    NULL) == ret);
	return ret;
}

/* A parsed m packs, parses back to itself and packs again to the same bytes. */
static void round_trip(const struct aps_msg_limits *lim, const struct frames *f,
                       const struct aps_msg *m)
{
	uint8_t *first, *second;
	size_t first_len, second_len;
	struct aps_msg again;
	const char *diff;

	CHECK(aps_msg_pack_alloc(m, &first, &first_len) == 0);
	CHECK(parse(lim, first, first_len, f, &again) == 0);
	diff = first_difference(m, &again);
	if (diff != NULL)
		fprintf(stderr, "fuzz_validate: %s differs after a round trip\n", diff);
	CHECK(diff == NULL);
	CHECK(aps_msg_pack_alloc(&again, &second, &second_len) == 0);
	CHECK(first_len == second_len && memcmp(first, second, first_len) == 0);
	free(second);
	free(first);
}

/* The defaults, or limits that inputs of a few hundred bytes can exceed. */
static void set_limits(struct aps_msg_limits *lim, bool from_server, bool tight)
{
	aps_msg_limits_init(lim);
	lim->from_server = from_server;
	if (!tight)
		return;
	lim->max_header = 256;
	lim->max_ranks = 8;
	lim->max_tensors = 16;
	lim->max_elements = 4096;
}

static void parse_as(bool from_server, const struct frames *f)
{
	struct aps_msg_limits lim;
	struct aps_msg m;

	set_limits(&lim, from_server, f->tight);
	if (parse(&lim, f->hdr, f->hdr_len, f, &m) == 0)
		round_trip(&lim, f, &m);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct frames f;

	split(data, size, &f);
	parse_as(false, &f);
	parse_as(true, &f);
	free(f.payload);
	free(f.hdr);
	return 0;
}
