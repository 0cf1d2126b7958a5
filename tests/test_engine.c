/*
 * apsd's engine threads (server/engine.c) with a real libuv loop: a lane runs
 * its tasks in submission order, done() comes on the loop, quiesce takes an
 * owner's queued tasks back unrun without waiting behind other owners' work,
 * wait lets them run, and free runs what is queued and cancels what the loop
 * has not taken.
 */
#include "common/err.h"
#include "server/engine.h"

#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#define MAX_LOG 256

/* What happened, in order: run and done of each task by id (shared by the threads). */
struct log {
	pthread_mutex_t mu;
	int runs[MAX_LOG], n_runs;
	int dones[MAX_LOG], n_dones;
	bool cancelled[MAX_LOG];
	bool ran[MAX_LOG];
};

struct task {
	struct aps_engine_task base;
	struct log *log;
	int id;
	atomic_bool *gate; /* run() waits until it is true (NULL: no wait) */
	atomic_bool started;
};

static void run_task(struct aps_engine_task *b, struct aps_engine_scratch *s)
{
	struct task *t = (struct task *)b;

	assert_non_null(aps_engine_scratch(s, 4096)); /* a thread's own buffer */
	atomic_store(&t->started, true);
	while (t->gate != NULL && !atomic_load(t->gate))
		usleep(1000);
	pthread_mutex_lock(&t->log->mu);
	t->log->runs[t->log->n_runs++] = t->id;
	t->log->ran[t->id] = true;
	pthread_mutex_unlock(&t->log->mu);
}

static void done_task(struct aps_engine_task *b, bool cancelled)
{
	struct task *t = (struct task *)b;

	t->log->dones[t->log->n_dones++] = t->id; /* the loop thread only */
	t->log->cancelled[t->id] = cancelled;
}

static struct task *task(struct log *log, int id, const void *owner, atomic_bool *gate)
{
	struct task *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	*t = (struct task){ .base = { .run = run_task, .done = done_task, .owner = owner },
		            .log = log,
		            .id = id,
		            .gate = gate };
	return t;
}

static void keep_alive(uv_timer_t *t)
{
	(void)t;
}

struct fixture {
	uv_loop_t loop;
	uv_timer_t keep; /* the engine's handle does not keep the loop alive */
	struct aps_engine *e;
	struct log log;
};

static struct fixture *setup(unsigned threads)
{
	struct fixture *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	pthread_mutex_init(&f->log.mu, NULL);
	uv_loop_init(&f->loop);
	uv_timer_init(&f->loop, &f->keep);
	uv_timer_start(&f->keep, keep_alive, 60000, 60000);
	assert_int_equal(aps_engine_new(&f->e, &f->loop, threads), 0);
	return f;
}

/* Runs the loop until n done() calls have come. */
static void until_done(struct fixture *f, int n)
{
	while (f->log.n_dones < n)
		uv_run(&f->loop, UV_RUN_ONCE);
}

static void teardown(struct fixture *f)
{
	aps_engine_close(f->e);
	aps_engine_free(f->e);
	uv_close((uv_handle_t *)&f->keep, NULL);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	pthread_mutex_destroy(&f->log.mu);
	free(f);
}

static void free_all(struct task **t, int n)
{
	for (int i = 0; i < n; i++)
		free(t[i]);
}

static void test_engine_runs_a_lane_in_order_and_done_comes_on_the_loop(void **state)
{
	struct fixture *f = setup(3);
	struct task *t[60];
	struct aps_engine_counters c;

	(void)state;
	for (int i = 0; i < 60; i++) {
		t[i] = task(&f->log, i, f, NULL);
		aps_engine_submit(f->e, (uint32_t)(i % 3), &t[i]->base); /* lane i mod 3 */
	}
	until_done(f, 60);
	/* every lane's tasks ran in the order they were submitted */
	for (int lane = 0; lane < 3; lane++) {
		int last = -1;
		for (int k = 0; k < f->log.n_runs; k++) {
			if (f->log.runs[k] % 3 != lane)
				continue;
			assert_true(f->log.runs[k] > last);
			last = f->log.runs[k];
		}
	}
	for (int i = 0; i < 60; i++)
		assert_false(f->log.cancelled[i]);
	aps_engine_counters(f->e, &c);
	assert_int_equal(c.threads, 3);
	assert_int_equal(c.tasks, 60);
	free_all(t, 60);
	teardown(f);
}

static void test_engine_quiesce_takes_queued_tasks_back_unrun(void **state)
{
	struct fixture *f = setup(1);
	atomic_bool open = false;
	int a = 0, b = 0; /* two owners */
	struct task *blocker = task(&f->log, 0, &a, &open), *t[4];

	(void)state;
	aps_engine_submit(f->e, 0, &blocker->base); /* owner a holds the only thread */
	for (int i = 0; i < 4; i++) {
		t[i] = task(&f->log, 1 + i, &b, NULL);
		aps_engine_submit(f->e, 0, &t[i]->base);
	}
	while (!atomic_load(&blocker->started))
		usleep(1000);
	/* b's tasks are queued behind a's: quiesce does not wait for a */
	aps_engine_quiesce(f->e, &b);
	assert_int_equal(f->log.n_dones, 4);
	for (int i = 1; i <= 4; i++) {
		assert_true(f->log.cancelled[i]);
		assert_false(f->log.ran[i]);
	}
	atomic_store(&open, true);
	until_done(f, 5);
	assert_false(f->log.cancelled[0]);
	assert_int_equal(f->log.n_runs, 1);
	free(blocker);
	free_all(t, 4);
	teardown(f);
}

static void test_engine_quiesce_waits_for_a_running_task_and_cancels_its_result(void **state)
{
	struct fixture *f = setup(2);
	int a = 0;
	struct task *t[8];

	(void)state;
	for (int i = 0; i < 8; i++) {
		t[i] = task(&f->log, i, &a, NULL);
		aps_engine_submit(f->e, (uint32_t)i, &t[i]->base);
	}
	while (atomic_load(&t[0]->started) == false)
		usleep(100);
	aps_engine_quiesce(f->e, &a); /* the loop has taken none of the results */
	assert_int_equal(f->log.n_dones, 8);
	for (int i = 0; i < 8; i++)
		assert_true(f->log.cancelled[i]);
	assert_true(f->log.ran[0]); /* it was running: it ran to its end */
	free_all(t, 8);
	teardown(f);
}

static void test_engine_wait_lets_the_tasks_run_and_their_done_come(void **state)
{
	struct fixture *f = setup(2);
	int a = 0, b = 0;
	struct task *t[10];

	(void)state;
	for (int i = 0; i < 10; i++) {
		t[i] = task(&f->log, i, i % 2 ? &a : &b, NULL);
		aps_engine_submit(f->e, (uint32_t)i, &t[i]->base);
	}
	aps_engine_wait(f->e, &a);
	for (int i = 1; i < 10; i += 2)
		assert_true(f->log.ran[i]);
	until_done(f, 10);
	for (int i = 0; i < 10; i++)
		assert_false(f->log.cancelled[i]);
	free_all(t, 10);
	teardown(f);
}

static void test_engine_free_runs_what_is_queued_and_cancels_results(void **state)
{
	struct fixture *f = setup(2);
	struct task *t[20];
	struct log *log = &f->log;
	int ran = 0;

	(void)state;
	for (int i = 0; i < 20; i++) {
		t[i] = task(log, i, f, NULL);
		aps_engine_submit(f->e, (uint32_t)i, &t[i]->base);
	}
	aps_engine_close(f->e); /* the daemon stops: no result reaches the loop */
	aps_engine_free(f->e);
	for (int i = 0; i < 20; i++) {
		ran += log->ran[i];
		assert_true(log->cancelled[i]);
	}
	assert_int_equal(ran, 20);
	assert_int_equal(log->n_dones, 20);
	free_all(t, 20);
	uv_close((uv_handle_t *)&f->keep, NULL);
	uv_run(&f->loop, UV_RUN_DEFAULT);
	assert_int_equal(uv_loop_close(&f->loop), 0);
	pthread_mutex_destroy(&log->mu);
	free(f);
}

static void test_engine_counters_without_an_engine(void **state)
{
	struct aps_engine_counters c;

	(void)state;
	aps_engine_counters(NULL, &c);
	assert_int_equal(c.threads, 1); /* the loop sums */
	assert_int_equal(c.tasks, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_engine_runs_a_lane_in_order_and_done_comes_on_the_loop),
		cmocka_unit_test(test_engine_quiesce_takes_queued_tasks_back_unrun),
		cmocka_unit_test(
		        test_engine_quiesce_waits_for_a_running_task_and_cancels_its_result),
		cmocka_unit_test(test_engine_wait_lets_the_tasks_run_and_their_done_come),
		cmocka_unit_test(test_engine_free_runs_what_is_queued_and_cancels_results),
		cmocka_unit_test(test_engine_counters_without_an_engine),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
