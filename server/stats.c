/*
 * The stats socket: binding the path (replacing a stale file, never a live
 * daemon's) and answering each command line with a JSON report.
 */
#include "server/stats.h"

#include "common/err.h"
#include "common/log.h"
#include "server/oneshot.h"
#include "server/report.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

struct aps_stats {
	uv_pipe_t pipe;
	const struct aps_server *srv;
	struct aps_oneshot *oneshot;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
};

static char *answer(void *ctx, const char *request, size_t *len)
{
	struct aps_stats *st = ctx;
	struct aps_report_clients clients;
	char command[64], *doc = NULL;

	snprintf(command, sizeof(command), "%.*s", (int)strcspn(request, "\r\n"), request);
	aps_oneshot_counts(st->oneshot, &clients.evicted, &clients.refused);
	if (aps_report_build(st->srv, command, &clients, &doc) < 0)
		return NULL;
	*len = strlen(doc);
	doc[(*len)++] = '\n'; /* the NUL's place: the document is one line */
	return doc;
}

/* True when a daemon answers at path: the socket file is not stale. */
static bool someone_listens(const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool alive;

	if (fd < 0)
		return true; /* cannot tell: remove nothing */
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	alive = connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
	close(fd);
	return alive;
}

static int bind_path(struct aps_stats *st)
{
	int ret = uv_pipe_bind(&st->pipe, st->path);

	if (ret == UV_EADDRINUSE) {
		if (someone_listens(st->path)) {
			aps_log_error("stats", "another apsd answers on path=%s", st->path);
			return APS_EBUSY;
		}
		aps_log_info("stats", "removing a stale socket path=%s", st->path);
		unlink(st->path);
		ret = uv_pipe_bind(&st->pipe, st->path);
	}
	if (ret < 0) {
		aps_log_error("stats", "cannot listen path=%s reason=\"%s\"", st->path,
		              uv_strerror(ret));
		return APS_ESYS;
	}
	chmod(st->path, 0660);
	return 0;
}

static void free_stats(void *ctx)
{
	free(ctx);
}

static void on_unused_pipe_closed(uv_handle_t *h)
{
	free(h->data);
}

int aps_stats_open(struct aps_stats **out, uv_loop_t *loop, const char *path,
                   const struct aps_server *srv)
{
	struct aps_stats *st = calloc(1, sizeof(*st));
	int ret;

	if (st == NULL)
		return APS_ENOMEM;
	if (strlen(path) >= sizeof(st->path)) {
		free(st);
		return APS_ERANGE;
	}
	snprintf(st->path, sizeof(st->path), "%s", path);
	st->srv = srv;
	uv_pipe_init(loop, &st->pipe, 0);
	st->pipe.data = st;
	ret = bind_path(st);
	if (ret == 0)
		ret = aps_oneshot_start(&st->oneshot, (uv_stream_t *)&st->pipe, "\n", answer, st);
	if (ret < 0) {
		uv_close((uv_handle_t *)&st->pipe, on_unused_pipe_closed);
		return ret;
	}
	*out = st;
	return 0;
}

void aps_stats_close(struct aps_stats *st)
{
	if (st == NULL)
		return;
	unlink(st->path);
	aps_oneshot_close(st->oneshot, free_stats);
}
