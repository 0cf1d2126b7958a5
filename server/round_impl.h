/*
 * What round.c shares with round_finish.c, which encodes a finished chunk's
 * result: the round's books after that result, and the timeline's label.
 */
#ifndef APS_SERVER_ROUND_IMPL_H
#define APS_SERVER_ROUND_IMPL_H

#include "server/round.h"

#define APS__ROUND_AT(r, chunk) \
	((struct aps_trace_at){ (r)->job_label, (r)->label, (r)->step, (chunk) })

/* The round's books after chunk res->offset's result res: the step moves on
 * after its last chunk (res->step_done). On the loop thread. */
void aps__round_close_chunk(struct aps_round *r, struct aps_round_result *res);

#endif
