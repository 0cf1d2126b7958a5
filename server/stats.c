/*
 * The stats socket on the libuv loop: accept, read one line (at most 255
 * bytes), answer with one JSON document, close. A client that is too slow,
 * too chatty or one too many is closed; the data path never waits for it,
 * and what it can make the daemon hold is bounded by APS_STATS_MAX_CLIENTS
 * documents.
 */
#include "server/stats.h"

#include "common/err.h"
#include "common/log.h"
#include "common/statspath.h"
#include "server/report.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define LINE_MAX_BYTES 256

struct aps_stats {
	uv_pipe_t pipe;
	uv_loop_t *loop;
	const struct aps_server *srv;
	char path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	struct client *clients_list; /* every open client */
	int clients;
	bool closing;
	bool pipe_closed; /* st is freed when this and every client are closed */
};

struct client {
	struct client *next;
	uv_pipe_t pipe;
	uv_timer_t timer;
	uv_write_t write;
	struct aps_stats *st;
	char line[LINE_MAX_BYTES];
	size_t len;
	char *doc;
	int open_handles;
	bool answered;
};

static void on_client_closed(uv_handle_t *h)
{
	struct client *cl = h->data;

	struct client **link = &cl->st->clients_list;

	if (--cl->open_handles > 0)
		return;
	while (*link != cl)
		link = &(*link)->next;
	*link = cl->next;
	cl->st->clients--;
	if (cl->st->pipe_closed && cl->st->clients == 0)
		free(cl->st);
	free(cl->doc);
	free(cl);
}

static void close_client(struct client *cl)
{
	if (uv_is_closing((uv_handle_t *)&cl->pipe))
		return;
	uv_close((uv_handle_t *)&cl->pipe, on_client_closed);
	uv_close((uv_handle_t *)&cl->timer, on_client_closed);
}

static void on_written(uv_write_t *w, int status)
{
	(void)status;
	close_client(w->data);
}

static void answer(struct client *cl)
{
	uv_buf_t buf;
	char *nl;

	cl->answered = true;
	cl->line[cl->len] = '\0';
	nl = cl->line + strcspn(cl->line, "\r\n");
	*nl = '\0';
	if (aps_report_build(cl->st->srv, cl->line, &cl->doc) < 0) {
		close_client(cl);
		return;
	}
	size_t len = strlen(cl->doc);
	cl->doc[len] = '\n'; /* json_dumps leaves room: replace the NUL, send len + 1 */
	buf = uv_buf_init(cl->doc, (unsigned)len + 1);
	cl->write.data = cl;
	uv_read_stop((uv_stream_t *)&cl->pipe);
	if (uv_write(&cl->write, (uv_stream_t *)&cl->pipe, &buf, 1, on_written) < 0)
		close_client(cl);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct client *cl = h->data;

	(void)suggested;
	*buf = uv_buf_init(cl->line + cl->len, (unsigned)(sizeof(cl->line) - 1 - cl->len));
}

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *buf)
{
	struct client *cl = s->data;

	(void)buf;
	if (n < 0 && n != UV_EOF) {
		close_client(cl);
		return;
	}
	if (n > 0)
		cl->len += (size_t)n;
	if (memchr(cl->line, '\n', cl->len) != NULL || (n == UV_EOF && cl->len > 0)) {
		answer(cl);
		return;
	}
	/* A line that fills the buffer without ending is not a command. */
	if (n == UV_EOF || cl->len >= sizeof(cl->line) - 1)
		close_client(cl);
}

static void on_timeout(uv_timer_t *t)
{
	close_client(t->data);
}

static void accept_client(struct aps_stats *st, struct client *cl)
{
	cl->st = st;
	cl->pipe.data = cl->timer.data = cl;
	uv_pipe_init(st->loop, &cl->pipe, 0);
	uv_timer_init(st->loop, &cl->timer);
	cl->open_handles = 2;
	cl->next = st->clients_list;
	st->clients_list = cl;
	st->clients++;
	if (uv_accept((uv_stream_t *)&st->pipe, (uv_stream_t *)&cl->pipe) < 0) {
		close_client(cl);
		return;
	}
	uv_timer_start(&cl->timer, on_timeout, APS_STATS_TIMEOUT_MS, 0);
	uv_read_start((uv_stream_t *)&cl->pipe, on_alloc, on_read);
}

static void on_connection(uv_stream_t *server, int status)
{
	struct aps_stats *st = server->data;
	struct client *cl;

	if (status < 0)
		return;
	cl = calloc(1, sizeof(*cl));
	if (cl == NULL)
		return;
	accept_client(st, cl);
	/* One too many: accepted (so that it does not linger in the backlog) and closed. */
	if (st->clients > APS_STATS_MAX_CLIENTS) {
		aps_log_warn("stats", "refused a client: %d already connected",
		             APS_STATS_MAX_CLIENTS);
		close_client(cl);
	}
}

/* True when a daemon answers at path: the socket file is not stale. */
static bool someone_listens(const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool alive;

	if (fd < 0)
		return true; /* cannot tell: do not remove anything */
	snprintf(addr.sun_path, sizeof(addr.sun_path), "%s", path);
	alive = connect(fd, (struct sockaddr *)&addr, sizeof(addr)) == 0;
	close(fd);
	return alive;
}

static int bind_path(struct aps_stats *st)
{
	int ret = uv_pipe_bind(&st->pipe, st->path);

	if (ret == UV_EADDRINUSE) {
		if (someone_listens(st->path))
			return APS_EBUSY;
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
	return uv_listen((uv_stream_t *)&st->pipe, 16, on_connection) < 0 ? APS_ESYS : 0;
}

static void on_stats_closed(uv_handle_t *h)
{
	struct aps_stats *st = h->data;

	st->pipe_closed = true;
	if (st->clients == 0)
		free(st);
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
	st->loop = loop;
	st->srv = srv;
	uv_pipe_init(loop, &st->pipe, 0);
	st->pipe.data = st;
	ret = bind_path(st);
	if (ret < 0) {
		if (ret == APS_EBUSY)
			aps_log_error("stats", "another apsd answers on path=%s", st->path);
		uv_close((uv_handle_t *)&st->pipe, on_stats_closed);
		return ret;
	}
	*out = st;
	return 0;
}

void aps_stats_close(struct aps_stats *st)
{
	if (st == NULL || st->closing)
		return;
	st->closing = true;
	for (struct client *cl = st->clients_list; cl != NULL; cl = cl->next)
		close_client(cl);
	unlink(st->path);
	uv_close((uv_handle_t *)&st->pipe, on_stats_closed);
}
