/*
 * Timelines in the Chrome trace format (chrome://tracing, Perfetto): one
 * complete event ("ph":"X") per stage of a round, written to a file as they
 * happen. Off unless opened, and then one branch per stage.
 */
#ifndef APS_COMMON_TRACE_H
#define APS_COMMON_TRACE_H

#include <stdbool.h>
#include <stdint.h>

struct aps_trace;

/* Starts a trace file (truncated). Returns 0, or APS_ESYS when it cannot be written. */
int aps_trace_open(struct aps_trace **out, const char *path, const char *process_name);

/* Ends the JSON array and closes the file. NULL is a no-op. */
void aps_trace_close(struct aps_trace *t);

/* Writes the events that waited a second or more (a daemon's tick: the last events
 * of a burst reach the file without waiting for the next one). NULL is a no-op. */
void aps_trace_flush_due(struct aps_trace *t);

/* Monotonic nanoseconds, the clock of every event. */
uint64_t aps_trace_now(void);

/* What a stage served: its job and tensor (NULL: none), step and chunk. */
struct aps_trace_at {
	const char *job, *tensor;
	uint64_t step;
	uint32_t chunk;
};

/*
 * One stage that ran from start_ns to now: name ("dequantize", a literal) and
 * what it served. Events reach the file within a second (of the next event or
 * of aps_trace_flush_due), and the file is a whole JSON array after every
 * write (a reader that races a write may see it torn: a write is not atomic
 * against a read; read again). Thread-safe; t NULL is a no-op.
 */
void aps_trace_stage(struct aps_trace *t, const char *name, uint64_t start_ns,
                     const struct aps_trace_at *at);

#endif
