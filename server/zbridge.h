/*
 * The ZeroMQ ROUTER socket bridged into the libuv loop: the only file of the
 * daemon that includes zmq.h. It receives whole multipart messages and hands
 * them up, sends replies without ever blocking or silently dropping (a queue
 * per peer when the peer's pipe is full), and reports disconnected peers.
 */
#ifndef APS_SERVER_ZBRIDGE_H
#define APS_SERVER_ZBRIDGE_H

#include "common/sbuf.h"
#include "server/round.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

#define APS_PEER_ID_MAX 255

/* A peer's ZeroMQ routing id. */
struct aps_peer {
	uint8_t len;
	uint8_t id[APS_PEER_ID_MAX];
};

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
	void *priv;          /* the bridge's frames */
};

struct aps_zbridge_ops {
	/* A message; valid until the callback returns unless its payload is taken. */
	void (*on_message)(void *ctx, struct aps_inmsg *m);
	/* The connection conn closed (peer exited, crashed or timed out). */
	void (*on_disconnect)(void *ctx, uint64_t conn);
};

struct aps_zbridge_opts {
	const char *endpoint;
	int heartbeat_ms;               /* ZMTP heartbeats; 0 = off */
	int heartbeat_timeout_ms;       /* a silent connection is closed after this */
	int64_t max_message_bytes;      /* ZMQ_MAXMSGSIZE */
	int drain_batch;                /* messages per loop iteration */
	const char *curve_secret;       /* Z85 secret key of the daemon; NULL: no CURVE */
	const char *const *curve_allow; /* Z85 public keys of the workers let in */
	size_t n_curve_allow;
};

struct aps_zbridge_counters {
	uint64_t msgs_in, msgs_out, bytes_in, bytes_out;
	uint64_t queued;     /* sends that waited in a peer queue (its pipe was full) */
	uint64_t unroutable; /* sends to a peer that had disconnected */
	uint64_t dropped;    /* queued sends discarded when the socket closed */
	uint64_t bad_frames; /* messages with a wrong number of frames */
	uint64_t auth_accepted, auth_refused; /* CURVE handshakes */
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
 * Returns 0, APS_ENOMEM, or APS_ECONN when the peer is gone (counted as unroutable).
 */
int aps_zbridge_send(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                     size_t hdr_len, struct aps_sbuf *payload);

const struct aps_zbridge_counters *aps_zbridge_counters(struct aps_zbridge *b);

bool aps_peer_equal(const struct aps_peer *a, const struct aps_peer *b);

#endif
