/*
 * JSON reports of the daemon's state for the stats socket (apsctl reads
 * them): counters, latency percentiles, jobs with their stalls, workers and
 * tensors. Read-only over the server; built with jansson, but for the long
 * listings (tensors, workers), written as text.
 */
#include "server/report.h"

#include "common/err.h"
#include "server/ckpt_load.h"
#include "server/listing.h"
#include "server/server_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdbool.h>
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

/* What a round in progress waits for: its missing ranks, or with none missing,
 * its job's snapshot copy (its finishes wait for it: finish.c), or apsd itself
 * (its chunks being summed and coded, its results being sent). */
static const char *waits_for(const struct aps_job *job, size_t missing)
{
	if (missing > 0)
		return "ranks";
	return job->copying != NULL ? "checkpoint_copy" : "apsd";
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
		        a, json_pack("{s:s, s:I, s:o, s:s, s:f}", "tensor", t->name, "step",
		                     (json_int_t)t->round.step, "missing",
		                     ranks_array(missing, n < 64 ? n : 64), "waiting_for",
		                     waits_for(job, n), "waiting_s",
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
		json_object_set_new(o, "origin", json_string(j->origin));
		json_object_set_new(o, "bytes", json_integer((json_int_t)aps_job_bytes(j)));
		json_object_set_new(o, "reading_checkpoint", json_boolean(j->loading != NULL));
		if (j->loading != NULL) { /* how far: bytes read of the file's */
			uint64_t read, bytes;
			aps_ckpt_load_progress(j->loading, &read, &bytes);
			json_object_set_new(o, "checkpoint_read_bytes",
			                    json_integer((json_int_t)read));
			json_object_set_new(o, "checkpoint_bytes", json_integer((json_int_t)bytes));
		}
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

/*
 * The tensors and workers reports are written as text, not built as jansson
 * objects: a line of those cost 20 us, mostly malloc and free (4096 lines of a
 * `tensors` report took 81 ms of the loop, and `apsctl top` asks every second).
 */

/* s as a JSON string: names are visible ASCII (proto/validate.c), but a quote,
 * a backslash or a control byte is escaped all the same. */
static void put_str(FILE *f, const char *s)
{
	static const char plain_not[] = "\"\\\x01\x02\x03\x04\x05\x06\x07\x08\x09\x0a\x0b"
	                                "\x0c\x0d\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18"
	                                "\x19\x1a\x1b\x1c\x1d\x1e\x1f\x7f";

	putc_unlocked('"', f);
	while (*s != '\0') {
		size_t run = strcspn(s, plain_not); /* the bytes written as they are */
		fwrite_unlocked(s, 1, run, f);
		s += run;
		if (*s == '"' || *s == '\\')
			fprintf(f, "\\%c", *s++);
		else if (*s != '\0')
			fprintf(f, "\\u%04x", (unsigned char)*s++);
	}
	putc_unlocked('"', f);
}

/* "key":"value", */
static void put_key_str(FILE *f, const char *key, const char *value, bool last)
{
	fprintf(f, "\"%s\":", key);
	put_str(f, value);
	if (!last)
		putc_unlocked(',', f);
}

/* "key":value, a real as jansson's JSON_REAL_PRECISION(6) writes it (1.0, not 1);
 * not finite: null. */
static void put_key_real(FILE *f, const char *key, double value, bool last)
{
	char num[32] = "null";

	if (isfinite(value)) {
		snprintf(num, sizeof(num), "%.6g", value);
		if (strpbrk(num, ".e") == NULL)
			strcat(num, ".0");
	}
	fprintf(f, "\"%s\":%s%s", key, num, last ? "" : ",");
}

static void put_key_int(FILE *f, const char *key, long long value, bool last)
{
	fprintf(f, "\"%s\":%lld%s", key, value, last ? "" : ",");
}

static void put_worker(FILE *f, const struct aps_session *s, uint64_t now)
{
	/* away_s: since its connection closed, while apsd waits for it to reconnect */
	double away = s->detached_ms ? (double)(now - s->detached_ms) / 1000.0 : 0.0;

	putc_unlocked('{', f);
	put_key_str(f, "job", s->job->name, false);
	put_key_int(f, "rank", (long long)s->rank, false);
	put_key_str(f, "address", s->address, false);
	put_key_real(f, "connected_s", (double)(now - s->joined_ms) / 1000.0, false);
	put_key_real(f, "last_seen_s", (double)(now - s->last_seen_ms) / 1000.0, false);
	put_key_int(f, "msgs_in", (long long)s->msgs_in, false);
	put_key_int(f, "bytes_in", (long long)s->bytes_in, false);
	put_key_int(f, "bytes_out", (long long)s->bytes_out, false);
	put_key_int(f, "reconnects", (long long)s->reconnects, false);
	put_key_real(f, "away_s", away, true);
	putc_unlocked('}', f);
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
static void put_workers(FILE *f, const struct aps_server *srv, const uint32_t *quota)
{
	uint64_t now = uv_now(srv->loop);
	uint32_t n = 0;
	bool first = true;

	for (const struct aps_job *j = srv->jobs.jobs; j != NULL && n < srv->jobs.n_jobs;
	     j = j->next) {
		uint32_t listed = 0;
		for (uint32_t r = 0; r < j->world_size && listed < quota[n]; r++) {
			if (j->ranks[r] == NULL)
				continue;
			if (!first)
				putc_unlocked(',', f);
			put_worker(f, j->ranks[r], now);
			first = false;
			listed++;
		}
		n++;
	}
}

static void put_tensor(FILE *f, const struct aps_job *j, const struct aps_tensor *t)
{
	const struct aps_tensor_stats *st = &t->stats;
	double ratio = st->bytes_in ? (double)st->elements_in * 4.0 / (double)st->bytes_in : 0.0;
	/* What an element took on the uplink, block exponents included. */
	double bits = st->elements_in ? (double)st->bytes_in * 8.0 / (double)st->elements_in : 0.0;

	putc_unlocked('{', f);
	put_key_str(f, "job", j->name, false);
	put_key_str(f, "name", t->name, false);
	put_key_int(f, "id", (long long)t->id, false);
	put_key_int(f, "count", (long long)t->count, false);
	put_key_str(f, "format", st->format, false);
	put_key_str(f, "scaling", aps_scaling_name(j->scaling), false);
	put_key_int(f, "scale_exp", (long long)st->scale_exp, false);
	put_key_int(f, "down_scale_exp", (long long)st->down_scale_exp, false);
	put_key_real(f, "flushed_fraction", st->flushed_fraction, false);
	put_key_int(f, "overflow", (long long)st->overflow, false);
	put_key_int(f, "bytes_in", (long long)st->bytes_in, false);
	put_key_int(f, "bytes_out", (long long)st->bytes_out, false);
	put_key_real(f, "compression", ratio, false);
	put_key_int(f, "steps", (long long)st->steps, false);
	put_key_str(f, "policy_format", t->policy.current.name, false);
	put_key_str(f, "reason", t->policy.reason, false);
	put_key_real(f, "rel_error", st->rel_error, false);
	put_key_int(f, "format_switches", (long long)t->policy.switches, false);
	put_key_int(f, "updates", (long long)t->opt.updates, false);
	put_key_real(f, "bits_per_element", bits, false);
	put_key_int(f, "block_size", (long long)j->block, true);
	putc_unlocked('}', f);
}

/* REPORT_LINES_MAX tensors of every job together. */
static void put_tensors(FILE *f, const struct aps_server *srv, const uint32_t *quota)
{
	uint32_t n = 0;
	bool first = true;

	for (const struct aps_job *j = srv->jobs.jobs; j != NULL && n < srv->jobs.n_jobs;
	     j = j->next) {
		for (uint32_t i = 0; i < quota[n]; i++) {
			if (!first)
				putc_unlocked(',', f);
			put_tensor(f, j, j->tensors[i]);
			first = false;
		}
		n++;
	}
}

/* {"tensors":[...],"tensors_unlisted":N} or the same of workers, into *out. */
static int listing(const struct aps_server *srv, bool ranks, char **out)
{
	const char *what = ranks ? "workers" : "tensors";
	uint32_t *quota = NULL;
	int64_t unlisted = share(srv, ranks, &quota);
	size_t len = 0;
	FILE *f = unlisted >= 0 ? open_memstream(out, &len) : NULL;
	int bad;

	if (f == NULL) {
		free(quota);
		return APS_ENOMEM;
	}
	fprintf(f, "{\"%s\":[", what);
	if (ranks)
		put_workers(f, srv, quota);
	else
		put_tensors(f, srv, quota);
	fprintf(f, "],\"%s_unlisted\":%lld}", what, (long long)unlisted);
	free(quota);
	bad = ferror(f);
	if (fclose(f) != 0 || bad) {
		free(*out);
		*out = NULL;
		return APS_ENOMEM;
	}
	return 0;
}

int aps_report_build(const struct aps_server *srv, const char *command,
                     const struct aps_report_clients *clients, char **out)
{
	json_t *doc;

	if (strcmp(command, "stats") == 0) {
		doc = stats(srv, clients);
	} else if (strcmp(command, "jobs") == 0) {
		doc = json_pack("{s:o}", "jobs", jobs(srv));
	} else if (strcmp(command, "workers") == 0 || strcmp(command, "tensors") == 0) {
		return listing(srv, strcmp(command, "workers") == 0, out);
	} else {
		doc = json_pack("{s:s}", "error",
		                "unknown command: send one of stats, jobs, workers, tensors");
	}
	if (doc == NULL)
		return APS_ENOMEM;
	*out = json_dumps(doc, JSON_COMPACT | JSON_REAL_PRECISION(6));
	json_decref(doc);
	return *out != NULL ? 0 : APS_ENOMEM;
}
