/*
 * Sharing a report's lines out among jobs, smallest first (listing.h).
 */
#include "server/listing.h"

#include <stdlib.h>

struct wish {
	uint32_t want, index; /* lines a job wants, its place in the list */
};

static int by_want(const void *a, const void *b)
{
	const struct wish *x = a, *y = b;

	return (x->want > y->want) - (x->want < y->want);
}

int64_t aps_listing_share(const uint32_t *want, size_t n, uint32_t max, uint32_t *quota)
{
	struct wish *w = malloc((n ? n : 1) * sizeof(*w));
	size_t left = max;
	int64_t unlisted = 0;

	if (w == NULL)
		return -1;
	for (size_t i = 0; i < n; i++)
		w[i] = (struct wish){ want[i], (uint32_t)i };
	qsort(w, n, sizeof(*w), by_want);
	for (size_t i = 0; i < n; i++) {
		size_t share = left / (n - i);
		uint32_t q = (uint32_t)(w[i].want < share ? w[i].want : share);
		quota[w[i].index] = q;
		left -= q;
		unlisted += w[i].want - q;
	}
	free(w);
	return unlisted;
}
