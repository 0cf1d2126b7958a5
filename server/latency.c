/*
 * A ring of recent round durations and their percentiles (nearest rank).
 */
#include "server/latency.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void aps_latency_add(struct aps_latency *l, uint64_t ns)
{
	l->ns[l->count % APS_LATENCY_WINDOW] = ns;
	l->count++;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

uint64_t aps_latency_percentile(const struct aps_latency *l, double p)
{
	size_t n = l->count < APS_LATENCY_WINDOW ? (size_t)l->count : APS_LATENCY_WINDOW;
	uint64_t sorted[APS_LATENCY_WINDOW];
	size_t rank;

	if (n == 0)
		return 0;
	memcpy(sorted, l->ns, n * sizeof(sorted[0]));
	qsort(sorted, n, sizeof(sorted[0]), cmp_u64);
	rank = (size_t)ceil(p / 100.0 * (double)n);
	return sorted[rank > 0 ? rank - 1 : 0];
}
