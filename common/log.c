/*
 * The logger: formats one line and writes it to stderr in a single write(2),
 * so that lines from several threads or processes never interleave.
 */
#include "common/log.h"

#include "common/err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define LINE_MAX_BYTES 2048

static enum aps_log_level current_level = APS_LOG_INFO;
static int journal = -1; /* -1: not checked yet */

static const char *const level_names[] = { "error", "warn", "info", "debug" };
/* syslog priorities: err, warning, info, debug */
static const int level_priority[] = { 3, 4, 6, 7 };

void aps_log_set_level(enum aps_log_level level)
{
	current_level = level;
}

bool aps_log_gate_open(struct aps_log_gate *g, uint64_t now_ms, uint64_t period_ms)
{
	if (g->logged_ms != 0 && now_ms - g->logged_ms < period_ms) {
		g->held++;
		return false;
	}
	return true;
}

uint64_t aps_log_gate_pass(struct aps_log_gate *g, uint64_t now_ms)
{
	uint64_t held = g->held;

	g->logged_ms = now_ms;
	g->held = 0;
	return held;
}

bool aps_log_enabled(enum aps_log_level level)
{
	return level <= current_level;
}

int aps_log_level_parse(const char *name, enum aps_log_level *out)
{
	for (int i = APS_LOG_ERROR; name != NULL && i <= APS_LOG_DEBUG; i++) {
		if (strcmp(name, level_names[i]) == 0) {
			*out = (enum aps_log_level)i;
			return 0;
		}
	}
	return APS_EINVAL;
}

const char *aps_log_level_name(enum aps_log_level level)
{
	if (level < APS_LOG_ERROR || level > APS_LOG_DEBUG)
		return "unknown";
	return level_names[level];
}

/* JOURNAL_STREAM is "dev:ino" of the journal's socket; stderr must be that file. */
static bool stderr_is_journal(void)
{
	const char *env = getenv("JOURNAL_STREAM");
	unsigned long long dev, ino;
	struct stat st;

	if (env == NULL || sscanf(env, "%llu:%llu", &dev, &ino) != 2)
		return false;
	if (fstat(STDERR_FILENO, &st) < 0)
		return false;
	return (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino;
}

static int line_prefix(char *buf, size_t len, enum aps_log_level level, const char *component)
{
	struct timespec ts;
	struct tm tm;

	if (journal < 0)
		journal = stderr_is_journal();
	if (journal)
		return snprintf(buf, len, "<%d>%s: ", level_priority[level], component);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	return snprintf(buf, len, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %s %s: ", tm.tm_year + 1900,
	                tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec,
	                ts.tv_nsec / 1000000, level_names[level], component);
}

void aps_log(enum aps_log_level level, const char *component, const char *fmt, ...)
{
	char line[LINE_MAX_BYTES];
	va_list ap;
	int used;

	if (!aps_log_enabled(level))
		return;
	used = line_prefix(line, sizeof(line) - 1, level, component);
	if (used < 0 || (size_t)used >= sizeof(line) - 1)
		used = 0;
	va_start(ap, fmt);
	int body = vsnprintf(line + used, sizeof(line) - 1 - (size_t)used, fmt, ap);
	va_end(ap);
	if (body > 0)
		used += body;
	if ((size_t)used > sizeof(line) - 2)
		used = sizeof(line) - 2;
	line[used++] = '\n';
	/* One write: a line is never split, not even between processes. */
	if (write(STDERR_FILENO, line, (size_t)used) < 0)
		return;
}
