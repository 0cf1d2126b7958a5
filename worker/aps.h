/*
 * libaps: the apsd client library (C ABI).
 *
 * Two parts: the low-precision codec (format information, quantize and
 * dequantize with an APS scale exponent, the exponent rules), and the client
 * of the apsd daemon (aps_client_*): join a job, register tensors, all-reduce
 * them to the mean over ranks, broadcast, barrier. Every
 * function returns 0 (or a non-negative count) on success and a negative
 * APS_E* code on failure; aps_strerror() names the code and aps_last_error()
 * gives the detail of the calling thread's last failure. The library never
 * prints. Buffers are always the caller's, with explicit lengths.
 */
#ifndef APS_H
#define APS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "aps_errors.h"

/** Version of the library, "MAJOR.MINOR.PATCH". Static string. */
const char *aps_version(void);

/** Detail of the calling thread's last failed call (static per thread, "" if none). */
const char *aps_last_error(void);

/** Description of a format, filled by aps_format_info. */
struct aps_format_info {
	char name[16];       /* canonical name: "e4m3", "fp16", "e2m5", ... */
	uint32_t bits;       /* width of one packed code */
	uint32_t exp_bits;   /* X */
	uint32_t man_bits;   /* Y */
	uint32_t fn;         /* layout: 0 IEEE-style (inf, NaN), 1 OCP "fn" (one NaN, no
	                        inf), 2 OCP MX element format (no inf, no NaN) */
	int32_t emax;        /* largest exponent of a finite value */
	float max;           /* largest finite value */
	float min_normal;    /* smallest normal value */
	float min_subnormal; /* smallest subnormal value, 0 if none */
};

/**
 * Describes the format named fmt ("fp32", "bf16", "fp16", "e5m2", "e4m3",
 * "e4m3fn", "e3m0", the OCP MX element formats "fp4", "fp6e2m3", "fp6e3m2",
 * or "eXmY" with 2 <= X <= 8 and 1+X+Y <= 16, "eXmYfn", "eXmYmx").
 * Returns 0, APS_EINVAL (NULL argument) or APS_EFORMAT.
 */
int aps_format_info(const char *fmt, struct aps_format_info *out);

/** Bytes that count packed codes of fmt occupy, or a negative APS_E* code. */
int64_t aps_packed_size(const char *fmt, uint64_t count);

enum aps_rounding_mode {
	APS_ROUNDING_NEAREST = 0,    /* round to nearest, ties to even (default) */
	APS_ROUNDING_STOCHASTIC = 1, /* reproducible: keyed by (seed, stream, index) */
};

/** Options of aps_quantize; a NULL pointer means all zero. */
struct aps_quantize_opts {
	int32_t scale_exp; /* k: the codes hold x * 2^k */
	int32_t rounding;  /* enum aps_rounding_mode */
	uint64_t seed;     /* stochastic rounding only */
	uint64_t stream;   /* stochastic rounding only: e.g. tensor id and step */
	uint64_t index0;   /* stochastic rounding only: global index of x[0] */
};

/** Counts of one aps_quantize call. */
struct aps_quantize_stats {
	uint64_t overflow;  /* finite values that saturated to +-max */
	uint64_t nonfinite; /* inf and NaN inputs (inf saturates, NaN -> canonical NaN) */
	uint64_t flushed;   /* non-zero values that became zero */
	float maxabs;       /* largest |x| over finite inputs */
};

/**
 * Quantizes x[0..n) times 2^opts->scale_exp to packed codes of fmt in out,
 * which holds out_len bytes (at least aps_packed_size(fmt, n)). stats may be
 * NULL. Returns 0, APS_EINVAL, APS_EFORMAT, APS_ESHORT or APS_ERANGE (scale
 * exponent beyond +-320). Nothing is written past out_len.
 */
int aps_quantize(const char *fmt, const float *x, uint64_t n, const struct aps_quantize_opts *opts,
                 uint8_t *out, uint64_t out_len, struct aps_quantize_stats *stats);

/**
 * Decodes n packed codes of fmt (codes_len bytes) times 2^-scale_exp into
 * out[0..n). Exact, rounded once to fp32. Same errors as aps_quantize.
 */
int aps_dequantize(const char *fmt, const uint8_t *codes, uint64_t codes_len, uint64_t n,
                   int32_t scale_exp, float *out);

/** As aps_dequantize, but adds into acc[0..n) instead of overwriting it. */
int aps_accumulate(const char *fmt, const uint8_t *codes, uint64_t codes_len, uint64_t n,
                   int32_t scale_exp, float *acc);

/** Block sizes of block scaling: 16, 32 (the default) or 64 elements. */
#define APS_BLOCK_DEFAULT 32

/**
 * Exponents block scaling gives n elements: ceil(n / block). 0 when block is
 * not 16, 32 or 64 (aps_last_error() says so).
 */
uint64_t aps_block_count(uint64_t n, uint32_t block);

/**
 * Block scaling: x[0..n) in blocks of block elements (16, 32 or 64; the last
 * may be short), block b quantized with its own exponent exps[b], the largest
 * k at which the block's largest finite |x| does not saturate (0 for an
 * all-zero block, within [-127, 127]). Block b's codes are the bits
 * aps_quantize gives for it with scale_exp = exps[b]; they start on a byte
 * boundary (MX layout: the codes, and one int8 exponent per block beside
 * them). exps holds exps_len >= aps_block_count(n, block) entries. Of opts
 * only rounding, seed, stream and index0 are used (NULL: all zero). Returns
 * 0, APS_EINVAL, APS_EFORMAT, APS_ESHORT or APS_ERANGE.
 */
int aps_quantize_blocks(const char *fmt, const float *x, uint64_t n, uint32_t block,
                        const struct aps_quantize_opts *opts, uint8_t *out, uint64_t out_len,
                        int8_t *exps, uint64_t exps_len, struct aps_quantize_stats *stats);

/**
 * Decodes block-scaled codes: out[i] = value of code i times 2^-exps[i / block].
 * Errors as aps_quantize_blocks; an exponent of -128 (none that block scaling
 * gives: 2^128 is past fp32) is APS_ERANGE.
 */
int aps_dequantize_blocks(const char *fmt, const uint8_t *codes, uint64_t codes_len,
                          const int8_t *exps, uint64_t exps_len, uint64_t n, uint32_t block,
                          float *out);

/** As aps_dequantize_blocks, but adds into acc[0..n). */
int aps_accumulate_blocks(const char *fmt, const uint8_t *codes, uint64_t codes_len,
                          const int8_t *exps, uint64_t exps_len, uint64_t n, uint32_t block,
                          float *acc);

/**
 * Largest |x[i]| over the finite values of x[0..n); 0 when there are none.
 * NaN when x is NULL and n > 0 (aps_last_error() says so).
 */
float aps_maxabs(const float *x, uint64_t n);

enum aps_scaling_mode {
	APS_SCALING_MODE_NONE = 0,   /* k = 0 */
	APS_SCALING_MODE_LOCAL = 1,  /* largest k with no overflow for this data */
	APS_SCALING_MODE_GLOBAL = 2, /* the paper: emax - ceil(log2(nworkers * max)) */
	APS_SCALING_MODE_BLOCK = 3,  /* a local k per block of block_size elements (client
	                                only: aps_exponent takes NONE, LOCAL or GLOBAL) */
};

/**
 * The APS scale exponent of x[0..n) for fmt under mode (k = 0 for an all-zero
 * tensor). Non-finite values are ignored. Every argument is checked before x is
 * read. Returns 0 and writes *k, or APS_EINVAL (NULL pointer, nworkers < 1, a
 * mode other than NONE, LOCAL or GLOBAL), APS_EFORMAT or APS_ERANGE (n beyond
 * 2^58).
 */
int aps_exponent(const char *fmt, const float *x, uint64_t n, int32_t nworkers, int32_t mode,
                 int32_t *k);

/** A connection to apsd as one rank of one job. Not thread-safe: one thread at a time. */
typedef struct aps_client aps_client;

/**
 * Optional sink for the client's diagnostics (the library never prints). It is
 * called from the client's I/O thread, or from a thread inside a client call
 * that does the I/O thread's work (a call that starts sends itself when the
 * I/O thread is idle; aps_request_wait); it must not call the client.
 */
typedef void (*aps_log_fn)(void *ctx, int level, const char *line);

/** Options of aps_client_new; aps_client_opts_init sets the defaults. */
struct aps_client_opts {
	const char *endpoint; /* default "tcp://127.0.0.1:5555"; tcp://HOST:PORT (PORT
	                         1..65535) or ipc://PATH; several, comma-separated
	                         ("tcp://a:5555,tcp://b:5555"): one apsd shard each, see
	                         partition_bytes */
	const char *job;      /* default "default"; 1..64 visible ASCII bytes */
	uint32_t rank;        /* 0 <= rank < world_size */
	uint32_t world_size;  /* ranks in the job, 1..65536 (apsd's max_ranks) */
	const char *format;   /* uplink format of every tensor, default "e4m3" */
	int32_t scaling;      /* enum aps_scaling_mode, default APS_SCALING_MODE_LOCAL; GLOBAL
	                         exchanges exponents through the daemon before each push */
	const char *downlink; /* format of results: NULL (the uplink format), "fp32", ... */
	int32_t timeout_ms;   /* deadline of a call without progress, default 60000 */
	int32_t heartbeat_ms; /* liveness while waiting, default 1000 */
	aps_log_fn log;       /* NULL: no diagnostics */
	void *log_ctx;
	const char *trace;      /* Chrome-trace timeline file of every call's stages (scan,
	                           quantize, push, wait, dequantize); NULL: $APS_TRACE, or off. Opened
	                           before joining: one that cannot be written is APS_ESYS */
	int32_t policy_auto;    /* 1: ask for the daemon's automatic precision policy; 0 or 1 */
	const char *rules;      /* formats by tensor name, first match wins: "*.bias=fp32,fc.*=fp16"
	                           (no empty rule; an unknown format is APS_EFORMAT);
	                           NULL or "": every tensor in format */
	int32_t error_feedback; /* 1: keep each tensor's quantization residual and add it to
	                           the next step's gradient (what is flushed is delayed, not
	                           lost); 0 or 1 */
	const char *curve_server_key; /* the daemon's Z85 public key: encrypt and authenticate
	                                 (the three keys, of 40 Z85 characters each, or none) */
	const char *curve_public_key; /* this worker's Z85 key pair (aps_curve_keypair), */
	const char *curve_secret_key; /* whose public half is in the daemon's allowlist */
	int32_t rejoin; /* 1: when apsd restarts (or does not know this session), the client
	                   joins the job again, registers its tensors at the steps it is at,
	                   and sends the calls in flight again: they complete. Ranks whose
	                   steps differ (a result reached some of them only) get
	                   APS_EMISMATCH. 0 (default): APS_ENOSESSION (or APS_ECONN after a
	                   BYE) */
	uint64_t partition_bytes; /* several shards: tensors above this many fp32 bytes are cut
	                             into partitions of this size, and partitions and smaller
	                             tensors go to the shard with the fewest bytes so far, in
	                             the order of registration (every rank must register in the
	                             same order). Keep it a multiple of the daemons'
	                             chunk_bytes for results bit-identical to one daemon.
	                             With block scaling it is rounded down to a multiple
	                             of 256 (partitions start on a block).
	                             0: 4 MiB (apsd's default chunk_bytes) */
	const char *optimizer;    /* NULL or "": all-reduce mode. Else (1..127 visible ASCII
	                             bytes) optimize mode: the
	                             daemon holds the weights and steps this optimizer,
	                             "sgd[,momentum=M][,dampening=D][,nesterov=0|1]
	                             [,weight_decay=W]" or "adam|adamw[,beta1=B1][,beta2=B2]
	                             [,eps=E][,weight_decay=W]" (torch.optim's defaults);
	                             every rank of the job names the same one. One daemon
	                             (no shards) and not with rejoin: APS_EINVAL (a
	                             restarted apsd resumes the job from its checkpoint, the
	                             workers restart too) */
	const char *job_token;    /* NULL or "": none. Else 1..128 visible ASCII bytes that
	                             every rank of the job gives: the job's first HELLO
	                             fixes it, and a HELLO without it, or with another, is
	                             refused with APS_EACCES (a stranger cannot take a free
	                             rank). Keep it secret; with CURVE it also never travels
	                             in clear */

	int32_t connect_timeout_ms; /* joining: how long the client tries to connect to apsd
	                               (again every second at most while nothing listens,
	                               so that a daemon started after its workers is
	                               joined) before aps_client_new fails with APS_ECONN,
	                               saying whether the connection was refused or nothing
	                               answered; a daemon that took the connection is waited
	                               for up to timeout_ms. Default 10000; 0: no limit but
	                               timeout_ms */
	uint32_t block_size;    /* scaling APS_SCALING_MODE_BLOCK: elements per block, 16, 32 or 64;
	                           0: APS_BLOCK_DEFAULT. Every rank of the job gives the same.
	                           Payloads carry one int8 exponent per block after the codes
	                           (fp32 travels as it is) */
	uint32_t codec_threads; /* threads that scan and encode a tensor of several chunks
	                           together, the caller's included, 0..64; 0 or 1: the
	                           caller's alone. The same codes for any number */
	int32_t no_payload_crc; /* 1: the job's payloads travel without CRC32C, both ways
	                           (every rank of the job says the same; the daemon still
	                           checks lengths and inf/NaN codes, and TCP its own
	                           checksum). About 9 % of a worker's CPU and 6 % of the
	                           daemon's on large tensors. 0 (default): with */
};

/**
 * Generates a CURVE key pair as two Z85 strings of 40 characters (buffers of
 * at least 41 bytes). Returns 0, APS_EINVAL (a NULL buffer) or APS_ESYS when
 * ZeroMQ has no CURVE; aps_last_error() says which.
 */
int aps_curve_keypair(char *public_key, char *secret_key);

/** Fills o with the defaults (rank 0 of a world of 1). NULL is a no-op. */
void aps_client_opts_init(struct aps_client_opts *o);

/** sizeof(struct aps_client_opts) of this library, for bindings to check theirs. */
size_t aps_client_opts_size(void);

/**
 * Joins the job: connects, says HELLO and waits for the daemon's WELCOME
 * (with several endpoints: joins the job on every shard, in list order).
 * On success *out owns a client to free with aps_client_close. Every option is
 * checked before anything connects (every endpoint of a list before any shard
 * is joined). Returns 0, APS_EINVAL (an option out of its range, named by
 * aps_last_error()), APS_EFORMAT (format, downlink or a rule's), APS_ESYS (the
 * trace file cannot be written), APS_ECONN (no connection could be
 * made within connect_timeout_ms, or timeout_ms if that is shorter: the message says whether it was
 * refused or nothing answered; or apsd closed it again and again), APS_ETIMEDOUT (apsd took the
 * connection but did not answer within timeout_ms; while apsd reads the job's checkpoint, protocol
 * 1.11, the wait lasts as long as the read goes on, and fails when it stalls for timeout_ms, 1 s
 * at least), APS_EBUSY (the rank is held by a live session),
 * APS_EMISMATCH (the job's world size or options differ), APS_ERANGE (a limit of apsd's:
 * max_jobs, max_jobs_per_address, or the job's checkpoint is larger than the memory left to
 * resume it) or APS_EACCES (the job token differs, or apsd refused this client's CURVE key:
 * "authentication failed").
 */
int aps_client_new(aps_client **out, const struct aps_client_opts *o);

/**
 * Registers a tensor of count fp32 elements (1..2^32) under name (1..255 visible
 * ASCII bytes; every rank registers the same tensors) and writes its id. Returns
 * 0, APS_EINVAL (checked before anything is sent), APS_ENOMEM, APS_EMISMATCH
 * (another rank registered another count), APS_ERANGE (a limit of apsd's: max_tensors,
 * max_job_bytes or max_total_bytes), APS_ETIMEDOUT or APS_ECLOSED.
 */
int aps_client_register(aps_client *c, const char *name, uint64_t count, uint32_t *tensor_id);

/**
 * All-reduce: replaces buf[0..count) with the mean over every rank of the
 * job, in place. Blocks until the result arrives. timeout_ms <= 0 uses the
 * client's. A tensor holding NaN or inf is refused before anything is sent
 * (APS_ENONFINITE). Other errors: APS_EINVAL, APS_ETIMEDOUT (the message names
 * the ranks the daemon still waits for), APS_EPEERLOST (a rank of the job was
 * lost; the message names it), APS_EPROTO, APS_ECLOSED.
 */
int aps_client_allreduce(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                         int32_t timeout_ms);

/** An all-reduce or broadcast in flight; aps_request_wait ends it. */
typedef struct aps_request aps_request;

/**
 * Starts an all-reduce and returns at once: the client's I/O thread sends
 * the tensor (in chunks of the daemon's size) and writes the mean into buf
 * as results arrive. buf must stay valid and untouched until the request is
 * waited for. Many requests may be in flight, one per tensor; they complete
 * in any order. In global scaling mode the requests started together share
 * one exponent exchange. Errors as aps_client_allreduce, plus APS_EBUSY when
 * the tensor already has a call in flight. On success *req must be passed to
 * aps_request_wait exactly once, before aps_client_close.
 */
int aps_client_allreduce_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                               int32_t timeout_ms, aps_request **req);

/** Starts a broadcast from rank 0; see aps_client_allreduce_start. */
int aps_client_broadcast_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                               int32_t timeout_ms, aps_request **req);

/**
 * Waits until req is complete, frees it and returns its result: 0 or the
 * APS_E* code of the call (aps_last_error() says why, on this thread). When
 * req is the client's only call in flight, the waiting thread sends and
 * receives it itself instead of through the I/O thread (the same messages,
 * two thread hand-offs fewer: a small call's latency).
 */
int aps_request_wait(aps_request *req);

/**
 * 1 when req is complete (aps_request_wait will not block), 0 when not. Reads
 * the replies that wait on the socket first, unless another thread is at it: a
 * lone call's replies are read by whoever waits for it, this call, or the I/O
 * thread's next look (within 50 ms).
 */
int aps_request_done(const aps_request *req);

/**
 * Broadcast from rank 0: every rank's buf[0..count) receives rank 0's values.
 * Rank 0's values must be finite: one inf or NaN refuses the call before
 * anything is sent (APS_ENONFINITE). Other errors as aps_client_allreduce.
 */
int aps_client_broadcast(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                         int32_t timeout_ms);

/**
 * Optimize mode: one optimizer step of a tensor. Sends grad[0..count) (quantized
 * like an all-reduce) with the learning rate lr; the daemon averages the
 * gradients of every rank, updates its fp32 master weights and answers with
 * the update, which is added to weights[0..count) in place. weights must hold
 * what the daemon believes the workers hold: rank 0's broadcast values at
 * first, then only changed by these steps; then after every step
 * |weights - master| is at most half a quantization step of the update's
 * format at the update's scale, plus fp32 rounding. grad is only read. Errors
 * as aps_client_allreduce, plus APS_EINVAL when the client is not in
 * optimize mode or lr is not finite and >= 0.
 */
int aps_client_step(aps_client *c, uint32_t tensor_id, const float *grad, float *weights,
                    uint64_t count, float lr, int32_t timeout_ms);

/** Starts an optimizer step; see aps_client_step and aps_client_allreduce_start. */
int aps_client_step_start(aps_client *c, uint32_t tensor_id, const float *grad, float *weights,
                          uint64_t count, float lr, int32_t timeout_ms, aps_request **req);

/**
 * Optimize mode: copies the daemon's fp32 master weights of a tensor into
 * weights[0..count) and, when updates is not NULL, the number of optimizer
 * updates they have had. Any rank, any time (not between a step's start and
 * its wait on the same tensor: APS_EBUSY). Errors: APS_EINVAL (also when the job is
 * in all-reduce mode: the daemon holds no weights), APS_EPROTO (no weights yet: rank 0
 * broadcasts them first), APS_ETIMEDOUT, APS_ECLOSED.
 */
int aps_client_pull(aps_client *c, uint32_t tensor_id, float *weights, uint64_t count,
                    int32_t timeout_ms, uint64_t *updates);

/**
 * Optimize mode: the optimizer updates the tensor had when it was registered:
 * 0 for a new job, the checkpoint's count when the daemon resumed the job.
 * Returns 0 or APS_EINVAL.
 */
int aps_client_tensor_updates(aps_client *c, uint32_t tensor_id, uint64_t *updates);

/*
 * Calls on codes the caller made: for a codec that runs where the gradient
 * lives (a GPU, aps.torch), so that only codes cross to host memory and back.
 * The caller encodes the tensor in the layout aps_client_codes_layout gives
 * (the codes of aps_quantize, chunk after chunk; block scaling: each chunk's
 * codes followed by its int8 block exponents, as aps_quantize_blocks gives
 * them for that chunk), and decodes each result chunk itself. With shards, the
 * partitions' chunks follow each other (partition_bytes a multiple of the
 * daemons' chunk_bytes, every shard in the same formats), and the whole tensor
 * has one exponent. Not with global scaling (the exponent is exchanged before
 * encoding) nor error_feedback (the caller keeps the residual of the codes it
 * made).
 */

/** Where a tensor's codes lie, chunk after chunk (aps_client_codes_layout). */
struct aps_codes_layout {
	char format[16];      /* the codes' format */
	uint64_t count;       /* elements */
	uint64_t chunk_elems; /* elements of every chunk but the last (a multiple of 8,
	                         of 64 with block scaling) */
	uint32_t chunks;      /* chunks of the tensor, >= 1 */
	uint32_t block;       /* block scaling: elements per block; 0: one exponent a chunk */
	uint64_t chunk_bytes; /* bytes of every chunk but the last: chunk i starts there times i */
	uint64_t bytes;       /* of every chunk */
};

/**
 * The layout of the tensor's next call: what the caller sends (send) and
 * where its result lands (result; the downlink format). Either may be NULL.
 * The format can change between calls (the daemon's precision policy, its
 * schedule, a restart): ask before each. Unlike the other calls it may be
 * made from any thread, also while another thread uses the client. Returns
 * 0, APS_EINVAL (not registered; shards whose partitions are not whole chunks
 * or differ in format) or APS_EBUSY (the tensor has a call in flight).
 */
int aps_client_codes_layout(aps_client *c, uint32_t tensor_id, struct aps_codes_layout *send,
                            struct aps_codes_layout *result);

/** The buffers of a codes call; the caller's until the request is waited for. */
struct aps_codes_call {
	const char *format;   /* the send layout's format: a stale one is APS_EMISMATCH */
	const uint8_t *codes; /* the send layout's bytes (copied before the start returns) */
	uint64_t codes_len;
	int32_t scale_exp;       /* the codes hold x * 2^scale_exp (0 with block scaling) */
	uint8_t *result;         /* the result layout's bytes, written as chunks arrive */
	uint64_t result_len;     /* at least the result layout's bytes */
	int32_t *result_exps;    /* chunk i's values are its codes times 2^-result_exps[i]
	                            (block scaling: 0, the exponents are in the codes) */
	uint32_t n_result_exps;  /* at least the result layout's chunks */
	const uint64_t *flushed; /* per chunk of the send layout, from the first: the finite
	                            non-zero values its encoding flushed to zero (as
	                            aps_quantize's stats count them), which the daemon's
	                            precision policy reads; NULL: none counted */
	uint32_t n_flushed;      /* entries of flushed, at most the send layout's chunks */
};

/**
 * Starts an all-reduce of codes: as aps_client_allreduce_start, but the
 * tensor travels as call->codes and the mean comes back as codes in
 * call->result. Codes of inf or NaN are refused before anything is sent
 * (APS_ENONFINITE). Errors as aps_client_allreduce_start, plus APS_EINVAL
 * (bad buffers or lengths, a scale exponent beyond +-320 or a block exponent
 * beyond +-127, global scaling, error feedback, optimize mode, shards whose
 * partitions are not whole chunks) and
 * APS_EMISMATCH (call->format is not the tensor's format at this step).
 */
int aps_client_allreduce_codes_start(aps_client *c, uint32_t tensor_id,
                                     const struct aps_codes_call *call, int32_t timeout_ms,
                                     aps_request **req);

/** Optimize mode: an optimizer step of codes; the update comes back as codes in call->result. */
int aps_client_step_codes_start(aps_client *c, uint32_t tensor_id,
                                const struct aps_codes_call *call, float lr, int32_t timeout_ms,
                                aps_request **req);

/** Waits until every rank of the job has entered the barrier (on every shard). */
int aps_client_barrier(aps_client *c, int32_t timeout_ms);

/** Says BYE, closes the connection and frees c. NULL is a no-op. Returns 0. */
int aps_client_close(aps_client *c);

#ifdef __cplusplus
}
#endif

#endif
