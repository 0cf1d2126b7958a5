/*
 * One request, one answer, close: the client side of the stats socket and of
 * the metrics endpoint, over any libuv stream.
 */
#include "server/oneshot.h"

#include "common/err.h"
#include "common/log.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct aps_oneshot {
	uv_stream_t *listener;
	uv_loop_t *loop;
	const char *terminator;
	aps_oneshot_handler handler;
	void *ctx;
	struct client *clients; /* the newest first */
	int n_clients;
	uint64_t evicted, refused;
	struct aps_log_gate evicted_log;
	bool listener_closed;
	void (*on_closed)(void *ctx);
};

struct client {
	struct client *next;
	union {
		uv_pipe_t pipe;
		uv_tcp_t tcp;
	} conn;
	uv_timer_t timer;
	uv_write_t write;
	struct aps_oneshot *o;
	char request[APS_ONESHOT_REQUEST_MAX + 1];
	size_t len;
	char *answer;
	uint64_t answered_ms; /* when its answer began to be written */
	int open_handles;
};

static void maybe_done(struct aps_oneshot *o)
{
	if (o->listener_closed && o->n_clients == 0) {
		void (*on_closed)(void *) = o->on_closed;
		void *ctx = o->ctx;
		free(o);
		if (on_closed != NULL)
			on_closed(ctx);
	}
}

static void on_client_closed(uv_handle_t *h)
{
	struct client *cl = h->data, **link;
	struct aps_oneshot *o = cl->o;

	if (--cl->open_handles > 0)
		return;
	for (link = &o->clients; *link != cl; link = &(*link)->next)
		;
	*link = cl->next;
	o->n_clients--;
	free(cl->answer);
	free(cl);
	maybe_done(o);
}

static void close_client(struct client *cl)
{
	if (uv_is_closing((uv_handle_t *)&cl->conn))
		return;
	uv_close((uv_handle_t *)&cl->conn, on_client_closed);
	uv_close((uv_handle_t *)&cl->timer, on_client_closed);
}

static void on_written(uv_write_t *w, int status)
{
	(void)status;
	close_client(w->data);
}

static void answer(struct client *cl)
{
	size_t len = 0;
	uv_buf_t buf;

	cl->request[cl->len] = '\0';
	uv_read_stop((uv_stream_t *)&cl->conn);
	cl->answer = cl->o->handler(cl->o->ctx, cl->request, &len);
	cl->answered_ms = uv_now(cl->o->loop);
	if (cl->answer == NULL) {
		close_client(cl);
		return;
	}
	buf = uv_buf_init(cl->answer, (unsigned)len);
	cl->write.data = cl;
	if (uv_write(&cl->write, (uv_stream_t *)&cl->conn, &buf, 1, on_written) < 0)
		close_client(cl);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
	struct client *cl = h->data;

	(void)suggested;
	*buf = uv_buf_init(cl->request + cl->len, (unsigned)(APS_ONESHOT_REQUEST_MAX - cl->len));
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
	cl->request[cl->len] = '\0';
	if (strstr(cl->request, cl->o->terminator) != NULL || (n == UV_EOF && cl->len > 0)) {
		answer(cl);
		return;
	}
	/* A request that fills the buffer without ending is not one. */
	if (n == UV_EOF || cl->len >= APS_ONESHOT_REQUEST_MAX)
		close_client(cl);
}

static void on_timeout(uv_timer_t *t)
{
	close_client(t->data);
}

static int init_conn(struct aps_oneshot *o, struct client *cl)
{
	if (o->listener->type == UV_NAMED_PIPE)
		return uv_pipe_init(o->loop, &cl->conn.pipe, 0);
	return uv_tcp_init(o->loop, &cl->conn.tcp);
}

/* A client that has not taken its answer in this long reads too slowly to keep
 * its place from a new one (a scraper takes a few ms). */
#define SLOW_READER_MS 1000

/* The client that has waited longest without a whole request, one that sent
 * nothing before one that sent part of it, else the one whose answer has
 * waited longest past SLOW_READER_MS; NULL: none. */
static struct client *least_useful(struct aps_oneshot *o)
{
	struct client *idle = NULL, *partial = NULL, *slow = NULL;
	uint64_t now = uv_now(o->loop);

	/* the list is newest first: the last one found is the oldest */
	for (struct client *cl = o->clients; cl != NULL; cl = cl->next) {
		if (uv_is_closing((uv_handle_t *)&cl->conn))
			continue;
		if (cl->answer != NULL && now - cl->answered_ms >= SLOW_READER_MS)
			slow = cl;
		else if (cl->answer == NULL && cl->len == 0)
			idle = cl;
		else if (cl->answer == NULL)
			partial = cl;
	}
	return idle != NULL ? idle : partial != NULL ? partial : slow;
}

/* Every place is taken: a new client takes the least useful one's, or is refused. */
static bool make_room(struct aps_oneshot *o)
{
	struct client *victim;
	uint64_t now = uv_now(o->loop);
	int live = 0;

	for (struct client *cl = o->clients; cl != NULL; cl = cl->next)
		live += !uv_is_closing((uv_handle_t *)&cl->conn);
	if (live < APS_ONESHOT_MAX_CLIENTS)
		return true;
	victim = least_useful(o);
	if (victim == NULL) {
		o->refused++;
		return false;
	}
	o->evicted++;
	if (aps_log_gate_open(&o->evicted_log, now, 1000))
		aps_log_warn("oneshot",
		             "closed a client that had not sent a whole request or read its "
		             "answer: %d clients at once, a new one came held_back=%llu",
		             APS_ONESHOT_MAX_CLIENTS,
		             (unsigned long long)aps_log_gate_pass(&o->evicted_log, now));
	close_client(victim);
	return true;
}

static void on_connection(uv_stream_t *listener, int status)
{
	struct aps_oneshot *o = listener->data;
	struct client *cl;
	bool room;

	if (status < 0)
		return;
	room = make_room(o);
	if ((cl = calloc(1, sizeof(*cl))) == NULL)
		return;
	cl->o = o;
	init_conn(o, cl);
	uv_timer_init(o->loop, &cl->timer);
	cl->conn.pipe.data = cl->timer.data = cl;
	cl->open_handles = 2;
	cl->next = o->clients;
	o->clients = cl;
	o->n_clients++;
	/* Accepted in any case, so that it does not linger in the backlog. */
	if (uv_accept(listener, (uv_stream_t *)&cl->conn) < 0 || !room) {
		close_client(cl);
		return;
	}
	uv_timer_start(&cl->timer, on_timeout, APS_ONESHOT_TIMEOUT_MS, 0);
	uv_read_start((uv_stream_t *)&cl->conn, on_alloc, on_read);
}

int aps_oneshot_start(struct aps_oneshot **out, uv_stream_t *listener, const char *terminator,
                      aps_oneshot_handler handler, void *ctx)
{
	struct aps_oneshot *o = calloc(1, sizeof(*o));

	if (o == NULL)
		return APS_ENOMEM;
	o->listener = listener;
	o->loop = listener->loop;
	o->terminator = terminator;
	o->handler = handler;
	o->ctx = ctx;
	if (uv_listen(listener, 64, on_connection) < 0) {
		free(o); /* listener->data is still the caller's, for its close callback */
		return APS_ESYS;
	}
	listener->data = o;
	*out = o;
	return 0;
}

void aps_oneshot_counts(const struct aps_oneshot *o, uint64_t *evicted, uint64_t *refused)
{
	*evicted = o != NULL ? o->evicted : 0;
	*refused = o != NULL ? o->refused : 0;
}

static void on_listener_closed(uv_handle_t *h)
{
	struct aps_oneshot *o = h->data;

	o->listener_closed = true;
	maybe_done(o);
}

void aps_oneshot_close(struct aps_oneshot *o, void (*on_closed)(void *ctx))
{
	o->on_closed = on_closed;
	for (struct client *cl = o->clients; cl != NULL; cl = cl->next)
		close_client(cl);
	uv_close((uv_handle_t *)o->listener, on_listener_closed);
}
