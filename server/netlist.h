/*
 * allow_from: the networks whose peers may connect to apsd's port, as an
 * operator writes them ("10.0.0.0/8, 192.168.7.12, fd00::/8"), and whether an
 * address is in one of them. config.c checks the text at start (a typo stops
 * the daemon with its line); the ZAP handler (zbridge_zap.c) asks at each
 * handshake.
 */
#ifndef APS_SERVER_NETLIST_H
#define APS_SERVER_NETLIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_NETLIST_MAX 64 /* networks in one list */

struct aps_net {
	int family;       /* AF_INET or AF_INET6 */
	uint8_t addr[16]; /* network byte order, the first 4 for AF_INET */
	unsigned prefix;  /* bits that must match */
};

struct aps_netlist {
	struct aps_net nets[APS_NETLIST_MAX];
	size_t n;
};

/* Parses a comma-separated list of addresses and ADDRESS/PREFIX networks
 * (spaces around items allowed). Returns 0, or APS_EINVAL with why (one line
 * naming the item) in why. An empty text is an empty list. */
int aps_netlist_parse(struct aps_netlist *l, const char *text, char *why, size_t why_len);

/* net as ADDRESS/PREFIX into out (INET6_ADDRSTRLEN + 4 bytes suffice). */
void aps_netlist_format(const struct aps_net *net, char *out, size_t len);

/* Whether ip (text, as the ZAP handler gets it; an IPv4-mapped IPv6 address
 * counts as its IPv4 one) is in one of l's networks. */
bool aps_netlist_has(const struct aps_netlist *l, const char *ip);

#endif
