/*
 * The client's state, shared by client.c (joining, leaving), request.c
 * (starting calls and waiting for them on the caller's thread), iothread.c
 * (the I/O thread and the I/O role) with its recovery (resume.c, rejoin.c),
 * and what they all build on: outbox.c (a call's messages), chunks.c (a call's
 * chunks and their codes) and client_core.c (log, send, queue, end calls).
 *
 * Locking: c->lock guards the queue of new requests, the tensor table, every
 * request's done/result/error and c->fatal. Everything else of an active
 * request, and the socket, belongs to whoever holds c->io_role: the I/O
 * thread, except while it waits for the socket, or a caller that sends what it
 * queued or waits for its lone call (iothread.c: aps_client_kick,
 * aps_client_drive). io_role is taken before c->lock.
 */
#ifndef APS_WORKER_CLIENT_IMPL_H
#define APS_WORKER_CLIENT_IMPL_H

#include "common/format.h"
#include "common/pool.h"
#include "common/sbuf.h"
#include "common/scale.h"
#include "common/trace.h"
#include "proto/validate.h"
#include "worker/aps.h"
#include "worker/transport.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/types.h>

#define APS_CLIENT_ERROR_MAX         320
#define APS_CLIENT_WAITING_MAX       16 /* ranks a timeout message names */
#define APS_CLIENT_CODEC_THREADS_MAX 64
/* The exponent an all-zero tensor has on the wire (the codec's own is out of range there). */
#define WIRE_ZERO_EXPONENT (-APS_CODEC_SCALE_MAX)

struct client_tensor {
	char name[APS_MSG_NAME_MAX + 1];
	uint64_t count;
	struct aps_format format; /* the daemon's choice; changes at step boundaries */
	float *residual;          /* error feedback: what the last quantization lost */
	size_t chunk_elems;       /* from REGISTERED: every rank uses the daemon's */
	uint64_t step;            /* the next call's step */
	uint64_t updates;         /* optimize mode: the daemon's update count at REGISTERED */
	struct aps_request *busy; /* the call in flight on this tensor, or NULL */
	/* The last call's codes, kept for the next (lock): fresh pages cost a fault per
	 * 4 KiB, 7 % of a worker's CPU on ResNet-50 in e4m3. */
	struct aps_sbuf *spare;
};

enum request_kind {
	REQ_REGISTER,
	REQ_ALLREDUCE,
	REQ_BROADCAST,
	REQ_BARRIER,
	REQ_PULL,    /* optimize mode: the master weights into buf */
	REQ_SHARDED, /* a call of a client with several shards: one request per part */
};

enum request_state {
	REQ_NEW,      /* queued by the caller */
	REQ_EXCHANGE, /* global mode: exponent sent, waiting for SCALES */
	REQ_SENT,     /* data or request sent, waiting for the reply */
};

/* aps_request.got, per chunk. */
#define CHUNK_ANSWERED 1u /* its answer arrived */
#define CHUNK_ASKED    2u /* apsd asked for it again (AGAIN) on this connection */

struct aps_request {
	struct aps_request *next;
	struct aps_request *prev; /* active: the next newer call (NULL: the newest) */
	bool in_active;           /* in c->active (I/O thread) */
	struct aps_client *owner;
	enum request_kind kind;
	enum request_state state;
	uint32_t tensor_id;
	uint64_t step;
	char name[APS_MSG_NAME_MAX + 1]; /* REGISTER: the tensor's name */
	struct aps_format reg_fmt;       /* REGISTER: the format to ask for */
	struct aps_request **parts;      /* REQ_SHARDED: the part requests (owned) */
	uint32_t n_parts;
	uint64_t count;
	size_t chunk_elems;
	float *buf;             /* the caller's: results are written here */
	bool update;            /* optimize-mode step: results are added to weights */
	float *weights;         /* the caller's weights (update) */
	float lr;               /* update: the learning rate sent with the gradient */
	float *corrected;       /* error feedback: buf plus the tensor's residual (owned) */
	float *residual;        /* error feedback: the tensor's residual (the tensor's) */
	const float *src;       /* what is quantized: buf or corrected */
	struct aps_sbuf *codes; /* what this rank sends */
	struct aps_format fmt;
	int scale_exp;
	uint32_t block;    /* block-scaled codes: each chunk's codes, then its exponents */
	int32_t exponent;  /* global mode: this rank's ceil(log2(N max)) */
	uint64_t *flushed; /* per chunk: the values its quantization flushed to zero (owned) */
	/* Chunks whose codes are final, from the first: the caller codes a tensor of
	 * several chunks after queuing it and the I/O thread sends each chunk as it
	 * is ready (request.c stream). Written by the coding thread, release. */
	_Atomic uint32_t encoded;
	/* The caller still codes it (lock): a failure meanwhile leaves the tensor busy
	 * until the coding ends, so that no other call takes its residual. */
	bool coding;
	/* A codes call (codes.c): results are stored as codes, not decoded; NULL: none. */
	uint8_t *out_codes;
	uint64_t out_len;
	int32_t *out_exps;
	struct aps_format out_fmt; /* what the results must be in */
	uint32_t out_block;
	uint32_t sent;    /* chunks handed to the socket, from the first (I/O thread) */
	uint64_t push_ns; /* when the first chunk left, for the timeline's "push" */
	uint32_t chunks, chunks_done;
	uint8_t *got;     /* chunks: CHUNK_* flags (owned; NULL: none sent yet) */
	uint64_t sent_ns; /* when its data left, for the timeline's "wait" */
	int timeout_ms;
	int64_t deadline_ms, next_heartbeat_ms;
	uint32_t waiting[APS_CLIENT_WAITING_MAX]; /* from the daemon's heartbeat reply */
	uint32_t n_waiting;
	bool heard;      /* the daemon answered a heartbeat of this request */
	bool asked;      /* a heartbeat of this request went (iothread.c HEARTBEAT_CALLS) */
	bool reexchange; /* sent again after a rejoin: global mode exchanges its exponent
	                    again but keeps its codes (the same max gives the same k) */
	/* under c->lock: */
	bool done;
	int result;
	char error[APS_CLIENT_ERROR_MAX];
};

struct aps_client {
	pid_t pid; /* the process that created it: a forked child must not use it */
	struct aps_transport *tr;
	char endpoint[256];
	char job[APS_MSG_JOB_MAX + 1];
	uint32_t rank, world_size;
	struct aps_format format;
	enum aps_scaling scaling;
	uint32_t block;         /* scaling block: elements per block, else 0 */
	uint32_t codec_threads; /* the caller's thread and pool's helpers (1: no pool) */
	struct aps_pool *pool;  /* NULL: the caller's thread codes alone */
	int timeout_ms, heartbeat_ms;
	int connect_timeout_ms; /* joining: how long no connection may be made (0: no limit) */
	aps_log_fn log;
	void *log_ctx;
	struct aps_trace *trace; /* NULL: no timeline */
	bool policy_auto, error_feedback;
	bool no_crc;                           /* the job's payloads travel without CRC32C */
	char optimizer[APS_MSG_OPTIM_MAX + 1]; /* the job's, as WELCOME says; "": all-reduce */
	struct aps_format downlink;            /* the job's, as WELCOME says (lock) */
	bool downlink_fixed;                   /* false: results in each tensor's format */
	char job_token[APS_MSG_TOKEN_MAX + 1]; /* "": none */
	char rules[512];
	struct aps_msg_limits limits;
	pthread_t io;
	bool io_started;
	int wake_fd;
	/* A caller published coded chunks since the I/O thread last looked (request.c
	 * stream): without it the I/O thread need not scan its calls for them. */
	atomic_bool coded;
	pthread_mutex_t lock;
	pthread_cond_t done_cv;
	pthread_mutex_t io_role;    /* the socket and the active requests (see the top) */
	int64_t io_sleeps_until_ms; /* the I/O thread waits until then; 0: it does not (io_role) */
	/* The I/O thread waits without watching the socket's messages (no call in
	 * flight when it began: iothread.c wait_released). Set with io_role held. */
	atomic_bool io_quiet;
	struct aps_request *queue; /* new requests, oldest first (lock) */
	uint32_t calls;            /* requests queued or in flight, not done (lock) */
	bool stopping;             /* (lock) */
	int fatal;                 /* a failure for good: every later call fails too (lock) */
	char fatal_text[APS_CLIENT_ERROR_MAX];
	int pending; /* a job-wide error no call was waiting for: the next call's */
	char pending_text[APS_CLIENT_ERROR_MAX];
	struct client_tensor *tensors; /* by id (lock) */
	uint32_t n_tensors;
	uint64_t barrier_step;      /* (I/O thread) */
	struct aps_request *active; /* sent, waiting for replies, newest first (I/O thread) */
	/* By tensor id: its newest call in active, found without a walk of the list (a
	 * walk a reply cost 40 % of a rank's CPU with 20000 calls in flight); NULL:
	 * none, or not indexed (out of memory: the walk). (I/O thread) */
	struct aps_request **active_ids;
	uint32_t n_active_ids;
	int64_t calls_due_ms; /* no active call's deadline or heartbeat is due before (I/O thread)
	                       */
	/* Messages dropped since the last line that said so (I/O thread, drop_noted):
	 * a peer that floods the socket gets a line a second, not one a message. */
	uint64_t dropped;
	int64_t dropped_next_log_ms;
	/* Joining again after apsd restarted (rejoin.c; I/O thread but rejoining: lock). */
	bool rejoin;            /* the option */
	bool rejoining;         /* HELLO sent again, queued calls wait */
	uint32_t reregistering; /* REGISTERED still due */
	int64_t rejoin_deadline_ms, next_hello_ms;
	struct aps_msg hello;        /* as first sent */
	struct aps_sharded *sharded; /* several endpoints: the shards' clients (sharded.c) */
	/* The connection's life (I/O thread, resume.c): */
	uint8_t session[APS_MSG_SESSION_LEN]; /* the session's token, chosen at the first HELLO */
	bool has_session;                     /* joined: a lost connection resumes it */
	uint64_t max_message_bytes;           /* apsd's limit, from WELCOME (0: unknown) */
	int keepalive_ms;      /* apsd takes this rank for dead after this much silence */
	const char *send_lost; /* a send on the session's connection failed: renewed next */
	int64_t last_sent_ms, last_recv_ms;
	int64_t last_msg_ms;  /* a message from apsd last came (last_recv_ms: also a new connection)
	                       */
	bool resuming;        /* HELLO flagged RESUME sent, WELCOME RESUMED due */
	int64_t renew_due_ms; /* the connection closed: a new one at this time (0: none) */
	int64_t last_renew_ms; /* when the last new one went: the next waits RENEW_MS */
};

int64_t aps_client_now_ms(void);

/* The arguments of a registration: 0, or APS_EINVAL with the message set. */
int aps_check_register_args(const char *name, uint64_t count, const uint32_t *tensor_id);

/* Takes every active call out of c->active (and its index): the list, newest first. */
struct aps_request *aps_client_take_active(struct aps_client *c);

/* Fails every request in flight (I/O thread); with none, a job-wide error waits
 * for the next call. */
void aps_client_fail_calls(struct aps_client *c, int code, const char *text);
/* The same, and every later call too: the client is done (closed, refused, fatal). */
void aps_client_fail_for_good(struct aps_client *c, int code, const char *text);

/* rejoin.c: apsd lost this session (why); starts joining again. */
void aps_rejoin_begin(struct aps_client *c, const char *why);
/* rejoin.c: true when an ERROR was about joining again (and is handled). */
bool aps_rejoin_on_error(struct aps_client *c, const struct aps_msg *m);
/* rejoin.c: a WELCOME or an unasked REGISTERED while joining again. */
void aps_rejoin_on_message(struct aps_client *c, const struct aps_msg *m);
/* rejoin.c: the connection came back while joining again: the registrations again. */
void aps_rejoin_resumed(struct aps_client *c);
/* rejoin.c: resends HELLO, gives up at the deadline; ms until it is due again. */
int aps_rejoin_timers(struct aps_client *c, int64_t now);

/* The client may be used by this call: not NULL, not forked. */
int aps_client_check(const struct aps_client *c);

/* Hands one line to the user's log callback, if any. */
void aps_client_log(const struct aps_client *c, int level, const char *fmt, ...)
        __attribute__((format(printf, 3, 4)));

/* A message with our identity, ready to fill. */
void aps_client_msg(const struct aps_client *c, struct aps_msg *m, enum aps_msg_type type);

/* Packs m and sends it with an optional shared payload (data, len within buf). */
int aps_client_send(struct aps_client *c, struct aps_msg *m, struct aps_sbuf *buf,
                    const uint8_t *data, size_t len);

/* Queues a request (takes ownership; lock held); aps_client_kick then sends it. */
void aps_client_enqueue(struct aps_client *c, struct aps_request *r);
/* Wakes the I/O thread: a request was queued, or chunks of one were coded. */
int aps_client_wake(struct aps_client *c);

/* Frees a request and what it owns (its waiter, or its caller when it was never queued). */
void aps_request_free(struct aps_request *r);

/* Marks r done with result (0 or an APS_E* code and text) and wakes waiters (lock held). */
void aps_request_finish_locked(struct aps_client *c, struct aps_request *r, int result,
                               const char *text);

/* Waits for r (of one connection), frees it, and writes the tensor id it registered
 * and the update count of the weights it pulled (each if not NULL). */
int aps_conn_wait(struct aps_request *r, uint32_t *tensor_id, uint64_t *updates);
/* 1 when r (of one connection) is done, 0 when not, or an APS_E* code. */
int aps_conn_done(const struct aps_request *r);

/*
 * The client of one connection (client.c, request.c): what api.c's public
 * calls do for it, and what a sharded client does on each shard.
 */
int aps_conn_new(aps_client **out, const struct aps_client_opts *o);
int aps_conn_close(aps_client *c);
int aps_conn_broadcast_start(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                             int32_t timeout_ms, aps_request **req);
int aps_conn_barrier(aps_client *c, int32_t timeout_ms);
int aps_conn_tensor_updates(aps_client *c, uint32_t tensor_id, uint64_t *updates);

/* The I/O thread's body. */
void *aps_client_io_main(void *arg);
/*
 * A caller that queued a call (lock not held): when the I/O thread waits, the
 * caller sends what is queued itself; when it is at work, it is woken to.
 */
void aps_client_kick(struct aps_client *c);
/*
 * A caller about to wait for r: while r is the only call queued or in flight,
 * the caller takes the I/O role and does the I/O thread's work itself until r
 * is done (its reply skips two thread hand-offs). Returns at once, having done
 * nothing, when r is not alone.
 */
void aps_client_drive(struct aps_client *c, struct aps_request *r);
/* A caller asking whether a call is done: what the socket holds is read now
 * unless another thread does the I/O. */
void aps_client_look(struct aps_client *c);

/* aps_client_register asking for format (NULL: the client's rules decide). */
int aps_client_register_as(aps_client *c, const char *name, uint64_t count, const char *format,
                           uint32_t *tensor_id);

/*
 * aps_client_allreduce_start of one partition of a larger tensor: maxabs, when
 * not NULL, is the whole tensor's max |x| (its values already checked finite),
 * so that every partition gets the exponent the whole tensor would.
 */
int aps_client_allreduce_part(aps_client *c, uint32_t tensor_id, float *buf, uint64_t count,
                              int32_t timeout_ms, const float *whole_max, aps_request **req);

/* Starts a barrier; aps_request_wait ends it. */
int aps_client_barrier_start(aps_client *c, int32_t timeout_ms, aps_request **req);

/*
 * outbox.c: sending a call's messages (the I/O thread when it starts, resume.c
 * after a reconnect). Data chunks whose answer has arrived are not sent again;
 * of a request still being coded, the chunks coded so far (r->encoded).
 */
int aps_outbox_chunks(struct aps_client *c, struct aps_request *r);
/* The chunks coded since the last send of r (I/O thread, on a wake-up). */
int aps_outbox_more(struct aps_client *c, struct aps_request *r);
/* Chunk of r once more (apsd's AGAIN: it had not kept it); nothing if not sent yet or
 * answered, APS_OUTBOX_ASKED_BEFORE (and nothing) if apsd asked for it on this
 * connection already. */
#define APS_OUTBOX_ASKED_BEFORE 1
int aps_outbox_chunk_again(struct aps_client *c, struct aps_request *r, uint32_t chunk);
int aps_outbox_simple(struct aps_client *c, struct aps_request *r); /* REGISTER, BARRIER */
int aps_outbox_exponents(struct aps_client *c, struct aps_request **batch, uint32_t n);
int aps_outbox_pull(struct aps_client *c, struct aps_request *r);

/* resume.c: the connection to apsd closed, or apsd went silent (why): a new one is due. */
void aps_resume_lost(struct aps_client *c, const char *why);
/* resume.c: renews a lost connection when due, keeps a quiet one alive, takes a silent
 * daemon's for dead; ms until it is due again. */
int aps_resume_timers(struct aps_client *c, int64_t now);
/* resume.c: apsd took the session back (WELCOME flagged RESUMED): every call in
 * flight goes again, each from where it is. */
void aps_resume_calls(struct aps_client *c);
/* resume.c: apsd does not know the session it was asked to take back (ERROR about
 * HELLO, APS_ENOSESSION). True when handled. */
bool aps_resume_refused(struct aps_client *c, const struct aps_msg *m);
/* resume.c: what a WELCOME says of the session: its token and apsd's limits. */
void aps_resume_welcomed(struct aps_client *c, const struct aps_msg *welcome);

/* Queues r unless the client already failed for good; on failure r is freed. */
int aps_request_submit(struct aps_client *c, struct aps_request *r, aps_request **out);
/* A data call's request, checked against the tensor table: buf the caller's floats
 * (results land there), data what the call reads (buf, or a codes call's codes). */
int aps_request_data(struct aps_client *c, enum request_kind kind, uint32_t tensor_id, float *buf,
                     const void *data, uint64_t count, int32_t timeout_ms,
                     struct aps_request **out);
/* The job steps an optimizer on the daemon. */
bool aps_client_optimize_mode(const struct aps_client *c);

/* codes.c: aps_client_codes_layout and the codes calls (update: a step, with lr) of
 * one connection. */
int aps_conn_codes_layout(aps_client *c, uint32_t tensor_id, struct aps_codes_layout *send,
                          struct aps_codes_layout *result);
int aps_conn_codes_start(aps_client *c, uint32_t tensor_id, const struct aps_codes_call *call,
                         bool update, float lr, int32_t timeout_ms, aps_request **out);
/* chunks.c: chunks of r in the daemon's size: at least one, even for an empty tensor. */
uint32_t aps_request_chunks(const struct aps_request *r);
/*
 * chunks.c: chunk i of r: its elements [*off, *off + *n), and where its payload
 * starts in r->codes (returned) and how long it is (*len).
 */
size_t aps_request_chunk(const struct aps_request *r, uint32_t i, size_t *off, size_t *n,
                         size_t *len);
/* chunks.c: the buffer of r's codes and its per-chunk counts; no chunk coded yet. */
int aps_request_alloc_codes(struct aps_client *c, struct aps_request *r);
/* chunks.c: chunk i's codes (block-scaled codes travel with each chunk's exponents),
 * and with error feedback its residual; returns its flushed count. */
uint64_t aps_request_encode_chunk(struct aps_request *r, uint32_t i);
/* chunks.c: chunks [from, to), over the client's codec pool when it has one, then
 * published to the I/O thread (r->encoded = to). */
void aps_request_encode_chunks(struct aps_client *c, struct aps_request *r, uint32_t from,
                               uint32_t to);
/* chunks.c: how many chunks a streaming coder codes between two wake-ups. */
uint32_t aps_request_stream_batch(const struct aps_client *c, const struct aps_request *r);
/* chunks.c: encodes r's data for the wire once its scale exponent is known. */
int aps_request_encode(struct aps_client *c, struct aps_request *r);
/* chunks.c: true when chunks of r are coded and not yet sent (the I/O thread). */
bool aps_request_unsent(const struct aps_request *r);
/* chunks.c: chunk of a codes call's result into the caller's buffers; APS_EPROTO when
 * it does not fit the call's result layout. */
int aps_request_take_codes(struct aps_request *r, const struct aps_msg *m, uint32_t chunk);

#endif
