/*
 * Which addresses may connect (admission.h): a small table of the addresses
 * whose connections closed without a message, and of those turned away.
 */
#include "server/admission.h"

#include <stdio.h>
#include <string.h>

#define WINDOW_MS     60000ULL
#define FIRST_AWAY_MS 60000ULL
#define MAX_AWAY_MS   3600000ULL

void aps_admission_init(struct aps_admission *a, uint32_t limit)
{
	memset(a, 0, sizeof(*a));
	a->limit = limit;
}

bool aps_admission_ip_of(const char *address, char ip[INET6_ADDRSTRLEN])
{
	const char *colon = strrchr(address, ':');
	size_t len = colon != NULL ? (size_t)(colon - address) : 0;

	if (len == 0 || len >= INET6_ADDRSTRLEN)
		return false;
	memcpy(ip, address, len);
	ip[len] = '\0';
	return true;
}

static struct aps_admission_entry *find(struct aps_admission *a, const char *ip)
{
	for (size_t i = 0; i < APS_ADMISSION_SLOTS; i++) {
		if (a->slots[i].ip[0] != '\0' && strcmp(a->slots[i].ip, ip) == 0)
			return &a->slots[i];
	}
	return NULL;
}

/* ip's slot, a new one when it has none: a free slot, else the one idle longest
 * among those not turned away, else the one whose time away ends first. */
static struct aps_admission_entry *slot(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e = find(a, ip), *idle = NULL, *ending = NULL;

	if (e != NULL)
		return e;
	for (size_t i = 0; i < APS_ADMISSION_SLOTS && e == NULL; i++) {
		struct aps_admission_entry *s = &a->slots[i];
		if (s->ip[0] == '\0')
			e = s;
		else if (s->until_ms <= now && (idle == NULL || s->last_ms < idle->last_ms))
			idle = s;
		else if (s->until_ms > now && (ending == NULL || s->until_ms < ending->until_ms))
			ending = s;
	}
	e = e != NULL ? e : idle != NULL ? idle : ending;
	memset(e, 0, sizeof(*e));
	snprintf(e->ip, sizeof(e->ip), "%s", ip);
	e->window_ms = now;
	return e;
}

bool aps_admission_silent_close(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e;

	if (a->limit == 0)
		return false;
	e = slot(a, ip, now);
	e->last_ms = now;
	if (e->until_ms > now)
		return false; /* turned away already: a handshake cut short */
	if (now - e->window_ms >= WINDOW_MS) {
		e->window_ms = now;
		e->silent = 0;
	}
	if (++e->silent <= a->limit)
		return false;
	e->window_ms = now;
	e->silent = 0;
	return true;
}

uint64_t aps_admission_turn_away(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e = slot(a, ip, now);
	uint32_t doublings;
	uint64_t away;

	if (e->until_ms != 0 && now > e->until_ms + MAX_AWAY_MS)
		e->strikes = 0; /* an hour without a strike: forgiven */
	doublings = e->strikes < 6 ? e->strikes : 6;
	away = FIRST_AWAY_MS << doublings;
	if (away > MAX_AWAY_MS)
		away = MAX_AWAY_MS;
	e->strikes++;
	e->until_ms = now + away;
	e->last_ms = now;
	a->quarantined++;
	return away;
}

bool aps_admission_allows(struct aps_admission *a, const char *ip, uint64_t now)
{
	const struct aps_admission_entry *e = a->limit != 0 ? find(a, ip) : NULL;

	if (e == NULL || e->until_ms <= now)
		return true;
	a->refused++;
	return false;
}
