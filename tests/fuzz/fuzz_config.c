/*
 * libFuzzer harness of the daemon's configuration parser (docs/FUZZING.md).
 * Each input is read twice. First as a whole config file, by
 * aps_config_load_file. Then split at NUL bytes as a command line, by
 * aps_config_parse_args: the first piece is the text of a second file that an
 * argument "@" names (so that "--config @" mixes a file and flags), every later
 * piece is one argument after argv[0] = "apsd". Both files are memfds created
 * once per process and rewritten in place. A command line with an argument
 * that could name another file (a '/' outside "scheme://", or "..") is
 * skipped: the fuzzer must not open /dev/stdin or a FIFO. The --help text
 * goes to /dev/null. A configuration that loads also yields its policy, whose
 * tensor-name rules are matched against a few names. Any broken promise of
 * config.h aborts.
 */
#include "common/err.h"
#include "common/rules.h"
#include "server/config.h"
#include "server/policy.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define CHECK(cond) check((cond), #cond, __LINE__)

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A file the parser reads: a memfd and its /proc path. */
struct memfile {
	int fd;
	char path[64];
};

static struct memfile whole; /* the input */
static struct memfile first; /* the input up to its first NUL, for "@" */

static void check(bool ok, const char *what, int line)
{
	if (ok)
		return;
	fprintf(stderr, "fuzz_config.c:%d: broken rule: %s\n", line, what);
	abort();
}

static void memfile_open(struct memfile *f, const char *name)
{
	f->fd = memfd_create(name, 0);
	CHECK(f->fd >= 0);
	snprintf(f->path, sizeof(f->path), "/proc/self/fd/%d", f->fd);
}

static void memfile_write(const struct memfile *f, const uint8_t *data, size_t size)
{
	size_t done = 0;

	CHECK(ftruncate(f->fd, 0) == 0);
	while (done < size) {
		ssize_t n = pwrite(f->fd, data + done, size - done, (off_t)done);

		CHECK(n > 0);
		done += (size_t)n;
	}
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	memfile_open(&whole, "fuzz_config");
	memfile_open(&first, "fuzz_config_first");
	CHECK(freopen("/dev/null", "w", stdout) != NULL);
	return 0;
}

/* The policy a loaded configuration yields, its rules tried on a few tensor names. */
static void check_policy(const struct aps_config *cfg)
{
	static const char *const names[] = { "fc.weight", "layers.0.attn.bias", "", "*" };
	struct aps_policy_config policy;
	struct aps_format format;

	aps_config_get_policy(cfg, &policy);
	CHECK(memchr(policy.rules, '\0', sizeof(policy.rules)) != NULL);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		if (aps_rules_match(policy.rules, names[i], &format))
			CHECK(format.bits >= 1 && format.bits <= 32);
	}
	(void)aps_config_get_downlink(cfg, &format);
}

/* What a loaded configuration always satisfies. */
static void check_config(const struct aps_config *cfg)
{
	char line[4096], small[17];

	CHECK(memchr(cfg->listen, '\0', sizeof(cfg->listen)) != NULL);
	CHECK(strncmp(cfg->listen, "tcp://", 6) == 0 || strncmp(cfg->listen, "ipc://", 6) == 0 ||
	      strncmp(cfg->listen, "inproc://", 9) == 0);
	CHECK((long long)cfg->heartbeat_timeout_ms >= 2LL * cfg->heartbeat_ms);
	aps_config_describe(cfg, line, sizeof(line));
	CHECK(memchr(line, '\0', sizeof(line)) != NULL);
	aps_config_describe(cfg, small, sizeof(small));
	CHECK(memchr(small, '\0', sizeof(small)) != NULL);
	aps_config_describe(cfg, small, 1);
	CHECK(small[0] == '\0');
	aps_config_describe(cfg, small, 0);
	check_policy(cfg);
}

/* ret and err as config.h promises; *cfg untouched unless it succeeded. */
static void check_outcome(int ret, const struct aps_config *before, const struct aps_config *after,
                          const struct aps_config_error *err)
{
	if (ret == 0) {
		check_config(after);
		return;
	}
	CHECK(ret == APS_ECONFIG);
	CHECK(memcmp(before, after, sizeof(*before)) == 0);
	CHECK(memchr(err->message, '\0', sizeof(err->message)) != NULL);
	CHECK(err->message[0] != '\0');
}

static void load_whole(const uint8_t *data, size_t size, const struct aps_config *defaults)
{
	struct aps_config cfg;
	struct aps_config_error err;
	int ret;

	memfile_write(&whole, data, size);
	memcpy(&cfg, defaults, sizeof(cfg));
	ret = aps_config_load_file(&cfg, whole.path, &err);
	check_outcome(ret, defaults, &cfg, &err);
}

/* False for what might name a file other than "@": see the top of this file. */
static bool harmless(const char *arg)
{
	return strchr(arg, '/') == NULL ||
	       (strstr(arg, "://") != NULL && strstr(arg, "..") == NULL);
}

/* A command line: argv[0..argc) each in its own heap block, and argv[argc] = NULL. */
struct cmdline {
	int argc;
	char **argv;
	bool uses_first; /* an argument is "@" */
	bool harmless;
};

static char *copy_string(const char *s, size_t len)
{
	char *p = malloc(len + 1);

	CHECK(p != NULL);
	memcpy(p, s, len);
	p[len] = '\0';
	return p;
}

static void cmdline_add(struct cmdline *cl, const char *s, size_t len)
{
	char *arg = copy_string(s, len);

	cl->harmless = cl->harmless && harmless(arg);
	if (strcmp(arg, "@") == 0) {
		free(arg);
		arg = copy_string(first.path, strlen(first.path));
		cl->uses_first = true;
	}
	cl->argv[cl->argc++] = arg;
	cl->argv[cl->argc] = NULL;
}

/* Pieces after the first NUL, each ended by a NUL or the end of the input. */
static void cmdline_split(struct cmdline *cl, const uint8_t *data, size_t size, size_t start)
{
	size_t pieces = 2;

	for (size_t i = start; i < size; i++)
		pieces += data[i] == '\0';
	cl->argv = calloc(pieces + 1, sizeof(*cl->argv));
	CHECK(cl->argv != NULL);
	cl->argc = 0;
	cl->harmless = true;
	cl->uses_first = false;
	cmdline_add(cl, "apsd", 4);
	while (start < size) {
		const uint8_t *end = memchr(data + start, '\0', size - start);
		size_t len = end != NULL ? (size_t)(end - (data + start)) : size - start;

		cmdline_add(cl, (const char *)data + start, len);
		start += len + 1;
	}
}

static void cmdline_free(struct cmdline *cl)
{
	for (int i = 0; i < cl->argc; i++)
		free(cl->argv[i]);
	free(cl->argv);
}

static void parse_args(const uint8_t *data, size_t size, const struct aps_config *defaults)
{
	const uint8_t *nul = memchr(data, '\0', size);
	size_t first_len = nul != NULL ? (size_t)(nul - data) : size;
	struct aps_config_error err;
	struct aps_config cfg;
	struct cmdline cl;
	bool exit_now;
	int ret;

	cmdline_split(&cl, data, size, nul != NULL ? first_len + 1 : size);
	if (!cl.harmless)
		goto out;
	if (cl.uses_first)
		memfile_write(&first, data, first_len);
	memcpy(&cfg, defaults, sizeof(cfg));
	ret = aps_config_parse_args(&cfg, cl.argc, cl.argv, &err, &exit_now);
	check_outcome(ret, defaults, &cfg, &err);
	if (exit_now)
		CHECK(ret == 0 && memcmp(&cfg, defaults, sizeof(cfg)) == 0);
out:
	cmdline_free(&cl);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct aps_config defaults;

	aps_config_defaults(&defaults);
	load_whole(data, size, &defaults);
	parse_args(data, size, &defaults);
	return 0;
}
