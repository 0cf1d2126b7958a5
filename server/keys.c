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

static int add_key(struct aps_keys *out, const char *key)
{
	char(*grown)[APS_KEY_Z85_LEN + 1] = realloc(out->keys, (out->n + 1) * sizeof(*grown));

	if (grown == NULL)
		return APS_ENOMEM;
	out->keys = grown;
	snprintf(out->keys[out->n++], APS_KEY_Z85_LEN + 1, "%s", key);
	return 0;
}

static int parse_line(char *line, struct aps_keys *out, const char **reason)
{
	char *key = line + strspn(line, " \t");

	key[strcspn(key, "\r\n")] = '\0';
	for (size_t n = strlen(key); n > 0 && (key[n - 1] == ' ' || key[n - 1] == '\t'); n--)
		key[n - 1] = '\0';
	if (key[0] == '\0' || key[0] == '#')
		return 0;
	if (strlen(key) != APS_KEY_Z85_LEN || strspn(key, z85_alphabet) != APS_KEY_Z85_LEN) {
		*reason = "not a Z85 key of 40 characters";
		return APS_ECONFIG;
	}
	return add_key(out, key);
}

int aps_keys_load(const char *path, struct aps_keys *out, char *why, size_t why_len)
{
	FILE *f = fopen(path, "r");
	const char *reason = NULL;
	char line[256];
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
	if (ret == 0 && (out->list = malloc(out->n * sizeof(*out->list))) == NULL)
		ret = APS_ENOMEM;
	for (size_t i = 0; ret == 0 && i < out->n; i++)
		out->list[i] = out->keys[i];
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
