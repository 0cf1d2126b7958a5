/*
 * Rounds: rank-ordered accumulation of each chunk and the downlink encoding
 * of each finished chunk. A contribution whose lower ranks are all summed is
 * decoded straight into the accumulator (the first one writes, the others
 * add) and released at once; one that arrives early is held, without a copy,
 * until its turn. So the sum is the same bits whatever the arrival order.
 * With lowp the running sum is rounded to the format after every addition
 * (the paper's algorithm, all ranks on one exponent) and sent as codes. A
 * finished chunk's result is encoded in round_finish.c.
 */
#include "server/round.h"
#include "server/round_impl.h"

#include "common/crc32c.h"
#include "common/err.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static size_t chunk_elems_of(size_t count, size_t chunk_elems)
{
	return chunk_elems == 0 || chunk_elems >= count ? (count ? count : 1) : chunk_elems;
}

/* At least one, even for an empty tensor. */
static uint32_t chunks_of(size_t count, size_t per)
{
	uint32_t n = (uint32_t)((count + per - 1) / per);

	return n > 0 ? n : 1;
}

uint64_t aps_round_overhead(uint32_t world_size, size_t count, size_t chunk_elems)
{
	uint64_t n_chunks = chunks_of(count, chunk_elems_of(count, chunk_elems));
	struct aps_round *r = NULL;

	return n_chunks *
	       (sizeof(*r->chunks) +
	        (uint64_t)world_size * (sizeof(*r->has) + sizeof(*r->held) + sizeof(*r->declined)));
}

int aps_round_init(struct aps_round *r, uint32_t world_size, size_t count, size_t chunk_elems,
                   bool lowp)
{
	size_t cells;

	memset(r, 0, sizeof(*r));
	r->world_size = world_size;
	r->count = count;
	r->lowp = lowp;
	r->chunk_elems = chunk_elems_of(count, chunk_elems);
	r->n_chunks = chunks_of(count, r->chunk_elems);
	cells = (size_t)r->n_chunks * world_size;
	r->chunks = calloc(r->n_chunks, sizeof(*r->chunks));
	r->has = calloc(cells, sizeof(*r->has));
	r->held = calloc(cells, sizeof(*r->held));
	r->declined = calloc(cells, sizeof(*r->declined));
	r->acc = malloc((count ? count : 1) * sizeof(float));
	if (lowp)
		r->scratch = malloc(r->chunk_elems * sizeof(float));
	if (r->chunks == NULL || r->has == NULL || r->held == NULL || r->declined == NULL ||
	    r->acc == NULL || (lowp && r->scratch == NULL)) {
		aps_round_fini(r);
		return APS_ENOMEM;
	}
	return 0;
}

static void release(struct aps_payload *p)
{
	if (p->release != NULL)
		p->release(p->ctx);
	memset(p, 0, sizeof(*p));
}

/* Shares (aps_round_held): a round joins its share's list when it starts to hold
 * something and leaves it when it holds nothing, as a share does its pool's. */
static void share_link(struct aps_round_share *s)
{
	struct aps_round_held *p = s->pool;

	s->prev = NULL;
	s->next = p->holders;
	if (p->holders != NULL)
		p->holders->prev = s;
	p->holders = s;
	p->n_holders++;
}

static void share_unlink(struct aps_round_share *s)
{
	struct aps_round_held *p = s->pool;

	if (s->prev != NULL)
		s->prev->next = s->next;
	else
		p->holders = s->next;
	if (s->next != NULL)
		s->next->prev = s->prev;
	s->prev = s->next = NULL;
	p->n_holders--;
}

static void round_link(struct aps_round *r)
{
	struct aps_round_share *s = r->share;

	r->share_prev = NULL;
	r->share_next = s->rounds;
	if (s->rounds != NULL)
		s->rounds->share_prev = r;
	s->rounds = r;
}

static void round_unlink(struct aps_round *r)
{
	struct aps_round_share *s = r->share;

	if (r->share_prev != NULL)
		r->share_prev->share_next = r->share_next;
	else
		s->rounds = r->share_next;
	if (r->share_next != NULL)
		r->share_next->share_prev = r->share_prev;
	r->share_prev = r->share_next = NULL;
}

/* A contribution goes into its cell (hold) and leaves it (unhold): summed at once,
 * later in its turn, given up for another job's, or dropped with its step. */
static void hold(struct aps_round *r, const struct aps_contribution *c)
{
	uint64_t len = c->payload.len;
	struct aps_round_share *s = r->share;

	if (c->payload.data == NULL || len == 0)
		return;
	r->held_bytes += len;
	r->held_unaskable += !c->askable;
	if (s == NULL)
		return;
	if (r->held_bytes == len)
		round_link(r);
	s->bytes += len;
	if (s->pool == NULL)
		return;
	if (s->bytes == len)
		share_link(s);
	s->pool->bytes += len;
}

static void unhold(struct aps_round *r, const struct aps_contribution *c)
{
	uint64_t len = c->payload.len;
	struct aps_round_share *s = r->share;

	if (c->payload.data == NULL || len == 0)
		return;
	r->held_bytes -= len;
	r->held_unaskable -= !c->askable;
	if (s == NULL)
		return;
	if (r->held_bytes == 0)
		round_unlink(r);
	s->bytes -= len;
	if (s->pool == NULL)
		return;
	if (s->bytes == 0)
		share_unlink(s);
	s->pool->bytes -= len;
}

static void reset_step(struct aps_round *r)
{
	size_t cells = (size_t)r->n_chunks * r->world_size;

	if (r->in_flight > 0) /* its tasks first: their results are dropped */
		aps_engine_quiesce(r->engine, r);
	for (size_t i = 0; r->held != NULL && i < cells; i++) {
		unhold(r, &r->held[i]);
		release(&r->held[i].payload);
	}
	if (r->has != NULL)
		memset(r->has, 0, cells * sizeof(*r->has));
	if (r->declined != NULL)
		memset(r->declined, 0, cells * sizeof(*r->declined));
	if (r->chunks != NULL)
		memset(r->chunks, 0, r->n_chunks * sizeof(*r->chunks));
	r->kind = APS_ROUND_IDLE;
	r->chunks_sealed = 0;
	r->chunks_finished = 0;
	r->step_fmt_set = false;
	r->flushed = 0;
}

void aps_round_fini(struct aps_round *r)
{
	reset_step(r);
	free(r->chunks);
	free(r->has);
	free(r->held);
	free(r->declined);
	free(r->acc);
	free(r->scratch);
	free(r->err_scratch);
	memset(r, 0, sizeof(*r));
}

void aps_round_abort(struct aps_round *r)
{
	if (r->kind != APS_ROUND_IDLE && r->chunks_sealed == r->n_chunks)
		return; /* every chunk is summed: its results are on their way */
	reset_step(r);
}

bool aps_round_busy(const struct aps_round *r)
{
	return r->kind != APS_ROUND_IDLE && r->chunks_sealed < r->n_chunks;
}

size_t aps_round_chunk_len(const struct aps_round *r, uint32_t chunk)
{
	size_t off = (size_t)chunk * r->chunk_elems;

	return r->count - off < r->chunk_elems ? r->count - off : r->chunk_elems;
}

int64_t aps_round_chunk_of(const struct aps_round *r, uint64_t offset, uint64_t count)
{
	uint64_t chunk = offset / r->chunk_elems;

	if (offset % r->chunk_elems != 0 || chunk >= r->n_chunks)
		return -1;
	return count == aps_round_chunk_len(r, (uint32_t)chunk) ? (int64_t)chunk : -1;
}

/* Rounds acc[off, off + n) to the format: the paper's sum after each addition. */
static void round_to_format(struct aps_round *r, const struct aps_format *f, float *acc, size_t n)
{
	struct aps_quant_opts o = { 0 };
	size_t len = aps_format_packed_size(f, n);

	aps_codec_quantize(f, acc, n, &o, r->scratch, len, NULL);
	aps_codec_dequantize(f, r->scratch, len, n, 0, acc);
}

/* Where a stage of this round stands on the timeline. */

/* Decodes one contribution into its chunk of acc: the first writes, later ones add. */
static void sum_one(struct aps_round *r, uint32_t chunk, const struct aps_contribution *c,
                    bool first)
{
	const struct aps_payload *p = &c->payload;
	float *acc = r->acc + (size_t)chunk * r->chunk_elems;
	size_t n = aps_round_chunk_len(r, chunk);
	/* lowp sums the codes as they are (times 2^k): every rank has the same k. */
	int k = r->lowp ? 0 : c->scale_exp;
	uint64_t t0 = r->trace != NULL ? aps_trace_now() : 0;

	if (first) {
		aps_codec_decode_payload(&c->fmt, p->data, p->len, n, k, c->block, acc, false);
		aps_trace_stage(r->trace, "dequantize", t0, &APS__ROUND_AT(r, chunk));
		return;
	}
	aps_codec_decode_payload(&c->fmt, p->data, p->len, n, k, c->block, acc, true);
	if (r->lowp)
		round_to_format(r, &c->fmt, acc, n);
	aps_trace_stage(r->trace, "sum", t0, &APS__ROUND_AT(r, chunk));
}

bool aps_round_offloaded(const struct aps_round *r)
{
	return r->engine != NULL && r->kind == APS_ROUND_ALLREDUCE && !r->lowp &&
	       r->transform == NULL && r->trace == NULL &&
	       r->chunk_elems >= APS_ROUND_ENGINE_MIN_ELEMS;
}

/* One contribution's dequantize-accumulate on the chunk's engine thread. */
struct sum_task {
	struct aps_engine_task base;
	struct aps_round *r;
	uint32_t chunk;
	bool first;
	struct aps_contribution c;
};

static void run_sum(struct aps_engine_task *base, struct aps_engine_scratch *s)
{
	struct sum_task *t = (struct sum_task *)base;

	(void)s;
	sum_one(t->r, t->chunk, &t->c, t->first);
	release(&t->c.payload);
}

/* Cancelled before it ran, it still holds its payload. */
static void sum_done(struct aps_engine_task *base, bool cancelled)
{
	struct sum_task *t = (struct sum_task *)base;

	(void)cancelled;
	release(&t->c.payload);
	t->r->in_flight--;
	free(t);
}

/* Sums c into the chunk here or on the chunk's engine thread (after the sums before it). */
static void sum_in_order(struct aps_round *r, uint32_t chunk, struct aps_contribution *c,
                         bool first)
{
	struct sum_task *t = aps_round_offloaded(r) ? malloc(sizeof(*t)) : NULL;

	if (t == NULL) {
		if (r->in_flight > 0) /* out of memory: the sums before it first */
			aps_engine_wait(r->engine, r);
		sum_one(r, chunk, c, first);
		release(&c->payload);
		return;
	}
	*t = (struct sum_task){ .base = { .run = run_sum, .done = sum_done, .owner = r },
		                .r = r,
		                .chunk = chunk,
		                .first = first,
		                .c = *c };
	memset(&c->payload, 0, sizeof(c->payload));
	r->in_flight++;
	aps_engine_submit(r->engine, r->lane + chunk, &t->base);
}

static bool is_absent(const struct aps_round *r, uint32_t rank)
{
	return r->absent != NULL && r->absent[rank];
}

/*
 * Sums every held contribution of chunk whose turn has come, in rank order;
 * an absent rank that sent nothing is passed over (an elastic job's mean is
 * over the ranks that contributed).
 */
static void sum_ready(struct aps_round *r, uint32_t chunk)
{
	struct aps_round_chunk *ch = &r->chunks[chunk];
	size_t base = (size_t)chunk * r->world_size;

	while (ch->next_rank < r->world_size) {
		struct aps_contribution *c = &r->held[base + ch->next_rank];
		if (r->has[base + ch->next_rank]) {
			unhold(r, c);
			sum_in_order(r, chunk, c, ch->summed == 0);
			ch->summed++;
		} else if (!is_absent(r, ch->next_rank)) {
			return;
		}
		ch->next_rank++;
	}
}

static int refuse(char *why, size_t why_len, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

static int refuse(char *why, size_t why_len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, why_len, fmt, ap);
	va_end(ap);
	return APS_EPROTO;
}

static int check_lowp(const struct aps_round *r, const struct aps_contribution *c, char *why,
                      size_t why_len)
{
	if (!r->lowp || c->payload.data == NULL || !r->step_fmt_set)
		return 0;
	if (!aps_format_equal(&c->fmt, &r->step_fmt) || c->scale_exp != r->step_scale)
		return refuse(
		        why, why_len,
		        "lowp sum needs one format and exponent: %s k=%d, others sent %s k=%d",
		        c->fmt.name, c->scale_exp, r->step_fmt.name, r->step_scale);
	return 0;
}

static int check_add(const struct aps_round *r, uint32_t rank, uint64_t step, uint32_t chunk,
                     enum aps_round_kind kind, const struct aps_contribution *c, char *why,
                     size_t why_len)
{
	bool data = c->payload.data != NULL;

	if (rank >= r->world_size || chunk >= r->n_chunks)
		return refuse(why, why_len, "rank %u or chunk %u out of range", rank, chunk);
	if (step != r->step)
		return refuse(why, why_len, "step %llu, the tensor is at step %llu",
		              (unsigned long long)step, (unsigned long long)r->step);
	if (r->has[(size_t)chunk * r->world_size + rank])
		return refuse(why, why_len, "rank %u already sent chunk %u of step %llu", rank,
		              chunk, (unsigned long long)step);
	/* Only a rank that was absent can come this late (elastic jobs): not its round. */
	if (r->chunks[chunk].finished)
		return refuse(why, why_len, "chunk %u of step %llu was finished without rank %u",
		              chunk, (unsigned long long)step, rank);
	if (r->kind != APS_ROUND_IDLE && r->kind != kind)
		return refuse(why, why_len, "step %llu mixes a broadcast and an all-reduce",
		              (unsigned long long)step);
	if (kind == APS_ROUND_ALLREDUCE && !data)
		return refuse(why, why_len, "rank %u pushed no data", rank);
	if (kind == APS_ROUND_BROADCAST && data && rank != 0)
		return refuse(why, why_len, "rank %u sent broadcast data: only rank 0 does", rank);
	if (kind == APS_ROUND_ALLREDUCE && c->block != aps_codec_payload_block(&c->fmt, r->block))
		return refuse(why, why_len, "rank %u sent %s in blocks of %u, the job's are %u",
		              rank, c->fmt.name, c->block, r->block);
	return check_lowp(r, c, why, why_len);
}

/* Whether rank's contribution to chunk would be summed at once: every rank below
 * it has been summed, has sent its own, or is absent. */
static bool its_turn(const struct aps_round *r, uint32_t chunk, uint32_t rank)
{
	size_t base = (size_t)chunk * r->world_size;

	for (uint32_t q = r->chunks[chunk].next_rank; q < rank; q++) {
		if (!r->has[base + q] && !is_absent(r, q))
			return false;
	}
	return true;
}

/*
 * Gives up r's held contributions whose ranks can be asked for them again, the
 * highest ranks first (the furthest from their turn), until need bytes are
 * freed; each is declined as if it had come now. Returns the bytes freed.
 */
static uint64_t give_up(struct aps_round *r, uint64_t need)
{
	uint64_t freed = 0;

	for (uint32_t rank = r->world_size; rank-- > 0 && freed < need;) {
		for (uint32_t chunk = 0; chunk < r->n_chunks && freed < need; chunk++) {
			size_t cell = (size_t)chunk * r->world_size + rank;
			struct aps_contribution *c = &r->held[cell];

			if (!r->has[cell] || rank <= r->chunks[chunk].next_rank ||
			    c->payload.data == NULL || !c->askable)
				continue; /* summed, or its rank would wait for an AGAIN it cannot
				             read */
			freed += c->payload.len;
			unhold(r, c);
			release(&c->payload);
			r->has[cell] = false;
			r->chunks[chunk].arrived--;
			r->flushed -= c->flushed;
			r->declined[cell] = APS_ROUND_DECLINED;
			r->share->pool->given_up++;
		}
	}
	return freed;
}

/*
 * Frees what v holds past fair, up to need bytes: contributions that can be
 * asked for again first (give_up); then, with drop_step, the steps of rounds
 * that hold one that cannot, whole (they may take v below fair).
 */
static void take_from(struct aps_round_share *v, uint64_t fair, uint64_t need, bool drop)
{
	struct aps_round_held *p = v->pool;
	uint64_t got = 0, over = v->bytes - fair < need ? v->bytes - fair : need;
	struct aps_round *q, *next_q;

	for (q = v->rounds; q != NULL && got < over; q = next_q) {
		uint64_t had = q->held_bytes;

		next_q = q->share_next; /* q leaves the list if it gives up everything */
		if (!drop) {
			got += give_up(q, over - got);
		} else if (q->held_unaskable > 0) {
			p->drop_step(p->ctx, q);
			p->steps_dropped++;
			got += had - q->held_bytes;
		}
	}
}

/*
 * Room in the pool for len more bytes of s, if s would stay within its fair
 * part: taken from the shares that hold more than theirs, down to it.
 */
static bool make_room(struct aps_round_share *s, uint64_t len)
{
	struct aps_round_held *p = s->pool;
	uint64_t fair = p->limit / (p->n_holders + (s->bytes == 0 ? 1 : 0));
	struct aps_round_share *v, *next_v;

	if (s->bytes + len > fair)
		return false;
	for (int drop = 0; drop <= (p->drop_step != NULL); drop++) {
		for (v = p->holders; v != NULL && p->bytes + len > p->limit; v = next_v) {
			next_v = v->next; /* v leaves the list if it gives up everything */
			if (v != s && v->bytes > fair)
				take_from(v, fair, p->bytes + len - p->limit, drop);
		}
	}
	return p->bytes + len <= p->limit;
}

/* An early contribution that would pass the pool's limit is not kept, unless
 * another job gives up room for it (aps_round_held). */
static bool decline(struct aps_round *r, uint32_t chunk, uint32_t rank,
                    const struct aps_contribution *c)
{
	struct aps_round_held *p = r->share != NULL ? r->share->pool : NULL;

	if (p == NULL || p->limit == 0 || c->payload.data == NULL ||
	    p->bytes + c->payload.len <= p->limit || its_turn(r, chunk, rank) ||
	    make_room(r->share, c->payload.len))
		return false;
	r->declined[(size_t)chunk * r->world_size + rank] = APS_ROUND_DECLINED;
	r->kind = APS_ROUND_ALLREDUCE; /* busy: its rank's call waits (aps_round_busy) */
	return true;
}

bool aps_round_wanted(struct aps_round *r, uint32_t chunk, uint32_t *rank)
{
	const struct aps_round_chunk *ch = &r->chunks[chunk];
	size_t cell = (size_t)chunk * r->world_size + ch->next_rank;

	if (ch->finished || ch->next_rank >= r->world_size ||
	    r->declined[cell] != APS_ROUND_DECLINED)
		return false;
	r->declined[cell] = APS_ROUND_ASKED;
	*rank = ch->next_rank;
	return true;
}

int aps_round_add(struct aps_round *r, uint32_t rank, uint64_t step, uint32_t chunk,
                  enum aps_round_kind kind, struct aps_contribution *c, char *why, size_t why_len)
{
	size_t cell = (size_t)chunk * r->world_size + rank;
	int ret = check_add(r, rank, step, chunk, kind, c, why, why_len);

	if (ret < 0)
		return ret;
	if (kind == APS_ROUND_ALLREDUCE && decline(r, chunk, rank, c))
		return APS_ROUND_ADD_DECLINED;
	r->declined[cell] = APS_ROUND_KEPT;
	if (r->kind != kind) /* written once a step: engine threads read it */
		r->kind = kind;
	r->has[cell] = true;
	r->chunks[chunk].arrived++;
	r->flushed += c->flushed;
	if (c->payload.data != NULL && !r->step_fmt_set) {
		r->step_fmt_set = true;
		r->step_fmt = c->fmt;
		r->step_scale = c->scale_exp;
	}
	r->held[cell] = *c;
	memset(&c->payload, 0, sizeof(c->payload));
	if (kind == APS_ROUND_ALLREDUCE) {
		hold(r, &r->held[cell]); /* sum_ready takes it off, at once or in its turn */
		sum_ready(r, chunk);
		return 0;
	}
	/* A broadcast: only the root carries data, there is nothing to order. */
	if (r->held[cell].payload.data != NULL) {
		sum_one(r, chunk, &r->held[cell], true);
		r->chunks[chunk].root_seen = true;
	}
	release(&r->held[cell].payload);
	return 0;
}

bool aps_round_has(const struct aps_round *r, uint32_t rank, uint64_t step, uint32_t chunk)
{
	return step == r->step && rank < r->world_size && chunk < r->n_chunks &&
	       r->has[(size_t)chunk * r->world_size + rank];
}

bool aps_round_sent(const struct aps_round *r, uint32_t rank, uint64_t step, uint32_t chunk)
{
	return aps_round_has(r, rank, step, chunk) ||
	       (step == r->step && rank < r->world_size && chunk < r->n_chunks &&
	        r->declined[(size_t)chunk * r->world_size + rank] != APS_ROUND_KEPT);
}

bool aps_round_chunk_complete(const struct aps_round *r, uint32_t chunk)
{
	const struct aps_round_chunk *ch = &r->chunks[chunk];

	if (ch->finished || ch->arrived == 0)
		return false;
	if (r->kind == APS_ROUND_ALLREDUCE)
		return ch->next_rank == r->world_size;
	/* A broadcast: every expected rank asked, and the root's data is in. */
	for (uint32_t rank = 0; rank < r->world_size; rank++) {
		if (!r->has[(size_t)chunk * r->world_size + rank] && !is_absent(r, rank))
			return false;
	}
	return ch->root_seen;
}

bool aps_round_recheck(struct aps_round *r, uint32_t chunk)
{
	/* Also with nothing kept: next_rank passes the absent, up to a declined rank. */
	if (r->kind == APS_ROUND_ALLREDUCE && !r->chunks[chunk].finished)
		sum_ready(r, chunk);
	return aps_round_chunk_complete(r, chunk);
}

void aps__round_close_chunk(struct aps_round *r, struct aps_round_result *res)
{
	struct aps_round_chunk *ch = &r->chunks[res->offset / r->chunk_elems];

	res->step = r->step;
	res->flushed = r->flushed;
	ch->err_num = res->err_num;
	ch->err_den = res->err_den;
	if (++r->chunks_finished == r->n_chunks) {
		double num = 0, den = 0; /* in chunk order: the same sum whatever the threads */
		for (uint32_t c = 0; c < r->n_chunks; c++) {
			num += r->chunks[c].err_num;
			den += r->chunks[c].err_den;
		}
		res->rel_error = den > 0 ? sqrt(num / den) : 0.0;
		reset_step(r);
		r->step++;
		res->step_done = true;
	}
}

size_t aps_round_missing(const struct aps_round *r, uint32_t *ranks, size_t cap)
{
	size_t n = 0;

	for (uint32_t rank = 0; rank < r->world_size; rank++) {
		bool missing = false;
		if (is_absent(r, rank))
			continue;
		for (uint32_t c = 0; c < r->n_chunks && !missing; c++)
			missing = !r->chunks[c].finished && !aps_round_sent(r, rank, r->step, c);
		if (!missing)
			continue;
		if (n < cap)
			ranks[n] = rank;
		n++;
	}
	return n;
}
