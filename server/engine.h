/*
 * Engine threads: the per-byte work of rounds (dequantize-accumulate, the
 * mean's encoding) off the event loop, on k threads. A task goes to a lane
 * (lane mod k picks its thread) and each thread runs its tasks in the order
 * they were submitted, so that every task of one chunk, submitted to one
 * lane in rank order, runs in rank order: the same bits as one thread.
 *
 * When a task has run, its done() is called on the loop thread. The engine
 * knows nothing of rounds: a task is a run() and a done() with an owner, and
 * aps_engine_quiesce(owner) takes the owner's tasks back before its state is
 * reset or freed.
 */
#ifndef APS_SERVER_ENGINE_H
#define APS_SERVER_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* A thread's own buffer, kept between its tasks, freed with the engine. */
struct aps_engine_scratch {
	void *buf;
	size_t cap;
};

/* The scratch grown to at least bytes; NULL when out of memory. */
void *aps_engine_scratch(struct aps_engine_scratch *s, size_t bytes);

struct aps_engine_task {
	void (*run)(struct aps_engine_task *t, struct aps_engine_scratch *s); /* an engine thread */
	/* On the loop thread once run() returned; cancelled: the owner was quiesced (run()
	 * may not have run) or the engine closed before the loop took it, and only
	 * resources are to be freed. */
	void (*done)(struct aps_engine_task *t, bool cancelled);
	const void *owner;
	struct aps_engine_task *next; /* the engine's */
};

struct aps_engine_counters {
	unsigned threads;
	uint64_t tasks;     /* run */
	uint64_t busy_ns;   /* in run(), every thread together */
	uint64_t waits;     /* quiesce calls that had to wait for a thread */
	uint32_t max_queue; /* the longest a lane's queue has been */
};

struct aps_engine;

/* threads >= 1 threads, whose done() calls come on loop. Returns 0, APS_ENOMEM or
 * APS_ESYS (a thread could not be started). */
int aps_engine_new(struct aps_engine **out, uv_loop_t *loop, unsigned threads);

/* Stops calling done() on the loop (the loop may end): at the server's stop. */
void aps_engine_close(struct aps_engine *e);

/* Runs every queued task, cancels every completion not yet taken, joins the threads
 * (NULL-safe). */
void aps_engine_free(struct aps_engine *e);

void aps_engine_submit(struct aps_engine *e, uint32_t lane, struct aps_engine_task *t);

/* Waits until no task of owner is queued or running (their done() calls still come).
 * Loop thread only. */
void aps_engine_wait(struct aps_engine *e, const void *owner);

/* Drops owner's queued tasks unrun, waits for the one running, and cancels its
 * completions that the loop has not taken yet: done(t, true) for each, before
 * it returns. Loop thread only. */
void aps_engine_quiesce(struct aps_engine *e, const void *owner);

/* e NULL: the loop sums (threads = 1), one thread and nothing run here. */
void aps_engine_counters(struct aps_engine *e, struct aps_engine_counters *out);

#endif
