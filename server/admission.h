/*
 * Part of the socket bridge: which addresses may connect. An address whose
 * connections keep going without a single message (a scanner, a flood of
 * connections that never speak, connections libzmq parks because they reuse
 * a live routing id) costs apsd a little each time, and parked ones a socket
 * reset that cuts every worker. Each handshake is counted by the address the
 * ZAP handler is given, each connection's first message by the address
 * ZeroMQ gives the message (both right whatever happened to the descriptor);
 * past max_silent_closes handshakes in a minute that never led to a message
 * (those of the last 250-500 ms are not judged yet), the address's handshakes are
 * refused (the ZAP handler, status 400) for a minute, twice as long at each
 * repeat, at most an hour. An address from which a joined worker is
 * connected is never turned away, nor 127.0.0.1, ::1 and ipc, where a host's
 * own workers connect (the caller checks). Addresses are the peers' IP
 * addresses as text.
 */
#ifndef APS_SERVER_ADMISSION_H
#define APS_SERVER_ADMISSION_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stdint.h>

#define APS_ADMISSION_SLOTS 256 /* addresses remembered; the least silent one goes */

struct aps_admission_entry {
	char ip[INET6_ADDRSTRLEN]; /* "" : a free slot */
	uint32_t handshakes;       /* let through in the window that began at window_ms */
	uint32_t spoke;            /* its connections that delivered a message, same window */
	uint32_t recent[2];        /* handshakes of this 250 ms and the 250 ms before */
	uint32_t recent_spoke[2];  /* first messages, the same */
	uint64_t recent_ms;        /* when recent[0]'s 250 ms began */
	uint64_t checked_ms;       /* when the bridge last looked at its connections */
	uint32_t strikes;          /* times it was turned away */
	uint64_t window_ms, until_ms, last_ms;
};

struct aps_admission {
	struct aps_admission_entry slots[APS_ADMISSION_SLOTS];
	uint32_t limit; /* silent closes a minute; 0: nobody is turned away */
	uint64_t quarantined, refused;
};

void aps_admission_init(struct aps_admission *a, uint32_t limit);

/* The IP address of a conns.h "ip:port" into ip (conns.c matches connections by
 * it); false for "local" (ipc) or "unknown". */
bool aps_admission_ip_of(const char *address, char ip[INET6_ADDRSTRLEN]);

/* Addresses never turned away: 127.0.0.1, ::1, ipc ("localhost:UID:GID:PID"). */
bool aps_admission_exempt(const char *ip);

/* A handshake from ip that the ZAP handler lets go on. */
void aps_admission_handshake(struct aps_admission *a, const char *ip, uint64_t now);

/* A connection from ip delivered its first message. */
void aps_admission_spoke(struct aps_admission *a, const char *ip, uint64_t now);

/* ip's handshakes in its minute that led to no message (those of the last
 * 250-500 ms are not judged yet); 0 while it is turned away. */
uint32_t aps_admission_unspoken(struct aps_admission *a, const char *ip, uint64_t now);

/* The next address, from slot *i on, with more than the limit of those (*n of
 * them); NULL: no more. The caller turns it away, or forgives it. */
const char *aps_admission_over(struct aps_admission *a, size_t *i, uint32_t *n, uint64_t now);

/* ip is let in again, and its count starts again (its workers are joined). */
void aps_admission_forgive(struct aps_admission *a, const char *ip, uint64_t now);

/* Whether the bridge should look at ip's connections now (at most every 250 ms
 * an address: a flood's handshakes must not each cost a scan of them all). */
bool aps_admission_check_due(struct aps_admission *a, const char *ip, uint64_t now);

/* Whether ip is turned away now (nothing counted). */
bool aps_admission_away(struct aps_admission *a, const char *ip, uint64_t now);

/* Turns ip away from now on (its count starts again); returns for how many ms. */
uint64_t aps_admission_turn_away(struct aps_admission *a, const char *ip, uint64_t now);

/* Whether a handshake from ip may go on now (a refusal is counted). */
bool aps_admission_allows(struct aps_admission *a, const char *ip, uint64_t now);

#endif
