/*
 * Daemon configuration: defaults, then an INI-style file, then command-line
 * flags. Every key has the same name in the file and as a flag (--name VALUE
 * or --name=VALUE). Errors are returned in struct aps_config_error as one
 * line ("file:line: reason" or "--flag=value: reason"); this module never
 * prints them. The caller prints err.message and exits 2.
 */
#ifndef APS_SERVER_CONFIG_H
#define APS_SERVER_CONFIG_H

#include "common/format.h"
#include "common/log.h"
#include "common/scale.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#define APS_CONFIG_ENDPOINT_MAX 255  /* bytes, without the NUL */
#define APS_CONFIG_LINE_MAX     1024 /* bytes per file line, without the newline */
#define APS_CONFIG_ERROR_MAX    512

/* FP32: decode every push exactly and sum in fp32; LOWP: the paper's sum, rounded to
 * the format after every addition (global scaling only). */
enum aps_sum {
	APS_SUM_FP32,
	APS_SUM_LOWP,
};

/* Format of RESULT messages; AUTO answers each tensor in its uplink format. */
enum aps_downlink {
	APS_DOWNLINK_AUTO,
	APS_DOWNLINK_FP32,
	APS_DOWNLINK_FP16,
	APS_DOWNLINK_BF16,
};

struct aps_config {
	char listen[APS_CONFIG_ENDPOINT_MAX + 1]; /* tcp://, ipc:// or inproc:// */
	enum aps_log_level log_level;
	enum aps_downlink downlink;
	int heartbeat_ms;                /* interval between HEARTBEATs */
	int heartbeat_timeout_ms;        /* silence after which a session is dead */
	int reconnect_grace_ms;          /* a closed connection may come back */
	int max_jobs;                    /* jobs alive at once */
	int max_jobs_per_address;        /* of those, started from one address or ipc user */
	int max_ranks;                   /* world size limit of one job */
	int max_tensors;                 /* tensors registered by one job */
	uint64_t max_job_bytes;          /* fp32 bytes of one job's tensors */
	uint64_t max_message_bytes;      /* largest frame accepted; 0: chunk_bytes + 64k */
	uint64_t max_total_bytes;        /* of every job together; 0: half the memory */
	uint64_t max_address_bytes;      /* of the jobs of one address; 0: max_total_bytes / 2 */
	uint64_t max_held_bytes;         /* early pushes held, every job; 0: max_total_bytes / 4 */
	int max_connections;             /* 0: from RLIMIT_NOFILE */
	int max_connections_per_address; /* 0: no limit */
	int join_timeout_ms;             /* to join, and for a job to fill */
	int max_silent_closes;           /* an address's, a minute; 0: no limit */
	int drain_batch;                 /* messages read per ZMQ_FD wake-up */
	int threads;                     /* threads that sum; 0: the CPU set's cores */
	int io_threads;                  /* ZeroMQ I/O threads; 0: cores / 4 */
	enum aps_scaling scaling;        /* of jobs whose HELLO states none */
	enum aps_sum sum;                /* how pushes are summed */
	uint64_t chunk_bytes;            /* chunk size of large tensors, in fp32 bytes */
	char stats[APS_CONFIG_ENDPOINT_MAX + 1];          /* stats socket path; "" chooses one */
	char metrics_listen[APS_CONFIG_ENDPOINT_MAX + 1]; /* "ADDR:PORT", "" for none */
	char trace[APS_CONFIG_ENDPOINT_MAX + 1];          /* timeline file, "" for none */
	char curve_secret_key_file[APS_CONFIG_ENDPOINT_MAX + 1]; /* "" no CURVE */
	char curve_allow_file[APS_CONFIG_ENDPOINT_MAX + 1];
	char allow_from[APS_CONFIG_ENDPOINT_MAX + 1]; /* networks that may connect; "" any */
	int elastic;                                  /* 1: a lost rank shrinks its job */
	int insecure;                                 /* 1: listen beyond loopback without CURVE */
	int policy;                                   /* 0 off, 1 auto */
	char rules[APS_CONFIG_ENDPOINT_MAX + 1];      /* "glob=format,..." */
	int schedule_steps;
	int schedule_format; /* index of fp32, fp16, bf16 */
	int small_tensor_elems;
	double flush_up, flush_down, error_up, error_down;
	int window_up, window_down;
	char checkpoint_dir[APS_CONFIG_ENDPOINT_MAX + 1]; /* "" : $STATE_DIRECTORY, or off */
	int checkpoint_steps;                             /* 0: only at stop and job end */
	int checkpoint_keep;                              /* files kept per job */
	uint64_t checkpoint_max_bytes; /* every job's files; 0: a quarter of the filesystem */
};

struct aps_config_error {
	char message[APS_CONFIG_ERROR_MAX];
};

/* Fills every key with its default: `apsd` alone serves on tcp://127.0.0.1:5555. */
void aps_config_defaults(struct aps_config *cfg);

/*
 * Applies the keys of the INI-style file at path on top of *cfg, then checks
 * keys against each other. Stops at the first problem; *cfg is written only
 * on success. Returns 0 or APS_ECONFIG with err->message set (err may be NULL).
 */
int aps_config_load_file(struct aps_config *cfg, const char *path, struct aps_config_error *err);

/*
 * Applies argv on top of *cfg: the file of --config first wherever it
 * appears, then every other flag in order, then the cross-key checks.
 * -h/--help and --version print to stdout, set *exit_now and return 0.
 * *cfg is written only on success. Returns 0 or APS_ECONFIG with
 * err->message set (err may be NULL).
 */
int aps_config_parse_args(struct aps_config *cfg, int argc, char **argv,
                          struct aps_config_error *err, bool *exit_now);

/* Writes the usage text: every key with its range, default and meaning. */
void aps_config_print_usage(FILE *out);

/* One line "key=value ..." of every key, for the startup log; always NUL-terminated. */
void aps_config_describe(const struct aps_config *cfg, char *buf, size_t len);

struct aps_policy_config;
/* The precision policy the configuration describes (server/policy.h). */
void aps_config_get_policy(const struct aps_config *cfg, struct aps_policy_config *out);

/*
 * Fills *out with the configured downlink format and returns true, or
 * returns false for APS_DOWNLINK_AUTO (answer in each tensor's uplink format).
 */
bool aps_config_get_downlink(const struct aps_config *cfg, struct aps_format *out);

#endif
