/*
 * Unit tests of the sd_notify sender (server/notify.h) against a real AF_UNIX
 * datagram listener made here, bound to a path in a temporary directory or to
 * an abstract name: each message arrives exactly, from this process, and
 * nothing else does; WATCHDOG_USEC/WATCHDOG_PID parsing; malformed variables;
 * a full or missing listener is an error, never a block or a crash; without
 * NOTIFY_SOCKET every call is a no-op. Datagrams are queued by the time
 * sendto returns, so the listener reads with MSG_DONTWAIT and never sleeps.
 */
#include "common/err.h"
#include "server/notify.h"

#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

struct listener {
	int fd;
	char dir[64];   /* temporary directory of a path socket, "" for abstract */
	char name[108]; /* what NOTIFY_SOCKET says */
};

static struct listener lis;

static int setup(void **state)
{
	(void)state;
	unsetenv("NOTIFY_SOCKET");
	unsetenv("WATCHDOG_USEC");
	unsetenv("WATCHDOG_PID");
	lis = (struct listener){ .fd = -1 };
	return 0;
}

static int teardown(void **state)
{
	char path[128];

	(void)state;
	if (lis.fd >= 0)
		close(lis.fd);
	if (lis.dir[0] != '\0') {
		snprintf(path, sizeof(path), "%s/notify.sock", lis.dir);
		unlink(path);
		rmdir(lis.dir);
	}
	return 0;
}

/* Binds the listener (a path, or an abstract name) and points NOTIFY_SOCKET at it. */
static void listen_on(bool abstract)
{
	static unsigned serial;
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	socklen_t len;
	int one = 1;

	if (abstract) {
		snprintf(lis.name, sizeof(lis.name), "@test_notify-%d-%u", (int)getpid(), serial++);
	} else {
		snprintf(lis.dir, sizeof(lis.dir), "/tmp/test_notify.XXXXXX");
		assert_non_null(mkdtemp(lis.dir));
		snprintf(lis.name, sizeof(lis.name), "%s/notify.sock", lis.dir);
	}
	memcpy(addr.sun_path, lis.name, strlen(lis.name));
	if (abstract)
		addr.sun_path[0] = '\0';
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(lis.name));
	lis.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	assert_true(lis.fd >= 0);
	assert_int_equal(setsockopt(lis.fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)), 0);
	assert_int_equal(bind(lis.fd, (struct sockaddr *)&addr, len), 0);
	assert_int_equal(setenv("NOTIFY_SOCKET", lis.name, 1), 0);
}

/* Reads one queued datagram as a string; fails if none is queued. */
static void receive(char *buf, size_t size, pid_t *sender)
{
	union {
		struct cmsghdr align;
		char buf[CMSG_SPACE(sizeof(struct ucred))];
	} control;
	struct iovec iov = { .iov_base = buf, .iov_len = size - 1 };
	struct msghdr msg = { .msg_iov = &iov,
		              .msg_iovlen = 1,
		              .msg_control = control.buf,
		              .msg_controllen = sizeof(control.buf) };
	ssize_t got = recvmsg(lis.fd, &msg, MSG_DONTWAIT);
	struct cmsghdr *c = CMSG_FIRSTHDR(&msg);

	assert_true(got >= 0);
	buf[got] = '\0';
	assert_non_null(c);
	assert_int_equal(c->cmsg_type, SCM_CREDENTIALS);
	if (sender != NULL)
		*sender = ((const struct ucred *)(const void *)CMSG_DATA(c))->pid;
}

static void expect_message(const char *want)
{
	char buf[1024];

	receive(buf, sizeof(buf), NULL);
	assert_string_equal(buf, want);
}

static void expect_nothing_queued(void)
{
	char buf[16];

	assert_int_equal(recv(lis.fd, buf, sizeof(buf), MSG_DONTWAIT), -1);
	assert_int_equal(errno, EAGAIN);
}

static void check_every_message(void)
{
	struct aps_notify n;
	char buf[1024];
	unsigned long long usec;
	char tail;

	assert_int_equal(aps_notify_init(&n), 0);
	assert_true(aps_notify_enabled(&n));
	assert_int_equal(aps_notify_ready(&n), 0);
	expect_message("READY=1");
	assert_int_equal(aps_notify_status(&n, "serving %s jobs=%d", "tcp://127.0.0.1:5555", 3), 0);
	expect_message("STATUS=serving tcp://127.0.0.1:5555 jobs=3");
	assert_int_equal(aps_notify_watchdog(&n), 0);
	expect_message("WATCHDOG=1");
	assert_int_equal(aps_notify_reloading(&n), 0);
	receive(buf, sizeof(buf), NULL);
	assert_int_equal(sscanf(buf, "RELOADING=1\nMONOTONIC_USEC=%llu%c", &usec, &tail), 1);
	assert_true(usec > 0);
	assert_int_equal(aps_notify_stopping(&n), 0);
	expect_message("STOPPING=1");
	expect_nothing_queued();
	aps_notify_close(&n);
}

static void test_notify_path_socket_gets_each_message(void **state)
{
	(void)state;
	listen_on(false);
	check_every_message();
}

static void test_notify_abstract_socket_gets_each_message(void **state)
{
	(void)state;
	listen_on(true);
	check_every_message();
}

/* systemd accepts notifications from the main PID only (NotifyAccess=main). */
static void test_notify_sender_is_this_process(void **state)
{
	struct aps_notify n;
	char buf[64];
	pid_t sender = 0;

	(void)state;
	listen_on(true);
	aps_notify_init(&n);
	assert_int_equal(aps_notify_ready(&n), 0);
	receive(buf, sizeof(buf), &sender);
	assert_int_equal(sender, getpid());
	aps_notify_close(&n);
}

static void test_notify_status_is_one_line_and_bounded(void **state)
{
	struct aps_notify n;
	static char big[APS_NOTIFY_STATUS_MAX * 2 + 1];
	static char buf[APS_NOTIFY_STATUS_MAX * 4];

	(void)state;
	listen_on(false);
	aps_notify_init(&n);
	assert_int_equal(aps_notify_status(&n, "jobs=%d\nworkers=%d\n", 1, 4), 0);
	expect_message("STATUS=jobs=1 workers=4 ");
	memset(big, 'x', sizeof(big) - 1);
	assert_int_equal(aps_notify_status(&n, "%s", big), 0);
	receive(buf, sizeof(buf), NULL);
	assert_int_equal(strlen(buf), strlen("STATUS=") + APS_NOTIFY_STATUS_MAX);
	assert_int_equal(strncmp(buf, "STATUS=", 7), 0);
	assert_int_equal(strspn(buf + 7, "x"), APS_NOTIFY_STATUS_MAX);
	assert_int_equal(aps_notify_status(&n, "%s", ""), 0);
	expect_message("STATUS=");
	aps_notify_close(&n);
}

static void test_notify_without_socket_every_call_is_a_noop(void **state)
{
	struct aps_notify n;

	(void)state;
	setenv("WATCHDOG_USEC", "2000000", 1); /* no socket to ping: no watchdog */
	assert_int_equal(aps_notify_init(&n), 0);
	assert_false(aps_notify_enabled(&n));
	assert_int_equal(aps_notify_ready(&n), 0);
	assert_int_equal(aps_notify_status(&n, "jobs=%d", 1), 0);
	assert_int_equal(aps_notify_watchdog(&n), 0);
	assert_int_equal(aps_notify_reloading(&n), 0);
	assert_int_equal(aps_notify_stopping(&n), 0);
	assert_int_equal(n.sys_errno, 0);
	aps_notify_close(&n);
	aps_notify_close(&n);
}

static int init_with_watchdog(const char *usec, const char *pid)
{
	struct aps_notify n;
	int ret;

	setenv("WATCHDOG_USEC", usec, 1);
	if (pid != NULL)
		setenv("WATCHDOG_PID", pid, 1);
	else
		unsetenv("WATCHDOG_PID");
	ret = aps_notify_init(&n);
	assert_true(aps_notify_enabled(&n)); /* the watchdog never turns notifications off */
	assert_int_equal(n.watchdog_usec, ret > 0 ? strtoull(usec, NULL, 10) : 0);
	aps_notify_close(&n);
	return ret;
}

static void test_notify_watchdog_interval_is_half_in_ms(void **state)
{
	(void)state;
	listen_on(true);
	assert_int_equal(init_with_watchdog("2000000", NULL), 1000);
	assert_int_equal(init_with_watchdog("30000000", NULL), 15000);
	assert_int_equal(init_with_watchdog("3001", NULL), 1);
	assert_int_equal(init_with_watchdog("1", NULL), 1); /* never 0: that means none */
	assert_int_equal(init_with_watchdog("18446744073709551614", NULL), 2147483647);
}

static void test_notify_watchdog_pid_of_another_process_means_no_watchdog(void **state)
{
	char self[32], parent[32];

	(void)state;
	listen_on(true);
	snprintf(self, sizeof(self), "%d", (int)getpid());
	snprintf(parent, sizeof(parent), "%d", (int)getppid());
	assert_int_equal(init_with_watchdog("2000000", self), 1000);
	assert_int_equal(init_with_watchdog("2000000", parent), 0);
}

static void test_notify_malformed_watchdog_keeps_notifications(void **state)
{
	static const char *const bad_usec[] = { "",
		                                "0",
		                                "-5",
		                                "+5",
		                                "1s",
		                                " 5",
		                                "5 ",
		                                "18446744073709551615",
		                                "99999999999999999999" };
	struct aps_notify n;

	(void)state;
	listen_on(false);
	for (size_t i = 0; i < sizeof(bad_usec) / sizeof(bad_usec[0]); i++)
		assert_int_equal(init_with_watchdog(bad_usec[i], NULL), APS_EINVAL);
	assert_int_equal(init_with_watchdog("2000000", "pid1"), APS_EINVAL);
	assert_int_equal(init_with_watchdog("2000000", "0"), APS_EINVAL);
	setenv("WATCHDOG_USEC", "0", 1);
	assert_int_equal(aps_notify_init(&n), APS_EINVAL);
	assert_int_equal(aps_notify_ready(&n), 0);
	expect_message("READY=1");
	aps_notify_close(&n);
}

static void test_notify_bad_socket_name_turns_notifications_off(void **state)
{
	static const char *const bad[] = { "", "@", "/", "relative/notify", "vsock:2:1234" };
	char too_long[200];
	struct aps_notify n;

	(void)state;
	setenv("WATCHDOG_USEC", "2000000", 1);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		setenv("NOTIFY_SOCKET", bad[i], 1);
		assert_int_equal(aps_notify_init(&n), APS_EINVAL);
		assert_false(aps_notify_enabled(&n));
		assert_int_equal(aps_notify_ready(&n), 0);
		assert_int_equal(aps_notify_watchdog(&n), 0);
		aps_notify_close(&n);
	}
	memset(too_long, 'a', sizeof(too_long) - 1);
	too_long[0] = '/';
	too_long[sizeof(too_long) - 1] = '\0';
	setenv("NOTIFY_SOCKET", too_long, 1);
	assert_int_equal(aps_notify_init(&n), APS_EINVAL);
	assert_false(aps_notify_enabled(&n));
	aps_notify_close(&n);
}

static void test_notify_missing_listener_is_an_error(void **state)
{
	struct aps_notify n;

	(void)state;
	setenv("NOTIFY_SOCKET", "/nonexistent/apsd-test/notify.sock", 1);
	assert_int_equal(aps_notify_init(&n), 0);
	assert_int_equal(aps_notify_ready(&n), APS_ESYS);
	assert_int_equal(n.sys_errno, ENOENT);
	assert_int_equal(aps_notify_status(&n, "still %s", "running"), APS_ESYS);
	aps_notify_close(&n);
}

/* A manager that reads nothing fills its queue: the sender gets APS_EBUSY at once. */
static void test_notify_full_listener_does_not_block(void **state)
{
	struct aps_notify n;
	int ret = 0, sent = 0;

	(void)state;
	listen_on(true);
	aps_notify_init(&n);
	while (ret == 0 && sent < 100000) {
		ret = aps_notify_watchdog(&n);
		sent += ret == 0;
	}
	assert_int_equal(ret, APS_EBUSY);
	assert_int_equal(n.sys_errno, EAGAIN);
	assert_true(sent > 0);
	expect_message("WATCHDOG=1"); /* the queue is intact */
	aps_notify_close(&n);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
		T(test_notify_path_socket_gets_each_message),
		T(test_notify_abstract_socket_gets_each_message),
		T(test_notify_sender_is_this_process),
		T(test_notify_status_is_one_line_and_bounded),
		T(test_notify_without_socket_every_call_is_a_noop),
		T(test_notify_watchdog_interval_is_half_in_ms),
		T(test_notify_watchdog_pid_of_another_process_means_no_watchdog),
		T(test_notify_malformed_watchdog_keeps_notifications),
		T(test_notify_bad_socket_name_turns_notifications_off),
		T(test_notify_missing_listener_is_an_error),
		T(test_notify_full_listener_does_not_block),
	};
#undef T
	return cmocka_run_group_tests_name("notify", tests, NULL, NULL);
}
