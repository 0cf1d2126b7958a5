/*
 * Joining a job: HELLO and its WELCOME, before the I/O thread starts (join.c).
 */
#ifndef APS_WORKER_JOIN_H
#define APS_WORKER_JOIN_H

#include "worker/client_impl.h"

/* Says HELLO (with downlink unless NULL or "auto") and waits for WELCOME on this
 * thread, connecting again as needed. 0, or an APS_E* code with the reason set for
 * aps_last_error (APS_ECONN, APS_ETIMEDOUT, APS_EACCES, APS_EMISMATCH, ...). */
int aps_join(struct aps_client *c, const char *downlink);

#endif
