/*
 * The public calls that a client of several shards serves differently
 * (aps.h): each picks, through one small table, the client of one
 * connection (client.c, request.c) or of several shards (sharded.c, which
 * builds on the first). The other public calls (optimize mode, codec,
 * options) serve one connection only and live where they are done.
 */
#include "worker/client_impl.h"

#include "common/err.h"
#include "worker/api_error.h"
#include "worker/options.h"
#include "worker/sharded.h"

#include <math.h>
#include <string.h>

struct client_ops {
	int (*reg)(aps_client *c, const char *name, uint64_t count, uint32_t *tensor_id);
	int (*allreduce_start)(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
	                       int32_t timeout_ms, aps_request **out);
	int (*broadcast_start)(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
	                       int32_t timeout_ms, aps_request **out);
	int (*barrier)(aps_client *c, int32_t timeout_ms);
	int (*codes_layout)(aps_client *c, uint32_t tensor_id, struct aps_codes_layout *send,
	                    struct aps_codes_layout *result);
	int (*codes_start)(aps_client *c, uint32_t tensor_id, const struct aps_codes_call *call,
	                   bool update, float lr, int32_t timeout_ms, aps_request **out);
	int (*wait)(struct aps_request *r);
	int (*done)(const struct aps_request *r);
	int (*close)(aps_client *c);
};

static int conn_register(aps_client *c, const char *name, uint64_t count, uint32_t *tensor_id)
{
	return aps_client_register_as(c, name, count, NULL, tensor_id);
}

static int conn_allreduce_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                                int32_t timeout_ms, aps_request **out)
{
	return aps_client_allreduce_part(c, tensor_id, buf, count, timeout_ms, NULL, out);
}

static int conn_wait(struct aps_request *r)
{
	return aps_conn_wait(r, NULL, NULL);
}

static const struct client_ops one_connection = {
	.reg = conn_register,
	.allreduce_start = conn_allreduce_start,
	.broadcast_start = aps_conn_broadcast_start,
	.barrier = aps_conn_barrier,
	.codes_layout = aps_conn_codes_layout,
	.codes_start = aps_conn_codes_start,
	.wait = conn_wait,
	.done = aps_conn_done,
	.close = aps_conn_close,
};

static const struct client_ops shards = {
	.reg = aps_sharded_register,
	.allreduce_start = aps_sharded_allreduce_start,
	.broadcast_start = aps_sharded_broadcast_start,
	.barrier = aps_sharded_barrier,
	.codes_layout = aps_sharded_codes_layout,
	.codes_start = aps_sharded_codes_start,
	.wait = aps_sharded_wait,
	.done = aps_sharded_done,
	.close = aps_sharded_close,
};

/* A bad client (NULL, another process's) goes to the one-connection calls,
 * which say what is wrong with it. */
static const struct client_ops *ops_of(const aps_client *c)
{
	return c != NULL && c->sharded != NULL && aps_client_check(c) == 0 ? &shards
	                                                                   : &one_connection;
}

static const struct client_ops *ops_of_request(const struct aps_request *r)
{
	return r != NULL && r->kind == REQ_SHARDED ? &shards : &one_connection;
}

int aps_client_new(aps_client **out, const struct aps_client_opts *o)
{
	bool several = o != NULL && o->endpoint != NULL && strchr(o->endpoint, ',') != NULL;
	struct aps_format fmt, down;
	int ret;

	if (several && o->optimizer != NULL && o->optimizer[0] != '\0')
		return aps_api_fail(APS_EINVAL, "optimize mode serves one daemon, not several "
		                                "shards: give one endpoint");
	/* Every shard's client checks o again, but none joins before all of o is checked. */
	if (several && (ret = aps__options_check(o, &fmt, &down)) < 0)
		return ret;
	return several ? aps_sharded_new(out, o) : aps_conn_new(out, o);
}

int aps_client_close(aps_client *c)
{
	return c == NULL ? 0 : ops_of(c)->close(c);
}

int aps_client_register(aps_client *c, const char *name, uint64_t count, uint32_t *tensor_id)
{
	return ops_of(c)->reg(c, name, count, tensor_id);
}

int aps_client_allreduce_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                               int32_t timeout_ms, aps_request **out)
{
	return ops_of(c)->allreduce_start(c, tensor_id, buf, count, timeout_ms, out);
}

int aps_client_broadcast_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                               int32_t timeout_ms, aps_request **out)
{
	return ops_of(c)->broadcast_start(c, tensor_id, buf, count, timeout_ms, out);
}

int aps_request_wait(aps_request *r)
{
	return ops_of_request(r)->wait(r);
}

int aps_request_done(const aps_request *r)
{
	return ops_of_request(r)->done(r);
}

int aps_client_allreduce(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                         int32_t timeout_ms)
{
	aps_request *r;
	int ret = aps_client_allreduce_start(c, tensor_id, buf, count, timeout_ms, &r);

	return ret < 0 ? ret : aps_request_wait(r);
}

int aps_client_broadcast(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                         int32_t timeout_ms)
{
	aps_request *r;
	int ret = aps_client_broadcast_start(c, tensor_id, buf, count, timeout_ms, &r);

	return ret < 0 ? ret : aps_request_wait(r);
}

int aps_client_barrier(aps_client *c, int32_t timeout_ms)
{
	int ret = aps_client_check(c);

	return ret < 0 ? ret : ops_of(c)->barrier(c, timeout_ms);
}

int aps_client_codes_layout(aps_client *c, uint32_t tensor_id, struct aps_codes_layout *send,
                            struct aps_codes_layout *result)
{
	return ops_of(c)->codes_layout(c, tensor_id, send, result);
}

int aps_client_allreduce_codes_start(aps_client *c, uint32_t tensor_id,
                                     const struct aps_codes_call *call, int32_t timeout_ms,
                                     aps_request **req)
{
	return ops_of(c)->codes_start(c, tensor_id, call, false, 0, timeout_ms, req);
}

int aps_client_step_codes_start(aps_client *c, uint32_t tensor_id,
                                const struct aps_codes_call *call, float lr, int32_t timeout_ms,
                                aps_request **req)
{
	if (!isfinite(lr) || lr < 0)
		return aps_api_fail(APS_EINVAL, "learning rate %g is not finite and >= 0",
		                    (double)lr);
	return ops_of(c)->codes_start(c, tensor_id, call, true, lr, timeout_ms, req);
}

int aps_client_tensor_updates(aps_client *c, uint32_t tensor_id, uint64_t *updates)
{
	if (ops_of(c) == &shards)
		return aps_api_fail(APS_EINVAL,
		                    "the client has several shards (optimize mode serves "
		                    "one daemon)");
	return aps_conn_tensor_updates(c, tensor_id, updates);
}
