/*
 * Private to proto/: the field-by-field mapping between struct aps_msg and the
 * protobuf-c generated Aps__Envelope. Nothing outside proto/ includes this.
 */
#ifndef APS_PROTO_ENVELOPE_H
#define APS_PROTO_ENVELOPE_H

#include "proto/aps.pb-c.h"
#include "proto/frame.h"

/*
 * Fills env from m. env borrows m's strings and lists: it is valid while m
 * is and is never freed. payload_crc is written as Envelope.payload_crc32c.
 */
void aps_envelope_from_msg(const struct aps_msg *m, uint32_t payload_crc, Aps__Envelope *env);

/*
 * Copies env into m (zeroed first). The caller has checked that env's
 * strings fit m's arrays, its lists hold at most APS_MSG_LIST_MAX entries and
 * its scaling mode is known; anything longer is cut. m->payload is left NULL.
 */
void aps_envelope_to_msg(const Aps__Envelope *env, struct aps_msg *m);

#endif
