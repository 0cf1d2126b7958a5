/*
 * The shard map of a client with several daemon endpoints: partitioning and
 * byte-balanced, deterministic assignment (shards.h), and the parsing of the
 * endpoint list. Owns no connection; sharded.c uses it.
 */
#include "worker/shards.h"

#include "common/err.h"

#include <string.h>

int aps_shards_init(struct aps_shard_map *m, uint32_t n_shards, uint64_t part_bytes)
{
	uint64_t elems;

	if (m == NULL || n_shards < 1 || n_shards > APS_SHARDS_MAX)
		return APS_EINVAL;
	elems = (part_bytes ? part_bytes : APS_SHARDS_DEFAULT_BYTES) / sizeof(float);
	elems &= ~(uint64_t)7; /* every partition starts on a byte for every code width */
	memset(m, 0, sizeof(*m));
	m->n_shards = n_shards;
	m->part_elems = elems < 8 ? 8 : elems;
	return 0;
}

uint32_t aps_shards_n_parts(const struct aps_shard_map *m, uint64_t count)
{
	uint64_t n = (count + m->part_elems - 1) / m->part_elems;

	return n ? (uint32_t)n : 1;
}

static uint32_t least_loaded(const struct aps_shard_map *m)
{
	uint32_t best = 0;

	for (uint32_t s = 1; s < m->n_shards; s++) {
		if (m->load[s] < m->load[best])
			best = s;
	}
	return best;
}

void aps_shards_assign(struct aps_shard_map *m, uint64_t count, uint32_t bits_per_elem,
                       struct aps_shard_part *parts)
{
	uint32_t n = aps_shards_n_parts(m, count);

	for (uint32_t i = 0; i < n; i++) {
		uint64_t off = (uint64_t)i * m->part_elems;
		uint64_t len = count - off < m->part_elems ? count - off : m->part_elems;
		uint32_t s = least_loaded(m);
		parts[i] = (struct aps_shard_part){ .shard = s, .offset = off, .count = len };
		m->load[s] += (len * bits_per_elem + 7) / 8;
	}
}

static bool blank(char ch)
{
	return ch == ' ' || ch == '\t';
}

int aps_shards_parse(const char *list, char (*out)[APS_SHARDS_ENDPOINT_MAX], uint32_t max,
                     uint32_t *n)
{
	const char *p = list;

	if (list == NULL || out == NULL || n == NULL)
		return APS_EINVAL;
	*n = 0;
	for (;;) {
		const char *end = strchr(p, ',');
		size_t len = end != NULL ? (size_t)(end - p) : strlen(p);
		while (len > 0 && blank(*p)) {
			p++;
			len--;
		}
		while (len > 0 && blank(p[len - 1]))
			len--;
		if (len == 0 || len >= APS_SHARDS_ENDPOINT_MAX || *n >= max)
			return APS_EINVAL;
		memcpy(out[*n], p, len);
		out[(*n)++][len] = '\0';
		if (end == NULL)
			return 0;
		p = end + 1;
	}
}
