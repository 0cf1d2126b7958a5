/*
 * The connection to apsd closed and came back (a network blip), on the I/O
 * thread. ZeroMQ reconnects the socket by itself, with the same routing id,
 * and apsd keeps this rank's session for its reconnect_grace_ms; but either
 * side may have lost messages with the old connection. So the client speaks
 * at once (a HEARTBEAT: the first message on the new connection is what
 * gives the session back), and when apsd answers WELCOME flagged RESUMED it
 * sends every call in flight again, each from where it is: the data chunks
 * whose results have not arrived, the exponents of an exchange not answered,
 * the barrier, the registration or the pull. apsd answers what it had seen
 * again and drops what it holds, so nothing is counted twice (server/resend.c);
 * a result that arrives twice is taken once (iothread.c).
 */
#include "worker/client_impl.h"

#include <stdio.h>
#include <stdlib.h>

void aps_resume_reconnected(struct aps_client *c)
{
	struct aps_msg hb;

	aps_client_log(c, 1, "the connection to apsd at %s closed and is back", c->endpoint);
	aps_client_msg(c, &hb, APS_MSG_HEARTBEAT);
	snprintf(hb.tensor_name, sizeof(hb.tensor_name), "@resume"); /* about no call */
	aps_client_send(c, &hb, NULL, NULL, 0);
}

static int resend(struct aps_client *c, struct aps_request *r)
{
	switch (r->kind) {
	case REQ_REGISTER:
	case REQ_BARRIER:
		return aps_io_send_simple(c, r);
	case REQ_PULL:
		return aps_io_send_pull(c, r);
	case REQ_ALLREDUCE:
	case REQ_BROADCAST:
		return r->state == REQ_SENT ? aps_io_send_chunks(c, r) : 0;
	default:
		return 0;
	}
}

void aps_resume_calls(struct aps_client *c)
{
	struct aps_request **exchange = NULL;
	uint32_t n = 0, n_active = 0;
	int ret = 0;

	for (struct aps_request *r = c->active; r != NULL; r = r->next)
		n_active++;
	aps_client_log(c, 2, "apsd took rank %u of job '%s' back: %u calls in flight go again",
	               c->rank, c->job, n_active);
	if (n_active > 0 && (exchange = malloc(n_active * sizeof(*exchange))) == NULL) {
		aps_client_fail_all(c, APS_ENOMEM, "out of memory resending calls", false);
		return;
	}
	aps_rejoin_resumed(c);
	for (struct aps_request *r = c->active; r != NULL && ret == 0; r = r->next) {
		if (r->state == REQ_EXCHANGE)
			exchange[n++] = r;
		else
			ret = resend(c, r);
	}
	if (ret == 0 && n > 0)
		ret = aps_io_send_exponents(c, exchange, n);
	free(exchange);
	if (ret < 0)
		aps_client_fail_all(c, APS_ECONN, "send to the daemon failed after a reconnect",
		                    false);
}
