/*
 * Checkpoint writes off the event loop: snapshots are written one at a time
 * on libuv's thread pool, in the order they were queued; a queued snapshot
 * that has not started is replaced by a newer one of the same job. The loop
 * does not end while a write is running or queued, so a snapshot queued at
 * SIGTERM reaches the disk before the daemon exits.
 */
#ifndef APS_SERVER_CKPT_QUEUE_H
#define APS_SERVER_CKPT_QUEUE_H

#include "server/checkpoint.h"
#include "server/ckpt_room.h"

#include <stdbool.h>
#include <uv.h>

struct aps_ckpt_queue;

/* Called on the loop thread when a write ended: ret 0, or APS_ESYS with why;
 * room says which files were removed to make room for it (ckpt_room.h). */
typedef void (*aps_ckpt_done_cb)(void *ctx, const struct aps_ckpt *ck, int ret, const char *why,
                                 const struct aps_ckpt_room *room, double seconds);

/* The jobs apsd has, asked on the loop thread as a write starts: *names a heap
 * array of heap strings, *n of them (the queue frees them). Returns 0, or
 * APS_ENOMEM: then that write removes no file to make room. */
typedef int (*aps_ckpt_live_cb)(void *ctx, char ***names, size_t *n);

/* dir is copied; max_bytes bounds every job's files together (ckpt_room.h; 0: no
 * bound), and live names the jobs whose files stay. Returns 0 or APS_ENOMEM. */
int aps_ckpt_queue_new(struct aps_ckpt_queue **out, uv_loop_t *loop, const char *dir, unsigned keep,
                       uint64_t max_bytes, aps_ckpt_live_cb live, aps_ckpt_done_cb done, void *ctx);

/* Queues ck (heap-allocated; the queue takes ownership and frees it). */
void aps_ckpt_queue_push(struct aps_ckpt_queue *q, struct aps_ckpt *ck);

/* On the loop thread, before a job that may resume looks for its files: while a
 * write runs, its room removes none of them (job: the job's name). */
void aps_ckpt_queue_job_starts(struct aps_ckpt_queue *q, const char *job);

/* True when nothing is written or waiting. */
bool aps_ckpt_queue_idle(const struct aps_ckpt_queue *q);

/* Frees an idle queue (NULL-safe); a busy one is left to the loop and leaked. */
void aps_ckpt_queue_free(struct aps_ckpt_queue *q);

#endif
