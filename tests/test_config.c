/*
 * Unit tests of the daemon configuration (server/config.h): defaults, the
 * file syntax and every error it reports, flags and their precedence, the
 * cross-key check, usage and the example deploy/apsd.conf. Files are written
 * to a temporary directory; APS_SOURCE_DIR (default ".") is tests/ in the
 * source tree.
 */
#include "common/err.h"
#include "server/config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define MAX_ARGS 16

static char tmp_dir[64];
static char conf_path[128];

static int setup(void **state)
{
	(void)state;
	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/test_config.XXXXXX");
	if (mkdtemp(tmp_dir) == NULL)
		return -1;
	snprintf(conf_path, sizeof(conf_path), "%s/apsd.conf", tmp_dir);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(conf_path);
	return rmdir(tmp_dir);
}

static void write_bytes(const char *text, size_t len)
{
	FILE *f = fopen(conf_path, "wb");

	assert_non_null(f);
	assert_int_equal(fwrite(text, 1, len, f), len);
	assert_int_equal(fclose(f), 0);
}

static void write_conf(const char *text)
{
	write_bytes(text, strlen(text));
}

/* Loads text over the defaults; returns what aps_config_load_file returned. */
static int load(const char *text, struct aps_config *cfg, struct aps_config_error *err)
{
	write_conf(text);
	aps_config_defaults(cfg);
	memset(err, 0, sizeof(*err));
	return aps_config_load_file(cfg, conf_path, err);
}

/* Checks that text fails with "<conf_path>:<where_reason>". */
static void expect_file_error(const char *text, const char *where_reason)
{
	struct aps_config_error err;
	struct aps_config cfg;
	char want[APS_CONFIG_ERROR_MAX];

	snprintf(want, sizeof(want), "%s:%s", conf_path, where_reason);
	if (load(text, &cfg, &err) != APS_ECONFIG)
		fail_msg("accepted: %s", text);
	assert_string_equal(err.message, want);
}

/* Parses the NULL-terminated flags over the defaults, as argv[1..]. */
static int parse(struct aps_config *cfg, struct aps_config_error *err, bool *exit_now, ...)
{
	char *argv[MAX_ARGS + 1] = { "apsd" };
	int argc = 1;
	va_list ap;

	va_start(ap, exit_now);
	while (argc < MAX_ARGS && (argv[argc] = va_arg(ap, char *)) != NULL)
		argc++;
	va_end(ap);
	aps_config_defaults(cfg);
	memset(err, 0, sizeof(*err));
	return aps_config_parse_args(cfg, argc, argv, err, exit_now);
}

#define PARSE(cfg, err, ...) parse(cfg, err, &exit_now, __VA_ARGS__, (char *)NULL)

static void expect_flag_error(const char *want, char *a, char *b, char *c)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now = true;

	assert_int_equal(PARSE(&cfg, &err, a, b, c), APS_ECONFIG);
	assert_false(exit_now);
	assert_string_equal(err.message, want);
}

static void test_config_defaults(void **state)
{
	struct aps_config cfg;
	char line[1024];

	(void)state;
	aps_config_defaults(&cfg);
	assert_string_equal(cfg.listen, "tcp://127.0.0.1:5555");
	assert_int_equal(cfg.log_level, APS_LOG_INFO);
	assert_int_equal(cfg.downlink, APS_DOWNLINK_AUTO);
	assert_int_equal(cfg.heartbeat_ms, 1000);
	assert_int_equal(cfg.heartbeat_timeout_ms, 5000);
	assert_int_equal(cfg.reconnect_grace_ms, 1500);
	assert_int_equal(cfg.max_jobs, 64);
	assert_int_equal(cfg.max_ranks, 1024);
	assert_int_equal(cfg.max_tensors, 65536);
	assert_true(cfg.max_message_bytes == 0); /* chunk_bytes + 64k */
	assert_true(cfg.max_total_bytes == 0);   /* half the memory */
	assert_true(cfg.max_held_bytes == 0);    /* a quarter of max_total_bytes */
	assert_int_equal(cfg.max_connections, 0);
	assert_int_equal(cfg.join_timeout_ms, 60000);
	assert_int_equal(cfg.drain_batch, 256);
	assert_int_equal(cfg.threads, 0);    /* the cores of the CPU set */
	assert_int_equal(cfg.io_threads, 0); /* a quarter of the cores */
	aps_config_describe(&cfg, line, sizeof(line));
	assert_string_equal(
	        line, "listen=tcp://127.0.0.1:5555 log_level=info downlink=auto "
	              "heartbeat_ms=1000 heartbeat_timeout_ms=5000 reconnect_grace_ms=1500 "
	              "max_jobs=64 max_jobs_per_address=16 max_connections=0 "
	              "max_connections_per_address=1024 join_timeout_ms=60000 "
	              "max_silent_closes=32 "
	              "max_ranks=1024 max_tensors=65536 max_job_bytes=8G max_total_bytes=0 "
	              "max_address_bytes=0 max_held_bytes=0 max_message_bytes=0 "
	              "drain_batch=256 threads=0 io_threads=0 scaling=local sum=fp32 stats= "
	              "metrics_listen= trace= "
	              "curve_secret_key_file= curve_allow_file= allow_from= elastic=no insecure=no "
	              "policy=off rules= schedule_steps=0 schedule_format=fp32 "
	              "small_tensor_elems=1024 flush_up=0.5 flush_down=0.05 error_up=0.35 "
	              "error_down=0.1 window_up=3 window_down=50 chunk_bytes=4M checkpoint_dir= "
	              "checkpoint_steps=100 checkpoint_keep=2 checkpoint_max_bytes=0");
}

static void test_config_valid_file(void **state)
{
	static const char text[] =
	        "# whole-line comment\n"
	        "; another one\n"
	        "\n"
	        "   [apsd]   # trailing comment\n"
	        "listen = \"ipc:///tmp/aps #1;x.sock\"   # quoted keeps # and ;\n"
	        "  log_level=debug ; trailing\n"
	        "downlink\t=\tbf16\r\n"
	        "heartbeat_ms = 2000\n"
	        "heartbeat-timeout-ms = 4000\n"
	        "max_jobs = \"8\"\n"
	        "[ apsd ]\n"
	        "max_ranks = 3\n"
	        "max_tensors = 7\n"
	        "max_message_bytes = 64M\n"
	        "drain_batch = 1"; /* no final newline */
	struct aps_config_error err;
	struct aps_config cfg;
	struct aps_format f;

	(void)state;
	assert_int_equal(load(text, &cfg, &err), 0);
	assert_string_equal(cfg.listen, "ipc:///tmp/aps #1;x.sock");
	assert_int_equal(cfg.log_level, APS_LOG_DEBUG);
	assert_int_equal(cfg.downlink, APS_DOWNLINK_BF16);
	assert_int_equal(cfg.heartbeat_ms, 2000);
	assert_int_equal(cfg.heartbeat_timeout_ms, 4000);
	assert_int_equal(cfg.max_jobs, 8);
	assert_int_equal(cfg.max_ranks, 3);
	assert_int_equal(cfg.max_tensors, 7);
	assert_true(cfg.max_message_bytes == 64ull << 20);
	assert_int_equal(cfg.drain_batch, 1);
	assert_true(aps_config_get_downlink(&cfg, &f));
	assert_string_equal(f.name, "bf16");
	assert_int_equal(load("\xEF\xBB\xBF# byte order mark\nlisten = ipc://x;y\n", &cfg, &err),
	                 0);
	assert_string_equal(cfg.listen, "ipc://x;y");
	assert_int_equal(load("", &cfg, &err), 0);
	assert_int_equal(cfg.heartbeat_ms, 1000);
}

static void test_config_file_errors(void **state)
{
	static const char *const cases[][2] = {
		{ "lisen = tcp://x\n", "1: unknown key 'lisen' (did you mean 'listen'?)" },
		{ "\n# c\nfoo = 1\n", "3: unknown key 'foo'" },
		{ "heartbeat_ms = abc", "1: heartbeat_ms = 'abc': not an integer" },
		{ "heartbeat_ms = 1000 ms", "1: heartbeat_ms = '1000 ms': not an integer" },
		{ "heartbeat_ms =", "1: heartbeat_ms = '': not an integer" },
		{ "heartbeat_ms = 5", "1: heartbeat_ms = 5: must be between 100 and 60000" },
		{ "heartbeat_ms = -1000",
		  "1: heartbeat_ms = -1000: must be between 100 and 60000" },
		{ "max_jobs = 99999999999999999999999",
		  "1: max_jobs = 99999999999999999999999: must be between 1 and 4096" },
		{ "heartbeat_ms = 1000\n\nheartbeat_ms = 2000\n",
		  "3: duplicate key 'heartbeat_ms' (first set on line 1)" },
		{ "listen tcp://127.0.0.1:1", "1: 'listen tcp://127.0.0.1:1': missing '=' "
		                              "(expected key = value)" },
		{ " = 5", "1: missing key before '='" },
		{ "[server]\n", "1: unknown section [server] (apsd reads only [apsd])" },
		{ "[apsd\n", "1: '[apsd': missing ']' after the section name" },
		{ "listen = \"tcp://x", "1: listen = '\"tcp://x': missing closing quote" },
		{ "listen = \"", "1: listen = '\"': missing closing quote" },
		{ "log_level = loud", "1: log_level = 'loud': must be one of error, warn, info, "
		                      "debug" },
		{ "downlink = e4m3",
		  "1: downlink = 'e4m3': must be one of auto, fp32, fp16, bf16" },
		{ "listen = http://x", "1: listen = 'http://x': must start with tcp://, ipc:// or "
		                       "inproc://" },
		{ "listen = tcp://", "1: listen = 'tcp://': no address after tcp://" },
		/* before: apsd started and failed to bind ("No such device") */
		{ "listen = tcp://::1:5555",
		  "1: listen = 'tcp://::1:5555': an IPv6 address goes in "
		  "brackets (tcp://[::1]:5555)" },
		{ "listen = tcp://[::1:5555", "1: listen = 'tcp://[::1:5555': an IPv6 address in "
		                              "brackets needs ]:PORT after it (tcp://[::1]:5555)" },
		{ "listen = tcp://127.0.0.1",
		  "1: listen = 'tcp://127.0.0.1': needs HOST:PORT, PORT 0 "
		  "to 65535 or * (tcp://HOST:5555)" },
		{ "listen = tcp://127.0.0.1:70000",
		  "1: listen = 'tcp://127.0.0.1:70000': needs "
		  "HOST:PORT, PORT 0 to 65535 or * (tcp://HOST:5555)" },
		{ "max_message_bytes = 1T", "1: max_message_bytes = '1T': not a size (a number "
		                            "with an optional k, M or G suffix)" },
		{ "max_message_bytes = 1.5G", "1: max_message_bytes = '1.5G': not a size (a number "
		                              "with an optional k, M or G suffix)" },
		{ "max_message_bytes = -1k", "1: max_message_bytes = '-1k': not a size (a number "
		                             "with an optional k, M or G suffix)" },
		{ "max_message_bytes = 8G", "1: max_message_bytes = 8G: must be between 0 and 4G" },
		{ "chunk_bytes = 1023", "1: chunk_bytes = 1023: must be between 1k and 1G" },
		{ "chunk_bytes = 1025M", "1: chunk_bytes = 1025M: must be between 1k and 1G" },
		{ "max_message_bytes = 4097M", "1: max_message_bytes = 4097M: must be between 0 "
		                               "and 4G" },
	};

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		expect_file_error(cases[i][0], cases[i][1]);
}

static void test_config_long_lines(void **state)
{
	char text[2048], value[400], want[256];

	(void)state;
	memset(text, 'x', sizeof(text));
	text[0] = '#';
	text[1025] = '\n';
	text[1026] = '\0';
	expect_file_error(text, "1: line longer than 1024 bytes");
	text[1024] = '\n'; /* exactly 1024 bytes is fine */
	text[1025] = '\0';
	expect_file_error(strcat(text, "x"), "2: 'x': missing '=' (expected key = value)");
	memset(value, 'a', sizeof(value));
	value[sizeof(value) - 1] = '\0';
	snprintf(text, sizeof(text), "listen = tcp://%s\n", value);
	snprintf(want, sizeof(want), "1: listen = 'tcp://%.58s...': longer than 255 bytes", value);
	expect_file_error(text, want);
}

static void test_config_file_unreadable(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	char want[256];

	(void)state;
	aps_config_defaults(&cfg);
	assert_int_equal(aps_config_load_file(&cfg, "/nonexistent/apsd.conf", &err), APS_ECONFIG);
	assert_string_equal(err.message, "/nonexistent/apsd.conf: No such file or directory");
	assert_int_equal(aps_config_load_file(&cfg, tmp_dir, &err), APS_ECONFIG);
	snprintf(want, sizeof(want), "%s: Is a directory", tmp_dir);
	assert_string_equal(err.message, want);
	assert_int_equal(aps_config_load_file(&cfg, "/nonexistent", NULL), APS_ECONFIG);
	assert_int_equal(aps_config_load_file(NULL, "/nonexistent", NULL), APS_EINVAL);
}

static void test_config_error_leaves_config_untouched(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now;

	(void)state;
	assert_int_equal(load("heartbeat_ms = 2000\nbogus = 1\n", &cfg, &err), APS_ECONFIG);
	assert_int_equal(cfg.heartbeat_ms, 1000);
	assert_int_equal(PARSE(&cfg, &err, "--max_jobs=2", "--max_ranks=0"), APS_ECONFIG);
	assert_int_equal(cfg.max_jobs, 64);
}

static void test_config_nul_byte_and_huge_line(void **state)
{
	static const char nul[] = "listen = tcp://a\0b\n";
	size_t big = 100 * 1024;
	struct aps_config_error err;
	struct aps_config cfg;
	char *text = malloc(big), want[256];

	(void)state;
	assert_non_null(text);
	write_bytes(nul, sizeof(nul) - 1);
	aps_config_defaults(&cfg);
	assert_int_equal(aps_config_load_file(&cfg, conf_path, &err), APS_ECONFIG);
	snprintf(want, sizeof(want), "%s:1: NUL byte (not a text file?)", conf_path);
	assert_string_equal(err.message, want);
	memset(text, 'k', big);
	memcpy(text, "# ok\nlisten = ", 14);
	write_bytes(text, big);
	assert_int_equal(aps_config_load_file(&cfg, conf_path, &err), APS_ECONFIG);
	snprintf(want, sizeof(want), "%s:2: line longer than 1024 bytes", conf_path);
	assert_string_equal(err.message, want);
	for (size_t i = 0; i < big; i++)
		text[i] = (char)(i * 2654435761u >> 13);
	write_bytes(text, big);
	assert_int_equal(aps_config_load_file(&cfg, conf_path, &err), APS_ECONFIG);
	free(text);
}

static void test_config_flag_forms(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now = true;

	(void)state;
	assert_int_equal(PARSE(&cfg, &err, "--listen", "ipc:///tmp/x", "--log-level=debug",
	                       "--max_message_bytes", "2M", "--chunk_bytes", "1M",
	                       "--downlink=fp16", "--max-jobs", "5", "--listen=inproc://y",
	                       "--heartbeat_timeout_ms=600000"),
	                 0);
	assert_false(exit_now);
	assert_string_equal(cfg.listen, "inproc://y");
	assert_int_equal(cfg.log_level, APS_LOG_DEBUG);
	assert_true(cfg.max_message_bytes == 2u << 20);
	assert_int_equal(cfg.downlink, APS_DOWNLINK_FP16);
	assert_int_equal(cfg.max_jobs, 5);
	assert_int_equal(cfg.heartbeat_timeout_ms, 600000);
	assert_int_equal(PARSE(&cfg, &err, "--max_jobs=4096", "--max_ranks=65536"), 0);
	assert_int_equal(cfg.max_ranks, 65536);
}

static void test_config_flags_override_file(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now;

	(void)state;
	write_conf("max_jobs = 8\nmax_ranks = 16\nlog_level = warn\n");
	assert_int_equal(PARSE(&cfg, &err, "--max_jobs=2", "--config", conf_path), 0);
	assert_int_equal(cfg.max_jobs, 2);
	assert_int_equal(cfg.max_ranks, 16);
	assert_int_equal(cfg.log_level, APS_LOG_WARN);
	assert_int_equal(PARSE(&cfg, &err, "--config", conf_path, "--max-ranks", "4"), 0);
	assert_int_equal(cfg.max_jobs, 8);
	assert_int_equal(cfg.max_ranks, 4);
	assert_int_equal(PARSE(&cfg, &err, "--log_level", "error", "--config=", conf_path),
	                 APS_ECONFIG);
	assert_string_equal(err.message, "--config: needs a value");
}

static void test_config_config_flag_anywhere(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now;
	char arg[160];

	(void)state;
	write_conf("heartbeat_ms = 2000\nheartbeat_timeout_ms = 3000\n");
	snprintf(arg, sizeof(arg), "--config=%s", conf_path);
	/* the file alone is inconsistent; the flag after it fixes it */
	assert_int_equal(PARSE(&cfg, &err, "--heartbeat_timeout_ms=4000", "--max_jobs=3", arg), 0);
	assert_int_equal(cfg.heartbeat_ms, 2000);
	assert_int_equal(cfg.heartbeat_timeout_ms, 4000);
	assert_int_equal(cfg.max_jobs, 3);
	assert_int_equal(PARSE(&cfg, &err, arg, "--config", conf_path), APS_ECONFIG);
	assert_string_equal(err.message, "--config: given more than once");
	assert_int_equal(PARSE(&cfg, &err, "--config", "/nonexistent/a.conf"), APS_ECONFIG);
	assert_string_equal(err.message, "/nonexistent/a.conf: No such file or directory");
}

static void test_config_flag_errors(void **state)
{
	(void)state;
	expect_flag_error("--lisen: unknown option (did you mean --listen?)", "--lisen=x", NULL,
	                  NULL);
	expect_flag_error("--confg: unknown option (did you mean --config?)", "--confg", "a", NULL);
	expect_flag_error("--verison: unknown option (did you mean --version?)", "--verison", NULL,
	                  NULL);
	expect_flag_error("--bogus: unknown option (see --help)", "--bogus", NULL, NULL);
	expect_flag_error("-x: unknown option (see --help)", "-x", NULL, NULL);
	expect_flag_error("--listen: needs a value", "--max_jobs=1", "--listen", NULL);
	expect_flag_error("--listen: needs a value", "--listen", "--max_jobs=1", NULL);
	expect_flag_error("--heartbeat_ms=5: must be between 100 and 60000", "--heartbeat_ms=5",
	                  NULL, NULL);
	expect_flag_error("--heartbeat-ms=5: must be between 100 and 60000", "--heartbeat-ms", "5",
	                  NULL);
	expect_flag_error("--heartbeat_ms=abc: not an integer", "--heartbeat_ms", "abc", NULL);
	expect_flag_error("--log_level=: must be one of error, warn, info, debug",
	                  "--log_level=", NULL, NULL);
	expect_flag_error("serve: unexpected argument (options are --key value)", "serve", NULL,
	                  NULL);
	expect_flag_error("--: unexpected argument (options are --key value)", "--", NULL, NULL);
	expect_flag_error("--help: takes no value", "--help=1", NULL, NULL);
	/* the shape of argv is checked before any value */
	expect_flag_error("--bogus: unknown option (see --help)", "--max_jobs=0", "--bogus", NULL);
}

/* Runs the flags with stdout sent to a file; returns what was printed (free it). */
static char *capture_stdout(int *ret, bool *exit_now, char *flag)
{
	struct aps_config_error err;
	struct aps_config cfg, before;
	FILE *out = tmpfile();
	int saved = dup(STDOUT_FILENO);
	char *text = calloc(1, 8192);

	assert_non_null(out);
	assert_non_null(text);
	fflush(stdout);
	assert_true(dup2(fileno(out), STDOUT_FILENO) >= 0);
	*ret = parse(&cfg, &err, exit_now, "--max_jobs=9", flag, (char *)NULL);
	fflush(stdout);
	dup2(saved, STDOUT_FILENO);
	close(saved);
	aps_config_defaults(&before);
	assert_memory_equal(&cfg, &before, sizeof(cfg));
	rewind(out);
	assert_true(fread(text, 1, 8191, out) > 0);
	fclose(out);
	return text;
}

static void test_config_help_and_version(void **state)
{
	static const char *const keys[] = { "--listen ENDPOINT",
		                            "--log_level error|warn|info|debug",
		                            "--downlink auto|fp32|fp16|bf16",
		                            "--heartbeat_ms N",
		                            "--heartbeat_timeout_ms N",
		                            "--max_jobs N",
		                            "--max_ranks N",
		                            "--max_tensors N",
		                            "--max_message_bytes SIZE",
		                            "--drain_batch N",
		                            "--config FILE",
		                            "--version" };
	bool exit_now = false;
	char *text;
	int ret;

	(void)state;
	text = capture_stdout(&ret, &exit_now, "--help");
	assert_int_equal(ret, 0);
	assert_true(exit_now);
	for (size_t i = 0; i < sizeof(keys) / sizeof(keys[0]); i++) {
		if (strstr(text, keys[i]) == NULL)
			fail_msg("usage lacks %s:\n%s", keys[i], text);
	}
	assert_non_null(strstr(text, "default tcp://127.0.0.1:5555"));
	assert_non_null(strstr(text, "default 4M, 1k..1G"));
	assert_non_null(strstr(text, "default 1000, 100..60000"));
	free(text);
	text = capture_stdout(&ret, &exit_now, "-h");
	assert_true(exit_now);
	assert_int_equal(strncmp(text, "Usage: apsd", 11), 0);
	free(text);
	text = capture_stdout(&ret, &exit_now, "--version");
	assert_int_equal(ret, 0);
	assert_true(exit_now);
	assert_int_equal(strncmp(text, "apsd ", 5), 0);
	free(text);
}

static void test_config_size_suffixes(void **state)
{
	static const struct {
		const char *text;
		uint64_t bytes;
	} cases[] = { { "1k", 1024 },      { "1K", 1024 },          { "512k", 512 << 10 },
		      { "64M", 64 << 20 }, { "4G", 4ull << 30 },    { "1024", 1024 },
		      { "3000", 3000 },    { "4096M", 4ull << 30 }, { "4194304k", 4ull << 30 },
		      { "1G", 1ull << 30 } };
	struct aps_config_error err;
	struct aps_config cfg;
	char text[64], line[512];

	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(text, sizeof(text), "max_job_bytes = %s\n", cases[i].text);
		assert_int_equal(load(text, &cfg, &err), 0);
		assert_true(cfg.max_job_bytes == cases[i].bytes);
	}
	cfg.max_message_bytes = 3 << 20;
	aps_config_describe(&cfg, line, sizeof(line));
	assert_non_null(strstr(line, " max_message_bytes=3M "));
	cfg.max_message_bytes = 1536;
	aps_config_describe(&cfg, line, sizeof(line));
	assert_non_null(strstr(line, " max_message_bytes=1536 "));
}

static void test_config_cross_key(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now;

	(void)state;
	expect_file_error(
	        "heartbeat_ms = 2000\nheartbeat_timeout_ms = 3000\n",
	        "2: heartbeat_timeout_ms (3000) must be at least twice heartbeat_ms (2000)");
	expect_file_error(
	        "heartbeat_timeout_ms = 3000\n\nheartbeat_ms = 2000\n",
	        "3: heartbeat_timeout_ms (3000) must be at least twice heartbeat_ms (2000)");
	expect_file_error(
	        "heartbeat_ms = 3000\n",
	        "1: heartbeat_timeout_ms (5000) must be at least twice heartbeat_ms (3000)");
	expect_file_error("max_message_bytes = 2M\n",
	                  "1: max_message_bytes (2097152) must hold a chunk: at least chunk_bytes "
	                  "(4194304) + 64k, or 0");
	expect_file_error("max_message_bytes = 5M\nchunk_bytes = 8M\n",
	                  "2: max_message_bytes (5242880) must hold a chunk: at least chunk_bytes "
	                  "(8388608) + 64k, or 0");
	assert_int_equal(load("max_message_bytes = 5M\nchunk_bytes = 1M\n", &cfg, &err), 0);
	assert_int_equal(load("heartbeat_ms = 2500\n", &cfg, &err), 0);
	assert_int_equal(PARSE(&cfg, &err, "--heartbeat-ms", "3000"), APS_ECONFIG);
	assert_string_equal(err.message, "--heartbeat-ms: heartbeat_timeout_ms (5000) must be at "
	                                 "least twice heartbeat_ms (3000)");
	write_conf("heartbeat_ms = 2000\n");
	assert_int_equal(PARSE(&cfg, &err, "--heartbeat_timeout_ms=3999", "--config", conf_path),
	                 APS_ECONFIG);
	assert_string_equal(err.message, "--heartbeat_timeout_ms: heartbeat_timeout_ms (3999) must "
	                                 "be at least twice heartbeat_ms (2000)");
	write_conf("heartbeat_timeout_ms = 3000\n");
	assert_int_equal(PARSE(&cfg, &err, "--config", conf_path, "--heartbeat_ms=1600"),
	                 APS_ECONFIG);
	assert_string_equal(err.message, "--heartbeat_ms: heartbeat_timeout_ms (3000) must be at "
	                                 "least twice heartbeat_ms (1600)");
	assert_int_equal(PARSE(&cfg, &err, "--config", conf_path, "--heartbeat_ms=1500"), 0);
}

/* The paper's low-precision sum needs one exponent for all workers. */
static void test_config_lowp_sum_needs_global_scaling(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now;

	(void)state;
	expect_file_error("scaling = global\nsum = lowp\nscaling = local\n",
	                  "3: duplicate key 'scaling' (first set on line 1)");
	expect_file_error("sum = lowp\n",
	                  "1: sum = lowp needs scaling = global (scaling is local)");
	expect_file_error("sum = lowp\nscaling = none\n",
	                  "2: sum = lowp needs scaling = global (scaling is none)");
	assert_int_equal(load("sum = lowp\nscaling = global\n", &cfg, &err), 0);
	assert_int_equal(cfg.sum, APS_SUM_LOWP);
	assert_int_equal(cfg.scaling, APS_SCALING_GLOBAL);
	assert_int_equal(PARSE(&cfg, &err, "--sum", "lowp"), APS_ECONFIG);
	assert_string_equal(err.message,
	                    "--sum: sum = lowp needs scaling = global (scaling is local)");
	assert_int_equal(PARSE(&cfg, &err, "--sum", "lowp", "--scaling=global"), 0);
	/* the workers divide a lowp sum by the world size: not with a shrinking job */
	expect_file_error("scaling = global\nsum = lowp\nelastic = yes\n",
	                  "3: sum = lowp and elastic = yes do not go together (the workers "
	                  "divide a lowp sum by the world size)");
	assert_int_equal(PARSE(&cfg, &err, "--elastic", "yes"), 0);
	assert_int_equal(cfg.elastic, 1);
}

static void test_config_policy_keys(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now;

	(void)state;
	assert_int_equal(load("policy = auto\nrules = *.bias=fp32, fc.*=fp16\nflush_up = 0.05\n",
	                      &cfg, &err),
	                 0);
	assert_int_equal(cfg.policy, 1);
	assert_true(cfg.flush_up == 0.05);
	expect_file_error("flush_up = lots\n", "1: flush_up = 'lots': not a number");
	expect_file_error("flush_up = 2\n", "1: flush_up = 2: must be between 0 and 1");
	expect_file_error("rules = *.bias=fp64\n", "1: rule '*.bias=fp64': 'fp64' is not a format");
	assert_int_equal(PARSE(&cfg, &err, "--rules", "fc.*"), APS_ECONFIG);
	assert_string_equal(err.message, "--rules: rule 'fc.*' is not GLOB=FORMAT");
}

/* allow_from's networks are checked at start: a typo would let in everyone or nobody. */
static void test_config_allow_from(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	bool exit_now;

	(void)state;
	assert_int_equal(load("allow_from = 10.20.0.0/16, 192.168.7.12, fd00::/8\n", &cfg, &err),
	                 0);
	assert_string_equal(cfg.allow_from, "10.20.0.0/16, 192.168.7.12, fd00::/8");
	expect_file_error("\nallow_from = 10.20.0.1/16\n",
	                  "2: network '10.20.0.1/16' has bits set past its prefix: write "
	                  "10.20.0.0/16 for the network, or the address alone");
	expect_file_error("allow_from = node7\n",
	                  "1: network 'node7' is not an IPv4 or IPv6 address (write ADDRESS or "
	                  "ADDRESS/PREFIX, comma-separated; host names are not looked up)");
	assert_int_equal(PARSE(&cfg, &err, "--allow_from", "10.0.0.0/8,"), APS_ECONFIG);
	assert_string_equal(err.message,
	                    "--allow_from: an empty item in the networks '10.0.0.0/8,'");
}

static void test_config_did_you_mean(void **state)
{
	(void)state;
	expect_file_error("heartbeat = 1\n", "1: unknown key 'heartbeat' (did you mean "
	                                     "'heartbeat_ms'?)");
	expect_file_error("max_job = 1\n", "1: unknown key 'max_job' (did you mean 'max_jobs'?)");
	expect_file_error("lgo_level = info\n", "1: unknown key 'lgo_level' (did you mean "
	                                        "'log_level'?)");
	expect_file_error("max_tensor_bytes = 1\n", "1: unknown key 'max_tensor_bytes'");
	expect_file_error("xyz = 1\n", "1: unknown key 'xyz'");
	expect_flag_error("--heartbeat-timeout: unknown option (did you mean "
	                  "--heartbeat_timeout_ms?)",
	                  "--heartbeat-timeout=1", NULL, NULL);
	expect_flag_error("--hlep: unknown option (did you mean --help?)", "--hlep", NULL, NULL);
}

static void test_config_describe_truncates(void **state)
{
	struct aps_config cfg;
	char line[16];

	(void)state;
	aps_config_defaults(&cfg);
	memset(line, 'z', sizeof(line));
	aps_config_describe(&cfg, line, sizeof(line));
	assert_string_equal(line, "listen=tcp://12");
	aps_config_describe(&cfg, line, 0);
	assert_int_equal(line[0], 'l');
}

static void test_config_downlink_format(void **state)
{
	static const char *const names[] = { "fp32", "fp16", "bf16" };
	struct aps_config cfg;
	struct aps_format f;

	(void)state;
	aps_config_defaults(&cfg);
	assert_false(aps_config_get_downlink(&cfg, &f));
	for (int i = 0; i < 3; i++) {
		cfg.downlink = (enum aps_downlink)(APS_DOWNLINK_FP32 + i);
		assert_true(aps_config_get_downlink(&cfg, &f));
		assert_string_equal(f.name, names[i]);
	}
}

static char *read_deploy_example(void)
{
	const char *dir = getenv("APS_SOURCE_DIR");
	char path[512];
	char *text = calloc(1, 32768);
	FILE *f;

	snprintf(path, sizeof(path), "%s/../deploy/apsd.conf", dir != NULL ? dir : ".");
	f = fopen(path, "r");
	if (f == NULL)
		fail_msg("cannot open %s (set APS_SOURCE_DIR to tests/)", path);
	assert_non_null(text);
	assert_true(fread(text, 1, 32767, f) > 0);
	fclose(f);
	return text;
}

/* The example loads as is, and with every "#key = value" line enabled it gives the defaults. */
static void test_config_deploy_example(void **state)
{
	struct aps_config_error err;
	struct aps_config cfg;
	char *text = read_deploy_example(), *enabled = calloc(1, 32768), *out = enabled;
	char want[1024], got[1024];

	(void)state;
	assert_non_null(enabled);
	aps_config_defaults(&cfg);
	aps_config_describe(&cfg, want, sizeof(want));
	if (load(text, &cfg, &err) != 0)
		fail_msg("%s", err.message);
	for (const char *line = text, *end; *line != '\0'; line = end) {
		end = strchr(line, '\n') != NULL ? strchr(line, '\n') + 1 : line + strlen(line);
		if (line[0] == '#' && line[1] >= 'a' && line[1] <= 'z')
			line++;
		memcpy(out, line, (size_t)(end - line));
		out += end - line;
	}
	if (load(enabled, &cfg, &err) != 0)
		fail_msg("%s", err.message);
	aps_config_describe(&cfg, got, sizeof(got));
	assert_string_equal(got, want);
	for (char *key = strtok(want, " "); key != NULL; key = strtok(NULL, " ")) {
		*strchr(key, '=') = '\0';
		if (strstr(text, key) == NULL)
			fail_msg("deploy/apsd.conf does not document %s", key);
	}
	free(enabled);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_config_defaults),
		cmocka_unit_test(test_config_valid_file),
		cmocka_unit_test(test_config_file_errors),
		cmocka_unit_test(test_config_long_lines),
		cmocka_unit_test(test_config_file_unreadable),
		cmocka_unit_test(test_config_error_leaves_config_untouched),
		cmocka_unit_test(test_config_nul_byte_and_huge_line),
		cmocka_unit_test(test_config_flag_forms),
		cmocka_unit_test(test_config_flags_override_file),
		cmocka_unit_test(test_config_config_flag_anywhere),
		cmocka_unit_test(test_config_flag_errors),
		cmocka_unit_test(test_config_help_and_version),
		cmocka_unit_test(test_config_size_suffixes),
		cmocka_unit_test(test_config_cross_key),
		cmocka_unit_test(test_config_lowp_sum_needs_global_scaling),
		cmocka_unit_test(test_config_policy_keys),
		cmocka_unit_test(test_config_allow_from),
		cmocka_unit_test(test_config_did_you_mean),
		cmocka_unit_test(test_config_describe_truncates),
		cmocka_unit_test(test_config_downlink_format),
		cmocka_unit_test(test_config_deploy_example),
	};
	return cmocka_run_group_tests_name("config", tests, setup, teardown);
}
