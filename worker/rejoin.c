/*
 * Joining the job again after apsd restarted (opts.rejoin), on the I/O thread.
 *
 * A daemon that restarted does not know this connection: it answers every
 * message with APS_ENOSESSION (or said BYE when it stopped). Then the calls
 * in flight go back to the queue (nothing of their step was delivered to
 * this rank), calls queued meanwhile wait, and the client says its first
 * HELLO again, once per heartbeat until WELCOME or the call deadline. After
 * WELCOME it registers every tensor it had, in id order, each flagged REJOIN
 * with the step it is at: the daemon creates the tensors at those steps, and
 * ranks at different steps (a result reached some of them only) get
 * APS_EMISMATCH. When every REGISTERED is back, the calls go (again), so that
 * every rank sends each step once to the new daemon.
 *
 * Tensor ids are the daemon's: ranks that registered the same tensors in the
 * same order get the same ids back. Ids that differ end the client
 * (APS_EMISMATCH), as its callers hold the old ones.
 */
#include "worker/client_impl.h"

#include "common/err.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void finish_rejoin(struct aps_client *c)
{
	pthread_mutex_lock(&c->lock);
	c->rejoining = false;
	pthread_cond_broadcast(&c->done_cv); /* a waiting caller may drive its call again */
	pthread_mutex_unlock(&c->lock);
	aps_client_log(c, 2, "joined job '%s' again as rank %u", c->job, c->rank);
	/* Wake the loop: queued calls go now. */
	if (aps_client_wake(c) < 0)
		aps_client_log(c, 1, "cannot wake the I/O thread");
}

/*
 * The calls in flight go back to the head of the queue, in the order they
 * were started, to be sent again once the client has joined again: their
 * codes are kept (the caller's buffer may already hold some result chunks),
 * so what is sent again is what was sent before.
 */
static void requeue_active(struct aps_client *c)
{
	struct aps_request *again = NULL, *r = aps_client_take_active(c), *next;

	for (; r != NULL; r = next) { /* active is newest first: this reverses it */
		next = r->next;
		r->state = REQ_NEW;
		r->chunks_done = 0;
		if (r->got != NULL) /* a new daemon: every chunk is answered anew */
			memset(r->got, 0, r->chunks);
		r->heard = false;
		r->n_waiting = 0;
		r->reexchange = r->kind == REQ_ALLREDUCE && r->codes != NULL &&
		                c->scaling == APS_SCALING_GLOBAL && !aps_format_is_fp32(&r->fmt);
		r->next = again;
		again = r;
	}
	if (again == NULL)
		return;
	pthread_mutex_lock(&c->lock);
	struct aps_request **tail = &again;
	while (*tail != NULL)
		tail = &(*tail)->next;
	*tail = c->queue;
	c->queue = again;
	pthread_mutex_unlock(&c->lock);
}

void aps_rejoin_begin(struct aps_client *c, const char *why)
{
	if (c->rejoining)
		return;
	aps_client_log(c, 1, "%.200s: joining job '%s' again; the calls in flight go again", why,
	               c->job);
	requeue_active(c);
	c->has_session = false; /* the daemon that had it is gone */
	c->resuming = false;
	pthread_mutex_lock(&c->lock);
	c->rejoining = true;
	pthread_mutex_unlock(&c->lock);
	c->reregistering = 0;
	c->rejoin_deadline_ms = aps_client_now_ms() + c->timeout_ms;
	c->next_hello_ms = 0; /* now */
}

int aps_rejoin_timers(struct aps_client *c, int64_t now)
{
	char text[APS_CLIENT_ERROR_MAX];

	if (now >= c->rejoin_deadline_ms) {
		snprintf(
		        text, sizeof(text),
		        "apsd at %.120s did not take job '%.64s' back within %d ms after it restarted",
		        c->endpoint, c->job, c->timeout_ms);
		pthread_mutex_lock(&c->lock);
		c->rejoining = false;
		pthread_mutex_unlock(&c->lock);
		aps_client_fail_for_good(c, APS_ECONN, text);
		return 0;
	}
	if (c->reregistering == 0 && now >= c->next_hello_ms) {
		struct aps_msg hello = c->hello;
		aps_client_send(c, &hello, NULL, NULL, 0);
		c->next_hello_ms = now + c->heartbeat_ms;
	}
	int64_t next = c->reregistering == 0 && c->next_hello_ms < c->rejoin_deadline_ms
	                       ? c->next_hello_ms
	                       : c->rejoin_deadline_ms;
	return next > now ? (int)(next - now) : 0;
}

/* Every tensor again, at the step this rank is at; REGISTERED is due for each. */
static void send_registrations(struct aps_client *c)
{
	c->reregistering = 0;
	for (uint32_t id = 0; id < c->n_tensors; id++) {
		const struct client_tensor *t = &c->tensors[id];
		struct aps_msg m;
		if (t->count == 0)
			continue;
		aps_client_msg(c, &m, APS_MSG_REGISTER);
		snprintf(m.tensor_name, sizeof(m.tensor_name), "%s", t->name);
		m.total_count = t->count;
		snprintf(m.format, sizeof(m.format), "%s", t->format.name);
		m.step = t->step;
		m.flags = APS_MSG_FLAG_REJOIN;
		if (aps_client_send(c, &m, NULL, NULL, 0) == 0)
			c->reregistering++;
	}
	if (c->reregistering == 0)
		finish_rejoin(c);
}

/* After WELCOME: the job's barrier number, then the registrations. */
static void reregister(struct aps_client *c, const struct aps_msg *welcome)
{
	c->barrier_step = welcome->step;
	send_registrations(c);
}

void aps_rejoin_resumed(struct aps_client *c)
{
	/* A REGISTER or its REGISTERED may be lost with the connection: all again (apsd
	 * answers one at the same step the same way; a REGISTERED twice ends the count
	 * early, harmlessly: this connection carries the REGISTERs before any call). */
	if (c->rejoining && c->reregistering > 0)
		send_registrations(c);
}

/* A REGISTERED of reregister(): the same id, and the step apsd has. */
static void registered_again(struct aps_client *c, const struct aps_msg *m)
{
	char text[APS_CLIENT_ERROR_MAX];
	struct client_tensor *t = m->tensor_id < c->n_tensors ? &c->tensors[m->tensor_id] : NULL;

	if (t == NULL || strcmp(t->name, m->tensor_name) != 0) {
		snprintf(text, sizeof(text),
		         "joining again: apsd gave tensor '%.80s' id %u, which this client knows "
		         "by another name: ranks registered different tensors; start the job again",
		         m->tensor_name, m->tensor_id);
		aps_client_fail_for_good(c, APS_EMISMATCH, text);
		return;
	}
	pthread_mutex_lock(&c->lock);
	t->step = m->step;
	t->chunk_elems = m->chunk_count ? m->chunk_count : m->total_count;
	pthread_mutex_unlock(&c->lock);
	if (c->reregistering > 0 && --c->reregistering == 0)
		finish_rejoin(c);
}

bool aps_rejoin_on_error(struct aps_client *c, const struct aps_msg *m)
{
	char text[APS_CLIENT_ERROR_MAX];

	if (!c->rejoin)
		return false;
	if (m->error_code == APS_ENOSESSION) {
		aps_rejoin_begin(c, m->error_text);
		return true;
	}
	/* A HELLO said twice (no WELCOME within a heartbeat): the first one was enough. */
	if (m->about_type == APS_MSG_HELLO && m->error_code == APS_EPROTO &&
	    (!c->rejoining || c->reregistering > 0))
		return true;
	if (!c->rejoining)
		return false;
	/* The job refused this rank back (steps or options differ): for good. */
	snprintf(text, sizeof(text), "joining again: %.200s", m->error_text);
	pthread_mutex_lock(&c->lock);
	c->rejoining = false;
	pthread_mutex_unlock(&c->lock);
	aps_client_fail_for_good(c, m->error_code, text);
	return true;
}

void aps_rejoin_on_message(struct aps_client *c, const struct aps_msg *m)
{
	if (!c->rejoining)
		return;
	if (m->type == APS_MSG_WELCOME && c->reregistering == 0)
		reregister(c, m);
	else if (m->type == APS_MSG_REGISTERED)
		registered_again(c, m);
}
