/*
 * The Prometheus endpoint: a TCP listener (server/oneshot.c) that answers
 * GET /metrics with every daemon counter, per-kind bad-message counters,
 * round latency quantiles, and per-job and per-tensor series. A scrape costs
 * the loop a few ms whatever peers do: at most TENSOR_SERIES_MAX tensors are
 * listed, shared out among the jobs, and the text is rendered at most once
 * every RENDER_EVERY_MS (an attack, 2026-12-07: a stranger's job of 30000
 * tensors made each GET 28 MB and 1-2.4 s of the loop, and 3 GETs a second
 * stalled every job).
 */
#include "server/metrics.h"

#include "common/err.h"
#include "common/log.h"
#include "server/listing.h"
#include "server/oneshot.h"
#include "server/server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Tensors listed in the per-tensor series, of every job together. */
#define TENSOR_SERIES_MAX 4096
/* Scrapes within this long of a render get its text again. */
#define RENDER_EVERY_MS 1000

struct aps_metrics {
	uv_tcp_t tcp;
	const struct aps_server *srv;
	struct aps_oneshot *oneshot;
	char *body; /* the last render; NULL: none yet */
	uint64_t rendered_ms;
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
	gauge(f, "held_bytes",
	      "Bytes of pushes that came before a lower rank's, held until their turn "
	      "(max_held_bytes bounds them).",
	      (double)srv->held.bytes);
	counter(f, "pushes_given_up",
	        "Held pushes a job gave up, past its fair part of max_held_bytes, for another "
	        "job's: asked again at their turn.",
	        srv->held.given_up);
	counter(f, "held_steps_dropped",
	        "Steps dropped, past their job's fair part of max_held_bytes, for another job's: "
	        "they held pushes of clients that cannot be asked again (protocol < 1.10).",
	        srv->held.steps_dropped);
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

/* Job and tensor names are visible ASCII (the validator insists); quotes and
 * backslashes escaped. A run at a time: a character at a time took the stream's
 * lock 500 times a name. */
static void label(FILE *f, const char *s)
{
	for (;;) {
		size_t run = strcspn(s, "\"\\");
		fwrite(s, 1, run, f);
		if (s[run] == '\0')
			return;
		fputc('\\', f);
		fputc(s[run], f);
		s += run + 1;
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

/* How many of its tensors each job lists (quota[i] for the i-th job of the
 * list, n of them): TENSOR_SERIES_MAX shared out. false: out of memory. */
static bool tensor_quotas(const struct aps_server *srv, uint32_t *quota, size_t n)
{
	uint32_t *want = malloc((n ? n : 1) * sizeof(*want));
	size_t i = 0;
	bool ok;

	if (want == NULL)
		return false;
	for (const struct aps_job *j = srv->jobs.jobs; j != NULL && i < n; j = j->next)
		want[i++] = j->n_tensors;
	ok = aps_listing_share(want, i, TENSOR_SERIES_MAX, quota) >= 0;
	free(want);
	return ok;
}

static void render_tensors(FILE *f, const struct aps_server *srv, const uint32_t *quota)
{
	static const char *const names[] = { "tensor_bytes_in_total", "tensor_bytes_out_total",
		                             "tensor_flushed_fraction" };
	static const char *const helps[] = {
		"Payload bytes received for the tensor.", "Payload bytes sent for the tensor.",
		"Share of non-zero values flushed to zero, last step."
	};
	const struct aps_job *j;
	size_t n;

	for (int k = 0; k < 3; k++) {
		fprintf(f, "# HELP apsd_%s %s\n# TYPE apsd_%s %s\n", names[k], helps[k], names[k],
		        k < 2 ? "counter" : "gauge");
		for (j = srv->jobs.jobs, n = 0; j != NULL; j = j->next, n++) {
			for (uint32_t i = 0; i < quota[n]; i++) {
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
	fprintf(f,
	        "# HELP apsd_job_tensors_unlisted Tensors of the job without series of their "
	        "own (at most %d are listed, of every job together).\n"
	        "# TYPE apsd_job_tensors_unlisted gauge\n",
	        TENSOR_SERIES_MAX);
	for (j = srv->jobs.jobs, n = 0; j != NULL; j = j->next, n++) {
		fputs("apsd_job_tensors_unlisted{job=\"", f);
		label(f, j->name);
		fprintf(f, "\"} %u\n", j->n_tensors - quota[n]);
	}
}

char *aps_metrics_render(const struct aps_server *srv)
{
	size_t n_jobs = srv->jobs.n_jobs, len = 0;
	uint32_t *quota = calloc(n_jobs ? n_jobs : 1, sizeof(*quota));
	char *text = NULL;
	FILE *f = quota != NULL && tensor_quotas(srv, quota, n_jobs) ? open_memstream(&text, &len)
	                                                             : NULL;

	if (f == NULL) {
		free(quota);
		return NULL;
	}
	render_daemon(f, srv);
	render_latency(f, srv);
	render_jobs(f, srv);
	render_tensors(f, srv, quota);
	free(quota);
	if (fclose(f) != 0) {
		free(text);
		return NULL;
	}
	return text;
}

/* The text of a render at most RENDER_EVERY_MS old; NULL: out of memory. */
static const char *body_of(struct aps_metrics *m)
{
	uint64_t now = uv_now(m->srv->loop);

	if (m->body == NULL || now - m->rendered_ms >= RENDER_EVERY_MS) {
		char *fresh = aps_metrics_render(m->srv);
		if (fresh == NULL)
			return NULL;
		free(m->body);
		m->body = fresh;
		m->rendered_ms = now;
	}
	return m->body;
}

static char *http_answer(void *ctx, const char *request, size_t *len)
{
	struct aps_metrics *m = ctx;
	bool wanted = strncmp(request, "GET /metrics ", 13) == 0 ||
	              strncmp(request, "GET /metrics?", 13) == 0;
	const char *body = wanted ? body_of(m) : NULL;
	char *reply = NULL;
	int n;

	if (wanted && body == NULL)
		return NULL;
	if (wanted) {
		uint64_t evicted, refused;
		char own[640];
		aps_oneshot_counts(m->oneshot, &evicted, &refused);
		snprintf(
		        own, sizeof(own),
		        "# HELP apsd_metrics_clients_evicted_total Clients of this endpoint closed "
		        "for a new one: no whole request, or an answer unread for a second.\n"
		        "# TYPE apsd_metrics_clients_evicted_total counter\n"
		        "apsd_metrics_clients_evicted_total %llu\n"
		        "# HELP apsd_metrics_clients_refused_total Clients of this endpoint refused: "
		        "16 were being answered.\n"
		        "# TYPE apsd_metrics_clients_refused_total counter\n"
		        "apsd_metrics_clients_refused_total %llu\n",
		        (unsigned long long)evicted, (unsigned long long)refused);
		n = asprintf(
		        &reply,
		        "HTTP/1.0 200 OK\r\nContent-Type: text/plain; version=0.0.4; "
		        "charset=utf-8\r\nContent-Length: %zu\r\nConnection: close\r\n\r\n%s%s",
		        strlen(body) + strlen(own), body, own);
	} else {
		n = asprintf(&reply, "HTTP/1.0 404 Not Found\r\nContent-Length: 10\r\n"
		                     "Connection: close\r\n\r\nnot found\n");
	}
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
	struct aps_metrics *m = ctx;

	free(m->body);
	free(m);
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
