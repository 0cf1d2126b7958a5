/*
 * libFuzzer harness of whole daemon connections (docs/FUZZING.md): the real
 * server (server.c and all under it: the ZeroMQ bridge, connections, sessions,
 * jobs, rounds) serves an ipc endpoint on a libuv loop in this process, and
 * each input is played by up to three peers as a sequence of messages, so
 * that the fuzzer reaches states one message cannot: joined sessions,
 * registered tensors, rounds half full, resumes, peers that leave mid-round.
 *
 * Input: byte 0 says how many peers (1 + b % 3) and, in bit 7, whether they
 * share one routing id (the takeover case). Then records:
 *   u8 peer (mod the count), u8 flags, u16 header length, header,
 *   and with flags bit 0 a u16 payload length and the payload;
 *   flags bit 1 closes that peer after the record (it speaks no more).
 * All lengths little-endian; a record cut short by the input's end is
 * dropped. After the records the loop runs until the daemon has been quiet
 * for a few milliseconds, then the peers close.
 *
 * The rule checked (beyond ASan and UBSan): every message the daemon sends
 * passes the validator a worker runs on the daemon's messages.
 */
#include "common/log.h"
#include "common/scale.h"
#include "proto/validate.h"
#include "server/server.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <uv.h>
#include <zmq.h>

#define MAX_PEERS  3
#define QUIET_MS   4  /* the daemon said nothing for this long: the input is played */
#define PLAY_MS    60 /* at most, per input */
#define CHUNK_ELEM 64

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static uv_loop_t loop;
static struct aps_server *srv;
static void *zctx;
static char endpoint[96];
static struct aps_msg_limits from_daemon;

static void broken(const char *rule)
{
	fprintf(stderr, "broken rule: %s\n", rule);
	abort();
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	struct aps_server_opts o = {
		.endpoint = endpoint,
		.downlink = "auto",
		.heartbeat_ms = 1000,
		.heartbeat_timeout_ms = 600000,
		.reconnect_grace_ms = 20,
		.max_message_bytes = 1 << 20,
		.drain_batch = 256,
		.max_jobs = 16,
		.max_ranks = 8,
		.max_tensors = 16,
		.max_job_bytes = 1 << 20,
		.max_total_bytes = 8 << 20,
		.max_connections = 64,
		.join_timeout_ms = 600000,
		.scaling = APS_SCALING_LOCAL,
		.chunk_elems = CHUNK_ELEM,
		.summary = "fuzz",
	};

	(void)argc;
	(void)argv;
	aps_log_set_level(APS_LOG_ERROR);
	snprintf(endpoint, sizeof(endpoint), "ipc:///tmp/apsd-fuzz-%d.sock", (int)getpid());
	uv_loop_init(&loop);
	if (aps_server_new(&srv, &loop, &o) < 0)
		broken("the server starts");
	zctx = zmq_ctx_new();
	aps_msg_limits_init(&from_daemon);
	from_daemon.from_server = true;
	return 0;
}

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads every reply waiting for peer; true when there was one. */
static bool read_replies(void *peer)
{
	bool any = false;

	for (;;) {
		zmq_msg_t part[2];
		int n = 0, more = 1;
		while (more) {
			zmq_msg_t extra, *m = n < 2 ? &part[n] : &extra;
			zmq_msg_init(m);
			if (zmq_msg_recv(m, peer, n ? 0 : ZMQ_DONTWAIT) < 0) {
				zmq_msg_close(m);
				return any;
			}
			more = zmq_msg_more(m);
			if (m == &extra)
				zmq_msg_close(m);
			else
				n++;
		}
		struct aps_msg msg;
		struct aps_msg_fault fault;
		if (n < 1 ||
		    aps_msg_parse(&from_daemon, zmq_msg_data(&part[0]), zmq_msg_size(&part[0]),
		                  n > 1 ? zmq_msg_data(&part[1]) : NULL,
		                  n > 1 ? zmq_msg_size(&part[1]) : 0, n > 1, &msg, &fault) != 0) {
			fprintf(stderr, "daemon sent: %s\n", n >= 1 ? fault.text : "no frame");
			broken("every message the daemon sends passes a worker's validator");
		}
		for (int i = 0; i < n; i++)
			zmq_msg_close(&part[i]);
		any = true;
	}
}

/* Runs the daemon until it has been quiet for QUIET_MS (at most PLAY_MS). */
static void play(void **peers, int n)
{
	int64_t start = now_ms(), last = start;

	while (now_ms() - last < QUIET_MS && now_ms() - start < PLAY_MS) {
		uv_run(&loop, UV_RUN_NOWAIT);
		for (int i = 0; i < n; i++) {
			if (peers[i] != NULL && read_replies(peers[i]))
				last = now_ms();
		}
		usleep(200);
	}
}

static void *open_peer(const uint8_t *id, size_t id_len)
{
	void *s = zmq_socket(zctx, ZMQ_DEALER);
	int zero = 0;

	zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero));
	if (id_len > 0)
		zmq_setsockopt(s, ZMQ_ROUTING_ID, id, id_len);
	zmq_connect(s, endpoint);
	return s;
}

static uint16_t u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

/* Sends the records of data to the peers. */
static void send_records(void **peers, int n, const uint8_t *data, size_t size)
{
	size_t pos = 0;

	while (pos + 4 <= size) {
		int who = data[pos] % n, flags = data[pos + 1];
		size_t hdr_len = u16(data + pos + 2), payload_len = 0;
		const uint8_t *hdr = data + pos + 4, *payload = NULL;
		if (pos + 4 + hdr_len > size)
			return;
		pos += 4 + hdr_len;
		if (flags & 1) {
			if (pos + 2 > size || pos + 2 + u16(data + pos) > size)
				return;
			payload_len = u16(data + pos);
			payload = data + pos + 2;
			pos += 2 + payload_len;
		}
		if (peers[who] == NULL)
			continue;
		zmq_send(peers[who], hdr, hdr_len, ZMQ_DONTWAIT | (payload ? ZMQ_SNDMORE : 0));
		if (payload != NULL)
			zmq_send(peers[who], payload, payload_len, ZMQ_DONTWAIT);
		if (flags & 2) {
			play(peers, n);
			zmq_close(peers[who]);
			peers[who] = NULL;
		}
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static unsigned serial;
	void *peers[MAX_PEERS] = { NULL };
	uint8_t id[16];
	int n;

	if (size < 1)
		return 0;
	n = 1 + data[0] % MAX_PEERS;
	for (int i = 0; i < n; i++) {
		/* Ids of their own, unless the input asks the peers to share one. */
		int k = (data[0] & 0x80) ? 0 : i;
		snprintf((char *)id, sizeof(id), "%c%05u-%d-fuzz", 0x80 | k, serial % 100000, k);
		peers[i] = open_peer(id, sizeof(id) - 1);
	}
	serial++;
	send_records(peers, n, data + 1, size - 1);
	play(peers, n);
	for (int i = 0; i < n; i++) {
		if (peers[i] != NULL)
			zmq_close(peers[i]);
	}
	play(peers, 0); /* the daemon sees the connections close */
	return 0;
}
