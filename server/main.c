/*
 * apsd: parses the configuration, starts the server and its stats socket on
 * the libuv loop, and stops them on SIGINT or SIGTERM (BYE to every worker,
 * then exit 0).
 */
#include "common/err.h"
#include "common/log.h"
#include "common/statspath.h"
#include "common/trace.h"
#include "server/config.h"
#include "server/hostlimits.h"
#include "server/keys.h"
#include "server/metrics.h"
#include "server/notify.h"
#include "server/server.h"
#include "server/stats.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct daemon {
	struct aps_config cfg;
	struct aps_format downlink;
	char summary[1024];
	char stats_path[256];
	struct aps_server *srv;
	struct aps_stats *stats;
	struct aps_metrics *metrics;
	struct aps_trace *trace;
	struct aps_keys secret, allow; /* CURVE; empty without it */
	int argc;                      /* kept for SIGHUP, which parses them again */
	char **argv;
	struct aps_notify notify;
	bool notify_failed; /* a failed notification was logged */
	uv_signal_t sigint, sigterm, sighup;
	uv_timer_t watchdog;
};

/* Logs the first failed notification only: the daemon goes on without them. */
static void notify_check(struct daemon *d, int ret, const char *what)
{
	if (ret >= 0 || d->notify_failed)
		return;
	d->notify_failed = true;
	aps_log_warn("apsd", "cannot notify the service manager message=%s reason=\"%s\" errno=%d",
	             what, aps_strerror(ret), d->notify.sys_errno);
}

static void notify_status(struct daemon *d)
{
	const struct aps_server_counters *c = aps_server_counters(d->srv);
	int ret = aps_notify_status(
	        &d->notify, "serving %s: %llu rounds, %llu jobs started, %llu ranks lost",
	        d->cfg.listen, (unsigned long long)c->rounds, (unsigned long long)c->jobs_started,
	        (unsigned long long)c->peers_lost);

	notify_check(d, ret, "STATUS");
}

static void on_watchdog(uv_timer_t *t)
{
	struct daemon *d = t->data;

	notify_check(d, aps_notify_watchdog(&d->notify), "WATCHDOG");
	notify_status(d);
}

/* SIGHUP: the file and flags again; log_level applies now, other keys at restart. */
static void on_reload(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;
	struct aps_config cfg;
	struct aps_config_error err;
	bool exit_now = false;

	(void)signum;
	notify_check(d, aps_notify_reloading(&d->notify), "RELOADING");
	aps_config_defaults(&cfg);
	if (aps_config_parse_args(&cfg, d->argc, d->argv, &err, &exit_now) < 0) {
		aps_log_error("apsd", "reload failed, configuration unchanged: %s", err.message);
	} else {
		d->cfg.log_level = cfg.log_level;
		aps_log_set_level(cfg.log_level);
		aps_log_info("apsd", "reloaded log_level=%s", aps_log_level_name(cfg.log_level));
	}
	notify_check(d, aps_notify_ready(&d->notify), "READY");
}

static void on_signal(uv_signal_t *h, int signum)
{
	struct daemon *d = h->data;

	aps_log_info("apsd", "stopping signal=%s", signum == SIGINT ? "SIGINT" : "SIGTERM");
	notify_check(d, aps_notify_stopping(&d->notify), "STOPPING");
	uv_close((uv_handle_t *)&d->watchdog, NULL);
	uv_close((uv_handle_t *)&d->sighup, NULL);
	aps_stats_close(d->stats);
	d->stats = NULL;
	aps_metrics_close(d->metrics);
	d->metrics = NULL;
	aps_server_stop(d->srv);
	uv_close((uv_handle_t *)&d->sigint, NULL);
	uv_close((uv_handle_t *)&d->sigterm, NULL);
}

static void watch_signals(struct daemon *d, uv_loop_t *loop)
{
	uv_signal_init(loop, &d->sigint);
	uv_signal_init(loop, &d->sigterm);
	uv_signal_init(loop, &d->sighup);
	d->sigint.data = d->sigterm.data = d->sighup.data = d;
	uv_signal_start(&d->sigint, on_signal, SIGINT);
	uv_signal_start(&d->sigterm, on_signal, SIGTERM);
	uv_signal_start(&d->sighup, on_reload, SIGHUP);
}

/* checkpoint_dir, else systemd's StateDirectory= (/var/lib/apsd), else none. */
static const char *checkpoint_dir(const struct aps_config *cfg)
{
	const char *state = getenv("STATE_DIRECTORY");

	if (cfg->checkpoint_dir[0] != '\0')
		return cfg->checkpoint_dir;
	/* StateDirectory= may list several, separated by ':': the first is ours. */
	return state != NULL && state[0] != '\0' && strchr(state, ':') == NULL ? state : NULL;
}

/* Limits that default from the machine: descriptors, memory, the largest frame, threads. */
static void resolve_limits(struct daemon *d, struct aps_server_opts *o)
{
	const struct aps_config *cfg = &d->cfg;
	uint64_t nofile = aps_hostlimits_raise_nofile();
	unsigned cpus = aps_hostlimits_cpus();

	o->max_connections = cfg->max_connections > 0 ? (size_t)cfg->max_connections
	                                              : aps_hostlimits_connections(nofile);
	o->max_connections_per_address = (size_t)cfg->max_connections_per_address;
	o->max_total_bytes =
	        cfg->max_total_bytes > 0 ? cfg->max_total_bytes : aps_hostlimits_memory() / 2;
	o->max_address_bytes =
	        cfg->max_address_bytes > 0 ? cfg->max_address_bytes : o->max_total_bytes / 2;
	o->max_held_bytes = cfg->max_held_bytes > 0 ? cfg->max_held_bytes : o->max_total_bytes / 4;
	o->max_message_bytes = (int64_t)(cfg->max_message_bytes > 0 ? cfg->max_message_bytes
	                                                            : cfg->chunk_bytes + 65536);
	if (o->checkpoint_dir != NULL && o->checkpoint_dir[0] != '\0')
		o->checkpoint_max_bytes = cfg->checkpoint_max_bytes > 0
		                                  ? cfg->checkpoint_max_bytes
		                                  : aps_hostlimits_disk(o->checkpoint_dir) / 4;
	o->threads = cfg->threads > 0 ? (unsigned)cfg->threads : cpus;
	o->io_threads = cfg->io_threads > 0 ? (unsigned)cfg->io_threads : (cpus + 3) / 4;
	aps_log_info("apsd",
	             "limits max_connections=%zu nofile=%llu max_total_bytes=%llu "
	             "max_address_bytes=%llu max_held_bytes=%llu max_message_bytes=%lld threads=%u "
	             "io_threads=%u cpus=%u checkpoint_max_bytes=%llu",
	             o->max_connections, (unsigned long long)nofile,
	             (unsigned long long)o->max_total_bytes,
	             (unsigned long long)o->max_address_bytes,
	             (unsigned long long)o->max_held_bytes, (long long)o->max_message_bytes,
	             o->threads, o->io_threads, cpus, (unsigned long long)o->checkpoint_max_bytes);
}

static struct aps_server_opts server_opts(struct daemon *d)
{
	const struct aps_config *cfg = &d->cfg;
	bool fixed = aps_config_get_downlink(cfg, &d->downlink);

	return (struct aps_server_opts){
		.endpoint = cfg->listen,
		.downlink = fixed ? d->downlink.name : "auto",
		.heartbeat_ms = cfg->heartbeat_ms,
		.heartbeat_timeout_ms = cfg->heartbeat_timeout_ms,
		.reconnect_grace_ms = cfg->reconnect_grace_ms,
		.join_timeout_ms = (uint64_t)cfg->join_timeout_ms,
		.max_silent_closes = (unsigned)cfg->max_silent_closes,
		.drain_batch = cfg->drain_batch,
		.max_jobs = (uint32_t)cfg->max_jobs,
		.max_jobs_per_address = (uint32_t)cfg->max_jobs_per_address,
		.max_ranks = (uint32_t)cfg->max_ranks,
		.max_tensors = (uint32_t)cfg->max_tensors,
		.max_job_bytes = cfg->max_job_bytes,
		.scaling = cfg->scaling,
		.lowp = cfg->sum == APS_SUM_LOWP,
		.elastic = cfg->elastic != 0,
		/* a multiple of 8 elements starts every chunk on a byte for every code width */
		.chunk_elems = (size_t)(cfg->chunk_bytes / sizeof(float)) & ~(size_t)7,
		.summary = d->summary,
		.trace = d->trace,
		.allow_from = cfg->allow_from,
		.checkpoint_dir = checkpoint_dir(cfg),
		.checkpoint_steps = (uint64_t)cfg->checkpoint_steps,
		.checkpoint_keep = (unsigned)cfg->checkpoint_keep,
	};
}

/* CURVE keys, or the warning that gradients travel in clear beyond this host. */
static int load_keys(struct daemon *d)
{
	char why[512];

	if (d->cfg.curve_secret_key_file[0] == '\0') {
		if (!aps_endpoint_is_loopback(d->cfg.listen))
			aps_log_warn("apsd",
			             "insecure: listening on %s without CURVE, gradients "
			             "travel in clear",
			             d->cfg.listen);
		return 0;
	}
	if (aps_keys_load(d->cfg.curve_secret_key_file, &d->secret, why, sizeof(why)) < 0 ||
	    aps_keys_load(d->cfg.curve_allow_file, &d->allow, why, sizeof(why)) < 0) {
		fprintf(stderr, "apsd: %s\n", why);
		return APS_ECONFIG;
	}
	aps_log_info("apsd", "CURVE on allowed_keys=%zu", d->allow.n);
	return 0;
}

static int start(struct daemon *d, uv_loop_t *loop)
{
	struct aps_server_opts opts;
	const char *path = d->stats_path;
	int ret = 0;

	if (d->cfg.trace[0] != '\0' &&
	    (ret = aps_trace_open(&d->trace, d->cfg.trace, "apsd")) < 0) {
		aps_log_error("apsd", "cannot write the trace path=%s", d->cfg.trace);
		return ret;
	}
	opts = server_opts(d);
	resolve_limits(d, &opts);
	aps_config_get_policy(&d->cfg, &opts.policy);
	if (d->secret.n > 0) {
		opts.curve_secret = d->secret.keys[0];
		opts.curve_allow = d->allow.list;
		opts.curve_jobs = d->allow.job_list;
		opts.n_curve_allow = d->allow.n;
	}
	ret = aps_server_new(&d->srv, loop, &opts);
	if (ret < 0) {
		aps_log_error("apsd", "cannot start endpoint=%s reason=\"%s\"", d->cfg.listen,
		              aps_strerror(ret));
		return ret;
	}
	if (d->cfg.stats[0] != '\0')
		snprintf(d->stats_path, sizeof(d->stats_path), "%s", d->cfg.stats);
	else if (aps_stats_default_path(aps_server_endpoint(d->srv), d->stats_path,
	                                sizeof(d->stats_path)) < 0) /* its port, not a 0 */
		path = "";
	ret = path[0] ? aps_stats_open(&d->stats, loop, path, d->srv) : APS_ERANGE;
	if (ret < 0)
		aps_log_error("apsd", "cannot open the stats socket path=%s reason=\"%s\"", path,
		              aps_strerror(ret));
	if (ret == 0 && d->cfg.metrics_listen[0] != '\0')
		ret = aps_metrics_open(&d->metrics, loop, d->cfg.metrics_listen, d->srv);
	if (ret < 0) {
		aps_stats_close(d->stats);
		aps_server_free(d->srv);
		uv_run(loop, UV_RUN_DEFAULT);
		return ret;
	}
	return 0;
}

int main(int argc, char **argv)
{
	static struct daemon d;
	struct aps_config_error err;
	bool exit_now = false;
	uv_loop_t *loop;
	int watchdog_ms;

	aps_hostlimits_malloc_policy();
	aps_config_defaults(&d.cfg);
	if (aps_config_parse_args(&d.cfg, argc, argv, &err, &exit_now) < 0) {
		fprintf(stderr, "apsd: %s\n", err.message);
		return 2;
	}
	if (exit_now)
		return 0;
	aps_log_set_level(d.cfg.log_level);
	if (load_keys(&d) < 0)
		return 2;
	aps_config_describe(&d.cfg, d.summary, sizeof(d.summary));
	signal(SIGPIPE, SIG_IGN);
	d.argc = argc;
	d.argv = argv;
	watchdog_ms = aps_notify_init(&d.notify);
	if (watchdog_ms < 0)
		aps_log_warn("apsd", "NOTIFY_SOCKET or WATCHDOG_USEC unusable reason=\"%s\"",
		             aps_strerror(watchdog_ms));
	loop = uv_default_loop();
	if (start(&d, loop) < 0) {
		aps_notify_close(&d.notify);
		return 1;
	}
	watch_signals(&d, loop);
	uv_timer_init(loop, &d.watchdog);
	d.watchdog.data = &d;
	if (watchdog_ms > 0)
		uv_timer_start(&d.watchdog, on_watchdog, (uint64_t)watchdog_ms,
		               (uint64_t)watchdog_ms);
	notify_check(&d, aps_notify_ready(&d.notify), "READY");
	notify_status(&d);
	aps_log_info("apsd", "listening endpoint=%s stats=%s version=%s %s",
	             aps_server_endpoint(d.srv), d.stats_path, APS_VERSION, d.summary);
	uv_run(loop, UV_RUN_DEFAULT);
	aps_server_log_counters(d.srv);
	aps_server_free(d.srv);
	aps_trace_close(d.trace);
	aps_keys_free(&d.secret);
	aps_keys_free(&d.allow);
	uv_loop_close(loop);
	aps_notify_close(&d.notify);
	aps_log_info("apsd", "stopped");
	return 0;
}
