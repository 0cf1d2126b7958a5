/*
 * The daemon's state, which the protocol's files (handlers, join, reconnect,
 * resend, optimize, finish, leave, outbox) and the stats (report, metrics)
 * read and change. Each file's own functions are in its own header.
 */
#ifndef APS_SERVER_SERVER_IMPL_H
#define APS_SERVER_SERVER_IMPL_H

#include "common/log.h"
#include "server/ckpt_copy.h"
#include "server/ckpt_load.h"
#include "server/ckpt_queue.h"
#include "server/engine.h"
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
	struct aps_log_gate refusal_log; /* HELLOs refused for token or key (join.c: 1 line/s) */
	struct aps_log_gate unread_log;  /* connections dropped for answers unread (1 line/s) */
	uint64_t trimmed_ms;             /* malloc_trim at the last job end it ran (leave.c) */
	bool trim_due;                   /* a job ended since: trim at a tick */
	bool stopping;
	struct aps_ckpt_queue *ckpt;    /* NULL: no checkpoint_dir */
	struct aps_ckpt_loader *loader; /* resumes' reads; NULL: no checkpoint_dir */
	uint64_t ckpt_reading;          /* bytes of checkpoints being read (max_total_bytes) */
	/* A job's snapshot copied off the loop (optimize.c starts it, server.c ends it:
	 * queued, and the job's waiting finishes run). */
	aps_ckpt_copied_cb snapshot_copied;
	struct aps_engine *engine;  /* NULL: threads = 1, every sum on the loop */
	struct aps_round_held held; /* early pushes of every round (max_held_bytes) */
	uv_timer_t *tick_timer;     /* graces, silences, job deadlines (owned) */
	uint64_t last_tick_ms;
};

#endif
