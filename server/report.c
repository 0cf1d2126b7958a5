/*
 * JSON reports of the daemon's state for the stats socket (apsctl reads
 * them): counters, latency percentiles, jobs with their stalls, workers and
 * tensors. Read-only over the server; built with jansson.
 */
#include "server/report.h"

#include "common/err.h"
#include "server/listing.h"
#include "server/server_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NS_PER_US 1000.0
/* Lines of the tensors and workers reports, of every job together, and stalls
 * a job lists: a report costs the loop a few ms whatever the jobs hold (an
 * attack, 2026-12-07: 4 jobs of 65536 tensors made `tensors` hold the loop
 * 7.9 s and apsd's memory 600 MiB, for a reply cut off unsent). */
#define REPORT_LINES_MAX 4096
#define STALLS_MAX       64

static json_t *counters(const struct aps_server *srv)
{
	const struct aps_server_counters *c = &srv->counters;
	const struct aps_zbridge_counters *z =
	        srv->bridge != NULL ? aps_zbridge_counters(srv->bridge) : &srv->bridge_counters;
	json_t *o = json_object(), *bad = json_object();
	struct aps_engine_counters e;

#define APS_REPORT_COUNTER(name, text) \
	json_object_set_new(o, #name, json_integer((json_int_t)c->name));
	APS_SERVER_COUNTER_MAP(APS_REPORT_COUNTER)
#undef APS_REPORT_COUNTER
#define APS_REPORT_FAULT(name, stat, text) \
	json_object_set_new(bad, stat, json_integer((json_int_t)c->faults[APS_MSG_FAULT_##name]));
	APS_MSG_FAULT_MAP(APS_REPORT_FAULT)
#undef APS_REPORT_FAULT
	json_object_set_new(o, "bad_messages", bad);
#define APS_REPORT_BRIDGE(name, metric, help) \
	json_object_set_new(o, #name, json_integer((json_int_t)z->name));
	APS_ZBRIDGE_COUNTER_MAP(APS_REPORT_BRIDGE)
#undef APS_REPORT_BRIDGE
	json_object_set_new(o, "connections_open", json_integer((json_int_t)z->open_connections));
	json_object_set_new(o, "parked_bytes", json_integer((json_int_t)z->parked_bytes));
	json_object_set_new(o, "held_bytes", json_integer((json_int_t)srv->held.bytes));
	json_object_set_new(o, "pushes_given_up", json_integer((json_int_t)srv->held.given_up));
	json_object_set_new(o, "held_steps_dropped",
	                    json_integer((json_int_t)srv->held.steps_dropped));
	aps_engine_counters(srv->engine, &e);
	json_object_set_new(o, "engine_threads", json_integer((json_int_t)e.threads));
	json_object_set_new(o, "engine_tasks", json_integer((json_int_t)e.tasks));
	json_object_set_new(o, "engine_busy_ms", json_real((double)e.busy_ns / 1e6));
	json_object_set_new(o, "engine_max_queue", json_integer((json_int_t)e.max_queue));
	return o;
}

static json_t *latency(const struct aps_server *srv)
{
	const struct aps_latency *l = &srv->latency;

	return json_pack("{s:I, s:f, s:f, s:f}", "rounds", (json_int_t)l->count, "p50_us",
	                 aps_latency_percentile(l, 50) / NS_PER_US, "p90_us",
	                 aps_latency_percentile(l, 90) / NS_PER_US, "p99_us",
	                 aps_latency_percentile(l, 99) / NS_PER_US);
}

static json_t *stats(const struct aps_server *srv, const struct aps_report_clients *clients)
{
	uint32_t sessions = 0;
	json_t *c = counters(srv);

	for (const struct aps_session *s = srv->jobs.sessions; s != NULL; s = s->next)
		sessions += s->job != NULL;
	json_object_set_new(c, "stats_clients_evicted",
	                    json_integer((json_int_t)(clients ? clients->evicted : 0)));
	json_object_set_new(c, "stats_clients_refused",
	                    json_integer((json_int_t)(clients ? clients->refused : 0)));
	return json_pack("{s:s, s:f, s:s, s:s, s:i, s:i, s:o, s:o}", "version", APS_VERSION,
	                 "uptime_s", (double)(uv_now(srv->loop) - srv->started_ms) / 1000.0,
	                 "endpoint", srv->opts.endpoint, "config",
	                 srv->opts.summary ? srv->opts.summary : "", "jobs", (int)srv->jobs.n_jobs,
	                 "workers", (int)sessions, "round_latency", latency(srv), "counters", c);
}

static json_t *ranks_array(const uint32_t *ranks, size_t n)
{
	json_t *a = json_array();

	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, json_integer(ranks[i]));
	return a;
}

/* Rounds in progress: which tensor, which step, who is missing, for how long;
 * the first STALLS_MAX of them (*unlisted: the others). */
static json_t *stalls(const struct aps_job *job, uint32_t *unlisted)
{
	json_t *a = json_array();
	uint32_t missing[64];

	*unlisted = 0;
	for (uint32_t i = 0; i < job->n_tensors; i++) {
		const struct aps_tensor *t = job->tensors[i];
		size_t n;
		if (!aps_round_busy(&t->round))
			continue;
		if (json_array_size(a) == STALLS_MAX) {
			(*unlisted)++;
			continue;
		}
		n = aps_round_missing(&t->round, missing, 64);
		json_array_append_new(
		        a, json_pack("{s:s, s:I, s:o, s:f}", "tensor", t->name, "step",
		                     (json_int_t)t->round.step, "missing",
		                     ranks_array(missing, n < 64 ? n : 64), "waiting_s",
		                     (double)(uv_hrtime() - t->stats.step_started_ns) / 1e9));
	}
	return a;
}

static json_t *jobs(const struct aps_server *srv)
{
	json_t *a = json_array();

	for (const struct aps_job *j = srv->jobs.jobs; j != NULL; j = j->next) {
		uint64_t step = 0, held = 0;
		uint32_t unlisted;
		json_t *o, *stalled = stalls(j, &unlisted);
		for (uint32_t i = 0; i < j->n_tensors; i++) {
			step = j->tensors[i]->round.step > step ? j->tensors[i]->round.step : step;
			held += j->tensors[i]->round.held_bytes;
		}
		o = json_pack("{s:s, s:s, s:I, s:I}", "mode",
		              j->optim.kind == APS_OPTIM_NONE ? "allreduce" : "optimize",
		              "optimizer", j->optim_spec, "last_checkpoint_step",
		              (json_int_t)j->last_ckpt_step, "held_bytes", (json_int_t)held);
		json_object_set_new(o, "stalls_unlisted", json_integer(unlisted));
		json_object_set_new(o, "reading_checkpoint", json_boolean(j->loading != NULL));
		json_array_append_new(a, o);
		json_object_update_new(
		        o, json_pack("{s:s, s:i, s:i, s:s, s:s, s:b, s:i, s:I, s:I, s:o}", "name",
		                     j->name, "world_size", (int)j->world_size, "connected",
		                     (int)aps_job_connected(j), "scaling",
		                     aps_scaling_name(j->scaling), "downlink",
		                     j->downlink_auto ? "auto" : j->downlink.name, "lowp", j->lowp,
		                     "tensors", (int)j->n_tensors, "step", (json_int_t)step,
		                     "rounds", (json_int_t)j->rounds_completed, "stalls", stalled));
	}
	return a;
}

static json_t *worker(const struct aps_session *s, uint64_t now)
{
	/* away_s: since its connection closed, while apsd waits for it to reconnect */
	double away = s->detached_ms ? (double)(now - s->detached_ms) / 1000.0 : 0.0;

	return json_pack("{s:s, s:i, s:s, s:f, s:f, s:I, s:I, s:I, s:i, s:f}", "job", s->job->name,
	                 "rank", (int)s->rank, "address", s->address, "connected_s",
	                 (double)(now - s->joined_ms) / 1000.0, "last_seen_s",
	                 (double)(now - s->last_seen_ms) / 1000.0, "msgs_in",
	                 (json_int_t)s->msgs_in, "bytes_in", (json_int_t)s->bytes_in, "bytes_out",
	                 (json_int_t)s->bytes_out, "reconnects", (int)s->reconnects, "away_s",
	                 away);
}

/* How many lines each job lists (*quota, one per job in list order, freed by
 * the caller): REPORT_LINES_MAX shared out among the jobs' tensors, or their
 * ranks with a session. Returns the lines left out, or -1: out of memory. */
static int64_t share(const struct aps_server *srv, bool ranks, uint32_t **quota)
{
	size_t n = 0;
	uint32_t *want = calloc(srv->jobs.n_jobs + 1, sizeof(*want));
	int64_t unlisted = -1;

	*quota = calloc(srv->jobs.n_jobs + 1, sizeof(**quota));
	if (want != NULL && *quota != NULL) {
		for (const struct aps_job *j = srv->jobs.jobs; j != NULL && n < srv->jobs.n_jobs;
		     j = j->next)
			want[n++] = ranks ? aps_job_connected(j) : j->n_tensors;
		unlisted = aps_listing_share(want, n, REPORT_LINES_MAX, *quota);
	}
	free(want);
	return unlisted;
}

/* Ranks with a session, in rank order, REPORT_LINES_MAX of every job together. */
static json_t *workers(const struct aps_server *srv, int64_t *unlisted)
{
	uint64_t now = uv_now(srv->loop);
	json_t *a = json_array();
	uint32_t *quota, n = 0;

	*unlisted = share(srv, true, &quota);
	for (const struct aps_job *j = srv->jobs.jobs;
	     j != NULL && *unlisted >= 0 && n < srv->jobs.n_jobs; j = j->next) {
		uint32_t listed = 0;
		for (uint32_t r = 0; r < j->world_size && listed < quota[n]; r++) {
			if (j->ranks[r] == NULL)
				continue;
			json_array_append_new(a, worker(j->ranks[r], now));
			listed++;
		}
		n++;
	}
	free(quota);
	return a;
}

static json_t *tensor(const struct aps_job *j, const struct aps_tensor *t)
{
	const struct aps_tensor_stats *st = &t->stats;
	double ratio = st->bytes_in ? (double)st->elements_in * 4.0 / (double)st->bytes_in : 0.0;
	/* What an element took on the uplink, block exponents included. */
	double bits = st->elements_in ? (double)st->bytes_in * 8.0 / (double)st->elements_in : 0.0;

	json_t *o = json_pack("{s:s, s:s, s:f, s:I, s:I, s:f, s:i}", "policy_format",
	                      t->policy.current.name, "reason", t->policy.reason, "rel_error",
	                      st->rel_error, "format_switches", (json_int_t)t->policy.switches,
	                      "updates", (json_int_t)t->opt.updates, "bits_per_element", bits,
	                      "block_size", (int)j->block);

	json_object_update_new(
	        o, json_pack("{s:s, s:s, s:i, s:I, s:s, s:s, s:i, s:i, s:f, s:I, s:I, "
	                     "s:I, s:f, s:I}",
	                     "job", j->name, "name", t->name, "id", (int)t->id, "count",
	                     (json_int_t)t->count, "format", st->format, "scaling",
	                     aps_scaling_name(j->scaling), "scale_exp", st->scale_exp,
	                     "down_scale_exp", st->down_scale_exp, "flushed_fraction",
	                     st->flushed_fraction, "overflow", (json_int_t)st->overflow, "bytes_in",
	                     (json_int_t)st->bytes_in, "bytes_out", (json_int_t)st->bytes_out,
	                     "compression", ratio, "steps", (json_int_t)st->steps));
	return o;
}

/* REPORT_LINES_MAX tensors of every job together. */
static json_t *tensors(const struct aps_server *srv, int64_t *unlisted)
{
	json_t *a = json_array();
	uint32_t *quota, n = 0;

	*unlisted = share(srv, false, &quota);
	for (const struct aps_job *j = srv->jobs.jobs;
	     j != NULL && *unlisted >= 0 && n < srv->jobs.n_jobs; j = j->next) {
		for (uint32_t i = 0; i < quota[n]; i++)
			json_array_append_new(a, tensor(j, j->tensors[i]));
		n++;
	}
	free(quota);
	return a;
}

int aps_report_build(const struct aps_server *srv, const char *command,
                     const struct aps_report_clients *clients, char **out)
{
	int64_t unlisted = 0;
	json_t *doc, *list;

	if (strcmp(command, "stats") == 0) {
		doc = stats(srv, clients);
	} else if (strcmp(command, "jobs") == 0) {
		doc = json_pack("{s:o}", "jobs", jobs(srv));
	} else if (strcmp(command, "workers") == 0) {
		list = workers(srv, &unlisted); /* before unlisted is read */
		doc = json_pack("{s:o, s:I}", "workers", list, "workers_unlisted",
		                (json_int_t)unlisted);
	} else if (strcmp(command, "tensors") == 0) {
		list = tensors(srv, &unlisted);
		doc = json_pack("{s:o, s:I}", "tensors", list, "tensors_unlisted",
		                (json_int_t)unlisted);
	} else {
		doc = json_pack("{s:s}", "error",
		                "unknown command: send one of stats, jobs, workers, tensors");
	}
	if (doc == NULL || unlisted < 0) {
		json_decref(doc);
		return APS_ENOMEM;
	}
	*out = json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(6));
	json_decref(doc);
	return *out != NULL ? 0 : APS_ENOMEM;
}
