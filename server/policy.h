/*
 * Hybrid precision (APS.md section 3): which format each tensor travels in,
 * step by step. Rules pin tensors by name, a schedule keeps the first steps
 * in a wider format, and the automatic policy moves a tensor up a ladder
 * (e3m0 -> e4m3 -> fp16 -> fp32) when too much of it is flushed to zero or
 * its result is too far from the fp32 mean, and back down after a long calm.
 * The daemon decides; every rank learns the decision in the same RESULT.
 */
#ifndef APS_SERVER_POLICY_H
#define APS_SERVER_POLICY_H

#include "common/format.h"
#include "common/rules.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_POLICY_RULES_MAX  512
#define APS_POLICY_REASON_MAX 24

struct aps_policy_config {
	bool automatic;            /* the ladder and the small-tensor rule */
	char rules[APS_RULES_MAX]; /* "*.bias=fp32,fc.*=fp16" (common/rules.h) */
	uint64_t schedule_steps;   /* steps 0..S-1 travel in schedule_format */
	struct aps_format schedule_format;
	uint64_t small_elems;        /* automatic: tensors below this travel in fp32 */
	double flush_up, flush_down; /* flushed fraction that moves up, that allows down */
	double error_up, error_down; /* relative error of the result, likewise */
	uint32_t window_up;          /* consecutive steps above a threshold to move up */
	uint32_t window_down;        /* consecutive steps below both to move down */
};

/* Where a tensor stands. */
struct aps_tensor_policy {
	struct aps_format base;             /* what the workers asked for */
	struct aps_format current;          /* what they use now */
	char reason[APS_POLICY_REASON_MAX]; /* "requested", "rule", "schedule", "small",
	                                       "flushed", "error", "calm" */
	bool pinned;                        /* by a rule or the small-tensor rule: never moves */
	uint32_t above, below;              /* current streaks */
	uint64_t switches;
	uint32_t down_window;    /* calm steps needed to move down; doubles after a flap */
	uint64_t last_down_step; /* when it last moved down (0: never) */
};

/*
 * Defaults: off; up when more than 50% of a tensor is flushed or its result is
 * 35% off, for 3 steps; down after 50 steps under 5% and 10%. Chosen on the
 * Fashion-MNIST demo (docs/RESULTS.md): e3m0 with APS loses 17-57% of values
 * and still trains, so stricter thresholds only move everything off e3m0.
 */
void aps_policy_defaults(struct aps_policy_config *cfg);

/* Checks a rules string; returns 0, or APS_ECONFIG with the reason in why. */
int aps_policy_check_rules(const char *rules, char *why, size_t why_len);

/* A tensor's policy when it is registered; its format for step 0 is current. */
void aps_policy_init(const struct aps_policy_config *cfg, const char *name, uint64_t count,
                     const struct aps_format *requested, struct aps_tensor_policy *p);

/*
 * Feeds what step `step` showed; returns true when the format of step + 1
 * differs (p->current and p->reason say what and why).
 */
bool aps_policy_observe(const struct aps_policy_config *cfg, struct aps_tensor_policy *p,
                        uint64_t step, double flushed_fraction, double rel_error);

#endif
