/*
 * The ZeroMQ ROUTER socket bridged into the libuv loop: the only file of the
 * daemon that includes zmq.h. It receives whole multipart messages and hands
 * them up, sends replies without ever blocking (a queue per peer when the
 * peer's pipe is full, outq.h), reports closed connections, and keeps every
 * peer within its limits (conns.h): max_connections, join_timeout_ms, slow
 * readers, and the connections libzmq itself would never close.
 */
#ifndef APS_SERVER_ZBRIDGE_H
#define APS_SERVER_ZBRIDGE_H

#include "common/sbuf.h"
#include "server/peer.h"
#include "server/round.h"
#include "server/tally.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

/* One received message: identity, header frame, optional payload frame. */
struct aps_inmsg {
	struct aps_peer peer;
	uint64_t conn;  /* the connection it came on (conns.h; 0 if unknown) */
	size_t nframes; /* frames after the identity */
	const uint8_t *hdr;
	size_t hdr_len;
	const uint8_t *payload; /* NULL when there is no payload frame */
	size_t payload_len;
	const char *address; /* the peer's address ("" when unknown) */
	const char *user;    /* CURVE: the Z85 public key it authenticated with; "" */
	void *priv;          /* the bridge's frames */
};

struct aps_zbridge_ops {
	/* A message; valid until the callback returns unless its payload is taken. */
	void (*on_message)(void *ctx, struct aps_inmsg *m);
	/* The connection conn closed (peer exited, crashed, or apsd dropped it). */
	void (*on_disconnect)(void *ctx, uint64_t conn);
};

struct aps_zbridge_opts {
	const char *endpoint;
	int64_t max_message_bytes; /* ZMQ_MAXMSGSIZE: a larger frame closes the connection */
	int drain_batch;           /* messages per loop iteration */
	unsigned io_threads;       /* ZMQ_IO_THREADS; 0: libzmq's default (1) */
	size_t max_connections;    /* open at once; one more is shut at once */
	size_t max_connections_per_address; /* open from one address (conns.h); 0: no limit */
	uint64_t join_timeout_ms;           /* a connection not admitted by then is dropped */
	unsigned max_silent_closes;         /* an address's closes without a message a minute,
	                                       then it is turned away (admission.h); 0: never */
	const char *curve_secret;           /* Z85 secret key of the daemon; NULL: no CURVE */
	const char *const *curve_allow;     /* Z85 public keys of the workers let in */
	size_t n_curve_allow;
	const char *allow_from; /* networks that may connect (netlist.h); NULL, "": any */
};

/* The bridge's counters: X(name, Prometheus name, help). */
#define APS_ZBRIDGE_COUNTER_MAP(X)                                                              \
	X(msgs_in, "messages_in", "ZeroMQ messages received.")                                  \
	X(msgs_out, "messages_out", "ZeroMQ messages sent.")                                    \
	X(bytes_in, "bytes_in", "Bytes received.")                                              \
	X(bytes_out, "bytes_out", "Bytes sent.")                                                \
	X(queued, "sends_queued", "Sends that waited because a peer's pipe was full.")          \
	X(unroutable, "sends_unroutable", "Sends to a peer that had gone.")                     \
	X(dropped, "sends_dropped", "Queued sends discarded: peer dropped, or shutdown.")       \
	X(empty_messages, "empty_messages", "Messages without a header frame.")                 \
	X(connections, "connections", "Connections accepted.")                                  \
	X(refused_connections, "refused_connections",                                           \
	  "Connections shut at once: max_connections were open.")                               \
	X(refused_address_connections, "refused_address_connections",                           \
	  "Connections shut at once: max_connections_per_address were open from their "         \
	  "address.")                                                                           \
	X(unjoined_dropped, "unjoined_dropped",                                                 \
	  "Connections dropped that had not joined within join_timeout_ms.")                    \
	X(unfinished_dropped, "unfinished_dropped",                                             \
	  "Connections dropped that read over twice max_message_bytes of a message never "      \
	  "finished.")                                                                          \
	X(accepts_closed, "accepts_closed",                                                     \
	  "Connections closed at accept: outside allow_from, or the accept failed.")            \
	X(unheard_dropped, "unheard_dropped",                                                   \
	  "Connections dropped that read over 32 KiB before their first message: a large "      \
	  "handshake (libzmq keeps its properties, at 40 times their bytes), or parked.")       \
	X(zmtp_refused, "zmtp_refused",                                                         \
	  "Connections ZeroMQ closed: a frame over max_message_bytes, or not ZMTP.")            \
	X(handshakes_failed, "handshakes_failed", "ZMTP or CURVE handshakes that failed.")      \
	X(slow_readers, "slow_readers", "Peers dropped because their replies piled up unread.") \
	X(listener_resets, "listener_resets",                                                   \
	  "Listener resets that freed connections ZeroMQ never closes.")                        \
	X(auth_accepted, "auth_accepted", "CURVE handshakes accepted.")                         \
	X(auth_refused, "auth_refused", "CURVE handshakes refused.")                            \
	X(addresses_turned_away, "addresses_turned_away",                                       \
	  "Times an address was turned away: max_silent_closes in a minute.")                   \
	X(handshakes_turned_away, "handshakes_turned_away",                                     \
	  "Handshakes refused because their address was turned away.")                          \
	X(handshakes_not_allowed, "handshakes_not_allowed",                                     \
	  "Handshakes refused because their address is outside allow_from.")

struct aps_zbridge_counters {
#define APS_ZBRIDGE_COUNTER_FIELD(name, metric, help) uint64_t name;
	APS_ZBRIDGE_COUNTER_MAP(APS_ZBRIDGE_COUNTER_FIELD)
#undef APS_ZBRIDGE_COUNTER_FIELD
	uint64_t open_connections; /* a gauge: connections open now */
	uint64_t parked_bytes;     /* a gauge: what parked connections may hold until a reset */
};

struct aps_zbridge;

/* Creates the socket and binds it. Returns 0 or APS_ECONN with a log line. */
int aps_zbridge_new(struct aps_zbridge **out, uv_loop_t *loop, const struct aps_zbridge_opts *o,
                    const struct aps_zbridge_ops *ops, void *ctx);

/* Closes the socket (pending sends get up to linger_ms) and frees the bridge. */
void aps_zbridge_free(struct aps_zbridge *b, int linger_ms);

/* Moves the payload frame out of m (no copy); release it with out->release. */
int aps_zbridge_take_payload(struct aps_inmsg *m, struct aps_payload *out);

/*
 * Sends hdr (copied) and, if not NULL, payload (a reference is taken; the
 * bytes are not copied) to peer. Never blocks: a full pipe queues the message.
 * Returns 0, APS_ENOMEM, APS_ECONN when the peer is gone (counted as
 * unroutable), or APS_EBUSY when the peer's queue was full: the peer is a
 * slow reader and its connection is dropped.
 */
int aps_zbridge_send(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                     size_t hdr_len, struct aps_sbuf *payload);

/* aps_zbridge_send, payload counted in tally's slot (tally.h) until libzmq is done
 * with it (or the message never goes). */
int aps_zbridge_send_tallied(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                             size_t hdr_len, struct aps_sbuf *payload, struct aps_tally *tally,
                             uint32_t slot);

/* Messages counted in a tally that wait for peer behind its full pipe. */
size_t aps_zbridge_tallied_waiting(struct aps_zbridge *b, const struct aps_peer *peer);

/* Whether any message waits for peer behind its full pipe. */
bool aps_zbridge_backed_up(struct aps_zbridge *b, const struct aps_peer *peer);

/* A session joined on conn (admitted: no deadline), or left it (the deadline runs again). */
void aps_zbridge_admit(struct aps_zbridge *b, uint64_t conn, bool admitted);

/* Whether connection conn is open (apsd has not read its close). */
bool aps_zbridge_conn_open(struct aps_zbridge *b, uint64_t conn);

/* Shuts connection conn down; on_disconnect follows. Returns 0 or APS_EINVAL (closed). */
int aps_zbridge_drop(struct aps_zbridge *b, uint64_t conn);

const struct aps_zbridge_counters *aps_zbridge_counters(struct aps_zbridge *b);

/* The endpoint the router is bound to, as libzmq says (a port 0 or * made real). */
const char *aps_zbridge_endpoint(const struct aps_zbridge *b);

#endif
