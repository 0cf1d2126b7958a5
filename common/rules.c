/*
 * Parsing and matching format rules.
 */
#include "common/rules.h"

#include "common/err.h"

#include <fnmatch.h>
#include <stdio.h>
#include <string.h>

static char *trim(char *s)
{
	char *end;

	while (*s == ' ')
		s++;
	for (end = s + strlen(s); end > s && end[-1] == ' '; end--)
		end[-1] = '\0';
	return s;
}

/* Calls fn(glob, format or NULL, arg) per rule until fn returns non-zero; an
 * empty item (two commas, or one at an end) is a rule of glob "" too. */
static int each_rule(const char *rules, int (*fn)(const char *glob, const char *fmt, void *arg),
                     void *arg)
{
	char copy[APS_RULES_MAX], *all;
	int ret;

	snprintf(copy, sizeof(copy), "%s", rules != NULL ? rules : "");
	all = trim(copy);
	for (char *item = all[0] != '\0' ? all : NULL, *next; item != NULL; item = next) {
		char *eq;
		next = strchr(item, ',');
		if (next != NULL)
			*next++ = '\0';
		eq = strchr(item, '=');
		if (eq != NULL)
			*eq = '\0';
		ret = fn(trim(item), eq != NULL ? trim(eq + 1) : NULL, arg);
		if (ret != 0)
			return ret;
	}
	return 0;
}

struct check {
	char *why;
	size_t len;
};

static int check_one(const char *glob, const char *fmt, void *arg)
{
	struct check *c = arg;
	struct aps_format f;

	if (fmt == NULL && glob[0] == '\0') {
		snprintf(c->why, c->len, "an empty rule (two commas, or one at an end)");
		return APS_ECONFIG;
	}
	if (fmt == NULL || glob[0] == '\0') {
		snprintf(c->why, c->len, "rule '%s' is not GLOB=FORMAT", glob);
		return APS_ECONFIG;
	}
	if (aps_format_parse(fmt, &f) < 0) {
		snprintf(c->why, c->len, "rule '%s=%s': '%s' is not a format", glob, fmt, fmt);
		return APS_EFORMAT;
	}
	return 0;
}

int aps_rules_check(const char *rules, char *why, size_t why_len)
{
	struct check c = { why, why_len };

	if (rules != NULL && strlen(rules) >= APS_RULES_MAX) {
		snprintf(why, why_len, "rules are longer than %d bytes", APS_RULES_MAX - 1);
		return APS_ECONFIG;
	}
	return each_rule(rules, check_one, &c);
}

struct match {
	const char *name;
	struct aps_format *out;
};

static int match_one(const char *glob, const char *fmt, void *arg)
{
	struct match *m = arg;

	if (fmt == NULL || fnmatch(glob, m->name, 0) != 0)
		return 0;
	return aps_format_parse(fmt, m->out) == 0 ? 1 : 0;
}

bool aps_rules_match(const char *rules, const char *name, struct aps_format *out)
{
	struct match m = { name, out };

	return each_rule(rules, match_one, &m) == 1;
}
