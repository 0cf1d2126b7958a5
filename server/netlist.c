/*
 * allow_from's networks: parsed once, matched by prefix at each handshake.
 */
#include "server/netlist.h"

#include "common/err.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ITEM_MAX 64 /* longer than any address with its prefix */

/* An address as text into family and 16 bytes; an IPv4-mapped IPv6 one as IPv4
 * (*mapped says so, when not NULL). */
static bool address_of(const char *text, int *family, uint8_t addr[16], bool *mapped)
{
	static const uint8_t v4_in_v6[12] = { 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff };

	memset(addr, 0, 16);
	if (mapped != NULL)
		*mapped = false;
	if (inet_pton(AF_INET, text, addr) == 1) {
		*family = AF_INET;
		return true;
	}
	if (inet_pton(AF_INET6, text, addr) != 1)
		return false;
	*family = AF_INET6;
	if (memcmp(addr, v4_in_v6, sizeof(v4_in_v6)) == 0) {
		memmove(addr, addr + 12, 4);
		memset(addr + 4, 0, 12);
		*family = AF_INET;
		if (mapped != NULL)
			*mapped = true;
	}
	return true;
}

static bool prefix_matches(const uint8_t *a, const uint8_t *b, unsigned bits)
{
	unsigned whole = bits / 8, rest = bits % 8;

	if (memcmp(a, b, whole) != 0)
		return false;
	return rest == 0 || ((a[whole] ^ b[whole]) & (uint8_t)(0xff << (8 - rest))) == 0;
}

static int parse_item(struct aps_net *net, const char *item, char *why, size_t why_len)
{
	char addr[ITEM_MAX];
	const char *slash = strchr(item, '/');
	size_t len = slash != NULL ? (size_t)(slash - item) : strlen(item);
	unsigned max, skip;
	bool mapped;

	if (len >= sizeof(addr)) {
		snprintf(why, why_len, "network '%.40s...' is not an address", item);
		return APS_EINVAL;
	}
	memcpy(addr, item, len);
	addr[len] = '\0';
	if (!address_of(addr, &net->family, net->addr, &mapped)) {
		snprintf(why, why_len,
		         "network '%s' is not an IPv4 or IPv6 address (write ADDRESS or "
		         "ADDRESS/PREFIX, comma-separated; host names are not looked up)",
		         item);
		return APS_EINVAL;
	}
	/* ::ffff:10.9.0.0/112 is 10.9.0.0/16: its prefix counts the 96 bits before */
	skip = mapped ? 96 : 0;
	max = net->family == AF_INET ? 32 : 128;
	net->prefix = max;
	if (slash != NULL) {
		char *end;
		unsigned long p = strtoul(slash + 1, &end, 10);
		if (!isdigit((unsigned char)slash[1]) || *end != '\0' || p < skip ||
		    p > skip + max) {
			snprintf(why, why_len, "network '%s': the prefix must be %u to %u", item,
			         skip, skip + max);
			return APS_EINVAL;
		}
		net->prefix = (unsigned)p - skip;
	}
	/* 10.1.2.3/8 most likely means 10.0.0.0/8 or 10.1.2.3: say so, do not guess */
	if (net->prefix < max) {
		uint8_t host[16];
		memcpy(host, net->addr, 16);
		for (unsigned b = net->prefix; b < max; b++)
			host[b / 8] &= (uint8_t) ~(0x80 >> (b % 8));
		if (memcmp(host, net->addr, 16) != 0) {
			char fixed[INET6_ADDRSTRLEN];
			inet_ntop(net->family, host, fixed, sizeof(fixed));
			snprintf(why, why_len,
			         "network '%s' has bits set past its prefix: write %s/%u for the "
			         "network, or the address alone",
			         item, fixed, net->prefix);
			return APS_EINVAL;
		}
	}
	return 0;
}

int aps_netlist_parse(struct aps_netlist *l, const char *text, char *why, size_t why_len)
{
	const char *p = text;

	l->n = 0;
	while (*p != '\0') {
		char item[ITEM_MAX + 1];
		const char *end = strchr(p, ',');
		size_t len = end != NULL ? (size_t)(end - p) : strlen(p);

		while (len > 0 && isspace((unsigned char)*p)) {
			p++;
			len--;
		}
		while (len > 0 && isspace((unsigned char)p[len - 1]))
			len--;
		if (len == 0) {
			snprintf(why, why_len, "an empty item in the networks '%s'", text);
			return APS_EINVAL;
		}
		if (len > ITEM_MAX) {
			snprintf(why, why_len, "network '%.40s...' is not an address", p);
			return APS_EINVAL;
		}
		if (l->n == APS_NETLIST_MAX) {
			snprintf(why, why_len, "more than %d networks", APS_NETLIST_MAX);
			return APS_EINVAL;
		}
		snprintf(item, sizeof(item), "%.*s", (int)len, p);
		if (parse_item(&l->nets[l->n], item, why, why_len) < 0)
			return APS_EINVAL;
		l->n++;
		if (end == NULL)
			break;
		p = end + 1;
		if (*p == '\0') {
			snprintf(why, why_len, "an empty item in the networks '%s'", text);
			return APS_EINVAL;
		}
	}
	return 0;
}

void aps_netlist_format(const struct aps_net *net, char *out, size_t len)
{
	char addr[INET6_ADDRSTRLEN];

	if (inet_ntop(net->family, net->addr, addr, sizeof(addr)) == NULL)
		addr[0] = '\0';
	snprintf(out, len, "%s/%u", addr, net->prefix);
}

bool aps_netlist_has(const struct aps_netlist *l, const char *ip)
{
	uint8_t addr[16];
	int family;

	if (!address_of(ip, &family, addr, NULL))
		return false;
	for (size_t i = 0; i < l->n; i++) {
		if (l->nets[i].family == family &&
		    prefix_matches(l->nets[i].addr, addr, l->nets[i].prefix))
			return true;
	}
	return false;
}
