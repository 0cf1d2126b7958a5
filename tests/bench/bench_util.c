/*
 * Helpers shared by the all-reduce benchmarks: clocks, the tensor set,
 * gradient-like data and the RESULT line. No ZeroMQ and no libaps here.
 */
#include "bench_util.h"

#include "resnet50_shapes.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

static const char *const single_name[] = { "single" };

int bench_tensors_init(struct bench_tensors *t, const char *spec)
{
	bool resnet = strcmp(spec, "resnet50") == 0;
	int64_t one = resnet ? 0 : bench_parse_size(spec);

	memset(t, 0, sizeof(*t));
	if (!resnet && one <= 0)
		return -EINVAL;
	t->n = resnet ? RESNET50_N_TENSORS : 1;
	t->counts = calloc(t->n, sizeof(*t->counts));
	t->names = calloc(t->n, sizeof(*t->names));
	if (t->counts == NULL || t->names == NULL) {
		bench_tensors_fini(t);
		return -ENOMEM;
	}
	for (size_t i = 0; i < t->n; i++) {
		t->counts[i] = resnet ? resnet50_tensors[i].count : (uint64_t)one;
		t->names[i] = resnet ? resnet50_tensors[i].name : single_name[0];
		t->total += t->counts[i];
		if (t->counts[i] > t->max_count)
			t->max_count = t->counts[i];
	}
	t->summary = resnet ? "resnet50" : "single";
	return 0;
}

void bench_tensors_fini(struct bench_tensors *t)
{
	free(t->counts);
	free(t->names);
	memset(t, 0, sizeof(*t));
}

double bench_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double bench_cpu(void)
{
	struct rusage ru;

	getrusage(RUSAGE_SELF, &ru);
	return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
	       (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static uint64_t splitmix64(uint64_t *state)
{
	uint64_t z = (*state += UINT64_C(0x9e3779b97f4a7c15));

	z = (z ^ (z >> 30)) * UINT64_C(0xbf58476d1ce4e5b9);
	z = (z ^ (z >> 27)) * UINT64_C(0x94d049bb133111eb);
	return z ^ (z >> 31);
}

/* Sum of four 16-bit uniforms (Irwin-Hall): bell-shaped, unit variance, times scale. */
void bench_fill(float *x, size_t n, uint64_t seed, double scale)
{
	const double unit = sqrt(3.0) / 65536.0;

	for (size_t i = 0; i < n; i++) {
		uint64_t r = splitmix64(&seed);
		double s = (double)(r & 0xffff) + (double)((r >> 16) & 0xffff) +
		           (double)((r >> 32) & 0xffff) + (double)(r >> 48) - 2.0 * 65535.0;

		x[i] = (float)(s * unit * scale);
	}
}

float bench_layer_scale(size_t i)
{
	/* 2^-8 .. 2^-24, as the gradients of Fig. 2 of the paper spread. */
	return ldexpf(1.0f, -8 - (int)((i * 7) % 17));
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x > y) - (x < y);
}

double bench_quantile(double *v, size_t n, double q)
{
	size_t i;

	if (n == 0)
		return NAN;
	qsort(v, n, sizeof(*v), cmp_double);
	i = (size_t)ceil(q * (double)n);
	return v[i == 0 ? 0 : (i > n ? n - 1 : i - 1)];
}

void bench_report(const char *what, double *samples_us, size_t n, double cpu_s, const char *extra)
{
	double sum = 0;

	for (size_t i = 0; i < n; i++)
		sum += samples_us[i];
	printf("RESULT what=%s n=%zu min_us=%.1f p10_us=%.1f p50_us=%.1f p90_us=%.1f "
	       "p99_us=%.1f max_us=%.1f mean_us=%.1f cpu_ms_per_sample=%.3f%s%s\n",
	       what, n, bench_quantile(samples_us, n, 0.0), bench_quantile(samples_us, n, 0.10),
	       bench_quantile(samples_us, n, 0.50), bench_quantile(samples_us, n, 0.90),
	       bench_quantile(samples_us, n, 0.99), bench_quantile(samples_us, n, 1.0),
	       n ? sum / (double)n : NAN, n ? cpu_s * 1e3 / (double)n : NAN, extra ? " " : "",
	       extra ? extra : "");
	fflush(stdout);
}

int64_t bench_parse_size(const char *s)
{
	char *end;
	unsigned long long v;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s || s[0] == '-')
		return -1;
	if (*end != '\0') {
		const char *units = "kMG", *u = strchr(units, *end);
		if (u == NULL || end[1] != '\0')
			return -1;
		v <<= 10 * (u - units + 1);
		end++;
	}
	return v <= INT64_MAX ? (int64_t)v : -1;
}
