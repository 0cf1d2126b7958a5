/*
 * Shared, reference-counted byte buffers: one RESULT payload sent to every
 * rank without a copy per rank. The count is atomic because the last
 * reference is often dropped on a ZeroMQ I/O thread.
 */
#ifndef APS_COMMON_SBUF_H
#define APS_COMMON_SBUF_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

struct aps_sbuf {
	atomic_uint refs;
	size_t len;
	uint8_t data[];
};

/* A buffer of len bytes with one reference, or NULL when out of memory. */
struct aps_sbuf *aps_sbuf_new(size_t len);
struct aps_sbuf *aps_sbuf_ref(struct aps_sbuf *b);
/* Drops a reference; frees the buffer with the last one. NULL is a no-op. */
void aps_sbuf_unref(struct aps_sbuf *b);

#endif
