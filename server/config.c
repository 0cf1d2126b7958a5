/*
 * Loads the daemon's configuration: the defaults, then a file (INI-style),
 * then flags, each key through its line of the table (config_keys.c).
 * Parsing works on a copy that is committed only when everything, cross-key
 * checks included, is valid. Errors are returned as text naming the file
 * and line or the flag, never printed; only the usage and version text asked
 * for with --help and --version go to stdout.
 */
#include "server/config.h"

#include "server/config_keys.h"
#include "server/keys.h"
#include "server/netlist.h"
#include "server/policy.h"

#include "common/err.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifndef APS_VERSION
#define APS_VERSION "0.1.0"
#endif
#define NKEYS aps_config_nkeys
#define keys  aps_config_keys

/* Where a key was last set during one load: a file line or a flag. */
struct origin {
	unsigned int seq; /* 0: not set by this load; larger: set later */
	const char *path; /* file, or NULL for a flag */
	int line;
	const char *flag; /* the flag as typed; flag_len bytes, without "=value" */
	int flag_len;
};

struct loader {
	struct aps_config cfg; /* work copy, committed on success */
	struct aps_config_error *err;
	unsigned int seq;
	struct origin origin[APS_CONFIG_KEYS_MAX];
};

static int fail(struct aps_config_error *err, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));

static int fail(struct aps_config_error *err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(err->message, sizeof(err->message), fmt, ap);
	va_end(ap);
	return APS_ECONFIG;
}

static void loader_init(struct loader *ld, const struct aps_config *cfg,
                        struct aps_config_error *err)
{
	memset(ld, 0, sizeof(*ld));
	ld->cfg = *cfg;
	ld->err = err;
}

static void origin_describe(const struct origin *o, char *buf, size_t len)
{
	if (o->path != NULL)
		snprintf(buf, len, "%s:%d", o->path, o->line);
	else if (o->flag != NULL)
		snprintf(buf, len, "%.*s", o->flag_len, o->flag);
	else
		snprintf(buf, len, "config");
}

static const struct origin *origin_of(const struct loader *ld, const char *name)
{
	int idx = aps_config_key_find(name, strlen(name));

	assert(idx >= 0);
	return &ld->origin[idx];
}

/* Gradients leave the host only encrypted, unless the operator says otherwise. */
static int check_security(struct loader *ld)
{
	const struct aps_config *c = &ld->cfg;
	char where[APS_CONFIG_ERROR_MAX];

	if ((c->curve_secret_key_file[0] == '\0') != (c->curve_allow_file[0] == '\0')) {
		origin_describe(origin_of(ld, c->curve_allow_file[0] ? "curve_allow_file"
		                                                     : "curve_secret_key_file"),
		                where, sizeof(where));
		return fail(ld->err,
		            "%s: CURVE needs both curve_secret_key_file and "
		            "curve_allow_file",
		            where);
	}
	if (c->curve_secret_key_file[0] != '\0' || c->insecure ||
	    aps_endpoint_is_loopback(c->listen))
		return 0;
	origin_describe(origin_of(ld, "listen"), where, sizeof(where));
	return fail(ld->err,
	            "%s: listening on %s without CURVE would send gradients in clear: set "
	            "curve_secret_key_file and curve_allow_file, or insecure = yes",
	            where, c->listen);
}

/* Networks too: a typo must not let everyone in, nor nobody. */
static int check_allow_from(struct loader *ld)
{
	struct aps_netlist nets;
	char why[200], where[APS_CONFIG_ERROR_MAX];

	if (aps_netlist_parse(&nets, ld->cfg.allow_from, why, sizeof(why)) == 0)
		return 0;
	origin_describe(origin_of(ld, "allow_from"), where, sizeof(where));
	return fail(ld->err, "%s: %s", where, why);
}

/* Rules are checked once, here, so that a typo stops the daemon at start. */
static int check_rules(struct loader *ld)
{
	char why[160], where[APS_CONFIG_ERROR_MAX];

	if (aps_policy_check_rules(ld->cfg.rules, why, sizeof(why)) == 0)
		return 0;
	origin_describe(origin_of(ld, "rules"), where, sizeof(where));
	return fail(ld->err, "%s: %s", where, why);
}

/* sum = lowp is the paper's algorithm: it needs one exponent for all workers. */
static int check_sum(struct loader *ld)
{
	const struct origin *a = origin_of(ld, "sum");
	const struct origin *b = origin_of(ld, "scaling");
	char where[APS_CONFIG_ERROR_MAX];

	if (ld->cfg.sum == APS_SUM_LOWP && ld->cfg.elastic) {
		const struct origin *e = origin_of(ld, "elastic");
		origin_describe(a->seq > e->seq ? a : e, where, sizeof(where));
		return fail(ld->err,
		            "%s: sum = lowp and elastic = yes do not go together (the workers "
		            "divide a lowp sum by the world size)",
		            where);
	}
	if (ld->cfg.sum != APS_SUM_LOWP || ld->cfg.scaling == APS_SCALING_GLOBAL)
		return 0;
	origin_describe(a->seq > b->seq ? a : b, where, sizeof(where));
	return fail(ld->err, "%s: sum = lowp needs scaling = global (scaling is %s)", where,
	            aps_config_scalings[ld->cfg.scaling]);
}

/* A worker's largest frame is one fp32 chunk: a smaller limit would close its connections. */
static int check_message_size(struct loader *ld)
{
	const struct origin *a = origin_of(ld, "max_message_bytes");
	const struct origin *b = origin_of(ld, "chunk_bytes");
	uint64_t max = ld->cfg.max_message_bytes, chunk = ld->cfg.chunk_bytes;
	char where[APS_CONFIG_ERROR_MAX];

	if (max == 0 || max >= chunk + 64 * KIB)
		return 0;
	origin_describe(a->seq > b->seq ? a : b, where, sizeof(where));
	return fail(ld->err,
	            "%s: max_message_bytes (%llu) must hold a chunk: at least chunk_bytes (%llu) "
	            "+ 64k, or 0",
	            where, (unsigned long long)max, (unsigned long long)chunk);
}

static int check_cross(struct loader *ld)
{
	const struct origin *a = origin_of(ld, "heartbeat_ms");
	const struct origin *b = origin_of(ld, "heartbeat_timeout_ms");
	int hb = ld->cfg.heartbeat_ms, timeout = ld->cfg.heartbeat_timeout_ms;
	char where[APS_CONFIG_ERROR_MAX];

	if ((long long)timeout >= 2LL * hb)
		return check_sum(ld) < 0 || check_rules(ld) < 0 || check_message_size(ld) < 0 ||
		                       check_allow_from(ld) < 0
		               ? APS_ECONFIG
		               : check_security(ld);
	origin_describe(a->seq > b->seq ? a : b, where, sizeof(where));
	return fail(ld->err,
	            "%s: heartbeat_timeout_ms (%d) must be at least twice heartbeat_ms (%d)", where,
	            timeout, hb);
}

enum line_status {
	LINE_OK,
	LINE_EOF,
	LINE_TOO_LONG,
	LINE_NUL,
	LINE_IOERR,
};

/* Reads one line, without its newline or CR, into buf of APS_CONFIG_LINE_MAX + 2 bytes. */
static enum line_status read_line(FILE *f, char *buf, size_t cap)
{
	size_t n = 0;
	int c;

	while ((c = getc(f)) != EOF && c != '\n') {
		if (c == '\0')
			return LINE_NUL;
		if (n + 1 >= cap)
			return LINE_TOO_LONG;
		buf[n++] = (char)c;
	}
	if (c == EOF && ferror(f))
		return LINE_IOERR;
	if (c == EOF && n == 0)
		return LINE_EOF;
	if (n > 0 && buf[n - 1] == '\r')
		n--;
	buf[n] = '\0';
	return n > APS_CONFIG_LINE_MAX ? LINE_TOO_LONG : LINE_OK;
}

static char *trim(char *s)
{
	char *end;

	while (isspace((unsigned char)*s))
		s++;
	end = s + strlen(s);
	while (end > s && isspace((unsigned char)end[-1]))
		end--;
	*end = '\0';
	return s;
}

/* Cuts s at a '#' or ';' that starts it or follows whitespace, outside double quotes. */
static void strip_comment(char *s)
{
	bool quoted = false;

	for (char *p = s; *p != '\0'; p++) {
		if (*p == '"')
			quoted = !quoted;
		else if (!quoted && (*p == '#' || *p == ';') &&
		         (p == s || isspace((unsigned char)p[-1]))) {
			*p = '\0';
			return;
		}
	}
}

static int load_section(struct loader *ld, const char *path, int line, char *s)
{
	size_t len = strlen(s);
	char *name;

	if (s[len - 1] != ']')
		return fail(ld->err, "%s:%d: '%.*s%s': missing ']' after the section name", path,
		            line, CLIP(s));
	s[len - 1] = '\0';
	name = trim(s + 1);
	if (strcmp(name, "apsd") != 0)
		return fail(ld->err, "%s:%d: unknown section [%.*s%s] (apsd reads only [apsd])",
		            path, line, CLIP(name));
	return 0;
}

/* Removes double quotes around *val; fails when the closing one is missing. */
static int unquote(char **val)
{
	size_t len = strlen(*val);

	if (**val != '"')
		return 0;
	if (len < 2 || (*val)[len - 1] != '"')
		return APS_ECONFIG;
	(*val)[len - 1] = '\0';
	(*val)++;
	return 0;
}

static int unknown_key(struct loader *ld, const char *path, int line, const char *key)
{
	const char *hint = aps_config_key_suggest(key, strlen(key), NULL);

	if (hint != NULL)
		return fail(ld->err, "%s:%d: unknown key '%s' (did you mean '%s'?)", path, line,
		            key, hint);
	return fail(ld->err, "%s:%d: unknown key '%.*s%s'", path, line, CLIP(key));
}

static int load_assignment(struct loader *ld, const char *path, int line, char *s)
{
	char reason[REASON_MAX], *eq = strchr(s, '='), *key, *val;
	struct origin *o;
	int idx, ret;

	if (eq == NULL)
		return fail(ld->err, "%s:%d: '%.*s%s': missing '=' (expected key = value)", path,
		            line, CLIP(s));
	*eq = '\0';
	key = trim(s);
	val = trim(eq + 1);
	if (*key == '\0')
		return fail(ld->err, "%s:%d: missing key before '='", path, line);
	idx = aps_config_key_find(key, strlen(key));
	if (idx < 0)
		return unknown_key(ld, path, line, key);
	o = &ld->origin[idx];
	if (o->seq != 0)
		return fail(ld->err, "%s:%d: duplicate key '%s' (first set on line %d)", path, line,
		            key, o->line);
	if (unquote(&val) < 0)
		return fail(ld->err, "%s:%d: %s = '%.*s%s': missing closing quote", path, line, key,
		            CLIP(val));
	ret = aps_config_key_parse(&keys[idx], val, &ld->cfg, reason);
	if (ret == APS_ERANGE)
		return fail(ld->err, "%s:%d: %s = %.*s%s: %s", path, line, key, CLIP(val), reason);
	if (ret < 0)
		return fail(ld->err, "%s:%d: %s = '%.*s%s': %s", path, line, key, CLIP(val),
		            reason);
	*o = (struct origin){ .seq = ++ld->seq, .path = path, .line = line };
	return 0;
}

static int load_line(struct loader *ld, const char *path, int line, char *text)
{
	char *s = text;

	if (line == 1 && strncmp(s, "\xEF\xBB\xBF", 3) == 0)
		s += 3; /* UTF-8 byte order mark */
	s = trim(s);
	strip_comment(s);
	s = trim(s);
	if (*s == '\0')
		return 0;
	if (*s == '[')
		return load_section(ld, path, line, s);
	return load_assignment(ld, path, line, s);
}

static int load_stream(struct loader *ld, const char *path, FILE *f)
{
	char text[APS_CONFIG_LINE_MAX + 2];
	int ret;

	for (int line = 1;; line++) {
		switch (read_line(f, text, sizeof(text))) {
		case LINE_EOF:
			return 0;
		case LINE_TOO_LONG:
			return fail(ld->err, "%s:%d: line longer than %d bytes", path, line,
			            APS_CONFIG_LINE_MAX);
		case LINE_NUL:
			return fail(ld->err, "%s:%d: NUL byte (not a text file?)", path, line);
		case LINE_IOERR:
			return fail(ld->err, "%s: %s", path, strerror(errno));
		case LINE_OK:
			break;
		}
		ret = load_line(ld, path, line, text);
		if (ret < 0)
			return ret;
	}
}

static int load_path(struct loader *ld, const char *path)
{
	FILE *f = fopen(path, "r");
	int ret;

	if (f == NULL)
		return fail(ld->err, "%s: %s", path, strerror(errno));
	ret = load_stream(ld, path, f);
	fclose(f);
	return ret;
}

int aps_config_load_file(struct aps_config *cfg, const char *path, struct aps_config_error *err)
{
	struct aps_config_error scratch;
	struct loader ld;
	int ret;

	if (cfg == NULL || path == NULL)
		return APS_EINVAL;
	loader_init(&ld, cfg, err != NULL ? err : &scratch);
	ret = load_path(&ld, path);
	if (ret < 0)
		return ret;
	ret = check_cross(&ld);
	if (ret < 0)
		return ret;
	*cfg = ld.cfg;
	return 0;
}

enum {
	FLAG_CONFIG = -1, /* flag_extras[0] */
	FLAG_HELP = -2,
	FLAG_VERSION = -3,
	FLAG_UNKNOWN = -4,
};

static const char *const flag_extras[] = { "config", "help", "version", NULL };

struct flag {
	const char *name; /* as typed, "--log-level"; name_len bytes */
	int name_len;
	const char *value; /* NULL for help and version */
	int idx;           /* in keys[], or FLAG_* */
};

static int flag_index(const char *s, size_t len)
{
	int idx = aps_config_key_find(s, len);

	if (idx >= 0)
		return idx;
	for (int i = 0; flag_extras[i] != NULL; i++) {
		if (aps_config_name_matches(s, len, flag_extras[i]))
			return -1 - i;
	}
	return FLAG_UNKNOWN;
}

static int unknown_flag(struct aps_config_error *err, const char *s, int len)
{
	const char *hint =
	        len > 2 ? aps_config_key_suggest(s + 2, (size_t)len - 2, flag_extras) : NULL;
	const char *cut = len > SHOW_MAX ? "..." : "";

	if (s[1] == '-' && hint != NULL)
		return fail(err, "%.*s: unknown option (did you mean --%s?)", len, s, hint);
	return fail(err, "%.*s%s: unknown option (see --help)", len > SHOW_MAX ? SHOW_MAX : len, s,
	            cut);
}

/* Splits argv[*i], and its value when separate, into fl and moves *i past them. */
static int next_flag(int argc, char **argv, int *i, struct flag *fl, struct aps_config_error *err)
{
	const char *arg = argv[(*i)++], *eq = strchr(arg, '=');

	*fl = (struct flag){ .name = arg, .name_len = 2, .idx = FLAG_HELP };
	if (strcmp(arg, "-h") == 0)
		return 0;
	if (arg[0] != '-' || arg[1] == '\0' || strcmp(arg, "--") == 0)
		return fail(err, "%.*s%s: unexpected argument (options are --key value)",
		            CLIP(arg));
	fl->name_len = eq != NULL ? (int)(eq - arg) : (int)strlen(arg);
	if (arg[1] != '-')
		return unknown_flag(err, arg, fl->name_len);
	fl->idx = flag_index(arg + 2, (size_t)fl->name_len - 2);
	fl->value = eq != NULL ? eq + 1 : NULL;
	if (fl->idx == FLAG_UNKNOWN)
		return unknown_flag(err, arg, fl->name_len);
	if (fl->idx == FLAG_HELP || fl->idx == FLAG_VERSION)
		return eq == NULL ? 0 : fail(err, "%.*s: takes no value", fl->name_len, arg);
	if (eq == NULL && *i < argc && strncmp(argv[*i], "--", 2) != 0)
		fl->value = argv[(*i)++];
	if (fl->value == NULL || (fl->idx == FLAG_CONFIG && fl->value[0] == '\0'))
		return fail(err, "%.*s: needs a value", fl->name_len, arg);
	return 0;
}

/* First pass: the shape of argv, --help, --version and the --config file. */
static int scan_flags(int argc, char **argv, const char **config, bool *exit_now,
                      struct aps_config_error *err)
{
	struct flag fl;
	int ret;

	for (int i = 1; i < argc;) {
		ret = next_flag(argc, argv, &i, &fl, err);
		if (ret < 0)
			return ret;
		if (fl.idx == FLAG_HELP)
			aps_config_print_usage(stdout);
		if (fl.idx == FLAG_VERSION)
			printf("apsd %s\n", APS_VERSION);
		*exit_now = fl.idx == FLAG_HELP || fl.idx == FLAG_VERSION;
		if (*exit_now)
			return 0;
		if (fl.idx == FLAG_CONFIG && *config != NULL)
			return fail(err, "%.*s: given more than once", fl.name_len, fl.name);
		if (fl.idx == FLAG_CONFIG)
			*config = fl.value;
	}
	return 0;
}

/* Second pass: every key flag in order, over whatever the file set. */
static int apply_flags(struct loader *ld, int argc, char **argv)
{
	char reason[REASON_MAX];
	struct flag fl;
	int ret;

	for (int i = 1; i < argc;) {
		ret = next_flag(argc, argv, &i, &fl, ld->err);
		if (ret < 0)
			return ret;
		if (fl.idx < 0)
			continue;
		ret = aps_config_key_parse(&keys[fl.idx], fl.value, &ld->cfg, reason);
		if (ret < 0)
			return fail(ld->err, "%.*s=%.*s%s: %s", fl.name_len, fl.name,
			            CLIP(fl.value), reason);
		ld->origin[fl.idx] = (struct origin){ .seq = ++ld->seq,
			                              .flag = fl.name,
			                              .flag_len = fl.name_len };
	}
	return 0;
}

int aps_config_parse_args(struct aps_config *cfg, int argc, char **argv,
                          struct aps_config_error *err, bool *exit_now)
{
	struct aps_config_error scratch;
	const char *config = NULL;
	struct loader ld;
	int ret;

	if (cfg == NULL || argv == NULL || exit_now == NULL)
		return APS_EINVAL;
	*exit_now = false;
	loader_init(&ld, cfg, err != NULL ? err : &scratch);
	ret = scan_flags(argc, argv, &config, exit_now, ld.err);
	if (ret < 0 || *exit_now)
		return ret;
	if (config != NULL)
		ret = load_path(&ld, config);
	if (ret == 0)
		ret = apply_flags(&ld, argc, argv);
	if (ret == 0)
		ret = check_cross(&ld);
	if (ret == 0)
		*cfg = ld.cfg;
	return ret;
}

bool aps_config_get_downlink(const struct aps_config *cfg, struct aps_format *out)
{
	if (cfg->downlink <= APS_DOWNLINK_AUTO || cfg->downlink > APS_DOWNLINK_BF16)
		return false;
	return aps_format_parse(aps_config_downlinks[cfg->downlink], out) == 0;
}

void aps_config_get_policy(const struct aps_config *cfg, struct aps_policy_config *out)
{
	aps_policy_defaults(out);
	out->automatic = cfg->policy == 1;
	snprintf(out->rules, sizeof(out->rules), "%s", cfg->rules);
	out->schedule_steps = (uint64_t)cfg->schedule_steps;
	aps_format_parse(aps_config_wide_formats[cfg->schedule_format], &out->schedule_format);
	out->small_elems = (uint64_t)cfg->small_tensor_elems;
	out->flush_up = cfg->flush_up;
	out->flush_down = cfg->flush_down;
	out->error_up = cfg->error_up;
	out->error_down = cfg->error_down;
	out->window_up = (uint32_t)cfg->window_up;
	out->window_down = (uint32_t)cfg->window_down;
}
