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

/*
 * Fixed malloc thresholds (glibc) before any thread starts: message bodies up
 * to 16 MiB come from the heap, and free memory at the top of every thread's
 * heap beyond 512 KiB goes back to the system when it is freed. glibc's own
 * thresholds rise after each large free (to twice the block, up to 64 MiB)
 * and malloc_trim does not trim a thread's heap top, so a finished job's
 * memory could stay resident (1.3 MiB in 1 run of 10 of test_attacks.py's
 * test_memory_of_a_finished_job_goes_back before this).
 */
void aps_hostlimits_malloc_policy(void);

/* The cores of the daemon's CPU set (sched_getaffinity), at least 1. */
unsigned aps_hostlimits_cpus(void);

#endif
