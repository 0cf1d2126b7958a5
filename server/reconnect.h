/*
 * Sessions whose connection closed, went silent, or came back (reconnect.c).
 */
#ifndef APS_SERVER_RECONNECT_H
#define APS_SERVER_RECONNECT_H

#include "proto/frame.h"
#include "server/job.h"
#include "server/peer.h"
#include "server/zbridge.h"

#include <stdbool.h>
#include <stdint.h>

struct aps_server;

/* s's connection closed or went silent (why): it waits for reconnect_grace_ms. */
void aps_reconnect_detach(struct aps_server *srv, struct aps_session *s, const char *why);

/*
 * A HELLO that names a session apsd knows (its token, job and rank) takes it
 * to in's connection, answered WELCOME (RESUMED when it asked to RESUME); one
 * flagged RESUME of a session apsd does not know gets APS_ENOSESSION. False
 * for a first HELLO, which join.c handles.
 */
bool aps_reconnect_hello(struct aps_server *srv, struct aps_inmsg *in, const struct aps_msg *m);

/* A session moved away from peer (its late messages are stale). */
bool aps_reconnect_moved_from(struct aps_server *srv, const struct aps_peer *peer);

/* Graces that ran out, joined sessions that went silent. */
void aps_reconnect_tick(struct aps_server *srv, uint64_t now);

#endif
