/*
 * Writes the seed corpus of fuzz_validate into a directory: a valid message of
 * every type as its sender builds it (every format for the data types), then
 * a few edge cases (largest lists and one entry more, a bad CRC, a NaN code,
 * no header). Each file is in fuzz_validate's input layout: a 2-byte
 * little-endian word (header length; bit 14 set for tight limits, bit 15 when
 * a payload frame is present), the header, the payload. Usage: make_seeds DIR
 * (tests/fuzz/corpus/validate).
 */
#include "common/codec.h"
#include "common/err.h"
#include "common/scale.h"
#include "proto/frame.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define HAS_PAYLOAD  0x8000u
#define TIGHT_LIMITS 0x4000u
#define CHUNK        37 /* elements of a data chunk: not a multiple of 8 */
#define PAYLOAD_MAX  (CHUNK * 4)

static const char *out_dir;
static int failures;

/* One seed: the message, and what goes on the wire after its header. */
struct seed {
	struct aps_msg m;
	uint8_t payload[PAYLOAD_MAX];
	bool has_payload;
	bool corrupt;     /* flip a payload bit after packing: a CRC mismatch */
	bool tight;       /* parsed under fuzz_validate's tight limits */
	uint8_t extra[4]; /* raw bytes appended to the packed header */
	size_t n_extra;
};

static void write_seed(const char *name, const struct seed *s)
{
	uint8_t hdr[8192], payload[PAYLOAD_MAX];
	unsigned flags = (s->has_payload ? HAS_PAYLOAD : 0) | (s->tight ? TIGHT_LIMITS : 0);
	size_t len = 0;
	char path[4096];
	FILE *f;
	uint8_t word[2];

	if (aps_msg_pack(&s->m, hdr, sizeof(hdr) - sizeof(s->extra), &len) < 0) {
		fprintf(stderr, "make_seeds: %s: cannot pack\n", name);
		failures++;
		return;
	}
	memcpy(hdr + len, s->extra, s->n_extra);
	len += s->n_extra;
	memcpy(payload, s->payload, sizeof(payload));
	payload[0] ^= s->corrupt ? 1 : 0;
	word[0] = (uint8_t)(len & 0xff);
	word[1] = (uint8_t)((len | flags) >> 8);
	snprintf(path, sizeof(path), "%s/%s", out_dir, name);
	f = fopen(path, "wb");
	if (f == NULL || fwrite(word, 1, 2, f) != 2 || fwrite(hdr, 1, len, f) != len ||
	    (s->has_payload && fwrite(payload, 1, s->m.payload_len, f) != s->m.payload_len)) {
		perror(path);
		failures++;
	}
	if (f != NULL && fclose(f) != 0)
		failures++;
}

static void identity(struct seed *s, enum aps_msg_type type)
{
	memset(s, 0, sizeof(*s));
	aps_msg_init(&s->m, type);
	strcpy(s->m.job, "default");
	s->m.rank = 1;
	s->m.world_size = 4;
}

/* A chunk of CHUNK elements at offset 100 of 1000, quantized to format. */
static void chunk(struct seed *s, const char *format)
{
	struct aps_quant_opts opts = { .scale_exp = 3 };
	struct aps_format f;
	float x[CHUNK];

	for (int i = 0; i < CHUNK; i++)
		x[i] = (float)(i - CHUNK / 2) / 7.0f;
	if (aps_format_parse(format, &f) < 0) {
		fprintf(stderr, "make_seeds: format %s\n", format);
		exit(1);
	}
	s->m.tensor_id = 3;
	s->m.step = 42;
	s->m.chunk_offset = 100;
	s->m.chunk_count = CHUNK;
	s->m.total_count = 1000;
	strcpy(s->m.format, format);
	s->m.scale_exp = opts.scale_exp;
	s->m.payload_len = aps_format_packed_size(&f, CHUNK);
	if (aps_codec_quantize(&f, x, CHUNK, &opts, s->payload, sizeof(s->payload), NULL) < 0)
		exit(1);
	s->m.payload = s->payload;
	s->has_payload = true;
}

/* Protocol 1.7: a block-scaled chunk, the codes then one exponent per block of 32. */
static void block_seed(enum aps_msg_type type, const char *prefix, const char *format)
{
	struct aps_quant_opts opts = { 0 };
	struct aps_format f;
	float x[CHUNK];
	char name[64];
	struct seed s;

	for (int i = 0; i < CHUNK; i++)
		x[i] = (float)(i - CHUNK / 2) * (i < 32 ? 1e-6f : 3.0f);
	identity(&s, type);
	chunk(&s, format);
	aps_format_parse(format, &f);
	s.m.chunk_offset = 64;
	s.m.scale_exp = 0;
	s.m.block_size = 32;
	s.m.payload_len = aps_codec_payload_size(&f, CHUNK, 32);
	if (aps_codec_encode_payload(&f, x, CHUNK, 32, &opts, s.payload, sizeof(s.payload), NULL) <
	    0)
		exit(1);
	snprintf(name, sizeof(name), "%s-block-%s", prefix, format);
	write_seed(name, &s);
}

static void data_seeds(enum aps_msg_type type, const char *prefix)
{
	static const char *const formats[] = { "e4m3", "e5m2", "e4m3fn", "e3m0", "fp16",
		                               "bf16", "e2m1", "e8m7",   "fp32" };
	char name[64];
	struct seed s;

	for (size_t i = 0; i < sizeof(formats) / sizeof(formats[0]); i++) {
		identity(&s, type);
		chunk(&s, formats[i]);
		snprintf(name, sizeof(name), "%s-%s", prefix, formats[i]);
		write_seed(name, &s);
	}
	identity(&s, type);
	chunk(&s, "e4m3");
	s.m.flags = APS_MSG_FLAG_SKIP;
	s.m.payload = NULL;
	s.m.payload_len = 0;
	s.has_payload = false;
	snprintf(name, sizeof(name), "%s-skip", prefix);
	write_seed(name, &s);
	block_seed(type, prefix, "fp4");
	block_seed(type, prefix, "e4m3");
}

static void list_seed(const char *name, enum aps_msg_type type, uint32_t n)
{
	struct seed s;

	identity(&s, type);
	s.m.n_tensor_ids = s.m.n_exponents = n;
	for (uint32_t i = 0; i < n; i++) {
		s.m.tensor_ids[i] = i * 7;
		s.m.exponents[i] = i == 1 ? -APS_CODEC_SCALE_MAX : (int32_t)i - 12;
	}
	write_seed(name, &s);
}

static void error_seed(const char *name, uint32_t version, bool anonymous, uint32_t waiting)
{
	struct seed s;

	identity(&s, APS_MSG_ERROR);
	if (anonymous) {
		s.m.job[0] = '\0';
		s.m.world_size = 0;
		s.m.rank = 0;
	}
	s.m.version_major = version;
	s.m.error_code = APS_ETIMEDOUT;
	strcpy(s.m.error_text, "timed out: waiting for ranks 2 3");
	s.m.n_waiting_for = waiting;
	for (uint32_t i = 0; i < waiting; i++)
		s.m.waiting_for[i] = i % 4;
	write_seed(name, &s);
}

static void control_seeds(void)
{
	static const struct {
		const char *name;
		enum aps_msg_type type;
	} plain[] = { { "hello", APS_MSG_HELLO },
		      { "welcome", APS_MSG_WELCOME },
		      { "barrier", APS_MSG_BARRIER },
		      { "heartbeat", APS_MSG_HEARTBEAT },
		      { "bye", APS_MSG_BYE } };
	struct seed s;

	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++) {
		identity(&s, plain[i].type);
		s.m.step = plain[i].type == APS_MSG_BARRIER ? 3 : 0;
		s.m.scaling = plain[i].type == APS_MSG_HELLO ? APS_SCALING_GLOBAL : s.m.scaling;
		write_seed(plain[i].name, &s);
	}
	for (int type = APS_MSG_REGISTER; type <= APS_MSG_REGISTERED; type++) {
		identity(&s, (enum aps_msg_type)type);
		s.m.tensor_id = type == APS_MSG_REGISTERED ? 7 : 0;
		strcpy(s.m.tensor_name, "layers.0.attn.weight");
		s.m.total_count = 1000;
		strcpy(s.m.format, "e4m3");
		write_seed(type == APS_MSG_REGISTER ? "register" : "registered", &s);
	}
	list_seed("exponents", APS_MSG_EXPONENTS, 2);
	list_seed("scales", APS_MSG_SCALES, 3);
	error_seed("error", APS_PROTO_VERSION_MAJOR, false, 2);
	error_seed("error-anonymous", APS_PROTO_VERSION_MAJOR, true, 0);
	error_seed("error-version2", 2, true, 0);
	/* protocol 1.4: optimize mode, and a worker that joins a restarted daemon again */
	identity(&s, APS_MSG_HELLO);
	strcpy(s.m.optimizer, "adam,beta2=0.99,weight_decay=0.0001");
	write_seed("hello-optimizer", &s);
	identity(&s, APS_MSG_REGISTER);
	strcpy(s.m.tensor_name, "fc.weight");
	s.m.total_count = 1000;
	s.m.flags = APS_MSG_FLAG_REJOIN;
	s.m.step = 12;
	write_seed("register-rejoin", &s);
	identity(&s, APS_MSG_PULL);
	s.m.tensor_id = 3;
	write_seed("pull", &s);
}

/* Optimize mode: a gradient for the daemon's optimizer, and its weights coming back. */
static void optimize_seeds(void)
{
	struct seed s;

	identity(&s, APS_MSG_PUSH);
	chunk(&s, "e4m3");
	s.m.flags = APS_MSG_FLAG_UPDATE;
	s.m.lr = 0.1f;
	write_seed("push-update", &s);
	identity(&s, APS_MSG_WEIGHTS);
	chunk(&s, "fp32");
	s.m.updates = 40;
	write_seed("weights", &s);
}

static void broadcast_seeds(void)
{
	struct seed s;

	identity(&s, APS_MSG_BROADCAST);
	s.m.rank = 0;
	chunk(&s, "fp32");
	s.m.format[0] = '\0'; /* BROADCAST is fp32 whatever it says */
	write_seed("broadcast-rank0", &s);
	identity(&s, APS_MSG_BROADCAST);
	chunk(&s, "fp32");
	write_seed("broadcast-fp32", &s);
	identity(&s, APS_MSG_BROADCAST);
	chunk(&s, "fp32");
	s.m.payload = NULL;
	s.m.payload_len = 0;
	s.has_payload = false;
	write_seed("broadcast-rank1", &s); /* the daemon relays it without payload */
}

/* Over each limit: one list entry more than struct aps_msg holds, then the tight limits. */
static void tight_seeds(void)
{
	static const uint8_t one_more_rank[] = { 0xb0, 0x01, 0x01 }; /* waiting_for (22) = 1 */
	struct seed s;

	identity(&s, APS_MSG_ERROR);
	s.m.error_code = APS_ETIMEDOUT;
	strcpy(s.m.error_text, "timed out");
	s.m.n_waiting_for = APS_MSG_LIST_MAX;
	memcpy(s.extra, one_more_rank, sizeof(one_more_rank));
	s.n_extra = sizeof(one_more_rank);
	write_seed("error-waiting-257", &s);
	identity(&s, APS_MSG_PUSH);
	chunk(&s, "e4m3");
	s.tight = true;
	write_seed("push-tight", &s);
	s.m.total_count = 4096;
	s.m.chunk_offset = 4096 - CHUNK;
	write_seed("push-tight-last", &s);
}

/* Valid headers with bad payloads, and inputs that are no message at all. */
static void edge_seeds(void)
{
	struct seed s;

	list_seed("exponents-max", APS_MSG_EXPONENTS, APS_MSG_LIST_MAX);
	error_seed("error-waiting-max", APS_PROTO_VERSION_MAJOR, false, APS_MSG_LIST_MAX);
	tight_seeds();
	identity(&s, APS_MSG_PUSH);
	chunk(&s, "e4m3");
	s.m.flags = APS_MSG_FLAG_LOWP_SUM;
	write_seed("push-lowp", &s);
	s.corrupt = true;
	write_seed("push-badcrc", &s);
	s.corrupt = false;
	s.payload[5] = 0x7f; /* an e4m3 NaN code, with a matching CRC */
	write_seed("push-nan", &s);
	memset(&s, 0, sizeof(s));
	aps_msg_init(&s.m, APS_MSG_UNSPECIFIED);
	write_seed("unspecified", &s);
}

/* No header, and a payload frame of 0 bytes. */
static void raw_seed(void)
{
	char path[4096];
	FILE *f;
	uint8_t empty[2] = { 0, 0x80 };

	snprintf(path, sizeof(path), "%s/%s", out_dir, "empty-with-payload");
	f = fopen(path, "wb");
	if (f == NULL || fwrite(empty, 1, sizeof(empty), f) != sizeof(empty) || fclose(f) != 0)
		failures++;
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: make_seeds DIR\n");
		return 2;
	}
	out_dir = argv[1];
	control_seeds();
	broadcast_seeds();
	optimize_seeds();
	data_seeds(APS_MSG_PUSH, "push");
	data_seeds(APS_MSG_RESULT, "result");
	edge_seeds();
	raw_seed();
	return failures == 0 ? 0 : 1;
}
