/*
 * The job table: jobs by name, sessions by peer (a keyed hash, job.h), tensors
 * by id and by name. Jobs are few (max_jobs) and walked linearly.
 */
#include "server/job.h"

#include "server/ckpt_copy.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct aps_peer *key_of(const struct aps_session *s, enum aps_session_key k)
{
	return k == APS_SESSION_BY_PEER ? &s->peer : &s->moved_from;
}

static size_t bucket_of(struct aps_jobs *t, size_t n_buckets, const struct aps_peer *p)
{
	return (size_t)(aps_peer_hash(&t->hasher, p) & (n_buckets - 1));
}

/* Twice the buckets (64 at first). Returns 0 or APS_ENOMEM (the old ones stay). */
static int index_grow(struct aps_jobs *t, enum aps_session_key k)
{
	struct aps_session_index *ix = &t->index[k];
	size_t n = ix->n_buckets ? 2 * ix->n_buckets : 64;
	struct aps_session **b = calloc(n, sizeof(*b)), *s, *next;

	if (b == NULL)
		return APS_ENOMEM;
	for (size_t i = 0; i < ix->n_buckets; i++) {
		for (s = ix->buckets[i]; s != NULL; s = next) {
			size_t to = bucket_of(t, n, key_of(s, k));
			next = s->index_next[k];
			s->index_next[k] = b[to];
			b[to] = s;
		}
	}
	free(ix->buckets);
	ix->buckets = b;
	ix->n_buckets = n;
	return 0;
}

/* Makes sure the index has buckets. Returns 0 or APS_ENOMEM. */
static int index_ready(struct aps_jobs *t, enum aps_session_key k)
{
	return t->index[k].n_buckets > 0 ? 0 : index_grow(t, k);
}

static void index_add(struct aps_jobs *t, struct aps_session *s, enum aps_session_key k)
{
	struct aps_session_index *ix = &t->index[k];
	size_t b;

	if (ix->n >= ix->n_buckets)
		(void)index_grow(t, k); /* out of memory: longer chains, still right */
	b = bucket_of(t, ix->n_buckets, key_of(s, k));
	s->index_next[k] = ix->buckets[b];
	ix->buckets[b] = s;
	ix->n++;
}

static void index_remove(struct aps_jobs *t, struct aps_session *s, enum aps_session_key k)
{
	struct aps_session_index *ix = &t->index[k];
	struct aps_session **link;

	if (ix->n_buckets == 0)
		return;
	link = &ix->buckets[bucket_of(t, ix->n_buckets, key_of(s, k))];
	while (*link != NULL && *link != s)
		link = &(*link)->index_next[k];
	if (*link == s) {
		*link = s->index_next[k];
		s->index_next[k] = NULL;
		ix->n--;
	}
}

/* The first session under peer by k (a joined one only, if joined). */
static struct aps_session *index_find(struct aps_jobs *t, enum aps_session_key k,
                                      const struct aps_peer *peer, bool joined)
{
	const struct aps_session_index *ix = &t->index[k];

	if (ix->n == 0)
		return NULL;
	for (struct aps_session *s = ix->buckets[bucket_of(t, ix->n_buckets, peer)]; s != NULL;
	     s = s->index_next[k]) {
		if (aps_peer_equal(key_of(s, k), peer) && (!joined || s->job != NULL))
			return s;
	}
	return NULL;
}

struct aps_session *aps_jobs_find_session(struct aps_jobs *t, const struct aps_peer *peer)
{
	return index_find(t, APS_SESSION_BY_PEER, peer, false);
}

struct aps_session *aps_jobs_find_moved(struct aps_jobs *t, const struct aps_peer *peer)
{
	return index_find(t, APS_SESSION_BY_MOVED_FROM, peer, true);
}

struct aps_session *aps_jobs_session(struct aps_jobs *t, const struct aps_peer *peer)
{
	struct aps_session *s = aps_jobs_find_session(t, peer);

	if (s != NULL)
		return s;
	/* both indexes from the first session: a move (aps_jobs_move_session) never fails */
	if (index_ready(t, APS_SESSION_BY_PEER) < 0 ||
	    index_ready(t, APS_SESSION_BY_MOVED_FROM) < 0 || (s = calloc(1, sizeof(*s))) == NULL)
		return NULL;
	s->peer = *peer;
	s->conn = 0;
	index_add(t, s, APS_SESSION_BY_PEER);
	s->next = t->sessions;
	if (t->sessions != NULL)
		t->sessions->prev = s;
	t->sessions = s;
	return s;
}

void aps_jobs_move_session(struct aps_jobs *t, struct aps_session *s, const struct aps_peer *peer)
{
	index_remove(t, s, APS_SESSION_BY_PEER);
	if (s->moved_from.len > 0)
		index_remove(t, s, APS_SESSION_BY_MOVED_FROM);
	s->moved_from = s->peer;
	s->peer = *peer;
	index_add(t, s, APS_SESSION_BY_PEER);
	index_add(t, s, APS_SESSION_BY_MOVED_FROM);
}

void aps_jobs_drop_session(struct aps_jobs *t, struct aps_session *s)
{
	if (s->job != NULL && s->job->ranks[s->rank] == s)
		s->job->ranks[s->rank] = NULL;
	index_remove(t, s, APS_SESSION_BY_PEER);
	if (s->moved_from.len > 0)
		index_remove(t, s, APS_SESSION_BY_MOVED_FROM);
	if (s->prev != NULL)
		s->prev->next = s->next;
	else if (t->sessions == s)
		t->sessions = s->next;
	if (s->next != NULL)
		s->next->prev = s->prev;
	free(s);
}

struct aps_job *aps_jobs_find(struct aps_jobs *t, const char *name)
{
	for (struct aps_job *j = t->jobs; j != NULL; j = j->next) {
		if (strcmp(j->name, name) == 0)
			return j;
	}
	return NULL;
}

uint64_t aps_job_bytes(const struct aps_job *job)
{
	return job->tensor_bytes + job->overhead_bytes + job->resume_bytes;
}

uint64_t aps_jobs_bytes(const struct aps_jobs *t, const char *origin, uint64_t *of_origin)
{
	uint64_t total = 0;

	*of_origin = 0;
	for (const struct aps_job *j = t->jobs; j != NULL; j = j->next) {
		total += aps_job_bytes(j);
		*of_origin += strcmp(j->origin, origin) == 0 ? aps_job_bytes(j) : 0;
	}
	return total;
}

void aps_tensor_forget_pulled(struct aps_job *job, struct aps_tensor *t)
{
	if (t->pulled == NULL)
		return;
	for (uint32_t c = 0; c < t->round.n_chunks; c++)
		aps_sbuf_unref(t->pulled[c]); /* the pulls still queued keep theirs */
	free(t->pulled);
	t->pulled = NULL;
	job->overhead_bytes -= t->count * sizeof(float);
}

static void free_tensor(struct aps_job *job, struct aps_tensor *tensor)
{
	if (tensor == NULL)
		return;
	aps_tensor_forget_pulled(job, tensor);
	aps_round_fini(&tensor->round);
	aps_replay_fini(&tensor->replay);
	aps_optim_tensor_fini(&tensor->opt);
	aps_tally_release(tensor->unsent);
	free(tensor->registered);
	free(tensor->exp_has);
	free(tensor);
}

static void free_job(struct aps_job *job)
{
	for (uint32_t i = 0; job->copying != NULL && i < job->n_tensors; i++) {
		/* The arrays it saves are read on a thread: freed when the copy is done. */
		float **saved[APS_OPTIM_SAVED_MAX];
		unsigned n = aps_optim_tensor_saved(&job->tensors[i]->opt, saved);
		for (unsigned a = 0; a < n; a++) {
			aps_ckpt_copy_free_later(job->copying, *saved[a]);
			*saved[a] = NULL;
		}
	}
	for (struct aps_deferred_finish *d = job->deferred, *next; d != NULL; d = next) {
		next = d->next;
		free(d);
	}
	for (uint32_t i = 0; i < job->n_tensors; i++)
		free_tensor(job, job->tensors[i]);
	aps_tally_release(job->steps_unsent);
	free(job->tensors);
	free(job->by_name);
	aps_ckpt_free(&job->resume);
	free(job->ranks);
	free(job->barrier_has);
	free(job->absent);
	free(job);
}

int aps_jobs_create(struct aps_jobs *t, const char *name, uint32_t world_size, struct aps_job **out)
{
	struct aps_job *job = calloc(1, sizeof(*job));

	if (job == NULL)
		return APS_ENOMEM;
	snprintf(job->name, sizeof(job->name), "%s", name);
	job->world_size = world_size;
	job->scaling = APS_SCALING_LOCAL;
	job->downlink_auto = true;
	job->ranks = calloc(world_size, sizeof(*job->ranks));
	job->barrier_has = calloc(world_size, sizeof(*job->barrier_has));
	job->absent = calloc(world_size, sizeof(*job->absent));
	if (job->ranks == NULL || job->barrier_has == NULL || job->absent == NULL) {
		free_job(job);
		return APS_ENOMEM;
	}
	job->next = t->jobs;
	t->jobs = job;
	t->n_jobs++;
	*out = job;
	return 0;
}

int aps_jobs_share_held(struct aps_jobs *t, struct aps_job *job, const char *origin, bool local,
                        struct aps_round_held *pool)
{
	struct aps_held_share *h = NULL;

	for (h = local ? NULL : t->shares; h != NULL; h = h->next) {
		if (strcmp(h->origin, origin) == 0)
			break;
	}
	if (h == NULL) {
		if ((h = calloc(1, sizeof(*h))) == NULL)
			return APS_ENOMEM;
		snprintf(h->origin, sizeof(h->origin), "%s", local ? "" : origin);
		h->share.pool = pool;
		h->next = t->shares;
		t->shares = h;
	}
	h->jobs++;
	job->held = h;
	return 0;
}

/* The job is gone (its rounds with it: the share holds nothing of it). */
static void release_share(struct aps_jobs *t, struct aps_held_share *h)
{
	struct aps_held_share **link = &t->shares;

	if (h == NULL || --h->jobs > 0)
		return;
	while (*link != NULL && *link != h)
		link = &(*link)->next;
	if (*link != NULL)
		*link = h->next;
	free(h);
}

void aps_jobs_remove(struct aps_jobs *t, struct aps_job *job)
{
	struct aps_job **link = &t->jobs;
	struct aps_held_share *held = job->held;

	while (*link != NULL && *link != job)
		link = &(*link)->next;
	if (*link == NULL)
		return;
	*link = job->next;
	t->n_jobs--;
	for (struct aps_session *s = t->sessions; s != NULL; s = s->next) {
		if (s->job == job)
			s->job = NULL;
	}
	free_job(job);
	release_share(t, held);
}

void aps_jobs_free_all(struct aps_jobs *t)
{
	while (t->sessions != NULL)
		aps_jobs_drop_session(t, t->sessions);
	while (t->jobs != NULL)
		aps_jobs_remove(t, t->jobs);
	for (int k = 0; k < APS_SESSION_KEYS; k++) {
		free(t->index[k].buckets);
		t->index[k] = (struct aps_session_index){ 0 };
	}
}

uint32_t aps_job_connected(const struct aps_job *job)
{
	uint32_t n = 0;

	for (uint32_t r = 0; r < job->world_size; r++)
		n += job->ranks[r] != NULL;
	return n;
}

/* Where name is in by_name, or would go: the first place whose name is not before it. */
static uint32_t name_place(const struct aps_job *job, const char *name)
{
	uint32_t lo = 0, hi = job->n_tensors;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		if (strcmp(job->by_name[mid]->name, name) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

struct aps_tensor *aps_job_tensor_by_name(struct aps_job *job, const char *name)
{
	uint32_t i = name_place(job, name);

	return i < job->n_tensors && strcmp(job->by_name[i]->name, name) == 0 ? job->by_name[i]
	                                                                      : NULL;
}

struct aps_tensor *aps_job_tensor(struct aps_job *job, uint32_t id)
{
	return id < job->n_tensors ? job->tensors[id] : NULL;
}

static int grow_tensors(struct aps_job *job)
{
	uint32_t cap = job->cap_tensors ? 2 * job->cap_tensors : 16;
	struct aps_tensor **t = realloc(job->tensors, cap * sizeof(*t));
	struct aps_tensor **n;

	if (t == NULL)
		return APS_ENOMEM;
	job->tensors = t;
	n = realloc(job->by_name, cap * sizeof(*n));
	if (n == NULL)
		return APS_ENOMEM; /* tensors grew, by_name did not: cap_tensors says the lesser */
	job->by_name = n;
	job->cap_tensors = cap;
	return 0;
}

uint64_t aps_job_tensor_overhead(const struct aps_job *job, uint64_t count)
{
	struct aps_tensor *t = NULL;

	return sizeof(*t) +
	       (uint64_t)job->world_size * (sizeof(*t->registered) + sizeof(*t->exp_has)) +
	       aps_tally_size(job->world_size) +
	       aps_round_overhead(job->world_size, count, job->chunk_elems);
}

int aps_job_add_tensor(struct aps_job *job, const char *name, uint64_t count, uint32_t max_tensors,
                       struct aps_tensor **out)
{
	struct aps_tensor *t;

	if (job->n_tensors >= max_tensors)
		return APS_ERANGE;
	if (job->n_tensors == job->cap_tensors && grow_tensors(job) < 0)
		return APS_ENOMEM;
	t = calloc(1, sizeof(*t));
	if (t == NULL)
		return APS_ENOMEM;
	t->registered = calloc(job->world_size, sizeof(*t->registered));
	t->exp_has = calloc(job->world_size, sizeof(*t->exp_has));
	t->unsent = aps_tally_new(job->world_size);
	if (t->registered == NULL || t->exp_has == NULL || t->unsent == NULL ||
	    aps_round_init(&t->round, job->world_size, count, job->chunk_elems, job->lowp) < 0) {
		aps_tally_release(t->unsent);
		free(t->registered);
		free(t->exp_has);
		free(t);
		return APS_ENOMEM;
	}
	t->round.absent = job->absent;
	t->round.no_crc = job->no_crc;
	t->round.block = job->block;
	job->tensor_bytes += count * sizeof(float);
	job->overhead_bytes += aps_job_tensor_overhead(job, count);
	job->answer_msgs += 2 * (uint64_t)t->round.n_chunks + 2;
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->id = job->n_tensors;
	t->count = count;
	uint32_t at = name_place(job, t->name);
	memmove(&job->by_name[at + 1], &job->by_name[at],
	        (job->n_tensors - at) * sizeof(*job->by_name));
	job->by_name[at] = t;
	job->tensors[job->n_tensors++] = t;
	*out = t;
	return 0;
}

void aps_tensor_forget_answers(struct aps_tensor *t)
{
	aps_replay_fini(&t->replay);
	t->exp_done = false;
}

void aps_job_abort_tensor(struct aps_job *job, struct aps_tensor *t)
{
	/* Optimize mode: chunks already stepped cannot be taken back. */
	if (t->opt.ready && t->round.kind == APS_ROUND_ALLREDUCE && t->round.chunks_finished > 0)
		t->opt.torn = true;
	t->opt.lr_rank = UINT32_MAX;
	aps_round_abort(&t->round);
	aps_tensor_forget_answers(t);
	memset(t->exp_has, 0, job->world_size * sizeof(*t->exp_has));
	t->exp_arrived = 0;
}

void aps_job_abort_rounds(struct aps_job *job)
{
	for (uint32_t i = 0; i < job->n_tensors; i++)
		aps_job_abort_tensor(job, job->tensors[i]);
	memset(job->barrier_has, 0, job->world_size * sizeof(*job->barrier_has));
	job->barrier_arrived = 0;
}

bool aps_job_busy(const struct aps_job *job)
{
	if (job->barrier_arrived > 0)
		return true;
	for (uint32_t i = 0; i < job->n_tensors; i++) {
		if (aps_round_busy(&job->tensors[i]->round) || job->tensors[i]->exp_arrived > 0)
			return true;
	}
	return false;
}

static bool in_round(const struct aps_round *r, uint32_t rank)
{
	if (!aps_round_busy(r)) /* nothing of this step: no chunk to look at */
		return false;
	for (uint32_t chunk = 0; chunk < r->n_chunks; chunk++) {
		if (aps_round_sent(r, rank, r->step, chunk))
			return true;
	}
	return false;
}

bool aps_job_rank_waits(const struct aps_job *job, uint32_t rank)
{
	if (job->barrier_has[rank])
		return true;
	for (uint32_t i = 0; i < job->n_tensors; i++) {
		if (job->tensors[i]->exp_has[rank] || in_round(&job->tensors[i]->round, rank))
			return true;
	}
	return false;
}

void aps_job_forget_rank(struct aps_job *job, uint32_t rank)
{
	if (job->barrier_has[rank]) {
		job->barrier_has[rank] = false;
		job->barrier_arrived--;
	}
	/* Its exponent stays in exp_max: a larger max only lowers k (never an overflow). */
	for (uint32_t i = 0; i < job->n_tensors; i++) {
		struct aps_tensor *t = job->tensors[i];
		if (t->exp_has[rank]) {
			t->exp_has[rank] = false;
			t->exp_arrived--;
		}
	}
}

uint32_t aps_job_members(const struct aps_job *job)
{
	uint32_t n = 0;

	for (uint32_t r = 0; r < job->world_size; r++)
		n += job->absent[r] ? 0 : 1;
	return n;
}

int aps_tensor_exponents_complete(const struct aps_job *job, struct aps_tensor *t, int32_t *max)
{
	uint32_t need = 0;

	for (uint32_t r = 0; r < job->world_size; r++)
		need += job->absent[r] && !t->exp_has[r] ? 0 : 1;
	if (t->exp_arrived == 0 || t->exp_arrived < need)
		return 0;
	*max = t->exp_max;
	t->exp_done = true;
	t->exp_done_step = t->round.step;
	t->exp_done_max = t->exp_max;
	t->exp_arrived = 0;
	memset(t->exp_has, 0, job->world_size * sizeof(*t->exp_has));
	return 1;
}

int aps_tensor_add_exponent(const struct aps_job *job, struct aps_tensor *t, uint32_t rank,
                            int32_t exponent, int32_t *max)
{
	if (t->exp_has[rank])
		return APS_EPROTO;
	t->exp_has[rank] = true;
	if (t->exp_arrived == 0 || exponent > t->exp_max)
		t->exp_max = exponent;
	t->exp_arrived++;
	return aps_tensor_exponents_complete(job, t, max);
}
