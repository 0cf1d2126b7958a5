/*
 * Which server shard carries which part of which tensor. A client with
 * several daemon endpoints cuts every tensor larger than a partition into
 * partitions (all of partition size but the last) and gives each partition,
 * and each smaller tensor, to the shard that carries the fewest bytes so far
 * (ties to the lowest index). The assignment depends only on the sequence of
 * registrations, so every rank that registers the same tensors in the same
 * order computes the same map. No network, no daemon: pure bookkeeping.
 */
#ifndef APS_WORKER_SHARDS_H
#define APS_WORKER_SHARDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_SHARDS_MAX           64
#define APS_SHARDS_ENDPOINT_MAX  256                 /* bytes of one endpoint, NUL included */
#define APS_SHARDS_DEFAULT_BYTES ((uint64_t)4 << 20) /* fp32 bytes: apsd's default chunk */

struct aps_shard_part {
	uint32_t shard;  /* index into the endpoint list */
	uint64_t offset; /* first element of the tensor in this part */
	uint64_t count;  /* elements */
};

struct aps_shard_map {
	uint32_t n_shards;
	uint64_t part_elems;           /* a multiple of 8, at least 8 */
	uint64_t load[APS_SHARDS_MAX]; /* bytes each shard receives per step from one rank */
};

/*
 * Sets up an empty map of n_shards (1..APS_SHARDS_MAX) shards whose
 * partitions hold part_bytes / 4 elements, rounded down to a multiple of 8
 * (0: APS_SHARDS_DEFAULT_BYTES). Returns 0 or APS_EINVAL.
 */
int aps_shards_init(struct aps_shard_map *m, uint32_t n_shards, uint64_t part_bytes);

/* Partitions a tensor of count elements is cut into (at least 1). */
uint32_t aps_shards_n_parts(const struct aps_shard_map *m, uint64_t count);

/*
 * Cuts a tensor of count elements whose codes take bits_per_elem bits into
 * parts[0..aps_shards_n_parts) and gives each to the least loaded shard.
 */
void aps_shards_assign(struct aps_shard_map *m, uint64_t count, uint32_t bits_per_elem,
                       struct aps_shard_part *parts);

/*
 * Splits a comma-separated endpoint list ("tcp://a:5555,tcp://b:5555") into
 * out[0..*n); blanks around commas are dropped. Returns 0, or APS_EINVAL for
 * an empty item, an item of APS_SHARDS_ENDPOINT_MAX bytes or more, or more
 * than max items.
 */
int aps_shards_parse(const char *list, char (*out)[APS_SHARDS_ENDPOINT_MAX], uint32_t max,
                     uint32_t *n);

#endif
