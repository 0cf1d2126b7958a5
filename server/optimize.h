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
 * Before a new job of optimize mode starts: the newest checkpoint of its name,
 * which the HELLO's job token must own (checkpoint.h) and which must fit
 * max_job_bytes and what max_total_bytes leaves, read whole only then.
 * Returns 1 with *ck loaded, 0 (none, or checkpoints off), or APS_EACCES /
 * APS_ERANGE with why: the HELLO is refused.
 */
int aps_optimize_resume_load(struct aps_server *srv, const struct aps_msg *m,
                             const struct aps_optim_config *cfg, struct aps_ckpt *ck, char *why,
                             size_t why_len);
/* A new job in optimize mode: its settings, and the checkpoint ck it resumes (moved
 * in; nothing when ck->n_tensors is 0). */
void aps_optimize_job_start(struct aps_server *srv, struct aps_job *job,
                            const struct aps_optim_config *cfg, struct aps_ckpt *ck);
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
/* Queues a checkpoint of job (when checkpoints are on and it has weights). */
void aps_optimize_checkpoint(struct aps_server *srv, struct aps_job *job, const char *why);
/* PULL: the weights of a tensor, to the rank that asked. */
void aps_handle_pull(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);

#endif
