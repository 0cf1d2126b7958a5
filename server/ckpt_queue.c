/*
 * The checkpoint write queue: a FIFO of snapshots, one uv_work_t at a time on
 * libuv's thread pool. The worker thread only makes room (ckpt_room.c) and
 * calls aps_ckpt_write (no logging, no daemon state: the names of the jobs
 * apsd has are taken on the loop as the write starts, and those that start
 * meanwhile are noted under a lock its removals take); the result is
 * reported on the loop thread.
 */
#include "server/ckpt_queue.h"

#include "common/err.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct entry {
	struct entry *next;
	struct aps_ckpt *ck;
};

struct aps_ckpt_queue {
	uv_loop_t *loop;
	char dir[APS_CKPT_PATH_MAX];
	unsigned keep;
	uint64_t max_bytes;
	aps_ckpt_live_cb live;
	aps_ckpt_done_cb done;
	void *ctx;
	struct entry *head; /* waiting, oldest first */
	uv_work_t work;
	struct aps_ckpt *writing;  /* NULL: no write running */
	struct aps_ckpt_room room; /* the running write's */
	/* Jobs that started while the write runs (their files stay): the loop adds,
	 * the write's thread reads and removes files under the lock. */
	uv_mutex_t lock;
	char **started;
	size_t n_started, cap_started;
	bool started_lost; /* one could not be noted (no memory): no file goes */
	int ret;           /* of the running write */
	char why[256];
	uint64_t started_ns;
};

int aps_ckpt_queue_new(struct aps_ckpt_queue **out, uv_loop_t *loop, const char *dir, unsigned keep,
                       uint64_t max_bytes, aps_ckpt_live_cb live, aps_ckpt_done_cb done, void *ctx)
{
	struct aps_ckpt_queue *q = calloc(1, sizeof(*q));

	if (q == NULL || uv_mutex_init(&q->lock) < 0) {
		free(q);
		return APS_ENOMEM;
	}
	q->loop = loop;
	snprintf(q->dir, sizeof(q->dir), "%s", dir);
	q->keep = keep;
	q->max_bytes = max_bytes;
	q->live = live;
	q->done = done;
	q->ctx = ctx;
	q->work.data = q;
	*out = q;
	return 0;
}

static void free_ckpt(struct aps_ckpt *ck)
{
	aps_ckpt_free(ck);
	free(ck);
}

static void on_write(uv_work_t *w)
{
	struct aps_ckpt_queue *q = w->data;

	q->why[0] = '\0';
	q->ret = aps_ckpt_room_make(&q->room, q->why, sizeof(q->why));
	if (q->ret == 0)
		q->ret = aps_ckpt_write(q->dir, q->writing, q->keep, q->why, sizeof(q->why));
}

static void start_next(struct aps_ckpt_queue *q);

/* The room's remover, on the write's thread: a file of a job that started since
 * the write began stays; the check and the unlink under one lock. */
static int remove_file(void *ctx, const char *job, const char *path)
{
	struct aps_ckpt_queue *q = ctx;
	int ret;

	uv_mutex_lock(&q->lock);
	ret = q->started_lost ? APS_EBUSY : 0;
	for (size_t i = 0; i < q->n_started && ret == 0; i++)
		ret = strcmp(q->started[i], job) == 0 ? APS_EBUSY : 0;
	if (ret == 0 && unlink(path) < 0 && errno != ENOENT)
		ret = APS_ESYS;
	uv_mutex_unlock(&q->lock);
	return ret;
}

void aps_ckpt_queue_job_starts(struct aps_ckpt_queue *q, const char *job)
{
	if (q == NULL || q->writing == NULL)
		return;
	uv_mutex_lock(&q->lock);
	if (q->n_started == q->cap_started) {
		size_t cap = q->cap_started ? 2 * q->cap_started : 8;
		char **grown = realloc(q->started, cap * sizeof(*grown));
		if (grown != NULL) {
			q->started = grown;
			q->cap_started = cap;
		}
	}
	if (q->n_started < q->cap_started && (q->started[q->n_started] = strdup(job)) != NULL)
		q->n_started++;
	else
		q->started_lost = true;
	uv_mutex_unlock(&q->lock);
}

static void end_write(struct aps_ckpt_queue *q)
{
	uv_mutex_lock(&q->lock);
	for (size_t i = 0; i < q->n_started; i++)
		free(q->started[i]);
	q->n_started = 0;
	q->started_lost = false;
	uv_mutex_unlock(&q->lock);
	for (size_t i = 0; i < q->room.n_live; i++)
		free(q->room.live[i]);
	free(q->room.live);
	free_ckpt(q->writing);
	q->writing = NULL;
}

static void on_written(uv_work_t *w, int status)
{
	struct aps_ckpt_queue *q = w->data;
	double seconds = (double)(uv_hrtime() - q->started_ns) / 1e9;

	if (status < 0 && q->ret == 0) {
		q->ret = APS_ESYS;
		snprintf(q->why, sizeof(q->why), "write cancelled");
	}
	q->done(q->ctx, q->writing, q->ret, q->why, &q->room, seconds);
	end_write(q);
	start_next(q);
}

static void start_next(struct aps_ckpt_queue *q)
{
	struct entry *e = q->head;

	if (q->writing != NULL || e == NULL)
		return;
	q->head = e->next;
	q->writing = e->ck;
	free(e);
	q->started_ns = uv_hrtime();
	q->room = (struct aps_ckpt_room){ .dir = q->dir,
		                          .max_bytes = q->max_bytes,
		                          .ck = q->writing,
		                          .remove = remove_file,
		                          .remove_ctx = q };
	q->room.keep_all = q->live(q->ctx, &q->room.live, &q->room.n_live) < 0;
	if (uv_queue_work(q->loop, &q->work, on_write, on_written) < 0) {
		q->done(q->ctx, q->writing, APS_ESYS, "cannot queue the write", &q->room, 0);
		end_write(q);
	}
}

void aps_ckpt_queue_push(struct aps_ckpt_queue *q, struct aps_ckpt *ck)
{
	struct entry **link = &q->head, *e;

	for (; *link != NULL; link = &(*link)->next) {
		if (strcmp((*link)->ck->job, ck->job) == 0) {
			free_ckpt((*link)->ck); /* a newer snapshot of the same job */
			(*link)->ck = ck;
			start_next(q);
			return;
		}
	}
	e = calloc(1, sizeof(*e));
	if (e == NULL) {
		q->done(q->ctx, ck, APS_ENOMEM, "out of memory", NULL, 0);
		free_ckpt(ck);
		return;
	}
	e->ck = ck;
	*link = e;
	start_next(q);
}

bool aps_ckpt_queue_idle(const struct aps_ckpt_queue *q)
{
	return q->writing == NULL && q->head == NULL;
}

void aps_ckpt_queue_free(struct aps_ckpt_queue *q)
{
	if (q == NULL || !aps_ckpt_queue_idle(q))
		return;
	free(q->started);
	uv_mutex_destroy(&q->lock);
	free(q);
}
