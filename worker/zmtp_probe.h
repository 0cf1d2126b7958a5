/*
 * Which security mechanism a ZeroMQ endpoint speaks ("NULL", "CURVE"), read
 * from its ZMTP 3 greeting on a plain socket: how the client tells "the daemon
 * uses CURVE and this client does not" from a daemon that only closed.
 */
#ifndef APS_WORKER_ZMTP_PROBE_H
#define APS_WORKER_ZMTP_PROBE_H

#define APS_ZMTP_MECHANISM_LEN 21 /* 20 bytes on the wire and a NUL */

/* Connects to endpoint (tcp:// or ipc://), says the start of a ZMTP 3 greeting,
 * reads the peer's mechanism into mechanism and closes, all within timeout_ms.
 * 0, APS_EINVAL for another transport, APS_ECONN when no connection could be
 * made, APS_EPROTO when the peer did not answer with a ZMTP 3 greeting. */
int aps_zmtp_probe_mechanism(const char *endpoint, int timeout_ms,
                             char mechanism[APS_ZMTP_MECHANISM_LEN]);

#endif
