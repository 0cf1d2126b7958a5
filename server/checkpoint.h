/*
 * Checkpoint files of optimize-mode jobs: the master weights and the
 * optimizer state of every tensor of one job, written atomically (temporary
 * file, fsync, rename, fsync of the directory) with a CRC32C over the whole
 * file, and read back from the newest file that is complete and intact.
 * Plain file I/O, no libuv: the daemon runs writes on its thread pool
 * (server/ckpt_queue.c). File layout in docs/OPERATIONS.md, "Checkpoints".
 */
#ifndef APS_SERVER_CHECKPOINT_H
#define APS_SERVER_CHECKPOINT_H

#include "proto/frame.h"
#include "server/optimizer.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_CKPT_ARRAYS_MAX   APS_OPTIM_SAVED_MAX /* weights, then the state */
#define APS_CKPT_PATH_MAX     512
#define APS_CKPT_SALT_BYTES   16
#define APS_CKPT_DIGEST_BYTES 32
#define APS_CKPT_WRITER_MAX   63 /* "key " and a Z85 key, or an address's origin */

/*
 * Who may resume a checkpoint: the job token it was written under, kept as a
 * salted BLAKE2b digest (the token itself is never written). A job without a
 * token writes none: whoever may start the job resumes it, as whoever may
 * join it could read its weights.
 */
struct aps_ckpt_owner {
	bool set;
	uint8_t salt[APS_CKPT_SALT_BYTES];
	uint8_t digest[APS_CKPT_DIGEST_BYTES];
};

/* The owner of a job whose token is token ("": none). Returns 0, or APS_ESYS
 * (no randomness for the salt). */
int aps_ckpt_owner_of(const char *token, struct aps_ckpt_owner *out);

/* Whether a job with token ("": none) may resume a checkpoint owner wrote. */
bool aps_ckpt_owner_admits(const struct aps_ckpt_owner *owner, const char *token);

struct aps_ckpt_tensor {
	char name[APS_MSG_NAME_MAX + 1];
	uint64_t count;
	uint64_t updates, state_t;
	uint32_t n_arrays;                  /* 1 + the optimizer's state slots */
	float *arrays[APS_CKPT_ARRAYS_MAX]; /* each count floats, owned */
	bool borrowed; /* arrays are a job's, not owned: ckpt_copy.h copies them */
};

struct aps_ckpt {
	char job[APS_MSG_JOB_MAX + 1];
	char optimizer[APS_OPTIM_SPEC_MAX]; /* canonical spec (aps_optim_describe) */
	struct aps_ckpt_owner owner;        /* who may resume it */
	/* Who wrote it: the CURVE key ("key " and its Z85) of the job's first rank, or
	 * without CURVE its address's origin (access.h); "" read from the files of
	 * before APSCKPT3. Room is made from the largest writer's files (ckpt_room.h). */
	char writer[APS_CKPT_WRITER_MAX + 1];
	uint64_t step; /* names the file: the largest update count of its tensors */
	uint32_t n_tensors;
	struct aps_ckpt_tensor *tensors; /* owned */
};

/* Frees what ck owns and zeroes it; NULL-safe. */
void aps_ckpt_free(struct aps_ckpt *ck);

/* DIR/JOB.STEP.ckpt, the job name escaped (%XX) to [A-Za-z0-9_-]. Returns 0 or APS_ERANGE. */
int aps_ckpt_path(const char *dir, const char *job, uint64_t step, char *buf, size_t len);

/*
 * Writes ck to aps_ckpt_path(dir, ck->job, ck->step) through PATH.tmp,
 * fsync, rename and an fsync of dir, then removes all but the newest keep
 * files of the job (keep >= 1). Returns 0, or APS_ESYS with why set. Safe
 * on any thread: no logging, no global state.
 */
int aps_ckpt_write(const char *dir, const struct aps_ckpt *ck, unsigned keep, char *why,
                   size_t why_len);

/* Bytes of the file aps_ckpt_write would write for ck. */
uint64_t aps_ckpt_size(const struct aps_ckpt *ck);

/* The header of the file at path alone (job, optimizer, owner, writer, step: no
 * tensors), and the length it says the file has. Returns 0, or APS_EPROTO (a bad
 * header) / APS_ESYS with why. */
int aps_ckpt_read_head(const char *path, struct aps_ckpt *ck, uint64_t *len, char *why,
                       size_t why_len);

/* Reads and checks one file. Returns 0, or APS_EPROTO (torn, corrupt) / APS_ESYS with why. */
int aps_ckpt_read(const char *path, struct aps_ckpt *out, char *why, size_t why_len);

/* What aps_ckpt_load_newest checks of a file from its header, before it reads
 * the file whole. */
struct aps_ckpt_want {
	const char *token;          /* the job's token ("": none): the file's owner must admit it */
	uint64_t max_bytes;         /* a larger file does not fit (0: any) */
	_Atomic uint64_t *progress; /* the bytes of the file being read, as they come (NULL:
	                               not told); another thread may look at it */
};

/*
 * Loads the newest intact checkpoint of job in dir into *out (its path into
 * path), logging every newer file it skips and why. Returns 1 when one was
 * loaded, 0 when there is none, APS_ESYS when dir cannot be read, and with why
 * set, without reading further: APS_EACCES when the newest file's owner does
 * not admit want->token, APS_ERANGE when it is larger than want->max_bytes.
 */
int aps_ckpt_load_newest(const char *dir, const char *job, const struct aps_ckpt_want *want,
                         struct aps_ckpt *out, char *path, size_t path_len, char *why,
                         size_t why_len);

/*
 * What aps_ckpt_load_newest would find from the newest header that reads, without
 * reading a file whole: 1 when there is a file to load (*bytes: its length), 0
 * when there is none, APS_ESYS when dir cannot be read, APS_EACCES / APS_ERANGE
 * with why as there. One directory listing and one small read: cheap enough for
 * the event loop.
 */
int aps_ckpt_check_newest(const char *dir, const char *job, const struct aps_ckpt_want *want,
                          uint64_t *bytes, char *why, size_t why_len);

#endif
