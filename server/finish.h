/*
 * What a complete chunk, exponent exchange or barrier sends (finish.c).
 */
#ifndef APS_SERVER_FINISH_H
#define APS_SERVER_FINISH_H

#include "server/job.h"

#include <stdint.h>

struct aps_server;

/* Chunk chunk of t is complete: its result to every rank (arrived_ns: when the
 * push that completed it arrived, uv_hrtime). */
void aps_finish_chunk(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                      uint32_t chunk, uint64_t arrived_ns);

/* Releases job's barrier when every rank it waits for is in it. */
void aps_finish_barrier(struct aps_server *srv, struct aps_job *job);

/* Elastic jobs, after a rank left: finishes what no longer waits for it. */
void aps_finish_recheck(struct aps_server *srv, struct aps_job *job);

#endif
