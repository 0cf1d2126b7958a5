/*
 * apsd: parses the configuration, starts the server on the libuv loop, and
 * stops it on SIGINT or SIGTERM (BYE to every worker, then exit 0).
 */
#include "common/err.h"
#include "common/log.h"
#include "server/config.h"
#include "server/server.h"

#include <signal.h>
#include <stdio.h>

struct daemon {
	struct aps_server *srv;
	uv_signal_t sigint, sigterm;
};

static void on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;

	aps_log_info("apsd", "stopping signal=%s", signum == SIGINT ? "SIGINT" : "SIGTERM");
	aps_server_stop(d->srv);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->sigterm, NULL);
}

static void watch_signals(struct daemon *d, uv_loop_t *loop)
{
	uv_signal_init(loop, &d->sigint);
	uv_signal_init(loop, &d->sigterm);
	d->sigint.data = d->sigterm.data = d;
	uv_signal_start(&d->sigint, on_signal, SIGINT);
	uv_signal_start(&d->sigterm, on_signal, SIGTERM);
}

static struct aps_server_opts server_opts(const struct aps_config *cfg, struct aps_format *downlink)
{
	bool fixed = aps_config_get_downlink(cfg, downlink);

	return (struct aps_server_opts){
		.endpoint = cfg->listen,
		.downlink = fixed ? downlink->name : "auto",
		.heartbeat_ms = cfg->heartbeat_ms,
		.heartbeat_timeout_ms = cfg->heartbeat_timeout_ms,
		.max_message_bytes = (int64_t)cfg->max_message_bytes,
		.drain_batch = cfg->drain_batch,
		.max_jobs = (uint32_t)cfg->max_jobs,
		.max_ranks = (uint32_t)cfg->max_ranks,
		.max_tensors = (uint32_t)cfg->max_tensors,
		.scaling = cfg->scaling,
		.lowp = cfg->sum == APS_SUM_LOWP,
		/* a multiple of 8 elements starts every chunk on a byte for every code width */
		.chunk_elems = (size_t)(cfg->chunk_bytes / sizeof(float)) & ~(size_t)7,
	};
}

int main(int argc, char **argv)
{
	struct aps_config cfg;
	struct aps_config_error err;
	struct aps_server_opts opts;
	struct aps_format downlink;
	struct daemon d = { 0 };
	bool exit_now = false;
	char summary[512];
	uv_loop_t *loop;
	int ret;

	aps_config_defaults(&cfg);
	if (aps_config_parse_args(&cfg, argc, argv, &err, &exit_now) < 0) {
		fprintf(stderr, "apsd: %s\n", err.message);
		return 2;
	}
	if (exit_now)
		return 0;
	aps_log_set_level((enum aps_log_level)cfg.log_level);
	signal(SIGPIPE, SIG_IGN);
	loop = uv_default_loop();
	opts = server_opts(&cfg, &downlink);
	ret = aps_server_new(&d.srv, loop, &opts);
	if (ret < 0) {
		aps_log_error("apsd", "cannot start endpoint=%s reason=\"%s\"", cfg.listen,
		              aps_strerror(ret));
		return 1;
	}
	watch_signals(&d, loop);
	aps_config_describe(&cfg, summary, sizeof(summary));
	aps_log_info("apsd", "listening endpoint=%s version=%s %s", cfg.listen, APS_VERSION,
	             summary);
	uv_run(loop, UV_RUN_DEFAULT);
	aps_server_log_counters(d.srv);
	aps_server_free(d.srv);
	uv_loop_close(loop);
	aps_log_info("apsd", "stopped");
	return 0;
}
