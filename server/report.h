/*
 * The documents the stats socket serves: one JSON object per command
 * ("stats", "jobs", "workers", "tensors"), built from the server's state.
 */
#ifndef APS_SERVER_REPORT_H
#define APS_SERVER_REPORT_H

#include <stddef.h>
#include <stdint.h>

struct aps_server;

/* What the stats socket's own listener did (oneshot.h): among the counters. */
struct aps_report_clients {
	uint64_t evicted, refused;
};

/*
 * Builds the document for command into a malloc'd NUL-terminated string
 * (*out, freed by the caller). An unknown command gives {"error": ...}. The
 * tensors and workers reports list at most 4096 lines of every job together,
 * shared out smallest job first ("tensors_unlisted", "workers_unlisted": the
 * others); a job lists its first 64 stalls ("stalls_unlisted").
 * Returns 0 or APS_ENOMEM.
 */

int aps_report_build(const struct aps_server *srv, const char *command,
                     const struct aps_report_clients *clients, char **out);

#endif
