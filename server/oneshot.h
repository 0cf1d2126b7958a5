/*
 * A listener for one-shot exchanges: a client sends one request (ended by a
 * terminator such as "\n" or "\r\n\r\n", at most APS_ONESHOT_REQUEST_MAX
 * bytes), the handler answers with one buffer, the connection closes. Few
 * clients at once and a deadline per client, so that nobody can stall the
 * loop or make the daemon hold more than a bounded number of answers. When
 * every place is taken, a new client takes the place of the one that has
 * waited longest without a whole request (those that sent nothing first), or
 * else of one that has not read its answer for a second: 16 idle
 * connections, opened again as they were closed, had kept every scraper out
 * (an attack, 2026-12-07). The stats socket and the metrics
 * endpoint are built on it.
 */
#ifndef APS_SERVER_ONESHOT_H
#define APS_SERVER_ONESHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <uv.h>

#define APS_ONESHOT_MAX_CLIENTS 16
#define APS_ONESHOT_TIMEOUT_MS  5000
#define APS_ONESHOT_REQUEST_MAX 4096

/*
 * Answers request (NUL-terminated, terminator included) with a malloc'd
 * buffer of *len bytes, or NULL to close without an answer.
 */
typedef char *(*aps_oneshot_handler)(void *ctx, const char *request, size_t *len);

struct aps_oneshot;

/*
 * Serves on an initialised, bound, not yet listening stream (a uv_pipe_t or
 * uv_tcp_t the caller allocated inside *out's lifetime: pass it, the oneshot
 * takes it over and closes it). Returns 0 or APS_ENOMEM / APS_ESYS.
 */
int aps_oneshot_start(struct aps_oneshot **out, uv_stream_t *listener, const char *terminator,
                      aps_oneshot_handler handler, void *ctx);

/* Clients that lost their place to a newer one, and clients refused because
 * every place was taken by one being answered. */
void aps_oneshot_counts(const struct aps_oneshot *o, uint64_t *evicted, uint64_t *refused);

/* Closes the listener and every client; on_closed(ctx) runs when all are closed. */
void aps_oneshot_close(struct aps_oneshot *o, void (*on_closed)(void *ctx));

#endif
