/*
 * Checkpoint reads off the event loop (ckpt_load.h): one uv_work_t each, at
 * most AT_ONCE on libuv's pool, the others waiting in order. The worker thread
 * only calls aps_ckpt_load_newest.
 */
#include "server/ckpt_load.h"

#include "common/err.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Reads on the pool at once: the pool's other threads stay for snapshot copies
 * and writes, whose jobs wait for them (a stranger's reads, one per HELLO,
 * held all 4 and another job's step waited 8.8 s). */
#define AT_ONCE 2

struct aps_ckpt_loader {
	uv_loop_t *loop;
	struct aps_ckpt_load *waiting, **tail;  /* in the order they came */
	struct aps_ckpt_load *on_pool[AT_ONCE]; /* NULL: a free place */
	unsigned running;
	uint64_t read_done; /* bytes read by the reads that ended */
};

struct aps_ckpt_load {
	struct aps_ckpt_load *next;
	struct aps_ckpt_loader *q;
	uv_work_t work;
	char dir[APS_CKPT_PATH_MAX];
	char job[APS_MSG_JOB_MAX + 1];
	char token[APS_MSG_TOKEN_MAX + 1];
	struct aps_ckpt_want want;
	uint64_t bytes;
	_Atomic uint64_t read; /* of the file, by the pool's thread (want.progress) */
	aps_ckpt_loaded_cb done;
	void *ctx;
	int ret;
	struct aps_ckpt ck;
	char path[APS_CKPT_PATH_MAX];
	char why[256];
};

static void on_read(uv_work_t *w)
{
	struct aps_ckpt_load *l = w->data;

	l->ret = aps_ckpt_load_newest(l->dir, l->job, &l->want, &l->ck, l->path, sizeof(l->path),
	                              l->why, sizeof(l->why));
}

static void start_next(struct aps_ckpt_loader *q);

static void on_done(uv_work_t *w, int status)
{
	struct aps_ckpt_load *l = w->data;
	struct aps_ckpt_loader *q = l->q;

	if (status < 0 && l->ret == 0) {
		l->ret = APS_ESYS;
		snprintf(l->why, sizeof(l->why), "read cancelled");
	}
	q->running--;
	q->read_done += atomic_load_explicit(&l->read, memory_order_relaxed);
	for (unsigned i = 0; i < AT_ONCE; i++)
		q->on_pool[i] = q->on_pool[i] == l ? NULL : q->on_pool[i];
	l->done(l->ctx, l, l->job, l->bytes, l->ret, &l->ck, l->path, l->why);
	aps_ckpt_free(&l->ck);
	free(l);
	start_next(q);
}

static void start_next(struct aps_ckpt_loader *q)
{
	while (q->running < AT_ONCE && q->waiting != NULL) {
		struct aps_ckpt_load *l = q->waiting;
		q->waiting = l->next;
		if (q->waiting == NULL)
			q->tail = &q->waiting;
		q->running++;
		for (unsigned i = 0; i < AT_ONCE; i++) {
			if (q->on_pool[i] == NULL) {
				q->on_pool[i] = l;
				break;
			}
		}
		if (uv_queue_work(q->loop, &l->work, on_read, on_done) < 0) {
			q->running--;
			for (unsigned i = 0; i < AT_ONCE; i++)
				q->on_pool[i] = q->on_pool[i] == l ? NULL : q->on_pool[i];
			l->ret = APS_ESYS;
			snprintf(l->why, sizeof(l->why), "cannot queue the read");
			l->done(l->ctx, l, l->job, l->bytes, l->ret, &l->ck, l->path, l->why);
			free(l);
		}
	}
}

int aps_ckpt_loader_new(struct aps_ckpt_loader **out, uv_loop_t *loop)
{
	struct aps_ckpt_loader *q = calloc(1, sizeof(*q));

	if (q == NULL)
		return APS_ENOMEM;
	q->loop = loop;
	q->tail = &q->waiting;
	*out = q;
	return 0;
}

void aps_ckpt_loader_free(struct aps_ckpt_loader *q)
{
	if (q != NULL && q->running == 0 && q->waiting == NULL)
		free(q);
}

int aps_ckpt_load_start(struct aps_ckpt_loader *q, const char *dir, const char *job,
                        const struct aps_ckpt_want *want, uint64_t bytes, aps_ckpt_loaded_cb done,
                        void *ctx, const struct aps_ckpt_load **out)
{
	struct aps_ckpt_load *l = calloc(1, sizeof(*l));

	if (l == NULL)
		return APS_ENOMEM;
	snprintf(l->dir, sizeof(l->dir), "%s", dir);
	snprintf(l->job, sizeof(l->job), "%s", job);
	snprintf(l->token, sizeof(l->token), "%s", want->token);
	l->want = (struct aps_ckpt_want){ .token = l->token,
		                          .max_bytes = want->max_bytes,
		                          .progress = &l->read };
	l->bytes = bytes;
	l->done = done;
	l->ctx = ctx;
	l->q = q;
	l->work.data = l;
	*q->tail = l;
	q->tail = &l->next;
	*out = l;
	start_next(q);
	return 0;
}

void aps_ckpt_load_progress(const struct aps_ckpt_load *l, uint64_t *read, uint64_t *bytes)
{
	uint64_t got =
	        atomic_load_explicit(&((struct aps_ckpt_load *)l)->read, memory_order_relaxed);

	*bytes = l->bytes;
	*read = got < l->bytes ? got : l->bytes;
}

uint64_t aps_ckpt_loader_read(const struct aps_ckpt_loader *q)
{
	uint64_t n = q->read_done;

	for (unsigned i = 0; i < AT_ONCE; i++) {
		if (q->on_pool[i] != NULL)
			n += atomic_load_explicit(&q->on_pool[i]->read, memory_order_relaxed);
	}
	return n;
}
