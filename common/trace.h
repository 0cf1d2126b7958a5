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

/* Monotonic nanoseconds, the clock of every event. */
uint64_t aps_trace_now(void);

/*
 * One stage that ran from start_ns to now: name ("dequantize"), the tensor and
 * step it served and the chunk. Thread-safe; t NULL is a no-op.
 */
void aps_trace_stage(struct aps_trace *t, const char *name, uint64_t start_ns, const char *tensor,
                     uint64_t step, uint32_t chunk);

#endif
