/*
 * Calls a reconnected rank sent again (resend.c): what apsd already had of
 * them is answered again from what it kept, or dropped. Used by server.c and
 * handlers.c.
 */
#ifndef APS_SERVER_RESEND_H
#define APS_SERVER_RESEND_H

#include "proto/frame.h"
#include "server/job.h"

#include <stdbool.h>

struct aps_server;

/* A call sent again whose answer was kept (a finished chunk, a complete
 * barrier): answered even when the job can no longer complete new rounds. */
bool aps_resend_answerable(struct aps_session *s, const struct aps_msg *m);

/*
 * Each returns true when m (or, for EXPONENTS, the one tensor t) was seen
 * before: answered again from what was kept, or dropped. False: handle it as
 * new.
 */
bool aps_resend_push(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                     uint32_t chunk, const struct aps_msg *m);
bool aps_resend_exponent(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                         struct aps_msg *scales);
bool aps_resend_barrier(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);
/* Keeps a chunk's result (its header as sent to every rank) for aps_resend_push. */
void aps_resend_keep(struct aps_server *srv, struct aps_tensor *t, uint64_t step,
                     const struct aps_round_result *res, const uint8_t *hdr, size_t len);

#endif
