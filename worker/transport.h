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

struct aps_transport;

/* One received message; valid until the next aps_transport_recv or close. */
struct aps_rxmsg {
	size_t nframes;
	const uint8_t *hdr;
	size_t hdr_len;
	const uint8_t *payload; /* NULL without a payload frame */
	size_t payload_len;
};

/* Connects (asynchronously: nothing waits here). Returns 0, APS_ECONN or APS_ENOMEM. */
int aps_transport_open(struct aps_transport **out, const char *endpoint, int heartbeat_ms);

/* Closes; queued messages get up to linger_ms to leave. NULL is a no-op. */
void aps_transport_close(struct aps_transport *t, int linger_ms);

/* Sends a header and an optional payload (both copied). Returns 0 or APS_ECONN. */
int aps_transport_send(struct aps_transport *t, const uint8_t *hdr, size_t hdr_len,
                       const void *payload, size_t payload_len, bool has_payload);

/* Waits up to timeout_ms for one message: 1 received, 0 timed out, APS_ECONN. */
int aps_transport_recv(struct aps_transport *t, int timeout_ms, struct aps_rxmsg *out);

/* zmq_strerror of the last failure of this thread. */
const char *aps_transport_strerror(void);

#endif
