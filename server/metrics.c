/*
 * The Prometheus endpoint: a TCP listener (server/oneshot.c) that answers
 * GET /metrics with every daemon counter, per-kind bad-message counters,
 * round latency quantiles, and per-job and per-tensor series.
 */
#include "server/metrics.h"

#include "common/err.h"
#include "common/log.h"
#include "server/oneshot.h"
#include "server/server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct aps_metrics {
	uv_tcp_t tcp;
	const struct aps_server *srv;
	struct aps_oneshot *oneshot;
};

static void counter(FILE *f, const char *name, const char *help, uint64_t value)
{
	fprintf(f, "# HELP apsd_%s_total %s\n# TYPE apsd_%s_total counter\napsd_%s_total %llu\n",
	        name, help, name, name, (unsigned long long)value);
}

static void gauge(FILE *f, const char *name, const char *help, double value)
{
	fprintf(f, "# HELP apsd_%s %s\n# TYPE apsd_%s gauge\napsd_%s %.9g\n", name, help, name,
	        name, value);
}

static void render_daemon(FILE *f, const struct aps_server *srv)
{
	const struct aps_server_counters *c = &srv->counters;
	const struct aps_zbridge_counters *z =
	        srv->bridge != NULL ? aps_zbridge_counters(srv->bridge) : &srv->bridge_counters;
	struct aps_engine_counters e;

#define APS_METRIC_COUNTER(name, text) counter(f, #name, text, c->name);
	APS_SERVER_COUNTER_MAP(APS_METRIC_COUNTER)
#undef APS_METRIC_COUNTER
	fprintf(f, "# HELP apsd_bad_messages_total Messages refused by the validator, by kind.\n"
	           "# TYPE apsd_bad_messages_total counter\n");
#define APS_METRIC_FAULT(name, stat, text)                              \
	fprintf(f, "apsd_bad_messages_total{kind=\"%s\"} %llu\n", stat, \
	        (unsigned long long)c->faults[APS_MSG_FAULT_##name]);
	APS_MSG_FAULT_MAP(APS_METRIC_FAULT)
#undef APS_METRIC_FAULT
#define APS_METRIC_BRIDGE(name, metric, help) counter(f, metric, help, z->name);
	APS_ZBRIDGE_COUNTER_MAP(APS_METRIC_BRIDGE)
#undef APS_METRIC_BRIDGE
	gauge(f, "connections_open", "Connections open now.", (double)z->open_connections);
	gauge(f, "parked_bytes",
	      "What connections libzmq parked (a live routing id reused) may hold until the "
	      "next listener reset, at most.",
	      (double)z->parked_bytes);
	gauge(f, "uptime_seconds", "Seconds since the daemon started.",
	      (double)(uv_now(srv->loop) - srv->started_ms) / 1000.0);
	gauge(f, "jobs", "Jobs being served.", srv->jobs.n_jobs);
	aps_engine_counters(srv->engine, &e);
	gauge(f, "engine_threads", "Threads that sum (1: the event loop).", e.threads);
	counter(f, "engine_tasks", "Sums and encodings run on engine threads.", e.tasks);
	fprintf(f,
	        "# HELP apsd_engine_busy_seconds_total Seconds engine threads spent in tasks.\n"
	        "# TYPE apsd_engine_busy_seconds_total counter\n"
	        "apsd_engine_busy_seconds_total %.6f\n",
	        (double)e.busy_ns / 1e9);
}

static void render_latency(FILE *f, const struct aps_server *srv)
{
	static const double quantiles[] = { 0.5, 0.9, 0.99 };

	fprintf(f,
	        "# HELP apsd_round_latency_seconds Time from a step's first push to its last "
	        "result, over the last %d rounds.\n# TYPE apsd_round_latency_seconds summary\n",
	        APS_LATENCY_WINDOW);
	for (size_t i = 0; i < sizeof(quantiles) / sizeof(quantiles[0]); i++)
		fprintf(f, "apsd_round_latency_seconds{quantile=\"%g\"} %.9g\n", quantiles[i],
		        (double)aps_latency_percentile(&srv->latency, 100 * quantiles[i]) / 1e9);
	fprintf(f, "apsd_round_latency_seconds_count %llu\n",
	        (unsigned long long)srv->latency.count);
}

/* Job and tensor names are visible ASCII (the validator insists); quotes and backslashes escaped.
 */
static void label(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '"' || *s == '\\')
			fputc('\\', f);
		fputc(*s, f);
	}
}

static void render_jobs(FILE *f, const struct aps_server *srv)
{
	fprintf(f, "# HELP apsd_job_ranks_connected Ranks of the job that are connected.\n"
	           "# TYPE apsd_job_ranks_connected gauge\n");
	for (const struct aps_job *j = srv->jobs.jobs; j != NULL; j = j->next) {
		fputs("apsd_job_ranks_connected{job=\"", f);
		label(f, j->name);
		fprintf(f, "\"} %u\n", aps_job_connected(j));
	}
	fprintf(f, "# HELP apsd_job_rounds_total Rounds the job completed.\n"
	           "# TYPE apsd_job_rounds_total counter\n");
	for (const struct aps_job *j = srv->jobs.jobs; j != NULL; j = j->next) {
		fputs("apsd_job_rounds_total{job=\"", f);
		label(f, j->name);
		fprintf(f, "\"} %llu\n", (unsigned long long)j->rounds_completed);
	}
}

static void render_tensors(FILE *f, const struct aps_server *srv)
{
	static const char *const names[] = { "tensor_bytes_in_total", "tensor_bytes_out_total",
		                             "tensor_flushed_fraction" };
	static const char *const helps[] = {
		"Payload bytes received for the tensor.", "Payload bytes sent for the tensor.",
		"Share of non-zero values flushed to zero, last step."
	};

	for (int k = 0; k < 3; k++) {
		fprintf(f, "# HELP apsd_%s %s\n# TYPE apsd_%s %s\n", names[k], helps[k], names[k],
		        k < 2 ? "counter" : "gauge");
		for (const struct aps_job *j = srv->jobs.jobs; j != NULL; j = j->next) {
			for (uint32_t i = 0; i < j->n_tensors; i++) {
				const struct aps_tensor *t = j->tensors[i];
				double v = k == 0   ? (double)t->stats.bytes_in
				           : k == 1 ? (double)t->stats.bytes_out
				                    : t->stats.flushed_fraction;
				fprintf(f, "apsd_%s{job=\"", names[k]);
				label(f, j->name);
				fputs("\",tensor=\"", f);
				label(f, t->name);
				fprintf(f, "\"} %.9g\n", v);
			}
		}
	}
}

char *aps_metrics_render(const struct aps_server *srv)
{
	char *text = NULL;
	size_t len = 0;
	FILE *f = open_memstream(&text, &len);

	if (f == NULL)
		return NULL;
	render_daemon(f, srv);
	render_latency(f, srv);
	render_jobs(f, srv);
	render_tensors(f, srv);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

static char *http_answer(void *ctx, const char *request, size_t *len)
{
	struct aps_metrics *m = ctx;
	bool wanted = strncmp(request, "GET /metrics ", 13) == 0 ||
	              strncmp(request, "GET /metrics?", 13) == 0;
	char *body = wanted ? aps_metrics_render(m->srv) : NULL;
	char *reply = NULL;
	int n;

	if (wanted && body == NULL)
		return NULL;
	n = asprintf(&reply,
	             "HTTP/1.0 %s\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n"
	             "Content-Length: %zu\r\nConnection: close\r\n\r\n%s",
	             wanted ? "200 OK" : "404 Not Found", wanted ? strlen(body) : 10,
	             wanted ? body : "not found\n");
	free(body);
	if (n < 0)
		return NULL;
	*len = (size_t)n;
	return reply;
}

/* "127.0.0.1:9100" or "[::1]:9100" */
static int parse_listen(const char *listen, struct sockaddr_storage *addr)
{
	char host[64];
	const char *colon = strrchr(listen, ':');
	int port;

	if (colon == NULL || (port = atoi(colon + 1)) <= 0 || port > 65535 ||
	    (size_t)(colon - listen) >= sizeof(host))
		return APS_EINVAL;
	snprintf(host, sizeof(host), "%.*s", (int)(colon - listen), listen);
	if (host[0] == '[' && host[strlen(host) - 1] == ']') {
		host[strlen(host) - 1] = '\0';
		return uv_ip6_addr(host + 1, port, (struct sockaddr_in6 *)addr) < 0 ? APS_EINVAL
		                                                                    : 0;
	}
	return uv_ip4_addr(host, port, (struct sockaddr_in *)addr) < 0 ? APS_EINVAL : 0;
}

static void free_metrics(void *ctx)
{
	free(ctx);
}

static void on_unused_tcp_closed(uv_handle_t *h)
{
	free(h->data);
}

int aps_metrics_open(struct aps_metrics **out, uv_loop_t *loop, const char *listen,
                     const struct aps_server *srv)
{
	struct sockaddr_storage addr;
	struct aps_metrics *m;
	int ret = parse_listen(listen, &addr);

	if (ret < 0)
		return ret;
	if ((m = calloc(1, sizeof(*m))) == NULL)
		return APS_ENOMEM;
	m->srv = srv;
	uv_tcp_init(loop, &m->tcp);
	m->tcp.data = m;
	ret = uv_tcp_bind(&m->tcp, (struct sockaddr *)&addr, 0) < 0 ? APS_ESYS : 0;
	if (ret == 0)
		ret = aps_oneshot_start(&m->oneshot, (uv_stream_t *)&m->tcp, "\r\n\r\n",
		                        http_answer, m);
	if (ret < 0) {
		aps_log_error("metrics", "cannot listen address=%s", listen);
		uv_close((uv_handle_t *)&m->tcp, on_unused_tcp_closed);
		return APS_ESYS;
	}
	*out = m;
	return 0;
}

void aps_metrics_close(struct aps_metrics *m)
{
	if (m != NULL)
		aps_oneshot_close(m->oneshot, free_metrics);
}
