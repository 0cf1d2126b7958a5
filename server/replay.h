/*
 * What a rank that reconnected may have missed: the last result of every
 * chunk of a tensor, as it went to every rank (its packed header and a
 * reference to its payload), so that a push sent again for a finished chunk
 * is answered with the very bytes the other ranks got. No sockets here.
 */
#ifndef APS_SERVER_REPLAY_H
#define APS_SERVER_REPLAY_H

#include "common/sbuf.h"

#include <stddef.h>
#include <stdint.h>

struct aps_replay_entry {
	uint64_t step;            /* of the result kept */
	uint8_t *hdr;             /* the header as sent, in hdr_cap bytes */
	size_t hdr_len, hdr_cap;  /* hdr_len 0: nothing kept */
	struct aps_sbuf *payload; /* one reference */
};

struct aps_replay {
	uint32_t n_chunks;
	struct aps_replay_entry *chunks; /* NULL until the first result is kept */
};

/*
 * Keeps chunk's result of step (hdr copied, payload referenced) in place of
 * the one before; the table of n_chunks entries is made on the first call.
 * Returns 0 or APS_ENOMEM (then nothing is kept for that chunk).
 */
int aps_replay_keep(struct aps_replay *r, uint32_t n_chunks, uint32_t chunk, uint64_t step,
                    const uint8_t *hdr, size_t hdr_len, struct aps_sbuf *payload);

/* The kept result of chunk at step, or NULL. */
const struct aps_replay_entry *aps_replay_find(const struct aps_replay *r, uint32_t chunk,
                                               uint64_t step);

void aps_replay_fini(struct aps_replay *r);

#endif
