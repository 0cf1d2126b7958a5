/* Results kept for ranks that reconnect (replay.h). */
#include "server/replay.h"

#include "common/err.h"

#include <stdlib.h>
#include <string.h>

static void drop(struct aps_replay_entry *e)
{
	free(e->hdr);
	aps_sbuf_unref(e->payload);
	memset(e, 0, sizeof(*e));
}

/* Room for len header bytes in e (the last step's buffer when it is large enough). */
static int make_room(struct aps_replay_entry *e, size_t len)
{
	uint8_t *grown;

	if (e->hdr != NULL && e->hdr_cap >= len)
		return 0;
	grown = realloc(e->hdr, len);
	if (grown == NULL)
		return APS_ENOMEM;
	e->hdr = grown;
	e->hdr_cap = len;
	return 0;
}

int aps_replay_keep(struct aps_replay *r, uint32_t n_chunks, uint32_t chunk, uint64_t step,
                    const uint8_t *hdr, size_t hdr_len, struct aps_sbuf *payload)
{
	struct aps_replay_entry *e;

	if (r->chunks == NULL) {
		r->chunks = calloc(n_chunks, sizeof(*r->chunks));
		if (r->chunks == NULL)
			return APS_ENOMEM;
		r->n_chunks = n_chunks;
	}
	if (chunk >= r->n_chunks)
		return APS_EINVAL;
	e = &r->chunks[chunk];
	aps_sbuf_unref(e->payload);
	e->payload = NULL;
	e->hdr_len = 0;
	if (make_room(e, hdr_len) < 0) {
		drop(e);
		return APS_ENOMEM;
	}
	memcpy(e->hdr, hdr, hdr_len);
	e->hdr_len = hdr_len;
	e->step = step;
	e->payload = payload != NULL ? aps_sbuf_ref(payload) : NULL;
	return 0;
}

const struct aps_replay_entry *aps_replay_find(const struct aps_replay *r, uint32_t chunk,
                                               uint64_t step)
{
	if (r->chunks == NULL || chunk >= r->n_chunks || r->chunks[chunk].hdr_len == 0)
		return NULL;
	return r->chunks[chunk].step == step ? &r->chunks[chunk] : NULL;
}

void aps_replay_fini(struct aps_replay *r)
{
	for (uint32_t i = 0; r->chunks != NULL && i < r->n_chunks; i++)
		drop(&r->chunks[i]);
	free(r->chunks);
	memset(r, 0, sizeof(*r));
}
