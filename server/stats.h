/*
 * The stats socket: a Unix stream socket on which a client sends one
 * command line ("stats", "jobs", "workers", "tensors") and reads one JSON
 * document (server/report.c) before the daemon closes the connection. It
 * never blocks the data path: few clients at once, short lines, a deadline.
 */
#ifndef APS_SERVER_STATS_H
#define APS_SERVER_STATS_H

#include <stddef.h>
#include <uv.h>

#define APS_STATS_MAX_CLIENTS 16
#define APS_STATS_TIMEOUT_MS  5000

struct aps_server;
struct aps_stats;

/*
 * Listens at path (mode 0660). A socket file left by a dead daemon is
 * replaced; one a live daemon answers on is APS_EBUSY. Returns 0,
 * APS_EBUSY, APS_ESYS or APS_ENOMEM.
 */
int aps_stats_open(struct aps_stats **out, uv_loop_t *loop, const char *path,
                   const struct aps_server *srv);

/* Closes the socket, its clients, removes the file and frees st. NULL is a no-op. */
void aps_stats_close(struct aps_stats *st);

#endif
