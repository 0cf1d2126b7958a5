/*
 * Unit tests of the connection table (server/conns.h) on real descriptors:
 * each "connection" is a socketpair, one end playing ZeroMQ's descriptor and
 * the other the peer. Ids, deadlines, the limit, the cause of a close, stuck
 * and parked connections, and a descriptor ZeroMQ closed without a word.
 */
#include "common/err.h"
#include "server/conns.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

struct pair {
	int zmq, peer; /* ZeroMQ's end, the peer's end */
};

static struct pair open_pair(void)
{
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
	return (struct pair){ sv[0], sv[1] };
}

/* The peer reads end-of-file: the connection was shut down. */
static bool peer_sees_eof(int peer)
{
	char c;

	return recv(peer, &c, 1, MSG_DONTWAIT) == 0;
}

static uint64_t closed_count(struct aps_conns *t)
{
	size_t n;
	uint64_t *ids = aps_conns_take_closed(t, &n);

	free(ids);
	return n;
}

static void test_conns_ids_tell_connections_on_one_descriptor_apart(void **state)
{
	struct aps_conns t;
	struct pair p = open_pair();
	uint64_t first, second;
	size_t n;
	uint64_t *ids;

	(void)state;
	aps_conns_init(&t, 8, 1000);
	assert_int_equal(aps_conns_accepted(&t, p.zmq, 1), 0);
	first = aps_conns_id(&t, p.zmq);
	assert_int_equal(first, (1ull << 32) | (uint64_t)(p.zmq + 1));
	close(p.peer);
	assert_int_equal(aps_conns_closed(&t, p.zmq, NULL), APS_CONN_PEER);
	assert_int_equal(aps_conns_id(&t, p.zmq), first); /* late messages still map */
	assert_int_equal(aps_conns_accepted(&t, p.zmq, 2), 0);
	second = aps_conns_id(&t, p.zmq);
	assert_int_not_equal(second, first);
	assert_null(aps_conns_find(&t, first));
	assert_non_null(aps_conns_find(&t, second));
	ids = aps_conns_take_closed(&t, &n);
	assert_int_equal(n, 1);
	assert_int_equal(ids[0], first);
	free(ids);
	assert_int_equal(aps_conns_closed(&t, 9999, NULL), -1);
	aps_conns_free(&t);
	close(p.zmq);
}

static void test_conns_drop_those_not_admitted_in_time(void **state)
{
	struct aps_conns t;
	struct pair a = open_pair(), b = open_pair();

	(void)state;
	aps_conns_init(&t, 8, 100);
	aps_conns_accepted(&t, a.zmq, 1000);
	aps_conns_accepted(&t, b.zmq, 1000);
	aps_conns_admit(&t, aps_conns_id(&t, b.zmq), true, 1010);
	aps_conns_tick(&t, 1050);
	assert_false(peer_sees_eof(a.peer));
	aps_conns_tick(&t, 1100);
	assert_true(peer_sees_eof(a.peer));
	assert_false(peer_sees_eof(b.peer));
	assert_int_equal(t.cnt.unjoined_dropped, 1);
	/* its session left: the deadline runs again from then */
	aps_conns_admit(&t, aps_conns_id(&t, b.zmq), false, 2000);
	aps_conns_tick(&t, 2099);
	assert_false(peer_sees_eof(b.peer));
	aps_conns_tick(&t, 2100);
	assert_true(peer_sees_eof(b.peer));
	assert_int_equal(aps_conns_closed(&t, a.zmq, NULL), APS_CONN_DROPPED);
	aps_conns_free(&t);
	close(a.zmq);
	close(a.peer);
	close(b.zmq);
	close(b.peer);
}

static void test_conns_shut_the_one_over_the_limit(void **state)
{
	struct aps_conns t;
	struct pair a = open_pair(), b = open_pair();

	(void)state;
	aps_conns_init(&t, 1, 60000);
	assert_int_equal(aps_conns_accepted(&t, a.zmq, 1), 0);
	assert_int_equal(aps_conns_accepted(&t, b.zmq, 1), APS_EBUSY);
	assert_true(peer_sees_eof(b.peer));
	assert_false(peer_sees_eof(a.peer));
	assert_int_equal(t.cnt.refused, 1);
	assert_int_equal(t.live, 2); /* until ZeroMQ reports its close */
	assert_int_equal(aps_conns_closed(&t, b.zmq, NULL), APS_CONN_DROPPED);
	assert_int_equal(t.live, 1);
	aps_conns_free(&t);
	close(a.zmq);
	close(a.peer);
	close(b.zmq);
	close(b.peer);
}

static void test_conns_tell_who_closed(void **state)
{
	struct aps_conns t;
	struct aps_peer who = { .len = 1, .id = { 7 } };
	struct pair a = open_pair(), b = open_pair(), c = open_pair();
	const char *address = NULL;

	(void)state;
	aps_conns_init(&t, 8, 60000);
	aps_conns_accepted(&t, a.zmq, 1);
	aps_conns_accepted(&t, b.zmq, 1);
	aps_conns_accepted(&t, c.zmq, 1);
	aps_conns_delivered(&t, aps_conns_id(&t, b.zmq), &who, 2);
	close(a.peer); /* the peer hung up */
	assert_int_equal(aps_conns_closed(&t, a.zmq, &address), APS_CONN_PEER);
	assert_string_equal(address, "local");
	/* b's peer is still there: ZeroMQ closed it (an oversized frame) */
	assert_int_equal(aps_conns_closed(&t, b.zmq, NULL), APS_CONN_ZMTP);
	assert_int_equal(t.cnt.zmtp_refused, 1);
	/* c never delivered a message and a handshake failed: that was it */
	aps_conns_handshake_failed(&t);
	assert_int_equal(aps_conns_closed(&t, c.zmq, NULL), APS_CONN_HANDSHAKE);
	assert_int_equal(closed_count(&t), 3);
	aps_conns_free(&t);
	close(a.zmq);
	close(b.zmq);
	close(b.peer);
	close(c.zmq);
	close(c.peer);
}

static void test_conns_find_the_stuck_ones(void **state)
{
	struct aps_conns t;
	struct aps_peer who = { .len = 1, .id = { 1 } };
	struct pair a = open_pair(), b = open_pair();

	(void)state;
	aps_conns_init(&t, 8, 600000);
	aps_conns_accepted(&t, a.zmq, 1);
	aps_conns_accepted(&t, b.zmq, 1);
	/* a: bytes wait unread while it delivers nothing (ZeroMQ stopped reading) */
	assert_int_equal(write(a.peer, "xyz", 3), 3);
	assert_int_equal(aps_conns_tick(&t, 10), 0);
	assert_int_equal(aps_conns_tick(&t, 10 + APS_CONNS_STUCK_MS - 1), 0);
	assert_int_equal(aps_conns_tick(&t, 10 + APS_CONNS_STUCK_MS), 1);
	/* b: its peer hung up long ago and ZeroMQ never said it closed */
	close(b.peer);
	assert_int_equal(aps_conns_tick(&t, 5000), 1);
	assert_int_equal(aps_conns_tick(&t, 5000 + APS_CONNS_STUCK_MS), 2);
	/* a delivers: it was only slow, not stuck */
	aps_conns_delivered(&t, aps_conns_id(&t, a.zmq), &who, 2);
	assert_int_equal(aps_conns_tick(&t, 9000), 1);
	aps_conns_free(&t);
	close(a.zmq);
	close(a.peer);
	close(b.zmq);
}

/* A TCP connection on loopback: its accepted end plays ZeroMQ's descriptor. */
static struct pair open_tcp_pair(void)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(a);
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct pair p;

	assert_int_equal(bind(l, (struct sockaddr *)&a, sizeof(a)), 0);
	assert_int_equal(listen(l, 1), 0);
	assert_int_equal(getsockname(l, (struct sockaddr *)&a, &len), 0);
	p.peer = socket(AF_INET, SOCK_STREAM, 0);
	assert_int_equal(connect(p.peer, (struct sockaddr *)&a, sizeof(a)), 0);
	p.zmq = accept(l, NULL, NULL);
	assert_true(p.zmq >= 0);
	close(l);
	return p;
}

/* What a parked connection may hold is what ZeroMQ read of it, not what waits unread. */
static void test_conns_parked_bytes_are_what_was_read(void **state)
{
	struct aps_conns t;
	struct pair p = open_tcp_pair();
	char buf[5000] = { 0 };
	const char *address = NULL;

	(void)state;
	aps_conns_init(&t, 8, 600000);
	aps_conns_accepted(&t, p.zmq, 1);
	aps_conns_handshake_succeeded(&t);
	assert_int_equal(send(p.peer, buf, sizeof(buf), 0), (ssize_t)sizeof(buf));
	for (size_t got = 0; got < 3000;) {
		ssize_t n = recv(p.zmq, buf, 3000 - got, 0);
		assert_true(n > 0);
		got += (size_t)n;
	}
	close(p.peer);
	usleep(20000);
	assert_int_equal(aps_conns_closed(&t, p.zmq, &address), APS_CONN_PEER);
	assert_true(strncmp(address, "127.0.0.1:", 10) == 0);
	assert_true(aps_conns_joined_from(&t, "127.0.0.1") == false);
	/* TCP counts the peer's FIN as one byte received. */
	assert_in_range(aps_conns_parked_bytes(&t), APS_CONNS_PARKED_BYTES + 3000,
	                APS_CONNS_PARKED_BYTES + 3001);
	aps_conns_free(&t);
	close(p.zmq);
}

/* A connection that reads on and delivers nothing is dropped past the bound. */
static void test_conns_drop_a_message_without_end(void **state)
{
	struct aps_conns t;
	struct aps_peer who = { .len = 1, .id = { 3 } };
	struct pair p = open_tcp_pair();
	char buf[4000] = { 0 };

	(void)state;
	aps_conns_init(&t, 8, 600000);
	t.max_unfinished_bytes = 1000;
	aps_conns_accepted(&t, p.zmq, 1);
	aps_conns_admit(&t, aps_conns_id(&t, p.zmq), true, 1);
	aps_conns_tick(&t, 2); /* the mark: nothing read */
	assert_int_equal(send(p.peer, buf, 1500, 0), 1500);
	assert_int_equal(recv(p.zmq, buf, 1500, MSG_WAITALL), 1500);
	aps_conns_delivered(&t, aps_conns_id(&t, p.zmq), &who, 2); /* a message came of it */
	aps_conns_tick(&t, 3);
	assert_int_equal(t.cnt.unfinished, 0);
	assert_int_equal(send(p.peer, buf, 900, 0), 900); /* under the bound */
	assert_int_equal(recv(p.zmq, buf, 900, MSG_WAITALL), 900);
	aps_conns_tick(&t, 4);
	assert_int_equal(t.cnt.unfinished, 0);
	assert_int_equal(send(p.peer, buf, 200, 0), 200); /* 1100 since the last message */
	assert_int_equal(recv(p.zmq, buf, 200, MSG_WAITALL), 200);
	aps_conns_tick(&t, 5);
	assert_int_equal(t.cnt.unfinished, 1);
	assert_true(peer_sees_eof(p.peer));
	aps_conns_free(&t);
	close(p.zmq);
	close(p.peer);
}

static void test_conns_count_parked_connections(void **state)
{
	struct aps_conns t;
	struct aps_peer who = { .len = 1, .id = { 2 } };
	struct pair p[3];

	(void)state;
	aps_conns_init(&t, 8, 600000);
	for (int i = 0; i < 3; i++) {
		p[i] = open_pair();
		aps_conns_accepted(&t, p[i].zmq, 1);
		aps_conns_handshake_succeeded(&t);
	}
	aps_conns_delivered(&t, aps_conns_id(&t, p[0].zmq), &who, 2);
	assert_int_equal(aps_conns_parked(&t), 0); /* the quiet ones may still speak */
	for (int i = 1; i < 3; i++) {
		close(p[i].peer);
		aps_conns_closed(&t, p[i].zmq, NULL);
	}
	assert_int_equal(aps_conns_parked(&t), 2); /* closed without a word: parked */
	/* A socketpair says nothing of what was read: 1 MiB is counted for each. */
	assert_int_equal(aps_conns_parked_bytes(&t), 2 * (APS_CONNS_PARKED_BYTES + (1u << 20)));
	aps_conns_forget_all(&t);
	assert_int_equal(aps_conns_parked(&t), 0);
	assert_int_equal(aps_conns_parked_bytes(&t), 0);
	assert_int_equal(t.live, 0);
	assert_int_equal(closed_count(&t), 3);
	aps_conns_free(&t);
	for (int i = 0; i < 3; i++)
		close(p[i].zmq);
	close(p[0].peer);
}

static void test_conns_notice_a_descriptor_closed_without_a_word(void **state)
{
	struct aps_conns t;
	struct pair p = open_pair();

	(void)state;
	aps_conns_init(&t, 8, 600000);
	aps_conns_accepted(&t, p.zmq, 1);
	close(p.zmq); /* ZeroMQ closed its descriptor and said nothing */
	/* each connection is looked at every 8 ticks (2 s): two fstat each */
	for (uint64_t tick = 0; tick < 8 && t.live > 0; tick++)
		aps_conns_tick(&t, 2 + tick);
	assert_int_equal(t.live, 0);
	assert_int_equal(closed_count(&t), 1);
	/* apsd's duplicate was the socket's last reference: the peer sees the end */
	assert_true(peer_sees_eof(p.peer));
	aps_conns_free(&t);
	close(p.peer);
}

static void test_conns_drop_every_connection_of_a_peer(void **state)
{
	struct aps_conns t;
	struct aps_peer slow = { .len = 2, .id = { 9, 9 } }, other = { .len = 1, .id = { 3 } };
	struct pair a = open_pair(), b = open_pair();

	(void)state;
	aps_conns_init(&t, 8, 600000);
	aps_conns_accepted(&t, a.zmq, 1);
	aps_conns_accepted(&t, b.zmq, 1);
	aps_conns_delivered(&t, aps_conns_id(&t, a.zmq), &slow, 2);
	aps_conns_delivered(&t, aps_conns_id(&t, b.zmq), &other, 2);
	assert_int_equal(aps_conns_drop_peer(&t, &slow, 5), 1);
	assert_true(peer_sees_eof(a.peer));
	assert_false(peer_sees_eof(b.peer));
	assert_int_equal(aps_conns_drop(&t, 12345, 5), APS_EINVAL);
	aps_conns_free(&t);
	close(a.zmq);
	close(a.peer);
	close(b.zmq);
	close(b.peer);
}

static void test_addrs_count_an_ipv6_slash_64_as_one_address(void **state)
{
	struct aps_addrs a = { 0 };
	struct aps_addrs_entry *net;
	char ip[32];

	(void)state;
	assert_int_equal((net = aps_addrs_open(&a, "2001:db8::1"))->open, 1);
	assert_int_equal(aps_addrs_open(&a, "2001:db8::ffff:2")->open, 2); /* the same /64 */
	assert_int_equal(aps_addrs_open(&a, "2001:db8:0:1::1")->open, 1);  /* the next /64 */
	assert_int_equal(aps_addrs_open(&a, "::ffff:10.0.0.1")->open, 1);
	assert_int_equal(aps_addrs_open(&a, "::ffff:10.0.0.2")->open, 1); /* v4: as it is */
	/* link-local, with its interface: one /64 (a stranger picked one per job before) */
	assert_int_equal(aps_addrs_open(&a, "fe80::1%eth0")->open, 1);
	assert_int_equal(aps_addrs_open(&a, "fe80::2:3%eth0")->open, 2);
	aps_addrs_join(net, 1);
	assert_int_equal(aps_addrs_find(&a, "2001:db8::7")->joined, 1);
	aps_addrs_close(&a, net, true);
	assert_int_equal(aps_addrs_find(&a, "2001:db8::1")->open, 1);
	assert_int_equal(aps_addrs_find(&a, "2001:db8::1")->joined, 0);
	aps_addrs_close(&a, net, false);
	assert_null(aps_addrs_find(&a, "2001:db8::1")); /* freed with its last */
	for (int i = 0; i < 1000; i++) {                /* grows past its first buckets */
		snprintf(ip, sizeof(ip), "10.1.%d.%d", i / 256, i % 256);
		assert_int_equal(aps_addrs_open(&a, ip)->open, 1);
	}
	assert_int_equal(a.n, 1004);
	assert_int_equal(aps_addrs_find(&a, "10.1.3.231")->open, 1);
	aps_addrs_free(&a);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_conns_ids_tell_connections_on_one_descriptor_apart),
		cmocka_unit_test(test_conns_drop_those_not_admitted_in_time),
		cmocka_unit_test(test_conns_shut_the_one_over_the_limit),
		cmocka_unit_test(test_conns_tell_who_closed),
		cmocka_unit_test(test_conns_find_the_stuck_ones),
		cmocka_unit_test(test_conns_count_parked_connections),
		cmocka_unit_test(test_conns_parked_bytes_are_what_was_read),
		cmocka_unit_test(test_conns_drop_a_message_without_end),
		cmocka_unit_test(test_conns_notice_a_descriptor_closed_without_a_word),
		cmocka_unit_test(test_conns_drop_every_connection_of_a_peer),
		cmocka_unit_test(test_addrs_count_an_ipv6_slash_64_as_one_address),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
