/*
 * Encoding of one message: struct aps_msg into the bytes of the header frame
 * (a protobuf Envelope), with the length and CRC32C of the payload frame
 * written into it. Sending the frames is the caller's; decoding and checking
 * what a peer sent is validate.c's.
 */
#include "proto/frame.h"

#include "common/crc32c.h"
#include "common/err.h"
#include "proto/envelope.h"

#include <stdlib.h>
#include <string.h>

/* Stands for the CRC in a size estimate: a non-zero fixed32 is always sent. */
#define CRC_PLACEHOLDER 0xFFFFFFFFu

void aps_msg_init(struct aps_msg *m, enum aps_msg_type type)
{
	memset(m, 0, sizeof(*m));
	m->type = type;
	m->version_major = APS_PROTO_VERSION_MAJOR;
	m->version_minor = APS_PROTO_VERSION_MINOR;
	m->scaling = APS_MSG_SCALING_UNSET;
}

const char *aps_msg_type_name(int type)
{
	switch (type) {
#define APS_MSG_TYPE_CASE(name, value) \
	case APS_MSG_##name:           \
		return #name;
		APS_MSG_TYPE_MAP(APS_MSG_TYPE_CASE)
#undef APS_MSG_TYPE_CASE
	default:
		return "UNKNOWN";
	}
}

static bool terminated(const char *s, size_t cap)
{
	return memchr(s, '\0', cap) != NULL;
}

/* What protobuf-c needs to encode m without reading out of its arrays. */
static bool encodable(const struct aps_msg *m)
{
	if (m->n_waiting_for > APS_MSG_LIST_MAX || m->n_exponents > APS_MSG_LIST_MAX ||
	    m->n_tensor_ids > APS_MSG_LIST_MAX)
		return false;
	if (m->payload == NULL && m->payload_len != 0)
		return false;
	return terminated(m->job, sizeof(m->job)) &&
	       terminated(m->tensor_name, sizeof(m->tensor_name)) &&
	       terminated(m->format, sizeof(m->format)) &&
	       terminated(m->next_format, sizeof(m->next_format)) &&
	       terminated(m->error_text, sizeof(m->error_text));
}

size_t aps_msg_packed_size(const struct aps_msg *m)
{
	Aps__Envelope env;

	if (m == NULL || !encodable(m))
		return 0;
	aps_envelope_from_msg(m, m->payload ? CRC_PLACEHOLDER : 0, &env);
	return aps__envelope__get_packed_size(&env);
}

int aps_msg_pack(const struct aps_msg *m, uint8_t *buf, size_t cap, size_t *len)
{
	uint32_t crc = m != NULL && m->payload && !(m->flags & APS_MSG_FLAG_NO_CRC)
	                       ? aps_crc32c(0, m->payload, m->payload_len)
	                       : 0;

	return aps_msg_pack_with_crc(m, crc, buf, cap, len);
}

int aps_msg_pack_with_crc(const struct aps_msg *m, uint32_t payload_crc, uint8_t *buf, size_t cap,
                          size_t *len)
{
	Aps__Envelope env;
	size_t need;

	if (m == NULL || len == NULL || (buf == NULL && cap > 0) || !encodable(m))
		return APS_EINVAL;
	aps_envelope_from_msg(m, m->payload ? payload_crc : 0, &env);
	need = aps__envelope__get_packed_size(&env);
	if (need > cap)
		return APS_ESHORT;
	*len = need > 0 ? aps__envelope__pack(&env, buf) : 0;
	return 0;
}

int aps_msg_pack_alloc(const struct aps_msg *m, uint8_t **out, size_t *len)
{
	size_t cap = aps_msg_packed_size(m);
	uint8_t *buf;
	int ret;

	if (cap == 0 || out == NULL || len == NULL)
		return APS_EINVAL;
	buf = malloc(cap);
	if (buf == NULL)
		return APS_ENOMEM;
	ret = aps_msg_pack(m, buf, cap, len);
	if (ret < 0)
		goto err_free;
	*out = buf;
	return 0;
err_free:
	free(buf);
	return ret;
}
