/*
 * A client of several apsd shards: the aps_client the caller holds is a
 * parent that owns one ordinary client per shard, and every public call on
 * it is spread over those by the shard map (shards.h).
 */
#ifndef APS_WORKER_SHARDED_H
#define APS_WORKER_SHARDED_H

#include "worker/aps.h"

#include <stdbool.h>

struct aps_request;

/* aps_client_new for a comma-separated endpoint list: joins the job on every shard. */
int aps_sharded_new(aps_client **out, const struct aps_client_opts *o);

/* aps_client_register: partitions the tensor and registers each part on its shard. */
int aps_sharded_register(aps_client *c, const char *name, uint64_t count, uint32_t *tensor_id);

/* aps_client_allreduce_start: one request per partition, each on its shard. */
int aps_sharded_allreduce_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                                int32_t timeout_ms, aps_request **req);

/* aps_client_broadcast_start, partitioned like the all-reduce. */
int aps_sharded_broadcast_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                                int32_t timeout_ms, aps_request **req);

/* aps_client_codes_layout: the partitions' layouts end to end (whole chunks, alike). */
int aps_sharded_codes_layout(aps_client *c, uint32_t tensor_id, struct aps_codes_layout *send,
                             struct aps_codes_layout *result);

/* aps_client_allreduce_codes_start: each partition's slice of the buffers on its shard. */
int aps_sharded_codes_start(aps_client *c, uint32_t tensor_id, const struct aps_codes_call *call,
                            bool update, float lr, int32_t timeout_ms, aps_request **req);

/* aps_client_barrier: a barrier on every shard at once. */
int aps_sharded_barrier(aps_client *c, int32_t timeout_ms);

/* aps_request_wait and aps_request_done of a request made here. */
int aps_sharded_wait(struct aps_request *r);
int aps_sharded_done(const struct aps_request *r);

/* aps_client_close: closes every shard's client, then the parent. */
int aps_sharded_close(aps_client *c);

#endif
