/*
 * A fork-join pool for one large piece of codec work at a time: aps_pool_run
 * cuts it into n parts and runs them on the pool's threads and the caller's
 * own, returning when every part is done. Calls from several threads take
 * turns. A client's codec of a large tensor uses it (codec_threads).
 */
#ifndef APS_COMMON_POOL_H
#define APS_COMMON_POOL_H

#include <stddef.h>

struct aps_pool;

/* helpers threads beside the caller's (>= 1). Returns 0, APS_ENOMEM or APS_ESYS. */
int aps_pool_new(struct aps_pool **out, unsigned helpers);

/* Joins the threads (NULL-safe). No run may be in progress. */
void aps_pool_free(struct aps_pool *p);

/* fn(ctx, i) for every i in [0, n), each once, on any of the threads; returns after
 * the last. fn must not call aps_pool_run. */
void aps_pool_run(struct aps_pool *p, size_t n, void (*fn)(void *ctx, size_t i), void *ctx);

#endif
