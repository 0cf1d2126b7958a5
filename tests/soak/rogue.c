/*
 * A rogue peer for the soak test: for a given time it sends apsd what no
 * client would, over one DEALER socket, and counts the ERROR replies:
 *
 *   garbage      random bytes as the header, sometimes with a payload frame
 *   truncated    a valid HELLO, REGISTER or PUSH cut short
 *   bitflip      a valid message with one to three header bits flipped
 *   bad_crc      a valid PUSH whose payload lost a bit on the way
 *   frames       three to five frames where at most two are allowed
 *   intruder     PUSH and BARRIER as a rank of a live job: from a connection that
 *                never said HELLO, or from the rogue's own joined one
 *   mismatch     HELLO to the rogue's own job with another world size, from the
 *                connection that never said HELLO
 *   deep         as rank 0 of its own job: PUSH with an unknown tensor, a chunk
 *                past the end, a format that is not the registered one
 *
 * It never HELLOs to someone else's job: a HELLO can create a job, or take a
 * rank that is still free. Usage:
 *   rogue ENDPOINT SECONDS SEED [JOB...]
 * Prints one line "rogue sent=N errors=N garbage=N ..." and exits 0 when at least
 * one ERROR came back (the daemon answered) and 1 otherwise.
 */
#include "common/codec.h"
#include "proto/frame.h"
#include "proto/validate.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

enum kind {
	GARBAGE,
	TRUNCATED,
	BITFLIP,
	BAD_CRC,
	FRAMES,
	INTRUDER,
	MISMATCH,
	DEEP,
	N_KINDS
};

static const char *const kind_names[N_KINDS] = { "garbage", "truncated", "bitflip",  "bad_crc",
	                                         "frames",  "intruder",  "mismatch", "deep" };

struct rogue {
	void *sock;     /* where send_frames sends: joined or stranger */
	void *joined;   /* rank 0 of the rogue's own job */
	void *stranger; /* never says HELLO: intruders, and HELLOs that do not match */
	uint64_t rng;
	const char *const *jobs; /* live jobs to intrude on */
	int n_jobs;
	char own_job[64];
	uint64_t sent[N_KINDS];
	uint64_t errors;
};

static uint64_t next(struct rogue *r)
{
	r->rng ^= r->rng << 13;
	r->rng ^= r->rng >> 7;
	r->rng ^= r->rng << 17;
	return r->rng;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void send_frames(struct rogue *r, const uint8_t *hdr, size_t len, const uint8_t *payload,
                        size_t payload_len)
{
	zmq_send(r->sock, hdr, len, payload != NULL ? ZMQ_SNDMORE : 0);
	if (payload != NULL)
		zmq_send(r->sock, payload, payload_len, 0);
}

/* Reads every reply waiting on sock and counts the ERRORs among them. */
static void drain_one(struct rogue *r, void *sock, int wait_ms)
{
	zmq_pollitem_t item = { .socket = sock, .events = ZMQ_POLLIN };
	static uint8_t hdr[65536], payload[65536];
	struct aps_msg_limits lim;

	aps_msg_limits_init(&lim);
	lim.from_server = true;
	while (zmq_poll(&item, 1, wait_ms) > 0) {
		struct aps_msg m;
		struct aps_msg_fault fault;
		int more = 0, payload_len = -1;
		size_t more_len = sizeof(more);
		int n = zmq_recv(sock, hdr, sizeof(hdr), 0);

		if (n < 0)
			return;
		zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &more_len);
		while (more) {
			payload_len = zmq_recv(sock, payload, sizeof(payload), 0);
			zmq_getsockopt(sock, ZMQ_RCVMORE, &more, &more_len);
		}
		if (aps_msg_parse(&lim, hdr, (size_t)n, payload,
		                  payload_len > 0 ? (size_t)payload_len : 0, payload_len >= 0, &m,
		                  &fault) == 0 &&
		    m.type == APS_MSG_ERROR)
			r->errors++;
		wait_ms = 0;
	}
}

static void drain(struct rogue *r, int wait_ms)
{
	zmq_pollitem_t items[2] = { { .socket = r->joined, .events = ZMQ_POLLIN },
		                    { .socket = r->stranger, .events = ZMQ_POLLIN } };

	zmq_poll(items, 2, wait_ms);
	drain_one(r, r->joined, 0);
	drain_one(r, r->stranger, 0);
}

static void identity(struct aps_msg *m, enum aps_msg_type type, const char *job, uint32_t rank,
                     uint32_t world)
{
	aps_msg_init(m, type);
	snprintf(m->job, sizeof(m->job), "%s", job);
	m->rank = rank;
	m->world_size = world;
}

/* A PUSH of 64 e4m3 codes of tensor 0 at offset 0 of 64 (the payload is the caller's). */
static void push(struct aps_msg *m, const char *job, uint32_t rank, uint8_t *payload)
{
	identity(m, APS_MSG_PUSH, job, rank, 8);
	strcpy(m->format, "e4m3");
	m->chunk_count = m->total_count = 64;
	m->step = 0;
	for (int i = 0; i < 64; i++)
		payload[i] = (uint8_t)((i * 3) & 0x3f); /* finite e4m3 codes */
	m->payload = payload;
	m->payload_len = 64;
}

static size_t pack(const struct aps_msg *m, uint8_t *buf, size_t cap)
{
	size_t len = 0;

	return aps_msg_pack(m, buf, cap, &len) < 0 ? 0 : len;
}

static void valid_message(struct rogue *r, struct aps_msg *m, uint8_t *payload)
{
	switch (next(r) % 3) {
	case 0:
		identity(m, APS_MSG_HELLO, r->own_job, 1, 2);
		strcpy(m->format, "e4m3");
		break;
	case 1:
		identity(m, APS_MSG_REGISTER, r->own_job, 1, 2);
		strcpy(m->tensor_name, "rogue.weight");
		m->total_count = 64;
		break;
	default:
		push(m, r->own_job, 1, payload);
		break;
	}
}

static void one(struct rogue *r, enum kind k)
{
	uint8_t hdr[4096], payload[256];
	struct aps_msg m;
	size_t len;

	switch (k) {
	case GARBAGE:
		len = 1 + next(r) % 300;
		for (size_t i = 0; i < len; i++)
			hdr[i] = (uint8_t)next(r);
		send_frames(r, hdr, len, next(r) % 2 ? hdr : NULL, len / 2);
		break;
	case TRUNCATED:
	case BITFLIP:
		valid_message(r, &m, payload);
		if ((len = pack(&m, hdr, sizeof(hdr))) == 0)
			return;
		if (k == TRUNCATED) {
			len = next(r) % len;
		} else {
			for (uint64_t n = 1 + next(r) % 3; n > 0; n--)
				hdr[next(r) % len] ^= (uint8_t)(1u << (next(r) % 8));
		}
		send_frames(r, hdr, len, m.payload, m.payload_len);
		break;
	case BAD_CRC:
		push(&m, r->own_job, 1, payload);
		if ((len = pack(&m, hdr, sizeof(hdr))) == 0)
			return;
		payload[next(r) % 64] ^= 0x10;
		send_frames(r, hdr, len, payload, 64);
		break;
	case FRAMES:
		identity(&m, APS_MSG_BARRIER, r->own_job, 1, 2);
		len = pack(&m, hdr, sizeof(hdr));
		for (uint64_t n = 2 + next(r) % 3; n > 0; n--)
			zmq_send(r->sock, hdr, len, ZMQ_SNDMORE);
		zmq_send(r->sock, hdr, len, 0);
		break;
	case INTRUDER:
	case MISMATCH: {
		const char *job = r->n_jobs > 0 ? r->jobs[next(r) % (uint64_t)r->n_jobs] : "soak";
		bool stranger = next(r) % 2;
		if (k == INTRUDER && next(r) % 2) {
			push(&m, job, (uint32_t)(next(r) % 8), payload);
		} else if (k == INTRUDER) {
			identity(&m, APS_MSG_BARRIER, job, (uint32_t)(next(r) % 8), 8);
		} else {
			/* Its own job, so that it never creates a worker's job with it. */
			identity(&m, APS_MSG_HELLO, r->own_job, 1, 1000);
			strcpy(m.format, "e4m3");
			stranger = true;
		}
		if ((len = pack(&m, hdr, sizeof(hdr))) == 0)
			return;
		r->sock = stranger ? r->stranger : r->joined;
		send_frames(r, hdr, len, m.payload, m.payload_len);
		r->sock = r->joined;
		break;
	}
	case DEEP:
		push(&m, r->own_job, 0, payload);
		m.world_size = 2;
		switch (next(r) % 3) {
		case 0:
			m.tensor_id = 7777;
			break;
		case 1:
			m.chunk_offset = 60;
			break;
		default:
			strcpy(m.format, "e5m2");
			break;
		}
		if ((len = pack(&m, hdr, sizeof(hdr))) == 0)
			return;
		send_frames(r, hdr, len, m.payload, m.payload_len);
		break;
	default:
		return;
	}
	r->sent[k]++;
}

/* Rank 0 of the rogue's own job, with one registered tensor, for the deep kind. */
static void join_own_job(struct rogue *r)
{
	uint8_t hdr[4096];
	struct aps_msg m;
	size_t len;

	identity(&m, APS_MSG_HELLO, r->own_job, 0, 2);
	strcpy(m.format, "e4m3");
	len = pack(&m, hdr, sizeof(hdr));
	send_frames(r, hdr, len, NULL, 0);
	identity(&m, APS_MSG_REGISTER, r->own_job, 0, 2);
	strcpy(m.tensor_name, "rogue.weight");
	m.total_count = 64;
	len = pack(&m, hdr, sizeof(hdr));
	send_frames(r, hdr, len, NULL, 0);
	/* WELCOME and REGISTERED are not errors: read them before counting. */
	zmq_pollitem_t item = { .socket = r->sock, .events = ZMQ_POLLIN };
	uint8_t buf[4096];
	for (int got = 0; got < 2 && zmq_poll(&item, 1, 2000) > 0; got++)
		zmq_recv(r->sock, buf, sizeof(buf), 0);
}

int main(int argc, char **argv)
{
	struct rogue r = { 0 };
	void *ctx;
	double end;
	int linger = 0, hwm = 1000;

	if (argc < 4) {
		fprintf(stderr, "usage: rogue ENDPOINT SECONDS SEED [JOB...]\n");
		return 2;
	}
	r.rng = strtoull(argv[3], NULL, 10) * 0x9e3779b97f4a7c15ULL | 1;
	r.jobs = (const char *const *)argv + 4;
	r.n_jobs = argc - 4;
	snprintf(r.own_job, sizeof(r.own_job), "rogue-%s", argv[3]);
	ctx = zmq_ctx_new();
	r.joined = zmq_socket(ctx, ZMQ_DEALER);
	r.stranger = zmq_socket(ctx, ZMQ_DEALER);
	for (int i = 0; i < 2; i++) {
		void *sock = i == 0 ? r.joined : r.stranger;
		zmq_setsockopt(sock, ZMQ_LINGER, &linger, sizeof(linger));
		zmq_setsockopt(sock, ZMQ_SNDHWM, &hwm, sizeof(hwm));
		if (zmq_connect(sock, argv[1]) != 0) {
			fprintf(stderr, "rogue: connect %s: %s\n", argv[1],
			        zmq_strerror(zmq_errno()));
			return 2;
		}
	}
	r.sock = r.joined;
	join_own_job(&r);
	end = now_s() + atof(argv[2]);
	while (now_s() < end) {
		one(&r, (enum kind)(next(&r) % N_KINDS));
		drain(&r, 5);
	}
	drain(&r, 200);
	uint64_t total = 0;
	printf("rogue errors=%llu", (unsigned long long)r.errors);
	for (int k = 0; k < N_KINDS; k++) {
		printf(" %s=%llu", kind_names[k], (unsigned long long)r.sent[k]);
		total += r.sent[k];
	}
	printf(" sent=%llu\n", (unsigned long long)total);
	zmq_close(r.joined);
	zmq_close(r.stranger);
	zmq_ctx_term(ctx);
	return r.errors > 0 ? 0 : 1;
}
