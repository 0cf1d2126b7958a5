/*
 * A rank that leaves its job or is lost, and the end of a job (leave.c).
 */
#ifndef APS_SERVER_LEAVE_H
#define APS_SERVER_LEAVE_H

#include "server/job.h"

struct aps_server;

/* s was lost (why: its connection closed, it went silent...): counted and logged;
 * if a round was in progress the job's rounds are aborted and the other ranks get
 * APS_EPEERLOST naming it; the last rank out ends the job. */
void aps_leave_lost(struct aps_server *srv, struct aps_session *s, const char *why);

/* s left (BYE): the same, without counting it as lost. */
void aps_leave_left(struct aps_server *srv, struct aps_session *s, const char *why);

/* A session waiting to reconnect whose rank a new client asks for: lost now, and
 * its session dropped. */
void aps_leave_evict(struct aps_server *srv, struct aps_session *s);

/* malloc_trim when a job ended since the last, at most once a second (server.c's tick). */
void aps_leave_trim(struct aps_server *srv);

/* Frees a job whose last rank left, and gives its memory back to the system. */
void aps_leave_end_job(struct aps_server *srv, struct aps_job *job);

#endif
