/* Payload messages of a tensor's answers not yet sent, per rank (tally.h). */
#include "server/tally.h"

#include <stdatomic.h>
#include <stdlib.h>

struct aps_tally {
	atomic_uint refs;
	uint32_t slots;
	atomic_uint unsent[];
};

struct aps_tally *aps_tally_new(uint32_t slots)
{
	struct aps_tally *t = calloc(1, aps_tally_size(slots));

	if (t == NULL)
		return NULL;
	atomic_init(&t->refs, 1);
	t->slots = slots;
	for (uint32_t i = 0; i < slots; i++)
		atomic_init(&t->unsent[i], 0);
	return t;
}

uint64_t aps_tally_size(uint32_t slots)
{
	return sizeof(struct aps_tally) + (uint64_t)slots * sizeof(atomic_uint);
}

static void unref(struct aps_tally *t)
{
	if (atomic_fetch_sub_explicit(&t->refs, 1, memory_order_acq_rel) == 1)
		free(t);
}

void aps_tally_start(struct aps_tally *t, uint32_t slot)
{
	atomic_fetch_add_explicit(&t->refs, 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&t->unsent[slot], 1, memory_order_relaxed);
}

void aps_tally_done(struct aps_tally *t, uint32_t slot)
{
	atomic_fetch_sub_explicit(&t->unsent[slot], 1, memory_order_release);
	unref(t);
}

uint32_t aps_tally_unsent(const struct aps_tally *t, uint32_t slot)
{
	return slot < t->slots ? atomic_load_explicit(&t->unsent[slot], memory_order_acquire) : 0;
}

void aps_tally_release(struct aps_tally *t)
{
	if (t != NULL)
		unref(t);
}
