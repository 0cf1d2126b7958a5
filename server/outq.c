/* Per-peer FIFOs of replies that wait for a full pipe (outq.h). */
#include "server/outq.h"

#include "common/err.h"

#include <stdlib.h>
#include <string.h>

static struct aps_outq_peer **link_of(struct aps_outq *q, const struct aps_peer *peer)
{
	struct aps_outq_peer **link =
	        &q->buckets[aps_peer_hash(&q->hasher, peer) % APS_OUTQ_BUCKETS];

	while (*link != NULL && !aps_peer_equal(&(*link)->peer, peer))
		link = &(*link)->next;
	return link;
}

bool aps_outq_waiting(const struct aps_outq *q, const struct aps_peer *peer)
{
	return q->peers > 0 && *link_of((struct aps_outq *)q, peer) != NULL;
}

size_t aps_outq_tallied(const struct aps_outq *q, const struct aps_peer *peer)
{
	const struct aps_outq_peer *p = q->peers > 0 ? *link_of((struct aps_outq *)q, peer) : NULL;

	return p != NULL ? p->n - p->loose : 0;
}

int aps_outq_push(struct aps_outq *q, const struct aps_peer *peer, const uint8_t *hdr,
                  size_t hdr_len, struct aps_sbuf *payload, struct aps_tally *tally, uint32_t slot)
{
	struct aps_outq_peer **link = link_of(q, peer), *p = *link;
	struct aps_outmsg *m;

	if (tally == NULL &&
	    (q->loose >= APS_OUTQ_TOTAL_MAX || (p != NULL && p->loose >= APS_OUTQ_PEER_MAX)))
		return APS_EBUSY;
	m = malloc(sizeof(*m) + hdr_len);
	if (m == NULL)
		return APS_ENOMEM;
	if (p == NULL && (p = calloc(1, sizeof(*p))) == NULL) {
		free(m);
		return APS_ENOMEM;
	}
	if (*link == NULL) {
		p->peer = *peer;
		*link = p;
		q->peers++;
	}
	m->next = NULL;
	m->payload = payload ? aps_sbuf_ref(payload) : NULL;
	m->tally = tally;
	m->slot = slot;
	m->hdr_len = hdr_len;
	memcpy(m->hdr, hdr, hdr_len);
	if (p->tail != NULL)
		p->tail->next = m;
	else
		p->head = m;
	p->tail = m;
	p->n++;
	q->total++;
	p->loose += tally == NULL;
	q->loose += tally == NULL;
	return 0;
}

static size_t free_peer(struct aps_outq *q, struct aps_outq_peer **link)
{
	struct aps_outq_peer *p = *link;
	size_t n = p->n;

	while (p->head != NULL) {
		struct aps_outmsg *m = p->head;
		p->head = m->next;
		aps_sbuf_unref(m->payload);
		if (m->tally != NULL)
			aps_tally_done(m->tally, m->slot);
		free(m);
	}
	*link = p->next;
	q->total -= n;
	q->loose -= p->loose;
	q->peers--;
	free(p);
	return n;
}

/* Sends p's queue in order; true when it is empty (or its peer gone) and may go. */
static bool flush_peer(struct aps_outq *q, struct aps_outq_peer *p, aps_outq_send_fn send,
                       void *ctx, size_t *sent)
{
	while (p->head != NULL) {
		struct aps_outmsg *m = p->head;
		int ret = send(ctx, &p->peer, m->hdr, m->hdr_len, m->payload, m->tally, m->slot);
		if (ret == APS_EBUSY)
			return false;
		if (ret < 0)
			return true;
		p->head = m->next;
		if (p->head == NULL)
			p->tail = NULL;
		p->n--;
		q->total--;
		p->loose -= m->tally == NULL;
		q->loose -= m->tally == NULL;
		(*sent)++;
		aps_sbuf_unref(m->payload);
		free(m);
	}
	return true;
}

void aps_outq_flush(struct aps_outq *q, aps_outq_send_fn send, void *ctx, size_t *sent,
                    size_t *lost)
{
	for (size_t b = 0; b < APS_OUTQ_BUCKETS && q->peers > 0; b++) {
		struct aps_outq_peer **link = &q->buckets[b];
		while (*link != NULL) {
			if (flush_peer(q, *link, send, ctx, sent))
				*lost += free_peer(q, link);
			else
				link = &(*link)->next;
		}
	}
}

size_t aps_outq_discard(struct aps_outq *q, const struct aps_peer *peer)
{
	struct aps_outq_peer **link = link_of(q, peer);

	return *link != NULL ? free_peer(q, link) : 0;
}

const struct aps_outq_peer *aps_outq_longest(const struct aps_outq *q)
{
	const struct aps_outq_peer *best = NULL;

	for (size_t b = 0; b < APS_OUTQ_BUCKETS && q->peers > 0; b++) {
		for (const struct aps_outq_peer *p = q->buckets[b]; p != NULL; p = p->next) {
			if (best == NULL || p->loose > best->loose)
				best = p;
		}
	}
	return best;
}

size_t aps_outq_clear(struct aps_outq *q)
{
	size_t n = 0;

	for (size_t b = 0; b < APS_OUTQ_BUCKETS; b++) {
		while (q->buckets[b] != NULL)
			n += free_peer(q, &q->buckets[b]);
	}
	return n;
}
