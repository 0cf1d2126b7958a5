/*
 * The mapping between struct aps_msg and Aps__Envelope (proto/aps.proto):
 * field by field, both directions, nothing else. Encoding lives in frame.c,
 * decoding and every check of a peer's values in validate.c.
 */
#include "proto/envelope.h"

#include <stdio.h>
#include <string.h>

#define APS_MSG_TYPE_CHECK(name, value) \
	_Static_assert(APS_MSG_##name == (int)APS__MSG_TYPE__##name, "MsgType " #name);
APS_MSG_TYPE_MAP(APS_MSG_TYPE_CHECK)
#undef APS_MSG_TYPE_CHECK

/* Wire ScalingMode = enum aps_scaling + 1; 0 is "unspecified". */
_Static_assert(APS__SCALING_MODE__SCALING_UNSPECIFIED == APS_MSG_SCALING_UNSET + 1, "scaling");

void aps_envelope_from_msg(const struct aps_msg *m, uint32_t payload_crc, Aps__Envelope *env)
{
	aps__envelope__init(env);
	env->version_major = m->version_major;
	env->version_minor = m->version_minor;
	env->type = (Aps__MsgType)m->type;
	env->job = (char *)m->job;
	env->rank = m->rank;
	env->world_size = m->world_size;
	env->tensor_id = m->tensor_id;
	env->tensor_name = (char *)m->tensor_name;
	env->step = m->step;
	env->chunk_offset = m->chunk_offset;
	env->chunk_count = m->chunk_count;
	env->total_count = m->total_count;
	env->format = (char *)m->format;
	env->next_format = (char *)m->next_format;
	env->about_type = (Aps__MsgType)m->about_type;
	env->scale_exp = m->scale_exp;
	env->scaling = (Aps__ScalingMode)(m->scaling + 1);
	env->flags = m->flags;
	env->payload_len = m->payload ? m->payload_len : 0;
	env->payload_crc32c = payload_crc;
	env->flushed = m->flushed;
	env->error_code = m->error_code;
	env->error_text = (char *)m->error_text;
	env->n_waiting_for = m->n_waiting_for;
	env->waiting_for = (uint32_t *)m->waiting_for;
	env->n_exponents = m->n_exponents;
	env->exponents = (int32_t *)m->exponents;
	env->n_tensor_ids = m->n_tensor_ids;
	env->tensor_ids = (uint32_t *)m->tensor_ids;
	env->optimizer = (char *)m->optimizer;
	env->lr = m->lr;
	env->updates = m->updates;
	env->session.data = (uint8_t *)m->session;
	env->session.len = m->has_session ? sizeof(m->session) : 0;
	env->job_token = (char *)m->job_token;
	env->max_message_bytes = m->max_message_bytes;
	env->keepalive_ms = m->keepalive_ms;
	env->retry_after_ms = m->retry_after_ms;
	env->block_size = m->block_size;
}

static void copy_string(char *dst, size_t cap, const char *src)
{
	snprintf(dst, cap, "%s", src ? src : "");
}

static uint32_t copy_list(void *dst, const void *src, size_t n, size_t elem)
{
	if (n > APS_MSG_LIST_MAX)
		n = APS_MSG_LIST_MAX;
	if (n > 0)
		memcpy(dst, src, n * elem);
	return (uint32_t)n;
}

void aps_envelope_to_msg(const Aps__Envelope *env, struct aps_msg *m)
{
	memset(m, 0, sizeof(*m));
	m->version_major = env->version_major;
	m->version_minor = env->version_minor;
	m->type = (enum aps_msg_type)env->type;
	copy_string(m->job, sizeof(m->job), env->job);
	m->rank = env->rank;
	m->world_size = env->world_size;
	m->tensor_id = env->tensor_id;
	copy_string(m->tensor_name, sizeof(m->tensor_name), env->tensor_name);
	m->step = env->step;
	m->chunk_offset = env->chunk_offset;
	m->chunk_count = env->chunk_count;
	m->total_count = env->total_count;
	copy_string(m->format, sizeof(m->format), env->format);
	copy_string(m->next_format, sizeof(m->next_format), env->next_format);
	m->about_type = (enum aps_msg_type)env->about_type;
	m->scale_exp = env->scale_exp;
	m->scaling = (int)env->scaling - 1;
	m->flags = env->flags;
	m->flushed = env->flushed;
	m->error_code = env->error_code;
	copy_string(m->error_text, sizeof(m->error_text), env->error_text);
	m->n_waiting_for = copy_list(m->waiting_for, env->waiting_for, env->n_waiting_for,
	                             sizeof(m->waiting_for[0]));
	m->n_exponents =
	        copy_list(m->exponents, env->exponents, env->n_exponents, sizeof(m->exponents[0]));
	m->n_tensor_ids = copy_list(m->tensor_ids, env->tensor_ids, env->n_tensor_ids,
	                            sizeof(m->tensor_ids[0]));
	copy_string(m->optimizer, sizeof(m->optimizer), env->optimizer);
	m->lr = env->lr;
	m->updates = env->updates;
	m->has_session = env->session.len == sizeof(m->session);
	if (m->has_session)
		memcpy(m->session, env->session.data, sizeof(m->session));
	copy_string(m->job_token, sizeof(m->job_token), env->job_token);
	m->max_message_bytes = env->max_message_bytes;
	m->keepalive_ms = env->keepalive_ms;
	m->retry_after_ms = env->retry_after_ms;
	m->block_size = env->block_size;
}
