/*
 * Reference counting of shared payload buffers.
 */
#include "common/sbuf.h"

#include <stdlib.h>

struct aps_sbuf *aps_sbuf_new(size_t len)
{
	struct aps_sbuf *b = malloc(sizeof(*b) + len);

	if (b == NULL)
		return NULL;
	atomic_init(&b->refs, 1);
	b->len = len;
	return b;
}

struct aps_sbuf *aps_sbuf_ref(struct aps_sbuf *b)
{
	atomic_fetch_add_explicit(&b->refs, 1, memory_order_relaxed);
	return b;
}

void aps_sbuf_unref(struct aps_sbuf *b)
{
	if (b != NULL && atomic_fetch_sub_explicit(&b->refs, 1, memory_order_acq_rel) == 1)
		free(b);
}
