/*
 * Starting calls, on the caller's thread: checks, the APS exponent and the
 * quantization of the caller's buffer (or, in global mode, the local half of
 * the exponent exchange), then the request is sent (iothread.c: by this thread
 * when it is the only call, else by the I/O thread). Waiting for a call, which
 * a lone call's caller spends doing the I/O thread's work. The blocking calls
 * are a start and a wait.
 */
#include "worker/client_impl.h"

#include "common/codec.h"
#include "common/err.h"
#include "common/rules.h"
#include "worker/api_error.h"
#include "worker/options.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int call_timeout(const struct aps_client *c, int32_t timeout_ms)
{
	return timeout_ms > 0 ? timeout_ms : c->timeout_ms;
}

static struct aps_request *new_request(struct aps_client *c, enum request_kind kind,
                                       int32_t timeout_ms)
{
	struct aps_request *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	r->owner = c;
	r->kind = kind;
	r->timeout_ms = call_timeout(c, timeout_ms);
	return r;
}

int aps_request_submit(struct aps_client *c, struct aps_request *r, aps_request **out)
{
	int ret = 0;
	bool alone = false;

	pthread_mutex_lock(&c->lock);
	if (c->fatal < 0) {
		ret = aps_api_fail(c->fatal, "%s", c->fatal_text);
	} else if (c->pending < 0) {
		ret = aps_api_fail(c->pending, "%s", c->pending_text);
		c->pending = 0;
	} else {
		if (r->kind == REQ_ALLREDUCE || r->kind == REQ_BROADCAST || r->kind == REQ_PULL)
			c->tensors[r->tensor_id].busy = r;
		aps_client_enqueue(c, r);
		alone = c->calls == 1;
	}
	pthread_mutex_unlock(&c->lock);
	if (ret < 0) {
		aps_request_free(r);
		return ret;
	}
	/* A lone call goes from this thread when the I/O thread is idle; with
	 * others in flight the I/O thread sends it, while this thread codes on. */
	if (alone)
		aps_client_kick(c);
	else
		aps_client_wake(c);
	*out = r;
	return aps_api_ok();
}

/* 0, or why r cannot be waited for or asked about here. */
static int check_request(const struct aps_request *r)
{
	if (r == NULL)
		return aps_api_fail(APS_EINVAL, "request is NULL");
	if (r->owner->pid != getpid())
		return aps_api_fail(APS_ECLOSED, "the request belongs to process %d",
		                    (int)r->owner->pid);
	return 0;
}

int aps_conn_wait(struct aps_request *r, uint32_t *tensor_id, uint64_t *updates)
{
	struct aps_client *c;
	int result = check_request(r);

	if (result < 0)
		return result;
	c = r->owner;
	aps_client_drive(c, r);
	pthread_mutex_lock(&c->lock);
	while (!r->done) {
		pthread_cond_wait(&c->done_cv, &c->lock);
		/* Another call ended or the client joined again: r alone now is this
		 * thread's to drive (a quiet I/O thread leaves a lone call's replies to
		 * its caller). */
		if (!r->done && c->calls == 1) {
			pthread_mutex_unlock(&c->lock);
			aps_client_drive(c, r);
			pthread_mutex_lock(&c->lock);
		}
	}
	pthread_mutex_unlock(&c->lock);
	result = r->result;
	if (result < 0)
		aps_api_fail(result, "%s", r->error);
	else
		aps_api_ok();
	if (result == 0 && tensor_id != NULL)
		*tensor_id = r->tensor_id;
	if (result == 0 && updates != NULL)
		*updates = r->step; /* a pull: the update count of the weights it brought */
	aps_request_free(r);
	return result;
}

int aps_conn_done(const struct aps_request *r)
{
	int ret = check_request(r);
	bool done;

	if (ret < 0)
		return ret;
	aps_client_look(r->owner);
	pthread_mutex_lock(&r->owner->lock);
	done = r->done;
	pthread_mutex_unlock(&r->owner->lock);
	return done ? 1 : 0;
}

/* Error feedback: quantize buf plus what the last step lost (the tensor is ours: busy). */
static int add_residual(struct aps_client *c, struct aps_request *r)
{
	struct client_tensor *t;

	/* The table may grow under the I/O thread; the residual itself never moves. */
	pthread_mutex_lock(&c->lock);
	t = &c->tensors[r->tensor_id];
	if (t->residual == NULL)
		t->residual = calloc(r->count, sizeof(float));
	r->residual = t->residual;
	pthread_mutex_unlock(&c->lock);
	if (r->residual == NULL || (r->corrected = malloc(r->count * sizeof(float))) == NULL)
		return APS_ENOMEM;
	for (uint64_t i = 0; i < r->count; i++)
		r->corrected[i] = r->buf[i] + r->residual[i];
	r->src = r->corrected;
	return 0;
}

/* codec_threads: the scan in ranges over the client's pool. */
#define SCAN_RANGE (1u << 20)

struct scan_parts {
	const float *x;
	size_t n;
	float max[APS_CLIENT_CODEC_THREADS_MAX];
	bool nonfinite[APS_CLIENT_CODEC_THREADS_MAX];
	size_t parts;
};

static void scan_part(void *ctx, size_t part)
{
	struct scan_parts *s = ctx;

	for (size_t off = part * SCAN_RANGE; off < s->n; off += s->parts * SCAN_RANGE) {
		size_t m = s->n - off < SCAN_RANGE ? s->n - off : SCAN_RANGE;
		bool nf = false;
		float max = aps_codec_scan(s->x + off, m, &nf);
		s->max[part] = max > s->max[part] ? max : s->max[part];
		s->nonfinite[part] |= nf;
	}
}

/* aps_codec_scan of x, on the pool when there is one and x is large. */
static float scan(struct aps_client *c, const float *x, size_t n, bool *nonfinite)
{
	struct scan_parts s = { .x = x, .n = n };
	float max = 0;

	if (c->pool == NULL || n < 2 * (size_t)SCAN_RANGE)
		return aps_codec_scan(x, n, nonfinite);
	s.parts = (n + SCAN_RANGE - 1) / SCAN_RANGE;
	if (s.parts > c->codec_threads)
		s.parts = c->codec_threads;
	aps_pool_run(c->pool, s.parts, scan_part, &s);
	*nonfinite = false;
	for (size_t p = 0; p < s.parts; p++) {
		max = s.max[p] > max ? s.max[p] : max;
		*nonfinite |= s.nonfinite[p];
	}
	return max;
}

/*
 * The APS exponent from maxabs, the largest |value| of what is sent, or in
 * global mode this rank's half of the exchange.
 */
static int scale(struct aps_client *c, struct aps_request *r, float maxabs)
{
	r->scale_exp = 0;
	if (c->scaling == APS_SCALING_NONE || c->scaling == APS_SCALING_BLOCK ||
	    aps_format_is_fp32(&r->fmt))
		return 0;
	if (c->scaling == APS_SCALING_LOCAL)
		return aps_scale_local(&r->fmt, maxabs, &r->scale_exp);
	return aps_scale_global_exponent(maxabs, (int)c->world_size, &r->exponent);
}

/* Checks the tensor of a data call and fills r's tensor fields (lock held). */
static int tensor_of(struct aps_client *c, struct aps_request *r, const void *buf, uint64_t count)
{
	struct client_tensor *t;

	if (r->tensor_id >= c->n_tensors || c->tensors[r->tensor_id].count == 0)
		return aps_api_fail(APS_EINVAL, "tensor id %u is not registered", r->tensor_id);
	t = &c->tensors[r->tensor_id];
	if (buf == NULL || count != t->count)
		return aps_api_fail(APS_EINVAL,
		                    "tensor '%.200s' has %llu elements, the call passes %llu%s",
		                    t->name, (unsigned long long)t->count,
		                    (unsigned long long)count, buf == NULL ? " and no buffer" : "");
	if (t->busy != NULL)
		return aps_api_fail(APS_EBUSY, "tensor '%.200s' has a call in flight: wait for it",
		                    t->name);
	r->count = count;
	r->chunk_elems = t->chunk_elems;
	r->step = t->step;
	r->fmt = t->format;
	snprintf(r->name, sizeof(r->name), "%s", t->name);
	return 0;
}

int aps_request_data(struct aps_client *c, enum request_kind kind, uint32_t tensor_id, float *buf,
                     const void *data, uint64_t count, int32_t timeout_ms, struct aps_request **out)
{
	struct aps_request *r;
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	if ((r = new_request(c, kind, timeout_ms)) == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	r->tensor_id = tensor_id;
	r->buf = buf;
	r->src = buf;
	pthread_mutex_lock(&c->lock);
	ret = tensor_of(c, r, data, count);
	pthread_mutex_unlock(&c->lock);
	if (ret < 0) {
		free(r);
		return ret;
	}
	*out = r;
	return 0;
}

static int refuse_nonfinite(struct aps_request *r, size_t nonfinite)
{
	int ret = aps_api_fail(APS_ENONFINITE,
	                       "tensor '%.200s' holds %zu NaN or inf values; nothing was sent",
	                       r->name, nonfinite);

	free(r);
	return ret;
}

bool aps_client_optimize_mode(const struct aps_client *c)
{
	return c->optimizer[0] != '\0';
}

/*
 * A tensor of several chunks leaves batch by batch: queued first, each batch
 * coded (on this thread, or over the codec pool with this thread in it) and
 * published (r->encoded), the I/O thread woken to send it while the next is
 * coded. Its results may come back meanwhile: they land in other chunks'
 * elements of buf.
 */
static int stream(struct aps_client *c, struct aps_request *r, aps_request **out)
{
	uint32_t chunks = aps_request_chunks(r), batch = aps_request_stream_batch(c, r);
	uint64_t t0 = c->trace != NULL ? aps_trace_now() : 0;
	int ret;

	if (aps_request_alloc_codes(c, r) < 0) {
		aps_request_free(r);
		return aps_api_fail(APS_ENOMEM, "out of memory for the codes");
	}
	r->coding = true;
	if ((ret = aps_request_submit(c, r, out)) < 0)
		return ret;
	for (uint32_t i = 0; i < chunks; i += batch) {
		aps_request_encode_chunks(c, r, i, chunks - i < batch ? chunks : i + batch);
		atomic_store_explicit(&c->coded, true, memory_order_release);
		aps_client_wake(c);
	}
	pthread_mutex_lock(&c->lock);
	r->coding = false;
	if (r->done && c->tensors[r->tensor_id].busy == r) /* it failed while we coded */
		c->tensors[r->tensor_id].busy = NULL;
	pthread_mutex_unlock(&c->lock);
	aps_trace_stage(c->trace, "quantize", t0,
	                &(struct aps_trace_at){ c->job, r->name, r->step, 0 });
	return ret;
}

/*
 * The gradient half of an all-reduce, of a partition of one (whole_max: the
 * whole tensor's max, scanned by the caller) or of an optimizer step: the
 * scan, error feedback, the exponent and the codes; then r is queued.
 */
static int start_reduce(aps_client *c, struct aps_request *r, const float *whole_max,
                        aps_request **out)
{
	bool nonfinite = false;
	float maxabs;
	uint64_t t0;

	if (whole_max != NULL) {
		maxabs = *whole_max; /* a partition: the caller scanned the whole tensor */
	} else {
		/* One pass finds the exponent's max and refuses inf and NaN. */
		t0 = c->trace != NULL ? aps_trace_now() : 0;
		maxabs = scan(c, r->src, r->count, &nonfinite);
		aps_trace_stage(c->trace, "scan", t0,
		                &(struct aps_trace_at){ c->job, r->name, r->step, 0 });
		if (nonfinite)
			return refuse_nonfinite(r, aps_codec_count_nonfinite_f32(r->src, r->count));
	}
	if (c->error_feedback && !aps_format_is_fp32(&r->fmt)) {
		if (add_residual(c, r) < 0) {
			aps_request_free(r);
			return aps_api_fail(APS_ENOMEM, "out of memory for error feedback");
		}
		maxabs = aps_codec_maxabs(r->src, r->count); /* of what is sent: the sum */
	}
	scale(c, r, maxabs);
	/* Global mode encodes when the daemon has sent the shared exponent. */
	if (c->scaling == APS_SCALING_GLOBAL && !aps_format_is_fp32(&r->fmt))
		return aps_request_submit(c, r, out);
	if (aps_request_chunks(r) > 1)
		return stream(c, r, out);
	if (aps_request_encode(c, r) < 0) {
		aps_request_free(r);
		return aps_api_fail(APS_ENOMEM, "out of memory for the codes");
	}
	return aps_request_submit(c, r, out);
}

int aps_client_allreduce_part(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                              int32_t timeout_ms, const float *whole_max, aps_request **out)
{
	struct aps_request *r = NULL; /* set by data_request when it returns 0 */
	int ret;

	if (out == NULL)
		return aps_api_fail(APS_EINVAL, "request pointer is NULL");
	if (c != NULL && aps_client_optimize_mode(c))
		return aps_api_fail(APS_EINVAL,
		                    "the job is in optimize mode (%s): step it on the daemon "
		                    "(aps_client_step; Client.step in Python)",
		                    c->optimizer);
	ret = aps_request_data(c, REQ_ALLREDUCE, tensor_id, buf, buf, count, timeout_ms, &r);
	if (ret < 0)
		return ret;
	return start_reduce(c, r, whole_max, out);
}

int aps_client_step_start(aps_client *c, uint32_t tensor_id, const float *grad, float *weights,
                          uint64_t count, float lr, int32_t timeout_ms, aps_request **out)
{
	struct aps_request *r = NULL; /* set by data_request when it returns 0 */
	int ret;

	if (out == NULL || weights == NULL)
		return aps_api_fail(APS_EINVAL, "request or weights pointer is NULL");
	if (c != NULL && !aps_client_optimize_mode(c))
		return aps_api_fail(APS_EINVAL, "the job is in all-reduce mode: name an optimizer "
		                                "in the client's options to step on the daemon");
	if (!isfinite(lr) || lr < 0)
		return aps_api_fail(APS_EINVAL, "learning rate %g is not finite and >= 0",
		                    (double)lr);
	ret = aps_request_data(c, REQ_ALLREDUCE, tensor_id, (float *)grad, (float *)grad, count,
	                       timeout_ms, &r);
	if (ret < 0)
		return ret;
	r->update = true;
	r->weights = weights;
	r->lr = lr;
	return start_reduce(c, r, NULL, out);
}

int aps_client_step(aps_client *c, uint32_t tensor_id, const float *grad, float *weights,
                    uint64_t count, float lr, int32_t timeout_ms)
{
	aps_request *r;
	int ret = aps_client_step_start(c, tensor_id, grad, weights, count, lr, timeout_ms, &r);

	return ret < 0 ? ret : aps_conn_wait(r, NULL, NULL);
}

int aps_client_pull(aps_client *c, uint32_t tensor_id, float *weights, uint64_t count,
                    int32_t timeout_ms, uint64_t *updates)
{
	struct aps_request *r = NULL; /* set by data_request when it returns 0 */
	int ret;

	if (c != NULL && !aps_client_optimize_mode(c))
		return aps_api_fail(APS_EINVAL, "the job is in all-reduce mode: the daemon holds "
		                                "no weights");
	ret = aps_request_data(c, REQ_PULL, tensor_id, weights, weights, count, timeout_ms, &r);
	if (ret < 0)
		return ret;
	ret = aps_request_submit(c, r, &r);
	if (ret < 0)
		return ret;
	return aps_conn_wait(r, NULL, updates);
}

int aps_conn_tensor_updates(aps_client *c, uint32_t tensor_id, uint64_t *updates)
{
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	if (updates == NULL)
		return aps_api_fail(APS_EINVAL, "updates is NULL");
	pthread_mutex_lock(&c->lock);
	if (tensor_id < c->n_tensors && c->tensors[tensor_id].count > 0)
		*updates = c->tensors[tensor_id].updates;
	else
		ret = aps_api_fail(APS_EINVAL, "tensor id %u is not registered", tensor_id);
	pthread_mutex_unlock(&c->lock);
	return ret < 0 ? ret : aps_api_ok();
}

int aps_conn_broadcast_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                             int32_t timeout_ms, aps_request **out)
{
	struct aps_request *r = NULL; /* set by data_request when it returns 0 */
	int ret;

	if (out == NULL)
		return aps_api_fail(APS_EINVAL, "request pointer is NULL");
	ret = aps_request_data(c, REQ_BROADCAST, tensor_id, buf, buf, count, timeout_ms, &r);
	if (ret < 0)
		return ret;
	r->fmt = aps_format_fp32();
	/* Only the root sends values (finite ones: apsd refuses the others); the
	 * others ask. */
	size_t nonfinite = c->rank == 0 ? aps_codec_count_nonfinite_f32(buf, r->count) : 0;
	if (nonfinite > 0)
		return refuse_nonfinite(r, nonfinite);
	if (c->rank == 0 && aps_request_encode(c, r) < 0) {
		aps_request_free(r);
		return aps_api_fail(APS_ENOMEM, "out of memory");
	}
	return aps_request_submit(c, r, out);
}

int aps_client_barrier_start(aps_client *c, int32_t timeout_ms, aps_request **out)
{
	struct aps_request *r;
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	if ((r = new_request(c, REQ_BARRIER, timeout_ms)) == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	return aps_request_submit(c, r, out);
}

int aps_conn_barrier(aps_client *c, int32_t timeout_ms)
{
	aps_request *r;
	int ret = aps_client_barrier_start(c, timeout_ms, &r);

	return ret < 0 ? ret : aps_conn_wait(r, NULL, NULL);
}

int aps_check_register_args(const char *name, uint64_t count, const uint32_t *tensor_id)
{
	if (name == NULL || name[0] == '\0' || strlen(name) > APS_MSG_NAME_MAX || count == 0 ||
	    tensor_id == NULL)
		return aps_api_fail(APS_EINVAL,
		                    "a tensor needs a name of 1 to %d bytes, a count of at least 1 "
		                    "and an id pointer",
		                    APS_MSG_NAME_MAX);
	if (!aps__visible_ascii(name))
		return aps_api_fail(APS_EINVAL, "tensor name '%.255s' is not visible ASCII", name);
	if (count > APS_MSG_ELEMENTS_MAX)
		return aps_api_fail(
		        APS_EINVAL, "tensor '%.255s' has %llu elements, apsd takes %llu", name,
		        (unsigned long long)count, (unsigned long long)APS_MSG_ELEMENTS_MAX);
	return 0;
}

/* The I/O thread fills the table when REGISTERED arrives. */
int aps_client_register_as(aps_client *c, const char *name, uint64_t count, const char *format,
                           uint32_t *tensor_id)
{
	struct aps_request *r;
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	if ((ret = aps_check_register_args(name, count, tensor_id)) < 0)
		return ret;
	if ((r = new_request(c, REQ_REGISTER, 0)) == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	snprintf(r->name, sizeof(r->name), "%s", name);
	/* The format asked for, else the one the client's rules name for this tensor. */
	r->reg_fmt = c->format;
	if (format == NULL || aps_format_parse(format, &r->reg_fmt) < 0)
		aps_rules_match(c->rules, name, &r->reg_fmt);
	r->count = count;
	ret = aps_request_submit(c, r, &r);
	if (ret < 0)
		return ret;
	return aps_conn_wait(r, tensor_id, NULL);
}
