/*
 * Who may join a job, or start one: job tokens, CURVE keys' job globs, and the
 * jobs one address may start (access.c). join.c asks before it touches a job.
 */
#ifndef APS_SERVER_ACCESS_H
#define APS_SERVER_ACCESS_H

#include "proto/frame.h"
#include "server/job.h"

#include <stdbool.h>
#include <stddef.h>

struct aps_server;

/* Whether m may touch its job at all (its token, its key's jobs); if not, s was
 * sent the refusal (with when to retry, for a name its last run still holds). */
bool aps_access_let_in(struct aps_server *srv, struct aps_session *s, const struct aps_msg *m);

/* 0 if s's address may start another job; else APS_ERANGE and why. */
int aps_access_may_start(struct aps_server *srv, const struct aps_session *s,
                         const struct aps_msg *m, char *why, size_t len);

/* Whom a job started from address is charged to: the IPv4 address, an IPv6
 * address's /64, an ipc peer's user. */
void aps_access_origin(const char *address, char out[APS_JOB_ORIGIN_LEN]);
/* Whether an origin is this host's (127.0.0.1, ::1, ipc), where its own workers
 * start their jobs: each job is charged on its own there. */
bool aps_access_origin_local(const char *origin);

/* Every rank of job waits to reconnect: a new run may take its name once
 * their graces end. */
bool aps_access_abandoned(const struct aps_job *job);

#endif
