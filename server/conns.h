/*
 * The daemon's connections, as ZeroMQ's socket monitor reports them. The
 * network's room: it knows descriptors and routing ids, no jobs.
 *
 * Each accepted descriptor gets
 *  - an id that tells it from a later connection on the same number: the
 *    kernel reuses numbers at once, and the monitor's events arrive on another
 *    socket than the messages, so a late "closed" must not end a new
 *    connection's session. The id is (accepts on that number) << 32 | fd + 1;
 *  - a duplicate descriptor of apsd's own, so that apsd can shut the
 *    connection down and look at it (has the peer hung up?) without racing
 *    ZeroMQ, which closes and reuses its own number whenever it likes;
 *  - a deadline to be admitted by (join_timeout_ms; the protocol admits a
 *    connection whose session joined a job), after which it is dropped.
 * At most max connections are open: one more is shut down at once.
 *
 * When ZeroMQ reports a close, the cause is told apart: the peer hung up,
 * apsd dropped it, or ZeroMQ closed it itself (a frame over
 * max_message_bytes, bytes that are not ZMTP, a failed handshake).
 *
 * It also finds connections ZeroMQ will never close. libzmq 4.3 leaves an
 * engine whose input had stopped (its pipe full, or taken over) waiting
 * forever once its peer hangs up, with its descriptor and buffers
 * (docs/RELIABILITY.md); such a connection is stuck when its peer has been
 * gone, or apsd has dropped it, for APS_CONNS_STUCK_MS without a close, or
 * when bytes have waited unread in its socket for that long while it
 * delivered nothing (apsd reads every connection it is given: ZeroMQ has
 * stopped reading this one). Only closing the socket frees it (zbridge.c).
 */
#ifndef APS_SERVER_CONNS_H
#define APS_SERVER_CONNS_H

#include "server/addrs.h"
#include "server/peer.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_CONNS_STUCK_MS 3000
/* Bytes a TCP connection may read before it delivers its first message. The
 * ZMTP greeting, a handshake and a HELLO take about 1 KiB, and a client sends
 * nothing more before its WELCOME. Past it the connection is dropped: a
 * handshake that large (libzmq keeps every property of a READY or INITIATE for
 * the connection's life, at about 40 times its bytes: 4 MB of 3-byte
 * properties held 160 MB), a connection libzmq parked (its routing id in use:
 * it never delivers what it read), or a client that sent before its WELCOME. */
#define APS_CONNS_UNHEARD_MAX (32 * 1024)
/* What libzmq keeps of a parked connection besides its messages (measured: ~11 KiB). */
#define APS_CONNS_PARKED_BYTES (16 * 1024)

enum aps_conn_cause {
	APS_CONN_PEER,    /* the peer hung up (or its host reset the connection) */
	APS_CONN_DROPPED, /* apsd shut it down (limit, deadline, or asked to) */
	APS_CONN_ZMTP,    /* ZeroMQ closed it after its handshake: an oversized frame or not ZMTP */
	APS_CONN_HANDSHAKE, /* ZeroMQ closed it in its handshake (CURVE refused, not ZMTP) */
};

struct aps_conn {
	uint64_t id; /* 0: the slot is free */
	int dup;     /* apsd's duplicate of ZeroMQ's descriptor, -1 when dup failed */
	uint32_t accepts;
	uint64_t accepted_ms;
	uint64_t deadline_ms; /* dropped when not admitted by then; 0: admitted, or no deadline */
	bool admitted;        /* a session joined a job on it */
	struct aps_addrs_entry *from; /* its address in the table (a TCP peer's); NULL: none */
	bool unheard;          /* dropped: read past APS_CONNS_UNHEARD_MAX before a message */
	uint64_t dropped_ms;   /* when apsd shut it down; 0: it did not */
	uint64_t gone_ms;      /* when its peer was first seen gone; 0: not yet */
	uint64_t msgs;         /* messages it delivered */
	uint64_t tick_msgs;    /* msgs at the last tick */
	uint64_t read_mark;    /* bytes ZeroMQ had read of it at the last tick it delivered */
	uint64_t backlog_ms;   /* since when bytes wait unread in its socket while it delivers
	                          nothing (ZeroMQ stopped reading it); 0: none */
	uint64_t backlog_msgs; /* msgs when that began */
	/* Its socket as last looked at (conns.c look): once per loop turn at most, and
	 * FIONREAD only when bytes came since or some waited unread. */
	uint64_t look_ms;     /* the loop time of the last look; 0: never */
	bool look_tcp;        /* TCP_INFO answered: a TCP connection */
	uint64_t received;    /* TCP_INFO's bytes received */
	int unread;           /* FIONREAD: bytes waiting in the socket */
	struct aps_peer peer; /* its routing id, from its first message */
	char address[48];     /* "ip:port" of the peer, "local" for ipc */
};

struct aps_conns_counters {
	uint64_t accepted;
	uint64_t refused;          /* over max_connections */
	uint64_t refused_address;  /* over max_connections_per_address */
	uint64_t unjoined_dropped; /* not admitted within join_timeout_ms */
	uint64_t zmtp_refused;     /* closed by ZeroMQ after the handshake */
	uint64_t unfinished;       /* dropped: read past max_unfinished_bytes, nothing delivered */
	uint64_t unheard;          /* dropped: read past APS_CONNS_UNHEARD_MAX before a message */
	uint64_t handshakes_failed;
};

struct aps_conns {
	struct aps_conn *slots; /* by ZeroMQ's descriptor */
	size_t cap;
	size_t live, max;
	size_t max_per_address; /* open from one address (addrs.h); 0: no limit */
	struct aps_addrs addrs;
	uint64_t join_timeout_ms;
	/* Bytes a TCP connection may have read and not delivered from one tick to the
	 * next (a message is whole or nothing: libzmq keeps every frame of an unfinished
	 * one, with no bound); past it, it is dropped. 0: no bound. */
	uint64_t max_unfinished_bytes;
	uint64_t ticks;   /* aps_conns_tick calls */
	uint64_t *closed; /* ids closed and not yet reported */
	size_t n_closed, cap_closed;
	uint64_t handshake_failures;     /* failed handshakes not yet matched to a close */
	uint64_t handshakes, delivering; /* since the last reset: handshakes that succeeded,
	                                    connections whose first message came */
	uint64_t silent_read;            /* since the last reset: bytes ZeroMQ read of connections
	                                    that closed without a message */
	char unheard_address[48];        /* of the last connection dropped unheard */
	struct aps_conns_counters cnt;
};

/* An empty table for at most max connections. */
void aps_conns_init(struct aps_conns *t, size_t max, uint64_t join_timeout_ms);

/* The monitor's "accepted fd". Returns 0, or APS_EBUSY when it is one over
 * max, APS_ERANGE one over max_per_address from its address (127.0.0.1, ::1
 * and ipc excepted, where a host's own workers connect): it is shut down at
 * once; or APS_ENOMEM. */
int aps_conns_accepted(struct aps_conns *t, int fd, uint64_t now);

/* The "ip:port" of the connection last accepted on descriptor fd, "" if none. */
const char *aps_conns_address(const struct aps_conns *t, int fd);

/* The monitor's "handshake failed" and "succeeded" (they name no descriptor). */
void aps_conns_handshake_failed(struct aps_conns *t);
void aps_conns_handshake_succeeded(struct aps_conns *t);

/*
 * Connections libzmq parked since the last reset, at least: handshakes that
 * succeeded for connections that never delivered a message and are closed.
 * libzmq parks a connection whose routing id is in use and never reads it;
 * it keeps its pipe (about 15 KiB, and what it held) until the socket closes.
 */
size_t aps_conns_parked(const struct aps_conns *t);

/*
 * What parked connections may hold, at most: APS_CONNS_PARKED_BYTES each, and
 * every byte ZeroMQ read of a connection that closed without a message (a
 * parked pipe keeps the messages it took; TCP says how much was read, ipc
 * does not: 1 MiB is counted for each). 0 when none is parked.
 */
uint64_t aps_conns_parked_bytes(const struct aps_conns *t);

/* The monitor's "closed fd": the id goes to the closed list. Returns its cause
 * (and the connection's address, valid until the next call), or -1 when fd was
 * not a connection. */
int aps_conns_closed(struct aps_conns *t, int fd, const char **address);

/* Whether a connection from ip (as in "ip:port") is open and joined a job. */
bool aps_conns_joined_from(struct aps_conns *t, const char *ip);

/* The id of the connection now on fd (0 when none). */
uint64_t aps_conns_id(const struct aps_conns *t, int fd);

/* The connection, or NULL when it has closed. */
struct aps_conn *aps_conns_find(struct aps_conns *t, uint64_t id);

/* Open connections from ip accepted since since_ms that have delivered nothing
 * yet (at most most). */
uint32_t aps_conns_quiet_from(const struct aps_conns *t, const char *ip, uint32_t most,
                              uint64_t since_ms);

enum aps_conns_delivery {
	APS_CONNS_LATER,   /* a message after the connection's first */
	APS_CONNS_FIRST,   /* its first: it spoke */
	APS_CONNS_UNHEARD, /* one after the connection read over APS_CONNS_UNHEARD_MAX
	                      before its first: it is dropped, the message goes unread */
};

/* A message arrived on connection id from peer, at now. */
enum aps_conns_delivery aps_conns_delivered(struct aps_conns *t, uint64_t id,
                                            const struct aps_peer *peer, uint64_t now);

/* Admitted (a session joined on it): no deadline; or not any more (from now). */
void aps_conns_admit(struct aps_conns *t, uint64_t id, bool admitted, uint64_t now);

/* Shuts connection id down. Returns 0, or APS_EINVAL when it has closed. */
int aps_conns_drop(struct aps_conns *t, uint64_t id, uint64_t now);

/* Shuts down every connection whose messages came from peer; how many. */
size_t aps_conns_drop_peer(struct aps_conns *t, const struct aps_peer *peer, uint64_t now);

/* Drops connections past their deadline; returns how many are stuck. */
size_t aps_conns_tick(struct aps_conns *t, uint64_t now);

/* Drops the TCP connections that read over APS_CONNS_UNHEARD_MAX and delivered
 * nothing. The caller asks once every message that waited was read (a HELLO
 * that waits unread is not silence), or messages have waited for a second. */
void aps_conns_drop_unheard(struct aps_conns *t, uint64_t now);

/* The listener was terminated and every connection with it: all are closed. */
void aps_conns_forget_all(struct aps_conns *t);

/* Moves the closed ids out (*n of them; the caller frees the array). */
uint64_t *aps_conns_take_closed(struct aps_conns *t, size_t *n);

void aps_conns_free(struct aps_conns *t);

#endif
