/*
 * Logging: one line per event to stderr, "key=value" fields, the level chosen
 * at run time. Under systemd (stderr is the journal) lines carry a <N> priority
 * prefix instead of a timestamp. Used by the daemon and tools, never by libaps.
 */
#ifndef APS_COMMON_LOG_H
#define APS_COMMON_LOG_H

#include <stdbool.h>
#include <stdint.h>

enum aps_log_level {
	APS_LOG_ERROR = 0,
	APS_LOG_WARN = 1,
	APS_LOG_INFO = 2,
	APS_LOG_DEBUG = 3,
};

void aps_log_set_level(enum aps_log_level level);
bool aps_log_enabled(enum aps_log_level level);

/* Parses "error", "warn", "info" or "debug"; returns 0 or APS_EINVAL. */
int aps_log_level_parse(const char *name, enum aps_log_level *out);
const char *aps_log_level_name(enum aps_log_level level);

void aps_log(enum aps_log_level level, const char *component, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/*
 * One line a period at most for an event that a peer can repeat: open() says
 * whether a line is due at now (false: this one is held back and counted);
 * pass() starts a period at now and returns how many were held back since the
 * last line. A gate of zeros lets the first line through.
 */
struct aps_log_gate {
	uint64_t logged_ms; /* 0: never */
	uint64_t held;
};
bool aps_log_gate_open(struct aps_log_gate *g, uint64_t now_ms, uint64_t period_ms);
uint64_t aps_log_gate_pass(struct aps_log_gate *g, uint64_t now_ms);

#define aps_log_error(comp, ...) aps_log(APS_LOG_ERROR, comp, __VA_ARGS__)
#define aps_log_warn(comp, ...)  aps_log(APS_LOG_WARN, comp, __VA_ARGS__)
#define aps_log_info(comp, ...)  aps_log(APS_LOG_INFO, comp, __VA_ARGS__)
#define aps_log_debug(comp, ...)                                   \
	do {                                                       \
		if (aps_log_enabled(APS_LOG_DEBUG))                \
			aps_log(APS_LOG_DEBUG, comp, __VA_ARGS__); \
	} while (0)

#endif
