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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tensors_are_found_by_name_and_keep_their_ids),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
