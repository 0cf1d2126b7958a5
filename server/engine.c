/*
 * Engine threads (engine.h). Each thread has its lane: a FIFO under its own
 * mutex, taken one task at a time (a task is a chunk's worth of work, about a
 * millisecond a MiB, so the lock is not what costs). Finished tasks go to one
 * completion list that a uv_async_t hands to the loop, one task at a time, so
 * that a done() that quiesces an owner cancels that owner's later completions.
 */
#include "server/engine.h"

#include "common/err.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct lane {
	struct aps_engine *e;
	pthread_t tid;
	bool started;
	pthread_mutex_t mu;
	pthread_cond_t work; /* a task was queued, or stop */
	pthread_cond_t idle; /* a task finished */
	struct aps_engine_task *head, *tail;
	uint32_t len, max_len;
	const void *running; /* owner of the task in run(), NULL: none */
	bool stop;
	uint64_t tasks, busy_ns, waits;
	struct aps_engine_scratch scratch;
};

struct aps_engine {
	uv_async_t *async; /* owned; freed by its close callback */
	unsigned n;
	struct lane *lanes;
	pthread_mutex_t done_mu;
	struct aps_engine_task *done_head, *done_tail; /* run, done() not yet called */
	bool closed;                                   /* no more uv_async_send */
};

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void append(struct aps_engine_task **head, struct aps_engine_task **tail,
                   struct aps_engine_task *t)
{
	t->next = NULL;
	if (*tail != NULL)
		(*tail)->next = t;
	else
		*head = t;
	*tail = t;
}

static struct aps_engine_task *pop(struct aps_engine_task **head, struct aps_engine_task **tail)
{
	struct aps_engine_task *t = *head;

	if (t != NULL) {
		*head = t->next;
		if (*head == NULL)
			*tail = NULL;
		t->next = NULL;
	}
	return t;
}

void *aps_engine_scratch(struct aps_engine_scratch *s, size_t bytes)
{
	if (s->cap < bytes) {
		free(s->buf);
		s->buf = malloc(bytes);
		s->cap = s->buf != NULL ? bytes : 0;
	}
	return s->buf;
}

static void completed(struct aps_engine *e, struct aps_engine_task *t)
{
	pthread_mutex_lock(&e->done_mu);
	append(&e->done_head, &e->done_tail, t);
	if (!e->closed)
		uv_async_send(e->async);
	pthread_mutex_unlock(&e->done_mu);
}

static void *lane_main(void *arg)
{
	struct lane *l = arg;

	pthread_mutex_lock(&l->mu);
	for (;;) {
		while (l->head == NULL && !l->stop)
			pthread_cond_wait(&l->work, &l->mu);
		struct aps_engine_task *t = pop(&l->head, &l->tail);
		if (t == NULL)
			break;
		l->len--;
		l->running = t->owner;
		pthread_mutex_unlock(&l->mu);
		uint64_t t0 = now_ns();
		t->run(t, &l->scratch);
		uint64_t spent = now_ns() - t0;
		/* Listed as complete before running is cleared: quiesce cancels it. */
		completed(l->e, t);
		pthread_mutex_lock(&l->mu);
		l->running = NULL;
		l->tasks++;
		l->busy_ns += spent;
		pthread_cond_broadcast(&l->idle);
	}
	pthread_mutex_unlock(&l->mu);
	return NULL;
}

/* Completions to the loop, one at a time (a done() may quiesce an owner). */
static void on_async(uv_async_t *h)
{
	struct aps_engine *e = h->data;

	for (;;) {
		pthread_mutex_lock(&e->done_mu);
		struct aps_engine_task *t = pop(&e->done_head, &e->done_tail);
		pthread_mutex_unlock(&e->done_mu);
		if (t == NULL)
			return;
		t->done(t, false);
	}
}

static void free_handle_cb(uv_handle_t *h)
{
	free(h);
}

int aps_engine_new(struct aps_engine **out, uv_loop_t *loop, unsigned threads)
{
	struct aps_engine *e = calloc(1, sizeof(*e));
	int ret = 0;

	*out = NULL;
	if (e == NULL)
		return APS_ENOMEM;
	e->n = threads > 0 ? threads : 1;
	e->lanes = calloc(e->n, sizeof(*e->lanes));
	e->async = malloc(sizeof(*e->async));
	if (e->lanes == NULL || e->async == NULL) {
		free(e->lanes);
		free(e->async);
		free(e);
		return APS_ENOMEM;
	}
	pthread_mutex_init(&e->done_mu, NULL);
	uv_async_init(loop, e->async, on_async);
	e->async->data = e;
	/* The loop ends when the daemon stops, whatever the engine holds. */
	uv_unref((uv_handle_t *)e->async);
	for (unsigned i = 0; i < e->n; i++) {
		struct lane *l = &e->lanes[i];
		l->e = e;
		pthread_mutex_init(&l->mu, NULL);
		pthread_cond_init(&l->work, NULL);
		pthread_cond_init(&l->idle, NULL);
		if (ret == 0 && pthread_create(&l->tid, NULL, lane_main, l) != 0)
			ret = APS_ESYS;
		l->started = ret == 0;
	}
	if (ret < 0) {
		aps_engine_close(e);
		aps_engine_free(e);
		return ret;
	}
	*out = e;
	return 0;
}

void aps_engine_close(struct aps_engine *e)
{
	if (e == NULL || e->closed)
		return;
	pthread_mutex_lock(&e->done_mu);
	e->closed = true;
	pthread_mutex_unlock(&e->done_mu);
	uv_close((uv_handle_t *)e->async, free_handle_cb);
}

static void cancel_where(struct aps_engine *e, const void *owner, bool any)
{
	struct aps_engine_task *keep_head = NULL, *keep_tail = NULL, *drop_head = NULL,
	                       *drop_tail = NULL, *t;

	pthread_mutex_lock(&e->done_mu);
	while ((t = pop(&e->done_head, &e->done_tail)) != NULL) {
		if (any || t->owner == owner)
			append(&drop_head, &drop_tail, t);
		else
			append(&keep_head, &keep_tail, t);
	}
	e->done_head = keep_head;
	e->done_tail = keep_tail;
	pthread_mutex_unlock(&e->done_mu);
	while ((t = pop(&drop_head, &drop_tail)) != NULL)
		t->done(t, true);
}

void aps_engine_free(struct aps_engine *e)
{
	if (e == NULL)
		return;
	for (unsigned i = 0; i < e->n; i++) {
		struct lane *l = &e->lanes[i];
		pthread_mutex_lock(&l->mu);
		l->stop = true;
		pthread_cond_signal(&l->work);
		pthread_mutex_unlock(&l->mu);
		if (l->started)
			pthread_join(l->tid, NULL);
		pthread_mutex_destroy(&l->mu);
		pthread_cond_destroy(&l->work);
		pthread_cond_destroy(&l->idle);
		free(l->scratch.buf);
	}
	cancel_where(e, NULL, true);
	pthread_mutex_destroy(&e->done_mu);
	free(e->lanes);
	free(e);
}

void aps_engine_submit(struct aps_engine *e, uint32_t lane, struct aps_engine_task *t)
{
	struct lane *l = &e->lanes[lane % e->n];

	pthread_mutex_lock(&l->mu);
	append(&l->head, &l->tail, t);
	if (++l->len > l->max_len)
		l->max_len = l->len;
	pthread_cond_signal(&l->work);
	pthread_mutex_unlock(&l->mu);
}

static bool queued(const struct lane *l, const void *owner)
{
	for (const struct aps_engine_task *t = l->head; t != NULL; t = t->next) {
		if (t->owner == owner)
			return true;
	}
	return false;
}

void aps_engine_wait(struct aps_engine *e, const void *owner)
{
	for (unsigned i = 0; i < e->n; i++) {
		struct lane *l = &e->lanes[i];
		pthread_mutex_lock(&l->mu);
		if (l->running == owner || queued(l, owner))
			l->waits++;
		while (l->running == owner || queued(l, owner))
			pthread_cond_wait(&l->idle, &l->mu);
		pthread_mutex_unlock(&l->mu);
	}
}

/* Moves owner's queued tasks of l to the end of the list (head, tail). */
static void unqueue(struct lane *l, const void *owner, struct aps_engine_task **head,
                    struct aps_engine_task **tail)
{
	struct aps_engine_task *keep_head = NULL, *keep_tail = NULL, *t;

	while ((t = pop(&l->head, &l->tail)) != NULL) {
		if (t->owner == owner) {
			append(head, tail, t);
			l->len--;
		} else {
			append(&keep_head, &keep_tail, t);
		}
	}
	l->head = keep_head;
	l->tail = keep_tail;
}

void aps_engine_quiesce(struct aps_engine *e, const void *owner)
{
	struct aps_engine_task *head = NULL, *tail = NULL, *t;

	/* Its queued tasks never run (no wait behind other owners' work); a running one
	 * is waited for. */
	for (unsigned i = 0; i < e->n; i++) {
		struct lane *l = &e->lanes[i];
		pthread_mutex_lock(&l->mu);
		unqueue(l, owner, &head, &tail);
		if (l->running == owner)
			l->waits++;
		while (l->running == owner)
			pthread_cond_wait(&l->idle, &l->mu);
		pthread_mutex_unlock(&l->mu);
	}
	cancel_where(e, owner, false);
	while ((t = pop(&head, &tail)) != NULL)
		t->done(t, true);
}

void aps_engine_counters(struct aps_engine *e, struct aps_engine_counters *out)
{
	memset(out, 0, sizeof(*out));
	out->threads = 1;
	if (e == NULL)
		return;
	out->threads = e->n;
	for (unsigned i = 0; i < e->n; i++) {
		struct lane *l = &e->lanes[i];
		pthread_mutex_lock(&l->mu);
		out->tasks += l->tasks;
		out->busy_ns += l->busy_ns;
		out->waits += l->waits;
		if (l->max_len > out->max_queue)
			out->max_queue = l->max_len;
		pthread_mutex_unlock(&l->mu);
	}
}
