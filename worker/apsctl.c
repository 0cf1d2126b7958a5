/*
 * apsctl: the operator's view of a running apsd through its stats socket.
 * `apsctl stats|jobs|workers|tensors` prints a table (or the daemon's JSON
 * with --json); `apsctl top` refreshes a live view until q or Ctrl-C.
 */
#include "common/statspath.h"
#include "worker/aps.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <termios.h>
#include <unistd.h>

#define DOC_MAX (64u << 20)

struct opts {
	const char *path;
	const char *command;
	bool json;
	char default_path[256];
};

static int usage(void)
{
	fprintf(stderr, "usage: apsctl [--stats PATH | --endpoint ENDPOINT] "
	                "stats|jobs|workers|tensors|top [--json]\n"
	                "       apsctl keygen PREFIX   writes PREFIX.key (secret) and PREFIX.pub\n"
	                "  the socket is --stats, else $APS_STATS, else the default path of the\n"
	                "  daemon at --endpoint (default $APS_ENDPOINT or tcp://127.0.0.1:5555)\n");
	return 2;
}

/* Sends one command and reads the whole answer; NULL with a message on failure. */
static char *query(const char *path, const char *command)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	size_t len = 0, cap = 1 << 16;
	char *doc = NULL;
	ssize_t n;
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		fprintf(stderr, "apsctl: cannot connect to %s: %s (is apsd running? see --stats)\n",
		        path, strerror(errno));
		goto out;
	}
	if (dprintf(fd, "%s\n", command) < 0 || (doc = malloc(cap)) == NULL)
		goto out;
	while ((n = read(fd, doc + len, cap - len - 1)) > 0) {
		len += (size_t)n;
		if (len + 1 == cap && cap < DOC_MAX) {
			char *grown = realloc(doc, cap *= 2);
			if (grown == NULL)
				break;
			doc = grown;
		}
	}
	doc[len] = '\0';
out:
	if (fd >= 0)
		close(fd);
	return doc;
}

static json_t *query_json(const char *path, const char *command)
{
	char *text = query(path, command);
	json_error_t err;
	json_t *doc;

	if (text == NULL)
		return NULL;
	doc = json_loads(text, 0, &err);
	if (doc == NULL)
		fprintf(stderr, "apsctl: bad answer from %s: %s\n", path, err.text);
	free(text);
	return doc;
}

static const char *str(json_t *o, const char *key)
{
	const char *s = json_string_value(json_object_get(o, key));

	return s != NULL ? s : "-";
}

static long long num(json_t *o, const char *key)
{
	return (long long)json_number_value(json_object_get(o, key));
}

static double real(json_t *o, const char *key)
{
	return json_number_value(json_object_get(o, key));
}

static void print_stats(json_t *doc)
{
	json_t *lat = json_object_get(doc, "round_latency"), *c = json_object_get(doc, "counters");
	json_t *bad = json_object_get(c, "bad_messages"), *v;
	const char *key;

	printf("apsd %s at %s, up %.0f s: %lld jobs, %lld workers\n", str(doc, "version"),
	       str(doc, "endpoint"), real(doc, "uptime_s"), num(doc, "jobs"), num(doc, "workers"));
	printf("round latency: p50 %.1f us, p90 %.1f us, p99 %.1f us over %lld rounds\n",
	       real(lat, "p50_us"), real(lat, "p90_us"), real(lat, "p99_us"), num(lat, "rounds"));
	printf("config: %s\n", str(doc, "config"));
	json_object_foreach(c, key, v)
	{
		if (json_is_integer(v))
			printf("  %-20s %lld\n", key, (long long)json_integer_value(v));
	}
	json_object_foreach(bad, key, v)
	{
		if (json_integer_value(v) != 0)
			printf("  bad message %-8s %lld\n", key, (long long)json_integer_value(v));
	}
}

static void print_jobs(json_t *doc)
{
	json_t *j, *s;
	size_t i, k;

	printf("%-16s %5s %9s %-7s %-8s %7s %8s %10s\n", "JOB", "WORLD", "CONNECTED", "SCALING",
	       "DOWNLINK", "TENSORS", "STEP", "ROUNDS");
	json_array_foreach(json_object_get(doc, "jobs"), i, j)
	{
		printf("%-16.16s %5lld %9lld %-7s %-8s %7lld %8lld %10lld\n", str(j, "name"),
		       num(j, "world_size"), num(j, "connected"), str(j, "scaling"),
		       str(j, "downlink"), num(j, "tensors"), num(j, "step"), num(j, "rounds"));
		if (json_is_true(json_object_get(j, "reading_checkpoint")))
			printf("  reading its checkpoint: %.1f of %.1f MiB\n",
			       (double)num(j, "checkpoint_read_bytes") / 1048576.0,
			       (double)num(j, "checkpoint_bytes") / 1048576.0);
		json_array_foreach(json_object_get(j, "stalls"), k, s)
		{
			char *missing = json_dumps(json_object_get(s, "missing"), JSON_COMPACT);
			const char *what = str(s, "waiting_for");
			if (strcmp(what, "checkpoint_copy") == 0)
				printf("  waiting %.1f s for its checkpoint's copy: tensor %s step %lld\n",
				       real(s, "waiting_s"), str(s, "tensor"), num(s, "step"));
			else if (strcmp(what, "apsd") == 0)
				printf("  waiting %.1f s for apsd to sum and send it: tensor %s step "
				       "%lld\n",
				       real(s, "waiting_s"), str(s, "tensor"), num(s, "step"));
			else
				printf("  waiting %.1f s for ranks %s: tensor %s step %lld\n",
				       real(s, "waiting_s"), missing ? missing : "?",
				       str(s, "tensor"), num(s, "step"));
			free(missing);
		}
		if (num(j, "stalls_unlisted") > 0)
			printf("  and %lld more tensors waiting\n", num(j, "stalls_unlisted"));
	}
}

static void print_workers(json_t *doc)
{
	json_t *w;
	size_t i;

	printf("%-16s %5s %-22s %10s %9s %12s %12s %7s\n", "JOB", "RANK", "ADDRESS", "CONNECTED",
	       "LAST SEEN", "BYTES IN", "BYTES OUT", "RECONN");
	json_array_foreach(json_object_get(doc, "workers"), i, w)
	{
		printf("%-16.16s %5lld %-22.22s %9.0fs %8.1fs %12lld %12lld %7lld", str(w, "job"),
		       num(w, "rank"), str(w, "address"), real(w, "connected_s"),
		       real(w, "last_seen_s"), num(w, "bytes_in"), num(w, "bytes_out"),
		       num(w, "reconnects"));
		if (real(w, "away_s") > 0)
			printf("  (connection closed %.1fs ago)", real(w, "away_s"));
		printf("\n");
	}
	if (num(doc, "workers_unlisted") > 0)
		printf("and %lld more ranks: apsd lists 4096, shared out among the jobs\n",
		       num(doc, "workers_unlisted"));
}

static void print_tensors(json_t *doc)
{
	json_t *t;
	size_t i;

	printf("%-12s %-28s %10s %-7s %5s %8s %8s %12s %12s %6s %5s\n", "JOB", "TENSOR", "COUNT",
	       "FORMAT", "K", "FLUSHED", "OVERFLOW", "BYTES IN", "BYTES OUT", "RATIO", "BITS");
	json_array_foreach(json_object_get(doc, "tensors"), i, t)
	{
		printf("%-12.12s %-28.28s %10lld %-7s %5lld %7.3f%% %8lld %12lld %12lld %5.1fx "
		       "%5.2f\n",
		       str(t, "job"), str(t, "name"), num(t, "count"), str(t, "format"),
		       num(t, "scale_exp"), 100 * real(t, "flushed_fraction"), num(t, "overflow"),
		       num(t, "bytes_in"), num(t, "bytes_out"), real(t, "compression"),
		       real(t, "bits_per_element"));
	}
	if (num(doc, "tensors_unlisted") > 0)
		printf("and %lld more tensors: apsd lists 4096, shared out among the jobs\n",
		       num(doc, "tensors_unlisted"));
}

static int show(const struct opts *o)
{
	static const struct {
		const char *name;
		void (*print)(json_t *doc);
	} commands[] = { { "stats", print_stats },
		         { "jobs", print_jobs },
		         { "workers", print_workers },
		         { "tensors", print_tensors } };
	json_t *doc;

	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++) {
		if (strcmp(o->command, commands[i].name) != 0)
			continue;
		if (o->json) {
			char *text = query(o->path, o->command);
			if (text == NULL)
				return 1;
			fputs(text, stdout);
			free(text);
			return 0;
		}
		if ((doc = query_json(o->path, o->command)) == NULL)
			return 1;
		commands[i].print(doc);
		json_decref(doc);
		return 0;
	}
	return usage();
}

static volatile sig_atomic_t interrupted;
static struct termios saved_tty;
static bool tty_raw;

static void on_sigint(int signum)
{
	(void)signum;
	interrupted = 1;
}

static void raw_mode(bool on)
{
	struct termios t;

	if (on && isatty(STDIN_FILENO) && tcgetattr(STDIN_FILENO, &saved_tty) == 0) {
		t = saved_tty;
		t.c_lflag &= ~(tcflag_t)(ICANON | ECHO);
		tty_raw = tcsetattr(STDIN_FILENO, TCSANOW, &t) == 0;
	} else if (!on && tty_raw) {
		tcsetattr(STDIN_FILENO, TCSANOW, &saved_tty);
	}
}

/* True when q was typed within timeout_ms. */
static bool quit_typed(int timeout_ms)
{
	struct pollfd p = { .fd = STDIN_FILENO, .events = POLLIN };
	char c;

	if (poll(&p, 1, timeout_ms) <= 0)
		return false;
	return read(STDIN_FILENO, &c, 1) == 1 && (c == 'q' || c == 'Q');
}

static void top_header(json_t *st, double *prev_rounds, double *prev_bytes)
{
	json_t *c = json_object_get(st, "counters"), *lat = json_object_get(st, "round_latency");
	double rounds = real(c, "rounds"), bytes = real(c, "bytes_in") + real(c, "bytes_out");

	printf("\033[H\033[2Japsd %s at %s   up %.0f s   q or Ctrl-C quits\n", str(st, "version"),
	       str(st, "endpoint"), real(st, "uptime_s"));
	printf("rounds/s %8.1f   MB/s %8.2f   round p50 %.0f us  p99 %.0f us   workers %lld\n\n",
	       *prev_rounds < 0 ? 0.0 : rounds - *prev_rounds,
	       *prev_rounds < 0 ? 0.0 : (bytes - *prev_bytes) / 1e6, real(lat, "p50_us"),
	       real(lat, "p99_us"), num(st, "workers"));
	*prev_rounds = rounds;
	*prev_bytes = bytes;
}

/* The ranks heard from least recently: who a stalled job waits for. */
static void top_slowest(json_t *doc)
{
	json_t *workers = json_object_get(doc, "workers"), *w;
	size_t i, n = json_array_size(workers);

	printf("\nslowest ranks (longest since last message):\n");
	for (int shown = 0; shown < 5 && n > 0; shown++) {
		size_t worst = 0;
		json_array_foreach(workers, i, w)
		{
			if (real(w, "last_seen_s") >
			    real(json_array_get(workers, worst), "last_seen_s"))
				worst = i;
		}
		w = json_array_get(workers, worst);
		printf("  %-16.16s rank %4lld  %-22.22s %6.1f s\n", str(w, "job"), num(w, "rank"),
		       str(w, "address"), real(w, "last_seen_s"));
		json_array_remove(workers, worst);
		n--;
	}
}

static void top_wide(json_t *doc)
{
	static const char *const wide[] = { "fp32", "fp16", "bf16" };
	json_t *t;
	size_t i;

	printf("\ntensors on a wider format:\n");
	json_array_foreach(json_object_get(doc, "tensors"), i, t)
	{
		for (size_t k = 0; k < sizeof(wide) / sizeof(wide[0]); k++) {
			if (strcmp(str(t, "format"), wide[k]) == 0)
				printf("  %-16.16s %-32.32s %s\n", str(t, "job"), str(t, "name"),
				       wide[k]);
		}
	}
}

static int top(const struct opts *o)
{
	double prev_rounds = -1, prev_bytes = 0;
	int ret = 0;

	signal(SIGINT, on_sigint);
	raw_mode(true);
	while (!interrupted) {
		json_t *st = query_json(o->path, "stats"), *jobs = query_json(o->path, "jobs");
		json_t *workers = query_json(o->path, "workers");
		json_t *tensors = query_json(o->path, "tensors");
		if (st == NULL || jobs == NULL || workers == NULL || tensors == NULL) {
			ret = 1;
			interrupted = 1;
		} else {
			top_header(st, &prev_rounds, &prev_bytes);
			print_jobs(jobs);
			top_slowest(workers);
			top_wide(tensors);
			fflush(stdout);
		}
		json_decref(st);
		json_decref(jobs);
		json_decref(workers);
		json_decref(tensors);
		if (!interrupted && quit_typed(1000))
			break;
	}
	raw_mode(false);
	return ret;
}

static int parse(struct opts *o, int argc, char **argv)
{
	const char *endpoint = getenv("APS_ENDPOINT");

	o->path = getenv("APS_STATS");
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--json") == 0)
			o->json = true;
		else if (strcmp(argv[i], "--stats") == 0 && i + 1 < argc)
			o->path = argv[++i];
		else if (strcmp(argv[i], "--endpoint") == 0 && i + 1 < argc)
			endpoint = argv[++i];
		else if (argv[i][0] != '-' && o->command == NULL)
			o->command = argv[i];
		else
			return -1;
	}
	if (o->command == NULL)
		return -1;
	if (o->path == NULL || o->path[0] == '\0') {
		aps_stats_default_path(endpoint ? endpoint : "tcp://127.0.0.1:5555",
		                       o->default_path, sizeof(o->default_path));
		o->path = o->default_path;
	}
	return 0;
}

/* Writes one key line to path with mode 0600, refusing to overwrite. */
static int write_key(const char *path, const char *key, const char *what)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);

	if (fd < 0 || dprintf(fd, "# apsd CURVE %s key (Z85)\n%s\n", what, key) < 0) {
		fprintf(stderr, "apsctl: cannot write %s: %s\n", path, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 1;
	}
	return close(fd) < 0;
}

/* A CURVE key pair: PREFIX.key for the owner, PREFIX.pub for the allowlist. */
static int keygen(const char *prefix)
{
	char public_key[41], secret_key[41], path[4096];

	if (aps_curve_keypair(public_key, secret_key) < 0) {
		fprintf(stderr, "apsctl: ZeroMQ has no CURVE support here\n");
		return 1;
	}
	snprintf(path, sizeof(path), "%s.key", prefix);
	if (write_key(path, secret_key, "secret") != 0)
		return 1;
	snprintf(path, sizeof(path), "%s.pub", prefix);
	if (write_key(path, public_key, "public") != 0)
		return 1;
	printf("%s.key (secret, 0600) and %s.pub (public): %s\n", prefix, prefix, public_key);
	return 0;
}

int main(int argc, char **argv)
{
	struct opts o = { 0 };

	if (argc == 3 && strcmp(argv[1], "keygen") == 0 && argv[2][0] != '-')
		return keygen(argv[2]);
	if (parse(&o, argc, argv) < 0)
		return usage();
	if (strcmp(o.command, "top") == 0)
		return top(&o);
	return show(&o);
}
