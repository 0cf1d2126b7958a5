/*
 * The apsd daemon as a library: one ZeroMQ endpoint served on a libuv loop.
 * main.c parses the configuration, creates the server, runs the loop and
 * stops the server on a signal.
 */
#ifndef APS_SERVER_SERVER_H
#define APS_SERVER_SERVER_H

#include "common/scale.h"
#include "proto/validate.h"
#include "server/policy.h"

#include <stdint.h>
#include <uv.h>

/* Daemon-wide counters; APS_MSG_FAULT_MAP adds one per kind of bad message. */
#define APS_SERVER_COUNTER_MAP(X)                                                             \
	X(rounds, "rounds completed (all-reduce and broadcast)")                              \
	X(barriers, "barriers completed")                                                     \
	X(jobs_started, "jobs started")                                                       \
	X(peers_lost, "ranks lost: connection closed or timed out")                           \
	X(reconnects, "ranks whose connection closed and came back within the grace")         \
	X(resent, "calls a reconnected rank sent again: answered again or dropped as seen")   \
	X(errors_sent, "ERROR replies sent")                                                  \
	X(bad_frames, "messages with a wrong number of frames")                               \
	X(bad_session, "messages from a peer that has not joined a job, or as another rank")  \
	X(stale_messages, "late messages of a connection taken for closed: dropped")          \
	X(bad_state, "messages the job refused: unknown tensor, wrong step, duplicate")       \
	X(refused_hello, "HELLOs refused: rank taken, world size or options differ, limits")  \
	X(refused_address_jobs, "HELLOs refused: their address started max_jobs_per_address") \
	X(refused_incomplete, "collective calls refused: the job lost a rank")                \
	X(policy_switches, "format changes decided by the precision policy")                  \
	X(updates, "optimizer updates applied (optimize mode, one per tensor and step)")      \
	X(checkpoints, "checkpoints written")                                                 \
	X(checkpoint_failures, "checkpoints that could not be written")                       \
	X(checkpoints_evicted, "checkpoint files of ended jobs removed for a new checkpoint") \
	X(resumed, "jobs resumed from a checkpoint")                                          \
	X(refused_token, "HELLOs refused: the job token differs, or the key may not join")    \
	X(refused_resume, "HELLOs to resume a session apsd does not know (token, job, rank)") \
	X(silent_dropped, "ranks whose connection said nothing for heartbeat_timeout_ms")     \
	X(jobs_expired, "jobs ended at join_timeout_ms: ranks missing, or a dead job kept")   \
	X(refused_memory,                                                                     \
	  "registrations refused: max_job_bytes, max_address_bytes, max_total_bytes")         \
	X(pushes_declined, "pushes not kept: early, with max_held_bytes held; asked again")   \
	X(asked_again, "AGAINs sent: a declined push's rank asked for it at its turn")        \
	X(unread_dropped,                                                                     \
	  "connections dropped: a new call of a tensor whose answers it left unread")

struct aps_server_counters {
#define APS_SERVER_COUNTER_FIELD(name, text) uint64_t name;
	APS_SERVER_COUNTER_MAP(APS_SERVER_COUNTER_FIELD)
#undef APS_SERVER_COUNTER_FIELD
	uint64_t faults[APS_MSG_FAULT_COUNT]; /* by enum aps_msg_fault_kind */
};

struct aps_server_opts {
	const char *endpoint;
	const char *downlink; /* "auto" or a format name: the default of new jobs */
	int heartbeat_ms; /* how often a worker speaks (told in WELCOME: a third of the timeout) */
	int heartbeat_timeout_ms; /* a joined connection silent this long is dropped */
	int reconnect_grace_ms;   /* a closed connection's session waits this long; 0: lost */
	int64_t max_message_bytes;
	int drain_batch;
	unsigned threads;    /* threads that sum: 1 the loop, k > 1 k engine threads */
	unsigned io_threads; /* ZeroMQ's */
	uint32_t max_jobs;
	uint32_t max_jobs_per_address; /* started from one address or ipc user; 0: any */
	uint32_t max_ranks;
	uint32_t max_tensors;
	uint64_t max_job_bytes;     /* fp32 bytes of the tensors of one job */
	uint64_t max_total_bytes;   /* the same, of every job together */
	uint64_t max_address_bytes; /* the same, of the jobs started from one address; 0: any */
	uint64_t max_held_bytes;    /* pushes held until their rank's turn, every job together */
	size_t max_connections;     /* open at once */
	size_t max_connections_per_address; /* open at once from one address; 0: any */
	uint64_t join_timeout_ms;           /* to join (a connection), to fill (a job) */
	unsigned max_silent_closes;         /* an address's closes without a message a minute */
	enum aps_scaling scaling;           /* of jobs whose HELLO states none */
	bool lowp;               /* sum = lowp: the paper's rounded sum, global scaling only */
	bool elastic;            /* jobs shrink when a rank is lost (docs/RELIABILITY.md) */
	size_t chunk_elems;      /* elements per chunk, a multiple of 8 */
	const char *summary;     /* the configuration in one line, for reports */
	struct aps_trace *trace; /* borrowed; NULL: no timeline */
	struct aps_policy_config policy; /* hybrid precision of new jobs */
	const char *curve_secret;        /* Z85; NULL: no CURVE */
	const char *const *curve_allow;  /* Z85 public keys of the workers let in */
	const char *const *curve_jobs;   /* per key: the job globs it may join, "" any */
	size_t n_curve_allow;
	const char *allow_from;        /* networks that may connect (netlist.h); NULL, "": any */
	const char *checkpoint_dir;    /* NULL or "": no checkpoints */
	uint64_t checkpoint_steps;     /* every this many updates; 0: only at stop and job end */
	unsigned checkpoint_keep;      /* files kept per job */
	uint64_t checkpoint_max_bytes; /* every job's files together; 0: no bound */
};

struct aps_server;

/* Binds and starts serving on loop. Returns 0, APS_ECONN (bind) or APS_ENOMEM. */
int aps_server_new(struct aps_server **out, uv_loop_t *loop, const struct aps_server_opts *o);

/* Says BYE to every connected worker and closes the socket; the loop then ends. */
void aps_server_stop(struct aps_server *srv);

/* Frees a stopped server. */
/* The endpoint it listens on, as bound (tcp://127.0.0.1:0 made tcp://127.0.0.1:41234). */
const char *aps_server_endpoint(const struct aps_server *srv);

void aps_server_free(struct aps_server *srv);

const struct aps_server_counters *aps_server_counters(const struct aps_server *srv);

/* Logs every counter on one line (at shutdown, until the stats socket exists). */
void aps_server_log_counters(const struct aps_server *srv);

#endif
