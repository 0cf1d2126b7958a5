/* The keyed hash of routing ids (peer.h). */
#include "server/peer.h"

#include <sodium.h>
#include <sys/random.h>
#include <time.h>

/* The key, once; without randomness a clock's (a hash still, not a secret). */
static void draw_key(struct aps_peer_hasher *h)
{
	if (getrandom(h->key, sizeof(h->key), 0) != (ssize_t)sizeof(h->key)) {
		struct timespec ts;
		clock_gettime(CLOCK_MONOTONIC, &ts);
		memcpy(h->key, &ts, sizeof(ts) < sizeof(h->key) ? sizeof(ts) : sizeof(h->key));
	}
	h->keyed = true;
}

uint64_t aps_peer_hash_bytes(struct aps_peer_hasher *h, const void *data, size_t len)
{
	uint8_t out[crypto_shorthash_BYTES];
	uint64_t v;

	if (!h->keyed)
		draw_key(h);
	crypto_shorthash(out, data, len, h->key);
	memcpy(&v, out, sizeof(v));
	return v;
}

uint64_t aps_peer_hash(struct aps_peer_hasher *h, const struct aps_peer *p)
{
	return aps_peer_hash_bytes(h, p->id, p->len);
}
