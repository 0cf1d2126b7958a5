/* Connection ids from descriptors and socket-monitor events (conns.h). */
#include "server/conns.h"

#include "common/err.h"

#include <stdlib.h>
#include <string.h>

uint64_t aps_conns_id(const struct aps_conns *t, int fd)
{
	uint32_t accepts;

	if (fd < 0)
		return 0;
	accepts = (size_t)fd < t->cap ? t->accepts[fd] : 0;
	return (uint64_t)accepts << 32 | ((uint64_t)(uint32_t)fd + 1);
}

int aps_conns_accepted(struct aps_conns *t, int fd)
{
	if (fd < 0)
		return APS_EINVAL;
	if ((size_t)fd >= t->cap) {
		size_t cap = (size_t)fd + 1 > 2 * t->cap ? (size_t)fd + 1 : 2 * t->cap;
		uint32_t *grown = realloc(t->accepts, cap * sizeof(*grown));
		if (grown == NULL)
			return APS_ENOMEM;
		memset(grown + t->cap, 0, (cap - t->cap) * sizeof(*grown));
		t->accepts = grown;
		t->cap = cap;
	}
	t->accepts[fd]++;
	return 0;
}

int aps_conns_closed(struct aps_conns *t, int fd)
{
	if (fd < 0)
		return APS_EINVAL;
	if (t->n_closed == t->cap_closed) {
		size_t cap = t->cap_closed ? 2 * t->cap_closed : 16;
		uint64_t *grown = realloc(t->closed, cap * sizeof(*grown));
		if (grown == NULL)
			return APS_ENOMEM;
		t->closed = grown;
		t->cap_closed = cap;
	}
	t->closed[t->n_closed++] = aps_conns_id(t, fd);
	return 0;
}

uint64_t *aps_conns_take_closed(struct aps_conns *t, size_t *n)
{
	uint64_t *ids = t->closed;

	*n = t->n_closed;
	t->closed = NULL;
	t->n_closed = t->cap_closed = 0;
	return ids;
}

void aps_conns_free(struct aps_conns *t)
{
	free(t->accepts);
	free(t->closed);
	memset(t, 0, sizeof(*t));
}
