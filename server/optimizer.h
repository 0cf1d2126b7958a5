/*
 * The daemon's optimizer (optimize mode): the spec a HELLO names, the update
 * rules (SGD with momentum, dampening and Nesterov; Adam; AdamW; weight decay)
 * written to match torch.optim's formulas, and one tensor's fp32 master
 * weights, the workers' view of them and the optimizer state. No sockets, no
 * files: server/optimize.c drives it, server/checkpoint.c saves it.
 */
#ifndef APS_SERVER_OPTIMIZER_H
#define APS_SERVER_OPTIMIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define APS_OPTIM_SLOTS_MAX 2 /* state arrays of one tensor: momentum, or Adam's two */
#define APS_OPTIM_SPEC_MAX  128

enum aps_optim_kind {
	APS_OPTIM_NONE = 0, /* all-reduce mode: no optimizer */
	APS_OPTIM_SGD,
	APS_OPTIM_ADAM,
	APS_OPTIM_ADAMW, /* Adam with decoupled weight decay */
};

struct aps_optim_config {
	enum aps_optim_kind kind;
	float momentum, dampening; /* SGD */
	bool nesterov;             /* SGD: needs momentum > 0 and dampening 0 */
	float beta1, beta2, eps;   /* Adam, AdamW */
	float weight_decay;
};

/*
 * Parses "sgd,momentum=0.9,nesterov=1", "adam,beta2=0.99,weight_decay=1e-4",
 * "adamw", ...: a name, then key=value pairs separated by commas. Unnamed keys
 * keep torch's defaults. Returns 0, or APS_EINVAL with one line in why.
 */
int aps_optim_parse(const char *spec, struct aps_optim_config *out, char *why, size_t why_len);

/* The canonical spec of c (every key of its kind), always NUL-terminated. */
void aps_optim_describe(const struct aps_optim_config *c, char *buf, size_t len);

/* State arrays a tensor needs: 0 (plain SGD), 1 (SGD with momentum) or 2 (Adam). */
unsigned aps_optim_slots(const struct aps_optim_config *c);

/*
 * One update of w[0..n) with the gradient g, the state arrays of c (slots
 * floats arrays of n, updated) and learning rate lr; t is the 1-based number
 * of this update of the state (Adam's bias correction; SGD's momentum buffer
 * starts as the first gradient when t == 1).
 */
void aps_optim_update(const struct aps_optim_config *c, float *w, const float *g,
                      float *const *state, size_t n, float lr, uint64_t t);

/* One tensor of an optimize-mode job. */
struct aps_optim_tensor {
	size_t count;
	float *weights;                    /* fp32 master weights */
	float *view;                       /* what every worker holds: weights sent so far */
	float *state[APS_OPTIM_SLOTS_MAX]; /* aps_optim_slots arrays of count floats */
	unsigned slots;
	uint64_t updates; /* updates applied (restored from a checkpoint) */
	uint64_t state_t; /* updates the state has seen (Adam's t) */
	bool ready;       /* weights set: rank 0's broadcast or a checkpoint */
	bool torn; /* a step was aborted after some of its chunks were applied: never saved again */
	float lr;  /* learning rate of the step being collected: the lowest rank's */
	uint32_t lr_rank; /* the rank lr came from this step; UINT32_MAX: none yet */
};

/* Allocates the arrays (zeroed). Returns 0 or APS_ENOMEM. */
int aps_optim_tensor_init(struct aps_optim_tensor *t, const struct aps_optim_config *c,
                          size_t count);
void aps_optim_tensor_fini(struct aps_optim_tensor *t);

/* The arrays a checkpoint saves, in the file's order: the weights, then the
 * state slots. Fills out with the addresses of t's pointers (so that a caller
 * may take or lend them) and returns how many: 1 + t->slots. */
#define APS_OPTIM_SAVED_MAX (1 + APS_OPTIM_SLOTS_MAX)
unsigned aps_optim_tensor_saved(struct aps_optim_tensor *t, float **out[APS_OPTIM_SAVED_MAX]);

/*
 * Optimize-mode result of one chunk [off, off + n): mean holds the chunk's
 * mean gradient and becomes the difference between the new master weights
 * and the workers' view, to be quantized for the downlink.
 */
void aps_optim_tensor_step_chunk(const struct aps_optim_config *c, struct aps_optim_tensor *t,
                                 size_t off, float *mean, size_t n);

#endif
