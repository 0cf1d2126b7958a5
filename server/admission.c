/*
 * Which addresses may connect (admission.h): a small table of the addresses
 * whose handshakes led to no message, and of those turned away.
 */
#include "server/admission.h"

#include <stdio.h>
#include <string.h>

#define WINDOW_MS 60000ULL
/* Handshakes of the last 250-500 ms are not judged: their first message may be on its way. */
#define SECOND_MS     250ULL
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

/* Handshakes of e's window that have not spoken (yet), for the table's eviction. */
static uint32_t silent_so_far(const struct aps_admission_entry *e)
{
	return e->handshakes > e->spoke ? e->handshakes - e->spoke : 0;
}

/* Whether s rather than the chosen one leaves the table: fewer silent
 * handshakes (a stranger's count must not be wiped by 256 new addresses of
 * its own), then idle longer. */
static bool goes_before(const struct aps_admission_entry *s,
                        const struct aps_admission_entry *chosen)
{
	if (chosen == NULL || silent_so_far(s) != silent_so_far(chosen))
		return chosen == NULL || silent_so_far(s) < silent_so_far(chosen);
	return s->last_ms < chosen->last_ms;
}

/* ip's slot, a new one when it has none: a free slot, else among those not
 * turned away the one with the fewest silent handshakes, idle longest, else
 * the one whose time away ends first. */
static struct aps_admission_entry *slot(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e = find(a, ip), *idle = NULL, *ending = NULL;

	if (e != NULL)
		return e;
	for (size_t i = 0; i < APS_ADMISSION_SLOTS && e == NULL; i++) {
		struct aps_admission_entry *s = &a->slots[i];
		if (s->ip[0] == '\0')
			e = s;
		else if (s->until_ms <= now && goes_before(s, idle))
			idle = s;
		else if (s->until_ms > now && (ending == NULL || s->until_ms < ending->until_ms))
			ending = s;
	}
	e = e != NULL ? e : idle != NULL ? idle : ending;
	memset(e, 0, sizeof(*e));
	snprintf(e->ip, sizeof(e->ip), "%s", ip);
	e->window_ms = e->recent_ms = now;
	return e;
}

bool aps_admission_exempt(const char *ip)
{
	return strcmp(ip, "127.0.0.1") == 0 || strcmp(ip, "::1") == 0 ||
	       strcmp(ip, "::ffff:127.0.0.1") == 0 || strncmp(ip, "localhost:", 10) == 0;
}

/* e's count starts again; the last 250-500 ms of handshakes and first messages
 * go on into it (the first messages are most likely theirs). */
static void restart(struct aps_admission_entry *e, uint64_t now)
{
	e->handshakes = e->recent[0] + e->recent[1];
	e->spoke = e->recent_spoke[0] + e->recent_spoke[1];
	e->window_ms = now;
}

/* Moves e's seconds and its window on to now. */
static void roll(struct aps_admission_entry *e, uint64_t now)
{
	uint64_t seconds = now > e->recent_ms ? (now - e->recent_ms) / SECOND_MS : 0;

	if (seconds > 0) {
		e->recent[1] = seconds == 1 ? e->recent[0] : 0;
		e->recent_spoke[1] = seconds == 1 ? e->recent_spoke[0] : 0;
		e->recent[0] = e->recent_spoke[0] = 0;
		e->recent_ms += seconds * SECOND_MS;
	}
	if (now >= e->window_ms + WINDOW_MS) /* the recent ones and their first messages go on */
		restart(e, now);
}

void aps_admission_handshake(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e;

	if (a->limit == 0)
		return;
	e = slot(a, ip, now);
	roll(e, now);
	e->handshakes++;
	e->recent[0]++;
	e->last_ms = now;
}

void aps_admission_spoke(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e = a->limit != 0 ? find(a, ip) : NULL;

	if (e == NULL)
		return;
	roll(e, now);
	e->spoke++;
	e->recent_spoke[0]++;
	e->last_ms = now;
}

/* Handshakes of e's window that led to no message, those of the last 250 ms aside. */
static uint32_t unspoken(const struct aps_admission_entry *e)
{
	uint64_t recent = (uint64_t)e->recent[0] + e->recent[1];
	uint64_t judged = e->handshakes > recent ? e->handshakes - recent : 0;

	return judged > e->spoke ? (uint32_t)(judged - e->spoke) : 0;
}

/* e's handshakes that led to no message, now; 0 while it is away. */
static uint32_t judged(struct aps_admission_entry *e, uint64_t now)
{
	if (e->ip[0] == '\0' || e->until_ms > now)
		return 0;
	roll(e, now);
	return unspoken(e);
}

uint32_t aps_admission_unspoken(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e = a->limit != 0 ? find(a, ip) : NULL;

	return e != NULL ? judged(e, now) : 0;
}

const char *aps_admission_over(struct aps_admission *a, size_t *i, uint32_t *unspoken_out,
                               uint64_t now)
{
	for (; a->limit != 0 && *i < APS_ADMISSION_SLOTS; (*i)++) {
		uint32_t n = judged(&a->slots[*i], now);
		if (n > a->limit) {
			*unspoken_out = n;
			return a->slots[(*i)++].ip;
		}
	}
	return NULL;
}

void aps_admission_forgive(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e = find(a, ip);

	if (e == NULL)
		return;
	if (e->until_ms > now)
		e->until_ms = now; /* ended now: an hour without a strike still forgives them */
	restart(e, now);
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
	restart(e, now);
	a->quarantined++;
	return away;
}

bool aps_admission_check_due(struct aps_admission *a, const char *ip, uint64_t now)
{
	struct aps_admission_entry *e = find(a, ip);

	if (e == NULL || (e->checked_ms != 0 && now - e->checked_ms < SECOND_MS))
		return false;
	e->checked_ms = now;
	return true;
}

bool aps_admission_away(struct aps_admission *a, const char *ip, uint64_t now)
{
	const struct aps_admission_entry *e = a->limit != 0 ? find(a, ip) : NULL;

	return e != NULL && e->until_ms > now;
}

bool aps_admission_allows(struct aps_admission *a, const char *ip, uint64_t now)
{
	const struct aps_admission_entry *e = a->limit != 0 ? find(a, ip) : NULL;

	if (e == NULL || e->until_ms <= now)
		return true;
	a->refused++;
	return false;
}
