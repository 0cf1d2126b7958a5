/*
 * Round latencies: the last APS_LATENCY_WINDOW durations in a ring, and
 * exact percentiles over them on demand (the stats socket asks rarely).
 */
#ifndef APS_SERVER_LATENCY_H
#define APS_SERVER_LATENCY_H

#include <stddef.h>
#include <stdint.h>

#define APS_LATENCY_WINDOW 4096

struct aps_latency {
	uint64_t ns[APS_LATENCY_WINDOW];
	uint64_t count; /* durations ever added */
};

void aps_latency_add(struct aps_latency *l, uint64_t ns);

/* The p-th percentile (0 < p <= 100) of the window, in ns; 0 when empty. */
uint64_t aps_latency_percentile(const struct aps_latency *l, double p);

#endif
