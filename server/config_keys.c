/*
 * The daemon's configuration keys. One table, aps_config_keys[], names every
 * key with its type, range, default (as text, parsed like any other value),
 * help and place in struct aps_config; the defaults, the file and flag parser
 * (config.c), the usage text and the startup summary all walk it.
 */
#include "server/config_keys.h"

#include "server/keys.h"
#include "server/policy.h"

#include "common/err.h"
#include "proto/frame.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#define NAME_MAX_BYTES 64 /* longer names get no did-you-mean */

static const char *const log_levels[] = { "error", "warn", "info", "debug", NULL };
const char *const aps_config_downlinks[] = { "auto", "fp32", "fp16", "bf16", NULL };
/* The order of enum aps_scaling and of enum aps_sum. */
const char *const aps_config_scalings[] = { "none", "local", "global", "block", NULL };
static const char *const sums[] = { "fp32", "lowp", NULL };
static const char *const policies[] = { "off", "auto", NULL };
static const char *const yes_no[] = { "no", "yes", NULL };
const char *const aps_config_wide_formats[] = { "fp32", "fp16", "bf16", NULL };

/* Name and place of a key, from the field itself so that they cannot disagree. */
#define KEY(f) .name = #f, .offset = offsetof(struct aps_config, f)

const struct key aps_config_keys[] = {
	{ KEY(listen), .type = KEY_ENDPOINT, .def = "tcp://127.0.0.1:5555",
	  .help = "ZeroMQ endpoint to bind (tcp://, ipc:// or inproc://)" },
	{ KEY(log_level), .type = KEY_CHOICE, .choices = log_levels, .def = "info",
	  .help = "least severe event logged to stderr" },
	{ KEY(downlink), .type = KEY_CHOICE, .choices = aps_config_downlinks, .def = "auto",
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
	{ KEY(max_jobs_per_address), .type = KEY_INT, .min = 0, .max = 4096, .def = "16",
	  .help = "jobs one IP address (IPv6: its /64; ipc: one user) may have started that "
	          "still run; one more HELLO for a new job from there is refused (0: no limit)" },
	{ KEY(max_connections), .type = KEY_INT, .min = 0, .max = 1 << 20, .def = "0",
	  .help = "connections open at once; one more is shut at once (0: from RLIMIT_NOFILE, "
	          "two descriptors a connection and 64 spare)" },
	{ KEY(max_connections_per_address), .type = KEY_INT, .min = 0, .max = 1 << 20,
	  .def = "1024",
	  .help = "connections open at once from one IP address (IPv6: its /64); one more is shut "
	          "at once; never 127.0.0.1, ::1 or ipc (0: no limit)" },
	{ KEY(join_timeout_ms), .type = KEY_INT, .min = 100, .max = 86400000, .def = "60000",
	  .help = "a connection that has not joined a job, or a job whose ranks have not all "
	          "joined, within this many milliseconds is dropped (its slot freed); so is a job "
	          "that cannot go on (a rank lost) this long after" },
	{ KEY(max_silent_closes), .type = KEY_INT, .min = 0, .max = 1000000, .def = "32",
	  .help = "handshakes from one IP address in a minute that may lead to no message; "
	          "past it apsd refuses that address's handshakes for a minute, twice as long "
	          "at each repeat up to an hour; never 127.0.0.1, ::1, ipc, or an address from "
	          "which a joined worker is connected (0: nobody is turned away)" },
	{ KEY(max_ranks), .type = KEY_INT, .min = 1, .max = APS_MSG_RANKS_MAX, .def = "1024",
	  .help = "ranks (world size) of one job" },
	{ KEY(max_tensors), .type = KEY_INT, .min = 1, .max = 1048576, .def = "65536",
	  .help = "tensors registered by one job" },
	{ KEY(max_job_bytes), .type = KEY_SIZE, .min = KIB, .max = 1024 * GIB, .def = "8G",
	  .help = "fp32 bytes of the tensors one job may register (suffixes k, M, G)" },
	{ KEY(max_total_bytes), .type = KEY_SIZE, .min = 0, .max = 1024 * 1024 * GIB, .def = "0",
	  .help = "bytes the tensors of every job together may hold, their values and what "
	          "each keeps per rank (0: half the memory of the machine or of its cgroup)" },
	{ KEY(max_address_bytes), .type = KEY_SIZE, .min = 0, .max = 1024 * 1024 * GIB, .def = "0",
	  .help = "bytes of max_total_bytes the jobs started from one IP address (IPv6: its "
	          "/64; ipc: one user) may hold together, so that one address cannot register "
	          "all of it (0: half of max_total_bytes)" },
	{ KEY(max_held_bytes), .type = KEY_SIZE, .min = 0, .max = 1024 * 1024 * GIB, .def = "0",
	  .help = "bytes of pushes that came before a lower rank's, held until their turn, over "
	          "every job; past it such a push is not kept and its rank is asked for it again "
	          "when its turn comes (0: a quarter of max_total_bytes)" },
	{ KEY(max_message_bytes), .type = KEY_SIZE, .min = 0, .max = 4 * GIB, .def = "0",
	  .help = "largest frame accepted; a larger one closes its connection (0: chunk_bytes "
	          "+ 64k, the largest a worker sends)" },
	{ KEY(drain_batch), .type = KEY_INT, .min = 1, .max = 65536, .def = "256",
	  .help = "messages read per socket wake-up" },
	{ KEY(threads), .type = KEY_INT, .min = 0, .max = 1024, .def = "0",
	  .help = "threads that sum and encode large chunks, each a share of the chunks (1: the "
	          "event loop itself; 0: the cores of the daemon's CPU set)" },
	{ KEY(io_threads), .type = KEY_INT, .min = 0, .max = 64, .def = "0",
	  .help = "ZeroMQ I/O threads, connections spread over them (0: a quarter of the CPU "
	          "set's cores, at least 1)" },
	{ KEY(scaling), .type = KEY_CHOICE, .choices = aps_config_scalings, .def = "local",
	  .help = "APS scaling of jobs whose workers do not choose (global: the paper; block: an "
	          "exponent per block of 32 elements)" },
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
	{ KEY(allow_from), .type = KEY_STRING, .def = "", .unset = "anyone NETS",
	  .help = "networks whose peers may connect, comma-separated: \"10.1.0.0/16, 10.2.0.7\" "
	          "(127.0.0.1, ::1 and ipc always may; others are closed at accept)" },
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
	{ KEY(schedule_format), .type = KEY_CHOICE, .choices = aps_config_wide_formats,
	  .def = "fp32", .help = "the format of the scheduled first steps" },
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
	{ KEY(checkpoint_max_bytes), .type = KEY_SIZE, .min = 0, .max = 1024 * 1024 * GIB,
	  .def = "0",
	  .help = "bytes the checkpoint files of every job may take together; room for a new "
	          "file comes from the files of ended jobs (the largest writer's oldest "
	          "first), else the write fails and the job's last files stay (0: a quarter "
	          "of checkpoint_dir's filesystem)" },
};

const size_t aps_config_nkeys = sizeof(aps_config_keys) / sizeof(aps_config_keys[0]);
#define NKEYS (sizeof(aps_config_keys) / sizeof(aps_config_keys[0]))
#define keys  aps_config_keys

_Static_assert(NKEYS <= APS_CONFIG_KEYS_MAX, "APS_CONFIG_KEYS_MAX is too small");

_Static_assert(sizeof(enum aps_log_level) == sizeof(int), "choice keys are stored as int");
_Static_assert(sizeof(enum aps_downlink) == sizeof(int), "choice keys are stored as int");

static char norm(char c)
{
	return c == '-' ? '_' : c;
}

bool aps_config_name_matches(const char *s, size_t len, const char *name)
{
	size_t i;

	for (i = 0; i < len && name[i] != '\0'; i++) {
		if (norm(s[i]) != name[i])
			return false;
	}
	return i == len && name[i] == '\0';
}

int aps_config_key_find(const char *s, size_t len)
{
	for (size_t i = 0; i < NKEYS; i++) {
		if (aps_config_name_matches(s, len, keys[i].name))
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

const char *aps_config_key_suggest(const char *s, size_t len, const char *const *extra)
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

void aps_config_key_format(const struct key *k, const struct aps_config *cfg, char *buf, size_t len)
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

/* A tcp:// address: HOST:PORT, [IPV6]:PORT; PORT digits or * (any free one). */
static int check_tcp_address(const char *addr, char *reason)
{
	const char *close = addr[0] == '[' ? strchr(addr, ']') : NULL;
	const char *colon = strrchr(addr, ':');
	const char *port = colon != NULL ? colon + 1 : NULL;

	if (addr[0] == '[' && (close == NULL || close[1] != ':')) {
		snprintf(reason, REASON_MAX,
		         "an IPv6 address in brackets needs ]:PORT after it "
		         "(tcp://[::1]:5555)");
		return APS_ECONFIG;
	}
	if (addr[0] != '[' && colon != NULL && strchr(addr, ':') != colon) {
		snprintf(reason, REASON_MAX, "an IPv6 address goes in brackets (tcp://[::1]:5555)");
		return APS_ECONFIG;
	}
	if (port == NULL || port[0] == '\0' ||
	    (strcmp(port, "*") != 0 && (strspn(port, "0123456789") != strlen(port) ||
	                                strlen(port) > 5 || atoi(port) > 65535))) {
		snprintf(reason, REASON_MAX,
		         "needs HOST:PORT, PORT 0 to 65535 or * (tcp://HOST:5555)");
		return APS_ECONFIG;
	}
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
		if (i == 0 && check_tcp_address(text + n, reason) < 0)
			return APS_ECONFIG;
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

int aps_config_key_parse(const struct key *k, const char *text, struct aps_config *cfg,
                         char *reason)
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
		int ret = aps_config_key_parse(&keys[i], keys[i].def, cfg, reason);

		(void)ret;
		assert(ret == 0);
	}
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
		aps_config_key_format(&keys[i], cfg, value, sizeof(value));
		used += (size_t)snprintf(buf + used, len - used, "%s%s=%s", i == 0 ? "" : " ",
		                         keys[i].name, value);
	}
}
