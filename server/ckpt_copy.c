/*
 * Snapshot copies off the event loop (ckpt_copy.h): one uv_work_t each. The
 * worker thread only allocates and copies.
 */
#include "server/ckpt_copy.h"

#include "common/err.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct aps_ckpt_copy {
	uv_work_t work;
	struct aps_ckpt *ck;
	aps_ckpt_copied_cb done;
	void *ctx;
	int ret;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	bool copied;  /* under lock: the thread is done with the borrowed arrays */
	void **later; /* the loop thread's: freed after done (aps_ckpt_copy_free_later) */
	size_t n_later, cap_later;
};

static void copy_arrays(struct aps_ckpt *ck, int *ret)
{
	for (uint32_t i = 0; i < ck->n_tensors; i++) {
		struct aps_ckpt_tensor *t = &ck->tensors[i];
		if (!t->borrowed)
			continue;
		for (uint32_t a = 0; a < t->n_arrays; a++) {
			float *copy = *ret == 0 ? malloc(t->count * sizeof(float)) : NULL;
			if (copy != NULL)
				memcpy(copy, t->arrays[a], t->count * sizeof(float));
			else
				*ret = APS_ENOMEM;
			t->arrays[a] = copy;
		}
		t->borrowed = false;
	}
}

static void on_copy(uv_work_t *w)
{
	struct aps_ckpt_copy *c = w->data;

	copy_arrays(c->ck, &c->ret);
	pthread_mutex_lock(&c->lock);
	c->copied = true;
	pthread_cond_broadcast(&c->cond);
	pthread_mutex_unlock(&c->lock);
}

static void on_copied(uv_work_t *w, int status)
{
	struct aps_ckpt_copy *c = w->data;

	if (status < 0 && !c->copied) { /* cancelled before it ran: nothing copied */
		copy_arrays(c->ck, &(int){ APS_ENOMEM });
		c->ret = APS_ESYS;
	}
	c->done(c->ctx, c, c->ck, c->ret);
	for (size_t i = 0; i < c->n_later; i++)
		free(c->later[i]);
	free(c->later);
	pthread_cond_destroy(&c->cond);
	pthread_mutex_destroy(&c->lock);
	free(c);
}

int aps_ckpt_copy_start(uv_loop_t *loop, struct aps_ckpt *ck, aps_ckpt_copied_cb done, void *ctx,
                        const struct aps_ckpt_copy **out)
{
	struct aps_ckpt_copy *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return APS_ENOMEM;
	c->ck = ck;
	c->done = done;
	c->ctx = ctx;
	c->work.data = c;
	pthread_mutex_init(&c->lock, NULL);
	pthread_cond_init(&c->cond, NULL);
	if (uv_queue_work(loop, &c->work, on_copy, on_copied) < 0) {
		pthread_cond_destroy(&c->cond);
		pthread_mutex_destroy(&c->lock);
		free(c);
		return APS_ESYS;
	}
	*out = c;
	return 0;
}

void aps_ckpt_copy_wait(const struct aps_ckpt_copy *cc)
{
	struct aps_ckpt_copy *c = (struct aps_ckpt_copy *)cc;

	pthread_mutex_lock(&c->lock);
	while (!c->copied)
		pthread_cond_wait(&c->cond, &c->lock);
	pthread_mutex_unlock(&c->lock);
}

void aps_ckpt_copy_free_later(const struct aps_ckpt_copy *cc, void *p)
{
	struct aps_ckpt_copy *c = (struct aps_ckpt_copy *)cc;

	if (p == NULL)
		return;
	if (c->n_later == c->cap_later) {
		size_t cap = c->cap_later ? 2 * c->cap_later : 16;
		void **later = realloc(c->later, cap * sizeof(*later));
		if (later == NULL) {
			aps_ckpt_copy_wait(c);
			free(p);
			return;
		}
		c->later = later;
		c->cap_later = cap;
	}
	c->later[c->n_later++] = p;
}
