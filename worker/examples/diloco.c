/*
 * DiLoCo from C: the outer loop of aps.torch.DiLoCo on the C ABI alone. The
 * client runs in optimize mode with the outer optimizer, SGD with Nesterov
 * momentum; each worker takes `every` inner steps on its own weights, then
 * sends its pseudo-gradient (the weights at the last sync minus its weights
 * now) through aps_client_step, whose answer moves the anchor to the new
 * master weights, and starts again from them. The protocol needs nothing
 * else.
 *
 * The model is a toy: least squares, each rank with its own data (rows of a
 * fixed A, targets A w* + a rank's offset), the inner optimizer plain SGD.
 * Prints one line per sync and, at the end, the loss of the master weights on
 * every rank's data and a checksum of them (the same on every rank).
 *
 *   diloco --endpoint tcp://127.0.0.1:5555 --rank R --world W
 *          [--steps 40] [--every 4] [--format e4m3] [--outer-lr 0.7]
 */
#include "aps.h"

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DIM  64 /* parameters */
#define ROWS 32 /* examples per rank */

struct args {
	const char *endpoint, *format;
	int rank, world, steps, every;
	float outer_lr;
};

/* A fixed pseudo-random value in [-0.5, 0.5) for (i, j, salt). */
static float hash01(uint32_t i, uint32_t j, uint32_t salt)
{
	uint32_t z = i * 0x9e3779b1u ^ j * 0x85ebca77u ^ salt * 0xc2b2ae3du;

	z ^= z >> 15;
	z *= 0x2c1b3c6du;
	z ^= z >> 12;
	return (float)(z >> 8) / 16777216.0f - 0.5f;
}

/* Rank r's rows of A and targets b = A w* + 0.1 r (the ranks disagree a little). */
static void make_data(int r, float *a, float *b)
{
	for (int i = 0; i < ROWS; i++) {
		float dot = 0;
		for (int j = 0; j < DIM; j++) {
			a[i * DIM + j] = hash01((uint32_t)(r * ROWS + i), (uint32_t)j, 1);
			dot += a[i * DIM + j] * hash01((uint32_t)j, 0, 2);
		}
		b[i] = dot + 0.1f * (float)r;
	}
}

/* Mean squared error of w on (a, b); with grad != NULL also its gradient. */
static float loss(const float *a, const float *b, const float *w, float *grad)
{
	float sum = 0;

	if (grad != NULL)
		memset(grad, 0, DIM * sizeof(float));
	for (int i = 0; i < ROWS; i++) {
		float e = -b[i];
		for (int j = 0; j < DIM; j++)
			e += a[i * DIM + j] * w[j];
		sum += e * e;
		for (int j = 0; grad != NULL && j < DIM; j++)
			grad[j] += 2.0f * e * a[i * DIM + j] / ROWS;
	}
	return sum / ROWS;
}

static int fail(const char *what, int ret)
{
	fprintf(stderr, "diloco: %s: %s (%s)\n", what, aps_strerror(ret), aps_last_error());
	return 1;
}

static int parse(struct args *a, int argc, char **argv)
{
	*a = (struct args){
		.format = "e4m3", .rank = -1, .steps = 40, .every = 4, .outer_lr = 0.7f
	};
	for (int i = 1; i + 1 < argc; i += 2) {
		const char *k = argv[i], *v = argv[i + 1];
		if (!strcmp(k, "--endpoint"))
			a->endpoint = v;
		else if (!strcmp(k, "--rank"))
			a->rank = atoi(v);
		else if (!strcmp(k, "--world"))
			a->world = atoi(v);
		else if (!strcmp(k, "--steps"))
			a->steps = atoi(v);
		else if (!strcmp(k, "--every"))
			a->every = atoi(v);
		else if (!strcmp(k, "--format"))
			a->format = v;
		else if (!strcmp(k, "--outer-lr"))
			a->outer_lr = strtof(v, NULL);
		else
			return -1;
	}
	return a->endpoint != NULL && a->rank >= 0 && a->world > a->rank && a->every > 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct aps_client_opts o;
	struct args a;
	aps_client *c;
	uint32_t id;
	float data_a[ROWS * DIM], data_b[ROWS], w[DIM], anchor[DIM], delta[DIM], grad[DIM];
	int ret;

	if (parse(&a, argc, argv) < 0) {
		fprintf(stderr, "usage: diloco --endpoint E --rank R --world W [--steps N] "
		                "[--every H] [--format F] [--outer-lr LR]\n");
		return 2;
	}
	make_data(a.rank, data_a, data_b);
	for (int j = 0; j < DIM; j++) /* each rank its own start: rank 0's is taken */
		anchor[j] = 0.1f * hash01((uint32_t)a.rank, (uint32_t)j, 3);
	aps_client_opts_init(&o);
	o.endpoint = a.endpoint;
	o.job = "diloco-c";
	o.rank = (uint32_t)a.rank;
	o.world_size = (uint32_t)a.world;
	o.format = a.format;
	o.optimizer = "sgd,momentum=0.9,nesterov=1"; /* the outer optimizer */
	if ((ret = aps_client_new(&c, &o)) < 0)
		return fail("aps_client_new", ret);
	if ((ret = aps_client_register(c, "w", DIM, &id)) < 0 ||
	    (ret = aps_client_broadcast(c, id, anchor, DIM, -1)) < 0) /* rank 0's weights */
		return fail("broadcast", ret);
	memcpy(w, anchor, sizeof(w));
	printf("start loss=%.6f\n", (double)loss(data_a, data_b, w, NULL));
	for (int step = 1; step <= a.steps; step++) {
		loss(data_a, data_b, w, grad); /* the inner step: plain SGD */
		for (int j = 0; j < DIM; j++)
			w[j] -= 0.05f * grad[j];
		if (step % a.every != 0)
			continue;
		for (int j = 0; j < DIM; j++) /* the pseudo-gradient */
			delta[j] = anchor[j] - w[j];
		if ((ret = aps_client_step(c, id, delta, anchor, DIM, a.outer_lr, -1)) < 0)
			return fail("aps_client_step", ret);
		memcpy(w, anchor, sizeof(w)); /* everyone from the new master weights */
		printf("sync step=%d loss=%.6f\n", step, (double)loss(data_a, data_b, w, NULL));
	}
	float master[DIM];
	uint64_t updates = 0;
	if ((ret = aps_client_pull(c, id, master, DIM, -1, &updates)) < 0)
		return fail("aps_client_pull", ret);
	uint32_t sum = 0;
	for (int j = 0; j < DIM; j++) {
		uint32_t bits;
		memcpy(&bits, &w[j], sizeof(bits));
		sum = sum * 31u + bits;
	}
	double off = 0;
	for (int j = 0; j < DIM; j++)
		off = fmax(off, fabs((double)master[j] - w[j]));
	printf("end loss=%.6f updates=%llu weights=%08x max|master-weights|=%g\n",
	       (double)loss(data_a, data_b, w, NULL), (unsigned long long)updates, sum, off);
	aps_client_close(c);
	return 0;
}
