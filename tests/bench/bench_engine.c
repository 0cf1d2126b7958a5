/*
 * The daemon's per-byte work without sockets: for every rank's chunk of codes,
 * the validator's one pass (CRC32C and the inf/NaN check), the rank-ordered
 * dequantize-accumulate of round.c, and per finished chunk the mean encoded
 * once (divide, max, quantize) and its CRC for the RESULT header. Fed from
 * memory, so that the rate is the engine's alone: GB/s of codes absorbed, per
 * core, against a memcpy of the same bytes.
 *
 * With --threads k, k threads each own every k-th chunk (a chunk's sum stays
 * one thread's, in rank order: the same bits as one thread), each in a round of
 * its own over its chunks: the split alone, every thread checking its own input.
 *
 * The second table is apsd's own engine (server/engine.c, apsd --threads k):
 * one thread plays the event loop (the check of every payload, round.c's
 * bookkeeping, the results taken back through a libuv loop) and k engine
 * threads sum and encode, chunk c on thread c mod k; k = 1 is apsd
 * --threads 1, where the loop does it all. Both tables print the CRC of the
 * results, which every row must share.
 *
 *   build/tests/bench/bench_engine [--threads 1,2] [--ranks 4] [--chunks 16]
 *                                  [--format e4m3] [--seconds 2]
 */
#include "common/codec.h"
#include "common/crc32c.h"
#include "common/err.h"
#include "common/format.h"
#include "common/scale.h"
#include "server/engine.h"
#include "server/round.h"
#include "tests/bench/bench_util.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_ELEMS (1u << 20) /* apsd's default chunk_bytes: 4 MiB of fp32 */
#define MAX_THREADS 64

struct options {
	unsigned threads[8], n_threads;
	unsigned ranks, chunks;
	const char *format;
	double seconds;
};

/* What every thread reads: each rank's codes of the whole tensor, and their exponents. */
struct input {
	struct aps_format fmt;
	unsigned ranks, chunks;
	size_t chunk_bytes;
	uint8_t **codes; /* ranks x (chunks x chunk_bytes) */
	int *scale;      /* ranks */
};

struct worker {
	pthread_t tid;
	const struct input *in;
	unsigned first, stride; /* the chunks first, first + stride, ... */
	double seconds;         /* how long to run */
	uint64_t bytes;         /* codes absorbed */
	double elapsed;
	uint32_t *chunk_crc; /* chunks, shared: the first step's result of each chunk */
	bool record;         /* this step writes chunk_crc[its chunks] */
	int ret;
};

static void die(const char *what, int ret)
{
	fprintf(stderr, "bench_engine: %s: %s\n", what, aps_strerror(ret));
	exit(1);
}

static void no_release(void *ctx)
{
	(void)ctx;
}

/* Every rank's codes of global chunk g checked as the validator does and added to
 * round chunk c, rank 0 last (the worst order: all held, then summed). Returns 0 or
 * an APS_E* code; the chunk is then complete. */
static int add_ranks(const struct input *in, struct aps_round *r, uint64_t step, uint32_t c,
                     uint32_t g)
{
	char why[128];

	for (unsigned rank = in->ranks; rank-- > 0;) {
		const uint8_t *p = in->codes[rank] + (size_t)g * in->chunk_bytes;
		struct aps_contribution ct = { .fmt = in->fmt, .scale_exp = in->scale[rank] };
		uint32_t crc;
		int ret;
		if (aps_codec_crc_nonfinite(&in->fmt, p, in->chunk_bytes, CHUNK_ELEMS, &crc) != 0)
			return APS_EPROTO;
		ct.payload = (struct aps_payload){ p, in->chunk_bytes, no_release, NULL };
		ret = aps_round_add(r, rank, step, c, APS_ROUND_ALLREDUCE, &ct, why, sizeof(why));
		if (ret < 0)
			return ret;
	}
	return aps_round_chunk_complete(r, c) ? 0 : APS_EPROTO;
}

/* One step over the worker's chunks, in order: every rank's chunk checked and added
 * (rank order: the daemon gets them in any order, and round.c holds them), then the
 * chunk finished. Returns 0 or an APS_E* code. */
static int one_step(struct worker *w, struct aps_round *r, uint64_t step)
{
	const struct input *in = w->in;

	for (uint32_t c = 0, g = w->first; g < in->chunks; c++, g += w->stride) {
		struct aps_round_result res;
		int ret = add_ranks(in, r, step, c, g);
		if (ret < 0)
			return ret;
		ret = aps_round_finish_chunk(r, c, NULL, APS_SCALING_LOCAL, &res);
		if (ret < 0)
			return ret;
		if (w->record)
			w->chunk_crc[g] = aps_crc32c(0, res.payload->data, res.payload->len);
		w->bytes += (uint64_t)in->ranks * in->chunk_bytes;
		aps_sbuf_unref(res.payload);
	}
	return 0;
}

static void *run_worker(void *arg)
{
	struct worker *w = arg;
	unsigned mine = (w->in->chunks - w->first + w->stride - 1) / w->stride;
	struct aps_round r;
	double t0;
	uint64_t step = 0;

	w->ret = aps_round_init(&r, w->in->ranks, (size_t)mine * CHUNK_ELEMS, CHUNK_ELEMS, false);
	if (w->ret < 0)
		return NULL;
	w->record = true; /* warm: pages of the sum touched, and the results' CRCs */
	w->ret = one_step(w, &r, step++);
	w->record = false;
	w->bytes = 0;
	t0 = bench_now();
	while (w->ret == 0 && bench_now() - t0 < w->seconds)
		w->ret = one_step(w, &r, step++);
	w->elapsed = bench_now() - t0;
	aps_round_fini(&r);
	return NULL;
}

static void make_input(struct input *in, const struct options *o)
{
	float *x = malloc((size_t)CHUNK_ELEMS * o->chunks * sizeof(float));
	size_t n = (size_t)CHUNK_ELEMS * o->chunks;
	int ret = aps_format_parse(o->format, &in->fmt);

	if (ret < 0 || x == NULL)
		die(o->format, ret < 0 ? ret : APS_ENOMEM);
	in->ranks = o->ranks;
	in->chunks = o->chunks;
	in->chunk_bytes = aps_format_packed_size(&in->fmt, CHUNK_ELEMS);
	in->codes = calloc(o->ranks, sizeof(*in->codes));
	in->scale = calloc(o->ranks, sizeof(*in->scale));
	for (unsigned rank = 0; rank < o->ranks; rank++) {
		struct aps_quant_opts q = { .rounding = APS_ROUND_NEAREST };
		struct aps_codec_stats st;
		size_t len = aps_format_packed_size(&in->fmt, n);
		bench_fill(x, n, 0x5eed + rank, 1e-3);
		in->codes[rank] = malloc(len);
		if (in->codes[rank] == NULL)
			die("codes", APS_ENOMEM);
		/* one exponent for the whole tensor, as a worker's APS local scaling */
		if ((ret = aps_scale_local(&in->fmt, aps_codec_maxabs(x, n), &q.scale_exp)) < 0 ||
		    (ret = aps_codec_quantize(&in->fmt, x, n, &q, in->codes[rank], len, &st)) < 0)
			die("quantize", ret);
		in->scale[rank] = q.scale_exp;
	}
	free(x);
}

/* GB/s of a memcpy of one chunk of every rank's codes, best of a few. */
static double memcpy_rate(const struct input *in)
{
	size_t len = (size_t)in->ranks * in->chunk_bytes;
	uint8_t *src = malloc(len), *dst = malloc(len);
	double best = 0;

	if (src == NULL || dst == NULL)
		die("memcpy buffers", APS_ENOMEM);
	memset(src, 1, len);
	memset(dst, 0, len);
	for (int i = 0; i < 20; i++) {
		double t0 = bench_now(), t;
		memcpy(dst, src, len);
		t = bench_now() - t0;
		if (t > 0 && (double)len / t > best)
			best = (double)len / t;
	}
	free(src);
	free(dst);
	return best * 1e-9;
}

/* k threads over the chunks; returns the GB/s of codes absorbed, and in digest the
 * CRC of every chunk's result in chunk order (the same bits for any k). */
static double run(const struct input *in, unsigned k, double seconds, uint32_t *digest)
{
	struct worker w[MAX_THREADS];
	uint32_t *chunk_crc = calloc(in->chunks, sizeof(*chunk_crc));
	double rate = 0;

	if (chunk_crc == NULL)
		die("digest", APS_ENOMEM);
	for (unsigned i = 0; i < k; i++) {
		w[i] = (struct worker){ .in = in,
			                .first = i,
			                .stride = k,
			                .seconds = seconds,
			                .chunk_crc = chunk_crc };
		if (pthread_create(&w[i].tid, NULL, run_worker, &w[i]) != 0)
			die("pthread_create", APS_ESYS);
	}
	*digest = 0;
	for (unsigned i = 0; i < k; i++) {
		pthread_join(w[i].tid, NULL);
		if (w[i].ret < 0)
			die("engine", w[i].ret);
		rate += (double)w[i].bytes / w[i].elapsed * 1e-9;
	}
	*digest = aps_crc32c(0, chunk_crc, in->chunks * sizeof(*chunk_crc));
	free(chunk_crc);
	return rate;
}

/* apsd's engine: the feeding thread is the loop. */
struct fed {
	const struct input *in;
	uint32_t *chunk_crc;
	unsigned done; /* chunks of this step back on the loop */
	bool record;
	int ret;
};

static void fed_done(void *ctx, int ret, struct aps_round_result *res, bool cancelled)
{
	struct fed *f = ctx;

	f->done++;
	if (cancelled || ret < 0) {
		f->ret = ret < 0 ? ret : APS_EPROTO;
		return;
	}
	if (f->record)
		f->chunk_crc[res->offset / CHUNK_ELEMS] =
		        aps_crc32c(0, res->payload->data, res->payload->len);
	aps_sbuf_unref(res->payload);
}

static int fed_step(struct fed *f, struct aps_round *r, uv_loop_t *loop, uint64_t step)
{
	const struct input *in = f->in;

	f->done = 0;
	for (uint32_t c = 0; c < in->chunks; c++) {
		int ret = add_ranks(in, r, step, c, c);
		if (ret < 0)
			return ret;
		if (aps_round_offloaded(r)) {
			ret = aps_round_finish_async(r, c, NULL, APS_SCALING_LOCAL, fed_done, f);
			if (ret < 0)
				return ret;
		} else {
			struct aps_round_result res;
			fed_done(f, aps_round_finish_chunk(r, c, NULL, APS_SCALING_LOCAL, &res),
			         &res, false);
		}
	}
	while (f->done < in->chunks)
		uv_run(loop, UV_RUN_ONCE);
	return f->ret;
}

static void keep_alive(uv_timer_t *t)
{
	(void)t;
}

/* apsd's engine with k threads (k = 1: none, the loop sums); GB/s of codes absorbed. */
static double run_fed(const struct input *in, unsigned k, double seconds, uint32_t *digest)
{
	struct fed f = { .in = in, .chunk_crc = calloc(in->chunks, sizeof(uint32_t)) };
	struct aps_engine *e = NULL;
	struct aps_round r;
	uv_loop_t loop;
	uint64_t step = 0, bytes = 0;
	double t0, elapsed;
	int ret = 0;
	/* apsd's loop has its sockets and timers; the engine's handle is unref'd */
	uv_timer_t keep;

	uv_loop_init(&loop);
	uv_timer_init(&loop, &keep);
	uv_timer_start(&keep, keep_alive, 60000, 60000);
	if (f.chunk_crc == NULL || (k > 1 && (ret = aps_engine_new(&e, &loop, k)) < 0))
		die("engine", f.chunk_crc == NULL ? APS_ENOMEM : ret);
	if ((ret = aps_round_init(&r, in->ranks, (size_t)in->chunks * CHUNK_ELEMS, CHUNK_ELEMS,
	                          false)) < 0)
		die("round", ret);
	r.engine = e;
	f.record = true;
	if ((ret = fed_step(&f, &r, &loop, step++)) < 0)
		die("engine step", ret);
	f.record = false;
	t0 = bench_now();
	while (bench_now() - t0 < seconds) {
		if ((ret = fed_step(&f, &r, &loop, step++)) < 0)
			die("engine step", ret);
		bytes += (uint64_t)in->ranks * in->chunks * in->chunk_bytes;
	}
	elapsed = bench_now() - t0;
	aps_round_fini(&r);
	aps_engine_close(e);
	uv_close((uv_handle_t *)&keep, NULL);
	uv_run(&loop, UV_RUN_DEFAULT); /* the handles close */
	aps_engine_free(e);
	uv_loop_close(&loop);
	*digest = aps_crc32c(0, f.chunk_crc, in->chunks * sizeof(uint32_t));
	free(f.chunk_crc);
	return (double)bytes / elapsed * 1e-9;
}

static void parse(struct options *o, int argc, char **argv)
{
	*o = (struct options){ .threads = { 1, 2 },
		               .n_threads = 2,
		               .ranks = 4,
		               .chunks = 16,
		               .format = "e4m3",
		               .seconds = 2.0 };
	for (int i = 1; i + 1 < argc; i += 2) {
		if (strcmp(argv[i], "--threads") == 0) {
			char *s = argv[i + 1];
			o->n_threads = 0;
			while (*s != '\0' && o->n_threads < 8) {
				o->threads[o->n_threads++] = (unsigned)strtoul(s, &s, 10);
				s += *s == ',';
			}
		} else if (strcmp(argv[i], "--ranks") == 0) {
			o->ranks = (unsigned)atoi(argv[i + 1]);
		} else if (strcmp(argv[i], "--chunks") == 0) {
			o->chunks = (unsigned)atoi(argv[i + 1]);
		} else if (strcmp(argv[i], "--format") == 0) {
			o->format = argv[i + 1];
		} else if (strcmp(argv[i], "--seconds") == 0) {
			o->seconds = atof(argv[i + 1]);
		} else {
			fprintf(stderr, "bench_engine: unknown flag %s\n", argv[i]);
			exit(2);
		}
	}
	for (unsigned i = 0; i < o->n_threads; i++)
		if (o->threads[i] < 1 || o->threads[i] > MAX_THREADS || o->threads[i] > o->chunks) {
			fprintf(stderr, "bench_engine: --threads: 1..%d, at most --chunks\n",
			        MAX_THREADS);
			exit(2);
		}
	if (o->ranks < 1 || o->chunks < 1 || o->seconds <= 0) {
		fprintf(stderr, "bench_engine: --ranks, --chunks and --seconds must be positive\n");
		exit(2);
	}
}

int main(int argc, char **argv)
{
	struct options o;
	struct input in;
	double one = 0, copy;
	uint32_t digest1 = 0;

	parse(&o, argc, argv);
	make_input(&in, &o);
	copy = memcpy_rate(&in);
	printf("bench_engine: %u ranks, %u chunks of %u %s codes (%zu KiB each), %s ISA, "
	       "%.1f s per row; memcpy of a chunk of every rank: %.2f GB/s\n\n",
	       o.ranks, o.chunks, CHUNK_ELEMS, in.fmt.name, in.chunk_bytes >> 10,
	       aps_codec_isa_name(aps_codec_get_isa()), o.seconds, copy);
	printf("| threads | GB/s of codes absorbed | per thread | x 1 thread | per thread / "
	       "memcpy | result digest |\n|--:|--:|--:|--:|--:|---|\n");
	for (unsigned i = 0; i < o.n_threads; i++) {
		uint32_t digest;
		double rate = run(&in, o.threads[i], o.seconds, &digest);
		if (i == 0) {
			one = rate / o.threads[i];
			digest1 = digest;
		}
		printf("| %u | %.2f | %.2f | %.2f | %.2f | %08x%s |\n", o.threads[i], rate,
		       rate / o.threads[i], rate / one, rate / o.threads[i] / copy, digest,
		       digest == digest1 ? "" : " DIFFERS");
		fflush(stdout);
	}
	printf("\napsd's engine (server/engine.c), one thread as the event loop checking every "
	       "payload:\n\n| apsd --threads | GB/s of codes absorbed | x --threads 1 | "
	       "result digest |\n|--:|--:|--:|---|\n");
	for (unsigned i = 0; i < o.n_threads; i++) {
		uint32_t digest;
		double rate = run_fed(&in, o.threads[i], o.seconds, &digest);
		if (i == 0)
			one = rate;
		printf("| %u | %.2f | %.2f | %08x%s |\n", o.threads[i], rate, rate / one, digest,
		       digest == digest1 ? "" : " DIFFERS");
		fflush(stdout);
	}
	return 0;
}
