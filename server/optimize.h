/*
 * Optimize mode (optimize.c): apsd holds the weights and applies the update;
 * workers PULL them. Checkpoints of its jobs.
 */
#ifndef APS_SERVER_OPTIMIZE_H
#define APS_SERVER_OPTIMIZE_H

#include "proto/frame.h"
#include "server/job.h"
#include "server/optimizer.h"

#include <stdbool.h>
#include <stddef.h>

struct aps_server;

/* A HELLO's optimizer: 0 with *cfg set (kind NONE for all-reduce), or APS_EINVAL with why. */
int aps_optimize_parse_hello(const struct aps_msg *m, struct aps_optim_config *cfg, char *why,
                             size_t why_len);
/*
 * Before a new job of optimize mode starts: whether there is a checkpoint of
 * its name to resume, which the HELLO's job token must own (checkpoint.h) and
 * which must fit max_job_bytes and what max_address_bytes (of the jobs of
 * origin, the HELLO's address: access.h) and max_total_bytes leave, from the
 * newest file's header. Returns 1 (*want and *bytes for aps_ckpt_load_start;
 * want->token is m's), 0 (none, or checkpoints off), or APS_EACCES /
 * APS_ERANGE with why: the HELLO is refused.
 */
int aps_optimize_resume_check(struct aps_server *srv, const struct aps_msg *m, const char *origin,
                              const struct aps_optim_config *cfg, struct aps_ckpt_want *want,
                              uint64_t *bytes, char *why, size_t why_len);
/* A new job in optimize mode: its settings. */
void aps_optimize_job_start(struct aps_job *job, const struct aps_optim_config *cfg);
/*
 * The read of job's checkpoint ended (ckpt_load.h's ret, ck, path, why): the job
 * takes ck (moved in) if it still fits what max_total_bytes leaves. Returns 0
 * (resumed, or nothing to resume), or APS_EACCES / APS_ERANGE with why in
 * out: the job's ranks are refused.
 */
int aps_optimize_job_resume(struct aps_server *srv, struct aps_job *job, int ret,
                            struct aps_ckpt *ck, const char *path, const char *why, char *out,
                            size_t out_len);
/* What max_total_bytes counts of job's checkpoint for a tensor registered as
 * name and count, which it will take (0: none). */
uint64_t aps_optimize_resumed_bytes(const struct aps_job *job, const char *name, uint64_t count);
/* A new tensor of an optimize job: its state, resumed when the checkpoint has it. */
int aps_optimize_register(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t);
/* A PUSH or BROADCAST agrees with the job's mode; false after an ERROR to s. */
bool aps_optimize_check_push(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                             const struct aps_msg *m);
/* A chunk's result was encoded: the workers' view follows it; a finished step counts. */
void aps_optimize_chunk_done(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                             const struct aps_round_result *res, bool broadcast);
/* When a snapshot is taken, which says how it takes the job's arrays. */
enum aps_snapshot {
	APS_SNAPSHOT_STEP, /* every checkpoint_steps: copied on a thread (ckpt_copy.h), the
	                      job's updates wait; skipped while the last is copied */
	APS_SNAPSHOT_END,  /* the job ends (freed next): moved out, no copy */
	APS_SNAPSHOT_STOP, /* apsd stops: copied on the loop */
};
/* Queues a checkpoint of job (when checkpoints are on and it has weights). */
void aps_optimize_checkpoint(struct aps_server *srv, struct aps_job *job, const char *why,
                             enum aps_snapshot when);
/* PULL: the weights of a tensor, to the rank that asked. */
void aps_handle_pull(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);

#endif
