/*
 * What apsd sends to workers (outbox.c): the only caller of the bridge's send.
 */
#ifndef APS_SERVER_OUTBOX_H
#define APS_SERVER_OUTBOX_H

#include "common/sbuf.h"
#include "proto/frame.h"
#include "server/job.h"
#include "server/peer.h"

#include <stddef.h>
#include <stdint.h>

struct aps_server;

#define APS_SERVER_HEADER_MAX 4096 /* bytes of a header frame the daemon packs */

/* Zeroes m as a message of type from apsd about rank of job. */
void aps_outbox_init(struct aps_msg *m, enum aps_msg_type type, const struct aps_job *job,
                     uint32_t rank);

/* Sends m (with payload, or none) to one peer. */
void aps_outbox_send(struct aps_server *srv, const struct aps_peer *peer, struct aps_msg *m,
                     struct aps_sbuf *payload);

/* Sends a header packed once (hdr, len) with payload: a result of t to each rank,
 * counted in t->unsent until libzmq has sent it. */
void aps_outbox_send_packed(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                            const uint8_t *hdr, size_t len, struct aps_sbuf *payload);

/* m with payload to s: an answer about t (WEIGHTS), counted as above. */
void aps_outbox_answer(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                       struct aps_msg *m, struct aps_sbuf *payload);

/*
 * True when s has more than allowed of t's answers that libzmq has not sent
 * (tally.h): its client makes a new call of t without reading them. Its
 * connection is then dropped (counted: unread_dropped), and the caller drops
 * the call: a client that reads comes back and sends it again.
 */
bool aps_outbox_unread(struct aps_server *srv, struct aps_session *s, const struct aps_tensor *t,
                       uint32_t allowed);

/* An ERROR about request (may be NULL) to peer; counts it. */
void aps_outbox_error(struct aps_server *srv, const struct aps_peer *peer, int code,
                      const struct aps_msg *request, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));

/* An EACCES ERROR answering a HELLO; retry_after_ms > 0: the job's name frees in that
 * many ms (protocol 1.9). */
void aps_outbox_refuse(struct aps_server *srv, const struct aps_peer *peer,
                       const struct aps_msg *hello, uint32_t retry_after_ms, const char *fmt, ...)
        __attribute__((format(printf, 5, 6)));

/* The same ERROR to every live rank of job. */
void aps_outbox_error_job(struct aps_server *srv, struct aps_job *job, int code, const char *text);

/* An ERROR about the job (no one call) to one of its ranks. */
void aps_outbox_error_rank(struct aps_server *srv, struct aps_job *job, uint32_t rank, int code,
                           const char *text);

/* Whether replies to s wait behind its full pipe (what it asked about may wait). */
bool aps_outbox_backed_up(struct aps_server *srv, const struct aps_session *s);

/* REGISTERED to s about t: its id, size, chunking, next step and format;
 * counted in tally's slot s->rank until it leaves the bridge (NULL: not counted). */
void aps_outbox_registered(struct aps_server *srv, struct aps_job *job, struct aps_session *s,
                           const struct aps_tensor *t, struct aps_tally *tally);

/* AGAIN to the rank whose declined push chunk of t now waits for, if one does
 * (aps_round_wanted): it sends that push again. */
void aps_outbox_again(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                      uint32_t chunk);

/* The SCALES r (tensor ids and their exponents) to every member of job. */
void aps_outbox_scales(struct aps_server *srv, struct aps_job *job, struct aps_msg *r);

#endif
