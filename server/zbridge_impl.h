/*
 * The bridge's state, shared by its two files: zbridge.c (the ROUTER socket's
 * life: open, reset, the tick that decides a reset, new and free) and
 * zbridge_pump.c (messages in and out, the monitor's events, send queues),
 * which knows nothing of how the socket came to be. Not for other modules.
 */
#ifndef APS_SERVER_ZBRIDGE_IMPL_H
#define APS_SERVER_ZBRIDGE_IMPL_H

#include "common/log.h"
#include "server/admission.h"
#include "server/conns.h"
#include "server/netlist.h"
#include "server/outq.h"
#include "server/zbridge.h"
#include "server/zbridge_zap.h"

#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#define RESET_WAIT_MS 2000 /* a reset that cannot listen again this long says so */

/* The heap bears out a reset only when it stayed up this many ticks (5 s). */
#define APS_ZBRIDGE_HEAP_WINDOW 20

struct aps_zbridge {
	uv_loop_t *loop;
	void *zctx;
	void *router, *monitor; /* NULL while a reset waits for the old socket */
	uv_poll_t *router_poll, *monitor_poll;
	bool reset_logged; /* a reset could not listen again for RESET_WAIT_MS: said so */
	struct aps_zbridge_opts opts; /* for the sockets a reset opens (strings borrowed) */
	uv_idle_t idle;
	uv_timer_t flush_timer, tick_timer, reset_timer;
	int open_handles;
	struct aps_outq outq;
	int drain_batch;
	int64_t max_message_bytes;
	struct aps_zbridge_ops ops;
	void *ctx;
	struct aps_zbridge_counters cnt;
	struct aps_zap *zap;           /* NULL without CURVE, max_silent_closes and allow_from */
	struct aps_netlist allow_from; /* opts.allow_from, parsed once; no networks: any */
	struct aps_admission admission;
	struct aps_conns conns;
	char endpoint[256];             /* as bound (ZMQ_LAST_ENDPOINT): what a reset binds again */
	int listen_fd;                  /* a duplicate of the listening socket, for the next socket
	                                   (ZMQ_USE_FD): the port is never free across a reset; -1 */
	uint64_t last_reset_ms;         /* 0: never */
	uint64_t trim_until_ms;         /* after a reset: trim at every tick until then (0: no) */
	uint64_t unheard_trim_until_ms; /* after unheard connections were dropped: trim until */
	uint64_t unheard_trim_ms;       /* then, the last trim */
	uint64_t unheard_logged;        /* conns.cnt.unheard at the last tick's log line */
	uint64_t parked_since_ms;       /* when a parked connection was first counted; 0: none */
	struct aps_log_gate refused_log, zmtp_log; /* refused_connections, zmtp_refused: 1 line/s */
	struct aps_log_gate accept_closed_log;     /* accepts_closed: 1 line/s */
	uint64_t behind_since_ms; /* messages have waited at every look since (0: none wait) */
	uint64_t heap_floor;      /* the heap's lowest in use since the last reset (0: unknown) */
	uint64_t heap_recent[APS_ZBRIDGE_HEAP_WINDOW]; /* the last ticks' readings */
	size_t heap_next;
	struct aps_log_gate unborne_log; /* resets memory did not bear out: a line a minute */
};

/* zbridge_pump.c, for zbridge.c. */
uint64_t aps__zbridge_now_ms(const struct aps_zbridge *b);
/* Drains the socket from the idle handle (messages may wait: the fd only signals changes). */
void aps__zbridge_schedule_drain(struct aps_zbridge *b);
/* Reads the monitor's events in order (accepts before their connections' messages). */
void aps__zbridge_read_monitor(struct aps_zbridge *b);
/* Reports closed connections once no message waits; true when there were some. */
bool aps__zbridge_report_closed(struct aps_zbridge *b);
/* Sends what waits in the peers' queues, as far as their pipes take it. */
void aps__zbridge_flush_queue(struct aps_zbridge *b);
/* libuv callbacks: the socket or monitor became readable; the idle drain; the retry timer. */
void aps__zbridge_on_ready(uv_poll_t *h, int status, int events);
void aps__zbridge_on_idle(uv_idle_t *h);
void aps__zbridge_on_flush_timer(uv_timer_t *t);

#endif
