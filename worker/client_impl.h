/*
 * The client's state, shared by client.c (joining, registering, closing,
 * waiting for replies) and collective.c (all-reduce, broadcast, barrier).
 */
#ifndef APS_WORKER_CLIENT_IMPL_H
#define APS_WORKER_CLIENT_IMPL_H

#include "common/format.h"
#include "common/scale.h"
#include "proto/validate.h"
#include "worker/aps.h"
#include "worker/transport.h"

#include <sys/types.h>

struct client_tensor {
	char name[APS_MSG_NAME_MAX + 1];
	uint64_t count;
	uint64_t step; /* the next call's step */
	bool registered;
};

struct aps_client {
	pid_t pid; /* the process that created it: a forked child must not use it */
	struct aps_transport *tr;
	char endpoint[256];
	char job[APS_MSG_JOB_MAX + 1];
	uint32_t rank, world_size;
	struct aps_format format;
	enum aps_scaling scaling;
	int timeout_ms, heartbeat_ms;
	aps_log_fn log;
	void *log_ctx;
	struct aps_msg_limits limits;
	struct client_tensor *tensors; /* by id */
	uint32_t n_tensors;
	uint64_t barrier_step;
	uint8_t *scratch; /* packed codes of the call in progress */
	size_t scratch_cap;
	struct aps_msg reply; /* the reply of the call in progress */
};

/* What a call waits for: a reply of this type about this tensor and step. */
struct client_wait {
	enum aps_msg_type type;
	uint32_t tensor_id;
	uint64_t step;
	const char *what; /* "all-reduce of 'w' step 3", for messages */
	bool barrier;
	bool by_name; /* REGISTERED: match the tensor name instead of the id */
	const char *name;
};

/* A message with our identity, ready to fill. */
void aps_client_msg(const struct aps_client *c, struct aps_msg *m, enum aps_msg_type type);

/* Packs and sends m with an optional payload. */
int aps_client_send(struct aps_client *c, struct aps_msg *m, const void *payload,
                    size_t payload_len);

/*
 * Waits for the reply w describes, heartbeating meanwhile; on success the
 * reply is in c->reply and its payload (if any) in *payload until the next
 * receive. Returns 0 or the error (APS_ETIMEDOUT, APS_EPEERLOST, ...).
 */
int aps_client_await(struct aps_client *c, const struct client_wait *w, int timeout_ms,
                     const uint8_t **payload, size_t *payload_len);

/* The client may be used by this call: not NULL, not forked. */
int aps_client_check(const struct aps_client *c);

#endif
