/*
 * The parent client of several apsd shards. It holds no socket: each shard
 * is an ordinary client (client.c) with its own connection and I/O thread,
 * and each shard's apsd is independent. A tensor is registered as one tensor
 * per partition on the partition's shard ("name" when it is not cut, else
 * "name#i"); a call starts one request per partition and the parent request
 * waits for all of them. Scaling stays per tensor: each partition is scaled
 * by the whole tensor's max |x| (local mode), and in global mode each rank
 * sends the whole tensor's exponent for every partition, so every shard
 * takes the same max and every partition gets the same k. A barrier is a
 * barrier on every shard. What this file does not own: the assignment
 * (shards.c), the wire (iothread.c).
 */
#include "worker/sharded.h"

#include "common/codec.h"
#include "common/err.h"
#include "common/rules.h"
#include "worker/api_error.h"
#include "worker/client_impl.h"
#include "worker/shards.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PART_SUFFIX_MAX 11 /* "#" and up to 10 digits */
#define DETAIL_MAX      512

struct sharded_tensor {
	char name[APS_MSG_NAME_MAX + 1];
	uint64_t count;
	uint32_t first, n_parts; /* its parts: parts[first .. first + n_parts) */
};

struct aps_sharded {
	uint32_t n;
	aps_client *shard[APS_SHARDS_MAX];
	struct aps_shard_map map;
	struct aps_format format; /* the uplink format the client asks for */
	char rules[APS_RULES_MAX];
	bool whole_max; /* partitions scale by the whole tensor's max (not with error feedback) */
	struct sharded_tensor *tensors;
	uint32_t n_tensors;
	struct aps_shard_part *parts;
	uint32_t *part_ids; /* each part's tensor id on its shard */
	uint32_t n_parts;
};

/* The calling thread's last error of code without its "<strerror>: " head. */
static const char *detail_of(int code)
{
	const char *last = aps_last_error(), *name = aps_strerror(code);
	size_t skip = strlen(name);

	if (strncmp(last, name, skip) == 0 && last[skip] == ':' && last[skip + 1] == ' ')
		last += skip + 2;
	return last;
}

/* Records the calling thread's last error of code again, behind prefix. */
static int refail(int code, const char *prefix)
{
	char detail[DETAIL_MAX];

	snprintf(detail, sizeof(detail), "%s", detail_of(code));
	return aps_api_fail(code, "%s%s", prefix, detail);
}

static int join_shard(struct aps_sharded *sh, const struct aps_client_opts *o, uint32_t i,
                      const char *endpoint)
{
	const char *path = o->trace != NULL ? o->trace : getenv("APS_TRACE");
	struct aps_client_opts one = *o;
	char trace[1024], prefix[320];
	int ret;

	one.endpoint = endpoint;
	one.trace = "";
	if (path != NULL && path[0] != '\0') { /* one timeline per shard's client */
		snprintf(trace, sizeof(trace), "%s.shard%u", path, i);
		one.trace = trace;
	}
	ret = aps_conn_new(&sh->shard[i], &one);
	if (ret < 0) {
		snprintf(prefix, sizeof(prefix), "shard %u (%.255s): ", i, endpoint);
		return refail(ret, prefix);
	}
	return 0;
}

static void free_sharded(struct aps_client *c)
{
	struct aps_sharded *sh = c->sharded;

	for (uint32_t i = 0; i < sh->n; i++)
		aps_conn_close(sh->shard[i]);
	free(sh->tensors);
	free(sh->parts);
	free(sh->part_ids);
	free(sh);
	free(c);
}

static int setup(struct aps_client *c, const struct aps_client_opts *o,
                 char (*eps)[APS_SHARDS_ENDPOINT_MAX], uint32_t n)
{
	struct aps_sharded *sh = c->sharded;
	uint64_t part_bytes = o->partition_bytes;
	int ret;

	/* Block scaling: partitions start on a block of every size (64 elements), so
	 * that their blocks are one daemon's. */
	if (o->scaling == APS_SCALING_MODE_BLOCK && part_bytes != 0)
		part_bytes = part_bytes < 256 ? 256 : part_bytes & ~(uint64_t)255;
	c->pid = getpid();
	c->rank = o->rank;
	c->world_size = o->world_size;
	snprintf(c->endpoint, sizeof(c->endpoint), "%.255s", o->endpoint);
	if (aps_shards_init(&sh->map, n, part_bytes) < 0)
		return aps_api_fail(APS_EINVAL, "%u shards: at most %d", n, APS_SHARDS_MAX);
	sh->whole_max = o->error_feedback == 0;
	snprintf(sh->rules, sizeof(sh->rules), "%s", o->rules != NULL ? o->rules : "");
	for (uint32_t i = 0; i < n; i++) {
		if ((ret = join_shard(sh, o, i, eps[i])) < 0)
			return ret;
		sh->n = i + 1;
	}
	/* every shard's client accepted o, so the format parses */
	aps_format_parse(o->format, &sh->format);
	return 0;
}

int aps_sharded_new(aps_client **out, const struct aps_client_opts *o)
{
	char(*eps)[APS_SHARDS_ENDPOINT_MAX] = malloc(APS_SHARDS_MAX * sizeof(*eps));
	struct aps_client *c = calloc(1, sizeof(*c));
	uint32_t n = 0;
	int ret;

	if (eps == NULL || c == NULL || (c->sharded = calloc(1, sizeof(*c->sharded))) == NULL) {
		ret = aps_api_fail(APS_ENOMEM, "out of memory");
	} else if (out == NULL) {
		ret = aps_api_fail(APS_EINVAL, "out is NULL");
	} else if (aps_shards_parse(o->endpoint, eps, APS_SHARDS_MAX, &n) < 0) {
		ret = aps_api_fail(APS_EINVAL,
		                   "endpoint list '%.200s': 1 to %d endpoints of 1 to %d bytes, "
		                   "separated by commas",
		                   o->endpoint, APS_SHARDS_MAX, APS_SHARDS_ENDPOINT_MAX - 1);
	} else {
		ret = setup(c, o, eps, n);
	}
	free(eps);
	if (ret < 0) {
		if (c != NULL && c->sharded != NULL)
			free_sharded(c);
		else
			free(c);
		return ret;
	}
	*out = c;
	return aps_api_ok();
}

static struct sharded_tensor *find_tensor(struct aps_sharded *sh, const char *name, uint32_t *id)
{
	for (uint32_t i = 0; i < sh->n_tensors; i++) {
		if (strcmp(sh->tensors[i].name, name) == 0) {
			*id = i;
			return &sh->tensors[i];
		}
	}
	return NULL;
}

/* Room for one more tensor of n parts; false when out of memory. */
static bool grow(struct aps_sharded *sh, uint32_t n)
{
	struct sharded_tensor *t = realloc(sh->tensors, (sh->n_tensors + 1) * sizeof(*t));
	struct aps_shard_part *p;
	uint32_t *ids;

	if (t == NULL)
		return false;
	sh->tensors = t;
	if ((p = realloc(sh->parts, (sh->n_parts + n) * sizeof(*p))) == NULL)
		return false;
	sh->parts = p;
	if ((ids = realloc(sh->part_ids, (sh->n_parts + n) * sizeof(*ids))) == NULL)
		return false;
	sh->part_ids = ids;
	return true;
}

static int register_parts(struct aps_sharded *sh, const char *name, uint32_t first, uint32_t n,
                          const struct aps_format *f)
{
	char part[APS_MSG_NAME_MAX + PART_SUFFIX_MAX + 1], prefix[64];
	int ret;

	for (uint32_t i = 0; i < n; i++) {
		const struct aps_shard_part *p = &sh->parts[first + i];
		if (n > 1)
			snprintf(part, sizeof(part), "%s#%u", name, i);
		else
			snprintf(part, sizeof(part), "%s", name);
		ret = aps_client_register_as(sh->shard[p->shard], part, p->count, f->name,
		                             &sh->part_ids[first + i]);
		if (ret < 0) {
			snprintf(prefix, sizeof(prefix), "shard %u: ", p->shard);
			return refail(ret, prefix);
		}
	}
	return 0;
}

int aps_sharded_register(aps_client *c, const char *name, uint64_t count, uint32_t *tensor_id)
{
	struct aps_sharded *sh = c->sharded;
	struct aps_shard_map before = sh->map;
	struct sharded_tensor *t;
	struct aps_format f = sh->format;
	uint32_t n, id;
	int ret;

	if ((ret = aps_check_register_args(name, count, tensor_id)) < 0)
		return ret;
	if ((t = find_tensor(sh, name, &id)) != NULL) {
		if (t->count != count)
			return aps_api_fail(
			        APS_EMISMATCH, "tensor '%.200s' has %llu elements, not %llu", name,
			        (unsigned long long)t->count, (unsigned long long)count);
		*tensor_id = id;
		return aps_api_ok();
	}
	n = aps_shards_n_parts(&sh->map, count);
	if (n > 1 && strlen(name) > APS_MSG_NAME_MAX - PART_SUFFIX_MAX)
		return aps_api_fail(APS_EINVAL,
		                    "tensor '%.200s' is cut into %u partitions: its name "
		                    "may have at most %d bytes",
		                    name, n, APS_MSG_NAME_MAX - PART_SUFFIX_MAX);
	if (!grow(sh, n))
		return aps_api_fail(APS_ENOMEM, "out of memory");
	aps_rules_match(sh->rules, name, &f); /* the bytes it will take, for the balance */
	aps_shards_assign(&sh->map, count, f.bits, sh->parts + sh->n_parts);
	if ((ret = register_parts(sh, name, sh->n_parts, n, &f)) < 0) {
		sh->map = before;
		return ret;
	}
	t = &sh->tensors[sh->n_tensors];
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->count = count;
	t->first = sh->n_parts;
	t->n_parts = n;
	sh->n_parts += n;
	*tensor_id = sh->n_tensors++;
	return aps_api_ok();
}

static int tensor_of(struct aps_sharded *sh, uint32_t id, const float *buf, uint64_t count,
                     const struct sharded_tensor **out)
{
	const struct sharded_tensor *t;

	if (id >= sh->n_tensors)
		return aps_api_fail(APS_EINVAL, "tensor id %u is not registered", id);
	t = &sh->tensors[id];
	if (buf == NULL || count != t->count)
		return aps_api_fail(APS_EINVAL,
		                    "tensor '%.200s' has %llu elements, the call passes %llu%s",
		                    t->name, (unsigned long long)t->count,
		                    (unsigned long long)count, buf == NULL ? " and no buffer" : "");
	*out = t;
	return 0;
}

static struct aps_request *new_parent(struct aps_client *c, uint32_t n)
{
	struct aps_request *r = calloc(1, sizeof(*r));

	if (r == NULL)
		return NULL;
	r->parts = calloc(n, sizeof(*r->parts));
	if (r->parts == NULL) {
		free(r);
		return NULL;
	}
	r->owner = c;
	r->kind = REQ_SHARDED;
	return r;
}

/* Ends a call whose part failed to start: waits for the parts already started. */
static int abandon(struct aps_request *r, int code)
{
	char detail[DETAIL_MAX];

	snprintf(detail, sizeof(detail), "%s", detail_of(code));
	aps_sharded_wait(r);
	return aps_api_fail(code, "%s", detail);
}

static int start_parts(struct aps_client *c, const struct sharded_tensor *t, float *buf,
                       int32_t timeout_ms, const float *maxabs, aps_request **out)
{
	struct aps_sharded *sh = c->sharded;
	struct aps_request *r = new_parent(c, t->n_parts);
	int ret;

	if (r == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < t->n_parts; i++) {
		const struct aps_shard_part *p = &sh->parts[t->first + i];
		aps_client *one = sh->shard[p->shard];
		uint32_t id = sh->part_ids[t->first + i];
		if (maxabs == NULL) /* a broadcast */
			ret = aps_conn_broadcast_start(one, id, buf + p->offset, p->count,
			                               timeout_ms, &r->parts[i]);
		else
			ret = aps_client_allreduce_part(one, id, buf + p->offset, p->count,
			                                timeout_ms, sh->whole_max ? maxabs : NULL,
			                                &r->parts[i]);
		if (ret < 0)
			return abandon(r, ret);
		r->n_parts = i + 1;
	}
	*out = r;
	return aps_api_ok();
}

int aps_sharded_allreduce_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                                int32_t timeout_ms, aps_request **out)
{
	const struct sharded_tensor *t = NULL;
	bool nonfinite;
	float maxabs;
	int ret;

	if (out == NULL)
		return aps_api_fail(APS_EINVAL, "request pointer is NULL");
	if ((ret = tensor_of(c->sharded, tensor_id, buf, count, &t)) < 0)
		return ret;
	maxabs = aps_codec_scan(buf, count, &nonfinite); /* one pass: the max, and inf or NaN */
	if (nonfinite)
		return aps_api_fail(APS_ENONFINITE,
		                    "tensor '%.200s' holds %zu NaN or inf values; nothing was sent",
		                    t->name, aps_codec_count_nonfinite_f32(buf, count));
	return start_parts(c, t, buf, timeout_ms, &maxabs, out);
}

int aps_sharded_broadcast_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                                int32_t timeout_ms, aps_request **out)
{
	const struct sharded_tensor *t = NULL;
	int ret;

	if (out == NULL)
		return aps_api_fail(APS_EINVAL, "request pointer is NULL");
	if ((ret = tensor_of(c->sharded, tensor_id, buf, count, &t)) < 0)
		return ret;
	return start_parts(c, t, buf, timeout_ms, NULL, out);
}

/* Codes calls: the partitions of a tensor have their own chunks on their
 * shards; put end to end they are the tensor's layout when every partition but
 * the last is whole chunks of one size and every shard answers in one format. */
struct parts_layout {
	struct aps_codes_layout send, result; /* the whole tensor's */
	struct aps_codes_layout *part_send, *part_result;
	uint32_t *first_chunk; /* each part's first chunk in the whole */
};

static bool alike(const struct aps_codes_layout *a, const struct aps_codes_layout *b)
{
	return strcmp(a->format, b->format) == 0 && a->chunk_elems == b->chunk_elems &&
	       a->block == b->block;
}

/* Adds part i's layout p to the whole w (the first part starts it). */
static bool append(struct aps_codes_layout *w, const struct aps_codes_layout *p, uint32_t i,
                   uint32_t n)
{
	bool last = i + 1 == n;

	if (i == 0) {
		*w = *p;
		w->count = w->chunks = w->bytes = 0;
	} else if (!(alike(w, p) || (last && p->chunks == 1 && p->count <= w->chunk_elems &&
	                             strcmp(w->format, p->format) == 0 && w->block == p->block))) {
		return false;
	}
	if (!last && p->count % w->chunk_elems != 0)
		return false;
	w->count += p->count;
	w->chunks += p->chunks;
	w->bytes += p->bytes;
	return true;
}

static void free_layout(struct parts_layout *l)
{
	free(l->part_send);
	free(l->part_result);
	free(l->first_chunk);
}

static int parts_layout(struct aps_sharded *sh, uint32_t tensor_id, struct parts_layout *l)
{
	const struct sharded_tensor *t;
	int ret;

	memset(l, 0, sizeof(*l));
	if (tensor_id >= sh->n_tensors)
		return aps_api_fail(APS_EINVAL, "tensor id %u is not registered", tensor_id);
	t = &sh->tensors[tensor_id];
	l->part_send = calloc(t->n_parts, sizeof(*l->part_send));
	l->part_result = calloc(t->n_parts, sizeof(*l->part_result));
	l->first_chunk = calloc(t->n_parts, sizeof(*l->first_chunk));
	if (l->part_send == NULL || l->part_result == NULL || l->first_chunk == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < t->n_parts; i++) {
		const struct aps_shard_part *p = &sh->parts[t->first + i];
		ret = aps_conn_codes_layout(sh->shard[p->shard], sh->part_ids[t->first + i],
		                            &l->part_send[i], &l->part_result[i]);
		if (ret < 0)
			return refail(ret, "a shard: ");
		l->first_chunk[i] = l->send.chunks;
		if (!append(&l->send, &l->part_send[i], i, t->n_parts) ||
		    !append(&l->result, &l->part_result[i], i, t->n_parts))
			return aps_api_fail(
			        APS_EINVAL,
			        "tensor '%.200s': its partitions are not whole chunks of "
			        "one format on every shard (codes calls need "
			        "partition_bytes a multiple of the daemons' chunk_bytes, "
			        "and the shards alike)",
			        t->name);
	}
	return 0;
}

int aps_sharded_codes_layout(aps_client *c, uint32_t tensor_id, struct aps_codes_layout *send,
                             struct aps_codes_layout *result)
{
	struct parts_layout l;
	int ret = parts_layout(c->sharded, tensor_id, &l);

	if (ret == 0) {
		if (send != NULL)
			*send = l.send;
		if (result != NULL)
			*result = l.result;
	}
	free_layout(&l);
	return ret < 0 ? ret : aps_api_ok();
}

/* Part i's slice of call, as one connection's codes call. */
static struct aps_codes_call part_call(const struct aps_codes_call *call,
                                       const struct parts_layout *l, uint32_t i)
{
	struct aps_codes_call p = *call;
	uint32_t first = l->first_chunk[i];

	p.codes = call->codes + (uint64_t)first * l->send.chunk_bytes;
	p.codes_len = l->part_send[i].bytes;
	p.result = call->result + (uint64_t)first * l->result.chunk_bytes;
	p.result_len = l->part_result[i].bytes;
	p.result_exps = call->result_exps + first;
	p.n_result_exps = l->part_result[i].chunks;
	p.flushed = call->n_flushed > first ? call->flushed + first : NULL;
	p.n_flushed = call->n_flushed > first ? call->n_flushed - first : 0;
	if (p.n_flushed > l->part_send[i].chunks)
		p.n_flushed = l->part_send[i].chunks;
	return p;
}

int aps_sharded_codes_start(aps_client *c, uint32_t tensor_id, const struct aps_codes_call *call,
                            bool update, float lr, int32_t timeout_ms, aps_request **out)
{
	struct aps_sharded *sh = c->sharded;
	const struct sharded_tensor *t;
	struct aps_request *r = NULL;
	struct parts_layout l;
	int ret;

	(void)lr;
	if (out == NULL || call == NULL || call->codes == NULL || call->result == NULL ||
	    call->result_exps == NULL || (call->n_flushed > 0 && call->flushed == NULL))
		return aps_api_fail(APS_EINVAL, "request, call or one of its buffers is NULL");
	if (update)
		return aps_api_fail(APS_EINVAL,
		                    "optimize mode serves one daemon, not several shards");
	if ((ret = parts_layout(sh, tensor_id, &l)) < 0)
		goto out;
	/* The whole call's lengths first: the parts are slices of its buffers. */
	if (call->codes_len != l.send.bytes || call->result_len < l.result.bytes ||
	    call->n_result_exps < l.result.chunks || call->n_flushed > l.send.chunks) {
		ret = aps_api_fail(APS_EINVAL,
		                   "tensor '%.200s' takes %llu bytes of codes and answers in %llu "
		                   "bytes and %u exponents; the call passes %llu, %llu and %u",
		                   sh->tensors[tensor_id].name, (unsigned long long)l.send.bytes,
		                   (unsigned long long)l.result.bytes, l.result.chunks,
		                   (unsigned long long)call->codes_len,
		                   (unsigned long long)call->result_len, call->n_result_exps);
		goto out;
	}
	t = &sh->tensors[tensor_id];
	if ((r = new_parent(c, t->n_parts)) == NULL) {
		ret = aps_api_fail(APS_ENOMEM, "out of memory");
		goto out;
	}
	for (uint32_t i = 0; i < t->n_parts; i++) {
		const struct aps_shard_part *p = &sh->parts[t->first + i];
		struct aps_codes_call part = part_call(call, &l, i);
		ret = aps_conn_codes_start(sh->shard[p->shard], sh->part_ids[t->first + i], &part,
		                           false, 0, timeout_ms, &r->parts[i]);
		if (ret < 0) {
			ret = abandon(r, ret);
			goto out;
		}
		r->n_parts = i + 1;
	}
	*out = r;
	ret = aps_api_ok();
out:
	free_layout(&l);
	return ret;
}

int aps_sharded_barrier(aps_client *c, int32_t timeout_ms)
{
	struct aps_sharded *sh = c->sharded;
	struct aps_request *r = new_parent(c, sh->n);
	int ret;

	if (r == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	for (uint32_t i = 0; i < sh->n; i++) {
		if ((ret = aps_client_barrier_start(sh->shard[i], timeout_ms, &r->parts[i])) < 0)
			return abandon(r, ret);
		r->n_parts = i + 1;
	}
	return aps_sharded_wait(r);
}

int aps_sharded_wait(struct aps_request *r)
{
	char detail[DETAIL_MAX] = "";
	int result = 0;

	for (uint32_t i = 0; i < r->n_parts; i++) {
		int ret = aps_conn_wait(r->parts[i], NULL, NULL);
		if (ret < 0 && result == 0) {
			result = ret;
			snprintf(detail, sizeof(detail), "%s", detail_of(ret));
		}
	}
	free(r->parts);
	free(r);
	return result < 0 ? aps_api_fail(result, "%s", detail) : aps_api_ok();
}

int aps_sharded_done(const struct aps_request *r)
{
	for (uint32_t i = 0; i < r->n_parts; i++) {
		if (aps_conn_done(r->parts[i]) != 1)
			return 0;
	}
	return 1;
}

int aps_sharded_close(aps_client *c)
{
	free_sharded(c);
	return 0;
}
