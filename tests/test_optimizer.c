/*
 * The daemon's optimizer: the spec parser (names, keys, ranges, torch's
 * defaults, the canonical form) and the update rules against the formulas of
 * torch.optim written out in double precision for a few steps.
 */
#include "server/optimizer.h"

#include "server/job.h"

#include "common/err.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#define N 5

static void parse_ok(const char *spec, struct aps_optim_config *c)
{
	char why[160] = "";

	if (aps_optim_parse(spec, c, why, sizeof(why)) != 0)
		fail_msg("'%s' refused: %s", spec, why);
}

static void parse_bad(const char *spec, const char *reason)
{
	struct aps_optim_config c;
	char why[160] = "";

	assert_int_equal(aps_optim_parse(spec, &c, why, sizeof(why)), APS_EINVAL);
	if (strstr(why, reason) == NULL)
		fail_msg("'%s': '%s' does not say '%s'", spec, why, reason);
}

static void test_optimizer_parses_specs(void **state)
{
	struct aps_optim_config c;
	char buf[APS_OPTIM_SPEC_MAX];

	(void)state;
	parse_ok("sgd", &c);
	assert_int_equal(c.kind, APS_OPTIM_SGD);
	assert_int_equal(aps_optim_slots(&c), 0);
	aps_optim_describe(&c, buf, sizeof(buf));
	assert_string_equal(buf, "sgd,momentum=0,dampening=0,nesterov=0,weight_decay=0");
	parse_ok("sgd,momentum=0.9,nesterov=1,weight_decay=5e-4", &c);
	assert_true(c.momentum == 0.9f && c.nesterov && c.weight_decay == 5e-4f);
	assert_int_equal(aps_optim_slots(&c), 1);
	parse_ok("adam", &c);
	assert_true(c.beta1 == 0.9f && c.beta2 == 0.999f && c.eps == 1e-8f && c.weight_decay == 0);
	assert_int_equal(aps_optim_slots(&c), 2);
	parse_ok("adamw", &c);
	assert_true(c.kind == APS_OPTIM_ADAMW && c.weight_decay == 0.01f);
	aps_optim_describe(&c, buf, sizeof(buf));
	assert_string_equal(buf, "adamw,beta1=0.899999976,beta2=0.999000013,eps=9.99999994e-09,"
	                         "weight_decay=0.00999999978");
	/* The canonical form parses back to the same settings. */
	struct aps_optim_config again;
	parse_ok(buf, &again);
	assert_memory_equal(&c, &again, sizeof(c));
}

static void test_optimizer_refuses_bad_specs(void **state)
{
	(void)state;
	parse_bad("", "is not sgd, adam or adamw");
	parse_bad("rmsprop", "is not sgd, adam or adamw");
	parse_bad("sgd,beta1=0.9", "has no setting 'beta1'");
	parse_bad("adam,momentum=0.9", "has no setting 'momentum'");
	parse_bad("sgd,momentum", "has no setting 'momentum'");
	parse_bad("sgd,momentum=1", "momentum");
	parse_bad("sgd,momentum=-0.1", "momentum");
	parse_bad("sgd,momentum=x", "momentum");
	parse_bad("sgd,momentum=", "momentum");
	parse_bad("sgd,nesterov=2", "nesterov");
	parse_bad("sgd,nesterov=1", "nesterov needs momentum");
	parse_bad("sgd,momentum=0.9,dampening=0.1,nesterov=1", "nesterov needs");
	parse_bad("adam,eps=0", "eps");
	parse_bad("adam,beta2=nan", "beta2");
	parse_bad("adam,weight_decay=inf", "weight_decay");
	parse_bad("sgd,", "has no setting");
}

/* torch.optim.SGD, in double: the reference the fp32 kernel must follow. */
static void sgd_ref(const struct aps_optim_config *c, double *w, double *buf, const double *g,
                    double lr, int t)
{
	for (int i = 0; i < N; i++) {
		double d = g[i] + c->weight_decay * w[i];
		if (c->momentum != 0) {
			buf[i] = t == 1 ? d : c->momentum * buf[i] + (1 - c->dampening) * d;
			d = c->nesterov ? d + c->momentum * buf[i] : buf[i];
		}
		w[i] -= lr * d;
	}
}

static void adam_ref(const struct aps_optim_config *c, double *w, double *m, double *v,
                     const double *g, double lr, int t)
{
	for (int i = 0; i < N; i++) {
		double gi = g[i];
		if (c->kind == APS_OPTIM_ADAMW)
			w[i] *= 1 - lr * c->weight_decay;
		else
			gi += c->weight_decay * w[i];
		m[i] = c->beta1 * m[i] + (1 - c->beta1) * gi;
		v[i] = c->beta2 * v[i] + (1 - c->beta2) * gi * gi;
		double mhat = m[i] / (1 - pow(c->beta1, t)), vhat = v[i] / (1 - pow(c->beta2, t));
		w[i] -= lr * mhat / (sqrt(vhat) + c->eps);
	}
}

/* Runs 6 steps of spec through the kernel and the reference; they agree to float tolerance. */
static void check_against_reference(const char *spec)
{
	struct aps_optim_config c;
	struct aps_optim_tensor t;
	double w[N], s0[N] = { 0 }, s1[N] = { 0 }, g[N];
	float gf[N];

	parse_ok(spec, &c);
	assert_int_equal(aps_optim_tensor_init(&t, &c, N), 0);
	for (int i = 0; i < N; i++)
		t.weights[i] = t.view[i] = (float)(w[i] = 0.5 - 0.25 * i);
	for (int step = 1; step <= 6; step++) {
		float delta[N];
		t.lr = 0.05f * (float)step; /* the client may change it every step */
		for (int i = 0; i < N; i++)
			g[i] = gf[i] = (float)(sin(step * 1.7 + i) * (i + 1));
		memcpy(delta, gf, sizeof(delta));
		aps_optim_tensor_step_chunk(&c, &t, 0, delta, N);
		if (c.kind == APS_OPTIM_SGD)
			sgd_ref(&c, w, s0, g, t.lr, step);
		else
			adam_ref(&c, w, s0, s1, g, t.lr, step);
		t.state_t++;
		for (int i = 0; i < N; i++) {
			if (fabs(t.weights[i] - w[i]) > 1e-5 * (1 + fabs(w[i])))
				fail_msg("%s step %d [%d]: %.9g, reference %.9g", spec, step, i,
				         (double)t.weights[i], w[i]);
			/* The downlink carries the new weights minus the workers' view. */
			assert_true(delta[i] == t.weights[i] - t.view[i]);
		}
		memcpy(t.view, t.weights, sizeof(float) * N);
	}
	aps_optim_tensor_fini(&t);
}

static void test_optimizer_matches_reference(void **state)
{
	(void)state;
	check_against_reference("sgd");
	check_against_reference("sgd,weight_decay=0.01");
	check_against_reference("sgd,momentum=0.9");
	check_against_reference("sgd,momentum=0.9,dampening=0.5,weight_decay=1e-3");
	check_against_reference("sgd,momentum=0.8,nesterov=1");
	check_against_reference("adam");
	check_against_reference("adam,beta1=0.5,beta2=0.9,weight_decay=0.1");
	check_against_reference("adamw,weight_decay=0.1");
}

/* A chunk updates only its own range. */
static void test_optimizer_chunk_offsets(void **state)
{
	struct aps_optim_config c;
	struct aps_optim_tensor t;
	float g[2] = { 1, 1 };

	(void)state;
	parse_ok("sgd,momentum=0.5", &c);
	assert_int_equal(aps_optim_tensor_init(&t, &c, 6), 0);
	t.lr = 1;
	aps_optim_tensor_step_chunk(&c, &t, 2, g, 2);
	for (int i = 0; i < 6; i++) {
		assert_true(t.weights[i] == (i == 2 || i == 3 ? -1.0f : 0.0f));
		assert_true(t.state[0][i] == (i == 2 || i == 3 ? 1.0f : 0.0f));
	}
	assert_true(g[0] == -1.0f && g[1] == -1.0f);
	aps_optim_tensor_fini(&t);
	aps_optim_tensor_fini(&t); /* zeroed: a second fini is harmless */
}

/* A lost rank after some chunks of a step were applied leaves the tensor torn. */
static void test_optimizer_abort_mid_step_marks_torn(void **state)
{
	struct aps_jobs jobs = { 0 };
	struct aps_job *job;
	struct aps_tensor *a, *b;
	struct aps_round_result res;
	struct aps_optim_config c;
	float g[8] = { 1, 2, 3, 4, 5, 6, 7, 8 };
	struct aps_contribution contrib = { 0 };
	char why[160];

	(void)state;
	parse_ok("sgd", &c);
	assert_int_equal(aps_jobs_create(&jobs, "j", 1, &job), 0);
	job->chunk_elems = 8;
	assert_int_equal(aps_job_add_tensor(job, "a", 24, 16, &a), 0);
	assert_int_equal(aps_job_add_tensor(job, "b", 24, 16, &b), 0);
	assert_int_equal(a->round.n_chunks, 3);
	assert_int_equal(aps_optim_tensor_init(&a->opt, &c, 24), 0);
	assert_int_equal(aps_optim_tensor_init(&b->opt, &c, 24), 0);
	a->opt.ready = b->opt.ready = true;
	aps_format_parse("fp32", &contrib.fmt);
	contrib.payload.data = (const uint8_t *)g;
	contrib.payload.len = sizeof(g);
	assert_int_equal(
	        aps_round_add(&a->round, 0, 0, 0, APS_ROUND_ALLREDUCE, &contrib, why, sizeof(why)),
	        0);
	assert_true(aps_round_chunk_complete(&a->round, 0));
	assert_int_equal(aps_round_finish_chunk(&a->round, 0, NULL, APS_SCALING_LOCAL, &res), 0);
	aps_sbuf_unref(res.payload);
	contrib.payload.data = (const uint8_t *)g;
	assert_int_equal(
	        aps_round_add(&b->round, 0, 0, 1, APS_ROUND_ALLREDUCE, &contrib, why, sizeof(why)),
	        0);
	aps_job_abort_rounds(job);
	assert_true(a->opt.torn);  /* chunk 0 of its step was applied */
	assert_false(b->opt.torn); /* nothing applied yet: the step is simply collected again */
	aps_jobs_free_all(&jobs);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_optimizer_parses_specs),
		cmocka_unit_test(test_optimizer_refuses_bad_specs),
		cmocka_unit_test(test_optimizer_matches_reference),
		cmocka_unit_test(test_optimizer_chunk_offsets),
		cmocka_unit_test(test_optimizer_abort_mid_step_marks_torn),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
