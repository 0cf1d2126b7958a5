/*
 * Part of the connection table (conns.h): open connections counted by the
 * address they come from, an IPv4 address as it is, an IPv6 one's /64 (a host
 * may pick any address of its /64). It answers in constant time whatever the
 * connections: how many an address has open (max_connections_per_address),
 * and whether a joined worker is among them (an address never turned away).
 * Keyed by a hash a peer cannot work out (peer.h): it picks its address within
 * its /64, and must not be able to make every lookup walk one bucket.
 */
#ifndef APS_SERVER_ADDRS_H
#define APS_SERVER_ADDRS_H

#include "server/peer.h"

#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>

#define APS_ADDRS_ORIGIN_LEN (INET6_ADDRSTRLEN + 3)

struct aps_addrs_entry {
	struct aps_addrs_entry *next;
	uint32_t open, joined; /* connections open, those of them admitted */
	char origin[APS_ADDRS_ORIGIN_LEN];
};

struct aps_addrs {
	struct aps_addrs_entry **buckets;
	size_t n_buckets, n;
	struct aps_peer_hasher hasher;
};

/* The origin of an IP address: itself, or for IPv6 (not v4-mapped) "NET/64". */
void aps_addrs_origin(const char *ip, char out[APS_ADDRS_ORIGIN_LEN]);

/* One more connection open from ip; returns its origin's entry, or NULL when out
 * of memory (the connection then goes uncounted). */
struct aps_addrs_entry *aps_addrs_open(struct aps_addrs *a, const char *ip);
/* One connection of e's (from aps_addrs_open) closed (joined: it was admitted);
 * e is freed with its last. */
void aps_addrs_close(struct aps_addrs *a, struct aps_addrs_entry *e, bool joined);
/* One connection of e's admitted (delta 1) or no longer (-1). */
void aps_addrs_join(struct aps_addrs_entry *e, int delta);
/* ip's origin's entry, or NULL: nothing open from there. */
const struct aps_addrs_entry *aps_addrs_find(struct aps_addrs *a, const char *ip);
void aps_addrs_free(struct aps_addrs *a);

#endif
