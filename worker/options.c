/*
 * The client's options: their defaults, the checks aps_client_new makes before
 * anything connects (each with a message that names the option), and CURVE key
 * pairs for them. Joining with checked options is client.c's.
 */
#include "worker/options.h"

#include "common/codec.h"
#include "common/err.h"
#include "common/rules.h"
#include "proto/frame.h"
#include "worker/api_error.h"
#include "worker/client_impl.h"

#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <zmq.h>

void aps_client_opts_init(struct aps_client_opts *o)
{
	if (o == NULL)
		return;
	memset(o, 0, sizeof(*o));
	o->endpoint = "tcp://127.0.0.1:5555";
	o->job = "default";
	o->world_size = 1;
	o->format = "e4m3";
	o->scaling = APS_SCALING_MODE_LOCAL;
	o->timeout_ms = 60000;
	o->heartbeat_ms = 1000;
	o->connect_timeout_ms = 10000;
}

size_t aps_client_opts_size(void)
{
	return sizeof(struct aps_client_opts);
}

/* "" (none) or 1..APS_MSG_TOKEN_MAX visible ASCII bytes. */
static bool token_ok(const char *token)
{
	size_t n = strlen(token);

	for (size_t i = 0; i < n; i++) {
		if (token[i] < '!' || token[i] > '~')
			return false;
	}
	return n <= APS_MSG_TOKEN_MAX;
}

int aps__options_check(const struct aps_client_opts *o, struct aps_format *fmt,
                       struct aps_format *down)
{
	char why[160];
	if (o == NULL || o->endpoint == NULL || o->job == NULL || o->format == NULL)
		return aps_api_fail(APS_EINVAL, "options, endpoint, job and format are required");
	if (o->world_size < 1 || o->rank >= o->world_size)
		return aps_api_fail(APS_EINVAL, "rank %u is not in a world of %u", o->rank,
		                    o->world_size);
	if (o->job[0] == '\0' || strlen(o->job) > APS_MSG_JOB_MAX)
		return aps_api_fail(APS_EINVAL, "job name must have 1 to %d bytes",
		                    APS_MSG_JOB_MAX);
	if (strlen(o->endpoint) >= 256)
		return aps_api_fail(APS_EINVAL, "endpoint is longer than 255 bytes");
	if (aps_format_parse(o->format, fmt) < 0)
		return aps_api_fail(APS_EFORMAT, "'%.32s' is not a format", o->format);
	if (o->downlink != NULL && o->downlink[0] != '\0' && strcmp(o->downlink, "auto") != 0 &&
	    aps_format_parse(o->downlink, down) < 0)
		return aps_api_fail(APS_EFORMAT, "downlink '%.32s' is not a format", o->downlink);
	if (o->scaling < APS_SCALING_MODE_NONE || o->scaling > APS_SCALING_MODE_BLOCK)
		return aps_api_fail(
		        APS_EINVAL,
		        "scaling %d is not none (0), local (1), global (2) or block (3)",
		        o->scaling);
	if (o->block_size != 0 &&
	    (o->scaling != APS_SCALING_MODE_BLOCK || !aps_codec_block_ok(o->block_size)))
		return aps_api_fail(APS_EINVAL, "block_size %u: 16, 32 or 64, with scaling block",
		                    o->block_size);
	if (o->codec_threads > APS_CLIENT_CODEC_THREADS_MAX)
		return aps_api_fail(APS_EINVAL, "codec_threads %u: at most %d", o->codec_threads,
		                    APS_CLIENT_CODEC_THREADS_MAX);
	if (o->no_payload_crc != 0 && o->no_payload_crc != 1)
		return aps_api_fail(APS_EINVAL, "no_payload_crc %d: 0 or 1", o->no_payload_crc);
	if (o->timeout_ms <= 0 || o->heartbeat_ms <= 0)
		return aps_api_fail(APS_EINVAL, "timeout_ms and heartbeat_ms must be positive");
	if (o->connect_timeout_ms < 0)
		return aps_api_fail(APS_EINVAL, "connect_timeout_ms must be 0 (none) or positive");
	if (aps_rules_check(o->rules, why, sizeof(why)) < 0)
		return aps_api_fail(APS_EINVAL, "rules: %s", why);
	if (o->optimizer != NULL && strlen(o->optimizer) > APS_MSG_OPTIM_MAX)
		return aps_api_fail(APS_EINVAL, "optimizer is longer than %d bytes",
		                    APS_MSG_OPTIM_MAX);
	if (o->job_token != NULL && !token_ok(o->job_token))
		return aps_api_fail(APS_EINVAL,
		                    "job_token must be 1 to %d visible ASCII bytes (no spaces)",
		                    APS_MSG_TOKEN_MAX);
	/* The workers' weights would not be what a restarted daemon resumes from its checkpoint. */
	if (o->optimizer != NULL && o->optimizer[0] != '\0' && o->rejoin)
		return aps_api_fail(APS_EINVAL,
		                    "rejoin does not apply to optimize mode: after apsd restarts, "
		                    "restart the workers (the job resumes from its checkpoint)");
	return 0;
}

int aps_curve_keypair(char *public_key, char *secret_key)
{
	if (public_key == NULL || secret_key == NULL)
		return aps_api_fail(APS_EINVAL, "a key buffer is NULL (two buffers of 41 bytes)");
	if (zmq_curve_keypair(public_key, secret_key) < 0)
		return aps_api_fail(APS_ESYS, "no CURVE key pair: %s (is libzmq built with CURVE?)",
		                    zmq_strerror(zmq_errno()));
	return aps_api_ok();
}
