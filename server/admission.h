/*
 * Part of the socket bridge: which addresses may connect. An address whose
 * connections keep closing without a single message (a scanner, a flood of
 * connections that never speak, connections libzmq parks because they reuse
 * a live routing id) costs apsd a little each time, and parked ones a socket
 * reset that cuts every worker. Past max_silent_closes such closes in a
 * minute, its handshakes are refused (the ZAP handler, status 400) for a
 * minute, twice as long at each repeat, at most an hour. An address from
 * which a joined worker is connected is never turned away (the caller
 * checks). Addresses are the peers' IP addresses as text; ipc has none.
 */
#ifndef APS_SERVER_ADMISSION_H
#define APS_SERVER_ADMISSION_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#define APS_ADMISSION_SLOTS 256 /* addresses remembered; the longest idle one goes */

struct aps_admission_entry {
	char ip[INET6_ADDRSTRLEN]; /* "" : a free slot */
	uint32_t silent;           /* silent closes in the window that began at window_ms */
	uint32_t strikes;          /* times it was turned away */
	uint64_t window_ms, until_ms, last_ms;
};

struct aps_admission {
	struct aps_admission_entry slots[APS_ADMISSION_SLOTS];
	uint32_t limit; /* silent closes a minute; 0: nobody is turned away */
	uint64_t quarantined, refused;
};

void aps_admission_init(struct aps_admission *a, uint32_t limit);

/* The IP address of a conns.h "ip:port" into ip; false for "local" (ipc) or "unknown". */
bool aps_admission_ip_of(const char *address, char ip[INET6_ADDRSTRLEN]);

/* A connection from ip closed without delivering a message: true when that was
 * one more than the limit allows in a minute (the window starts again). */
bool aps_admission_silent_close(struct aps_admission *a, const char *ip, uint64_t now);

/* Turns ip away from now on; returns for how many milliseconds. */
uint64_t aps_admission_turn_away(struct aps_admission *a, const char *ip, uint64_t now);

/* Whether a handshake from ip may go on now (a refusal is counted). */
bool aps_admission_allows(struct aps_admission *a, const char *ip, uint64_t now);

#endif
