/*
 * The daemon's protocol state machine without a socket: server/ linked with a
 * fake bridge (the seam of zbridge.h) that records what apsd sends and lets
 * a test hand it messages and closes. Join, a round, a barrier, a lost rank,
 * a reconnect that takes its session back, a push said again after it, and a
 * HELLO of another world size while ranks wait: each in milliseconds, through
 * the same code as the daemon's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "common/codec.h"
#include "common/err.h"
#include "proto/frame.h"
#include "proto/validate.h"
#include "server/policy.h"
#include "server/server.h"
#include "server/zbridge.h"

#include <stdlib.h>
#include <string.h>
#include <uv.h>

#define MAX_SENT 256
#define N        16

/* ---- the fake bridge: what apsd sent, to whom ---- */

struct sent {
	struct aps_peer to;
	struct aps_msg msg;
	float values[N];
};

struct aps_zbridge {
	struct aps_zbridge_ops ops;
	void *ctx;
	struct aps_zbridge_counters cnt;
	struct sent sent[MAX_SENT];
	size_t n_sent;
	uint64_t closed_conn; /* a connection the test closed: not open */
};

static struct aps_zbridge *bridge;

int aps_zbridge_new(struct aps_zbridge **out, uv_loop_t *loop, const struct aps_zbridge_opts *o,
                    const struct aps_zbridge_ops *ops, void *ctx)
{
	(void)loop;
	(void)o;
	bridge = calloc(1, sizeof(*bridge));
	bridge->ops = *ops;
	bridge->ctx = ctx;
	*out = bridge;
	return 0;
}

void aps_zbridge_free(struct aps_zbridge *b, int linger_ms)
{
	(void)linger_ms;
	free(b);
	bridge = NULL;
}

static void release_copy(void *ctx)
{
	free(ctx);
}

int aps_zbridge_take_payload(struct aps_inmsg *m, struct aps_payload *out)
{
	uint8_t *copy = malloc(m->payload_len);

	memcpy(copy, m->payload, m->payload_len);
	*out = (struct aps_payload){ copy, m->payload_len, release_copy, copy };
	return 0;
}

int aps_zbridge_send(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                     size_t hdr_len, struct aps_sbuf *payload)
{
	struct aps_msg_limits lim;
	struct sent *s = &b->sent[b->n_sent++];
	struct aps_msg_fault fault;

	assert_true(b->n_sent < MAX_SENT);
	aps_msg_limits_init(&lim);
	lim.from_server = true; /* what the daemon sends, as a worker reads it */
	s->to = *peer;
	assert_int_equal(aps_msg_parse(&lim, hdr, hdr_len, payload ? payload->data : NULL,
	                               payload ? payload->len : 0, payload != NULL, &s->msg,
	                               &fault),
	                 0);
	if (s->msg.type == APS_MSG_RESULT)
		assert_int_equal(aps_codec_dequantize(&s->msg.fmt, payload->data, payload->len,
		                                      s->msg.chunk_count, s->msg.scale_exp,
		                                      s->values),
		                 0);
	s->msg.payload = NULL; /* the payload lives with the daemon */
	return 0;
}

/* Sent at once: what libzmq would hold is done with here. */
int aps_zbridge_send_tallied(struct aps_zbridge *b, const struct aps_peer *peer, const uint8_t *hdr,
                             size_t hdr_len, struct aps_sbuf *payload, struct aps_tally *tally,
                             uint32_t slot)
{
	(void)tally;
	(void)slot;
	return aps_zbridge_send(b, peer, hdr, hdr_len, payload);
}

void aps_zbridge_admit(struct aps_zbridge *b, uint64_t conn, bool admitted)
{
	(void)b;
	(void)conn;
	(void)admitted;
}

bool aps_zbridge_conn_open(struct aps_zbridge *b, uint64_t conn)
{
	return conn != 0 && conn != b->closed_conn;
}

int aps_zbridge_drop(struct aps_zbridge *b, uint64_t conn)
{
	(void)b;
	(void)conn;
	return 0;
}

const char *aps_zbridge_endpoint(const struct aps_zbridge *b)
{
	(void)b;
	return "inproc://test";
}

size_t aps_zbridge_tallied_waiting(struct aps_zbridge *b, const struct aps_peer *peer)
{
	(void)b;
	(void)peer;
	return 0; /* every answer is sent at once */
}

bool aps_zbridge_backed_up(struct aps_zbridge *b, const struct aps_peer *peer)
{
	(void)b;
	(void)peer;
	return false;
}

const struct aps_zbridge_counters *aps_zbridge_counters(struct aps_zbridge *b)
{
	return &b->cnt;
}

/* ---- a test's workers: one routing id and connection each ---- */

struct worker {
	struct aps_peer peer;
	uint64_t conn;
	uint32_t rank;
	uint8_t token[APS_MSG_SESSION_LEN];
	const char *address;   /* its Peer-Address; NULL: "test" */
	const char *job;       /* NULL: "j" */
	const char *user;      /* its CURVE key; NULL: "" */
	const char *job_token; /* NULL: none */
};

static uv_loop_t loop;
static struct aps_server *srv;
static uint32_t max_jobs_per_address; /* of the next start(); 0: no limit */
/* CURVE keys of the next start() and the jobs their lines name */
static const char *const curve_keys[] = { "TRAINER", "ANYONE" };
static const char *const curve_jobs[] = { "train-*", "" };
static bool curve; /* the next start() has them */

static void start(int grace_ms)
{
	struct aps_server_opts o = {
		.endpoint = "inproc://test",
		.downlink = "auto",
		.heartbeat_ms = 1000,
		.heartbeat_timeout_ms = 5000,
		.reconnect_grace_ms = grace_ms,
		.max_message_bytes = 1 << 20,
		.max_jobs = 8,
		.max_jobs_per_address = max_jobs_per_address,
		.curve_allow = curve ? curve_keys : NULL,
		.curve_jobs = curve ? curve_jobs : NULL,
		.n_curve_allow = curve ? 2 : 0,
		.max_ranks = 64,
		.max_tensors = 64,
		.max_job_bytes = 1 << 24,
		.max_total_bytes = 1 << 26,
		.max_connections = 64,
		.join_timeout_ms = 60000,
		.scaling = APS_SCALING_LOCAL,
		.chunk_elems = 8,
		.summary = "test",
		.checkpoint_keep = 1,
	};

	aps_policy_defaults(&o.policy);
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(aps_server_new(&srv, &loop, &o), 0);
}

static void stop(void)
{
	aps_server_stop(srv);
	uv_run(&loop, UV_RUN_DEFAULT);
	aps_server_free(srv);
	assert_int_equal(uv_loop_close(&loop), 0);
}

static struct worker worker(uint32_t rank, uint64_t conn)
{
	struct worker w = { .peer = { .len = 2, .id = { 0x81, (uint8_t)rank } },
		            .conn = conn,
		            .rank = rank };

	memset(w.token, 0x40 + (int)rank, sizeof(w.token));
	return w;
}

static void say(struct worker *w, struct aps_msg *m, const float *payload, size_t n)
{
	uint8_t hdr[4096];
	size_t len;
	struct aps_inmsg in = { .peer = w->peer,
		                .conn = w->conn,
		                .address = w->address != NULL ? w->address : "test",
		                .user = w->user != NULL ? w->user : "" };

	snprintf(m->job, sizeof(m->job), "%s", w->job != NULL ? w->job : "j");
	m->rank = w->rank;
	if (m->world_size == 0)
		m->world_size = 2;
	m->payload = (const uint8_t *)payload;
	m->payload_len = n * sizeof(float);
	assert_int_equal(aps_msg_pack(m, hdr, sizeof(hdr), &len), 0);
	in.hdr = hdr;
	in.hdr_len = len;
	in.nframes = payload != NULL ? 2 : 1;
	in.payload = (const uint8_t *)payload;
	in.payload_len = m->payload_len;
	bridge->ops.on_message(bridge->ctx, &in);
}

static void hello(struct worker *w, uint32_t flags)
{
	struct aps_msg m;

	aps_msg_init(&m, APS_MSG_HELLO);
	m.flags = flags;
	if (w->job_token != NULL)
		snprintf(m.job_token, sizeof(m.job_token), "%s", w->job_token);
	memcpy(m.session, w->token, sizeof(m.session));
	m.has_session = true;
	say(w, &m, NULL, 0);
}

static void reg(struct worker *w)
{
	struct aps_msg m;

	aps_msg_init(&m, APS_MSG_REGISTER);
	snprintf(m.tensor_name, sizeof(m.tensor_name), "w");
	m.total_count = N;
	snprintf(m.format, sizeof(m.format), "fp32");
	say(w, &m, NULL, 0);
}

/* The whole tensor, chunk by chunk (8 elements a chunk), rank's value everywhere. */
static void push(struct worker *w, uint64_t step, float value)
{
	float x[N];

	for (size_t i = 0; i < N; i++)
		x[i] = value;
	for (uint64_t off = 0; off < N; off += 8) {
		struct aps_msg m;
		aps_msg_init(&m, APS_MSG_PUSH);
		m.tensor_id = 0;
		m.step = step;
		m.chunk_offset = off;
		m.chunk_count = 8;
		m.total_count = N;
		snprintf(m.format, sizeof(m.format), "fp32");
		say(w, &m, x + off, 8);
	}
}

/* What apsd sent to w of type since message *from (moved past them), counted. */
static size_t count_to(const struct worker *w, enum aps_msg_type type, size_t from)
{
	size_t n = 0;

	for (size_t i = from; i < bridge->n_sent; i++) {
		if (aps_peer_equal(&bridge->sent[i].to, &w->peer) &&
		    bridge->sent[i].msg.type == type)
			n++;
	}
	return n;
}

static const struct sent *last_to(const struct worker *w, enum aps_msg_type type)
{
	for (size_t i = bridge->n_sent; i-- > 0;) {
		if (aps_peer_equal(&bridge->sent[i].to, &w->peer) &&
		    bridge->sent[i].msg.type == type)
			return &bridge->sent[i];
	}
	return NULL;
}

static void joined_pair(struct worker *a, struct worker *b)
{
	hello(a, 0);
	hello(b, 0);
	assert_int_equal(count_to(a, APS_MSG_WELCOME, 0), 1);
	assert_int_equal(count_to(b, APS_MSG_WELCOME, 0), 1);
	reg(a);
	reg(b);
	assert_int_equal(count_to(a, APS_MSG_REGISTERED, 0), 1);
	assert_int_equal(count_to(b, APS_MSG_REGISTERED, 0), 1);
}

/* ---- the tests ---- */

static void test_a_round_gives_both_ranks_the_mean(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2);
	size_t before;

	(void)state;
	start(1500);
	joined_pair(&a, &b);
	before = bridge->n_sent;
	push(&a, 0, 1.0f);
	assert_int_equal(count_to(&a, APS_MSG_RESULT, before), 0); /* waits for rank 1 */
	push(&b, 0, 3.0f);
	assert_int_equal(count_to(&a, APS_MSG_RESULT, before), 2); /* two chunks each */
	assert_int_equal(count_to(&b, APS_MSG_RESULT, before), 2);
	for (size_t i = 0; i < 8; i++)
		assert_true(last_to(&b, APS_MSG_RESULT)->values[i] == 2.0f);
	stop();
}

static void test_a_rank_that_names_another_world_size_is_refused(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2);
	const struct sent *e;
	struct aps_msg m;

	(void)state;
	start(1500);
	hello(&a, 0);
	aps_msg_init(&m, APS_MSG_HELLO);
	m.world_size = 3;
	memcpy(m.session, b.token, sizeof(m.session));
	m.has_session = true;
	say(&b, &m, NULL, 0);
	e = last_to(&b, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_EMISMATCH);
	assert_null(last_to(&b, APS_MSG_WELCOME));
	stop();
}

/* A HELLO of rank 1 that says world size 3 to the job of world size 2. */
static void hello_of_world_3(struct worker *w)
{
	struct aps_msg m;

	aps_msg_init(&m, APS_MSG_HELLO);
	m.world_size = 3;
	memcpy(m.session, w->token, sizeof(m.session));
	m.has_session = true;
	say(w, &m, NULL, 0);
}

static void barrier(struct worker *w, uint64_t step)
{
	struct aps_msg m;

	aps_msg_init(&m, APS_MSG_BARRIER);
	m.step = step;
	say(w, &m, NULL, 0);
}

static void test_a_world_size_mismatch_fails_the_calls_that_wait_for_it(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2);
	const struct sent *e;
	size_t before;

	(void)state;
	start(1500);
	hello(&a, 0);
	reg(&a);
	push(&a, 0, 1.0f); /* waits for rank 1 */
	hello_of_world_3(&b);
	e = last_to(&b, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_EMISMATCH);
	e = last_to(&a, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_EMISMATCH);
	assert_int_equal(e->msg.about_type, APS_MSG_UNSPECIFIED); /* every call of it fails */
	assert_non_null(
	        strstr(e->msg.error_text, "rank 1 said world_size 3, job 'j' has world size 2"));
	/* The job cannot go on: what rank 0 sends later (a late chunk of the failed call,
	 * or the call made again) gets the error, never a round of its own (with the job
	 * kept, late chunks entered a fresh round: a wrong mean for the others), and a
	 * correct rank 1 is told the job is over. */
	before = bridge->n_sent;
	push(&a, 0, 1.0f);
	assert_int_equal(count_to(&a, APS_MSG_RESULT, before), 0);
	e = last_to(&a, APS_MSG_ERROR);
	assert_int_equal(e->msg.error_code, APS_EMISMATCH);
	assert_non_null(strstr(e->msg.error_text, "a HELLO of job 'j' was refused (rank 1 said"));
	hello(&b, 0);
	e = last_to(&b, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_EBUSY);
	assert_null(last_to(&b, APS_MSG_WELCOME));
	stop();
}

static void test_a_world_size_mismatch_tells_a_waiting_rank_once_and_an_idle_one_never(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2), c = worker(2, 3);

	(void)state;
	start(1500);
	hello(&a, 0);
	reg(&a);
	hello_of_world_3(&b); /* rank 0 has no call in flight: its next one must not fail */
	assert_int_equal(count_to(&a, APS_MSG_ERROR, 0), 0);
	barrier(&a, 0);
	hello_of_world_3(&b);
	assert_int_equal(count_to(&a, APS_MSG_ERROR, 0), 1);
	hello_of_world_3(&c); /* rank 2 of 3: past the job's ranks, and nothing waits now */
	assert_non_null(last_to(&c, APS_MSG_ERROR));
	assert_int_equal(count_to(&a, APS_MSG_ERROR, 0), 1);
	stop();
}

static void test_a_world_size_mismatch_to_a_full_job_disturbs_no_one(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2), stranger = worker(1, 3);
	size_t before;

	(void)state;
	stranger.peer.id[1] = 9; /* another client than rank 1's */
	memset(stranger.token, 0x77, sizeof(stranger.token));
	start(1500);
	joined_pair(&a, &b);
	push(&a, 0, 1.0f);
	hello_of_world_3(&stranger);
	assert_non_null(last_to(&stranger, APS_MSG_ERROR));
	assert_int_equal(count_to(&a, APS_MSG_ERROR, 0), 0);
	before = bridge->n_sent;
	push(&b, 0, 3.0f);
	assert_int_equal(count_to(&a, APS_MSG_RESULT, before), 2);
	stop();
}

static void test_a_barrier_returns_when_both_are_in_it(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2);
	struct aps_msg m;

	(void)state;
	start(1500);
	joined_pair(&a, &b);
	aps_msg_init(&m, APS_MSG_BARRIER);
	m.step = 0;
	say(&a, &m, NULL, 0);
	assert_int_equal(count_to(&a, APS_MSG_BARRIER, 0), 0);
	aps_msg_init(&m, APS_MSG_BARRIER);
	m.step = 0;
	say(&b, &m, NULL, 0);
	assert_int_equal(count_to(&a, APS_MSG_BARRIER, 0), 1);
	assert_int_equal(count_to(&b, APS_MSG_BARRIER, 0), 1);
	stop();
}

static void test_a_rank_lost_in_a_round_is_named_to_the_other(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2);
	const struct sent *e;

	(void)state;
	start(0); /* no grace: a closed connection is a lost rank at once */
	joined_pair(&a, &b);
	push(&a, 0, 1.0f);
	bridge->closed_conn = b.conn;
	bridge->ops.on_disconnect(bridge->ctx, b.conn);
	e = last_to(&a, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_EPEERLOST);
	assert_non_null(strstr(e->msg.error_text, "rank 1"));
	stop();
}

static void test_a_reconnect_takes_the_session_back_and_a_resent_push_counts_once(void **state)
{
	struct worker a = worker(0, 1), b = worker(1, 2);
	const struct sent *w;
	size_t before;

	(void)state;
	start(1500);
	joined_pair(&a, &b);
	push(&b, 0, 3.0f); /* rank 1's chunks are in; then its connection goes */
	bridge->closed_conn = b.conn;
	bridge->ops.on_disconnect(bridge->ctx, b.conn);
	b.conn = 3; /* back on a new connection, with its token */
	hello(&b, APS_MSG_FLAG_RESUME);
	w = last_to(&b, APS_MSG_WELCOME);
	assert_non_null(w);
	assert_true(w->msg.flags & APS_MSG_FLAG_RESUMED);
	before = bridge->n_sent;
	push(&b, 0, 3.0f); /* said again: what apsd holds is not added twice */
	push(&a, 0, 1.0f);
	assert_int_equal(count_to(&a, APS_MSG_RESULT, before), 2);
	assert_int_equal(count_to(&b, APS_MSG_RESULT, before), 2);
	assert_int_equal(count_to(&b, APS_MSG_ERROR, before), 0);
	for (size_t i = 0; i < 8; i++)
		assert_true(last_to(&a, APS_MSG_RESULT)->values[i] == 2.0f);
	stop();
}

static void test_a_resume_of_an_unknown_session_is_refused(void **state)
{
	struct worker b = worker(1, 2);
	const struct sent *e;

	(void)state;
	start(1500);
	hello(&b, APS_MSG_FLAG_RESUME);
	e = last_to(&b, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_ENOSESSION);
	stop();
}

/* rank 0 of a new job from address, on a connection of its own. */
static struct worker starter(uint64_t conn, const char *address, const char *job)
{
	struct worker w = worker(0, conn);

	w.peer.id[1] = (uint8_t)conn;
	w.address = address;
	w.job = job;
	return w;
}

/* Whether w's HELLO got a WELCOME; else the ERROR's text must contain refused. */
static bool welcomed(struct worker *w, const char *refused)
{
	const struct sent *e;

	hello(w, 0);
	if (count_to(w, APS_MSG_WELCOME, 0) == 1)
		return true;
	e = last_to(w, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_ERANGE);
	if (strstr(e->msg.error_text, refused) == NULL)
		fail_msg("'%s' does not say '%s'", e->msg.error_text, refused);
	return false;
}

static void test_one_address_starts_at_most_max_jobs_per_address(void **state)
{
	struct worker v6a = starter(10, "2001:db8:1:2::5", "a");
	struct worker v6b = starter(11, "2001:db8:1:2:ffff::9", "b"); /* a's /64 */
	struct worker v6c = starter(12, "2001:db8:1:3::5", "c");      /* another /64 */
	struct worker v4d = starter(13, "10.0.0.1", "d");
	struct worker v4e = starter(14, "10.0.0.1", "e");
	struct worker v4f = starter(15, "10.0.0.2", "f");
	struct worker joins_a = starter(16, "2001:db8:1:2::6", "a");
	/* ipc's Peer-Address is localhost:UID:GID:PID: one user is one origin */
	struct worker ipc_g = starter(17, "localhost:1000:1000:111", "g");
	struct worker ipc_h = starter(18, "localhost:1000:100:222", "h");
	struct worker ipc_i = starter(19, "localhost:1001:1001:111", "i");
	const char *limit = "the limit of one address (max_jobs_per_address)";

	(void)state;
	max_jobs_per_address = 1;
	start(1500);
	assert_true(welcomed(&v6a, limit));
	assert_false(welcomed(&v6b, "2001:db8:1:2::/64 already started 1 jobs that run"));
	assert_true(welcomed(&v6c, limit));
	assert_true(welcomed(&v4d, limit));
	assert_false(welcomed(&v4e, "10.0.0.1 already started 1 jobs that run"));
	assert_true(welcomed(&v4f, limit));
	joins_a.rank = 1; /* a job of that /64 that exists takes its ranks: not a new one */
	assert_true(welcomed(&joins_a, limit));
	assert_true(welcomed(&ipc_g, limit));
	assert_false(welcomed(&ipc_h, "ipc uid 1000 already started 1 jobs that run"));
	assert_true(welcomed(&ipc_i, limit));
	stop();
}

/* The text of the ERROR that w's HELLO got. */
static const char *refusal(struct worker *w)
{
	const struct sent *e;

	hello(w, 0);
	e = last_to(w, APS_MSG_ERROR);
	assert_non_null(e);
	assert_int_equal(e->msg.error_code, APS_EACCES);
	return e->msg.error_text;
}

static void test_a_refused_hello_learns_of_the_holder_only_if_it_may_join(void **state)
{
	struct worker holder = starter(20, "10.0.0.9", "secret-run");
	struct worker trainer = starter(21, "10.0.0.1", "secret-run");
	struct worker other_run = starter(22, "10.0.0.2", "secret-run");
	const char *text;

	(void)state;
	curve = true;
	start(1500);
	holder.user = "ANYONE";
	holder.job_token = "run1";
	hello(&holder, 0);
	assert_int_equal(count_to(&holder, APS_MSG_WELCOME, 0), 1);
	/* a key whose line names train-* does not learn that the job exists */
	trainer.user = "TRAINER";
	trainer.rank = 1;
	text = refusal(&trainer);
	assert_non_null(strstr(text, "its CURVE key may not join this job"));
	assert_null(strstr(text, "held by"));
	/* a key that may join, with another job token: since when, not from where */
	other_run.user = "ANYONE";
	other_run.job_token = "run2";
	other_run.rank = 1;
	text = refusal(&other_run);
	assert_non_null(strstr(text, "the job token differs (held by a job started 0.0 s ago "
	                             "with 1 of 2 ranks; apsd's log names its address)"));
	assert_null(strstr(text, "10.0.0.9"));
	stop();
}

/* What a test set for its start(), back to the defaults even when it failed. */
static int defaults(void **state)
{
	(void)state;
	max_jobs_per_address = 0;
	curve = false;
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_a_round_gives_both_ranks_the_mean),
		cmocka_unit_test(test_a_rank_that_names_another_world_size_is_refused),
		cmocka_unit_test(test_a_world_size_mismatch_fails_the_calls_that_wait_for_it),
		cmocka_unit_test(
		        test_a_world_size_mismatch_tells_a_waiting_rank_once_and_an_idle_one_never),
		cmocka_unit_test(test_a_world_size_mismatch_to_a_full_job_disturbs_no_one),
		cmocka_unit_test(test_a_barrier_returns_when_both_are_in_it),
		cmocka_unit_test(test_a_rank_lost_in_a_round_is_named_to_the_other),
		cmocka_unit_test(
		        test_a_reconnect_takes_the_session_back_and_a_resent_push_counts_once),
		cmocka_unit_test(test_a_resume_of_an_unknown_session_is_refused),
		cmocka_unit_test_teardown(test_one_address_starts_at_most_max_jobs_per_address,
		                          defaults),
		cmocka_unit_test_teardown(
		        test_a_refused_hello_learns_of_the_holder_only_if_it_may_join, defaults),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
