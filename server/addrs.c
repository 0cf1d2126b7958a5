/* Open connections by address (addrs.h): chained buckets, at most one entry a
 * bucket on average, an entry freed with its last connection. */
#include "server/addrs.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void aps_addrs_origin(const char *ip, char out[APS_ADDRS_ORIGIN_LEN])
{
	char net[INET6_ADDRSTRLEN], bare[INET6_ADDRSTRLEN];
	struct in6_addr a;

	snprintf(out, APS_ADDRS_ORIGIN_LEN, "%s", ip);
	/* a link-local address names its interface ("fe80::1%eth0"), which inet_pton
	 * refuses: without it, every address of the link is one /64 as any other */
	snprintf(bare, sizeof(bare), "%.*s", (int)strcspn(ip, "%"), ip);
	if (strchr(bare, ':') == NULL || inet_pton(AF_INET6, bare, &a) != 1 ||
	    IN6_IS_ADDR_V4MAPPED(&a))
		return;
	memset(&a.s6_addr[8], 0, 8);
	if (inet_ntop(AF_INET6, &a, net, sizeof(net)) != NULL)
		snprintf(out, APS_ADDRS_ORIGIN_LEN, "%s/64", net);
}

static struct aps_addrs_entry **link_of(struct aps_addrs *a, const char *origin)
{
	struct aps_addrs_entry **link;

	link = &a->buckets[aps_peer_hash_bytes(&a->hasher, origin, strlen(origin)) &
	                   (a->n_buckets - 1)];
	while (*link != NULL && strcmp((*link)->origin, origin) != 0)
		link = &(*link)->next;
	return link;
}

/* Twice the buckets (64 at first); out of memory: longer chains, still right. */
static void grow(struct aps_addrs *a)
{
	size_t n = a->n_buckets ? 2 * a->n_buckets : 64;
	struct aps_addrs_entry **old = a->buckets, *e, *next;
	size_t n_old = a->n_buckets;

	a->buckets = calloc(n, sizeof(*a->buckets));
	if (a->buckets == NULL) {
		a->buckets = old;
		return;
	}
	a->n_buckets = n;
	for (size_t i = 0; i < n_old; i++) {
		for (e = old[i]; e != NULL; e = next) {
			struct aps_addrs_entry **to = link_of(a, e->origin);
			next = e->next;
			e->next = *to;
			*to = e;
		}
	}
	free(old);
}

struct aps_addrs_entry *aps_addrs_open(struct aps_addrs *a, const char *ip)
{
	char origin[APS_ADDRS_ORIGIN_LEN];
	struct aps_addrs_entry **link, *e;

	if (a->n >= a->n_buckets)
		grow(a);
	if (a->n_buckets == 0)
		return NULL;
	aps_addrs_origin(ip, origin);
	link = link_of(a, origin);
	if (*link == NULL) {
		if ((e = calloc(1, sizeof(*e))) == NULL)
			return NULL;
		snprintf(e->origin, sizeof(e->origin), "%s", origin);
		*link = e;
		a->n++;
	}
	(*link)->open++;
	return *link;
}

void aps_addrs_close(struct aps_addrs *a, struct aps_addrs_entry *e, bool joined)
{
	struct aps_addrs_entry **link;

	e->joined -= joined && e->joined > 0;
	if (--e->open > 0)
		return;
	link = link_of(a, e->origin);
	if (*link == e)
		*link = e->next;
	free(e);
	a->n--;
}

void aps_addrs_join(struct aps_addrs_entry *e, int delta)
{
	if (delta > 0)
		e->joined++;
	else if (e->joined > 0)
		e->joined--;
}

const struct aps_addrs_entry *aps_addrs_find(struct aps_addrs *a, const char *ip)
{
	char origin[APS_ADDRS_ORIGIN_LEN];

	if (a->n == 0)
		return NULL;
	aps_addrs_origin(ip, origin);
	return *link_of(a, origin);
}

void aps_addrs_free(struct aps_addrs *a)
{
	for (size_t i = 0; i < a->n_buckets; i++) {
		struct aps_addrs_entry *e = a->buckets[i], *next;
		for (; e != NULL; e = next) {
			next = e->next;
			free(e);
		}
	}
	free(a->buckets);
	memset(a, 0, sizeof(*a));
}
