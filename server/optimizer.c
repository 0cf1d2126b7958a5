/*
 * Update rules of optimize mode and the spec that chooses one. The formulas
 * follow torch.optim (1.13, single-tensor path) operation by operation, in
 * fp32 with scalars computed in double as Python does, so that the daemon's
 * weights match torch's own optimizer on the same gradients to float
 * tolerance. Loops are plain C for the compiler to vectorize: a BLAS call
 * per operation would read the arrays several times more.
 */
#include "server/optimizer.h"

#include "common/err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct optim_key {
	const char *name;
	size_t offset; /* of the float (or bool) in struct aps_optim_config */
	bool is_bool;
	double min, max; /* inclusive; max_open: the max itself is refused */
	bool max_open;
	unsigned kinds; /* bit (1 << kind) for each kind that has it */
};

#define SGD_BIT  (1u << APS_OPTIM_SGD)
#define ADAM_BIT ((1u << APS_OPTIM_ADAM) | (1u << APS_OPTIM_ADAMW))
#define FIELD(f) #f, offsetof(struct aps_optim_config, f)

static const struct optim_key optim_keys[] = {
	{ FIELD(momentum), false, 0, 1, true, SGD_BIT },
	{ FIELD(dampening), false, 0, 1, false, SGD_BIT },
	{ FIELD(nesterov), true, 0, 1, false, SGD_BIT },
	{ FIELD(beta1), false, 0, 1, true, ADAM_BIT },
	{ FIELD(beta2), false, 0, 1, true, ADAM_BIT },
	{ FIELD(eps), false, 1e-30, 1, false, ADAM_BIT },
	{ FIELD(weight_decay), false, 0, 1e6, false, SGD_BIT | ADAM_BIT },
};

#define NKEYS (sizeof(optim_keys) / sizeof(optim_keys[0]))

static const char *const kind_names[] = { "none", "sgd", "adam", "adamw" };

static void defaults(enum aps_optim_kind kind, struct aps_optim_config *c)
{
	memset(c, 0, sizeof(*c));
	c->kind = kind;
	c->beta1 = 0.9f;
	c->beta2 = 0.999f;
	c->eps = 1e-8f;
	c->weight_decay = kind == APS_OPTIM_ADAMW ? 0.01f : 0.0f; /* torch's defaults */
}

static int parse_kind(const char *name, size_t len, enum aps_optim_kind *kind)
{
	for (int k = APS_OPTIM_SGD; k <= APS_OPTIM_ADAMW; k++) {
		if (strlen(kind_names[k]) == len && strncmp(name, kind_names[k], len) == 0) {
			*kind = (enum aps_optim_kind)k;
			return 0;
		}
	}
	return APS_EINVAL;
}

static const struct optim_key *find_key(const char *name, size_t len)
{
	for (size_t i = 0; i < NKEYS; i++) {
		if (strlen(optim_keys[i].name) == len &&
		    strncmp(name, optim_keys[i].name, len) == 0)
			return &optim_keys[i];
	}
	return NULL;
}

/* One "key=value" of len bytes at s. */
static int parse_pair(const char *s, size_t len, struct aps_optim_config *c, char *why,
                      size_t why_len)
{
	const char *eq = memchr(s, '=', len);
	const struct optim_key *k = eq != NULL ? find_key(s, (size_t)(eq - s)) : NULL;
	char text[64], *end;
	double v;

	if (eq == NULL || k == NULL || !(k->kinds & (1u << c->kind))) {
		snprintf(why, why_len, "optimizer %s has no setting '%.*s'", kind_names[c->kind],
		         (int)(eq != NULL ? eq - s : (ptrdiff_t)len), s);
		return APS_EINVAL;
	}
	snprintf(text, sizeof(text), "%.*s", (int)(len - (size_t)(eq - s) - 1), eq + 1);
	v = strtod(text, &end);
	if (text[0] == '\0' || *end != '\0' || !isfinite(v) || v < k->min || v > k->max ||
	    (k->max_open && v >= k->max) || (k->is_bool && v != 0 && v != 1)) {
		snprintf(why, why_len, "optimizer setting %s = '%.20s' is not in [%g, %g%s",
		         k->name, text, k->min, k->max, k->max_open ? ")" : "]");
		return APS_EINVAL;
	}
	if (k->is_bool)
		*(bool *)((char *)c + k->offset) = v != 0;
	else
		*(float *)((char *)c + k->offset) = (float)v;
	return 0;
}

int aps_optim_parse(const char *spec, struct aps_optim_config *out, char *why, size_t why_len)
{
	struct aps_optim_config c;
	size_t len = strcspn(spec, ",");
	enum aps_optim_kind kind;

	if (parse_kind(spec, len, &kind) < 0) {
		snprintf(why, why_len, "optimizer '%.*s' is not sgd, adam or adamw", (int)len,
		         spec);
		return APS_EINVAL;
	}
	defaults(kind, &c);
	for (const char *s = spec + len; *s == ',';) {
		s++;
		len = strcspn(s, ",");
		if (parse_pair(s, len, &c, why, why_len) < 0)
			return APS_EINVAL;
		s += len;
	}
	if (c.nesterov && (c.momentum <= 0 || c.dampening != 0)) {
		snprintf(why, why_len, "nesterov needs momentum > 0 and dampening = 0");
		return APS_EINVAL;
	}
	*out = c;
	return 0;
}

void aps_optim_describe(const struct aps_optim_config *c, char *buf, size_t len)
{
	size_t used;

	if (len == 0)
		return;
	used = (size_t)snprintf(buf, len, "%s", kind_names[c->kind]);
	for (size_t i = 0; i < NKEYS && used < len && c->kind != APS_OPTIM_NONE; i++) {
		const struct optim_key *k = &optim_keys[i];
		double v = k->is_bool ? *(const bool *)((const char *)c + k->offset)
		                      : *(const float *)((const char *)c + k->offset);
		if (k->kinds & (1u << c->kind))
			used += (size_t)snprintf(buf + used, len - used, ",%s=%.9g", k->name, v);
	}
}

unsigned aps_optim_slots(const struct aps_optim_config *c)
{
	switch (c->kind) {
	case APS_OPTIM_SGD:
		return c->momentum != 0 ? 1 : 0;
	case APS_OPTIM_ADAM:
	case APS_OPTIM_ADAMW:
		return 2;
	default:
		return 0;
	}
}

/* torch: d_p = g + wd * p; buf = d_p (t = 1) or momentum * buf + (1 - dampening) * d_p;
 * d_p = nesterov ? d_p + momentum * buf : buf; p -= lr * d_p. One loop per case, without
 * branches inside, so that the compiler vectorizes each. */
static void sgd(const struct aps_optim_config *c, float *w, const float *g, float *buf, size_t n,
                float lr, uint64_t t)
{
	const float wd = c->weight_decay, mom = c->momentum, damp = (float)(1.0 - c->dampening);
	const float neg_lr = -lr;

	if (buf == NULL) {
		for (size_t i = 0; i < n; i++)
			w[i] = w[i] + neg_lr * (g[i] + wd * w[i]);
		return;
	}
	if (t == 1) {
		for (size_t i = 0; i < n; i++)
			buf[i] = g[i] + wd * w[i];
	} else {
		for (size_t i = 0; i < n; i++)
			buf[i] = buf[i] * mom + damp * (g[i] + wd * w[i]);
	}
	if (c->nesterov) {
		for (size_t i = 0; i < n; i++)
			w[i] = w[i] + neg_lr * ((g[i] + wd * w[i]) + mom * buf[i]);
	} else {
		for (size_t i = 0; i < n; i++)
			w[i] = w[i] + neg_lr * buf[i];
	}
}

/* torch: m = beta1 m + (1 - beta1) g; v = beta2 v + (1 - beta2) g^2;
 * p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps). */
static void adam(const struct aps_optim_config *c, float *w, const float *g, float *const *state,
                 size_t n, float lr, uint64_t t)
{
	float *m = state[0], *v = state[1];
	const bool decoupled = c->kind == APS_OPTIM_ADAMW;
	/* Branch-free, so that the loop vectorizes: adding 0 * w, scaling by 1 change nothing. */
	const float wd = decoupled ? 0.0f : c->weight_decay;
	const float decay = decoupled ? (float)(1.0 - (double)lr * c->weight_decay) : 1.0f;
	const float b1 = c->beta1, b2 = c->beta2;
	const float a1 = (float)(1.0 - c->beta1), a2 = (float)(1.0 - c->beta2);
	const double bc1 = 1.0 - pow(c->beta1, (double)t), bc2 = 1.0 - pow(c->beta2, (double)t);
	const float neg_step = (float)(-(double)lr / bc1), bc2_sqrt = (float)sqrt(bc2);
	const float eps = c->eps;

	for (size_t i = 0; i < n; i++) {
		float gi = g[i] + wd * w[i];
		w[i] = w[i] * decay;
		m[i] = m[i] * b1 + a1 * gi;
		v[i] = v[i] * b2 + a2 * (gi * gi);
		w[i] = w[i] + neg_step * (m[i] / (sqrtf(v[i]) / bc2_sqrt + eps));
	}
}

void aps_optim_update(const struct aps_optim_config *c, float *w, const float *g,
                      float *const *state, size_t n, float lr, uint64_t t)
{
	switch (c->kind) {
	case APS_OPTIM_SGD:
		sgd(c, w, g, c->momentum != 0 ? state[0] : NULL, n, lr, t);
		break;
	case APS_OPTIM_ADAM:
	case APS_OPTIM_ADAMW:
		adam(c, w, g, state, n, lr, t);
		break;
	default:
		break;
	}
}

int aps_optim_tensor_init(struct aps_optim_tensor *t, const struct aps_optim_config *c,
                          size_t count)
{
	size_t n = count ? count : 1;

	memset(t, 0, sizeof(*t));
	t->count = count;
	t->lr_rank = UINT32_MAX;
	t->slots = aps_optim_slots(c);
	t->weights = calloc(n, sizeof(float));
	t->view = calloc(n, sizeof(float));
	for (unsigned s = 0; s < t->slots; s++)
		t->state[s] = calloc(n, sizeof(float));
	for (unsigned s = 0; s < t->slots; s++) {
		if (t->state[s] == NULL)
			goto err_free;
	}
	if (t->weights == NULL || t->view == NULL)
		goto err_free;
	return 0;
err_free:
	aps_optim_tensor_fini(t);
	return APS_ENOMEM;
}

void aps_optim_tensor_fini(struct aps_optim_tensor *t)
{
	free(t->weights);
	free(t->view);
	for (unsigned s = 0; s < APS_OPTIM_SLOTS_MAX; s++)
		free(t->state[s]);
	memset(t, 0, sizeof(*t));
}

unsigned aps_optim_tensor_saved(struct aps_optim_tensor *t, float **out[APS_OPTIM_SAVED_MAX])
{
	out[0] = &t->weights;
	for (unsigned s = 0; s < t->slots; s++)
		out[1 + s] = &t->state[s];
	return 1 + t->slots;
}

void aps_optim_tensor_step_chunk(const struct aps_optim_config *c, struct aps_optim_tensor *t,
                                 size_t off, float *mean, size_t n)
{
	float *state[APS_OPTIM_SLOTS_MAX] = { NULL, NULL };

	for (unsigned s = 0; s < t->slots; s++)
		state[s] = t->state[s] + off;
	aps_optim_update(c, t->weights + off, mean, state, n, t->lr, t->state_t + 1);
	for (size_t i = 0; i < n; i++)
		mean[i] = t->weights[off + i] - t->view[off + i];
}
