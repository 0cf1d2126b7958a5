/*
 * The precision policy's decisions. Pure functions of the configuration and
 * of what each step showed: no sockets, no rounds.
 */
#include "server/policy.h"

#include "common/err.h"
#include "common/rules.h"

#include <stdio.h>
#include <string.h>

/* The rungs, narrow to wide, as aps_format_parse names them. */
static const struct {
	const char *name;
	int exp_bits, man_bits;
} ladder[] = { { "e3m0", 3, 0 }, { "e4m3", 4, 3 }, { "fp16", 5, 10 }, { "fp32", 8, 23 } };
#define LADDER_LEN (sizeof(ladder) / sizeof(ladder[0]))

void aps_policy_defaults(struct aps_policy_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->schedule_format = aps_format_fp32();
	cfg->small_elems = 1024;
	cfg->flush_up = 0.5;
	cfg->flush_down = 0.05;
	cfg->error_up = 0.35;
	cfg->error_down = 0.10;
	cfg->window_up = 3;
	cfg->window_down = 50;
}

int aps_policy_check_rules(const char *rules, char *why, size_t why_len)
{
	return aps_rules_check(rules, why, why_len);
}

static void set(struct aps_tensor_policy *p, const struct aps_format *f, const char *reason)
{
	p->current = *f;
	snprintf(p->reason, sizeof(p->reason), "%s", reason);
}

void aps_policy_init(const struct aps_policy_config *cfg, const char *name, uint64_t count,
                     const struct aps_format *requested, struct aps_tensor_policy *p)
{
	struct aps_format f;

	memset(p, 0, sizeof(*p));
	p->base = *requested;
	p->down_window = cfg->window_down;
	set(p, requested, "requested");
	if (aps_rules_match(cfg->rules, name, &f)) {
		p->pinned = true;
		set(p, &f, "rule");
	} else if (cfg->automatic && count < cfg->small_elems && !aps_format_is_fp32(requested)) {
		p->pinned = true;
		f = aps_format_fp32();
		set(p, &f, "small");
	} else if (cfg->schedule_steps > 0) {
		set(p, &cfg->schedule_format, "schedule");
	}
}

static int ladder_pos(const struct aps_format *f)
{
	for (size_t i = 0; i < LADDER_LEN; i++) {
		if (f->exp_bits == ladder[i].exp_bits && f->man_bits == ladder[i].man_bits &&
		    f->layout == APS_LAYOUT_IEEE)
			return (int)i;
	}
	return -1;
}

/* One rung up (the ladder above the requested format), or false at the top. */
static struct aps_format rung(int pos)
{
	struct aps_format f;

	(void)aps_format_make(ladder[pos].exp_bits, ladder[pos].man_bits, APS_LAYOUT_IEEE, &f);
	snprintf(f.name, sizeof(f.name), "%s", ladder[pos].name);
	return f;
}

static unsigned rung_bits(int pos)
{
	return 1u + (unsigned)ladder[pos].exp_bits + (unsigned)ladder[pos].man_bits;
}

/* The narrowest rung wider than a format of bits bits (fp32 at most). */
static int rung_wider_than(unsigned bits)
{
	int pos = 0;

	while (pos + 1 < (int)LADDER_LEN && rung_bits(pos) <= bits)
		pos++;
	return pos;
}

static bool step_up(struct aps_tensor_policy *p, const char *reason)
{
	int pos = ladder_pos(&p->current);
	struct aps_format f;

	if (aps_format_is_fp32(&p->current))
		return false;
	/* A format off the ladder goes to the narrowest wider rung: fp4 and the fp6
	 * formats to e4m3, e5m2 to fp16, bf16 to fp32. */
	f = rung(pos >= 0 ? pos + 1 : rung_wider_than(p->current.bits));
	set(p, &f, reason);
	return true;
}

static bool step_down(struct aps_tensor_policy *p)
{
	int pos = ladder_pos(&p->current), base = ladder_pos(&p->base);
	struct aps_format f;

	if (pos <= 0 || aps_format_equal(&p->current, &p->base))
		return false;
	if (base >= 0 && pos - 1 < base)
		return false;
	if (base < 0 && rung_bits(pos - 1) <= p->base.bits) {
		set(p, &p->base, "calm"); /* back to the requested off-ladder format */
		return true;
	}
	f = rung(pos - 1);
	set(p, &f, "calm");
	return true;
}

bool aps_policy_observe(const struct aps_policy_config *cfg, struct aps_tensor_policy *p,
                        uint64_t step, double flushed_fraction, double rel_error)
{
	bool flushed = flushed_fraction > cfg->flush_up, wrong = rel_error > cfg->error_up;
	bool calm = flushed_fraction < cfg->flush_down && rel_error < cfg->error_down;

	if (p->pinned)
		return false;
	if (step + 1 < cfg->schedule_steps)
		return false;
	if (step + 1 == cfg->schedule_steps) {
		set(p, &p->base, "requested");
		p->switches++;
		return true;
	}
	if (!cfg->automatic)
		return false;
	p->above = flushed || wrong ? p->above + 1 : 0;
	p->below = calm ? p->below + 1 : 0;
	if (p->above >= cfg->window_up && step_up(p, flushed ? "flushed" : "error")) {
		/* Back up soon after a move down: the narrower format was not enough after
		 * all (a wider one always looks calm), so wait twice as long next time. */
		if (p->last_down_step != 0 && step - p->last_down_step <= p->down_window &&
		    p->down_window < UINT32_MAX / 2)
			p->down_window *= 2;
		p->above = p->below = 0;
		p->switches++;
		return true;
	}
	if (p->below >= p->down_window && step_down(p)) {
		p->last_down_step = step;
		p->above = p->below = 0;
		p->switches++;
		return true;
	}
	return false;
}
