/*
 * Helpers shared by the all-reduce benchmarks (bench_allreduce, bench_zmq_echo):
 * clocks, the tensor set a step all-reduces, gradient-like data, and the one
 * RESULT line a driver parses.
 */
#ifndef APS_BENCH_UTIL_H
#define APS_BENCH_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The tensors of one step: ResNet-50's 161, or one tensor of n elements. */
struct bench_tensors {
	size_t n;            /* tensors */
	const char **names;  /* n names */
	uint64_t *counts;    /* n element counts */
	uint64_t total;      /* elements over all tensors */
	uint64_t max_count;  /* largest tensor */
	const char *summary; /* "resnet50" or "single" */
};

/* "resnet50" or a positive element count; 0 or a negative errno-style code. */
int bench_tensors_init(struct bench_tensors *t, const char *spec);
void bench_tensors_fini(struct bench_tensors *t);

/* CLOCK_MONOTONIC in seconds. */
double bench_now(void);

/* User + system CPU seconds of this process (every thread). */
double bench_cpu(void);

/* Gradient-like values (bell-shaped, |x| ~ scale), deterministic in seed. */
void bench_fill(float *x, size_t n, uint64_t seed, double scale);

/* The scale of tensor i: layers sit binades apart (APS.md section 2). */
float bench_layer_scale(size_t i);

/* Nearest-rank quantile q in [0, 1] of v[0..n), which it sorts. */
double bench_quantile(double *v, size_t n, double q);

/*
 * Prints "RESULT what=<what> n=... min_us=... p10_us=... p50_us=... p90_us=...
 * p99_us=... max_us=... mean_us=... cpu_ms_per_sample=..." then extra (a
 * string of key=value fields, may be NULL). Sorts samples_us.
 */
void bench_report(const char *what, double *samples_us, size_t n, double cpu_s, const char *extra);

/* Parses a non-negative integer with an optional k/M/G (1024-based) suffix; -1 if bad. */
int64_t bench_parse_size(const char *s);

#endif
