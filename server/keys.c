/*
 * Reading CURVE key files, and telling loopback endpoints from the others
 * (which need CURVE or an explicit insecure = yes).
 */
#include "server/keys.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char z85_alphabet[] = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                   ".-:+=^!/*?&<>()[]{}@%$#";

static int add_key(struct aps_keys *out, const char *key, const char *jobs)
{
	char(*grown)[APS_KEY_Z85_LEN + 1] = realloc(out->keys, (out->n + 1) * sizeof(*grown));
	char(*grown_jobs)[APS_KEY_JOBS_MAX];

	if (grown == NULL)
		return APS_ENOMEM;
	out->keys = grown;
	grown_jobs = realloc(out->jobs, (out->n + 1) * sizeof(*grown_jobs));
	if (grown_jobs == NULL)
		return APS_ENOMEM;
	out->jobs = grown_jobs;
	snprintf(out->keys[out->n], APS_KEY_Z85_LEN + 1, "%s", key);
	snprintf(out->jobs[out->n++], APS_KEY_JOBS_MAX, "%s", jobs);
	return 0;
}

/* The job globs after a key: visible ASCII words, up to a '#' comment. */
static int parse_jobs(char *rest, char *jobs, size_t cap, const char **reason)
{
	size_t used = 0;

	jobs[0] = '\0';
	for (char *w = strtok(rest, " \t"); w != NULL && w[0] != '#'; w = strtok(NULL, " \t")) {
		for (const char *c = w; *c; c++) {
			if (*c < '!' || *c > '~') {
				*reason = "a job name is not visible ASCII";
				return APS_ECONFIG;
			}
		}
		if (strlen(w) > 64 || used + strlen(w) + 2 > cap) {
			*reason = "a job name is longer than 64 bytes, or the line's jobs than 511";
			return APS_ECONFIG;
		}
		used += (size_t)snprintf(jobs + used, cap - used, "%s%s", used ? " " : "", w);
	}
	return 0;
}

static int parse_line(char *line, struct aps_keys *out, const char **reason)
{
	char *key = line + strspn(line, " \t"), *rest, jobs[APS_KEY_JOBS_MAX];
	size_t len;

	key[strcspn(key, "\r\n")] = '\0';
	if (key[0] == '\0' || key[0] == '#')
		return 0;
	len = strcspn(key, " \t");
	rest = key + len;
	if (*rest != '\0')
		*rest++ = '\0';
	if (len != APS_KEY_Z85_LEN || strspn(key, z85_alphabet) != APS_KEY_Z85_LEN) {
		*reason = "not a Z85 key of 40 characters";
		return APS_ECONFIG;
	}
	if (parse_jobs(rest, jobs, sizeof(jobs), reason) < 0)
		return APS_ECONFIG;
	return add_key(out, key, jobs);
}

int aps_keys_load(const char *path, struct aps_keys *out, char *why, size_t why_len)
{
	FILE *f = fopen(path, "r");
	const char *reason = NULL;
	char line[APS_KEY_JOBS_MAX + 64];
	int ret = 0, lineno = 0;

	memset(out, 0, sizeof(*out));
	if (f == NULL) {
		snprintf(why, why_len, "%s: cannot read it", path);
		return APS_ECONFIG;
	}
	while (ret == 0 && fgets(line, sizeof(line), f) != NULL) {
		lineno++;
		ret = parse_line(line, out, &reason);
	}
	fclose(f);
	if (ret == 0 && out->n == 0) {
		ret = APS_ECONFIG;
		reason = "no key in the file";
	}
	if (ret == 0 && ((out->list = malloc(out->n * sizeof(*out->list))) == NULL ||
	                 (out->job_list = malloc(out->n * sizeof(*out->job_list))) == NULL))
		ret = APS_ENOMEM;
	for (size_t i = 0; ret == 0 && i < out->n; i++) {
		out->list[i] = out->keys[i];
		out->job_list[i] = out->jobs[i];
	}
	if (ret < 0) {
		snprintf(why, why_len, "%s:%d: %s", path, lineno,
		         reason ? reason : "out of memory");
		aps_keys_free(out);
	}
	return ret;
}

void aps_keys_free(struct aps_keys *k)
{
	free(k->keys);
	free(k->list);
	free(k->jobs);
	free(k->job_list);
	memset(k, 0, sizeof(*k));
}

int aps_endpoint_is_loopback(const char *endpoint)
{
	const char *host;
	size_t len;

	if (strncmp(endpoint, "tcp://", 6) != 0)
		return 1; /* ipc:// and inproc:// never leave the host */
	host = endpoint + 6;
	len = strcspn(host, ":");
	if (host[0] == '[')
		return strncmp(host, "[::1]", 5) == 0;
	return strncmp(host, "127.", 4) == 0 || (len == 9 && strncmp(host, "localhost", 9) == 0);
}
