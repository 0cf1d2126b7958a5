/*
 * One worker process of an all-reduce benchmark job against a running apsd.
 * It registers a tensor set (ResNet-50's 161 parameter tensors, or one tensor
 * of N elements), fills it with gradient-like values, then per step starts
 * every all-reduce asynchronously in reverse layer order (as backward produces
 * the gradients) and waits for all of them; or, with --blocking, calls
 * aps_client_allreduce once per tensor. Ranks enter a barrier before each step
 * (outside the timed window) when the world has more than one rank. Rank 0
 * prints one RESULT line (bench_util.h) with the step times after warm-up;
 * with --time-chunk N it also times the codec's per-chunk work on N elements
 * (what the daemon does with the last push of a round) in the same process;
 * with --codec-floor, rank 0 times the codec's own passes over one step of
 * its tensor set on one core: a worker's (exponent, quantize, dequantize of
 * the result) and the daemon's (world dequantize-accumulates per chunk, the
 * divide, exponent and quantize of the mean), the floor a step's CPU is
 * compared with beside raw ZeroMQ moving the same bytes.
 * Tests/bench/bench_allreduce.py runs it; it checks nothing but return codes.
 */
#include "aps.h"
#include "bench_util.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK_SAMPLES 31
#define COLD_BUFFERS  16 /* rotating buffers: together well beyond the 32 MiB L3 */

struct args {
	const char *endpoint, *job, *format, *tensors;
	int rank, world, scaling, steps, warmup, timeout_ms;
	bool blocking;
	int64_t time_chunk;      /* elements, 0: do not time the codec */
	int64_t partition_bytes; /* several endpoints: opts.partition_bytes (0: default) */
	bool codec_floor;        /* rank 0 times the codec's passes of one step */
	int codec_threads;       /* opts.codec_threads */
	bool no_crc;             /* opts.no_payload_crc */
};

struct worker {
	aps_client *c;
	struct bench_tensors t;
	uint32_t *ids;
	float **bufs;
	aps_request **reqs;
	int rank;
};

static void die(int rank, const char *what, int ret)
{
	fprintf(stderr, "bench_allreduce: rank %d: %s: %s: %s\n", rank, what, aps_strerror(ret),
	        aps_last_error());
	exit(1);
}

static void usage(void)
{
	fprintf(stderr,
	        "usage: bench_allreduce [--endpoint E] [--job NAME] [--rank R] [--world W]\n"
	        "         [--format F] [--scaling none|local|global] [--tensors resnet50|N]\n"
	        "         [--steps N] [--warmup N] [--blocking] [--time-chunk N] "
	        "[--timeout_ms MS]\n"
	        "         [--partition-bytes N] (--endpoint A,B,...: one apsd shard each)\n"
	        "         [--codec-floor] [--codec-threads K] [--no-crc]\n");
}

static int parse_scaling(const char *s)
{
	if (strcmp(s, "none") == 0)
		return APS_SCALING_MODE_NONE;
	if (strcmp(s, "local") == 0)
		return APS_SCALING_MODE_LOCAL;
	if (strcmp(s, "global") == 0)
		return APS_SCALING_MODE_GLOBAL;
	return -1;
}

static int parse(struct args *a, int argc, char **argv)
{
	static const struct option longs[] = { { "endpoint", 1, 0, 'e' },
		                               { "job", 1, 0, 'j' },
		                               { "rank", 1, 0, 'r' },
		                               { "world", 1, 0, 'w' },
		                               { "format", 1, 0, 'f' },
		                               { "scaling", 1, 0, 's' },
		                               { "tensors", 1, 0, 't' },
		                               { "steps", 1, 0, 'n' },
		                               { "warmup", 1, 0, 'u' },
		                               { "blocking", 0, 0, 'b' },
		                               { "time-chunk", 1, 0, 'c' },
		                               { "timeout_ms", 1, 0, 'o' },
		                               { "partition-bytes", 1, 0, 'p' },
		                               { "codec-floor", 0, 0, 'F' },
		                               { "codec-threads", 1, 0, 'T' },
		                               { "no-crc", 0, 0, 'C' },
		                               { 0, 0, 0, 0 } };
	int opt;

	*a = (struct args){ .endpoint = "tcp://127.0.0.1:5555",
		            .job = "bench",
		            .format = "e4m3",
		            .tensors = "resnet50",
		            .world = 1,
		            .scaling = APS_SCALING_MODE_LOCAL,
		            .steps = 10,
		            .warmup = 2,
		            .timeout_ms = 60000 };
	while ((opt = getopt_long(argc, argv, "", longs, NULL)) != -1) {
		switch (opt) {
		case 'e':
			a->endpoint = optarg;
			break;
		case 'j':
			a->job = optarg;
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
		case 's':
			a->scaling = parse_scaling(optarg);
			break;
		case 't':
			a->tensors = optarg;
			break;
		case 'n':
			a->steps = atoi(optarg);
			break;
		case 'u':
			a->warmup = atoi(optarg);
			break;
		case 'b':
			a->blocking = true;
			break;
		case 'c':
			a->time_chunk = bench_parse_size(optarg);
			break;
		case 'o':
			a->timeout_ms = atoi(optarg);
			break;
		case 'p':
			a->partition_bytes = bench_parse_size(optarg);
			break;
		case 'F':
			a->codec_floor = true;
			break;
		case 'T':
			a->codec_threads = atoi(optarg);
			break;
		case 'C':
			a->no_crc = true;
			break;
		default:
			return -1;
		}
	}
	if (optind != argc || a->world < 1 || a->rank < 0 || a->rank >= a->world ||
	    a->scaling < 0 || a->steps < 1 || a->warmup < 0 || a->time_chunk < 0 ||
	    a->partition_bytes < 0)
		return -1;
	return 0;
}

static void connect_worker(struct worker *w, const struct args *a)
{
	struct aps_client_opts o;
	int ret;

	aps_client_opts_init(&o);
	o.endpoint = a->endpoint;
	o.job = a->job;
	o.rank = (uint32_t)a->rank;
	o.world_size = (uint32_t)a->world;
	o.format = a->format;
	o.scaling = a->scaling;
	o.timeout_ms = a->timeout_ms;
	o.partition_bytes = (uint64_t)a->partition_bytes;
	o.codec_threads = (uint32_t)(a->codec_threads > 0 ? a->codec_threads : 0);
	o.no_payload_crc = a->no_crc ? 1 : 0;
	w->rank = a->rank;
	ret = aps_client_new(&w->c, &o);
	if (ret < 0)
		die(a->rank, "joining the job", ret);
}

/* Registers every tensor (forward order) and fills its buffer. */
static void setup(struct worker *w, const struct args *a)
{
	int ret = bench_tensors_init(&w->t, a->tensors);

	if (ret < 0)
		die(a->rank, "--tensors wants resnet50 or an element count", APS_EINVAL);
	w->ids = calloc(w->t.n, sizeof(*w->ids));
	w->bufs = calloc(w->t.n, sizeof(*w->bufs));
	w->reqs = calloc(w->t.n, sizeof(*w->reqs));
	if (w->ids == NULL || w->bufs == NULL || w->reqs == NULL)
		die(a->rank, "allocating", APS_ENOMEM);
	for (size_t i = 0; i < w->t.n; i++) {
		w->bufs[i] = malloc(w->t.counts[i] * sizeof(float));
		if (w->bufs[i] == NULL)
			die(a->rank, "allocating a tensor", APS_ENOMEM);
		bench_fill(w->bufs[i], w->t.counts[i], (uint64_t)a->rank << 32 | i,
		           bench_layer_scale(i));
		ret = aps_client_register(w->c, w->t.names[i], w->t.counts[i], &w->ids[i]);
		if (ret < 0)
			die(a->rank, w->t.names[i], ret);
	}
}

static void teardown(struct worker *w)
{
	aps_client_close(w->c);
	for (size_t i = 0; i < w->t.n; i++)
		free(w->bufs[i]);
	free(w->bufs);
	free(w->ids);
	free(w->reqs);
	bench_tensors_fini(&w->t);
}

/* One step: every tensor, last layer first. Returns the seconds the starts took (the
 * caller's scan and encoding, async mode). */
static double step(struct worker *w, bool blocking)
{
	double t0 = bench_now(), started;
	int ret;

	for (size_t j = w->t.n; j-- > 0;) {
		if (blocking)
			ret = aps_client_allreduce(w->c, w->ids[j], w->bufs[j], w->t.counts[j], 0);
		else
			ret = aps_client_allreduce_start(w->c, w->ids[j], w->bufs[j],
			                                 w->t.counts[j], 0, &w->reqs[j]);
		if (ret < 0)
			die(w->rank, w->t.names[j], ret);
	}
	started = bench_now() - t0;
	for (size_t j = w->t.n; !blocking && j-- > 0;) {
		ret = aps_request_wait(w->reqs[j]);
		if (ret < 0)
			die(w->rank, w->t.names[j], ret);
	}
	return started;
}

static void align(struct worker *w, int world)
{
	int ret = world > 1 ? aps_client_barrier(w->c, 0) : 0;

	if (ret < 0)
		die(w->rank, "barrier", ret);
}

static void run_steps(struct worker *w, const struct args *a)
{
	double *us = calloc((size_t)a->steps, sizeof(*us)), cpu0;
	double *start_us = calloc((size_t)a->steps, sizeof(*start_us));
	char extra[256];

	if (us == NULL || start_us == NULL)
		die(a->rank, "allocating", APS_ENOMEM);
	for (int s = 0; s < a->warmup; s++) {
		align(w, a->world);
		step(w, a->blocking);
	}
	if (a->rank == 0)
		printf("TIMED begin\n");
	fflush(stdout);
	cpu0 = bench_cpu();
	for (int s = 0; s < a->steps; s++) {
		double t0;
		align(w, a->world);
		t0 = bench_now();
		start_us[s] = step(w, a->blocking) * 1e6;
		us[s] = (bench_now() - t0) * 1e6;
	}
	cpu0 = bench_cpu() - cpu0;
	if (a->rank == 0) {
		printf("TIMED end\n");
		snprintf(extra, sizeof(extra),
		         "format=%s tensors=%s n_tensors=%zu elements=%llu world=%d mode=%s "
		         "bytes_up=%lld",
		         a->format, w->t.summary, w->t.n, (unsigned long long)w->t.total, a->world,
		         a->blocking ? "blocking" : "async",
		         (long long)aps_packed_size(a->format, w->t.total));
		bench_report("step", us, (size_t)a->steps, cpu0, extra);
		if (!a->blocking) /* the caller's share: scan and encode (codec_threads) */
			bench_report("start", start_us, (size_t)a->steps, 0, extra);
	}
	free(us);
	free(start_us);
}

/* Codes of n gradient-like values in fmt with their local APS exponent. */
static uint8_t *make_codes(const char *fmt, size_t n, float *x, int32_t *k, int64_t *len)
{
	uint8_t *codes;

	*len = aps_packed_size(fmt, n);
	codes = *len > 0 ? malloc((size_t)*len) : NULL;
	if (codes == NULL || aps_exponent(fmt, x, n, 1, APS_SCALING_MODE_LOCAL, k) < 0 ||
	    aps_quantize(fmt, x, n, &(struct aps_quantize_opts){ .scale_exp = *k }, codes,
	                 (uint64_t)*len, NULL) < 0)
		die(0, "preparing codes", APS_ENOMEM);
	return codes;
}

/*
 * The codec's work on one chunk of n elements: dequantize-accumulate with
 * its buffers in cache (hot) and rotating over COLD_BUFFERS pairs (cold),
 * dequantize, and the encoding of a result (max-abs, exponent, quantize).
 */
static void time_chunk(const char *fmt, size_t n)
{
	double hot[CHUNK_SAMPLES], cold[CHUNK_SAMPLES], deq[CHUNK_SAMPLES], enc[CHUNK_SAMPLES];
	float *x[COLD_BUFFERS], *acc[COLD_BUFFERS];
	uint8_t *codes[COLD_BUFFERS];
	int64_t len;
	int32_t k;
	char extra[96];

	for (int b = 0; b < COLD_BUFFERS; b++) {
		x[b] = malloc(n * sizeof(float));
		acc[b] = malloc(n * sizeof(float));
		if (x[b] == NULL || acc[b] == NULL)
			die(0, "allocating", APS_ENOMEM);
		memset(acc[b], 0, n * sizeof(float)); /* no page faults in the timed calls */
		bench_fill(x[b], n, (uint64_t)b, 1e-3f);
		codes[b] = make_codes(fmt, n, x[b], &k, &len);
	}
	for (int s = -1; s < CHUNK_SAMPLES; s++) {
		double t0 = bench_now(), t1, t2, t3;
		int b = 1 + (s + COLD_BUFFERS) % (COLD_BUFFERS - 1), ret; /* never 0 */
		struct aps_quantize_opts qo = { 0 };
		ret = aps_accumulate(fmt, codes[0], (uint64_t)len, n, k, acc[0]);
		t1 = bench_now();
		ret |= aps_accumulate(fmt, codes[b], (uint64_t)len, n, k, acc[b]);
		t2 = bench_now();
		ret |= aps_dequantize(fmt, codes[0], (uint64_t)len, n, k, x[0]);
		t3 = bench_now();
		ret |= aps_exponent(fmt, x[0], n, 1, APS_SCALING_MODE_LOCAL, &qo.scale_exp);
		ret |= aps_quantize(fmt, x[0], n, &qo, codes[0], (uint64_t)len, NULL);
		if (ret < 0)
			die(0, "timing the codec", ret);
		if (s < 0)
			continue;
		hot[s] = (t1 - t0) * 1e6;
		cold[s] = (t2 - t1) * 1e6;
		deq[s] = (t3 - t2) * 1e6;
		enc[s] = (bench_now() - t3) * 1e6;
	}
	snprintf(extra, sizeof(extra), "format=%s elements=%zu", fmt, n);
	bench_report("chunk_accumulate_hot", hot, CHUNK_SAMPLES, 0, extra);
	bench_report("chunk_accumulate_cold", cold, CHUNK_SAMPLES, 0, extra);
	bench_report("chunk_dequantize", deq, CHUNK_SAMPLES, 0, extra);
	bench_report("chunk_encode", enc, CHUNK_SAMPLES, 0, extra);
	for (int b = 0; b < COLD_BUFFERS; b++) {
		free(x[b]);
		free(acc[b]);
		free(codes[b]);
	}
}

#define FLOOR_SAMPLES 5
#define FLOOR_CHUNK   (1u << 20) /* apsd's default chunk: 1 Mi elements */

/*
 * The codec's passes of one step of t's tensors in fmt, on this thread: a
 * worker's, and the daemon's for world ranks (every rank's codes the same
 * here: the passes cost the same). Reported as two RESULT lines, in us.
 */
static void codec_floor(const struct bench_tensors *t, const char *fmt, int world)
{
	double wk[FLOOR_SAMPLES], dm[FLOOR_SAMPLES];
	float *x = malloc(t->max_count * sizeof(float)), *acc = malloc(FLOOR_CHUNK * sizeof(float));
	uint8_t *codes = malloc((size_t)aps_packed_size(fmt, t->max_count) + 64);
	char extra[96];

	if (x == NULL || acc == NULL || codes == NULL)
		die(0, "codec floor", APS_ENOMEM);
	for (int s = -1; s < FLOOR_SAMPLES; s++) {
		double tw = 0, td = 0;
		for (size_t i = 0; i < t->n; i++) {
			size_t n = (size_t)t->counts[i];
			uint64_t len = (uint64_t)aps_packed_size(fmt, n);
			struct aps_quantize_opts qo = { 0 };
			int ret;
			bench_fill(x, n, i, bench_layer_scale(i));
			double t0 = bench_now();
			ret = aps_exponent(fmt, x, n, 1, APS_SCALING_MODE_LOCAL, &qo.scale_exp);
			ret |= aps_quantize(fmt, x, n, &qo, codes, len, NULL);
			ret |= aps_dequantize(fmt, codes, len, n, qo.scale_exp, x);
			double t1 = bench_now();
			for (size_t off = 0; off < n; off += FLOOR_CHUNK) {
				size_t m = n - off < FLOOR_CHUNK ? n - off : FLOOR_CHUNK;
				uint64_t mlen = (uint64_t)aps_packed_size(fmt, m);
				const uint8_t *c = codes + aps_packed_size(fmt, off);
				struct aps_quantize_opts mo = { 0 };
				ret |= aps_dequantize(fmt, c, mlen, m, qo.scale_exp, acc);
				for (int r = 1; r < world; r++)
					ret |= aps_accumulate(fmt, c, mlen, m, qo.scale_exp, acc);
				for (size_t e = 0; e < m; e++)
					acc[e] /= (float)world;
				ret |= aps_exponent(fmt, acc, m, 1, APS_SCALING_MODE_LOCAL,
				                    &mo.scale_exp);
				ret |= aps_quantize(fmt, acc, m, &mo, (uint8_t *)x, mlen, NULL);
			}
			td += bench_now() - t1;
			tw += t1 - t0;
			if (ret < 0)
				die(0, "timing the codec floor", ret);
		}
		if (s >= 0) {
			wk[s] = tw * 1e6;
			dm[s] = td * 1e6;
		}
	}
	snprintf(extra, sizeof(extra), "format=%s world=%d", fmt, world);
	bench_report("codec_floor_worker", wk, FLOOR_SAMPLES, 0, extra);
	bench_report("codec_floor_daemon", dm, FLOOR_SAMPLES, 0, extra);
	free(x);
	free(acc);
	free(codes);
}

int main(int argc, char **argv)
{
	struct worker w = { 0 };
	struct args a;

	if (parse(&a, argc, argv) < 0) {
		usage();
		return 2;
	}
	connect_worker(&w, &a);
	setup(&w, &a);
	run_steps(&w, &a);
	align(&w, a.world);
	if (a.rank == 0 && a.codec_floor)
		codec_floor(&w.t, a.format, a.world);
	teardown(&w);
	if (a.rank == 0 && a.time_chunk > 0)
		time_chunk(a.format, (size_t)a.time_chunk);
	return 0;
}
