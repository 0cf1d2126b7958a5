/*
 * Jobs and their members: a job is a named group of world_size ranks that
 * registers the same tensors and reduces them together. This module owns the
 * job table, the sessions (one per connected worker), the tensors of a job
 * and its barrier. It decides nothing about messages: server.c does.
 */
#ifndef APS_SERVER_JOB_H
#define APS_SERVER_JOB_H

#include "common/format.h"
#include "common/log.h"
#include "common/scale.h"
#include "proto/frame.h"
#include "server/checkpoint.h"
#include "server/optimizer.h"
#include "server/policy.h"
#include "server/replay.h"
#include "server/round.h"
#include "server/zbridge.h"

#include <stdbool.h>
#include <stdint.h>

struct aps_job;

#define APS_JOB_ORIGIN_LEN 64 /* an IPv6 address, "/64" */

/* One connected worker. */
/* The job table's indexes of sessions (job.c): by routing id, and by the one a
 * session moved from (reconnect.c). */
enum aps_session_key {
	APS_SESSION_BY_PEER,
	APS_SESSION_BY_MOVED_FROM,
	APS_SESSION_KEYS
};

struct aps_session {
	struct aps_session *next, *prev;                  /* aps_jobs.sessions, newest first */
	struct aps_session *index_next[APS_SESSION_KEYS]; /* in aps_jobs.index's buckets */
	struct aps_peer peer;
	uint64_t conn;        /* connection of its last message (conns.h) */
	uint64_t detached_ms; /* when that connection closed and the rank waits to
	                         reconnect (reconnect_grace_ms); 0: connected */
	struct aps_job *job;  /* NULL until its HELLO was accepted */
	uint32_t rank;
	uint32_t minor; /* protocol minor version of its HELLO */
	uint64_t joined_ms, last_seen_ms;
	uint64_t msgs_in, bytes_in, bytes_out;
	uint32_t reconnects;  /* connections that came back: resent calls are expected */
	uint64_t unread_conn; /* the connection dropped for answers unread (outbox.h), or 0 */
	char address[64];     /* the peer's address as ZeroMQ reports it */
	char user[41];        /* CURVE: the Z85 key it authenticated with; "" without CURVE */
	uint8_t token[APS_MSG_SESSION_LEN]; /* from its HELLO: what takes the session back */
	struct aps_peer moved_from;         /* its routing id before it last moved (len 0: none):
	                                       late messages from there are dropped */
	/* A rank back in an elastic job hears its tensors' steps a batch at a time,
	 * then the barrier that let it in (finish.c): */
	bool steps_due;         /* REGISTEREDs from tensor steps_next on, then that BARRIER */
	uint32_t steps_next;    /* a tensor id */
	uint64_t steps_barrier; /* the barrier's step */
};

/* What the stats socket reports about a tensor. */
struct aps_tensor_stats {
	char format[16];          /* rank 0's uplink format at its last push */
	int scale_exp;            /* rank 0's uplink exponent at its last push */
	int down_scale_exp;       /* the downlink exponent of the last result chunk */
	double flushed_fraction;  /* of the last step: flushed / (count * world_size) */
	double rel_error;         /* of the last step's result against the fp32 mean */
	uint64_t overflow;        /* downlink values that saturated, over all steps */
	uint64_t bytes_in;        /* payload bytes received */
	uint64_t elements_in;     /* elements those bytes carried */
	uint64_t bytes_out;       /* payload bytes sent */
	uint64_t steps;           /* steps completed */
	uint64_t step_started_ns; /* uv_hrtime of the step's first contribution */
};

struct aps_tensor {
	char name[APS_MSG_NAME_MAX + 1];
	uint32_t id;
	struct aps_job *job; /* its job (borrowed) */
	uint64_t count;
	bool *registered; /* world_size: the rank registered this tensor */
	struct aps_round round;
	struct aps_tensor_stats stats;
	struct aps_tensor_policy policy;
	/* Global mode: the exponent exchange before the next push. */
	bool *exp_has; /* world_size: the rank sent its exponent */
	uint32_t exp_arrived;
	int32_t exp_max;
	/* The last exchange that completed, answered again to a rank that reconnected. */
	bool exp_done;
	uint64_t exp_done_step; /* the step it was for */
	int32_t exp_done_max;
	struct aps_replay replay;    /* each chunk's last result, for ranks that reconnected */
	struct aps_optim_tensor opt; /* optimize mode: weights and state */
	/* Optimize mode: the weights as PULL sends them, a buffer a chunk (round.n_chunks),
	 * made at the first pull of update count pulled_updates (pulled_stepped chunks
	 * of the next step in) and shared by every rank's pulls of it (NULL: none);
	 * counted in its job's overhead_bytes. */
	struct aps_sbuf **pulled;
	uint64_t pulled_updates;
	uint32_t pulled_stepped;
	struct aps_tally *unsent; /* per rank: its answers' payloads libzmq has not sent */
	const struct aps_optim_config *optim; /* the job's, for the round's transform */
};

/* A complete chunk whose finish waits for its job's snapshot copy (finish.c). */
struct aps_deferred_finish {
	struct aps_deferred_finish *next;
	struct aps_tensor *t;
	uint32_t chunk;
	uint64_t step, arrived_ns;
};

struct aps_job {
	struct aps_job *next;
	char name[APS_MSG_JOB_MAX + 1];
	uint32_t world_size;
	enum aps_scaling scaling;
	bool downlink_auto; /* RESULT in each tensor's uplink format */
	bool lowp;          /* sum rounded to the format after each addition */
	bool no_crc;        /* payloads travel without CRC32C (the first HELLO's choice) */
	bool elastic;       /* a lost rank shrinks the job instead of failing it */
	struct aps_policy_config policy;
	size_t chunk_elems; /* elements per chunk of its tensors */
	uint32_t block;     /* scaling block: elements per block (16, 32, 64), else 0 */
	struct aps_format downlink;
	struct aps_session **ranks; /* world_size; NULL: not connected */
	/*
	 * world_size; elastic jobs only: true for a rank that does not take part
	 * in rounds, barriers and exponent exchanges: lost, or back and waiting
	 * for the job's next barrier to take part again. Every round reads it.
	 */
	bool *absent;
	struct aps_tensor **tensors; /* by id, the order they were registered in */
	struct aps_tensor **by_name; /* the same, sorted by name (aps_job_tensor_by_name) */
	uint32_t n_tensors, cap_tensors;
	uint64_t tensor_bytes;   /* fp32 bytes of its tensors (optimize mode: with weights and
	                            state): what max_job_bytes bounds */
	uint64_t overhead_bytes; /* what they keep besides values (aps_job_tensor_overhead) */
	/* A rank's answers that may be in flight at once: two of each tensor's (a pull
	 * may start while the last is unread, optimize.c), a message a chunk and one
	 * more. More waiting for a rank means its client does not read (outbox.c). */
	uint64_t answer_msgs;
	uint64_t barrier_step;
	bool *barrier_has;
	/* Per rank: the REGISTEREDs to a rank back (s->steps_due) waiting in the bridge;
	 * NULL until a rank is back, or out of memory (then sent all at once). */
	struct aps_tally *steps_unsent;
	uint32_t barrier_arrived;
	uint64_t rounds_completed;
	struct aps_optim_config optim;       /* kind APS_OPTIM_NONE: all-reduce mode */
	char optim_spec[APS_OPTIM_SPEC_MAX]; /* canonical, "" in all-reduce mode */
	struct aps_ckpt resume;              /* loaded at start; tensors taken at REGISTER */
	uint64_t resume_bytes; /* of resume, not taken yet: max_total_bytes counts it */
	/* Its checkpoint being read (ckpt_load.h; a tag, not owned): its ranks' WELCOMEs
	 * wait, and they may send only HELLO, HEARTBEAT and BYE. */
	const struct aps_ckpt_load *loading;
	uint64_t loading_told_ms; /* when its ranks last heard how far the read is */
	/* Its snapshot being copied (ckpt_copy.h; a tag, not owned): its weights must
	 * not change meanwhile, and the finishes that would step them wait here. */
	const struct aps_ckpt_copy *copying;
	struct aps_deferred_finish *deferred;      /* newest first */
	struct aps_ckpt_owner ckpt_owner;          /* its token's, written in its checkpoints */
	char ckpt_writer[APS_CKPT_WRITER_MAX + 1]; /* who writes them (checkpoint.h) */
	uint64_t last_ckpt_step;                   /* step of the last checkpoint queued */
	bool unsaved; /* stepped since its last checkpoint was queued, or that one failed */
	/*
	 * Why the first rank that was lost or left did so, "" while every rank is
	 * there: no later round of the job can complete, so every later
	 * collective call is answered APS_EPEERLOST with this text at once.
	 */
	char departed[APS_MSG_TEXT_MAX + 1];
	int departed_code;    /* the error the job's later calls get: 0 is APS_EPEERLOST */
	uint64_t departed_ms; /* the tick that first saw departed: it ends join_timeout_ms on */
	char token[APS_MSG_TOKEN_MAX + 1]; /* its first HELLO's job token: the others' must match */
	uint64_t created_ms;               /* its first HELLO */
	char origin[APS_JOB_ORIGIN_LEN];   /* its first HELLO's address (IPv6: its /64) */
	bool filled;                       /* every rank has joined once: no deadline */
	struct aps_log_gate mismatch_log;  /* HELLOs refused for their options (join.c) */
	struct aps_held_share *held;       /* its early pushes' part of max_held_bytes */
};

/*
 * Sessions by a routing id: chained buckets, a power of two of them, at most
 * one session a bucket on average, hashed with a key (peer.h): nobody can pick
 * ids that share a bucket. Before, every message walked a list of every session: 3000
 * connections whose HELLO was refused cost an honest job more than half its
 * steps (an attack on 2026-12-07).
 */
struct aps_session_index {
	struct aps_session **buckets;
	size_t n_buckets, n;
};

/*
 * A part of max_held_bytes (round.h), one for the jobs started from one
 * address (their origin): a stranger's 16 jobs from one address get one fair
 * part, not 16. Jobs from 127.0.0.1, ::1 and ipc, where a host's own workers
 * start theirs, get one each.
 */
struct aps_held_share {
	struct aps_held_share *next;
	char origin[APS_JOB_ORIGIN_LEN]; /* "": one job's own */
	uint32_t jobs;
	struct aps_round_share share;
};

struct aps_jobs {
	struct aps_job *jobs;
	struct aps_held_share *shares;
	struct aps_session *sessions;
	uint32_t n_jobs;
	struct aps_session_index index[APS_SESSION_KEYS];
	struct aps_peer_hasher hasher;
};

/* The session of a peer, or NULL. */
struct aps_session *aps_jobs_find_session(struct aps_jobs *t, const struct aps_peer *peer);
/* The joined session that moved away from peer (its last reconnect), or NULL. */
struct aps_session *aps_jobs_find_moved(struct aps_jobs *t, const struct aps_peer *peer);
/* s (from aps_jobs_session) goes on under peer: the one it had is what it moved from. */
void aps_jobs_move_session(struct aps_jobs *t, struct aps_session *s, const struct aps_peer *peer);
/* The session of a peer, created when new; NULL when out of memory. */
struct aps_session *aps_jobs_session(struct aps_jobs *t, const struct aps_peer *peer);
/* Detaches the session from its job (if any) and frees it. */
void aps_jobs_drop_session(struct aps_jobs *t, struct aps_session *s);

struct aps_job *aps_jobs_find(struct aps_jobs *t, const char *name);
/* What every job holds that max_total_bytes bounds: values, bookkeeping, checkpoints
 * loaded and not taken yet; and in *of_origin, what the jobs started from origin
 * hold (max_address_bytes). */
uint64_t aps_jobs_bytes(const struct aps_jobs *t, const char *origin, uint64_t *of_origin);
/* The same, of one job. */
uint64_t aps_job_bytes(const struct aps_job *job);
/* A new job (world_size ranks, none connected). Returns 0 or APS_ENOMEM. */
int aps_jobs_create(struct aps_jobs *t, const char *name, uint32_t world_size,
                    struct aps_job **out);
/* The job's part of pool (job->held): that of the other jobs of origin, or its
 * own ("" or local). Returns 0 or APS_ENOMEM. */
int aps_jobs_share_held(struct aps_jobs *t, struct aps_job *job, const char *origin, bool local,
                        struct aps_round_held *pool);
/* Frees a job that has no session left. */
void aps_jobs_remove(struct aps_jobs *t, struct aps_job *job);
void aps_jobs_free_all(struct aps_jobs *t);

/* Live ranks of a job. */
uint32_t aps_job_connected(const struct aps_job *job);
/*
 * An elastic job's rank was lost: its place in the open barrier and exponent
 * exchanges is cleared, so that it can enter them again when it is back.
 */
void aps_job_forget_rank(struct aps_job *job, uint32_t rank);
/* Ranks that take part in the job's rounds (all but the absent ones). */
uint32_t aps_job_members(const struct aps_job *job);

/* The tensor of that name, NULL if none: a binary search (a REGISTER scanned
 * every name, 0.46 ms a call at 16384 tensors, an attack on 2026-12-07). */
struct aps_tensor *aps_job_tensor_by_name(struct aps_job *job, const char *name);
struct aps_tensor *aps_job_tensor(struct aps_job *job, uint32_t id);
/* Bytes a tensor of count elements keeps besides its values, most of it per rank of
 * each chunk: counted in tensor_bytes with them (max_job_bytes, max_total_bytes). */
uint64_t aps_job_tensor_overhead(const struct aps_job *job, uint64_t count);

/* Adds a tensor with the next id. Returns 0, APS_ENOMEM or APS_ERANGE (limit). */
int aps_job_add_tensor(struct aps_job *job, const char *name, uint64_t count, uint32_t max_tensors,
                       struct aps_tensor **out);

/*
 * Adds a rank's global-mode exponent for t. Returns 1 when every member has
 * sent one (*max is then their max and the exchange starts over), 0 while
 * some are missing, APS_EPROTO when the rank already sent one.
 */
int aps_tensor_add_exponent(const struct aps_job *job, struct aps_tensor *t, uint32_t rank,
                            int32_t exponent, int32_t *max);
/* As aps_tensor_add_exponent after a member left: 1 when the exchange is now complete. */
int aps_tensor_exponents_complete(const struct aps_job *job, struct aps_tensor *t, int32_t *max);

/* Forgets the answers kept for ranks that reconnect: its round starts over. */
void aps_tensor_forget_answers(struct aps_tensor *t);

/* Lets go of t's weights kept for pulls (pulled), if any. */
void aps_tensor_forget_pulled(struct aps_job *job, struct aps_tensor *t);

/* Drops what t's round and exponent exchange collected this step. */
void aps_job_abort_tensor(struct aps_job *job, struct aps_tensor *t);

/* Drops what every round and the barrier collected this step (a rank was lost). */
void aps_job_abort_rounds(struct aps_job *job);

/* True when any round or the barrier holds a contribution. */
bool aps_job_busy(const struct aps_job *job);

/* True when a round, an exponent exchange or the barrier holds one of rank's: its
 * call waits. */
bool aps_job_rank_waits(const struct aps_job *job, uint32_t rank);

#endif
