/*
 * A job's checkpoint read off the event loop: aps_ckpt_load_newest runs on
 * libuv's thread pool (a 384 MiB file held the loop, and every other job,
 * for 2.9 s), and what it found is handed to the loop thread. The loop does
 * not end while a read runs.
 */
#ifndef APS_SERVER_CKPT_LOAD_H
#define APS_SERVER_CKPT_LOAD_H

#include "server/checkpoint.h"

#include <stdint.h>
#include <uv.h>

struct aps_ckpt_loader;
struct aps_ckpt_load;

/*
 * On the loop thread, when the read of job's checkpoint ended: ret as
 * aps_ckpt_load_newest's (1: ck holds it, the callee may take it and zero
 * *ck; what is left is freed after), path the file's, why the reason of a
 * refusal (APS_EACCES, APS_ERANGE).
 */
typedef void (*aps_ckpt_loaded_cb)(void *ctx, const struct aps_ckpt_load *l, const char *job,
                                   uint64_t bytes, int ret, struct aps_ckpt *ck, const char *path,
                                   const char *why);

/* Starts reading the newest intact checkpoint of job in dir for want (every
 * string copied) when q has room; bytes (what the caller counts for it until
 * done) comes back to done. Returns 0 and the read (*out: a tag, freed when
 * done has returned), or APS_ENOMEM. */
int aps_ckpt_load_start(struct aps_ckpt_loader *q, const char *dir, const char *job,
                        const struct aps_ckpt_want *want, uint64_t bytes, aps_ckpt_loaded_cb done,
                        void *ctx, const struct aps_ckpt_load **out);

/* How far read l is: *read of its *bytes (what aps_ckpt_load_start was told; 0
 * read while it waits for its turn). On the loop thread. */
void aps_ckpt_load_progress(const struct aps_ckpt_load *l, uint64_t *read, uint64_t *bytes);

/* Bytes read by every read of q so far: it grows while the disk works, also for
 * a read that waits for its turn (on the loop thread). */
uint64_t aps_ckpt_loader_read(const struct aps_ckpt_loader *q);

/* Reads, at most 2 at once on libuv's pool (the others wait in the order they
 * came: the pool's other threads are for snapshot copies and writes). Returns 0
 * or APS_ENOMEM. */
int aps_ckpt_loader_new(struct aps_ckpt_loader **out, uv_loop_t *loop);

/* Frees an idle loader (NULL-safe); a busy one is left to the loop and leaked. */
void aps_ckpt_loader_free(struct aps_ckpt_loader *q);

#endif
