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
#include "worker/shards.h"

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define CURVE_KEY_LEN 40 /* Z85 characters of a CURVE key */

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

bool aps__visible_ascii(const char *s)
{
	for (; *s != '\0'; s++) {
		if (*s < '!' || *s > '~')
			return false;
	}
	return true;
}

static int check_identity(const struct aps_client_opts *o)
{
	if (o->world_size < 1 || o->world_size > APS_MSG_RANKS_MAX || o->rank >= o->world_size)
		return aps_api_fail(APS_EINVAL,
		                    "rank %u is not in a world of %u (world sizes 1 to %d)",
		                    o->rank, o->world_size, APS_MSG_RANKS_MAX);
	if (o->job[0] == '\0' || strlen(o->job) > APS_MSG_JOB_MAX || !aps__visible_ascii(o->job))
		return aps_api_fail(APS_EINVAL, "job name must have 1 to %d bytes, visible ASCII",
		                    APS_MSG_JOB_MAX);
	return 0;
}

/* tcp://HOST:PORT with PORT in 1..65535, or ipc://PATH. */
static int check_endpoint(const char *e)
{
	const char *colon = strrchr(e, ':');
	size_t digits = colon != NULL ? strspn(colon + 1, "0123456789") : 0;
	unsigned long port = digits > 0 && digits <= 5 ? strtoul(colon + 1, NULL, 10) : 0;

	if (strncmp(e, "ipc://", 6) == 0 && e[6] != '\0')
		return 0;
	if (strncmp(e, "tcp://", 6) != 0)
		return aps_api_fail(APS_EINVAL,
		                    "endpoint '%.255s' is not tcp://HOST:PORT or ipc://PATH", e);
	if (colon < e + 7 || digits == 0 || colon[1 + digits] != '\0')
		return aps_api_fail(APS_EINVAL, "endpoint '%.255s' is not tcp://HOST:PORT", e);
	if (port < 1 || port > 65535 || digits > 5)
		return aps_api_fail(APS_EINVAL, "endpoint '%.255s': port %.16s is not in 1..65535",
		                    e, colon + 1);
	return 0;
}

/* One endpoint, or a list of shards' separated by commas: each is checked. */
static int check_endpoints(const char *list)
{
	char(*eps)[APS_SHARDS_ENDPOINT_MAX] = malloc(APS_SHARDS_MAX * sizeof(*eps));
	uint32_t n = 0;
	int ret = 0;

	if (eps == NULL)
		return aps_api_fail(APS_ENOMEM, "out of memory");
	if (aps_shards_parse(list, eps, APS_SHARDS_MAX, &n) < 0)
		ret = aps_api_fail(APS_EINVAL,
		                   "endpoint list '%.200s': 1 to %d endpoints of 1 to %d bytes, "
		                   "separated by commas",
		                   list, APS_SHARDS_MAX, APS_SHARDS_ENDPOINT_MAX - 1);
	for (uint32_t i = 0; i < n && ret == 0; i++)
		ret = check_endpoint(eps[i]);
	free(eps);
	return ret;
}

/* GLOB=FORMAT items separated by commas, none empty (common/rules.h); an unknown
 * format is APS_EFORMAT. NULL or "" is no rules, as apsd's `rules =`. */
static int check_rules(const char *rules)
{
	char why[160];
	int ret = aps_rules_check(rules, why, sizeof(why));

	if (ret == 0)
		return 0;
	return aps_api_fail(ret == APS_EFORMAT ? APS_EFORMAT : APS_EINVAL, "rules: %s", why);
}

static int check_formats(const struct aps_client_opts *o, struct aps_format *fmt,
                         struct aps_format *down)
{
	if (aps_format_parse(o->format, fmt) < 0)
		return aps_api_fail(APS_EFORMAT, "'%.32s' is not a format", o->format);
	if (o->downlink != NULL && o->downlink[0] != '\0' && strcmp(o->downlink, "auto") != 0 &&
	    aps_format_parse(o->downlink, down) < 0)
		return aps_api_fail(APS_EFORMAT, "downlink '%.32s' is not a format", o->downlink);
	return check_rules(o->rules);
}

static int check_flag(int32_t value, const char *name)
{
	if (value != 0 && value != 1)
		return aps_api_fail(APS_EINVAL, "%s %d: 0 or 1", name, value);
	return 0;
}

static int check_modes(const struct aps_client_opts *o)
{
	int ret;

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
	if ((ret = check_flag(o->policy_auto, "policy_auto")) < 0 ||
	    (ret = check_flag(o->error_feedback, "error_feedback")) < 0 ||
	    (ret = check_flag(o->rejoin, "rejoin")) < 0 ||
	    (ret = check_flag(o->no_payload_crc, "no_payload_crc")) < 0)
		return ret;
	if (o->timeout_ms <= 0 || o->heartbeat_ms <= 0)
		return aps_api_fail(APS_EINVAL, "timeout_ms and heartbeat_ms must be positive");
	if (o->connect_timeout_ms < 0)
		return aps_api_fail(APS_EINVAL, "connect_timeout_ms must be 0 (none) or positive");
	return 0;
}

static int check_optimizer(const struct aps_client_opts *o)
{
	if (o->optimizer == NULL || o->optimizer[0] == '\0')
		return 0;
	if (strlen(o->optimizer) > APS_MSG_OPTIM_MAX || !aps__visible_ascii(o->optimizer))
		return aps_api_fail(APS_EINVAL, "optimizer must be 1 to %d visible ASCII bytes",
		                    APS_MSG_OPTIM_MAX);
	/* The workers' weights would not be what a restarted daemon resumes from its checkpoint. */
	if (o->rejoin)
		return aps_api_fail(APS_EINVAL,
		                    "rejoin does not apply to optimize mode: after apsd restarts, "
		                    "restart the workers (the job resumes from its checkpoint)");
	return 0;
}

/* A Z85 key: CURVE_KEY_LEN characters of ZeroMQ's Z85 alphabet. */
static int check_key(const char *key, const char *name)
{
	static const char z85[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
	                          ".-:+=^!/*?&<>()[]{}@%$#";

	if (strlen(key) != CURVE_KEY_LEN || strspn(key, z85) != CURVE_KEY_LEN)
		return aps_api_fail(APS_EINVAL, "%s is not a Z85 key of %d characters", name,
		                    CURVE_KEY_LEN);
	return 0;
}

/* The three CURVE keys, or none (a server key alone, or a key pair alone, is neither). */
static int check_curve(const struct aps_client_opts *o)
{
	int given = (o->curve_server_key != NULL) + (o->curve_public_key != NULL) +
	            (o->curve_secret_key != NULL);
	int ret;

	if (given == 0)
		return 0;
	if (given != 3)
		return aps_api_fail(APS_EINVAL, "CURVE takes all three keys (curve_server_key, "
		                                "curve_public_key, curve_secret_key) or none");
	if ((ret = check_key(o->curve_server_key, "curve_server_key")) < 0 ||
	    (ret = check_key(o->curve_public_key, "curve_public_key")) < 0)
		return ret;
	return check_key(o->curve_secret_key, "curve_secret_key");
}

int aps__options_check(const struct aps_client_opts *o, struct aps_format *fmt,
                       struct aps_format *down)
{
	int ret;

	if (o == NULL || o->endpoint == NULL || o->job == NULL || o->format == NULL)
		return aps_api_fail(APS_EINVAL, "options, endpoint, job and format are required");
	if ((ret = check_identity(o)) < 0 || (ret = check_endpoints(o->endpoint)) < 0 ||
	    (ret = check_formats(o, fmt, down)) < 0 || (ret = check_modes(o)) < 0 ||
	    (ret = check_optimizer(o)) < 0 || (ret = check_curve(o)) < 0)
		return ret;
	if (o->job_token != NULL &&
	    (strlen(o->job_token) > APS_MSG_TOKEN_MAX || !aps__visible_ascii(o->job_token)))
		return aps_api_fail(APS_EINVAL,
		                    "job_token must be 1 to %d visible ASCII bytes (no spaces)",
		                    APS_MSG_TOKEN_MAX);
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
