/*
 * Unit tests of the per-peer send queues (server/outq.h): each peer's replies
 * leave in order, one full pipe holds back its own peer only, the bounds
 * refuse rather than grow, and a peer that is gone loses its queue.
 */
#include "common/err.h"
#include "server/outq.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

/* A fake pipe per peer (id[0] picks it): open, full, or gone; what it got. */
struct pipes {
	int state[4]; /* 0 open, APS_EBUSY full, APS_ECONN gone */
	uint8_t got[4][8];
	size_t n[4];
};

static int fake_send(void *ctx, const struct aps_peer *peer, const uint8_t *hdr, size_t len,
                     struct aps_sbuf *payload, struct aps_tally *tally, uint32_t slot)
{
	struct pipes *p = ctx;
	int k = peer->id[0];

	(void)len;
	(void)payload;
	if (p->state[k] != 0)
		return p->state[k];
	p->got[k][p->n[k]++] = hdr[0];
	if (tally != NULL) /* sent: at once, here */
		aps_tally_done(tally, slot);
	return 0;
}

static struct aps_peer peer(uint8_t k)
{
	struct aps_peer p = { .len = 3, .id = { k, 'p', 'q' } };

	return p;
}

static void push(struct aps_outq *q, uint8_t k, uint8_t tag)
{
	struct aps_peer p = peer(k);

	assert_int_equal(aps_outq_push(q, &p, &tag, 1, NULL, NULL, 0), 0);
}

static void test_outq_keeps_each_peers_order_and_holds_back_only_it(void **state)
{
	struct aps_outq q = { 0 };
	struct pipes pipes = { .state = { APS_EBUSY, 0 } };
	struct aps_peer a = peer(0), b = peer(1);
	size_t sent = 0, lost = 0;

	(void)state;
	assert_false(aps_outq_waiting(&q, &a));
	push(&q, 0, 10);
	push(&q, 1, 20);
	push(&q, 0, 11);
	push(&q, 1, 21);
	assert_true(aps_outq_waiting(&q, &a));
	aps_outq_flush(&q, fake_send, &pipes, &sent, &lost);
	assert_int_equal(sent, 2); /* b's two; a's pipe is full */
	assert_memory_equal(pipes.got[1], ((uint8_t[]){ 20, 21 }), 2);
	assert_false(aps_outq_waiting(&q, &b));
	assert_true(aps_outq_waiting(&q, &a));
	pipes.state[0] = 0;
	aps_outq_flush(&q, fake_send, &pipes, &sent, &lost);
	assert_int_equal(sent, 4);
	assert_memory_equal(pipes.got[0], ((uint8_t[]){ 10, 11 }), 2);
	assert_int_equal(q.total, 0);
	assert_int_equal(q.peers, 0);
	assert_int_equal(lost, 0);
}

static void test_outq_refuses_past_its_bounds(void **state)
{
	struct aps_outq q = { 0 };
	struct aps_peer a = peer(0);
	uint8_t tag = 1;

	(void)state;
	for (int i = 0; i < APS_OUTQ_PEER_MAX; i++)
		assert_int_equal(aps_outq_push(&q, &a, &tag, 1, NULL, NULL, 0), 0);
	assert_int_equal(aps_outq_push(&q, &a, &tag, 1, NULL, NULL, 0), APS_EBUSY);
	assert_int_equal(aps_outq_longest(&q)->peer.id[0], 0);
	push(&q, 1, 2);
	assert_int_equal(aps_outq_longest(&q)->peer.id[0], 0);
	assert_int_equal(aps_outq_discard(&q, &a), APS_OUTQ_PEER_MAX);
	assert_int_equal(aps_outq_longest(&q)->peer.id[0], 1);
	assert_int_equal(aps_outq_clear(&q), 1);
	assert_null(aps_outq_longest(&q));
}

static void test_outq_a_peer_gone_loses_its_queue_and_payload_refs(void **state)
{
	struct aps_outq q = { 0 };
	struct pipes pipes = { .state = { APS_ECONN } };
	struct aps_peer a = peer(0);
	struct aps_sbuf *payload = aps_sbuf_new(8);
	uint8_t tag = 5;
	size_t sent = 0, lost = 0;

	(void)state;
	assert_int_equal(aps_outq_push(&q, &a, &tag, 1, payload, NULL, 0), 0);
	assert_int_equal(aps_outq_push(&q, &a, &tag, 1, payload, NULL, 0), 0);
	assert_int_equal(atomic_load(&payload->refs), 3);
	aps_outq_flush(&q, fake_send, &pipes, &sent, &lost);
	assert_int_equal(sent, 0);
	assert_int_equal(lost, 2);
	assert_int_equal(atomic_load(&payload->refs), 1);
	assert_false(aps_outq_waiting(&q, &a));
	aps_sbuf_unref(payload);
}

/* A queued message keeps its tally count (tally.h) until it is sent or lost. */
static void test_outq_a_tallied_message_counts_until_it_goes(void **state)
{
	struct aps_outq q = { 0 };
	struct pipes pipes = { .state = { APS_EBUSY, 0 } };
	struct aps_peer a = peer(0), b = peer(1);
	struct aps_tally *t = aps_tally_new(2);
	uint8_t tag = 7;
	size_t sent = 0, lost = 0;

	(void)state;
	assert_non_null(t);
	for (uint32_t slot = 0; slot < 2; slot++) {
		aps_tally_start(t, slot); /* what the bridge does before it queues */
		assert_int_equal(aps_outq_push(&q, slot ? &b : &a, &tag, 1, NULL, t, slot), 0);
	}
	aps_outq_flush(&q, fake_send, &pipes, &sent, &lost); /* b's goes, a's pipe is full */
	assert_int_equal(aps_tally_unsent(t, 0), 1);
	assert_int_equal(aps_tally_unsent(t, 1), 0);
	assert_int_equal(aps_outq_discard(&q, &a), 1); /* a slow reader: its queue goes */
	assert_int_equal(aps_tally_unsent(t, 0), 0);
	aps_tally_release(t); /* the last reference: freed (ASan would say otherwise) */
}

/* Sends and forgets: what the bridge does with a tally's count once sent. */
static int count_send_tallied(void *ctx, const struct aps_peer *peer, const uint8_t *hdr,
                              size_t len, struct aps_sbuf *payload, struct aps_tally *tally,
                              uint32_t slot)
{
	(void)ctx;
	(void)peer;
	(void)hdr;
	(void)len;
	(void)payload;
	if (tally != NULL)
		aps_tally_done(tally, slot);
	return 0;
}

/* A tensor's answer is bounded where it is made (tally.h), not here: however many
 * chunks it has, they wait in the queue, and only loose messages meet the bounds. */
static void test_outq_a_tensors_answer_of_many_chunks_is_not_bounded(void **state)
{
	struct aps_outq q = { 0 };
	struct pipes pipes = { .state = { APS_EBUSY } };
	struct aps_peer a = peer(0), b = peer(1);
	struct aps_tally *t = aps_tally_new(1);
	uint8_t tag = 3;
	size_t sent = 0, lost = 0, n = APS_OUTQ_TOTAL_MAX + 10;

	(void)state;
	assert_non_null(t);
	for (size_t i = 0; i < n; i++) {
		aps_tally_start(t, 0);
		assert_int_equal(aps_outq_push(&q, &a, &tag, 1, NULL, t, 0), 0);
	}
	assert_int_equal(q.total, n);
	assert_int_equal(q.loose, 0);
	for (int i = 0; i < APS_OUTQ_PEER_MAX; i++) /* a's loose ones still meet the bound */
		assert_int_equal(aps_outq_push(&q, &a, &tag, 1, NULL, NULL, 0), 0);
	assert_int_equal(aps_outq_push(&q, &a, &tag, 1, NULL, NULL, 0), APS_EBUSY);
	push(&q, 1, 4);
	assert_int_equal(aps_outq_longest(&q)->peer.id[0], 0);
	aps_outq_flush(&q, fake_send, &pipes, &sent, &lost); /* b's goes, a's pipe is full */
	assert_int_equal(sent, 1);
	assert_false(aps_outq_waiting(&q, &b));
	pipes.state[0] = 0;
	aps_outq_flush(&q, count_send_tallied, &pipes, &sent, &lost);
	assert_int_equal(sent, 1 + n + APS_OUTQ_PEER_MAX);
	assert_int_equal(q.total, 0);
	assert_int_equal(q.loose, 0);
	assert_int_equal(aps_tally_unsent(t, 0), 0);
	aps_tally_release(t);
}

static int count_send(void *ctx, const struct aps_peer *peer, const uint8_t *hdr, size_t len,
                      struct aps_sbuf *payload, struct aps_tally *tally, uint32_t slot)
{
	(void)peer;
	(void)hdr;
	(void)len;
	(void)payload;
	(void)tally;
	(void)slot;
	(*(size_t *)ctx)++;
	return 0;
}

/* FNV-1a, the unkeyed hash outq used before 2026-12-07. */
static uint32_t fnv(const uint8_t *id, size_t len)
{
	uint32_t h = 2166136261u;

	for (size_t i = 0; i < len; i++)
		h = (h ^ id[i]) * 16777619u;
	return h;
}

static void test_outq_ids_picked_to_share_a_bucket_do_not(void **state)
{
	/* 64 routing ids that shared one of the 256 buckets under FNV, as a peer
	 * could pick them: each lookup walked all. Keyed, they spread. */
	struct aps_outq q = { 0 };
	size_t found = 0, longest = 0, sent = 0, lost = 0, got = 0;
	uint8_t tag = 1;

	(void)state;
	for (uint32_t i = 0; found < 64; i++) {
		struct aps_peer p = { .len = 5,
			              .id = { 0, (uint8_t)i, (uint8_t)(i >> 8), (uint8_t)(i >> 16),
			                      'x' } };
		if (fnv(p.id, p.len) % APS_OUTQ_BUCKETS != 0)
			continue;
		assert_int_equal(aps_outq_push(&q, &p, &tag, 1, NULL, NULL, 0), 0);
		found++;
	}
	for (size_t b = 0; b < APS_OUTQ_BUCKETS; b++) {
		size_t n = 0;
		for (const struct aps_outq_peer *p = q.buckets[b]; p != NULL; p = p->next)
			n++;
		longest = n > longest ? n : longest;
	}
	assert_true(longest <= 8); /* 64 in 256 buckets: 64 under FNV */
	aps_outq_flush(&q, count_send, &got, &sent, &lost);
	assert_int_equal(sent, 64);
	assert_int_equal(got, 64);
	assert_int_equal(q.peers, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_outq_keeps_each_peers_order_and_holds_back_only_it),
		cmocka_unit_test(test_outq_refuses_past_its_bounds),
		cmocka_unit_test(test_outq_a_peer_gone_loses_its_queue_and_payload_refs),
		cmocka_unit_test(test_outq_a_tallied_message_counts_until_it_goes),
		cmocka_unit_test(test_outq_a_tensors_answer_of_many_chunks_is_not_bounded),
		cmocka_unit_test(test_outq_ids_picked_to_share_a_bucket_do_not),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
