/*
 * The stats socket: a Unix stream socket on which a client sends one
 * command line ("stats", "jobs", "workers", "tensors") and reads one JSON
 * document (server/report.c) before the daemon closes the connection
 * (server/oneshot.c bounds clients, sizes and time). Its default path is
 * common/statspath.h's.
 */
#ifndef APS_SERVER_STATS_H
#define APS_SERVER_STATS_H

#include <uv.h>

struct aps_server;
struct aps_stats;

/*
 * Listens at path (mode 0660). A socket file left by a dead daemon is
 * replaced; one a live daemon answers on is APS_EBUSY. Returns 0,
 * APS_EBUSY, APS_ERANGE (path too long), APS_ESYS or APS_ENOMEM.
 */
int aps_stats_open(struct aps_stats **out, uv_loop_t *loop, const char *path,
                   const struct aps_server *srv);

/* Closes the socket and its clients and removes the file. NULL is a no-op. */
void aps_stats_close(struct aps_stats *st);

#endif
