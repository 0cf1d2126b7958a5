/*
 * The daemon's limits that default from the machine it runs on: how many
 * descriptors it may open (connections), how much memory it may hold, and
 * how many cores it may use.
 */
#ifndef APS_SERVER_HOSTLIMITS_H
#define APS_SERVER_HOSTLIMITS_H

#include <stddef.h>
#include <stdint.h>

/* Descriptors the daemon keeps for itself: loop, sockets, stats, files. */
#define APS_HOSTLIMITS_SPARE_FDS 64

/* Raises RLIMIT_NOFILE's soft limit to the hard one (at most 1 << 20); the soft limit now. */
uint64_t aps_hostlimits_raise_nofile(void);

/* Connections that nofile descriptors hold: two each (ZeroMQ's and apsd's), and the spare. */
size_t aps_hostlimits_connections(uint64_t nofile);

/* Bytes of memory: the machine's, or its cgroup's memory.max when that is less. */
uint64_t aps_hostlimits_memory(void);

/* Bytes of the filesystem dir is on (statvfs); 0 when it cannot be read. */
uint64_t aps_hostlimits_disk(const char *dir);

/*
 * glibc's malloc, set before any thread starts: one arena, message bodies up
 * to 16 MiB from the heap, up to 32 MiB of free heap kept for the next step.
 * A step's bodies then reuse the pages the last step freed (glibc's sliding
 * thresholds gave them back and faulted them in again: the daemon's CPU per
 * step fell by a quarter to a third), and malloc_trim at a job's end gives
 * the heap's whole top back (it cannot trim a thread arena's top: 1.3 MiB of
 * a finished job stayed in 1 run of 10 of test_memory_of_a_finished_job_goes_back).
 * GLIBC_TUNABLES naming a glibc.malloc setting, or one of glibc's MALLOC_*
 * variables, leaves malloc as the operator set it.
 */
void aps_hostlimits_malloc_policy(void);

/* Bytes malloc has handed out and not taken back (mallinfo2: the arena's in
 * use and what it mapped); 0 where that does not tell (a sanitizer's malloc).
 * mallinfo2 walks every free chunk under the arena's lock: 500000 of a large
 * handshake's freed properties in glibc's fastbins, never merged, made each
 * call 30 ms, until the trim after such a connection is dropped (zbridge.c),
 * which merges them. */
uint64_t aps_hostlimits_heap_in_use(void);

/* The cores of the daemon's CPU set (sched_getaffinity), at least 1. */
unsigned aps_hostlimits_cpus(void);

#endif
