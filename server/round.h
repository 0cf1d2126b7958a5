/*
 * One tensor's rounds: collecting every rank's contribution for a step,
 * chunk by chunk, summing each chunk in rank order (so that the result never
 * depends on arrival order), and encoding each chunk's result once for the
 * downlink as soon as that chunk is complete, while later chunks still arrive.
 *
 * No sockets here: contributions arrive as payloads with a release callback,
 * and each result is a shared buffer the caller sends to every rank.
 */
#ifndef APS_SERVER_ROUND_H
#define APS_SERVER_ROUND_H

#include "server/engine.h"

#include "common/codec.h"
#include "common/format.h"
#include "common/sbuf.h"
#include "common/scale.h"
#include "common/trace.h"

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
	bool askable;               /* its rank's client can be asked for it again (AGAIN) */
	uint32_t block;             /* block-scaled payload (codec.h): elements per block, else 0 */
	uint64_t flushed;           /* the rank's own count, for the precision policy */
	struct aps_payload payload; /* data == NULL: no data (a broadcast's non-root) */
};

enum aps_round_kind {
	APS_ROUND_IDLE = 0, /* no contribution yet for this step */
	APS_ROUND_ALLREDUCE,
	APS_ROUND_BROADCAST,
};

/* How one chunk of the step is doing. */
struct aps_round_chunk {
	uint32_t arrived;        /* ranks that sent this chunk */
	uint32_t next_rank;      /* ranks [0, next_rank) are summed into acc or absent */
	uint32_t summed;         /* contributions in acc: the mean divides by this */
	bool root_seen;          /* broadcast: the root's data is in acc */
	bool finished;           /* its result was produced, or is being (engine threads) */
	double err_num, err_den; /* its result's share of the step's error, once closed */
};

/*
 * What contributions that came early (held until the lower ranks' come) may
 * take together, over every job; the loop thread's. limit 0: no bound.
 *
 * Each job holds its early contributions in a share (aps_round_share). One that
 * would pass limit is declined (not kept: its rank is asked for it again when
 * its turn comes, aps_round_wanted), unless its job holds less than a fair part
 * of limit (limit over the jobs that hold, counting its own) and another job
 * holds more: then that job gives up contributions it holds, the highest ranks
 * first, those whose clients can be asked again (askable), as many as the
 * newcomer needs but never below its own fair part, and they are asked for
 * again in their turn. Where that is not room enough, the rounds of such a job
 * that hold a contribution its client cannot be asked for again (older than
 * AGAIN) lose their step (drop_step): every rank makes it again. So a job that
 * holds pushes it never completes (its rank 0 never pushes) keeps no more than
 * its part once others need theirs.
 */
struct aps_round_share;
struct aps_round;
struct aps_round_held {
	uint64_t bytes, limit;
	struct aps_round_share *holders; /* the shares that hold something */
	uint32_t n_holders;
	uint64_t given_up; /* contributions given up for another job's (asked again) */
	/* Drops r's step to free what it holds for another job's: the callee aborts
	 * r (aps_round_abort) and tells its ranks. NULL: what cannot be asked for
	 * again stays held until its turn. */
	void (*drop_step)(void *ctx, struct aps_round *r);
	void *ctx;
	uint64_t steps_dropped; /* by drop_step */
};

/* One job's part of aps_round_held. */
struct aps_round_share {
	struct aps_round_held *pool; /* NULL: early contributions are all kept */
	uint64_t bytes;
	struct aps_round_share *prev, *next; /* in pool->holders while bytes > 0 */
	struct aps_round *rounds;            /* its rounds that hold something */
};

/* Declined contributions, per chunk and rank (aps_round.declined). */
enum aps_round_decline {
	APS_ROUND_KEPT = 0,
	APS_ROUND_DECLINED, /* not kept: its rank is asked for it when its turn comes */
	APS_ROUND_ASKED,    /* its rank was asked for it */
};

struct aps_round {
	uint32_t world_size;
	const bool *absent; /* world_size, borrowed: ranks not expected (NULL: none) */
	size_t count;       /* elements of the tensor */
	size_t chunk_elems; /* elements per chunk, a multiple of 8; the last may be shorter */
	uint32_t n_chunks;
	bool lowp;      /* sum rounded to the format after every addition */
	bool no_crc;    /* results travel without CRC32C (the job's choice) */
	uint32_t block; /* scaling block: elements per block of every payload but fp32 */
	uint64_t step;  /* the step being collected */
	enum aps_round_kind kind;
	uint32_t chunks_sealed;   /* chunks marked finished: no contribution comes any more */
	uint32_t chunks_finished; /* chunks whose result is out (closed) */
	struct aps_round_chunk *chunks;
	bool *has;                     /* n_chunks * world_size: rank sent chunk */
	struct aps_contribution *held; /* n_chunks * world_size: waiting for lower ranks */
	uint8_t *declined;             /* n_chunks * world_size: enum aps_round_decline */
	struct aps_round_share *share; /* its job's (borrowed); NULL: early ones are all kept */
	uint64_t held_bytes;           /* of held, this round's part of share->bytes */
	struct aps_round *share_prev, *share_next; /* in share->rounds while held_bytes > 0 */
	uint32_t held_unaskable;                   /* of held, contributions not askable */
	void *owner;                /* its tensor, for share->pool->drop_step (borrowed) */
	float *acc;                 /* count floats, the rank-ordered sum */
	uint8_t *scratch;           /* lowp: one chunk's codes */
	bool step_fmt_set;          /* the first contribution of the step fixed these: */
	struct aps_format step_fmt; /* uplink format, the "auto" downlink */
	int step_scale;             /* lowp: every rank's k */
	uint64_t flushed;           /* sum of the ranks' flushed counts this step */
	struct aps_trace *trace;    /* borrowed; NULL: no timeline */
	bool measure_error;         /* the policy wants the result's relative error */
	float *err_scratch;         /* one chunk of decoded result */
	const char *label;          /* the tensor's name, for the timeline */
	const char *job_label;      /* its job's name, for the timeline */
	/* Optimize mode: turns a finished chunk (the mean, or the broadcast values) in
	 * place into what is encoded for the downlink; NULL: sent as it is. */
	void (*transform)(void *ctx, enum aps_round_kind kind, size_t offset, float *acc, size_t n);
	void *transform_ctx;
	/* Engine threads (borrowed; NULL: every sum and encoding on the caller's thread).
	 * An all-reduce of chunks of APS_ROUND_ENGINE_MIN_ELEMS or more, without lowp,
	 * transform or timeline, runs there: chunk c on lane + c. */
	struct aps_engine *engine;
	uint32_t lane;
	uint32_t in_flight; /* its tasks submitted whose done() has not come yet */
};

/* Chunks smaller than this are summed on the caller's thread: a hand-off costs more. */
#define APS_ROUND_ENGINE_MIN_ELEMS 16384

struct aps_round_result {
	enum aps_round_kind kind; /* of the round it came from */
	struct aps_format fmt;    /* downlink format */
	int scale_exp;
	uint32_t block;           /* block-scaled payload: elements per block, else 0 */
	bool lowp_sum;            /* codes hold the sum (times 2^k), not the mean */
	size_t offset, count;     /* the chunk, in elements */
	struct aps_sbuf *payload; /* one reference for the caller */
	uint32_t crc;             /* CRC32C of the payload (where it was encoded) */
	float maxabs;             /* of the chunk's result */
	struct aps_codec_stats stats;
	uint64_t step;           /* the step it finished */
	uint64_t flushed;        /* the ranks' flushed counts of that step so far */
	bool step_done;          /* this was the step's last chunk; the round moved on */
	double rel_error;        /* step_done with measure_error: ||result - mean|| / ||mean|| */
	double err_num, err_den; /* this chunk's share of rel_error */
};

/*
 * When a chunk finished on an engine thread: on the loop thread, with ret 0 and
 * res (one payload reference for the callee) or APS_ENOMEM; cancelled: the
 * round was reset or freed meanwhile, res holds nothing.
 */
typedef void (*aps_round_done_cb)(void *ctx, int ret, struct aps_round_result *res, bool cancelled);

/* Bytes a round of count elements keeps besides its accumulator: per chunk, and
 * per chunk and rank (what has arrived, what waits): what max_job_bytes counts. */
uint64_t aps_round_overhead(uint32_t world_size, size_t count, size_t chunk_elems);

/* chunk_elems 0 means one chunk for the whole tensor. Returns 0 or APS_ENOMEM. */
int aps_round_init(struct aps_round *r, uint32_t world_size, size_t count, size_t chunk_elems,
                   bool lowp);
void aps_round_fini(struct aps_round *r);

/* Elements of chunk (the last may be shorter). */
size_t aps_round_chunk_len(const struct aps_round *r, uint32_t chunk);

/* The chunk index of [offset, offset + count), or -1 when it is not one chunk. */
int64_t aps_round_chunk_of(const struct aps_round *r, uint64_t offset, uint64_t count);

/*
 * Adds rank's contribution to chunk of the round of step. Takes ownership of
 * c->payload on success only. Returns 0, APS_ROUND_ADD_DECLINED (it came before
 * a lower rank's and r->share's pool is spent: not kept, see aps_round_held), or
 * APS_EPROTO with a reason in why: another step, a second contribution of the
 * rank, a broadcast mixed with a push, a lowp push in another format or with
 * another exponent, a payload scaled by other blocks than the round's.
 */
#define APS_ROUND_ADD_DECLINED 1
int aps_round_add(struct aps_round *r, uint32_t rank, uint64_t step, uint32_t chunk,
                  enum aps_round_kind kind, struct aps_contribution *c, char *why, size_t why_len);

bool aps_round_chunk_complete(const struct aps_round *r, uint32_t chunk);

/* True, with its rank, when the contribution the chunk waits for now was declined
 * and its rank not asked yet; it counts as asked from here. */
bool aps_round_wanted(struct aps_round *r, uint32_t chunk, uint32_t *rank);

/* True when rank's chunk of step is in the round already (it was sent again). */
bool aps_round_has(const struct aps_round *r, uint32_t rank, uint64_t step, uint32_t chunk);

/* True when rank sent its chunk of step: kept, or declined (its call waits for an
 * AGAIN). */
bool aps_round_sent(const struct aps_round *r, uint32_t rank, uint64_t step, uint32_t chunk);

/*
 * Finishes a complete chunk: the mean (all-reduce; the sum for lowp) or the
 * root's values (broadcast), encoded in down (NULL: the step's uplink format)
 * with the local APS exponent of the chunk's result, k = 0 when scaling is
 * APS_SCALING_NONE, or an exponent per block of r->block when it is
 * APS_SCALING_BLOCK. After the last chunk the round moves to the next step.
 * Returns 0 or APS_ENOMEM.
 */
int aps_round_finish_chunk(struct aps_round *r, uint32_t chunk, const struct aps_format *down,
                           enum aps_scaling scaling, struct aps_round_result *res);

/* True when chunks of this step finish on engine threads (aps_round_finish_async). */
bool aps_round_offloaded(const struct aps_round *r);

/*
 * aps_round_finish_chunk on an engine thread, after the chunk's sums; done(ctx, ...)
 * on the loop thread. The chunk counts as finished at once (no second finish).
 * Returns 0 or APS_ENOMEM (nothing submitted).
 */
int aps_round_finish_async(struct aps_round *r, uint32_t chunk, const struct aps_format *down,
                           enum aps_scaling scaling, aps_round_done_cb done, void *ctx);

/*
 * After a rank became absent: sums what no longer waits for it. Returns true
 * when the chunk is now complete (aps_round_finish_chunk is due).
 */
bool aps_round_recheck(struct aps_round *r, uint32_t chunk);

/* Drops what this step collected; the step stays, to be collected again. A step
 * whose every chunk has all its contributions is left to finish (its results are
 * on their way). */
void aps_round_abort(struct aps_round *r);

/* True when some contribution of this step has arrived and some chunk still waits
 * for one: a step whose chunks are all being encoded (engine threads) is no longer
 * busy, as it would not be on the loop: nothing of it waits for a rank. */
bool aps_round_busy(const struct aps_round *r);

/* Writes up to cap expected ranks that have not sent every chunk; returns how many. */
size_t aps_round_missing(const struct aps_round *r, uint32_t *ranks, size_t cap);

#endif
