/*
 * The collective calls of the blocking client: all-reduce (APS scale,
 * quantize, PUSH, wait, decode the RESULT in place), broadcast from rank 0,
 * and barrier.
 */
#include "worker/client_impl.h"

#include "common/codec.h"
#include "common/err.h"
#include "worker/api_error.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int call_timeout(const struct aps_client *c, int32_t timeout_ms)
{
	return timeout_ms > 0 ? timeout_ms : c->timeout_ms;
}

static int tensor_of(struct aps_client *c, uint32_t id, const float *buf, uint64_t count,
                     struct client_tensor **out)
{
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	if (id >= c->n_tensors || !c->tensors[id].registered)
		return aps_api_fail(APS_EINVAL, "tensor id %u is not registered", id);
	if (buf == NULL || count != c->tensors[id].count)
		return aps_api_fail(APS_EINVAL,
		                    "tensor '%.200s' has %llu elements, the call "
		                    "passes %llu%s",
		                    c->tensors[id].name, (unsigned long long)c->tensors[id].count,
		                    (unsigned long long)count, buf == NULL ? " and no buffer" : "");
	*out = &c->tensors[id];
	return 0;
}

static int reserve_scratch(struct aps_client *c, size_t len)
{
	uint8_t *p;

	if (len <= c->scratch_cap)
		return 0;
	p = realloc(c->scratch, len);
	if (p == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory for %zu bytes of codes", len);
	c->scratch = p;
	c->scratch_cap = len;
	return 0;
}

/* Scales and quantizes buf into c->scratch; refuses NaN and inf. */
static int encode(struct aps_client *c, const struct client_tensor *t, const float *buf,
                  struct aps_msg *m)
{
	struct aps_quant_opts o = { 0 };
	struct aps_codec_stats st;
	size_t len = aps_format_packed_size(&c->format, t->count);
	int ret = reserve_scratch(c, len);

	if (ret < 0)
		return ret;
	if (c->scaling == APS_SCALING_LOCAL && !aps_format_is_fp32(&c->format))
		aps_scale_local(&c->format, aps_codec_maxabs(buf, t->count), &o.scale_exp);
	aps_codec_quantize(&c->format, buf, t->count, &o, c->scratch, len, &st);
	if (st.nonfinite > 0)
		return aps_api_fail(APS_ENONFINITE,
		                    "tensor '%.200s' holds %llu NaN or inf values; "
		                    "nothing was sent",
		                    t->name, (unsigned long long)st.nonfinite);
	snprintf(m->format, sizeof(m->format), "%s", c->format.name);
	m->scale_exp = o.scale_exp;
	m->flushed = st.flushed;
	m->payload_len = len;
	return 0;
}

/* Decodes the reply's payload into buf. */
static int decode_reply(struct aps_client *c, const struct client_tensor *t, float *buf,
                        const uint8_t *payload, size_t len)
{
	struct aps_format f;

	if (payload == NULL || c->reply.chunk_count != t->count ||
	    aps_format_parse(c->reply.format, &f) < 0)
		return aps_api_fail(APS_EPROTO, "result for '%.200s' does not match the tensor",
		                    t->name);
	if (aps_codec_dequantize(&f, payload, len, t->count, c->reply.scale_exp, buf) < 0)
		return aps_api_fail(APS_EPROTO, "result for '%.200s' is too short", t->name);
	return 0;
}

static int exchange(struct aps_client *c, struct client_tensor *t, uint32_t id,
                    enum aps_msg_type type, struct aps_msg *m, const void *payload, float *buf,
                    int timeout_ms)
{
	struct client_wait w = { .type = type, .tensor_id = id, .step = t->step };
	char what[300];
	const uint8_t *rx;
	size_t rx_len;
	int ret;

	snprintf(what, sizeof(what), "%s of '%.200s' step %llu",
	         type == APS_MSG_RESULT ? "all-reduce" : "broadcast", t->name,
	         (unsigned long long)t->step);
	w.what = what;
	m->tensor_id = id;
	m->step = t->step;
	m->total_count = t->count;
	m->chunk_count = payload != NULL ? t->count : 0;
	ret = aps_client_send(c, m, payload, payload != NULL ? m->payload_len : 0);
	if (ret == 0)
		ret = aps_client_await(c, &w, timeout_ms, &rx, &rx_len);
	if (ret == 0)
		ret = decode_reply(c, t, buf, rx, rx_len);
	if (ret < 0)
		return ret;
	t->step++;
	return aps_api_ok();
}

int aps_client_allreduce(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                         int32_t timeout_ms)
{
	struct client_tensor *t;
	struct aps_msg m;
	int ret = tensor_of(c, tensor_id, buf, count, &t);

	if (ret < 0)
		return ret;
	aps_client_msg(c, &m, APS_MSG_PUSH);
	ret = encode(c, t, buf, &m);
	if (ret < 0)
		return ret;
	return exchange(c, t, tensor_id, APS_MSG_RESULT, &m, c->scratch, buf,
	                call_timeout(c, timeout_ms));
}

int aps_client_broadcast(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                         int32_t timeout_ms)
{
	struct client_tensor *t;
	struct aps_msg m;
	int ret = tensor_of(c, tensor_id, buf, count, &t);

	if (ret < 0)
		return ret;
	aps_client_msg(c, &m, APS_MSG_BROADCAST);
	if (c->rank == 0) {
		snprintf(m.format, sizeof(m.format), "fp32");
		m.payload_len = count * sizeof(float);
	}
	return exchange(c, t, tensor_id, APS_MSG_BROADCAST, &m, c->rank == 0 ? buf : NULL, buf,
	                call_timeout(c, timeout_ms));
}

int aps_client_barrier(aps_client *c, int32_t timeout_ms)
{
	struct client_wait w = { .type = APS_MSG_BARRIER, .barrier = true, .what = "barrier" };
	const uint8_t *rx;
	size_t rx_len;
	struct aps_msg m;
	int ret = aps_client_check(c);

	if (ret < 0)
		return ret;
	w.step = c->barrier_step;
	aps_client_msg(c, &m, APS_MSG_BARRIER);
	m.step = c->barrier_step;
	ret = aps_client_send(c, &m, NULL, 0);
	if (ret == 0)
		ret = aps_client_await(c, &w, call_timeout(c, timeout_ms), &rx, &rx_len);
	if (ret < 0)
		return ret;
	c->barrier_step++;
	return aps_api_ok();
}
