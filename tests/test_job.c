/*
 * Unit tests of a job's tensor table (server/job.h): tensors keep their ids in
 * the order they were registered, and are found by name, whatever the order of
 * the names, among many that share a long prefix.
 */
#include "server/job.h"

#include "common/err.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define N 5000

static void name_of(char *out, size_t len, unsigned i)
{
	/* a long shared prefix: what an attacker sent to make each look-up slow */
	snprintf(out, len, "%.200s%010u",
	         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"
	         "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
	         (i * 2654435761u) % 1000000007u);
}

static void test_tensors_are_found_by_name_and_keep_their_ids(void **state)
{
	struct aps_jobs jobs = { 0 };
	struct aps_job *job;
	struct aps_tensor *t;
	char name[256];

	(void)state;
	assert_int_equal(aps_jobs_create(&jobs, "j", 1, &job), 0);
	job->chunk_elems = 8;
	for (unsigned i = 0; i < N; i++) {
		name_of(name, sizeof(name), i);
		assert_null(aps_job_tensor_by_name(job, name));
		assert_int_equal(aps_job_add_tensor(job, name, 1, N, &t), 0);
		assert_int_equal(t->id, i);
	}
	for (unsigned i = 0; i < N; i++) {
		name_of(name, sizeof(name), i);
		t = aps_job_tensor_by_name(job, name);
		assert_non_null(t);
		assert_int_equal(t->id, i);
		assert_ptr_equal(aps_job_tensor(job, i), t);
	}
	assert_null(aps_job_tensor_by_name(job, ""));
	assert_null(aps_job_tensor_by_name(job, "zzz"));
	name_of(name, sizeof(name), N);
	assert_null(aps_job_tensor_by_name(job, name));
	/* the limit still holds */
	assert_int_equal(aps_job_add_tensor(job, name, 1, N, &t), APS_ERANGE);
	aps_jobs_free_all(&jobs);
}

static struct aps_peer peer_of(uint32_t i)
{
	struct aps_peer p = { .len = 5 };

	memcpy(p.id + 1, &i, sizeof(i));
	return p;
}

/*
 * Sessions are found by routing id, and by the one they moved from, through
 * every growth of the index; a dropped one is gone from both, the others stay.
 */
static void test_sessions_are_found_by_peer_and_by_where_they_moved_from(void **state)
{
	static struct aps_session *made[N]; /* N sessions, as N tensors above */
	struct aps_jobs t = { 0 };
	struct aps_job *job;

	(void)state;
	assert_int_equal(aps_jobs_create(&t, "j", 1, &job), 0);
	for (uint32_t i = 0; i < N; i++) {
		struct aps_peer p = peer_of(i);
		made[i] = aps_jobs_session(&t, &p);
		assert_non_null(made[i]);
		assert_ptr_equal(aps_jobs_session(&t, &p), made[i]); /* found, not made again */
	}
	for (uint32_t i = 0; i < N; i += 2) /* every other one moves to peer N + i */
	{
		struct aps_peer to = peer_of(N + i);
		made[i]->job = job;
		aps_jobs_move_session(&t, made[i], &to);
	}
	for (uint32_t i = 0; i < N; i++) {
		struct aps_peer p = peer_of(i), to = peer_of(N + i);
		if (i % 2 == 0) {
			assert_null(aps_jobs_find_session(&t, &p));
			assert_ptr_equal(aps_jobs_find_session(&t, &to), made[i]);
			assert_ptr_equal(aps_jobs_find_moved(&t, &p), made[i]);
		} else {
			assert_ptr_equal(aps_jobs_find_session(&t, &p), made[i]);
			assert_null(aps_jobs_find_moved(&t, &p));
		}
	}
	for (uint32_t i = 0; i < N; i += 4) {
		made[i]->job = NULL;
		aps_jobs_drop_session(&t, made[i]);
	}
	for (uint32_t i = 0; i < N; i += 2) {
		struct aps_peer p = peer_of(i), to = peer_of(N + i);
		bool gone = i % 4 == 0;
		assert_true((aps_jobs_find_session(&t, &to) == NULL) == gone);
		assert_true((aps_jobs_find_moved(&t, &p) == NULL) == gone);
	}
	assert_int_equal(t.index[APS_SESSION_BY_PEER].n, N - (N + 3) / 4);
	aps_jobs_free_all(&t);
	assert_null(t.sessions);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensors_are_found_by_name_and_keep_their_ids),
		cmocka_unit_test(test_sessions_are_found_by_peer_and_by_where_they_moved_from),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
