/*
 * A peer of the daemon's ROUTER socket is known by its ZeroMQ routing id: 1 to
 * 255 bytes, chosen by the peer (16 random bytes from libaps) or by ZeroMQ.
 * Routing ids say where a reply goes; they prove nothing (docs/RELIABILITY.md).
 */
#ifndef APS_SERVER_PEER_H
#define APS_SERVER_PEER_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#define APS_PEER_ID_MAX 255

struct aps_peer {
	uint8_t len;
	uint8_t id[APS_PEER_ID_MAX];
};

static inline bool aps_peer_equal(const struct aps_peer *a, const struct aps_peer *b)
{
	return a->len == b->len && memcmp(a->id, b->id, a->len) == 0;
}

/* FNV-1a of the id, for hash tables. */
static inline uint32_t aps_peer_hash(const struct aps_peer *p)
{
	uint32_t h = 2166136261u;

	for (uint8_t i = 0; i < p->len; i++)
		h = (h ^ p->id[i]) * 16777619u;
	return h;
}

#endif
