/*
 * A first HELLO: admission (token, CURVE key, limits), a new job or a rank of
 * one, WELCOME (join.c).
 */
#ifndef APS_SERVER_JOIN_H
#define APS_SERVER_JOIN_H

#include "proto/frame.h"
#include "server/job.h"

#include <stdint.h>

struct aps_server;

void aps_handle_hello(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);

/* WELCOME to a joined session (flags: APS_MSG_FLAG_RESUMED after a reconnect). */
void aps_join_welcome(struct aps_server *srv, struct aps_session *s, uint32_t flags);

/* Jobs whose ranks did not all arrive within join_timeout_ms end, and so do jobs
 * that could not go on join_timeout_ms before. */
void aps_join_tick(struct aps_server *srv, uint64_t now);

#endif
