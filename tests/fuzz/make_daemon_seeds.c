/*
 * Writes the seed corpus of fuzz_daemon into a directory: message sequences
 * a real job speaks (join, register, push, barrier, keepalive, leave), two
 * ranks whose pushes come out of rank order, a connection that closes and a
 * HELLO that resumes its session, global mode's exponents, a job token and a
 * stranger without it, and optimize mode. Each file is in fuzz_daemon's
 * input layout (tests/fuzz/fuzz_daemon.c). Usage: make_daemon_seeds DIR
 * (tests/fuzz/corpus/daemon).
 */
#include "common/codec.h"
#include "proto/frame.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define N 64 /* elements of the seeds' tensor: one chunk of fuzz_daemon's daemon */

static const char *out_dir;
static uint8_t buf[65536];
static size_t used;
static int failures;

static void begin(uint8_t peers_byte)
{
	buf[0] = peers_byte;
	used = 1;
}

static void put16(size_t v)
{
	buf[used++] = (uint8_t)(v & 0xff);
	buf[used++] = (uint8_t)(v >> 8);
}

/* One record: m from peer (flags bit 1: that peer closes after it). */
static void record(int peer, int close_after, struct aps_msg *m)
{
	size_t len;

	buf[used++] = (uint8_t)peer;
	buf[used++] = (uint8_t)((m->payload ? 1 : 0) | (close_after ? 2 : 0));
	if (aps_msg_pack(m, buf + used + 2, sizeof(buf) - used - 2 - N * 4 - 2, &len) < 0) {
		failures++;
		return;
	}
	put16(len);
	used += len;
	if (m->payload != NULL) {
		put16(m->payload_len);
		memcpy(buf + used, m->payload, m->payload_len);
		used += m->payload_len;
	}
}

static void finish(const char *name)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", out_dir, name);
	f = fopen(path, "wb");
	if (f == NULL || fwrite(buf, 1, used, f) != used)
		failures++;
	if (f != NULL)
		fclose(f);
}

static void msg(struct aps_msg *m, enum aps_msg_type type, const char *job, uint32_t rank,
                uint32_t world)
{
	aps_msg_init(m, type);
	snprintf(m->job, sizeof(m->job), "%s", job);
	m->rank = rank;
	m->world_size = world;
}

static void hello(int peer, const char *job, uint32_t rank, uint32_t world, uint8_t token)
{
	struct aps_msg m;

	msg(&m, APS_MSG_HELLO, job, rank, world);
	memset(m.session, token, sizeof(m.session));
	m.has_session = true;
	record(peer, 0, &m);
}

static void reg(int peer, const char *job, uint32_t rank, uint32_t world)
{
	struct aps_msg m;

	msg(&m, APS_MSG_REGISTER, job, rank, world);
	snprintf(m.tensor_name, sizeof(m.tensor_name), "w");
	m.total_count = N;
	snprintf(m.format, sizeof(m.format), "e4m3");
	record(peer, 0, &m);
}

static void push(int peer, const char *job, uint32_t rank, uint32_t world, uint64_t step)
{
	static uint8_t codes[N];
	struct aps_msg m;

	for (int i = 0; i < N; i++)
		codes[i] = (uint8_t)(0x30 + i % 16);
	msg(&m, APS_MSG_PUSH, job, rank, world);
	m.step = step;
	m.chunk_count = m.total_count = N;
	snprintf(m.format, sizeof(m.format), "e4m3");
	m.payload = codes;
	m.payload_len = N;
	record(peer, 0, &m);
}

static void simple(int peer, int close_after, enum aps_msg_type type, const char *job,
                   uint32_t rank, uint32_t world, uint32_t flags)
{
	struct aps_msg m;

	msg(&m, type, job, rank, world);
	m.flags = flags;
	record(peer, close_after, &m);
}

static void one_rank(void)
{
	begin(0);
	hello(0, "a", 0, 1, 1);
	reg(0, "a", 0, 1);
	push(0, "a", 0, 1, 0);
	simple(0, 0, APS_MSG_BARRIER, "a", 0, 1, 0);
	simple(0, 0, APS_MSG_HEARTBEAT, "a", 0, 1, APS_MSG_FLAG_ALIVE);
	push(0, "a", 0, 1, 1);
	simple(0, 0, APS_MSG_BYE, "a", 0, 1, 0);
	finish("one-rank-job");
}

static void out_of_order(void)
{
	begin(1);
	hello(0, "b", 0, 2, 2);
	hello(1, "b", 1, 2, 3);
	reg(0, "b", 0, 2);
	reg(1, "b", 1, 2);
	push(1, "b", 1, 2, 0); /* held until rank 0's */
	push(0, "b", 0, 2, 0);
	push(1, "b", 1, 2, 1);
	simple(1, 1, APS_MSG_HEARTBEAT, "b", 1, 2, APS_MSG_FLAG_ALIVE); /* leaves mid-round */
	finish("two-ranks-out-of-order");
}

static void resume(void)
{
	struct aps_msg m;

	begin(1);
	hello(0, "c", 0, 1, 4);
	reg(0, "c", 0, 1);
	simple(0, 1, APS_MSG_HEARTBEAT, "c", 0, 1, APS_MSG_FLAG_ALIVE);
	msg(&m, APS_MSG_HELLO, "c", 0, 1);
	m.flags = APS_MSG_FLAG_RESUME;
	memset(m.session, 4, sizeof(m.session));
	m.has_session = true;
	record(1, 0, &m);
	push(1, "c", 0, 1, 0);
	finish("close-and-resume");
}

static void global_mode(void)
{
	struct aps_msg m;

	begin(0);
	msg(&m, APS_MSG_HELLO, "d", 0, 1);
	m.scaling = 2; /* enum aps_scaling: global */
	memset(m.session, 5, sizeof(m.session));
	m.has_session = true;
	record(0, 0, &m);
	reg(0, "d", 0, 1);
	msg(&m, APS_MSG_EXPONENTS, "d", 0, 1);
	m.n_tensor_ids = m.n_exponents = 1;
	m.exponents[0] = -3;
	record(0, 0, &m);
	push(0, "d", 0, 1, 0);
	finish("global-exponents");
}

static void stranger(void)
{
	struct aps_msg m;

	begin(1);
	msg(&m, APS_MSG_HELLO, "e", 0, 2);
	snprintf(m.job_token, sizeof(m.job_token), "s3cret");
	memset(m.session, 6, sizeof(m.session));
	m.has_session = true;
	record(0, 0, &m);
	hello(1, "e", 1, 2, 7); /* no token: refused */
	push(1, "e", 1, 2, 0);
	finish("job-token-and-stranger");
}

static void optimize(void)
{
	static float w[N];
	struct aps_msg m;

	begin(0);
	msg(&m, APS_MSG_HELLO, "f", 0, 1);
	snprintf(m.optimizer, sizeof(m.optimizer), "sgd,momentum=0.9");
	memset(m.session, 8, sizeof(m.session));
	m.has_session = true;
	record(0, 0, &m);
	reg(0, "f", 0, 1);
	msg(&m, APS_MSG_BROADCAST, "f", 0, 1);
	m.chunk_count = m.total_count = N;
	m.payload = (const uint8_t *)w;
	m.payload_len = sizeof(w);
	record(0, 0, &m);
	push(0, "f", 0, 1, 1);
	msg(&m, APS_MSG_PULL, "f", 0, 1);
	record(0, 0, &m);
	finish("optimize-mode");
}

int main(int argc, char **argv)
{
	if (argc != 2) {
		fprintf(stderr, "usage: make_daemon_seeds DIR\n");
		return 2;
	}
	out_dir = argv[1];
	one_rank();
	out_of_order();
	resume();
	global_mode();
	stranger();
	optimize();
	if (failures > 0)
		fprintf(stderr, "make_daemon_seeds: %d seeds failed\n", failures);
	return failures > 0;
}
