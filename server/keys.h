/*
 * CURVE key files: one Z85 key (40 characters) per line, '#' comments. The
 * daemon reads its secret key and the allowlist of workers' public keys;
 * `apsctl keygen` writes them.
 */
#ifndef APS_SERVER_KEYS_H
#define APS_SERVER_KEYS_H

#include <stddef.h>

#define APS_KEY_Z85_LEN 40

struct aps_keys {
	char (*keys)[APS_KEY_Z85_LEN + 1];
	const char **list; /* n pointers into keys, for APIs that take a string array */
	size_t n;
};

/*
 * Reads every key of path into out (at least one). Returns 0, or APS_ECONFIG
 * with "path:line: reason" in why.
 */
int aps_keys_load(const char *path, struct aps_keys *out, char *why, size_t why_len);

void aps_keys_free(struct aps_keys *k);

/* True when a tcp:// endpoint binds only loopback (127.0.0.0/8, ::1, localhost). */
int aps_endpoint_is_loopback(const char *endpoint);

#endif
