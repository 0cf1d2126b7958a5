/*
 * Where the stats socket of a daemon is, so that apsd and apsctl agree
 * without configuration: two daemons on one host never share a path.
 */
#ifndef APS_COMMON_STATSPATH_H
#define APS_COMMON_STATSPATH_H

#include <stddef.h>

/*
 * $RUNTIME_DIRECTORY/stats.sock (systemd), else $XDG_RUNTIME_DIR/apsd-<port>.sock,
 * else /tmp/apsd-<uid>-<port>.sock, with <port> the port of a tcp:// endpoint
 * or a hash of any other endpoint. Returns 0 or APS_ERANGE (path too long).
 */
int aps_stats_default_path(const char *endpoint, char *buf, size_t len);

#endif
