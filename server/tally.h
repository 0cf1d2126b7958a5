/*
 * What a tensor's answers to each rank still hold in ZeroMQ: a count per rank
 * of the payload messages (RESULT, BROADCAST, WEIGHTS) handed to the bridge
 * that libzmq has not finished sending (it frees each one on its I/O thread,
 * once written to the socket). A rank whose client reads its answers has at
 * most one of a tensor's not finished when it makes its next call of that
 * tensor (libaps ends a call when its last chunk has arrived; libzmq lets go
 * of the last message it wrote when it next looks at the socket). More means
 * the client does not read: its answers would pile up in the daemon (400 steps
 * of a 4 MiB result took 1.6 GB, 2026-12-07).
 *
 * Shared by its tensor and every message in flight (a reference each): the
 * tensor may go first. Counts change on two threads: atomics.
 */
#ifndef APS_SERVER_TALLY_H
#define APS_SERVER_TALLY_H

#include <stdint.h>

struct aps_tally;

/* slots counters at 0 and one reference (the owner's); NULL when out of memory. */
struct aps_tally *aps_tally_new(uint32_t slots);

/* One more of slot's messages in flight, and a reference for it; aps_tally_done ends both. */
void aps_tally_start(struct aps_tally *t, uint32_t slot);
void aps_tally_done(struct aps_tally *t, uint32_t slot);

/* Slot's messages in flight now. */
uint32_t aps_tally_unsent(const struct aps_tally *t, uint32_t slot);

/* The owner's reference goes (NULL: nothing). */
void aps_tally_release(struct aps_tally *t);

/* Bytes a tally of slots counters takes (what max_job_bytes counts). */
uint64_t aps_tally_size(uint32_t slots);

#endif
