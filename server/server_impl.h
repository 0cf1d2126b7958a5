/*
 * What server.c (lifecycle, sending, lost peers) and handlers.c (one function
 * per message type) share. Not for other modules.
 */
#ifndef APS_SERVER_SERVER_IMPL_H
#define APS_SERVER_SERVER_IMPL_H

#include "server/ckpt_queue.h"
#include "server/job.h"
#include "server/latency.h"
#include "server/server.h"
#include "server/zbridge.h"

struct aps_server {
	uv_loop_t *loop;
	struct aps_zbridge *bridge;
	struct aps_jobs jobs;
	struct aps_msg_limits limits;
	struct aps_server_opts opts;
	bool default_downlink_auto;
	struct aps_format default_downlink;
	struct aps_server_counters counters;
	struct aps_zbridge_counters bridge_counters; /* copied when the bridge closes */
	struct aps_latency latency;                  /* of steps: first push to last result */
	uint64_t started_ms;
	bool stopping;
	struct aps_ckpt_queue *ckpt; /* NULL: no checkpoint_dir */
	uv_timer_t *tick_timer;      /* graces, silences, job deadlines (owned) */
	uint64_t last_tick_ms;
};

#define APS_SERVER_HEADER_MAX 4096 /* bytes of a header frame the daemon packs */

/* Sends m (with payload, or none) to one peer. */
void aps_server_send(struct aps_server *srv, const struct aps_peer *peer, struct aps_msg *m,
                     struct aps_sbuf *payload);

/* An ERROR about request (may be NULL) to peer; counts it. */
void aps_server_send_error(struct aps_server *srv, const struct aps_peer *peer, int code,
                           const struct aps_msg *request, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));

/* The same ERROR to every live rank of job. */
void aps_server_error_job(struct aps_server *srv, struct aps_job *job, int code, const char *text);

/*
 * A rank left (BYE) or was lost (its connection closed): it leaves its job;
 * if a round was in progress the job's rounds are aborted and the other
 * ranks get APS_EPEERLOST naming it; the last rank out ends the job.
 */
void aps_server_rank_gone(struct aps_server *srv, struct aps_session *s, bool lost,
                          const char *why);

/* join.c: WELCOME to a joined session (flags: APS_MSG_FLAG_RESUMED after a reconnect). */
void aps_join_welcome(struct aps_server *srv, struct aps_session *s, uint32_t flags);

/* Zeroes m as a message of type from apsd about rank of job. */
void aps_handle_identity(struct aps_msg *m, enum aps_msg_type type, const struct aps_job *job,
                         uint32_t rank);

/* Frees a job whose last rank left, and gives its memory back to the system. */
void aps_server_end_job(struct aps_server *srv, struct aps_job *job);

/* reconnect.c: a session waiting to reconnect whose rank a new client asks for: lost now. */
void aps_server_evict_detached(struct aps_server *srv, struct aps_session *s);
/* reconnect.c: s's connection closed or went silent (why): it waits for reconnect_grace_ms. */
void aps_reconnect_detach(struct aps_server *srv, struct aps_session *s, const char *why);
/*
 * reconnect.c: a HELLO that names a session apsd knows (its token, job and
 * rank) takes it to in's connection, answered WELCOME (RESUMED when it asked
 * to RESUME); one flagged RESUME of a session apsd does not know gets
 * APS_ENOSESSION. False for a first HELLO, which join.c handles.
 */
bool aps_reconnect_hello(struct aps_server *srv, struct aps_inmsg *in, const struct aps_msg *m);
/* reconnect.c: a session moved away from peer (its late messages are stale). */
bool aps_reconnect_moved_from(const struct aps_server *srv, const struct aps_peer *peer);
/* reconnect.c: graces that ran out, joined sessions that went silent. */
void aps_reconnect_tick(struct aps_server *srv, uint64_t now);
/* join.c: jobs whose ranks did not all arrive within join_timeout_ms end. */
void aps_join_tick(struct aps_server *srv, uint64_t now);

void aps_handle_hello(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_register(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_push(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m,
                     struct aps_inmsg *in);
void aps_handle_barrier(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_exponents(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_heartbeat(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_bye(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_pull(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);

/*
 * Optimize mode (optimize.c). A HELLO's optimizer: 0 with *cfg set (kind
 * NONE for all-reduce), or APS_EINVAL with why.
 */
int aps_optimize_parse_hello(const struct aps_msg *m, struct aps_optim_config *cfg, char *why,
                             size_t why_len);
/* A new job in optimize mode: its settings, and its newest checkpoint if there is one. */
void aps_optimize_job_start(struct aps_server *srv, struct aps_job *job,
                            const struct aps_optim_config *cfg);
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
/* Elastic jobs, after a rank left: finishes what no longer waits for it. */
void aps_job_recheck(struct aps_server *srv, struct aps_job *job);

#endif
