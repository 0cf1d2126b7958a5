/*
 * Checkpoint files: a round trip of every field, the file name and its
 * escaping, the atomic write leaving no temporary file, pruning to the newest
 * files, loading the newest intact file while skipping truncated,
 * corrupted, foreign and half-written ones, and room made within
 * checkpoint_max_bytes from the files of ended jobs, the largest writer first.
 */
#include "server/checkpoint.h"
#include "server/ckpt_queue.h"
#include "server/ckpt_room.h"

#include "common/crc32c.h"
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
#include <time.h>
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

/* A file of job at step by writer, its time set to age seconds ago; its bytes. */
static uint64_t write_by(const char *job, uint64_t step, const char *writer, int age)
{
	struct timespec t[2];
	struct aps_ckpt ck;
	char why[256] = "";
	uint64_t bytes;

	make(&ck, job, step);
	snprintf(ck.writer, sizeof(ck.writer), "%s", writer);
	if (aps_ckpt_write(dir, &ck, 8, why, sizeof(why)) != 0)
		fail_msg("write: %s", why);
	bytes = aps_ckpt_size(&ck);
	aps_ckpt_free(&ck);
	clock_gettime(CLOCK_REALTIME, &t[0]);
	t[0].tv_sec -= age;
	t[1] = t[0];
	assert_int_equal(utimensat(AT_FDCWD, path_of(job, step), t, 0), 0);
	return bytes;
}

static bool exists(const char *job, uint64_t step)
{
	return access(path_of(job, step), F_OK) == 0;
}

static void test_checkpoint_says_its_writer(void **state)
{
	struct aps_ckpt head;
	char why[256];
	uint64_t len, bytes;

	(void)state;
	bytes = write_by("w", 3, "key rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7", 0);
	assert_int_equal(aps_ckpt_read_head(path_of("w", 3), &head, &len, why, sizeof(why)), 0);
	assert_string_equal(head.writer, "key rq:rM>}U?@Lns47E1%kR.o@n%FcmmsL/@{H8]yf7");
	assert_string_equal(head.job, "w");
	assert_int_equal(head.step, 3);
	assert_int_equal(len, bytes);
	{
		struct aps_ckpt back;
		char path[APS_CKPT_PATH_MAX];
		assert_int_equal(load(dir, "w", "", &back, path), 1); /* and the whole file reads */
		assert_string_equal(back.writer, head.writer);
		aps_ckpt_free(&back);
	}
}

/* A file as apsd wrote it before APSCKPT3 (no writer) still reads, as a writer's "". */
static void test_checkpoint_of_before_writers_reads(void **state)
{
	struct aps_ckpt ck, back;
	char why[256] = "", path[APS_CKPT_PATH_MAX];
	uint8_t buf[4096];
	uint64_t len;
	uint32_t crc;
	size_t at;
	ssize_t n;
	int fd;

	(void)state;
	make(&ck, "old", 5); /* writer "": its string is 4 bytes of length 0 */
	assert_int_equal(aps_ckpt_write(dir, &ck, 2, why, sizeof(why)), 0);
	fd = open(path_of("old", 5), O_RDWR);
	n = read(fd, buf, sizeof(buf));
	assert_true(n > 64 && (size_t)n < sizeof(buf));
	/* magic, length, step, job, optimizer, owner: then the writer */
	at = 8 + 8 + 8 + 4 + strlen(ck.job) + 4 + strlen(ck.optimizer) + 1 + 16 + 32;
	memmove(buf + at, buf + at + 4, (size_t)n - at - 4);
	n -= 4;
	buf[7] = '2';
	len = (uint64_t)n;
	memcpy(buf + 8, &len, 8);
	crc = aps_crc32c(0, buf, at);
	memcpy(buf + at, &crc, 4);
	crc = aps_crc32c(0, buf, (size_t)n - 4);
	memcpy(buf + n - 4, &crc, 4);
	assert_int_equal(ftruncate(fd, 0), 0);
	assert_int_equal(pwrite(fd, buf, (size_t)n, 0), n);
	close(fd);
	assert_int_equal(load(dir, "old", "", &back, path), 1);
	assert_same(&ck, &back);
	assert_string_equal(back.writer, "");
	aps_ckpt_free(&back);
	aps_ckpt_free(&ck);
}

/*
 * A stranger (10.0.0.66) filled the bound with jobs after jobs; an honest
 * writer (10.0.0.1) has one ended job's file and a job that runs. Room for
 * the honest job's new file comes from the stranger's files, oldest first:
 * not from the honest ended job's, the running job's, or the job's own.
 */
static void test_checkpoint_room_comes_from_the_largest_writer(void **state)
{
	char why[512] = "", *live[] = { "running" };
	struct aps_ckpt next;
	struct aps_ckpt_room room = { .dir = dir, .live = live, .n_live = 1, .ck = &next };
	uint64_t s = 0, h0, run, own, need;

	(void)state;
	for (int i = 0; i < 6; i++) {
		char job[8];
		snprintf(job, sizeof(job), "s%d", i);
		s = write_by(job, 1, "10.0.0.66", 100 - 10 * i); /* s0 the oldest */
	}
	h0 = write_by("h0", 1, "10.0.0.1", 500); /* older than every stranger's file */
	run = write_by("running", 7, "10.0.0.66", 600);
	own = write_by("honest", 1, "10.0.0.1", 400); /* the job's own fallback */
	make(&next, "honest", 2);
	snprintf(next.writer, sizeof(next.writer), "10.0.0.1");
	need = aps_ckpt_size(&next);

	/* Room that two of the stranger's files make: its two oldest go. */
	room.max_bytes = 4 * s + h0 + run + own + need + s / 2;
	assert_int_equal(aps_ckpt_room_make(&room, why, sizeof(why)), 0);
	assert_int_equal(room.n_evicted, 2);
	assert_int_equal(room.evicted_bytes, 2 * s);
	assert_string_equal(room.shown[0].job, "s0");
	assert_string_equal(room.shown[0].writer, "10.0.0.66");
	assert_int_equal(room.shown[0].bytes, s);
	assert_string_equal(room.shown[1].job, "s1");
	assert_false(exists("s0", 1) || exists("s1", 1));
	assert_true(exists("s2", 1) && exists("h0", 1) && exists("running", 7) &&
	            exists("honest", 1));

	/* Down to the last of the stranger's files, then that one, and the
	 * honest ended job's file is still there: it holds the fewest bytes. */
	room.max_bytes = s + h0 + run + own + need;
	assert_int_equal(aps_ckpt_room_make(&room, why, sizeof(why)), 0);
	assert_int_equal(room.n_evicted, 3);
	assert_true(exists("s5", 1) && exists("h0", 1));
	room.max_bytes = h0 + run + own + need;
	assert_int_equal(aps_ckpt_room_make(&room, why, sizeof(why)), 0);
	assert_int_equal(room.n_evicted, 1);
	assert_string_equal(room.shown[0].job, "s5");
	assert_true(exists("h0", 1));

	/* What runs and the job's own fallback leave no room even without h0:
	 * nothing goes, h0 included. */
	room.max_bytes = run + own + need / 2;
	assert_int_equal(aps_ckpt_room_make(&room, why, sizeof(why)), APS_ESYS);
	assert_int_equal(room.n_evicted, 0);
	assert_non_null(strstr(why, "checkpoint_max_bytes is"));
	assert_true(exists("h0", 1) && exists("running", 7) && exists("honest", 1));
	aps_ckpt_free(&next);
}

/* A file of bytes zeros at path. */
static void zeros_at(const char *path, uint64_t bytes)
{
	int fd = open(path, O_WRONLY | O_CREAT, 0600);

	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
	close(fd);
}

/* Files no job could resume go first: a header that does not read, a temporary
 * file a killed daemon left. Without the names of the jobs that run, none goes. */
static void test_checkpoint_room_takes_unreadable_files_first(void **state)
{
	char why[512] = "", tmp[APS_CKPT_PATH_MAX + 8];
	struct aps_ckpt next;
	uint64_t one = write_by("big", 1, "10.0.0.66", 50);
	struct aps_ckpt_room room = { .dir = dir, .ck = &next, .keep_all = true };

	(void)state;
	write_by("torn", 1, "10.0.0.1", 10);
	truncate_file(path_of("torn", 1), 40);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path_of("left", 9));
	zeros_at(tmp, one);
	make(&next, "new", 1);

	room.max_bytes = 2 * one + one / 2; /* 1 + 1 + 40 bytes there, 1 more: one must go */
	assert_int_equal(aps_ckpt_room_make(&room, why, sizeof(why)), APS_ESYS);
	assert_int_equal(room.n_evicted, 0);
	assert_true(access(tmp, F_OK) == 0 && exists("torn", 1) && exists("big", 1));

	room.keep_all = false;
	assert_int_equal(aps_ckpt_room_make(&room, why, sizeof(why)), 0);
	assert_true(room.n_evicted >= 1 && room.n_evicted <= 2);
	assert_string_equal(room.shown[0].job, "");
	assert_true(exists("big", 1));
	assert_false(access(tmp, F_OK) == 0 && exists("torn", 1));
	aps_ckpt_free(&next);
}

/* A remover that cannot remove unreadable files (as if an operator made them
 * immutable), and removes the others. */
static int remove_but_junk(void *ctx, const char *job, const char *path)
{
	(void)ctx;
	(void)path;
	return strcmp(job, "") == 0 ? APS_ESYS : unlink(path);
}

/* A file that will not go (an operator's immutable file, a job started meanwhile)
 * is passed over; when what may still go would not make room, nothing more goes. */
static void test_checkpoint_room_removes_nothing_for_nothing(void **state)
{
	char why[512] = "", junk[APS_CKPT_PATH_MAX + 8];
	struct aps_ckpt next;
	uint64_t h = write_by("h", 1, "10.0.0.1", 50);
	struct aps_ckpt_room room = { .dir = dir, .ck = &next, .remove = remove_but_junk };

	(void)state;
	snprintf(junk, sizeof(junk), "%s/junk.ckpt", dir);
	zeros_at(junk, 3 * h); /* no header */
	make(&next, "n", 1);
	/* junk (3h) goes first but will not; h alone would not make room for n */
	room.max_bytes = 4 * h - h / 2;
	assert_int_equal(aps_ckpt_room_make(&room, why, sizeof(why)), APS_ESYS);
	assert_int_equal(room.n_evicted, 0);
	assert_true(exists("h", 1) && access(junk, F_OK) == 0);
	aps_ckpt_free(&next);
}

static struct aps_ckpt_queue *queue;
static int written_ret = 1;
static uint32_t written_evicted;

/* The jobs apsd has: none; "victim" starts as the write begins (after this list
 * was taken, before its room removes anything). */
static int none_but_victim_starts(void *ctx, char ***names, size_t *n)
{
	(void)ctx;
	*names = NULL;
	*n = 0;
	aps_ckpt_queue_job_starts(queue, "victim");
	return 0;
}

static void on_written(void *ctx, const struct aps_ckpt *ck, int ret, const char *why,
                       const struct aps_ckpt_room *room, double seconds)
{
	(void)ctx;
	(void)ck;
	(void)why;
	(void)seconds;
	written_ret = ret;
	written_evicted = room != NULL ? room->n_evicted : 0;
}

/* (found by helper-35) The jobs whose files stay were taken as the write began:
 * a job that started meanwhile had its files removed while it ran. Now a job
 * that starts during a write keeps them: the writer holding the most (victim's)
 * gives nothing, the other's file goes. */
static void test_checkpoint_room_leaves_a_job_that_starts_during_the_write(void **state)
{
	struct aps_ckpt *next = calloc(1, sizeof(*next));
	uint64_t u = write_by("victim", 1, "10.0.0.7", 300);
	uv_loop_t loop;

	(void)state;
	write_by("victim", 2, "10.0.0.7", 200);
	write_by("other", 1, "10.0.0.8", 100);
	make(next, "newer", 1);
	assert_int_equal(uv_loop_init(&loop), 0);
	assert_int_equal(aps_ckpt_queue_new(&queue, &loop, dir, 2, 3 * u + u / 2,
	                                    none_but_victim_starts, on_written, NULL),
	                 0);
	aps_ckpt_queue_push(queue, next);
	uv_run(&loop, UV_RUN_DEFAULT);
	assert_int_equal(written_ret, 0);
	assert_int_equal(written_evicted, 1);
	assert_true(exists("victim", 1) && exists("victim", 2) && exists("newer", 1));
	assert_false(exists("other", 1));
	aps_ckpt_queue_free(queue);
	assert_int_equal(uv_loop_close(&loop), 0);
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
		cmocka_unit_test_setup_teardown(test_checkpoint_says_its_writer, setup, teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_of_before_writers_reads, setup,
		                                teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_room_comes_from_the_largest_writer,
		                                setup, teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_room_takes_unreadable_files_first,
		                                setup, teardown),
		cmocka_unit_test_setup_teardown(test_checkpoint_room_removes_nothing_for_nothing,
		                                setup, teardown),
		cmocka_unit_test_setup_teardown(
		        test_checkpoint_room_leaves_a_job_that_starts_during_the_write, setup,
		        teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
