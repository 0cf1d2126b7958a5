/*
 * Prometheus metrics over HTTP: with --metrics_listen ADDR:PORT the daemon
 * answers GET /metrics with the text exposition format (version 0.0.4).
 * The same bounds as the stats socket: few clients, short requests, a
 * deadline, so that a scraper can never stall rounds.
 */
#ifndef APS_SERVER_METRICS_H
#define APS_SERVER_METRICS_H

#include <uv.h>

struct aps_server;
struct aps_metrics;

/* Listens at "ADDR:PORT" (IPv4 or [IPv6]:PORT). Returns 0, APS_EINVAL or APS_ESYS. */
int aps_metrics_open(struct aps_metrics **out, uv_loop_t *loop, const char *listen,
                     const struct aps_server *srv);

/* Closes the listener and its clients; frees m. NULL is a no-op. */
void aps_metrics_close(struct aps_metrics *m);

/* The exposition text (malloc'd, NUL-terminated); NULL when out of memory. */
char *aps_metrics_render(const struct aps_server *srv);

#endif
