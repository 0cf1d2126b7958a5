/*
 * The client's connection to apsd: one ZeroMQ DEALER socket in a context of
 * its own, created in the process that uses it (so a client survives fork()
 * as long as it is created after). The only file of worker/ with zmq.h.
 */
#ifndef APS_WORKER_TRANSPORT_H
#define APS_WORKER_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/sbuf.h"

struct aps_transport;

/* One received message; valid until the next aps_transport_recv or close. */
struct aps_rxmsg {
	size_t nframes;
	const uint8_t *hdr;
	size_t hdr_len;
	const uint8_t *payload; /* NULL without a payload frame */
	size_t payload_len;
};

/* CURVE keys of a connection (Z85); server_key NULL: in clear. */
struct aps_transport_curve {
	const char *server_key, *public_key, *secret_key;
};

/*
 * Connects (asynchronously: nothing waits here). Returns 0, APS_EINVAL (a
 * CURVE key is not Z85), APS_ECONN or APS_ENOMEM.
 */
int aps_transport_open(struct aps_transport **out, const char *endpoint, int heartbeat_ms,
                       const struct aps_transport_curve *curve);

/* Closes; queued messages get up to linger_ms to leave. NULL is a no-op. */
void aps_transport_close(struct aps_transport *t, int linger_ms);

/* Sends a header and an optional payload (both copied). Returns 0 or APS_ECONN. */
int aps_transport_send(struct aps_transport *t, const uint8_t *hdr, size_t hdr_len,
                       const void *payload, size_t payload_len, bool has_payload);

/*
 * Sends a header (copied) and len bytes at data of a shared buffer, without a
 * copy: the message holds a reference to buf until ZeroMQ has sent it.
 */
int aps_transport_send_shared(struct aps_transport *t, const uint8_t *hdr, size_t hdr_len,
                              struct aps_sbuf *buf, const uint8_t *data, size_t len);

/*
 * Waits up to timeout_ms for one message: 1 received, 0 timed out,
 * APS_TRANSPORT_RECV_RECONNECTED (nothing received: the connection had
 * closed and is back, so what was sent may be lost), or APS_ECONN.
 */
#define APS_TRANSPORT_RECV_RECONNECTED 2
int aps_transport_recv(struct aps_transport *t, int timeout_ms, struct aps_rxmsg *out);

/*
 * Waits up to timeout_ms until a message can be read or wake_fd is readable.
 * Returns a mask of APS_TRANSPORT_READABLE, APS_TRANSPORT_WOKEN and
 * APS_TRANSPORT_RECONNECTED (the connection had closed and is back: apsd
 * may have lost messages either way), or APS_ECONN.
 */
#define APS_TRANSPORT_READABLE    1
#define APS_TRANSPORT_WOKEN       2
#define APS_TRANSPORT_RECONNECTED 4
int aps_transport_poll(struct aps_transport *t, int wake_fd, int timeout_ms);

/* zmq_strerror of the last failure of this thread. */
const char *aps_transport_strerror(void);

#endif
