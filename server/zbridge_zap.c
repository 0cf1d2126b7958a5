/*
 * The ZAP handler of the socket bridge: a REP socket in the bridge's context,
 * drained from the libuv loop like the ROUTER (its ZMQ_FD is edge-triggered
 * too), that refuses addresses outside allow_from, counts each handshake for
 * the address it names, turns away the
 * addresses whose handshakes lead to no message (admission.h; a first message
 * is counted by zbridge_pump.c), refuses the handshakes of those turned away,
 * and checks each CURVE client key against the allowlist.
 */
#include "server/zbridge_zap.h"

#include "server/netlist.h"
#include "server/zbridge_impl.h"

#include "common/err.h"
#include "common/log.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#define KEY_BYTES  32
#define ZAP_FRAMES 7 /* version, id, domain, address, identity, mechanism, key */

struct aps_zap {
	void *sock;
	uv_poll_t poll;
	uv_loop_t *loop;
	struct aps_zbridge *bridge; /* its admission, and who is judged */
	bool curve;
	uint8_t (*keys)[KEY_BYTES];
	size_t n_keys;
	struct aps_log_gate not_allowed_log;
	uint64_t accepted, refused, not_allowed;
};

/* Outside allow_from: refused before anything is counted for the address. The
 * host's own workers (127.0.0.1, ::1, ipc) always come in. */
static bool outside(struct aps_zap *z, const char *ip)
{
	uint64_t now = uv_now(z->loop);

	const struct aps_netlist *allow = &z->bridge->allow_from;

	if (allow->n == 0 || ip[0] == '\0' || aps_admission_exempt(ip) ||
	    aps_netlist_has(allow, ip))
		return false;
	z->not_allowed++;
	if (aps_log_gate_open(&z->not_allowed_log, now, 1000))
		aps_log_warn("zap",
		             "refused a handshake address=%s reason=\"not in allow_from\" "
		             "held_back=%llu",
		             ip, (unsigned long long)aps_log_gate_pass(&z->not_allowed_log, now));
	return true;
}

static bool allowed(const struct aps_zap *z, const uint8_t *key)
{
	for (size_t i = 0; i < z->n_keys; i++) {
		if (memcmp(z->keys[i], key, KEY_BYTES) == 0)
			return true;
	}
	return false;
}

/* Reads one request (all its frames); false when none waits. */
static bool read_request(void *sock, zmq_msg_t *frames, size_t *n)
{
	zmq_msg_t extra;
	int more = 1;

	for (*n = 0; more;) {
		zmq_msg_t *m = *n < ZAP_FRAMES ? &frames[*n] : &extra;
		zmq_msg_init(m);
		if (zmq_msg_recv(m, sock, *n ? 0 : ZMQ_DONTWAIT) < 0) {
			zmq_msg_close(m);
			return *n > 0;
		}
		more = zmq_msg_more(m);
		if (m == &extra)
			zmq_msg_close(m);
		else
			(*n)++;
	}
	return true;
}

/* The user id of an accepted worker is its Z85 public key: every message it
 * sends carries it (User-Id), for the jobs its allowlist line names. */
static void reply(void *sock, zmq_msg_t *request_id, const uint8_t *key, const char *refusal)
{
	char user[41] = "";
	const char *text = refusal != NULL ? refusal : "OK";

	if (refusal == NULL && key != NULL)
		zmq_z85_encode(user, key, KEY_BYTES);
	zmq_send(sock, "1.0", 3, ZMQ_SNDMORE);
	zmq_send(sock, zmq_msg_data(request_id), zmq_msg_size(request_id), ZMQ_SNDMORE);
	zmq_send(sock, refusal == NULL ? "200" : "400", 3, ZMQ_SNDMORE);
	zmq_send(sock, text, strlen(text), ZMQ_SNDMORE);
	zmq_send(sock, user, strlen(user), ZMQ_SNDMORE);
	zmq_send(sock, "", 0, 0); /* metadata */
}

/* A connection that has not spoken for this long counts against its address. */
#define QUIET_MS 10000

/* ip has more than the limit of handshakes that led to no message (n). */
static void consider(struct aps_zbridge *b, const char *ip, uint32_t n, uint64_t now)
{
	/* a host's own workers, a worker's node: its workers would go with it */
	if (aps_admission_exempt(ip) || aps_conns_joined_from(&b->conns, ip)) {
		aps_admission_forgive(&b->admission, ip, now);
		return;
	}
	/* connections opened in the last QUIET_MS that have not spoken yet may still
	 * (a client that connects early); older ones count */
	if (n - aps_conns_quiet_from(&b->conns, ip, n, now > QUIET_MS ? now - QUIET_MS : 0) <=
	    b->admission.limit)
		return;
	uint64_t away = aps_admission_turn_away(&b->admission, ip, now);
	aps_log_warn("zbridge",
	             "turning away address=%s for_ms=%llu reason=\"%u of its handshakes within a "
	             "minute led to no message, more than max_silent_closes = %u\"",
	             ip, (unsigned long long)away, n, b->admission.limit);
}

/* Judgements wait until every message that waits was read (a connection's
 * first message may be among them), or until messages have waited at every
 * look for JUDGE_BEHIND_MS (a flood must not stop judgement). */
#define JUDGE_BEHIND_MS 1000

bool aps_zap_may_judge(struct aps_zbridge *b, uint64_t now)
{
	int events = 0;
	size_t len = sizeof(events);

	if (b->router == NULL || zmq_getsockopt(b->router, ZMQ_EVENTS, &events, &len) < 0)
		return false;
	if (!(events & ZMQ_POLLIN)) {
		b->behind_since_ms = 0;
		return true;
	}
	if (b->behind_since_ms == 0)
		b->behind_since_ms = now;
	return now - b->behind_since_ms >= JUDGE_BEHIND_MS;
}

void aps_zap_judge_all(struct aps_zap *z, uint64_t now)
{
	const char *ip;
	uint32_t n;

	if (!aps_zap_may_judge(z->bridge, now))
		return;
	for (size_t i = 0; (ip = aps_admission_over(&z->bridge->admission, &i, &n, now)) != NULL;)
		consider(z->bridge, ip, n, now);
}

/* At each handshake: its address is judged, and let in again if a worker of
 * it has joined since it was turned away (that worker must be able to come
 * back after a blip). */
static void judge(struct aps_zap *z, const char *ip, uint64_t now)
{
	struct aps_zbridge *b = z->bridge;
	uint32_t n;

	if (ip[0] == '\0')
		return;
	if (aps_admission_away(&b->admission, ip, now)) {
		if (aps_admission_check_due(&b->admission, ip, now) &&
		    aps_conns_joined_from(&b->conns, ip))
			aps_admission_forgive(&b->admission, ip, now);
		return;
	}
	n = aps_admission_unspoken(&b->admission, ip, now);
	if (n > b->admission.limit && aps_zap_may_judge(b, now) &&
	    aps_admission_check_due(&b->admission, ip, now))
		consider(b, ip, n, now);
}

static void answer(struct aps_zap *z, zmq_msg_t *f, size_t n)
{
	char ip[INET6_ADDRSTRLEN] = "";
	size_t ip_len = n > 3 ? zmq_msg_size(&f[3]) : 0;
	bool curve = n == ZAP_FRAMES && zmq_msg_size(&f[5]) == 5 &&
	             memcmp(zmq_msg_data(&f[5]), "CURVE", 5) == 0 &&
	             zmq_msg_size(&f[6]) == KEY_BYTES;
	const char *refusal = NULL;

	if (ip_len < sizeof(ip))
		memcpy(ip, zmq_msg_data(&f[3]), ip_len);
	if (outside(z, ip)) {
		if (n >= 2)
			reply(z->sock, &f[1], NULL, "address not allowed");
		return;
	}
	judge(z, ip, uv_now(z->loop));
	if (ip[0] != '\0' && !aps_admission_allows(&z->bridge->admission, ip, uv_now(z->loop))) {
		refusal = "address turned away";
		aps_log_debug("zap", "refused a handshake address=%s reason=\"turned away\"", ip);
	} else if (z->curve && !(curve && allowed(z, zmq_msg_data(&f[6])))) {
		refusal = "key not allowed";
		z->refused++;
		aps_log_warn("zap", "refused a worker address=%s reason=\"%s\"", ip,
		             curve ? "its key is not allowed" : "not a CURVE handshake");
	} else if (z->curve) {
		z->accepted++;
	}
	if (refusal == NULL && ip[0] != '\0')
		aps_admission_handshake(&z->bridge->admission, ip, uv_now(z->loop));
	if (n >= 2)
		reply(z->sock, &f[1], curve ? zmq_msg_data(&f[6]) : NULL, refusal);
}

static void on_ready(uv_poll_t *h, int status, int events)
{
	struct aps_zap *z = h->data;
	zmq_msg_t frames[ZAP_FRAMES];
	size_t n;

	(void)status;
	(void)events;
	for (;;) {
		int ev = 0;
		size_t len = sizeof(ev);
		if (zmq_getsockopt(z->sock, ZMQ_EVENTS, &ev, &len) < 0 || !(ev & ZMQ_POLLIN))
			return;
		if (!read_request(z->sock, frames, &n))
			return;
		answer(z, frames, n);
		for (size_t i = 0; i < n; i++)
			zmq_msg_close(&frames[i]);
	}
}

static int decode_keys(struct aps_zap *z, const char *const *allow, size_t n)
{
	z->keys = calloc(n ? n : 1, KEY_BYTES);
	if (z->keys == NULL)
		return APS_ENOMEM;
	for (size_t i = 0; i < n; i++) {
		if (strlen(allow[i]) != 40 || zmq_z85_decode(z->keys[i], allow[i]) == NULL)
			return APS_EINVAL;
	}
	z->n_keys = n;
	return 0;
}

int aps_zap_start(struct aps_zap **out, void *zctx, uv_loop_t *loop, struct aps_zbridge *bridge,
                  bool curve, const char *const *allow, size_t n)
{
	struct aps_zap *z = calloc(1, sizeof(*z));
	int fd, ret, linger = 0;
	size_t len = sizeof(fd);

	if (z == NULL)
		return APS_ENOMEM;
	z->loop = loop;
	z->bridge = bridge;
	z->curve = curve;
	ret = decode_keys(z, allow, n);
	z->sock = ret == 0 ? zmq_socket(zctx, ZMQ_REP) : NULL;
	if (ret == 0 && (z->sock == NULL || zmq_bind(z->sock, "inproc://zeromq.zap.01") < 0 ||
	                 zmq_getsockopt(z->sock, ZMQ_FD, &fd, &len) < 0))
		ret = APS_ECONN;
	if (ret < 0) {
		if (z->sock != NULL)
			zmq_close(z->sock);
		free(z->keys);
		free(z);
		return ret;
	}
	zmq_setsockopt(z->sock, ZMQ_LINGER, &linger, sizeof(linger));
	uv_poll_init(loop, &z->poll, fd);
	z->poll.data = z;
	uv_poll_start(&z->poll, UV_READABLE, on_ready);
	*out = z;
	return 0;
}

static void on_closed(uv_handle_t *h)
{
	struct aps_zap *z = h->data;

	free(z->keys);
	free(z);
}

void aps_zap_stop(struct aps_zap *z)
{
	if (z == NULL)
		return;
	uv_poll_stop(&z->poll); /* before its fd goes away with the socket */
	zmq_close(z->sock);
	uv_close((uv_handle_t *)&z->poll, on_closed);
}

void aps_zap_counts(const struct aps_zap *z, uint64_t *accepted, uint64_t *refused,
                    uint64_t *not_allowed)
{
	*accepted = z != NULL ? z->accepted : 0;
	*refused = z != NULL ? z->refused : 0;
	*not_allowed = z != NULL ? z->not_allowed : 0;
}
