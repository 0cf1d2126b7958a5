/*
 * One handler per message type a joined worker sends (handlers.c; HELLO is
 * join.c's, PULL optimize.c's). Each gets a message the validator checked
 * and a session allowed to send it (server.c).
 */
#ifndef APS_SERVER_HANDLERS_H
#define APS_SERVER_HANDLERS_H

#include "proto/frame.h"
#include "server/job.h"
#include "server/zbridge.h"

struct aps_server;

void aps_handle_register(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_push(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m,
                     struct aps_inmsg *in);
void aps_handle_barrier(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_exponents(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_heartbeat(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
void aps_handle_bye(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);

/* aps_round_held.drop_step (ctx: the server): the step of r, a tensor's round
 * that holds pushes of a client older than AGAIN, fails for every rank. */
void aps_handle_drop_held_step(void *ctx, struct aps_round *r);

#endif
