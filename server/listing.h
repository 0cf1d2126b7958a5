/*
 * What a report lists when the jobs hold more than it can: a budget of lines
 * shared out among the jobs, smallest first, so that a job of many tensors
 * or ranks cannot crowd the others out of /metrics or the stats socket.
 */
#ifndef APS_SERVER_LISTING_H
#define APS_SERVER_LISTING_H

#include <stddef.h>
#include <stdint.h>

/*
 * quota[i]: how many of its want[i] lines the i-th of n jobs lists, at most
 * max of them together; a job that wants less than an even share of what is
 * left gets all it wants. Returns the lines left out, or -1 when out of memory.
 */
int64_t aps_listing_share(const uint32_t *want, size_t n, uint32_t max, uint32_t *quota);

#endif
