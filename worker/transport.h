/*
 * The client's connection to apsd: one ZeroMQ DEALER socket in a context of
 * its own, created in the process that uses it (so a client survives fork()
 * as long as it is created after). The only file of worker/ with zmq.h.
 *
 * One socket is one connection: ZeroMQ never connects it again by itself.
 * When its connection closes (APS_TRANSPORT_LOST) or its connect fails
 * (APS_TRANSPORT_NOCONN: nothing listens yet), the client renews the
 * transport, a new socket with a new routing id, and takes its session back
 * by its token (resume.c). A connect that cannot start (an address that does
 * not resolve) is APS_TRANSPORT_NOCONN too. A handshake apsd refused (CURVE) is reported at
 * once (APS_TRANSPORT_REFUSED), with why.
 */
#ifndef APS_WORKER_TRANSPORT_H
#define APS_WORKER_TRANSPORT_H

#include <poll.h>
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
int aps_transport_open(struct aps_transport **out, const char *endpoint,
                       const struct aps_transport_curve *curve);

/*
 * Replaces the socket by a new one (a new routing id) to the same endpoint:
 * what waited on the old one is dropped. Returns 0, or APS_ECONN (the
 * transport is then unusable).
 */
int aps_transport_renew(struct aps_transport *t);

/* Closes the socket at once (a new one comes with aps_transport_renew); until then
 * sends fail with APS_ECONN and nothing is received. */
void aps_transport_drop(struct aps_transport *t);

/* False between aps_transport_drop and aps_transport_renew. */
bool aps_transport_connected(const struct aps_transport *t);

/* Whether the socket now in use has its connection: made (TCP or IPC, before
 * any handshake) and not lost since. */
bool aps_transport_link_up(const struct aps_transport *t);

/* How the connects of a transport went, over every socket it had. */
struct aps_transport_tally {
	unsigned made;       /* connections made */
	unsigned failed;     /* connects that failed: refused (nothing listens), or the host
	                        unreachable */
	unsigned unresolved; /* connects that could not start: the address does not resolve */
};

void aps_transport_tally(const struct aps_transport *t, struct aps_transport_tally *out);

/* Why the last handshake failed ("" when none did). */
const char *aps_transport_refusal(const struct aps_transport *t);

/* Whether the daemon speaks another security mechanism than this client (CURVE
 * against none, or one apsd never speaks), asked on a connection of its own within
 * timeout_ms (1 s at most; zmtp_probe.c): libzmq does not always say so when the
 * daemon closes at once. If so, the refusal says which. */
bool aps_transport_mechanism_differs(struct aps_transport *t, int timeout_ms);

/* Whether any handshake with apsd succeeded, on any socket of this transport. */
bool aps_transport_ever_handshook(const struct aps_transport *t);

/* Whether the handshake of the socket now (or last) in use succeeded. */
bool aps_transport_handshook(const struct aps_transport *t);

/* Whether the connection uses CURVE. */
bool aps_transport_curve(const struct aps_transport *t);

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
 * APS_TRANSPORT_RECV_LOST (nothing received: the connection closed, and what
 * was sent may be lost: renew), APS_TRANSPORT_RECV_NOCONN (the connect
 * failed or could not start: renew, a little later), APS_TRANSPORT_RECV_REFUSED (a handshake
 * failed), or APS_ECONN.
 */
#define APS_TRANSPORT_RECV_LOST    2
#define APS_TRANSPORT_RECV_REFUSED 3
#define APS_TRANSPORT_RECV_NOCONN  4
int aps_transport_recv(struct aps_transport *t, int timeout_ms, struct aps_rxmsg *out);

/*
 * Waits up to timeout_ms until a message can be read or wake_fd is readable.
 * Returns a mask of APS_TRANSPORT_READABLE, APS_TRANSPORT_WOKEN,
 * APS_TRANSPORT_LOST (the connection closed: renew), APS_TRANSPORT_NOCONN (the
 * connect failed: renew) and APS_TRANSPORT_REFUSED (a handshake failed), or
 * APS_ECONN.
 */
#define APS_TRANSPORT_READABLE 1
#define APS_TRANSPORT_WOKEN    2
#define APS_TRANSPORT_LOST     4
#define APS_TRANSPORT_REFUSED  8
#define APS_TRANSPORT_NOCONN   16
int aps_transport_poll(struct aps_transport *t, int wake_fd, int timeout_ms);
/*
 * What aps_transport_poll waits on, as plain descriptors (fds[3]; returns how
 * many): wake_fd, then the monitor's ZMQ_FD and, with messages true, the
 * socket's. Those two only say that the socket may have changed:
 * aps_transport_poll with no wait tells. For waiting while another thread may
 * use the socket.
 */
int aps_transport_pollfds(struct aps_transport *t, int wake_fd, bool messages, struct pollfd *fds);

/* zmq_strerror of the last failure of this thread. */
const char *aps_transport_strerror(void);

#endif
