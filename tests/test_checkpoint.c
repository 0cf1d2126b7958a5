/*
 * Checkpoint files: a round trip of every field, the file name and its
 * escaping, the atomic write leaving no temporary file, pruning to the newest
 * files, and loading the newest intact file while skipping truncated,
 * corrupted, foreign and half-written ones.
 */
#include "server/checkpoint.h"

#include "common/err.h"
#include "common/log.h"

#include <dirent.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/aps-test-ckpt-XXXXXX");
	aps_log_set_level(APS_LOG_ERROR); /* skipped files are logged as warnings */
	return mkdtemp(dir) == NULL ? -1 : 0;
}

static int teardown(void **state)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[600];

	(void)state;
	while (d != NULL && (e = readdir(d)) != NULL) {
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		if (e->d_name[0] != '.')
			unlink(path);
	}
	if (d != NULL)
		closedir(d);
	return rmdir(dir);
}

/* A checkpoint of job at step: tensor "w" (3 arrays of 5) and "b" (1 array of 1). */
static void make(struct aps_ckpt *ck, const char *job, uint64_t step)
{
	memset(ck, 0, sizeof(*ck));
	snprintf(ck->job, sizeof(ck->job), "%s", job);
	snprintf(ck->optimizer, sizeof(ck->optimizer), "adam,beta1=0.9");
	ck->step = step;
	ck->n_tensors = 2;
	ck->tensors = calloc(2, sizeof(*ck->tensors));
	assert_non_null(ck->tensors);
	snprintf(ck->tensors[0].name, sizeof(ck->tensors[0].name), "layer.0.weight");
	ck->tensors[0].count = 5;
	ck->tensors[0].n_arrays = 3;
	ck->tensors[0].updates = step;
	ck->tensors[0].state_t = step - 1;
	snprintf(ck->tensors[1].name, sizeof(ck->tensors[1].name), "b");
	ck->tensors[1].count = 1;
	ck->tensors[1].n_arrays = 1;
	ck->tensors[1].updates = step;
	for (int t = 0; t < 2; t++) {
		for (uint32_t a = 0; a < ck->tensors[t].n_arrays; a++) {
			ck->tensors[t].arrays[a] = malloc(ck->tensors[t].count * sizeof(float));
			for (uint64_t i = 0; i < ck->tensors[t].count; i++)
				ck->tensors[t].arrays[a][i] =
				        (float)step + 0.25f * (float)(a * 7 + i);
		}
	}
}

static void write_ok(const char *job, uint64_t step, unsigned keep)
{
	struct aps_ckpt ck;
	char why[256] = "";

	make(&ck, job, step);
	if (aps_ckpt_write(dir, &ck, keep, why, sizeof(why)) != 0)
		fail_msg("write: %s", why);
	aps_ckpt_free(&ck);
}

static void assert_same(const struct aps_ckpt *a, const struct aps_ckpt *b)
{
	assert_string_equal(a->job, b->job);
	assert_string_equal(a->optimizer, b->optimizer);
	assert_int_equal(a->step, b->step);
	assert_int_equal(a->n_tensors, b->n_tensors);
	for (uint32_t t = 0; t < a->n_tensors; t++) {
		const struct aps_ckpt_tensor *x = &a->tensors[t], *y = &b->tensors[t];
		assert_string_equal(x->name, y->name);
		assert_int_equal(x->count, y->count);
		assert_int_equal(x->updates, y->updates);
		assert_int_equal(x->state_t, y->state_t);
		assert_int_equal(x->n_arrays, y->n_arrays);
		for (uint32_t i = 0; i < x->n_arrays; i++)
			assert_memory_equal(x->arrays[i], y->arrays[i], x->count * sizeof(float));
	}
}

static char path_buf[APS_CKPT_PATH_MAX];

static const char *path_of(const char *job, uint64_t step)
{
	assert_int_equal(aps_ckpt_path(dir, job, step, path_buf, sizeof(path_buf)), 0);
	return path_buf;
}

static char refusal[512];

/* aps_ckpt_load_newest for a job whose token is token, with no memory bound. */
static int load(const char *d, const char *job, const char *token, struct aps_ckpt *ck, char *path)
{
	struct aps_ckpt_want want = { .token = token };

	refusal[0] = '\0';
	return aps_ckpt_load_newest(d, job, &want, ck, path, APS_CKPT_PATH_MAX, refusal,
	                            sizeof(refusal));
}

static void test_checkpoint_round_trip(void **state)
{
	struct aps_ckpt ck, back;
	char why[256] = "", expect[600];

	(void)state;
	make(&ck, "res/net 1", 7);
	assert_int_equal(aps_ckpt_write(dir, &ck, 2, why, sizeof(why)), 0);
	snprintf(expect, sizeof(expect), "%s/res%%2Fnet%%201.00000000000000000007.ckpt", dir);
	assert_string_equal(path_of("res/net 1", 7), expect);
	assert_int_equal(access(expect, R_OK), 0);
	strcat(expect, ".tmp");
	assert_int_not_equal(access(expect, F_OK), 0); /* renamed, nothing left over */
	assert_int_equal(aps_ckpt_read(path_of("res/net 1", 7), &back, why, sizeof(why)), 0);
	assert_same(&ck, &back);
	aps_ckpt_free(&back);
	aps_ckpt_free(&ck);
	aps_ckpt_free(NULL);
}

/* A read says how far it is as it goes (ckpt_load.c hands it to the job's ranks):
 * every byte of the file once it is in. */
static void test_checkpoint_read_says_how_far_it_is(void **state)
{
	_Atomic uint64_t read = 12345;
	struct aps_ckpt_want want = { .token = "", .progress = &read };
	struct aps_ckpt ck, back;
	char why[256] = "", path[APS_CKPT_PATH_MAX];
	struct stat st;

	(void)state;
	make(&ck, "far", 3);
	assert_int_equal(aps_ckpt_write(dir, &ck, 1, why, sizeof(why)), 0);
	assert_int_equal(stat(path_of("far", 3), &st), 0);
	assert_int_equal(aps_ckpt_load_newest(dir, "far", &want, &back, path, sizeof(path), why,
	                                      sizeof(why)),
	                 1);
	assert_int_equal(atomic_load(&read), (uint64_t)st.st_size);
	aps_ckpt_free(&back);
	aps_ckpt_free(&ck);
}

static void test_checkpoint_keeps_newest(void **state)
{
	struct aps_ckpt ck;
	char path[APS_CKPT_PATH_MAX];

	(void)state;
	for (uint64_t step = 5; step <= 25; step += 5)
		write_ok("job", step, 2);
	write_ok("other", 3, 2);
	for (uint64_t step = 5; step <= 25; step += 5)
		assert_int_equal(access(path_of("job", step), F_OK) == 0, step >= 20);
	assert_int_equal(access(path_of("other", 3), F_OK), 0);
	assert_int_equal(load(dir, "job", "", &ck, path), 1);
	assert_int_equal(ck.step, 25);
	assert_string_equal(path, path_of("job", 25));
	aps_ckpt_free(&ck);
	assert_int_equal(load(dir, "nobody", "", &ck, path), 0);
	assert_int_equal(load("/nonexistent/dir", "job", "", &ck, path), 0);
}

/*
 * A job with a token writes its owner, a salted digest of the token (never the
 * token): only a job with that token resumes the file. The others are refused
 * from the header, before the file is read, as is a file larger than what
 * fits. A job without a token writes none, and anyone resumes it.
 */
static void test_checkpoint_only_its_owner_resumes_it(void **state)
{
	struct aps_ckpt ck, back;
	struct aps_ckpt_want small = { .token = "s3cret", .max_bytes = 64 };
	char why[256] = "", path[APS_CKPT_PATH_MAX], bytes[4096];
	ssize_t n;
	int fd;

	(void)state;
	make(&ck, "owned", 4);
	assert_int_equal(aps_ckpt_owner_of("s3cret", &ck.owner), 0);
	assert_true(ck.owner.set);
	assert_true(aps_ckpt_owner_admits(&ck.owner, "s3cret"));
	assert_false(aps_ckpt_owner_admits(&ck.owner, "s3cret2"));
	assert_false(aps_ckpt_owner_admits(&ck.owner, ""));
	assert_int_equal(aps_ckpt_write(dir, &ck, 2, why, sizeof(why)), 0);
	fd = open(path_of("owned", 4), O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, bytes, sizeof(bytes));
	close(fd);
	assert_true(n > 0 && memmem(bytes, (size_t)n, "s3cret", 6) == NULL);

	assert_int_equal(load(dir, "owned", "", &back, path), APS_EACCES);
	assert_non_null(strstr(refusal, "another job token"));
	assert_int_equal(load(dir, "owned", "guess", &back, path), APS_EACCES);
	assert_int_equal(aps_ckpt_load_newest(dir, "owned", &small, &back, path, sizeof(path),
	                                      refusal, sizeof(refusal)),
	                 APS_ERANGE);
	assert_non_null(strstr(refusal, "max_total_bytes"));
	assert_int_equal(load(dir, "owned", "s3cret", &back, path), 1);
	assert_same(&ck, &back);
	assert_true(back.owner.set);
	aps_ckpt_free(&back);
	aps_ckpt_free(&ck);

	make(&ck, "open", 2); /* no token: no owner */
	assert_int_equal(aps_ckpt_owner_of("", &ck.owner), 0);
	assert_false(ck.owner.set);
	assert_int_equal(aps_ckpt_write(dir, &ck, 2, why, sizeof(why)), 0);
	assert_int_equal(load(dir, "open", "any", &back, path), 1);
	aps_ckpt_free(&back);
	aps_ckpt_free(&ck);
}

static void truncate_file(const char *path, off_t len)
{
	assert_int_equal(truncate(path, len), 0);
}

static void flip_byte(const char *path, off_t at)
{
	int fd = open(path, O_RDWR);
	unsigned char b;

	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, at), 1);
	b ^= 0x10;
	assert_int_equal(pwrite(fd, &b, 1, at), 1);
	close(fd);
}

static void expect_newest(uint64_t step)
{
	struct aps_ckpt ck;
	char path[APS_CKPT_PATH_MAX];

	assert_int_equal(load(dir, "job", "", &ck, path), 1);
	assert_int_equal(ck.step, step);
	aps_ckpt_free(&ck);
}

/* Every cut of a file is refused: the loader goes back to the previous one. */
static void test_checkpoint_skips_torn_and_corrupt(void **state)
{
	struct aps_ckpt ck;
	char why[256], tmp[APS_CKPT_PATH_MAX + 8];
	struct stat st;
	int fd;

	(void)state;
	write_ok("job", 10, 10);
	write_ok("job", 20, 10);
	expect_newest(20);
	assert_int_equal(stat(path_of("job", 20), &st), 0);
	for (off_t cut = 0; cut < st.st_size; cut += 7) {
		write_ok("job", 20, 10);
		truncate_file(path_of("job", 20), cut);
		assert_int_not_equal(aps_ckpt_read(path_of("job", 20), &ck, why, sizeof(why)), 0);
		expect_newest(10);
	}
	for (off_t at = 0; at < st.st_size; at += 5) {
		write_ok("job", 20, 10);
		flip_byte(path_of("job", 20), at);
		assert_int_equal(aps_ckpt_read(path_of("job", 20), &ck, why, sizeof(why)),
		                 APS_EPROTO);
		expect_newest(10);
	}
	/* A longer file (garbage appended) is refused too. */
	write_ok("job", 20, 10);
	fd = open(path_of("job", 20), O_WRONLY | O_APPEND);
	assert_int_equal(write(fd, "x", 1), 1);
	close(fd);
	expect_newest(10);
	/* A temporary file of a write that never finished is not a checkpoint. */
	snprintf(tmp, sizeof(tmp), "%s.tmp", path_of("job", 30));
	fd = open(tmp, O_WRONLY | O_CREAT, 0600);
	assert_int_equal(write(fd, "APSCKPT1", 8), 8);
	close(fd);
	expect_newest(10);
	/* The next write of the job removes what the torn one left. */
	write_ok("job", 50, 10);
	assert_int_not_equal(access(tmp, F_OK), 0);
	assert_int_equal(truncate(path_of("job", 50), 0), 0);
	/* Another job's file under this job's name is skipped. */
	write_ok("job2", 40, 10);
	assert_int_equal(rename(path_of("job2", 40), path_of("job", 40)), 0);
	expect_newest(10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_checkpoint_round_trip, setup, teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_read_says_how_far_it_is, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_keeps_newest, setup, teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_only_its_owner_resumes_it, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_skips_torn_and_corrupt, setup,
		                                teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
