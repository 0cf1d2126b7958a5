/*
 * Checkpoint reads off the event loop (ckpt_load.h): one uv_work_t each. The
 * worker thread only calls aps_ckpt_load_newest.
 */
#include "server/ckpt_load.h"

#include "common/err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct aps_ckpt_load {
	uv_work_t work;
	char dir[APS_CKPT_PATH_MAX];
	char job[APS_MSG_JOB_MAX + 1];
	char token[APS_MSG_TOKEN_MAX + 1];
	struct aps_ckpt_want want;
	uint64_t bytes;
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

static void on_done(uv_work_t *w, int status)
{
	struct aps_ckpt_load *l = w->data;

	if (status < 0 && l->ret == 0) {
		l->ret = APS_ESYS;
		snprintf(l->why, sizeof(l->why), "read cancelled");
	}
	l->done(l->ctx, l, l->job, l->bytes, l->ret, &l->ck, l->path, l->why);
	aps_ckpt_free(&l->ck);
	free(l);
}

int aps_ckpt_load_start(uv_loop_t *loop, const char *dir, const char *job,
                        const struct aps_ckpt_want *want, uint64_t bytes, aps_ckpt_loaded_cb done,
                        void *ctx, const struct aps_ckpt_load **out)
{
	struct aps_ckpt_load *l = calloc(1, sizeof(*l));

	if (l == NULL)
		return APS_ENOMEM;
	snprintf(l->dir, sizeof(l->dir), "%s", dir);
	snprintf(l->job, sizeof(l->job), "%s", job);
	snprintf(l->token, sizeof(l->token), "%s", want->token);
	l->want = (struct aps_ckpt_want){ .token = l->token, .max_bytes = want->max_bytes };
	l->bytes = bytes;
	l->done = done;
	l->ctx = ctx;
	l->work.data = l;
	if (uv_queue_work(loop, &l->work, on_read, on_done) < 0) {
		free(l);
		return APS_ESYS;
	}
	*out = l;
	return 0;
}
