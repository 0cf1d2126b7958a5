/*
 * A peer of the daemon's ROUTER socket is known by its ZeroMQ routing id: 1 to
 * 255 bytes, chosen by the peer (16 random bytes from libaps) or by ZeroMQ.
 * Routing ids say where a reply goes; they prove nothing (docs/RELIABILITY.md).
 */
#ifndef APS_SERVER_PEER_H
#define APS_SERVER_PEER_H

#include <stdbool.h>
#include <stddef.h>
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

/*
 * A keyed hash of routing ids for the daemon's tables (SipHash-2-4, libsodium),
 * its key drawn at the first use. A peer picks its routing id: with a hash it
 * could work out (FNV before 2026-12-07), it could pick ids that all share one
 * bucket and make every lookup walk them.
 */
struct aps_peer_hasher {
	uint8_t key[16];
	bool keyed;
};

uint64_t aps_peer_hash(struct aps_peer_hasher *h, const struct aps_peer *p);
/* The same hash of any bytes (an address). */
uint64_t aps_peer_hash_bytes(struct aps_peer_hasher *h, const void *data, size_t len);

#endif
