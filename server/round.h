/*
 * One tensor's rounds: collecting every rank's contribution for a step,
 * summing them in rank order (so that the result never depends on arrival
 * order), and encoding the mean once for the downlink.
 *
 * No sockets here: contributions arrive as payloads with a release callback,
 * and the result is a shared buffer the caller sends to every rank.
 */
#ifndef APS_SERVER_ROUND_H
#define APS_SERVER_ROUND_H

#include "common/codec.h"
#include "common/format.h"
#include "common/scale.h"
#include "server/sbuf.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Bytes a peer sent, owned by whoever holds it until release(ctx) is called. */
struct aps_payload {
	const uint8_t *data;
	size_t len;
	void (*release)(void *ctx);
	void *ctx;
};

struct aps_contribution {
	struct aps_format fmt;
	int scale_exp;
	uint64_t flushed;           /* the rank's own count, for the precision policy */
	struct aps_payload payload; /* data == NULL: no data (a broadcast's non-root) */
};

enum aps_round_kind {
	APS_ROUND_IDLE = 0, /* no contribution yet for this step */
	APS_ROUND_ALLREDUCE,
	APS_ROUND_BROADCAST,
};

struct aps_round {
	uint32_t world_size;
	size_t count;  /* elements of the tensor */
	uint64_t step; /* the step being collected */
	enum aps_round_kind kind;
	uint32_t arrived;              /* ranks that contributed this step */
	uint32_t next_rank;            /* ranks [0, next_rank) are summed into acc */
	bool root_seen;                /* broadcast: the root's data is in acc */
	bool *has;                     /* world_size: contributed this step */
	struct aps_contribution *held; /* world_size: waiting for the lower ranks */
	float *acc;                    /* count floats, the rank-ordered sum */
	struct aps_format first_fmt;   /* rank 0's uplink format: the "auto" downlink */
	uint64_t flushed;              /* sum of the ranks' flushed counts this step */
};

struct aps_round_result {
	struct aps_format fmt; /* downlink format */
	int scale_exp;
	struct aps_sbuf *payload; /* one reference for the caller */
	float maxabs;             /* of the mean */
	struct aps_codec_stats stats;
};

int aps_round_init(struct aps_round *r, uint32_t world_size, size_t count);
void aps_round_fini(struct aps_round *r);

/*
 * Adds rank's contribution to the round of step. Takes ownership of c->payload
 * on success only. Returns 0, or APS_EPROTO with a reason in why: another
 * step, a second contribution of the rank, a broadcast mixed with a push.
 */
int aps_round_add(struct aps_round *r, uint32_t rank, uint64_t step, enum aps_round_kind kind,
                  struct aps_contribution *c, char *why, size_t why_len);

bool aps_round_complete(const struct aps_round *r);

/*
 * Finishes a complete round: the mean (allreduce) or the root's values
 * (broadcast), encoded in down (NULL: rank 0's uplink format) with the local
 * APS exponent of the mean, or k = 0 when scaling is APS_SCALING_NONE. Then
 * the round moves to the next step. Returns 0 or APS_ENOMEM.
 */
int aps_round_finish(struct aps_round *r, const struct aps_format *down, enum aps_scaling scaling,
                     struct aps_round_result *res);

/* Drops what this step collected; the step stays, to be collected again. */
void aps_round_abort(struct aps_round *r);

/* Writes up to cap ranks that have not contributed; returns how many are missing. */
size_t aps_round_missing(const struct aps_round *r, uint32_t *ranks, size_t cap);

#endif
