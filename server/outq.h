/*
 * Replies that wait because their peer's pipe is full: one FIFO per peer, so
 * that a peer's later replies never pass its earlier ones and one peer that
 * does not read costs only itself. A peer's queue is bounded
 * (APS_OUTQ_PEER_MAX messages): past that it is a slow reader, and the bridge
 * drops its connection instead of letting it hold the daemon's memory (its
 * client comes back and asks again; docs/RELIABILITY.md). All queues together
 * are bounded too (APS_OUTQ_TOTAL_MAX). The bounds count loose messages only:
 * a message counted in a tally (a tensor's answer, tally.h) is bounded where it
 * is made, one answer of each tensor to each rank, however many chunks that
 * answer has (a pull of 8000 chunks was dropped as a slow reader every time,
 * before 2026-12-07), and by its job's answers in all (outbox.c: those of a
 * job that ended are no tensor's). Knows no sockets: the bridge hands it a send function.
 */
#ifndef APS_SERVER_OUTQ_H
#define APS_SERVER_OUTQ_H

#include "common/sbuf.h"
#include "server/peer.h"
#include "server/tally.h"

#include <stdbool.h>
#include <stddef.h>

#define APS_OUTQ_PEER_MAX  4096
#define APS_OUTQ_TOTAL_MAX 65536
#define APS_OUTQ_BUCKETS   256

struct aps_outmsg {
	struct aps_outmsg *next;
	struct aps_sbuf *payload; /* a reference; NULL: none */
	struct aps_tally *tally;  /* its count in flight (tally.h), or NULL */
	uint32_t slot;
	size_t hdr_len;
	uint8_t hdr[];
};

struct aps_outq_peer {
	struct aps_outq_peer *next; /* in its bucket */
	struct aps_peer peer;
	struct aps_outmsg *head, *tail;
	size_t n;     /* messages queued */
	size_t loose; /* of them, those not counted in a tally: bounded */
};

struct aps_outq {
	struct aps_outq_peer *buckets[APS_OUTQ_BUCKETS];
	struct aps_peer_hasher hasher;
	size_t total; /* messages in every queue */
	size_t loose; /* of them, those not counted in a tally: bounded */
	size_t peers; /* peers with a queue */
};

/* Sends one message now: 0 sent (a tally's count then goes with it), APS_EBUSY (the
 * pipe is still full), APS_ECONN (gone). */
typedef int (*aps_outq_send_fn)(void *ctx, const struct aps_peer *peer, const uint8_t *hdr,
                                size_t hdr_len, struct aps_sbuf *payload, struct aps_tally *tally,
                                uint32_t slot);

/* True when peer has replies waiting: a new one must wait behind them. */
bool aps_outq_waiting(const struct aps_outq *q, const struct aps_peer *peer);

/* Replies counted in a tally that wait for peer (0: none). */
size_t aps_outq_tallied(const struct aps_outq *q, const struct aps_peer *peer);

/*
 * Queues a copy of hdr and a reference to payload for peer, with tally's count
 * of slot (aps_tally_start, or tally NULL): the queue ends it if the message
 * never goes. Returns 0, APS_ENOMEM, or APS_EBUSY when a loose message (tally
 * NULL) finds the peer's loose messages (or every queue's) at their bound:
 * nothing was queued (the count is the caller's).
 */
int aps_outq_push(struct aps_outq *q, const struct aps_peer *peer, const uint8_t *hdr,
                  size_t hdr_len, struct aps_sbuf *payload, struct aps_tally *tally, uint32_t slot);

/*
 * Sends what it can, every peer's queue in order, until each is empty or its
 * pipe full; a peer that is gone loses its queue. Adds the messages sent to
 * *sent and those lost to *lost.
 */
void aps_outq_flush(struct aps_outq *q, aps_outq_send_fn send, void *ctx, size_t *sent,
                    size_t *lost);

/* Forgets peer's queue; returns how many messages it held. */
size_t aps_outq_discard(struct aps_outq *q, const struct aps_peer *peer);

/* The peer with the most loose messages queued (NULL when none). */
const struct aps_outq_peer *aps_outq_longest(const struct aps_outq *q);

/* Forgets every queue; returns how many messages they held. */
size_t aps_outq_clear(struct aps_outq *q);

#endif
