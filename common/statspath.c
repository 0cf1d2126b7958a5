/*
 * The default path of a daemon's stats socket.
 */
#include "common/statspath.h"

#include "common/err.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t hash_name(const char *s)
{
	uint32_t h = 2166136261u;

	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 16777619u;
	return h;
}

int aps_stats_default_path(const char *endpoint, char *buf, size_t len)
{
	const char *dir = getenv("RUNTIME_DIRECTORY"), *colon = strrchr(endpoint, ':');
	char port[16];
	int n;

	if (strncmp(endpoint, "tcp://", 6) == 0 && colon != NULL && colon[1] != '\0')
		snprintf(port, sizeof(port), "%.10s", colon + 1);
	else
		snprintf(port, sizeof(port), "%08x", hash_name(endpoint));
	if (dir != NULL && dir[0] != '\0')
		n = snprintf(buf, len, "%.*s/stats.sock", (int)strcspn(dir, ":"), dir);
	else if ((dir = getenv("XDG_RUNTIME_DIR")) != NULL && dir[0] != '\0')
		n = snprintf(buf, len, "%s/apsd-%s.sock", dir, port);
	else
		n = snprintf(buf, len, "/tmp/apsd-%u-%s.sock", (unsigned)getuid(), port);
	return n > 0 && (size_t)n < len ? 0 : APS_ERANGE;
}
