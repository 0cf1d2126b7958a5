/*
 * Connection ids. ZeroMQ tells the daemon which file descriptor a message came
 * on (ZMQ_SRCFD) and, through a socket monitor, when a descriptor was accepted
 * or closed. The kernel reuses descriptor numbers at once, and the monitor's
 * events arrive on another socket than the messages, so a descriptor alone
 * cannot tell an old connection from a new one: a late "closed" could end the
 * session of a new connection that got the same number. Counting each
 * number's accepts, in the monitor's order, can: an id is (accepts, fd), and
 * a "closed" names the id that was current when it happened.
 */
#ifndef APS_SERVER_CONNS_H
#define APS_SERVER_CONNS_H

#include <stddef.h>
#include <stdint.h>

struct aps_conns {
	uint32_t *accepts; /* by descriptor: connections accepted on it so far */
	size_t cap;
	uint64_t *closed; /* ids closed and not yet reported */
	size_t n_closed, cap_closed;
};

/* The id of the connection now on fd (0 when fd < 0). */
uint64_t aps_conns_id(const struct aps_conns *t, int fd);

/* The monitor's "accepted fd": later messages on fd belong to a new connection. */
int aps_conns_accepted(struct aps_conns *t, int fd);

/* The monitor's "closed fd": keeps the id of the connection that closed. */
int aps_conns_closed(struct aps_conns *t, int fd);

/* Moves the closed ids out (*n of them; the caller frees the array). */
uint64_t *aps_conns_take_closed(struct aps_conns *t, size_t *n);

void aps_conns_free(struct aps_conns *t);

#endif
