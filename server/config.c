/*
 * The daemon's configuration keys. One table, keys[], names every key with its
 * type, range, default (as text, parsed like any other value), help and place
 * in struct aps_config; the defaults, the file parser, the flag parser, the
 * usage text and the startup summary all walk it. Parsing works on a copy
 * that is committed only when everything, cross-key checks included, is
 * valid. Errors are returned as text, never printed; only the usage and
 * version text asked for with --help and --version go to stdout.
 */
#include "server/config.h"

#include "server/keys.h"
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

#define NAME_MAX_BYTES 64 /* longer names get no did-you-mean */
#define REASON_MAX     160
#define VALUE_MAX      (APS_CONFIG_ENDPOINT_MAX + 1)
#define SHOW_MAX       64 /* bytes of a user string echoed in an error */
/* Arguments for "%.*s%s": s cut to SHOW_MAX bytes, with "..." when cut. */
#define CLIP(s) SHOW_MAX, (s), (strlen(s) > SHOW_MAX ? "..." : "")
#define KIB     1024LL
#define MIB     (1024 * KIB)
#define GIB     (1024 * MIB)

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

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };
static const char *const downlinks[] = { "auto", "fp32", "fp16", "bf16", NULL };
/* The order of enum aps_scaling and of enum aps_sum. */
static const char *const scalings[] = { "none", "local", "global", NULL };
static const char *const sums[] = { "fp32", "lowp", NULL };
static const char *const policies[] = { "off", "auto", NULL };
static const char *const yes_no[] = { "no", "yes", NULL };
static const char *const wide_formats[] = { "fp32", "fp16", "bf16", NULL };

/* Name and place of a key, from the field itself so that they cannot disagree. */
#define KEY(f) .name = #f, .offset = offsetof(struct aps_config, f)

static const struct key keys[] = {
	{ KEY(listen), .type = KEY_ENDPOINT, .def = "tcp://127.0.0.1:5555",
	  .help = "ZeroMQ endpoint to bind (tcp://, ipc:// or inproc://)" },
	{ KEY(log_level), .type = KEY_CHOICE, .choices = log_levels, .def = "info",
	  .help = "least severe event logged to stderr" },
	{ KEY(downlink), .type = KEY_CHOICE, .choices = downlinks, .def = "auto",
	  .help = "format of results; auto answers in each tensor's uplink format" },
	{ KEY(heartbeat_ms), .type = KEY_INT, .min = 100, .max = 60000, .def = "1000",
	  .help = "milliseconds between the daemon's checks of its workers' liveness" },
	{ KEY(heartbeat_timeout_ms), .type = KEY_INT, .min = 200, .max = 600000, .def = "5000",
	  .help = "milliseconds a joined worker may stay silent before its connection is taken "
	          "for dead (>= 2 * heartbeat_ms; workers speak every third of it)" },
	{ KEY(reconnect_grace_ms), .type = KEY_INT, .min = 0, .max = 600000, .def = "1500",
	  .help = "milliseconds a rank whose connection closed keeps its place for it to "
	          "reconnect (0: lost at once)" },
	{ KEY(max_jobs), .type = KEY_INT, .min = 1, .max = 4096, .def = "64",
	  .help = "jobs served at once" },
	{ KEY(max_connections), .type = KEY_INT, .min = 0, .max = 1 << 20, .def = "0",
	  .help = "connections open at once; one more is shut at once (0: from RLIMIT_NOFILE, "
	          "two descriptors a connection and 64 spare)" },
	{ KEY(join_timeout_ms), .type = KEY_INT, .min = 100, .max = 86400000, .def = "60000",
	  .help = "a connection that has not joined a job, or a job whose ranks have not all "
	          "joined, within this many milliseconds is dropped (its slot freed)" },
	{ KEY(max_ranks), .type = KEY_INT, .min = 1, .max = 65536, .def = "1024",
	  .help = "ranks (world size) of one job" },
	{ KEY(max_tensors), .type = KEY_INT, .min = 1, .max = 1048576, .def = "65536",
	  .help = "tensors registered by one job" },
	{ KEY(max_job_bytes), .type = KEY_SIZE, .min = KIB, .max = 1024 * GIB, .def = "8G",
	  .help = "fp32 bytes of the tensors one job may register (suffixes k, M, G)" },
	{ KEY(max_total_bytes), .type = KEY_SIZE, .min = 0, .max = 1024 * 1024 * GIB, .def = "0",
	  .help = "fp32 bytes the tensors of every job together may hold (0: half the memory "
	          "of the machine or of its cgroup)" },
	{ KEY(max_message_bytes), .type = KEY_SIZE, .min = 0, .max = 4 * GIB, .def = "0",
	  .help = "largest frame accepted; a larger one closes its connection (0: chunk_bytes "
	          "+ 64k, the largest a worker sends)" },
	{ KEY(drain_batch), .type = KEY_INT, .min = 1, .max = 65536, .def = "256",
	  .help = "messages read per socket wake-up" },
	{ KEY(scaling), .type = KEY_CHOICE, .choices = scalings, .def = "local",
	  .help = "APS scaling of jobs whose workers do not choose (global: the paper)" },
	{ KEY(sum), .type = KEY_CHOICE, .choices = sums, .def = "fp32",
	  .help = "fp32: exact sum; lowp: rounded to the format after each addition (needs "
	          "scaling = global)" },
	{ KEY(stats), .type = KEY_STRING, .def = "", .unset = "automatic PATH",
	  .help = "stats socket path (default: $RUNTIME_DIRECTORY/stats.sock, else "
	          "$XDG_RUNTIME_DIR/apsd-PORT.sock, else /tmp/apsd-UID-PORT.sock)" },
	{ KEY(metrics_listen), .type = KEY_STRING, .def = "", .unset = "off ADDR:PORT",
	  .help = "ADDR:PORT where GET /metrics serves Prometheus metrics (default: off)" },
	{ KEY(trace), .type = KEY_STRING, .def = "", .unset = "off FILE",
	  .help = "write a Chrome-trace timeline of every round stage to this file (default: off)" },
	{ KEY(curve_secret_key_file), .type = KEY_STRING, .def = "", .unset = "off FILE",
	  .help = "the daemon's CURVE secret key (apsctl keygen): encrypts and authenticates" },
	{ KEY(curve_allow_file), .type = KEY_STRING, .def = "", .unset = "off FILE",
	  .help = "public keys of the workers let in, one per line (with curve_secret_key_file)" },
	{ KEY(elastic), .type = KEY_CHOICE, .choices = yes_no, .def = "no",
	  .help = "yes: a lost rank shrinks its job (means over the ranks that contributed) and "
	          "may come back at a barrier; no: the others get APS_EPEERLOST" },
	{ KEY(insecure), .type = KEY_CHOICE, .choices = yes_no, .def = "no",
	  .help = "yes: allow listening beyond loopback without CURVE (gradients in clear)" },
	{ KEY(policy), .type = KEY_CHOICE, .choices = policies, .def = "off",
	  .help = "auto: tensors move up e3m0 -> e4m3 -> fp16 -> fp32 when flushed or wrong, "
	          "small tensors travel in fp32 (workers may also ask for it)" },
	{ KEY(rules), .type = KEY_STRING, .def = "", .unset = "none RULES",
	  .help = "per-tensor formats by name, first match wins: \"*.bias=fp32,fc.*=fp16\"" },
	{ KEY(schedule_steps), .type = KEY_INT, .min = 0, .max = 1000000000, .def = "0",
	  .help = "the first N steps of every tensor travel in schedule_format" },
	{ KEY(schedule_format), .type = KEY_CHOICE, .choices = wide_formats, .def = "fp32",
	  .help = "the format of the scheduled first steps" },
	{ KEY(small_tensor_elems), .type = KEY_INT, .min = 0, .max = 1 << 30, .def = "1024",
	  .help = "policy = auto: tensors with fewer elements travel in fp32" },
	{ KEY(flush_up), .type = KEY_REAL, .rmin = 0, .rmax = 1, .def = "0.5",
	  .help = "policy = auto: share of a tensor's values flushed to zero above which it moves "
	          "up" },
	{ KEY(flush_down), .type = KEY_REAL, .rmin = 0, .rmax = 1, .def = "0.05",
	  .help = "policy = auto: flushed share below which a tensor may move down" },
	{ KEY(error_up), .type = KEY_REAL, .rmin = 0, .rmax = 10, .def = "0.35",
	  .help = "policy = auto: relative error of the result above which a tensor moves up" },
	{ KEY(error_down), .type = KEY_REAL, .rmin = 0, .rmax = 10, .def = "0.1",
	  .help = "policy = auto: relative error below which a tensor may move down" },
	{ KEY(window_up), .type = KEY_INT, .min = 1, .max = 1000000, .def = "3",
	  .help = "policy = auto: consecutive bad steps before moving up" },
	{ KEY(window_down), .type = KEY_INT, .min = 1, .max = 1000000, .def = "50",
	  .help = "policy = auto: consecutive calm steps before moving down (doubles after a "
	          "tensor moves back up soon)" },
	{ KEY(chunk_bytes), .type = KEY_SIZE, .min = KIB, .max = GIB, .def = "4M",
	  .help = "large tensors travel in chunks of this many fp32 bytes (suffixes k, M, G)" },
	{ KEY(checkpoint_dir), .type = KEY_STRING, .def = "", .unset = "automatic DIR",
	  .help = "where optimize-mode jobs write checkpoints and resume from (default: "
	          "$STATE_DIRECTORY under systemd, else no checkpoints)" },
	{ KEY(checkpoint_steps), .type = KEY_INT, .min = 0, .max = 1000000000, .def = "100",
	  .help = "optimize mode: a checkpoint every N optimizer steps (0: only when the daemon "
	          "stops and when a job ends)" },
	{ KEY(checkpoint_keep), .type = KEY_INT, .min = 1, .max = 1000, .def = "2",
	  .help = "checkpoint files kept per job, newest first" },
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

_Static_assert(sizeof(enum aps_log_level) == sizeof(int), "choice keys are stored as int");
_Static_assert(sizeof(enum aps_downlink) == sizeof(int), "choice keys are stored as int");

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
	struct origin origin[NKEYS];
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

static char norm(char c)
{
	return c == '-' ? '_' : c;
}

/* True when the len bytes of s spell name, '-' standing for '_'. */
static bool name_matches(const char *s, size_t len, const char *name)
{
	size_t i;

	for (i = 0; i < len && name[i] != '\0'; i++) {
		if (norm(s[i]) != name[i])
			return false;
	}
	return i == len && name[i] == '\0';
}

static int find_key(const char *s, size_t len)
{
	for (size_t i = 0; i < NKEYS; i++) {
		if (name_matches(s, len, keys[i].name))
			return (int)i;
	}
	return -1;
}

static int min3(int a, int b, int c)
{
	int m = a < b ? a : b;

	return m < c ? m : c;
}

/* Optimal string alignment distance (edits and adjacent swaps); a is at most NAME_MAX_BYTES. */
static int edit_distance(const char *a, size_t alen, const char *b)
{
	int d[3][NAME_MAX_BYTES + 1];
	size_t blen = strlen(b);

	for (size_t j = 0; j <= blen; j++)
		d[0][j] = (int)j;
	for (size_t i = 1; i <= alen; i++) {
		int *cur = d[i % 3], *prev = d[(i - 1) % 3], *prev2 = d[(i + 1) % 3];

		cur[0] = (int)i;
		for (size_t j = 1; j <= blen; j++) {
			int cost = norm(a[i - 1]) != b[j - 1];

			cur[j] = min3(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost);
			if (i > 1 && j > 1 && norm(a[i - 1]) == b[j - 2] &&
			    norm(a[i - 2]) == b[j - 1] && prev2[j - 2] + 1 < cur[j])
				cur[j] = prev2[j - 2] + 1;
		}
	}
	return d[alen % 3][blen];
}

static void keep_closer(const char *s, size_t len, const char *name, int *best, const char **found)
{
	int dist = edit_distance(s, len, name);

	if (dist < *best) {
		*best = dist;
		*found = name;
	}
}

/* The key (or extra name, NULL-terminated) closest to s, or NULL when none is close. */
static const char *suggest(const char *s, size_t len, const char *const *extra)
{
	int best = (len >= 8 ? 3 : 2) + 1; /* more edits than this: no suggestion */
	const char *found = NULL;

	if (len > NAME_MAX_BYTES || len < 3)
		return NULL;
	for (size_t i = 0; i < NKEYS; i++)
		keep_closer(s, len, keys[i].name, &best, &found);
	for (size_t i = 0; extra != NULL && extra[i] != NULL; i++)
		keep_closer(s, len, extra[i], &best, &found);
	return found;
}

static void format_size(uint64_t v, char *buf, size_t len)
{
	static const char units[] = "GMk";
	uint64_t unit = GIB;

	for (int i = 0; i < 3; i++, unit /= KIB) {
		if (v != 0 && v % unit == 0) {
			snprintf(buf, len, "%" PRIu64 "%c", v / unit, units[i]);
			return;
		}
	}
	snprintf(buf, len, "%" PRIu64, v);
}

static int choice_count(const struct key *k)
{
	int n = 0;

	while (k->choices[n] != NULL)
		n++;
	return n;
}

static void format_value(const struct key *k, const struct aps_config *cfg, char *buf, size_t len)
{
	const void *field = (const char *)cfg + k->offset;
	int i;

	switch (k->type) {
	case KEY_ENDPOINT:
	case KEY_STRING:
		snprintf(buf, len, "%s", (const char *)field);
		break;
	case KEY_CHOICE:
		memcpy(&i, field, sizeof(i));
		snprintf(buf, len, "%s", i >= 0 && i < choice_count(k) ? k->choices[i] : "?");
		break;
	case KEY_INT:
		memcpy(&i, field, sizeof(i));
		snprintf(buf, len, "%d", i);
		break;
	case KEY_SIZE:
		format_size(*(const uint64_t *)field, buf, len);
		break;
	case KEY_REAL:
		snprintf(buf, len, "%g", *(const double *)field);
		break;
	}
}

/*
 * Value parsers write the field or a reason. They return APS_ERANGE when the
 * value is well formed but out of range (shown as is) and APS_ECONFIG when it
 * is not understood (shown quoted in file errors).
 */
static int range_error(const struct key *k, char *reason)
{
	char lo[32], hi[32];

	if (k->type == KEY_SIZE) {
		format_size((uint64_t)k->min, lo, sizeof(lo));
		format_size((uint64_t)k->max, hi, sizeof(hi));
	} else {
		snprintf(lo, sizeof(lo), "%lld", k->min);
		snprintf(hi, sizeof(hi), "%lld", k->max);
	}
	snprintf(reason, REASON_MAX, "must be between %s and %s", lo, hi);
	return APS_ERANGE;
}

static int parse_string(const char *text, char *field, char *reason)
{
	if (strlen(text) > APS_CONFIG_ENDPOINT_MAX) {
		snprintf(reason, REASON_MAX, "longer than %d bytes", APS_CONFIG_ENDPOINT_MAX);
		return APS_ECONFIG;
	}
	strcpy(field, text);
	return 0;
}

static int parse_endpoint(const char *text, char *field, char *reason)
{
	static const char *const schemes[] = { "tcp://", "ipc://", "inproc://" };

	if (strlen(text) > APS_CONFIG_ENDPOINT_MAX) {
		snprintf(reason, REASON_MAX, "longer than %d bytes", APS_CONFIG_ENDPOINT_MAX);
		return APS_ECONFIG;
	}
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++) {
		size_t n = strlen(schemes[i]);

		if (strncmp(text, schemes[i], n) != 0)
			continue;
		if (text[n] == '\0') {
			snprintf(reason, REASON_MAX, "no address after %s", schemes[i]);
			return APS_ECONFIG;
		}
		strcpy(field, text);
		return 0;
	}
	snprintf(reason, REASON_MAX, "must start with tcp://, ipc:// or inproc://");
	return APS_ECONFIG;
}

static int parse_choice(const struct key *k, const char *text, void *field, char *reason)
{
	size_t used = 0;

	for (int i = 0; k->choices[i] != NULL; i++) {
		if (strcmp(text, k->choices[i]) == 0) {
			memcpy(field, &i, sizeof(i));
			return 0;
		}
	}
	used = (size_t)snprintf(reason, REASON_MAX, "must be one of");
	for (int i = 0; k->choices[i] != NULL && used < REASON_MAX; i++)
		used += (size_t)snprintf(reason + used, REASON_MAX - used, "%s %s",
		                         i == 0 ? "" : ",", k->choices[i]);
	return APS_ECONFIG;
}

/* Decimal digits with an optional sign; *out saturates on overflow. */
static bool parse_decimal(const char *text, long long *out, const char **end)
{
	const char *digits = text + (*text == '-' || *text == '+');
	char *stop;

	if (*digits < '0' || *digits > '9')
		return false;
	errno = 0;
	*out = strtoll(text, &stop, 10);
	*end = stop;
	return true;
}

static int parse_int(const struct key *k, const char *text, void *field, char *reason)
{
	const char *end;
	long long v;
	int i;

	if (!parse_decimal(text, &v, &end) || *end != '\0') {
		snprintf(reason, REASON_MAX, "not an integer");
		return APS_ECONFIG;
	}
	if (errno == ERANGE || v < k->min || v > k->max)
		return range_error(k, reason);
	i = (int)v;
	memcpy(field, &i, sizeof(i));
	return 0;
}

static int parse_real(const struct key *k, const char *text, void *field, char *reason)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(text, &end);
	if (end == text || *end != '\0' || errno == ERANGE || v != v) {
		snprintf(reason, REASON_MAX, "not a number");
		return APS_ECONFIG;
	}
	if (v < k->rmin || v > k->rmax) {
		snprintf(reason, REASON_MAX, "must be between %g and %g", k->rmin, k->rmax);
		return APS_ERANGE;
	}
	memcpy(field, &v, sizeof(v));
	return 0;
}

static int parse_size(const struct key *k, const char *text, void *field, char *reason)
{
	const char *end;
	long long v, unit = 1;
	uint64_t bytes;

	if (*text == '-' || *text == '+' || !parse_decimal(text, &v, &end))
		goto not_a_size;
	if (*end == 'k' || *end == 'K')
		unit = KIB;
	else if (*end == 'M')
		unit = MIB;
	else if (*end == 'G')
		unit = GIB;
	if (unit != 1)
		end++;
	if (*end != '\0')
		goto not_a_size;
	if (errno == ERANGE || v > k->max / unit || v * unit < k->min)
		return range_error(k, reason);
	bytes = (uint64_t)(v * unit);
	memcpy(field, &bytes, sizeof(bytes));
	return 0;
not_a_size:
	snprintf(reason, REASON_MAX, "not a size (a number with an optional k, M or G suffix)");
	return APS_ECONFIG;
}

static int parse_value(const struct key *k, const char *text, struct aps_config *cfg, char *reason)
{
	void *field = (char *)cfg + k->offset;

	switch (k->type) {
	case KEY_ENDPOINT:
		return parse_endpoint(text, field, reason);
	case KEY_STRING:
		return parse_string(text, field, reason);
	case KEY_CHOICE:
		return parse_choice(k, text, field, reason);
	case KEY_INT:
		return parse_int(k, text, field, reason);
	case KEY_SIZE:
		return parse_size(k, text, field, reason);
	case KEY_REAL:
		return parse_real(k, text, field, reason);
	}
	return APS_EINVAL;
}

void aps_config_defaults(struct aps_config *cfg)
{
	char reason[REASON_MAX];

	memset(cfg, 0, sizeof(*cfg));
	for (size_t i = 0; i < NKEYS; i++) {
		int ret = parse_value(&keys[i], keys[i].def, cfg, reason);

		(void)ret;
		assert(ret == 0);
	}
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
	int idx = find_key(name, strlen(name));

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
	            scalings[ld->cfg.scaling]);
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
		return check_sum(ld) < 0 || check_rules(ld) < 0 || check_message_size(ld) < 0
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
	const char *hint = suggest(key, strlen(key), NULL);

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
	idx = find_key(key, strlen(key));
	if (idx < 0)
		return unknown_key(ld, path, line, key);
	o = &ld->origin[idx];
	if (o->seq != 0)
		return fail(ld->err, "%s:%d: duplicate key '%s' (first set on line %d)", path, line,
		            key, o->line);
	if (unquote(&val) < 0)
		return fail(ld->err, "%s:%d: %s = '%.*s%s': missing closing quote", path, line, key,
		            CLIP(val));
	ret = parse_value(&keys[idx], val, &ld->cfg, reason);
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
	int idx = find_key(s, len);

	if (idx >= 0)
		return idx;
	for (int i = 0; flag_extras[i] != NULL; i++) {
		if (name_matches(s, len, flag_extras[i]))
			return -1 - i;
	}
	return FLAG_UNKNOWN;
}

static int unknown_flag(struct aps_config_error *err, const char *s, int len)
{
	const char *hint = len > 2 ? suggest(s + 2, (size_t)len - 2, flag_extras) : NULL;
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
		ret = parse_value(&keys[fl.idx], fl.value, &ld->cfg, reason);
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

static void print_key_usage(FILE *out, const struct key *k)
{
	static const char *const metavars[] = {
		[KEY_ENDPOINT] = "ENDPOINT", [KEY_STRING] = "PATH",
		[KEY_CHOICE] = "",           [KEY_INT] = "N",
		[KEY_SIZE] = "SIZE",         [KEY_REAL] = "X",
	};
	/* "off FILE": the word says what empty means, the rest is the metavar */
	const char *unset = k->unset != NULL ? k->unset : "none VALUE";
	const char *metavar = k->type == KEY_STRING ? strchr(unset, ' ') + 1 : metavars[k->type];
	char left[96], lo[32], hi[32], none[16];
	int used = snprintf(left, sizeof(left), "--%s %s", k->name, metavar);

	snprintf(none, sizeof(none), "(%.*s)", (int)strcspn(unset, " "), unset);

	for (int i = 0; k->type == KEY_CHOICE && k->choices[i] != NULL; i++)
		used += snprintf(left + used, sizeof(left) - (size_t)used, "%s%s", i ? "|" : "",
		                 k->choices[i]);
	fprintf(out, "  %-36s default %s", left, k->def[0] ? k->def : none);
	if (k->type == KEY_INT || k->type == KEY_SIZE) {
		format_size((uint64_t)k->min, lo, sizeof(lo));
		format_size((uint64_t)k->max, hi, sizeof(hi));
		if (k->type == KEY_INT)
			fprintf(out, ", %lld..%lld", k->min, k->max);
		else
			fprintf(out, ", %s..%s", lo, hi);
	}
	if (k->type == KEY_REAL)
		fprintf(out, ", %g..%g", k->rmin, k->rmax);
	fprintf(out, "\n      %s\n", k->help);
}

void aps_config_print_usage(FILE *out)
{
	fputs("Usage: apsd [--config FILE] [--KEY VALUE | --KEY=VALUE]...\n"
	      "\n"
	      "Serves APS all-reduce to workers over ZeroMQ. Each key below can also be\n"
	      "written \"key = value\" in the --config file (INI-style, optional [apsd]);\n"
	      "flags override the file, which overrides the defaults. Dashes may stand\n"
	      "for underscores (--log-level).\n"
	      "\n"
	      "  --config FILE                        read keys from FILE before the flags\n"
	      "  -h, --help                           print this help and exit\n"
	      "  --version                            print the version and exit\n",
	      out);
	for (size_t i = 0; i < NKEYS; i++)
		print_key_usage(out, &keys[i]);
}

void aps_config_describe(const struct aps_config *cfg, char *buf, size_t len)
{
	char value[VALUE_MAX];
	size_t used = 0;

	if (len == 0)
		return;
	buf[0] = '\0';
	for (size_t i = 0; i < NKEYS && used < len; i++) {
		format_value(&keys[i], cfg, value, sizeof(value));
		used += (size_t)snprintf(buf + used, len - used, "%s%s=%s", i == 0 ? "" : " ",
		                         keys[i].name, value);
	}
}

bool aps_config_get_downlink(const struct aps_config *cfg, struct aps_format *out)
{
	if (cfg->downlink <= APS_DOWNLINK_AUTO || cfg->downlink > APS_DOWNLINK_BF16)
		return false;
	return aps_format_parse(downlinks[cfg->downlink], out) == 0;
}

void aps_config_get_policy(const struct aps_config *cfg, struct aps_policy_config *out)
{
	aps_policy_defaults(out);
	out->automatic = cfg->policy == 1;
	snprintf(out->rules, sizeof(out->rules), "%s", cfg->rules);
	out->schedule_steps = (uint64_t)cfg->schedule_steps;
	aps_format_parse(wide_formats[cfg->schedule_format], &out->schedule_format);
	out->small_elems = (uint64_t)cfg->small_tensor_elems;
	out->flush_up = cfg->flush_up;
	out->flush_down = cfg->flush_down;
	out->error_up = cfg->error_up;
	out->error_down = cfg->error_down;
	out->window_up = (uint32_t)cfg->window_up;
	out->window_down = (uint32_t)cfg->window_down;
}
