/*
 * CURVE key files: one Z85 key (40 characters) per line, '#' comments. The
 * daemon reads its secret key and the allowlist of workers' public keys;
 * `apsctl keygen` writes them. An allowlist line may name, after its key, the
 * jobs that key may join (names or globs, "train-* eval"); without any, the
 * key may join every job.
 */
#ifndef APS_SERVER_KEYS_H
#define APS_SERVER_KEYS_H

#include <stddef.h>

#define APS_KEY_Z85_LEN 40

#define APS_KEY_JOBS_MAX 512 /* bytes of one line's job list */

struct aps_keys {
	char (*keys)[APS_KEY_Z85_LEN + 1];
	const char **list; /* n pointers into keys, for APIs that take a string array */
	char (*jobs)[APS_KEY_JOBS_MAX]; /* per key: space-separated job globs, "" any job */
	const char **job_list;          /* n pointers into jobs */
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
