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
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

struct args {
	const char *endpoint, *job, *format, *downlink, *mode;
	int rank, world, steps, jitter_ms, timeout_ms, sleep_ms;
	enum aps_scaling scaling;
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
		x[i] = u * ldexpf(1.0f, -(int)((z >> 8) % 6) - 3 * r - t);
	}
}

static int encode_like_client(const struct args *a, const struct aps_format *f, const float *x,
                              uint64_t n, uint8_t *codes)
{
	struct aps_quant_opts o = { 0 };

	if (a->scaling == APS_SCALING_LOCAL && !aps_format_is_fp32(f))
		aps_scale_local(f, aps_codec_maxabs(x, n), &o.scale_exp);
	aps_codec_quantize(f, x, n, &o, codes, aps_format_packed_size(f, n), NULL);
	return o.scale_exp;
}

static void expected(const struct args *a, int s, int t, uint64_t n, float *want, float *tmp,
                     uint8_t *codes)
{
	struct aps_format up, down;
	int k;

	aps_format_parse(a->format, &up);
	down = up;
	if (a->downlink != NULL)
		aps_format_parse(a->downlink, &down);
	for (int r = 0; r < a->world; r++) {
		make_data(a, r, s, t, tmp, n);
		k = encode_like_client(a, &up, tmp, n, codes);
		if (r == 0)
			aps_codec_dequantize(&up, codes, aps_format_packed_size(&up, n), n, k,
			                     want);
		else
			aps_codec_accumulate(&up, codes, aps_format_packed_size(&up, n), n, k,
			                     want);
	}
	for (uint64_t i = 0; i < n && a->world > 1; i++)
		want[i] /= (float)a->world;
	k = encode_like_client(a, &down, want, n, codes);
	aps_codec_dequantize(&down, codes, aps_format_packed_size(&down, n), n, k, want);
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

static int check_steps(const struct args *a, aps_client *c, const uint32_t *ids, float *x,
                       float *want, float *tmp, uint8_t *codes)
{
	int ret;

	for (int s = 0; s < a->steps; s++) {
		for (int t = 0; t < a->n_sizes; t++) {
			uint64_t n = a->sizes[t];
			make_data(a, a->rank, s, t, x, n);
			if (strcmp(a->mode, "nan") == 0)
				x[n / 2] = NAN;
			if (a->jitter_ms > 0)
				sleep_ms((
				        int)(mix(a->seed + (uint64_t)(a->rank * 977 + s * 31 + t)) %
				             (uint64_t)a->jitter_ms));
			if (a->sleep_ms > 0 && s == a->steps - 1)
				sleep_ms(a->sleep_ms);
			if ((ret = aps_client_allreduce(c, ids[t], x, n, a->timeout_ms)) < 0)
				return fail(ret);
			expected(a, s, t, n, want, tmp, codes);
			if (memcmp(x, want, n * sizeof(float)) != 0) {
				printf("MISMATCH step=%d tensor=%d\n", s, t);
				return 1;
			}
			printf("ok step=%d tensor=%d n=%llu sum=%08x\n", s, t,
			       (unsigned long long)n, checksum(x, n));
		}
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
	int ret;

	for (int t = 0; t < a->n_sizes; t++) {
		char name[32];
		snprintf(name, sizeof(name), "layer%d.weight", t);
		if ((ret = aps_client_register(c, name, a->sizes[t], &ids[t])) < 0)
			return fail(ret);
		max = a->sizes[t] > max ? a->sizes[t] : max;
	}
	float *x = malloc(max * 4), *want = malloc(max * 4), *tmp = malloc(max * 4);
	uint8_t *codes = malloc(max * 4);
	ret = check_steps(a, c, ids, x, want, tmp, codes);
	free(x);
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
		            .scaling = APS_SCALING_LOCAL,
		            .seed = 1 };
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
		else if (!strcmp(k, "--seed"))
			a->seed = strtoull(v, NULL, 10);
		else if (!strcmp(k, "--scaling"))
			aps_scaling_parse(v, &a->scaling);
		else if (!strcmp(k, "--sizes"))
			parse_sizes(a, argv[i + 1]);
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
	o.timeout_ms = a.timeout_ms;
	if ((ret = aps_client_new(&c, &o)) < 0)
		return fail(ret);
	ret = run(&a, c);
	aps_client_close(c);
	return ret;
}
