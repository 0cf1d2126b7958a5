/*
 * A worker for the integration tests: joins a job through libaps, all-reduces
 * deterministic data for a few steps and checks every result bit for bit
 * against an expectation computed here, independently of the daemon: each
 * rank's data (every worker can generate every rank's), encoded as a client
 * encodes it, decoded and summed in rank order, divided by the world size,
 * then encoded for the downlink. Prints one line per result; exit 0 when all
 * match, 1 on a mismatch, 3 when a call fails ("error NAME: text").
 */
#include "aps.h"
#include "common/codec.h"
#include "common/scale.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct args {
	const char *endpoint, *job, *format, *downlink, *mode;
	int rank, world, steps, jitter_ms, timeout_ms, sleep_ms;
	int connect_timeout_ms; /* -1: the library's default */
	enum aps_scaling scaling;
	bool lowp;                /* the daemon runs with sum = lowp */
	bool policy;              /* ask for the automatic precision policy */
	bool unchecked;           /* the daemon chooses formats: compare ranks, not values */
	bool ef;                  /* error feedback; mode "drift" measures what it buys */
	int wide;                 /* this tensor's values spread over 24 binades (-1: none) */
	bool async;               /* start every tensor of a step, then wait in reverse */
	bool rejoin;              /* join again after apsd restarts; redo the step that failed */
	uint64_t chunk_elems;     /* the daemon's chunk_bytes / 4 (0: one chunk) */
	uint64_t partition_bytes; /* several endpoints: opts.partition_bytes */
	uint32_t codec_threads;   /* opts.codec_threads */
	uint64_t seed;
	uint64_t sizes[16];
	int n_sizes;
};

static uint64_t mix(uint64_t z)
{
	z ^= z >> 33;
	z *= 0xff51afd7ed558ccdULL;
	z ^= z >> 33;
	z *= 0xc4ceb9fe1a85ec53ULL;
	return z ^ (z >> 33);
}

/* Rank r's gradient of tensor t at step s: values spread over a few binades. */
static void make_data(const struct args *a, int r, int s, int t, float *x, uint64_t n)
{
	uint64_t key = mix(a->seed ^ mix((uint64_t)r << 40 ^ (uint64_t)s << 20 ^ (uint64_t)t));

	for (uint64_t i = 0; i < n; i++) {
		uint64_t z = mix(key + i);
		float u = (float)(z >> 40) / 16777216.0f - 0.5f;
		int spread = t == a->wide ? 24 : 6;
		x[i] = u * ldexpf(1.0f, -(int)((z >> 8) % (uint64_t)spread) - 3 * r - t);
	}
}

static int rank_scale(const struct args *a, const struct aps_format *f, const float *x, uint64_t n,
                      int global_k)
{
	int k = 0;

	if (aps_format_is_fp32(f) || a->scaling == APS_SCALING_NONE)
		return 0;
	if (a->scaling == APS_SCALING_GLOBAL)
		return global_k;
	aps_scale_local(f, aps_codec_maxabs(x, n), &k);
	return k;
}

/* Global mode: every rank's ceil(log2(N max)), the max of them, then emax - max. */
static int global_scale(const struct args *a, const struct aps_format *f, int s, int t, uint64_t n,
                        float *tmp)
{
	int e, best = APS_SCALE_ZERO_EXPONENT;

	for (int r = 0; r < a->world; r++) {
		make_data(a, r, s, t, tmp, n);
		aps_scale_global_exponent(aps_codec_maxabs(tmp, n), a->world, &e);
		best = e > best ? e : best;
	}
	return aps_scale_from_global_exponent(f, best);
}

/* Adds one rank's codes into want: exactly (fp32 sum) or rounded to f (lowp). */
static void add_rank(const struct args *a, const struct aps_format *f, int r, const uint8_t *codes,
                     uint64_t n, int k, float *want, float *tmp)
{
	size_t len = aps_format_packed_size(f, n);
	struct aps_quant_opts raw = { 0 };

	if (!a->lowp) {
		if (r == 0)
			aps_codec_dequantize(f, codes, len, n, k, want);
		else
			aps_codec_accumulate(f, codes, len, n, k, want);
		return;
	}
	aps_codec_dequantize(f, codes, len, n, 0, tmp);
	for (uint64_t i = 0; i < n; i++)
		want[i] = r == 0 ? tmp[i] : want[i] + tmp[i];
	/* round the running sum to the format (an e4m3 buffer needs n bytes) */
	uint8_t *round = malloc(len);
	aps_codec_quantize(f, want, n, &raw, round, len, NULL);
	aps_codec_dequantize(f, round, len, n, 0, want);
	free(round);
}

/* The downlink: each chunk encoded with its own local exponent (or k = 0). */
static void downlink(const struct args *a, const struct aps_format *down, float *want, uint64_t n,
                     uint8_t *codes)
{
	uint64_t per = a->chunk_elems && a->chunk_elems < n ? a->chunk_elems : n;

	for (uint64_t off = 0; off < n; off += per) {
		uint64_t m = n - off < per ? n - off : per;
		struct aps_quant_opts o = { 0 };
		if (a->scaling != APS_SCALING_NONE && !aps_format_is_fp32(down))
			aps_scale_local(down, aps_codec_maxabs(want + off, m), &o.scale_exp);
		aps_codec_quantize(down, want + off, m, &o, codes, aps_format_packed_size(down, m),
		                   NULL);
		aps_codec_dequantize(down, codes, aps_format_packed_size(down, m), m, o.scale_exp,
		                     want + off);
	}
}

/* The result every rank must receive; 0, or 1 when a rank's data overflowed. */
static int expected(const struct args *a, int s, int t, uint64_t n, float *want, float *tmp,
                    uint8_t *codes)
{
	struct aps_format up, down;
	struct aps_codec_stats st;
	int k = 0, global_k;

	aps_format_parse(a->format, &up);
	down = up;
	if (a->downlink != NULL)
		aps_format_parse(a->downlink, &down);
	global_k = a->scaling == APS_SCALING_GLOBAL ? global_scale(a, &up, s, t, n, tmp) : 0;
	for (int r = 0; r < a->world; r++) {
		struct aps_quant_opts o;
		make_data(a, r, s, t, tmp, n);
		k = rank_scale(a, &up, tmp, n, global_k);
		o = (struct aps_quant_opts){ .scale_exp = k };
		aps_codec_quantize(&up, tmp, n, &o, codes, aps_format_packed_size(&up, n), &st);
		if (a->scaling == APS_SCALING_GLOBAL && st.overflow > 0)
			return 1; /* APS.md 2: global scaling never overflows */
		add_rank(a, &up, r, codes, n, k, want, tmp);
	}
	if (a->lowp) {
		/* the daemon sends the sum's codes with k; the client decodes and divides */
		for (uint64_t i = 0; i < n; i++)
			want[i] = ldexpf(want[i], -k) / (float)a->world;
		return 0;
	}
	aps_codec_divide(want, n, (float)a->world);
	downlink(a, &down, want, n, codes);
	return 0;
}

/* APS_ITEST_LOG=1: the client's diagnostics on stderr, with the time (ms). */
static void log_line(void *ctx, int level, const char *line)
{
	struct timespec ts;

	(void)ctx;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	fprintf(stderr, "client %ld.%03ld [%d] %s\n", (long)ts.tv_sec, ts.tv_nsec / 1000000, level,
	        line);
}

static int fail(int ret)
{
	printf("error %s: %s\n", aps_err_name(ret), aps_last_error());
	fflush(stdout);
	return 3;
}

static void sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

static uint32_t checksum(const float *x, uint64_t n)
{
	uint64_t h = 1469598103934665603ULL;
	const uint8_t *p = (const uint8_t *)x;

	for (uint64_t i = 0; i < n * sizeof(float); i++)
		h = (h ^ p[i]) * 1099511628211ULL;
	return (uint32_t)(h ^ (h >> 32));
}

/* Compares the result of tensor t at step s with the expectation and says so. */
static int check_one(const struct args *a, int s, int t, const float *x, float *want, float *tmp,
                     uint8_t *codes)
{
	uint64_t n = a->sizes[t];

	if (a->unchecked) { /* the driver compares the ranks' checksums */
		printf("ok step=%d tensor=%d n=%llu sum=%08x\n", s, t, (unsigned long long)n,
		       checksum(x, n));
		return 0;
	}
	if (expected(a, s, t, n, want, tmp, codes) != 0) {
		printf("OVERFLOW step=%d tensor=%d: global scaling overflowed\n", s, t);
		return 1;
	}
	if (memcmp(x, want, n * sizeof(float)) != 0) {
		printf("MISMATCH step=%d tensor=%d\n", s, t);
		return 1;
	}
	printf("ok step=%d tensor=%d n=%llu sum=%08x\n", s, t, (unsigned long long)n,
	       checksum(x, n));
	return 0;
}

static void prepare(const struct args *a, int s, int t, float *x)
{
	uint64_t n = a->sizes[t];

	make_data(a, a->rank, s, t, x, n);
	if (strcmp(a->mode, "nan") == 0)
		x[n / 2] = NAN;
	if (a->jitter_ms > 0)
		sleep_ms((int)(mix(a->seed + (uint64_t)(a->rank * 977 + s * 31 + t)) %
		               (uint64_t)a->jitter_ms));
	if (a->sleep_ms > 0 && s == a->steps - 1)
		sleep_ms(a->sleep_ms);
}

/* One step: every tensor in flight at once, waited for in reverse order. */
static int async_step(const struct args *a, aps_client *c, int s, const uint32_t *ids, float **xs,
                      float *want, float *tmp, uint8_t *codes)
{
	aps_request *req[16];
	int ret, bad = 0;

	for (int t = 0; t < a->n_sizes; t++) {
		prepare(a, s, t, xs[t]);
		ret = aps_client_allreduce_start(c, ids[t], xs[t], a->sizes[t], a->timeout_ms,
		                                 &req[t]);
		if (ret < 0) {
			bad = fail(ret); /* before the waits replace this thread's last error */
			while (t-- > 0)
				aps_request_wait(req[t]);
			return bad;
		}
	}
	for (int t = a->n_sizes - 1; t >= 0; t--) {
		ret = aps_request_wait(req[t]);
		if (ret < 0 && bad == 0)
			bad = fail(ret);
	}
	for (int t = 0; t < a->n_sizes && bad == 0; t++)
		bad = check_one(a, s, t, xs[t], want, tmp, codes);
	return bad;
}

static int sync_step(const struct args *a, aps_client *c, int s, const uint32_t *ids, float **xs,
                     float *want, float *tmp, uint8_t *codes)
{
	int ret;

	for (int t = 0; t < a->n_sizes; t++) {
		prepare(a, s, t, xs[t]);
		ret = aps_client_allreduce(c, ids[t], xs[t], a->sizes[t], a->timeout_ms);
		if (ret == APS_ENOSESSION && a->rejoin) {
			printf("rejoined step=%d tensor=%d\n", s, t); /* the tensor again */
			t--;
			continue;
		}
		if (ret < 0)
			return fail(ret);
		if ((ret = check_one(a, s, t, xs[t], want, tmp, codes)) != 0)
			return ret;
	}
	return 0;
}

/*
 * Mode "drift": the same gradient every step; prints how far the average of
 * the results is from it (relative L2). Error feedback should shrink it.
 */
static int drift(const struct args *a, aps_client *c, const uint32_t *ids, float *x, float *sum)
{
	uint64_t n = a->sizes[0];
	double num = 0, den = 0;
	int ret;

	memset(sum, 0, n * sizeof(float));
	for (int s = 0; s < a->steps; s++) {
		make_data(a, a->rank, 0, 0, x, n);
		if ((ret = aps_client_allreduce(c, ids[0], x, n, a->timeout_ms)) < 0)
			return fail(ret);
		for (uint64_t i = 0; i < n; i++)
			sum[i] += x[i];
	}
	make_data(a, a->rank, 0, 0, x, n);
	for (uint64_t i = 0; i < n; i++) {
		double d = sum[i] / a->steps - x[i];
		num += d * d;
		den += (double)x[i] * x[i];
	}
	printf("drift=%.6f\n", sqrt(num / den));
	return 0;
}

static int check_steps(const struct args *a, aps_client *c, const uint32_t *ids, float **xs,
                       float *want, float *tmp, uint8_t *codes)
{
	int ret;

	if (strcmp(a->mode, "drift") == 0)
		return drift(a, c, ids, xs[0], want);

	for (int s = 0; s < a->steps; s++) {
		ret = a->async ? async_step(a, c, s, ids, xs, want, tmp, codes)
		               : sync_step(a, c, s, ids, xs, want, tmp, codes);
		if (ret != 0)
			return ret;
	}
	if ((ret = aps_client_barrier(c, a->timeout_ms)) < 0)
		return fail(ret);
	printf("done rank=%d\n", a->rank);
	return 0;
}

static int run(const struct args *a, aps_client *c)
{
	uint64_t max = 1;
	uint32_t ids[16];
	float *xs[16] = { 0 };
	int ret;

	for (int t = 0; t < a->n_sizes; t++) {
		char name[32];
		snprintf(name, sizeof(name), "layer%d.weight", t);
		if ((ret = aps_client_register(c, name, a->sizes[t], &ids[t])) < 0) {
			ret = fail(ret);
			while (t-- > 0)
				free(xs[t]);
			return ret;
		}
		max = a->sizes[t] > max ? a->sizes[t] : max;
		xs[t] = malloc(a->sizes[t] * sizeof(float));
	}
	float *want = malloc(max * 4), *tmp = malloc(max * 4);
	uint8_t *codes = malloc(max * 4);
	ret = check_steps(a, c, ids, xs, want, tmp, codes);
	for (int t = 0; t < a->n_sizes; t++)
		free(xs[t]);
	free(want);
	free(tmp);
	free(codes);
	return ret;
}

static void parse_sizes(struct args *a, char *list)
{
	for (char *tok = strtok(list, ","); tok && a->n_sizes < 16; tok = strtok(NULL, ","))
		a->sizes[a->n_sizes++] = strtoull(tok, NULL, 10);
}

static int parse(struct args *a, int argc, char **argv)
{
	*a = (struct args){ .endpoint = "tcp://127.0.0.1:5555",
		            .job = "default",
		            .format = "e4m3",
		            .mode = "allreduce",
		            .world = 1,
		            .steps = 2,
		            .timeout_ms = 20000,
		            .connect_timeout_ms = -1,
		            .scaling = APS_SCALING_LOCAL,
		            .seed = 1,
		            .wide = -1 };
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "--endpoint"))
			a->endpoint = v;
		else if (!strcmp(k, "--job"))
			a->job = v;
		else if (!strcmp(k, "--format"))
			a->format = v;
		else if (!strcmp(k, "--downlink"))
			a->downlink = v;
		else if (!strcmp(k, "--mode"))
			a->mode = v;
		else if (!strcmp(k, "--rank"))
			a->rank = atoi(v);
		else if (!strcmp(k, "--world"))
			a->world = atoi(v);
		else if (!strcmp(k, "--steps"))
			a->steps = atoi(v);
		else if (!strcmp(k, "--jitter-ms"))
			a->jitter_ms = atoi(v);
		else if (!strcmp(k, "--sleep-ms"))
			a->sleep_ms = atoi(v);
		else if (!strcmp(k, "--timeout-ms"))
			a->timeout_ms = atoi(v);
		else if (!strcmp(k, "--connect-timeout-ms"))
			a->connect_timeout_ms = atoi(v);
		else if (!strcmp(k, "--seed"))
			a->seed = strtoull(v, NULL, 10);
		else if (!strcmp(k, "--scaling"))
			aps_scaling_parse(v, &a->scaling);
		else if (!strcmp(k, "--sizes"))
			parse_sizes(a, argv[i + 1]);
		else if (!strcmp(k, "--lowp"))
			a->lowp = atoi(v) != 0;
		else if (!strcmp(k, "--async"))
			a->async = atoi(v) != 0;
		else if (!strcmp(k, "--rejoin"))
			a->rejoin = atoi(v) != 0;
		else if (!strcmp(k, "--policy"))
			a->policy = atoi(v) != 0;
		else if (!strcmp(k, "--unchecked"))
			a->unchecked = atoi(v) != 0;
		else if (!strcmp(k, "--ef"))
			a->ef = atoi(v) != 0;
		else if (!strcmp(k, "--wide"))
			a->wide = atoi(v);
		else if (!strcmp(k, "--chunk-elems"))
			a->chunk_elems = strtoull(v, NULL, 10);
		else if (!strcmp(k, "--partition-bytes"))
			a->partition_bytes = strtoull(v, NULL, 10);
		else if (!strcmp(k, "--codec-threads"))
			a->codec_threads = (uint32_t)atoi(v);
		else
			return -1;
	}
	return a->n_sizes > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct aps_client_opts o;
	struct args a;
	aps_client *c;
	int ret;

	if (parse(&a, argc, argv) < 0) {
		fprintf(stderr, "usage: itest_worker --sizes N[,N...] [--rank R --world W ...]\n");
		return 2;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	aps_client_opts_init(&o);
	o.endpoint = a.endpoint;
	o.job = a.job;
	o.rank = (uint32_t)a.rank;
	o.world_size = (uint32_t)a.world;
	o.format = a.format;
	o.downlink = a.downlink;
	o.scaling = (int32_t)a.scaling;
	o.codec_threads = a.codec_threads;
	o.timeout_ms = a.timeout_ms;
	if (a.connect_timeout_ms >= 0)
		o.connect_timeout_ms = a.connect_timeout_ms;
	o.policy_auto = a.policy;
	/* CURVE keys (Z85) from the environment, as a deployment would pass them */
	o.curve_server_key = getenv("APS_CURVE_SERVER_KEY");
	o.curve_public_key = getenv("APS_CURVE_PUBLIC_KEY");
	o.curve_secret_key = getenv("APS_CURVE_SECRET_KEY");
	o.job_token = getenv("APS_JOB_TOKEN");
	o.error_feedback = a.ef;
	o.rejoin = a.rejoin;
	o.partition_bytes = a.partition_bytes;
	if (getenv("APS_ITEST_LOG") != NULL)
		o.log = log_line;
	if ((ret = aps_client_new(&c, &o)) < 0)
		return fail(ret);
	ret = run(&a, c);
	aps_client_close(c);
	return ret;
}
