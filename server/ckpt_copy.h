/*
 * A snapshot's copy off the event loop: the arrays a checkpoint borrowed from
 * its job are copied on libuv's thread pool. Copied on the loop, a job of
 * 384 MiB held every other job's steps for over a second at each
 * checkpoint_steps; now the job's own updates wait for the copy (finish.c
 * defers them) and the others go on.
 */
#ifndef APS_SERVER_CKPT_COPY_H
#define APS_SERVER_CKPT_COPY_H

#include "server/checkpoint.h"

#include <uv.h>

struct aps_ckpt_copy;

/* On the loop thread, when the copy ended: ret 0, ck owns every array; or
 * APS_ENOMEM, ck borrows nothing (the arrays it could not copy are NULL).
 * ck (heap-allocated) is the callee's. */
typedef void (*aps_ckpt_copied_cb)(void *ctx, const struct aps_ckpt_copy *c, struct aps_ckpt *ck,
                                   int ret);

/* Copies the borrowed arrays of ck (heap-allocated, moved in); the caller keeps
 * them unchanged until done is called or aps_ckpt_copy_wait returns. Returns 0
 * and the copy (*out: a tag, freed once done has returned), or APS_ENOMEM /
 * APS_ESYS (ck untouched, still the caller's). */
int aps_ckpt_copy_start(uv_loop_t *loop, struct aps_ckpt *ck, aps_ckpt_copied_cb done, void *ctx,
                        const struct aps_ckpt_copy **out);

/* Blocks until the copy's thread is done with the borrowed arrays; done still
 * comes later, on the loop. */
void aps_ckpt_copy_wait(const struct aps_ckpt_copy *c);

/* Frees p (a borrowed array, or anything) once the copy is done, after its done
 * callback: the job that lent it may end first without waiting. Waits (and
 * frees now) where it cannot keep it: no memory. */
void aps_ckpt_copy_free_later(const struct aps_ckpt_copy *c, void *p);

#endif
