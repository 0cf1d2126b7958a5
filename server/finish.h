/*
 * What a complete chunk, exponent exchange or barrier sends (finish.c).
 */
#ifndef APS_SERVER_FINISH_H
#define APS_SERVER_FINISH_H

#include "server/job.h"

#include <stdint.h>

struct aps_server;

/* Chunk chunk of t is complete: its result to every rank (arrived_ns: when the
 * push that completed it arrived, uv_hrtime); while the job's snapshot is
 * copied (job->copying), once the copy is done (aps_finish_deferred). */
void aps_finish_chunk(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                      uint32_t chunk, uint64_t arrived_ns);
/* The job's snapshot copy is done: the finishes that waited for it. */
void aps_finish_deferred(struct aps_server *srv, struct aps_job *job);

/* Releases job's barrier when every rank it waits for is in it. A rank back in
 * an elastic job first hears its tensors' steps, a batch at a time: its BARRIER
 * follows them, at a later aps_finish_steps_tick when there are many. */
void aps_finish_barrier(struct aps_server *srv, struct aps_job *job);

/* Every tick: the steps of ranks back that wait for room in their pipes. */
void aps_finish_steps_tick(struct aps_server *srv);

/* Elastic jobs, after a rank left: finishes what no longer waits for it. */
void aps_finish_recheck(struct aps_server *srv, struct aps_job *job);

#endif
