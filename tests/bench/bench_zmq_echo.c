/*
 * The transport's limit for the all-reduce benchmarks: a minimal "echo
 * parameter server" and its workers over plain ZeroMQ, moving the bytes apsd
 * moves with none of its work (no protobuf, no CRC, no codec, no rounds).
 *
 * --serve: a ROUTER. Each message is [identity, 16-byte header, payload]. Once
 * every rank of the world has sent a given slot, it sends every rank one reply
 * carrying the first sender's payload (zmq_msg_copy: one buffer, shared, as
 * apsd fans one RESULT buffer out). Stops when every rank said bye, after
 * --idle-exit-ms without a message, or on SIGTERM/SIGINT.
 *
 * Otherwise a worker (DEALER): per step it sends every chunk of every tensor
 * (the tensor set and chunking of bench_allreduce and apsd: chunks of
 * --chunk_bytes fp32 bytes, each carrying aps_packed_size(format, n) bytes),
 * last tensor first, zero-copy from one buffer, then receives every reply.
 * Barriers (an empty slot 0) align the ranks before each step. Rank 0 prints
 * the RESULT line of bench_util.h.
 */
#include "aps.h"
#include "bench_util.h"

#include <errno.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

enum {
	MSG_DATA = 0,
	MSG_BYE = 1
};

struct hdr {
	uint32_t kind, rank, slot, step;
};

struct args {
	const char *endpoint, *format, *tensors;
	bool serve;
	int rank, world, steps, warmup, idle_exit_ms, timeout_ms;
	int64_t chunk_bytes;
};

struct slot {
	uint32_t count;  /* ranks that sent this slot in the current step */
	zmq_msg_t first; /* the first sender's payload, echoed to every rank */
};

struct server {
	void *sock;
	int world;
	uint8_t (*ids)[256]; /* routing identity of each rank */
	size_t *id_len;
	struct slot *slots;
	size_t n_slots;
	int byes;
};

static volatile sig_atomic_t stop;

static void on_signal(int sig)
{
	(void)sig;
	stop = 1;
}

static void die(const char *what)
{
	fprintf(stderr, "bench_zmq_echo: %s: %s\n", what, zmq_strerror(errno));
	exit(1);
}

static int parse(struct args *a, int argc, char **argv)
{
	static const struct option longs[] = {
		{ "endpoint", 1, 0, 'e' },    { "serve", 0, 0, 'S' },
		{ "rank", 1, 0, 'r' },        { "world", 1, 0, 'w' },
		{ "format", 1, 0, 'f' },      { "tensors", 1, 0, 't' },
		{ "chunk_bytes", 1, 0, 'c' }, { "steps", 1, 0, 'n' },
		{ "warmup", 1, 0, 'u' },      { "idle-exit-ms", 1, 0, 'i' },
		{ "timeout_ms", 1, 0, 'o' },  { 0, 0, 0, 0 }
	};
	int opt;

	*a = (struct args){ .endpoint = "tcp://127.0.0.1:5556",
		            .format = "e4m3",
		            .tensors = "resnet50",
		            .world = 1,
		            .steps = 10,
		            .warmup = 2,
		            .idle_exit_ms = 30000,
		            .timeout_ms = 60000,
		            .chunk_bytes = 4 << 20 };
	while ((opt = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (opt) {
		case 'e':
			a->endpoint = optarg;
			break;
		case 'S':
			a->serve = true;
			break;
		case 'r':
			a->rank = atoi(optarg);
			break;
		case 'w':
			a->world = atoi(optarg);
			break;
		case 'f':
			a->format = optarg;
			break;
		case 't':
			a->tensors = optarg;
			break;
		case 'c':
			a->chunk_bytes = bench_parse_size(optarg);
			break;
		case 'n':
			a->steps = atoi(optarg);
			break;
		case 'u':
			a->warmup = atoi(optarg);
			break;
		case 'i':
			a->idle_exit_ms = atoi(optarg);
			break;
		case 'o':
			a->timeout_ms = atoi(optarg);
			break;
		default:
			return -1;
		}
	}
	if (optind != argc || a->world < 1 || a->rank < 0 || a->rank >= a->world || a->steps < 1 ||
	    a->warmup < 0 || a->chunk_bytes < 4 || a->idle_exit_ms < 1 || a->timeout_ms < 1)
		return -1;
	return 0;
}

/* ---- the echo server ---- */

static struct slot *slot_at(struct server *s, uint32_t i)
{
	if (i >= s->n_slots) {
		size_t n = (size_t)i + 1 > 2 * s->n_slots ? (size_t)i + 1 : 2 * s->n_slots;
		struct slot *grown = realloc(s->slots, n * sizeof(*grown));
		if (grown == NULL)
			die("out of memory");
		memset(grown + s->n_slots, 0, (n - s->n_slots) * sizeof(*grown));
		s->slots = grown;
		s->n_slots = n;
	}
	return &s->slots[i];
}

/* Every rank gets [identity, header, the shared payload]. */
static void echo(struct server *s, struct slot *sl, const struct hdr *h)
{
	for (int r = 0; r < s->world; r++) {
		zmq_msg_t m;
		zmq_msg_init(&m);
		zmq_msg_copy(&m, &sl->first);
		if (zmq_send(s->sock, s->ids[r], s->id_len[r], ZMQ_SNDMORE) < 0 ||
		    zmq_send(s->sock, h, sizeof(*h), ZMQ_SNDMORE) < 0 ||
		    zmq_msg_send(&m, s->sock, 0) < 0)
			die("echo send");
	}
	zmq_msg_close(&sl->first);
	sl->count = 0;
}

/* One message [identity, header, payload]; false when nothing came in time. */
static bool serve_one(struct server *s, int timeout_ms)
{
	zmq_pollitem_t item = { .socket = s->sock, .events = ZMQ_POLLIN };
	zmq_msg_t id, payload;
	struct hdr h;
	struct slot *sl;

	if (zmq_poll(&item, 1, timeout_ms) <= 0)
		return false;
	zmq_msg_init(&id);
	zmq_msg_init(&payload);
	if (zmq_msg_recv(&id, s->sock, 0) < 0 || zmq_recv(s->sock, &h, sizeof(h), 0) < 0 ||
	    zmq_msg_recv(&payload, s->sock, 0) < 0 || h.rank >= (uint32_t)s->world ||
	    zmq_msg_size(&id) > sizeof(s->ids[0]))
		die("a message that is not [identity, header, payload]");
	s->id_len[h.rank] = zmq_msg_size(&id);
	memcpy(s->ids[h.rank], zmq_msg_data(&id), s->id_len[h.rank]);
	zmq_msg_close(&id);
	if (h.kind == MSG_BYE) {
		s->byes++;
		zmq_msg_close(&payload);
		return true;
	}
	sl = slot_at(s, h.slot);
	if (sl->count++ == 0) {
		zmq_msg_init(&sl->first);
		zmq_msg_move(&sl->first, &payload);
	}
	zmq_msg_close(&payload);
	if (sl->count == (uint32_t)s->world)
		echo(s, sl, &h);
	return true;
}

static int serve(void *zctx, const struct args *a)
{
	struct server s = { .world = a->world };
	double last = bench_now();
	int one = 1;

	s.ids = calloc((size_t)a->world, sizeof(*s.ids));
	s.id_len = calloc((size_t)a->world, sizeof(*s.id_len));
	s.sock = zmq_socket(zctx, ZMQ_ROUTER);
	if (s.ids == NULL || s.id_len == NULL || s.sock == NULL)
		die("server setup");
	zmq_setsockopt(s.sock, ZMQ_ROUTER_MANDATORY, &one, sizeof(one));
	if (zmq_bind(s.sock, a->endpoint) < 0)
		die(a->endpoint);
	printf("bench_zmq_echo: serving %s world=%d\n", a->endpoint, a->world);
	fflush(stdout);
	while (!stop && s.byes < a->world && (bench_now() - last) * 1e3 < a->idle_exit_ms) {
		if (serve_one(&s, 100))
			last = bench_now();
	}
	for (size_t i = 0; i < s.n_slots; i++) {
		if (s.slots[i].count > 0)
			zmq_msg_close(&s.slots[i].first);
	}
	zmq_close(s.sock);
	free(s.slots);
	free(s.ids);
	free(s.id_len);
	return 0;
}

/* ---- a worker ---- */

struct client {
	void *sock;
	int rank, world;
	uint32_t step;
	size_t n_msgs;     /* messages of one step */
	uint32_t *slot_of; /* per message, in sending order */
	int64_t *bytes_of;
	uint8_t *payload; /* one read-only buffer every send points into */
};

static void send_msg(struct client *c, uint32_t kind, uint32_t slot, size_t len)
{
	struct hdr h = { kind, (uint32_t)c->rank, slot, c->step };
	zmq_msg_t m;

	zmq_msg_init_data(&m, c->payload, len, NULL, NULL); /* zero-copy, nothing to free */
	if (zmq_send(c->sock, &h, sizeof(h), ZMQ_SNDMORE) < 0 || zmq_msg_send(&m, c->sock, 0) < 0)
		die("send");
}

static void recv_replies(struct client *c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		zmq_msg_t m;
		struct hdr h;
		zmq_msg_init(&m);
		if (zmq_recv(c->sock, &h, sizeof(h), 0) < 0 || zmq_msg_recv(&m, c->sock, 0) < 0)
			die("recv");
		zmq_msg_close(&m);
	}
}

/* The messages of a step in sending order: last tensor first, its chunks in order. */
static void plan(struct client *c, const struct args *a, const struct bench_tensors *t)
{
	uint64_t per = (uint64_t)a->chunk_bytes / 4;
	uint32_t slot = 1;
	size_t n = 0, max_len = 0;

	for (size_t i = 0; i < t->n; i++)
		c->n_msgs += (t->counts[i] + per - 1) / per;
	c->slot_of = calloc(c->n_msgs, sizeof(*c->slot_of));
	c->bytes_of = calloc(c->n_msgs, sizeof(*c->bytes_of));
	if (c->slot_of == NULL || c->bytes_of == NULL)
		die("out of memory");
	for (size_t i = t->n; i-- > 0;) {
		for (uint64_t off = 0; off < t->counts[i]; off += per, n++) {
			uint64_t k = t->counts[i] - off < per ? t->counts[i] - off : per;
			c->slot_of[n] = slot++;
			c->bytes_of[n] = aps_packed_size(a->format, k);
			if (c->bytes_of[n] < 0)
				die("--format is not a format");
			if ((size_t)c->bytes_of[n] > max_len)
				max_len = (size_t)c->bytes_of[n];
		}
	}
	c->payload = calloc(max_len ? max_len : 1, 1);
	if (c->payload == NULL)
		die("out of memory");
}

static void barrier(struct client *c)
{
	if (c->world == 1)
		return;
	send_msg(c, MSG_DATA, 0, 0);
	recv_replies(c, 1);
}

static void step(struct client *c)
{
	for (size_t i = 0; i < c->n_msgs; i++)
		send_msg(c, MSG_DATA, c->slot_of[i], (size_t)c->bytes_of[i]);
	recv_replies(c, c->n_msgs);
	c->step++;
}

static void open_client(struct client *c, void *zctx, const struct args *a)
{
	int linger = 2000;

	c->sock = zmq_socket(zctx, ZMQ_DEALER);
	if (c->sock == NULL)
		die("zmq_socket");
	zmq_setsockopt(c->sock, ZMQ_LINGER, &linger, sizeof(linger));
	/* A reply later than this ends the worker (EAGAIN): no run waits forever. */
	zmq_setsockopt(c->sock, ZMQ_RCVTIMEO, &a->timeout_ms, sizeof(a->timeout_ms));
	if (zmq_connect(c->sock, a->endpoint) < 0)
		die(a->endpoint);
}

static void report(const struct client *c, const struct args *a, const struct bench_tensors *t,
                   double *us, double cpu)
{
	char extra[256];
	uint64_t up = 0;

	for (size_t i = 0; i < c->n_msgs; i++)
		up += (uint64_t)c->bytes_of[i];
	snprintf(extra, sizeof(extra),
	         "format=%s tensors=%s n_tensors=%zu elements=%llu world=%d mode=echo "
	         "bytes_up=%llu msgs=%zu",
	         a->format, t->summary, t->n, (unsigned long long)t->total, a->world,
	         (unsigned long long)up, c->n_msgs);
	bench_report("step", us, (size_t)a->steps, cpu, extra);
}

static int work(void *zctx, const struct args *a)
{
	struct client c = { .rank = a->rank, .world = a->world };
	struct bench_tensors t;
	double *us = calloc((size_t)a->steps, sizeof(*us)), cpu;

	if (us == NULL || bench_tensors_init(&t, a->tensors) < 0)
		die("--tensors wants resnet50 or an element count");
	plan(&c, a, &t);
	open_client(&c, zctx, a);
	for (int s = 0; s < a->warmup; s++) {
		barrier(&c);
		step(&c);
	}
	if (a->rank == 0)
		printf("TIMED begin\n");
	fflush(stdout);
	cpu = bench_cpu();
	for (int s = 0; s < a->steps; s++) {
		double t0;
		barrier(&c);
		t0 = bench_now();
		step(&c);
		us[s] = (bench_now() - t0) * 1e6;
	}
	cpu = bench_cpu() - cpu;
	if (a->rank == 0) {
		printf("TIMED end\n");
		report(&c, a, &t, us, cpu);
	}
	barrier(&c);
	send_msg(&c, MSG_BYE, 0, 0);
	zmq_close(c.sock);
	free(c.slot_of);
	free(c.bytes_of);
	free(c.payload);
	free(us);
	bench_tensors_fini(&t);
	return 0;
}

int main(int argc, char **argv)
{
	struct args a;
	void *zctx;
	int ret;

	if (parse(&a, argc, argv) < 0) {
		fprintf(stderr, "usage: bench_zmq_echo --serve [--endpoint E] [--world W] "
		                "[--idle-exit-ms MS]\n"
		                "       bench_zmq_echo [--endpoint E] [--rank R] [--world W] "
		                "[--format F] [--tensors resnet50|N]\n"
		                "                      [--chunk_bytes SIZE] [--steps N] "
		                "[--warmup N] [--timeout_ms MS]\n");
		return 2;
	}
	signal(SIGTERM, on_signal);
	signal(SIGINT, on_signal);
	zctx = zmq_ctx_new();
	if (zctx == NULL)
		die("zmq_ctx_new");
	ret = a.serve ? serve(zctx, &a) : work(zctx, &a);
	zmq_ctx_term(zctx);
	return ret;
}
