/*
 * Room for a checkpoint within checkpoint_max_bytes. The files of every job in
 * checkpoint_dir count together, with the one to be written. When they leave
 * no room, the files of jobs apsd does not have (jobs that ended) give it: the
 * writer (checkpoint.h) whose files hold the most bytes gives first, its oldest
 * file first, until the new one fits. A stranger who fills the bound with jobs
 * after jobs so removes its own files, not an honest job's; the files of jobs
 * that run, and the older files of the job being written, are never removed.
 * Files whose header does not read (no job could resume them) go before any
 * writer's; a file that cannot be opened stays. A file that will not go (its
 * job started meanwhile, or unlink fails) is passed over, and removals stop
 * when what may still go would not make room. Plain file I/O on the caller's thread (ckpt_queue.c:
 * libuv's pool).
 */
#ifndef APS_SERVER_CKPT_ROOM_H
#define APS_SERVER_CKPT_ROOM_H

#include "server/checkpoint.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_CKPT_ROOM_SHOWN 8 /* files removed that a room names (the log's lines) */

/* A file removed to make room. */
struct aps_ckpt_evicted {
	char job[APS_MSG_JOB_MAX + 1]; /* "" when its header did not read */
	char writer[APS_CKPT_WRITER_MAX + 1];
	uint64_t step, bytes;
};

/* What room a write asks for, and what it cost. */
struct aps_ckpt_room {
	/* in */
	const char *dir;
	uint64_t max_bytes;        /* 0: no bound */
	const struct aps_ckpt *ck; /* to be written: its job and its size */
	char **live;               /* the jobs apsd has: their files stay */
	size_t n_live;
	bool keep_all; /* the jobs apsd has are not known (no memory): no file goes */
	/* Removes the file at path of job ("" when its header did not read): 0, or < 0
	 * when it stays (a job of that name started meanwhile: ckpt_queue.c checks and
	 * removes under one lock). NULL: unlink. */
	int (*remove)(void *ctx, const char *job, const char *path);
	void *remove_ctx;
	/* out */
	uint32_t n_evicted; /* files removed */
	uint64_t evicted_bytes;
	struct aps_ckpt_evicted shown[APS_CKPT_ROOM_SHOWN]; /* the first n_evicted of them */
};

/*
 * Makes room in r->dir for r->ck within r->max_bytes, removing files as above
 * (r's out fields say which). Returns 0, or APS_ESYS with why naming
 * checkpoint_max_bytes when the files that may not be removed leave no room
 * (or the directory cannot be read).
 */
int aps_ckpt_room_make(struct aps_ckpt_room *r, char *why, size_t why_len);

#endif
