/*
 * Part of the socket bridge: the ZAP handler (ZeroMQ's authentication
 * protocol, RFC 27) that refuses addresses outside allow_from, counts every
 * handshake for its address, turns away
 * those whose handshakes lead to no message (admission.h) and, with CURVE, lets in only workers
 * whose public key is on the allowlist. It lives in the bridge's ZeroMQ context and on its loop.
 */
#ifndef APS_SERVER_ZBRIDGE_ZAP_H
#define APS_SERVER_ZBRIDGE_ZAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <uv.h>

struct aps_zap;
struct aps_zbridge;

/*
 * Binds inproc://zeromq.zap.01 in zctx and answers every handshake: 400 for an
 * address outside allow_from (netlist.h; "" lets any in) or one admission turns
 * away; with curve, 200 for a key among the n Z85
 * public keys of allow and 400 for any other; else 200. Each handshake counts
 * for its address, which is judged first (admission.h). bridge must outlive z. Returns 0,
 * APS_EINVAL (a key is not Z85) or APS_ECONN. The networks of allow_from are
 * the bridge's (parsed once, when it is made).
 */
int aps_zap_start(struct aps_zap **out, void *zctx, uv_loop_t *loop, struct aps_zbridge *bridge,
                  bool curve, const char *const *allow, size_t n);

/* Closes the socket (before the context terminates); frees z once its handle closed. */
void aps_zap_stop(struct aps_zap *z);

/* Whether connections may be judged by what they have not said (admission,
 * and conns.h's 32 KiB before a first message): no message waits unread on
 * the bridge's ROUTER, or messages have waited for a second. */
bool aps_zap_may_judge(struct aps_zbridge *b, uint64_t now);

/* Turns away the addresses past max_silent_closes (admission.h): at each tick
 * (an address is also judged at each of its handshakes). */
void aps_zap_judge_all(struct aps_zap *z, uint64_t now);

/* CURVE handshakes accepted and refused for their key so far, and handshakes
 * refused because their address is outside allow_from. */
void aps_zap_counts(const struct aps_zap *z, uint64_t *accepted, uint64_t *refused,
                    uint64_t *not_allowed);

#endif
