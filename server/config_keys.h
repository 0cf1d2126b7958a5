/*
 * The table of the daemon's configuration keys and what is done to one key
 * (config_keys.c): find it by name, parse a value into struct aps_config,
 * write it back as text, print its usage line. config.c loads files and
 * flags through it. Not for other modules.
 */
#ifndef APS_SERVER_CONFIG_KEYS_H
#define APS_SERVER_CONFIG_KEYS_H

#include "server/config.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#define REASON_MAX 160
#define VALUE_MAX  (APS_CONFIG_ENDPOINT_MAX + 1)
#define SHOW_MAX   64 /* bytes of a user string echoed in an error */
/* Arguments for "%.*s%s": s cut to SHOW_MAX bytes, with "..." when cut. */
#define CLIP(s)             SHOW_MAX, (s), (strlen(s) > SHOW_MAX ? "..." : "")
#define KIB                 1024LL
#define MIB                 (1024 * KIB)
#define GIB                 (1024 * MIB)
#define APS_CONFIG_KEYS_MAX 64 /* keys in the table, at most */

enum key_type {
	KEY_ENDPOINT,
	KEY_STRING, /* up to APS_CONFIG_ENDPOINT_MAX bytes; empty means automatic or off */
	KEY_CHOICE, /* stored as an enum whose values index choices[] */
	KEY_INT,
	KEY_SIZE, /* uint64_t bytes; accepts k, M and G suffixes */
	KEY_REAL, /* double between rmin and rmax */
};

struct key {
	const char *name;
	enum key_type type;
	long long min, max;         /* KEY_INT, KEY_SIZE */
	double rmin, rmax;          /* KEY_REAL */
	const char *unset;          /* KEY_STRING: what the empty default means, and the metavar */
	const char *const *choices; /* KEY_CHOICE, NULL-terminated */
	const char *def;            /* default, as it would be written in the file */
	const char *help;
	size_t offset; /* of the field in struct aps_config */
};

extern const struct key aps_config_keys[];
/* Choices that config.c checks against too (NULL-terminated). */
extern const char *const aps_config_scalings[], *const aps_config_downlinks[],
                                                        *const aps_config_wide_formats[];
extern const size_t aps_config_nkeys;

/* True when the len bytes of s spell name, '-' standing for '_'. */
bool aps_config_name_matches(const char *s, size_t len, const char *name);
/* The index of the key the len bytes of s name, or -1. */
int aps_config_key_find(const char *s, size_t len);
/* The key (or extra name, NULL-terminated) closest to s, or NULL when none is close. */
const char *aps_config_key_suggest(const char *s, size_t len, const char *const *extra);
/* text into k's field of cfg: 0, or APS_EINVAL with reason (REASON_MAX bytes) set. */
int aps_config_key_parse(const struct key *k, const char *text, struct aps_config *cfg,
                         char *reason);
/* k's value in cfg, as it would be written in the file. */
void aps_config_key_format(const struct key *k, const struct aps_config *cfg, char *buf,
                           size_t len);

#endif
