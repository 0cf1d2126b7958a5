/*
 * The service manager's notification protocol (sd_notify(3)) without
 * libsystemd: one-line "KEY=value" datagrams to the AF_UNIX socket named by
 * NOTIFY_SOCKET, and the watchdog interval from WATCHDOG_USEC/WATCHDOG_PID.
 * Without NOTIFY_SOCKET every call is a no-op that returns 0. No call ever
 * blocks or prints: errors are returned and the caller logs them.
 */
#ifndef APS_SERVER_NOTIFY_H
#define APS_SERVER_NOTIFY_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#define APS_NOTIFY_STATUS_MAX 512 /* bytes of STATUS= text; longer text is cut */

struct aps_notify {
	int fd;                  /* datagram socket, -1 when notifications are off */
	int sys_errno;           /* errno of the last failed system call, 0 if none */
	uint64_t watchdog_usec;  /* WATCHDOG_USEC meant for this process, 0 if none */
	socklen_t addr_len;      /* bytes of addr that name the socket */
	struct sockaddr_un addr; /* NOTIFY_SOCKET: a path, or an abstract name */
};

/*
 * Reads NOTIFY_SOCKET ("/path" or "@abstract"), WATCHDOG_USEC and
 * WATCHDOG_PID, and opens a non-blocking datagram socket. Returns the
 * interval in milliseconds at which to call aps_notify_watchdog (half of
 * WATCHDOG_USEC, at least 1), 0 when there is no watchdog for this process
 * (no socket, no WATCHDOG_USEC, or WATCHDOG_PID names another process), or:
 * APS_EINVAL: NOTIFY_SOCKET is not an absolute path or '@' name, or is too
 *   long (notifications off), or WATCHDOG_USEC/WATCHDOG_PID is not a positive
 *   decimal number (watchdog off, notifications on);
 * APS_ESYS: socket(2) failed (notifications off, n->sys_errno says why).
 * Whatever it returns, *n is ready for the calls below and for
 * aps_notify_close.
 */
int aps_notify_init(struct aps_notify *n);

/* True when NOTIFY_SOCKET was usable: the calls below send datagrams. */
bool aps_notify_enabled(const struct aps_notify *n);

/*
 * Each sends one datagram: "READY=1" (startup or a reload finished),
 * "STOPPING=1", "WATCHDOG=1", "RELOADING=1\nMONOTONIC_USEC=<now>" (a reload
 * started; READY=1 ends it). Return 0, or APS_EBUSY when the manager's queue
 * is full, or APS_ESYS when sendto(2) failed (n->sys_errno says why); the
 * daemon goes on either way.
 */
int aps_notify_ready(struct aps_notify *n);
int aps_notify_stopping(struct aps_notify *n);
int aps_notify_watchdog(struct aps_notify *n);
int aps_notify_reloading(struct aps_notify *n);

/*
 * Sends "STATUS=<text>", text formatted like printf, cut to
 * APS_NOTIFY_STATUS_MAX bytes, with newlines turned into spaces (one line for
 * systemctl status). Returns like aps_notify_ready.
 */
int aps_notify_status(struct aps_notify *n, const char *fmt, ...)
        __attribute__((format(printf, 2, 3)));

/* Closes the socket; every later call is a no-op. Safe to call twice. */
void aps_notify_close(struct aps_notify *n);

#endif
