/*
 * Optimize mode: apsd as a classic parameter server. The job's master weights
 * come from rank 0's BROADCAST (or from its newest checkpoint); each step's
 * mean gradient goes through the job's optimizer, and the downlink carries
 * the APS-quantized difference between the new weights and what the workers
 * hold (the view), which then moves by exactly what was sent: the daemon's
 * error feedback. Also PULL (the full fp32 weights) and checkpoint snapshots.
 * The update rules are optimizer.c's, the files checkpoint.c's.
 */
#include "server/optimize.h"

#include "server/ckpt_copy.h"

#include "server/outbox.h"
#include "server/server_impl.h"

#include "common/codec.h"
#include "common/err.h"
#include "common/log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int aps_optimize_parse_hello(const struct aps_msg *m, struct aps_optim_config *cfg, char *why,
                             size_t why_len)
{
	memset(cfg, 0, sizeof(*cfg));
	if (m->optimizer[0] == '\0')
		return 0;
	return aps_optim_parse(m->optimizer, cfg, why, why_len);
}

/* The round's transform: a broadcast sets (or delivers) the weights, a mean updates them. */
static void transform(void *ctx, enum aps_round_kind kind, size_t off, float *acc, size_t n)
{
	struct aps_tensor *t = ctx;
	struct aps_optim_tensor *o = &t->opt;

	if (kind == APS_ROUND_ALLREDUCE) {
		aps_optim_tensor_step_chunk(t->optim, o, off, acc, n);
		return;
	}
	if (!o->ready)
		memcpy(o->weights + off, acc, n * sizeof(float));
	else
		memcpy(acc, o->weights + off, n * sizeof(float));
	memcpy(o->view + off, o->weights + off, n * sizeof(float));
}

static uint64_t ckpt_tensor_bytes(const struct aps_ckpt_tensor *ct)
{
	return ct->arrays[0] != NULL ? (uint64_t)ct->n_arrays * ct->count * sizeof(float) : 0;
}

/* The least of bound - used over the bounds, at least 1 (nothing fits 1). */
static uint64_t room_within(uint64_t room, uint64_t bound, uint64_t used)
{
	if (bound == 0)
		return room;
	if (used >= bound)
		return 1;
	return bound - used < room ? bound - used : room;
}

/* What max_job_bytes, max_address_bytes and max_total_bytes leave a new job of
 * origin besides the others'. */
static uint64_t room_for_job(const struct aps_server *srv, const char *origin)
{
	uint64_t mine, total = aps_jobs_bytes(&srv->jobs, origin, &mine) + srv->ckpt_reading;
	uint64_t room = room_within(srv->opts.max_job_bytes, srv->opts.max_address_bytes, mine);

	return room_within(room, srv->opts.max_total_bytes, total);
}

int aps_optimize_resume_check(struct aps_server *srv, const struct aps_msg *m, const char *origin,
                              const struct aps_optim_config *cfg, struct aps_ckpt_want *want,
                              uint64_t *bytes, char *why, size_t why_len)
{
	const char *dir = srv->opts.checkpoint_dir;
	int ret;

	if (cfg->kind == APS_OPTIM_NONE || dir == NULL || dir[0] == '\0')
		return 0;
	*want = (struct aps_ckpt_want){ .token = m->job_token,
		                        .max_bytes = room_for_job(srv, origin) };
	ret = aps_ckpt_check_newest(dir, m->job, want, bytes, why, why_len);
	if (ret == APS_EACCES || ret == APS_ERANGE)
		aps_log_warn("checkpoint", "not resumed job=%s: %s", m->job, why);
	return ret == 1 || ret == APS_EACCES || ret == APS_ERANGE ? ret : 0;
}

void aps_optimize_job_start(struct aps_job *job, const struct aps_optim_config *cfg)
{
	job->optim = *cfg;
	if (cfg->kind != APS_OPTIM_NONE)
		aps_optim_describe(cfg, job->optim_spec, sizeof(job->optim_spec));
}

int aps_optimize_job_resume(struct aps_server *srv, struct aps_job *job, int ret,
                            struct aps_ckpt *ck, const char *path, const char *why, char *out,
                            size_t out_len)
{
	uint64_t bytes = 0, room;

	if (ret == APS_EACCES || ret == APS_ERANGE) {
		aps_log_warn("checkpoint", "not resumed job=%s: %s", job->name, why);
		snprintf(out, out_len, "%s", why);
		return ret;
	}
	if (ret != 1 || ck->n_tensors == 0)
		return 0;
	for (uint32_t i = 0; i < ck->n_tensors; i++)
		bytes += ckpt_tensor_bytes(&ck->tensors[i]);
	room = room_for_job(srv, job->origin);
	if (bytes > room) {
		snprintf(
		        out, out_len,
		        "job '%.64s': its checkpoint %.200s (step %llu) holds %llu bytes, and %llu "
		        "fit max_job_bytes, max_address_bytes and max_total_bytes now",
		        job->name, path, (unsigned long long)ck->step, (unsigned long long)bytes,
		        (unsigned long long)room);
		aps_log_warn("checkpoint", "not resumed job=%s: %s", job->name, out);
		return APS_ERANGE;
	}
	aps_log_info("checkpoint", "resuming job=%s step=%llu tensors=%u path=%s optimizer=%s",
	             job->name, (unsigned long long)ck->step, ck->n_tensors, path, ck->optimizer);
	job->resume = *ck;
	memset(ck, 0, sizeof(*ck));
	srv->counters.resumed++;
	job->last_ckpt_step = job->resume.step;
	job->resume_bytes = bytes;
	return 0;
}

/* The checkpoint's tensor that t (name, count) takes, or NULL. */
static struct aps_ckpt_tensor *resumed(const struct aps_job *job, const char *name, uint64_t count)
{
	for (uint32_t i = 0; i < job->resume.n_tensors; i++) {
		struct aps_ckpt_tensor *ct = &job->resume.tensors[i];
		if (ct->arrays[0] != NULL && ct->count == count && strcmp(ct->name, name) == 0)
			return ct;
	}
	return NULL;
}

uint64_t aps_optimize_resumed_bytes(const struct aps_job *job, const char *name, uint64_t count)
{
	const struct aps_ckpt_tensor *ct = resumed(job, name, count);

	return ct != NULL ? ckpt_tensor_bytes(ct) : 0;
}

/* Moves the checkpoint's arrays of t into its state (the state only for the same optimizer). */
static void take_resumed(struct aps_job *job, struct aps_tensor *t, struct aps_ckpt_tensor *ct)
{
	struct aps_optim_tensor *o = &t->opt;
	struct aps_optim_config saved;
	char why[160];
	bool same = aps_optim_parse(job->resume.optimizer, &saved, why, sizeof(why)) == 0 &&
	            saved.kind == job->optim.kind && ct->n_arrays == 1 + o->slots;

	job->resume_bytes -= ckpt_tensor_bytes(ct); /* counted in tensor_bytes from here */
	free(o->weights);
	o->weights = ct->arrays[0];
	ct->arrays[0] = NULL;
	memcpy(o->view, o->weights, o->count * sizeof(float));
	o->updates = ct->updates;
	o->ready = true;
	for (unsigned s = 0; same && s < o->slots; s++) {
		free(o->state[s]);
		o->state[s] = ct->arrays[1 + s];
		ct->arrays[1 + s] = NULL;
	}
	o->state_t = same ? ct->state_t : 0;
	for (uint32_t a = 1; a < ct->n_arrays; a++) { /* another optimizer's state */
		free(ct->arrays[a]);
		ct->arrays[a] = NULL;
	}
	if (!same)
		aps_log_warn("checkpoint",
		             "optimizer state not resumed job=%s tensor=%.80s saved=%s now=%s",
		             job->name, t->name, job->resume.optimizer, job->optim_spec);
}

int aps_optimize_register(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t)
{
	(void)srv;
	if (job->optim.kind == APS_OPTIM_NONE)
		return 0;
	if (aps_optim_tensor_init(&t->opt, &job->optim, t->count) < 0)
		return APS_ENOMEM;
	/* what max_job_bytes bounds: the weights, the workers' view and the state too */
	job->tensor_bytes += t->count * sizeof(float) * (2 + t->opt.slots);
	t->optim = &job->optim;
	t->round.transform = transform;
	t->round.transform_ctx = t;
	for (uint32_t i = 0; i < job->resume.n_tensors; i++) {
		struct aps_ckpt_tensor *ct = &job->resume.tensors[i];
		if (ct->arrays[0] == NULL || strcmp(ct->name, t->name) != 0)
			continue;
		if (ct->count == t->count)
			take_resumed(job, t, ct);
		else
			aps_log_warn("checkpoint",
			             "not resumed job=%s tensor=%.80s count=%llu saved_count=%llu",
			             job->name, t->name, (unsigned long long)t->count,
			             (unsigned long long)ct->count);
		break;
	}
	return 0;
}

bool aps_optimize_check_push(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t,
                             const struct aps_msg *m)
{
	bool optimize = s->job->optim.kind != APS_OPTIM_NONE;
	bool update = (m->flags & APS_MSG_FLAG_UPDATE) != 0;
	const char *why = NULL;

	if (m->type == APS_MSG_PUSH && optimize != update)
		why = optimize ? "the job is in optimize mode: push gradients as optimizer steps"
		               : "the job is in all-reduce mode: there is no optimizer to step";
	else if (optimize && m->type == APS_MSG_PUSH && !t->opt.ready)
		why = "no weights yet: rank 0 broadcasts them first";
	else if (optimize && t->opt.torn)
		why = "a rank was lost after part of a step was applied: restart the job, it "
		      "resumes from its last checkpoint";
	if (why == NULL) {
		/* the lowest rank's: rank 0's, or in an elastic job that lost it, the next one's */
		if (optimize && m->type == APS_MSG_PUSH && s->rank <= t->opt.lr_rank) {
			t->opt.lr = m->lr;
			t->opt.lr_rank = s->rank;
		}
		return true;
	}
	srv->counters.bad_state++;
	aps_outbox_error(srv, &s->peer, APS_EPROTO, m, "tensor '%.80s': %s", t->name, why);
	return false;
}

/* Every tensor of the job has had the same number of updates: a consistent snapshot. */
static bool job_at_step(const struct aps_job *job, uint64_t step)
{
	for (uint32_t i = 0; i < job->n_tensors; i++) {
		if (job->tensors[i]->opt.ready && job->tensors[i]->opt.updates != step)
			return false;
	}
	return true;
}

void aps_optimize_chunk_done(struct aps_server *srv, struct aps_job *job, struct aps_tensor *t,
                             const struct aps_round_result *res, bool broadcast)
{
	struct aps_optim_tensor *o = &t->opt;
	uint64_t k = srv->opts.checkpoint_steps;

	if (job->optim.kind == APS_OPTIM_NONE)
		return;
	if (!broadcast)
		aps_codec_decode_payload(&res->fmt, res->payload->data, res->payload->len,
		                         res->count, res->scale_exp, res->block,
		                         o->view + res->offset, true);
	if (!res->step_done)
		return;
	if (broadcast) {
		o->ready = true;
		return;
	}
	o->updates++;
	o->state_t++;
	job->unsaved = true;
	o->lr_rank = UINT32_MAX; /* the next step's lr comes with its pushes */
	srv->counters.updates++;
	if (k > 0 && o->updates % k == 0 && o->updates > job->last_ckpt_step &&
	    job_at_step(job, o->updates))
		aps_optimize_checkpoint(srv, job, "every checkpoint_steps", APS_SNAPSHOT_STEP);
}

static int copy_array(float **dst, const float *src, size_t n)
{
	*dst = malloc(n * sizeof(float));
	if (*dst == NULL)
		return APS_ENOMEM;
	memcpy(*dst, src, n * sizeof(float));
	return 0;
}

/* How a snapshot takes a tensor's arrays. */
enum take {
	TAKE_COPY,   /* copied now, on the loop */
	TAKE_BORROW, /* borrowed, copied on a thread (ckpt_copy.h) while they stay still */
	TAKE_MOVE,   /* moved out: the job ends */
};

static int take_array(float **dst, float **src, size_t n, enum take how)
{
	if (how == TAKE_COPY)
		return copy_array(dst, *src, n);
	*dst = *src;
	if (how == TAKE_MOVE)
		*src = NULL;
	return 0;
}

static int snapshot_tensor(struct aps_tensor *t, struct aps_ckpt_tensor *ct, enum take how)
{
	struct aps_optim_tensor *o = &t->opt;
	float **saved[APS_OPTIM_SAVED_MAX];
	int ret = 0;

	snprintf(ct->name, sizeof(ct->name), "%s", t->name);
	ct->count = o->count;
	ct->updates = o->updates;
	ct->state_t = o->state_t;
	ct->n_arrays = aps_optim_tensor_saved(o, saved);
	ct->borrowed = how == TAKE_BORROW;
	for (unsigned a = 0; ret == 0 && a < ct->n_arrays; a++)
		ret = take_array(&ct->arrays[a], saved[a], o->count, how);
	return ret;
}

/* A resumed tensor no rank registered again this time stays in the next checkpoint. */
static int snapshot_unclaimed(const struct aps_ckpt_tensor *src, struct aps_ckpt_tensor *ct)
{
	int ret = 0;

	*ct = *src;
	memset(ct->arrays, 0, sizeof(ct->arrays));
	for (uint32_t a = 0; ret == 0 && a < src->n_arrays; a++)
		ret = copy_array(&ct->arrays[a], src->arrays[a], src->count);
	return ret;
}

/* A tensor in the middle of a step (some of its chunks applied) or left torn by
 * a lost rank. Optimize mode's rounds have a transform: their chunks are applied
 * on the loop thread (round.h aps_round_offloaded). */
static const struct aps_tensor *half_stepped(const struct aps_job *job)
{
	for (uint32_t i = 0; i < job->n_tensors; i++) {
		const struct aps_tensor *t = job->tensors[i];
		if (t->opt.torn || (t->round.kind == APS_ROUND_ALLREDUCE &&
		                    (t->round.chunks_finished > 0 || t->round.chunks_sealed > 0)))
			return t;
	}
	return NULL;
}

static int snapshot(struct aps_job *job, struct aps_ckpt *ck, enum take how)
{
	uint32_t cap = job->n_tensors + job->resume.n_tensors;
	int ret = 0;

	snprintf(ck->job, sizeof(ck->job), "%s", job->name);
	snprintf(ck->optimizer, sizeof(ck->optimizer), "%s", job->optim_spec);
	ck->owner = job->ckpt_owner;
	snprintf(ck->writer, sizeof(ck->writer), "%s", job->ckpt_writer);
	ck->step = job->resume.step; /* the largest update count: each file of the job's
	                              * names a step past those before it (the smallest named a
	                              * snapshot of a tensor registered late before an older one) */
	ck->tensors = calloc(cap ? cap : 1, sizeof(*ck->tensors));
	if (ck->tensors == NULL)
		return APS_ENOMEM;
	for (uint32_t i = 0; ret == 0 && i < job->n_tensors; i++) {
		struct aps_tensor *t = job->tensors[i];
		if (!t->opt.ready)
			continue;
		ret = snapshot_tensor(t, &ck->tensors[ck->n_tensors++], how);
		ck->step = t->opt.updates > ck->step ? t->opt.updates : ck->step;
	}
	/* Copied now: a REGISTER takes them, whatever a thread reads (rarely many). */
	for (uint32_t i = 0; ret == 0 && i < job->resume.n_tensors; i++) {
		if (job->resume.tensors[i].arrays[0] != NULL)
			ret = snapshot_unclaimed(&job->resume.tensors[i],
			                         &ck->tensors[ck->n_tensors++]);
	}
	return ret;
}

/* A snapshot of job that takes its arrays how; NULL: nothing to keep, or no
 * memory (counted and logged). */
static struct aps_ckpt *take_snapshot(struct aps_server *srv, struct aps_job *job, enum take how)
{
	struct aps_ckpt *ck = calloc(1, sizeof(*ck));
	int ret = ck != NULL ? snapshot(job, ck, how) : APS_ENOMEM;

	if (ret == 0 && ck->n_tensors > 0)
		return ck;
	if (ret < 0) {
		srv->counters.checkpoint_failures++;
		aps_log_error("checkpoint", "out of memory for a snapshot job=%s", job->name);
	}
	aps_ckpt_free(ck);
	free(ck);
	return NULL;
}

void aps_optimize_checkpoint(struct aps_server *srv, struct aps_job *job, const char *why,
                             enum aps_snapshot when)
{
	enum take how = when == APS_SNAPSHOT_STEP  ? TAKE_BORROW
	                : when == APS_SNAPSHOT_END ? TAKE_MOVE
	                                           : TAKE_COPY;
	const struct aps_tensor *torn;
	struct aps_ckpt *ck;

	if (srv->ckpt == NULL || job->optim.kind == APS_OPTIM_NONE)
		return;
	/* Copying: at a step, the next is due checkpoint_steps later; at the end,
	 * nothing stepped since the snapshot being copied (the finishes wait). */
	if (job->copying != NULL)
		return;
	if (!job->unsaved) { /* rank 0's broadcast, or what its last checkpoint holds */
		aps_log_debug("checkpoint", "none job=%s reason=\"%s\": no step since the last",
		              job->name, why);
		return;
	}
	if ((torn = half_stepped(job)) != NULL) {
		aps_log_warn(
		        "checkpoint",
		        "skipped job=%s reason=\"%s\" tensor=%.80s is in the middle of a step: "
		        "the last checkpoint stays",
		        job->name, why, torn->name);
		return;
	}
	if ((ck = take_snapshot(srv, job, how)) == NULL)
		return;
	job->last_ckpt_step = ck->step;
	job->unsaved = false;
	aps_log_debug("checkpoint", "queued job=%s step=%llu reason=\"%s\"", job->name,
	              (unsigned long long)ck->step, why);
	if (how == TAKE_BORROW &&
	    aps_ckpt_copy_start(srv->loop, ck, srv->snapshot_copied, srv, &job->copying) == 0)
		return;
	if (how == TAKE_BORROW) {  /* no thread for it: copied now */
		aps_ckpt_free(ck); /* which frees no borrowed array */
		free(ck);
		if ((ck = take_snapshot(srv, job, TAKE_COPY)) == NULL) {
			job->unsaved = true;
			return;
		}
	}
	aps_ckpt_queue_push(srv->ckpt, ck);
}

/* The chunks of t's step in progress whose update is in its weights: 0 between
 * steps. */
static uint32_t stepped_chunks(const struct aps_tensor *t)
{
	return t->round.kind == APS_ROUND_ALLREDUCE
	               ? t->round.chunks_finished + t->round.chunks_sealed
	               : 0;
}

/*
 * t's weights as pulls send them (job.h pulled): copied once for each update
 * count, then shared by every rank's pulls, as results are. Each pull copied
 * them before: W ranks that pulled twice without reading held 2W copies of the
 * weights, counted nowhere. In the middle of a step the copy is made again
 * once more chunks are stepped (a pull then gets some chunks stepped, as it
 * did before). Returns 0 or APS_ENOMEM.
 */
static int pulled_weights(struct aps_job *job, struct aps_tensor *t)
{
	size_t per = t->round.chunk_elems;

	if (t->pulled != NULL && t->pulled_updates == t->opt.updates &&
	    t->pulled_stepped == stepped_chunks(t))
		return 0;
	aps_tensor_forget_pulled(job, t);
	t->pulled = calloc(t->round.n_chunks, sizeof(*t->pulled));
	if (t->pulled == NULL)
		return APS_ENOMEM;
	job->overhead_bytes += t->count * sizeof(float);
	t->pulled_updates = t->opt.updates;
	t->pulled_stepped = stepped_chunks(t);
	for (uint32_t c = 0; c < t->round.n_chunks; c++) {
		size_t off = (size_t)c * per, n = t->count - off < per ? t->count - off : per;
		if ((t->pulled[c] = aps_sbuf_new(n * sizeof(float))) == NULL) {
			aps_tensor_forget_pulled(job, t);
			return APS_ENOMEM;
		}
		memcpy(t->pulled[c]->data, t->opt.weights + off, n * sizeof(float));
	}
	return 0;
}

/* WEIGHTS: the tensor's master weights in the chunks of its rounds. */
static void send_weights(struct aps_server *srv, struct aps_session *s, struct aps_tensor *t)
{
	size_t per = t->round.chunk_elems;

	if (pulled_weights(s->job, t) < 0) {
		aps_outbox_error(srv, &s->peer, APS_ENOMEM, NULL, "out of memory");
		return;
	}
	for (uint32_t c = 0; c < t->round.n_chunks; c++) {
		size_t off = (size_t)c * per;
		struct aps_msg r;
		aps_msg_init(&r, APS_MSG_WEIGHTS);
		snprintf(r.job, sizeof(r.job), "%s", s->job->name);
		r.rank = s->rank;
		r.world_size = s->job->world_size;
		r.tensor_id = t->id;
		r.updates = t->opt.updates;
		r.chunk_offset = off;
		r.chunk_count = t->pulled[c]->len / sizeof(float);
		r.total_count = t->count;
		snprintf(r.format, sizeof(r.format), "fp32");
		r.flags = s->job->no_crc ? APS_MSG_FLAG_NO_CRC : 0;
		aps_outbox_answer(srv, s, t, &r, t->pulled[c]);
		s->bytes_out += t->pulled[c]->len;
	}
}

void aps_handle_pull(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m)
{
	struct aps_tensor *t = aps_job_tensor(s->job, m->tensor_id);
	char tensor[APS_MSG_NAME_MAX + 40];
	const char *why = NULL;

	if (t == NULL || !t->registered[s->rank])
		why = "is not registered by this rank";
	else if (s->job->optim.kind == APS_OPTIM_NONE)
		why = "belongs to a job in all-reduce mode: the daemon holds no weights";
	else if (!t->opt.ready)
		why = "has no weights yet: rank 0 broadcasts them first";
	/* A pull's answers (one message a chunk) unread while it pulls again: allowed one
	 * pull's, and the chunk libzmq holds until it next writes. */
	if (why == NULL && aps_outbox_unread(srv, s, t, t->round.n_chunks + 1))
		return;
	if (why == NULL)
		return send_weights(srv, s, t);
	srv->counters.bad_state++;
	if (t != NULL)
		snprintf(tensor, sizeof(tensor), "tensor '%s' (id %u)", t->name, m->tensor_id);
	else
		snprintf(tensor, sizeof(tensor), "tensor id %u", m->tensor_id);
	aps_outbox_error(srv, &s->peer, APS_EPROTO, m, "pull of %s: it %s", tensor, why);
}
