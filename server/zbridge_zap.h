/*
 * Part of the socket bridge: the ZAP handler (ZeroMQ's authentication
 * protocol, RFC 27) that lets in only workers whose CURVE public key is on
 * the allowlist. It lives in the bridge's ZeroMQ context and on its loop.
 */
#ifndef APS_SERVER_ZBRIDGE_ZAP_H
#define APS_SERVER_ZBRIDGE_ZAP_H

#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct aps_zap;

/*
 * Binds inproc://zeromq.zap.01 in zctx and answers every CURVE handshake:
 * 200 for a key among the n Z85 public keys of allow, 400 for any other.
 * Returns 0, APS_EINVAL (a key is not Z85) or APS_ECONN.
 */
int aps_zap_start(struct aps_zap **out, void *zctx, uv_loop_t *loop, const char *const *allow,
                  size_t n);

/* Closes the socket (before the context terminates); frees z once its handle closed. */
void aps_zap_stop(struct aps_zap *z);

/* Handshakes accepted and refused so far. */
void aps_zap_counts(const struct aps_zap *z, uint64_t *accepted, uint64_t *refused);

#endif
