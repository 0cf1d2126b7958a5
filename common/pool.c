/* A fork-join pool (pool.h): a generation counter wakes the helpers for each run;
 * every thread, the caller's too, takes the next part under the mutex (a part is a
 * chunk of codec work, milliseconds, so the lock is not what costs). */
#include "common/pool.h"

#include "common/err.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

struct aps_pool {
	pthread_mutex_t run_mu; /* one run at a time */
	pthread_mutex_t mu;
	pthread_cond_t work, idle;
	pthread_t *tids;
	unsigned n_tids;
	bool stop;
	uint64_t generation; /* a new run */
	void (*fn)(void *ctx, size_t i);
	void *ctx;
	size_t n, next, finished;
	unsigned busy; /* helpers inside the current run */
};

/* Takes and runs parts until none is left; called and returns with mu held. */
static void take_parts(struct aps_pool *p)
{
	while (p->next < p->n) {
		size_t i = p->next++;
		pthread_mutex_unlock(&p->mu);
		p->fn(p->ctx, i);
		pthread_mutex_lock(&p->mu);
		if (++p->finished == p->n)
			pthread_cond_broadcast(&p->idle);
	}
}

static void *helper_main(void *arg)
{
	struct aps_pool *p = arg;
	uint64_t seen = 0;

	pthread_mutex_lock(&p->mu);
	for (;;) {
		while (!p->stop && p->generation == seen)
			pthread_cond_wait(&p->work, &p->mu);
		if (p->stop)
			break;
		seen = p->generation;
		p->busy++;
		take_parts(p);
		if (--p->busy == 0)
			pthread_cond_broadcast(&p->idle);
	}
	pthread_mutex_unlock(&p->mu);
	return NULL;
}

int aps_pool_new(struct aps_pool **out, unsigned helpers)
{
	struct aps_pool *p = calloc(1, sizeof(*p));

	*out = NULL;
	if (p == NULL || (p->tids = calloc(helpers ? helpers : 1, sizeof(*p->tids))) == NULL) {
		free(p);
		return APS_ENOMEM;
	}
	pthread_mutex_init(&p->run_mu, NULL);
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->work, NULL);
	pthread_cond_init(&p->idle, NULL);
	for (; p->n_tids < helpers; p->n_tids++) {
		if (pthread_create(&p->tids[p->n_tids], NULL, helper_main, p) != 0) {
			aps_pool_free(p);
			return APS_ESYS;
		}
	}
	*out = p;
	return 0;
}

void aps_pool_free(struct aps_pool *p)
{
	if (p == NULL)
		return;
	pthread_mutex_lock(&p->mu);
	p->stop = true;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->mu);
	for (unsigned i = 0; i < p->n_tids; i++)
		pthread_join(p->tids[i], NULL);
	pthread_mutex_destroy(&p->run_mu);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->idle);
	free(p->tids);
	free(p);
}

void aps_pool_run(struct aps_pool *p, size_t n, void (*fn)(void *ctx, size_t i), void *ctx)
{
	if (n == 0)
		return;
	pthread_mutex_lock(&p->run_mu);
	pthread_mutex_lock(&p->mu);
	p->fn = fn;
	p->ctx = ctx;
	p->n = n;
	p->next = p->finished = 0;
	p->generation++;
	pthread_cond_broadcast(&p->work);
	take_parts(p);
	/* Every part done, and no helper still inside this run (it reads p->n). */
	while (p->finished < p->n || p->busy > 0)
		pthread_cond_wait(&p->idle, &p->mu);
	pthread_mutex_unlock(&p->mu);
	pthread_mutex_unlock(&p->run_mu);
}
