/*
 * Checkpoint file I/O. A file is, little-endian:
 *   "APSCKPT3", u64 file length, u64 step, string job, string optimizer,
 *   u8 owner set, 16 bytes salt, 32 bytes BLAKE2b digest of the job token,
 *   string writer, u32 CRC32C of the header so far (the owner and the writer
 *   are read, and trusted, before the rest), u32 tensors, then per tensor:
 *   string name, u64 count, u64 updates,
 *   u64 state_t, u32 arrays, arrays * count fp32 values;
 *   and last a u32 CRC32C of every byte before it.
 * (a string is a u32 length and its bytes). A file whose length, CRC or
 * structure is wrong is refused as a whole: a torn write (the daemon killed
 * mid-write before the rename, or a disk that lost the tail) never yields
 * half-old weights. "APSCKPT2" files have no writer ("": ckpt_room.c counts
 * them as one writer's); "APSCKPT1" files (before 2026-12-07) have no owner
 * either: they are read as a job without a token's. This module never touches
 * the daemon's state.
 */
#include "server/checkpoint.h"

#include "common/crc32c.h"
#include "common/err.h"
#include "common/log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAGIC_LEN 8
static const char magic[MAGIC_LEN] = { 'A', 'P', 'S', 'C', 'K', 'P', 'T', '3' };
static const char magic_v2[MAGIC_LEN] = { 'A', 'P', 'S', 'C', 'K', 'P', 'T', '2' };
static const char magic_v1[MAGIC_LEN] = { 'A', 'P', 'S', 'C', 'K', 'P', 'T', '1' };
#define OWNER_LEN (1 + APS_CKPT_SALT_BYTES + APS_CKPT_DIGEST_BYTES)

static void owner_digest(const uint8_t *salt, const char *token, uint8_t *digest)
{
	/* Once: picks BLAKE2b's fastest code. It cannot fail where it is not asked
	 * for randomness: the digest is the same bits either way. */
	if (sodium_init() < 0)
		aps_log_debug("checkpoint", "sodium_init failed: BLAKE2b's reference code");
	crypto_generichash(digest, APS_CKPT_DIGEST_BYTES, (const unsigned char *)token,
	                   strlen(token), salt, APS_CKPT_SALT_BYTES);
}

int aps_ckpt_owner_of(const char *token, struct aps_ckpt_owner *out)
{
	memset(out, 0, sizeof(*out));
	if (token[0] == '\0')
		return 0;
	if (getrandom(out->salt, sizeof(out->salt), 0) != (ssize_t)sizeof(out->salt))
		return APS_ESYS;
	owner_digest(out->salt, token, out->digest);
	out->set = true;
	return 0;
}

bool aps_ckpt_owner_admits(const struct aps_ckpt_owner *owner, const char *token)
{
	uint8_t digest[APS_CKPT_DIGEST_BYTES];

	if (!owner->set)
		return true;
	if (token[0] == '\0')
		return false;
	owner_digest(owner->salt, token, digest);
	return sodium_memcmp(digest, owner->digest, sizeof(digest)) == 0;
}

void aps_ckpt_free(struct aps_ckpt *ck)
{
	if (ck == NULL)
		return;
	for (uint32_t i = 0; ck->tensors != NULL && i < ck->n_tensors; i++) {
		for (uint32_t a = 0; a < APS_CKPT_ARRAYS_MAX && !ck->tensors[i].borrowed; a++)
			free(ck->tensors[i].arrays[a]);
	}
	free(ck->tensors);
	memset(ck, 0, sizeof(*ck));
}

static size_t escape_job(const char *job, char *buf, size_t len)
{
	static const char hex[] = "0123456789ABCDEF";
	size_t used = 0;

	for (const unsigned char *p = (const unsigned char *)job; *p && used + 4 < len; p++) {
		bool plain = (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') ||
		             (*p >= '0' && *p <= '9') || *p == '_' || *p == '-';
		if (plain) {
			buf[used++] = (char)*p;
			continue;
		}
		buf[used++] = '%';
		buf[used++] = hex[*p >> 4];
		buf[used++] = hex[*p & 15];
	}
	buf[used] = '\0';
	return used;
}

int aps_ckpt_path(const char *dir, const char *job, uint64_t step, char *buf, size_t len)
{
	char esc[3 * APS_MSG_JOB_MAX + 1];
	int n;

	escape_job(job, esc, sizeof(esc));
	n = snprintf(buf, len, "%s/%s.%020" PRIu64 ".ckpt", dir, esc, step);
	return n < 0 || (size_t)n >= len ? APS_ERANGE : 0;
}

/* Sequential output with a running CRC; the first failure sticks. */
struct out {
	int fd;
	uint32_t crc;
	uint64_t len;
	int err; /* errno of the first failure */
};

static void put(struct out *o, const void *data, size_t n)
{
	const char *p = data;

	if (o->err != 0)
		return;
	o->crc = aps_crc32c(o->crc, data, n);
	o->len += n;
	while (n > 0) {
		ssize_t w = write(o->fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0) {
			o->err = w < 0 ? errno : EIO;
			return;
		}
		p += w;
		n -= (size_t)w;
	}
}

static void put_u32(struct out *o, uint32_t v)
{
	put(o, &v, sizeof(v)); /* the daemon runs on little-endian hosts (x86-64, arm64) */
}

static void put_u64(struct out *o, uint64_t v)
{
	put(o, &v, sizeof(v));
}

static void put_str(struct out *o, const char *s)
{
	put_u32(o, (uint32_t)strlen(s));
	put(o, s, strlen(s));
}

uint64_t aps_ckpt_size(const struct aps_ckpt *ck)
{
	uint64_t n = sizeof(magic) + 8 + 8 + 4 + strlen(ck->job) + 4 + strlen(ck->optimizer) +
	             OWNER_LEN + 4 + strlen(ck->writer) + 4 + 4;

	for (uint32_t i = 0; i < ck->n_tensors; i++) {
		const struct aps_ckpt_tensor *t = &ck->tensors[i];
		n += 4 + strlen(t->name) + 8 * 3 + 4 + (uint64_t)t->n_arrays * t->count * 4;
	}
	return n + 4;
}

static void put_all(struct out *o, const struct aps_ckpt *ck)
{
	put(o, magic, sizeof(magic));
	put_u64(o, aps_ckpt_size(ck));
	put_u64(o, ck->step);
	put_str(o, ck->job);
	put_str(o, ck->optimizer);
	put(o, &(uint8_t){ ck->owner.set }, 1);
	put(o, ck->owner.salt, sizeof(ck->owner.salt));
	put(o, ck->owner.digest, sizeof(ck->owner.digest));
	put_str(o, ck->writer);
	put_u32(o, o->crc); /* the header's */
	put_u32(o, ck->n_tensors);
	for (uint32_t i = 0; i < ck->n_tensors; i++) {
		const struct aps_ckpt_tensor *t = &ck->tensors[i];
		put_str(o, t->name);
		put_u64(o, t->count);
		put_u64(o, t->updates);
		put_u64(o, t->state_t);
		put_u32(o, t->n_arrays);
		for (uint32_t a = 0; a < t->n_arrays; a++)
			put(o, t->arrays[a], t->count * sizeof(float));
	}
	uint32_t crc = o->crc;
	put_u32(o, crc);
}

static int sys_fail(char *why, size_t why_len, const char *what, const char *path, int err)
{
	snprintf(why, why_len, "%s %s: %s", what, path, strerror(err));
	return APS_ESYS;
}

static int sync_dir(const char *dir, char *why, size_t why_len)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int ret = 0;

	if (fd < 0)
		return sys_fail(why, why_len, "cannot open", dir, errno);
	if (fsync(fd) < 0)
		ret = sys_fail(why, why_len, "cannot fsync", dir, errno);
	close(fd);
	return ret;
}

/* The temporary file, written and synced; removed on failure. */
static int write_tmp(const char *tmp, const struct aps_ckpt *ck, char *why, size_t why_len)
{
	struct out o = { .fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640) };

	if (o.fd < 0)
		return sys_fail(why, why_len, "cannot create", tmp, errno);
	put_all(&o, ck);
	if (o.err == 0 && fsync(o.fd) < 0)
		o.err = errno;
	if (close(o.fd) < 0 && o.err == 0)
		o.err = errno;
	if (o.err == 0)
		return 0;
	unlink(tmp);
	return sys_fail(why, why_len, "cannot write", tmp, o.err);
}

static int cmp_desc(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? 1 : x > y ? -1 : 0;
}

/* The step of NAME when it is PREFIX + 20 digits + ".ckpt". */
static bool step_of(const char *name, const char *prefix, uint64_t *step)
{
	size_t plen = strlen(prefix);
	const char *d = name + plen;

	if (strncmp(name, prefix, plen) != 0 || strlen(d) != 20 + 5 || strcmp(d + 20, ".ckpt") != 0)
		return false;
	*step = 0;
	for (int i = 0; i < 20; i++) {
		if (d[i] < '0' || d[i] > '9')
			return false;
		*step = *step * 10 + (uint64_t)(d[i] - '0');
	}
	return true;
}

/* Steps of job's files in dir, newest first, *n of them; NULL when none or on error. */
static uint64_t *list_steps(const char *dir, const char *job, size_t *n, int *err)
{
	char prefix[3 * APS_MSG_JOB_MAX + 2];
	uint64_t *steps = NULL, step;
	size_t cap = 0;
	DIR *d = opendir(dir);
	struct dirent *e;

	*n = 0;
	*err = d == NULL ? errno : 0;
	if (d == NULL)
		return NULL;
	escape_job(job, prefix, sizeof(prefix) - 1);
	strcat(prefix, ".");
	while ((e = readdir(d)) != NULL) {
		if (!step_of(e->d_name, prefix, &step))
			continue;
		if (*n == cap) {
			uint64_t *grown = realloc(steps, (cap ? 2 * cap : 8) * sizeof(*steps));
			if (grown == NULL)
				break;
			steps = grown;
			cap = cap ? 2 * cap : 8;
		}
		steps[(*n)++] = step;
	}
	closedir(d);
	if (*n > 1)
		qsort(steps, *n, sizeof(*steps), cmp_desc);
	return steps;
}

/* Temporary files of job's writes that never finished (the daemon was killed). */
static void remove_torn(const char *dir, const char *job)
{
	char prefix[3 * APS_MSG_JOB_MAX + 2], path[APS_CKPT_PATH_MAX + 300];
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t len;

	if (d == NULL)
		return;
	escape_job(job, prefix, sizeof(prefix) - 1);
	strcat(prefix, ".");
	while ((e = readdir(d)) != NULL) {
		len = strlen(e->d_name);
		if (strncmp(e->d_name, prefix, strlen(prefix)) != 0 || len < 9 ||
		    strcmp(e->d_name + len - 9, ".ckpt.tmp") != 0)
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		unlink(path);
	}
	closedir(d);
}

/* After a write of job: its newest keep files stay; no other write of job runs. */
static void prune(const char *dir, const char *job, unsigned keep)
{
	char path[APS_CKPT_PATH_MAX];
	size_t n = 0;
	int err = 0;
	uint64_t *steps = list_steps(dir, job, &n, &err);

	for (size_t i = keep; i < n; i++) {
		if (aps_ckpt_path(dir, job, steps[i], path, sizeof(path)) == 0)
			unlink(path);
	}
	free(steps);
	remove_torn(dir, job);
}

int aps_ckpt_write(const char *dir, const struct aps_ckpt *ck, unsigned keep, char *why,
                   size_t why_len)
{
	char path[APS_CKPT_PATH_MAX], tmp[APS_CKPT_PATH_MAX + 8];
	int ret;

	if (aps_ckpt_path(dir, ck->job, ck->step, path, sizeof(path)) < 0) {
		snprintf(why, why_len, "checkpoint path under %.200s is too long", dir);
		return APS_ESYS;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	ret = write_tmp(tmp, ck, why, why_len);
	if (ret < 0)
		return ret;
	if (rename(tmp, path) < 0) {
		ret = sys_fail(why, why_len, "cannot rename to", path, errno);
		unlink(tmp);
		return ret;
	}
	ret = sync_dir(dir, why, why_len);
	if (ret == 0)
		prune(dir, ck->job, keep ? keep : 1);
	return ret;
}

/*
 * Bounds-checked input; the first overrun sticks. Over bytes in memory (fd < 0),
 * or over a file read as it is taken (fd >= 0): a window of STREAM_WINDOW bytes
 * for the small fields, arrays read straight into their own memory. Reading a
 * file whole first took twice its size at the peak, outside max_total_bytes,
 * and a third of the time (page faults, a copy).
 */
#define STREAM_WINDOW (64u << 10)
#define STREAM_PIECE  (1u << 20) /* array bytes read, then summed while in cache */

struct in {
	const uint8_t *p;
	uint64_t left; /* bytes not taken yet (a file: but its last 4, the CRC32C) */
	bool bad;
	int fd;                     /* -1: p holds every byte */
	uint8_t *buf;               /* a file's window */
	size_t avail;               /* bytes at p in the window */
	uint32_t crc;               /* of every byte taken (a file) */
	uint64_t size;              /* a file's bytes */
	_Atomic uint64_t *progress; /* a file's bytes read go here as they come (NULL: none) */
};

static bool read_full(int fd, uint8_t *dst, size_t n)
{
	while (n > 0) {
		ssize_t r = read(fd, dst, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return false;
		dst += r;
		n -= (size_t)r;
	}
	return true;
}

/* The bytes of the file read so far, those in the window (avail) with them; its
 * CRC32C's 4, read last, counted from the start, so that the end says every byte. */
static void told(struct in *in, size_t avail)
{
	if (in->progress != NULL)
		atomic_store_explicit(in->progress, in->size - in->left + avail,
		                      memory_order_relaxed);
}

/* The window holds n bytes at p, read on from the file (never its CRC32C). */
static bool fill(struct in *in, size_t n)
{
	size_t want = STREAM_WINDOW - in->avail;

	memmove(in->buf, in->p, in->avail);
	in->p = in->buf;
	if (want > in->left - in->avail)
		want = (size_t)(in->left - in->avail);
	if (!read_full(in->fd, in->buf + in->avail, want))
		return false;
	in->avail += want;
	told(in, in->avail);
	return in->avail >= n;
}

static const uint8_t *take(struct in *in, uint64_t n)
{
	const uint8_t *p;

	if (in->bad || n > in->left ||
	    (in->fd >= 0 && n > in->avail && (n > STREAM_WINDOW || !fill(in, (size_t)n)))) {
		in->bad = true;
		return NULL;
	}
	p = in->p;
	in->p += n;
	in->left -= n;
	if (in->fd >= 0) {
		in->avail -= (size_t)n;
		in->crc = aps_crc32c(in->crc, p, (size_t)n);
	}
	return p;
}

/* n bytes into dst: from the window, then straight from the file. */
static void take_into(struct in *in, uint8_t *dst, uint64_t n)
{
	size_t first = in->fd >= 0 && n > in->avail ? in->avail : (size_t)n;
	const uint8_t *p = take(in, first);

	if (p == NULL)
		return;
	memcpy(dst, p, first);
	for (uint64_t done = first; done < n && !in->bad;) {
		size_t piece = n - done < STREAM_PIECE ? (size_t)(n - done) : STREAM_PIECE;
		if (piece > in->left || !read_full(in->fd, dst + done, piece)) {
			in->bad = true;
			return;
		}
		in->crc = aps_crc32c(in->crc, dst + done, piece);
		in->left -= piece;
		done += piece;
		told(in, 0);
	}
}

static uint32_t get_u32(struct in *in)
{
	const uint8_t *p = take(in, 4);
	uint32_t v = 0;

	if (p != NULL)
		memcpy(&v, p, 4);
	return v;
}

static uint64_t get_u64(struct in *in)
{
	const uint8_t *p = take(in, 8);
	uint64_t v = 0;

	if (p != NULL)
		memcpy(&v, p, 8);
	return v;
}

static void get_str(struct in *in, char *buf, size_t cap)
{
	uint32_t n = get_u32(in);
	const uint8_t *p = n < cap ? take(in, n) : NULL;

	if (p == NULL) {
		in->bad = true;
		buf[0] = '\0';
		return;
	}
	memcpy(buf, p, n);
	buf[n] = '\0';
}

static int get_tensor(struct in *in, struct aps_ckpt_tensor *t)
{
	get_str(in, t->name, sizeof(t->name));
	t->count = get_u64(in);
	t->updates = get_u64(in);
	t->state_t = get_u64(in);
	t->n_arrays = get_u32(in);
	if (in->bad || t->n_arrays < 1 || t->n_arrays > APS_CKPT_ARRAYS_MAX || t->count == 0 ||
	    t->count > in->left / 4 / t->n_arrays)
		return APS_EPROTO;
	for (uint32_t a = 0; a < t->n_arrays; a++) {
		t->arrays[a] = malloc(t->count * sizeof(float));
		if (t->arrays[a] == NULL)
			return APS_ENOMEM;
		take_into(in, (uint8_t *)t->arrays[a], t->count * 4);
		if (in->bad)
			return APS_EPROTO;
	}
	return 0;
}

/* The header, up to the tensors: magic, length, step, job, optimizer, owner, writer. */
static void get_head(struct in *in, struct aps_ckpt *ck, uint64_t *len)
{
	const uint8_t *m = take(in, MAGIC_LEN), *o;
	bool v1 = m != NULL && memcmp(m, magic_v1, MAGIC_LEN) == 0;
	bool v2 = m != NULL && memcmp(m, magic_v2, MAGIC_LEN) == 0;

	if (m == NULL || (!v1 && !v2 && memcmp(m, magic, MAGIC_LEN) != 0)) {
		in->bad = true;
		return;
	}
	*len = get_u64(in);
	ck->step = get_u64(in);
	get_str(in, ck->job, sizeof(ck->job));
	get_str(in, ck->optimizer, sizeof(ck->optimizer));
	memset(&ck->owner, 0, sizeof(ck->owner));
	ck->writer[0] = '\0';
	if (v1 || (o = take(in, OWNER_LEN)) == NULL)
		return;
	ck->owner.set = o[0] != 0;
	memcpy(ck->owner.salt, o + 1, sizeof(ck->owner.salt));
	memcpy(ck->owner.digest, o + 1 + sizeof(ck->owner.salt), sizeof(ck->owner.digest));
	if (!v2)
		get_str(in, ck->writer, sizeof(ck->writer));
	if (aps_crc32c(0, m, (size_t)(in->p - m)) != get_u32(in))
		in->bad = true;
}

/* The longest header get_head reads. */
#define HEAD_MAX                                                                            \
	(MAGIC_LEN + 8 + 8 + 4 + APS_MSG_JOB_MAX + 4 + APS_OPTIM_SPEC_MAX + OWNER_LEN + 4 + \
	 APS_CKPT_WRITER_MAX + 4)

int aps_ckpt_read_head(const char *path, struct aps_ckpt *ck, uint64_t *len, char *why,
                       size_t why_len)
{
	uint8_t buf[HEAD_MAX];
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	ssize_t got;
	struct in in;

	if (fd < 0)
		return sys_fail(why, why_len, "cannot open", path, errno);
	do
		got = pread(fd, buf, sizeof(buf), 0);
	while (got < 0 && errno == EINTR);
	close(fd);
	in = (struct in){ .p = buf, .left = got > 0 ? (size_t)got : 0, .fd = -1 };
	get_head(&in, ck, len);
	if (in.bad) {
		snprintf(why, why_len, "bad header (a torn or corrupt file)");
		return APS_EPROTO;
	}
	return 0;
}

/* The file behind in (its first bytes in the window), parsed and checked as it is read. */
static int parse(struct in *in, uint64_t size, struct aps_ckpt *ck, char *why, size_t why_len)
{
	uint64_t said = 0;
	uint32_t crc = 0;
	int ret = 0;

	get_head(in, ck, &said);
	if (in->bad) {
		snprintf(why, why_len, "bad magic or header CRC32C (a torn or corrupt file)");
		return APS_EPROTO;
	}
	if (said != size) {
		snprintf(why, why_len, "length differs from its header (a torn file)");
		return APS_EPROTO;
	}
	ck->n_tensors = get_u32(in);
	if (in->bad || ck->n_tensors > in->left / 32) /* a tensor takes more than 32 bytes */
		ret = APS_EPROTO;
	else if ((ck->tensors = calloc(ck->n_tensors ? ck->n_tensors : 1, sizeof(*ck->tensors))) ==
	         NULL)
		ret = APS_ENOMEM;
	for (uint32_t i = 0; ret == 0 && i < ck->n_tensors; i++)
		ret = get_tensor(in, &ck->tensors[i]);
	if (ret == 0 && (in->bad || in->left != 0))
		ret = APS_EPROTO;
	if (ret == 0 && (pread(in->fd, &crc, 4, (off_t)(size - 4)) != 4 || crc != in->crc)) {
		snprintf(why, why_len, "bad CRC32C (a torn or corrupt file)");
		return APS_EPROTO;
	}
	if (ret < 0)
		snprintf(why, why_len, "%s", ret == APS_ENOMEM ? "out of memory" : "bad structure");
	return ret;
}

/* aps_ckpt_read, saying in *progress (if not NULL) how many bytes it read. */
static int read_file(const char *path, struct aps_ckpt *out, _Atomic uint64_t *progress, char *why,
                     size_t why_len)
{
	struct aps_ckpt ck = { 0 };
	struct in in = { .fd = open(path, O_RDONLY | O_CLOEXEC), .progress = progress };
	struct stat st;
	int ret;

	if (in.fd < 0)
		return sys_fail(why, why_len, "cannot open", path, errno);
	in.buf = malloc(STREAM_WINDOW);
	if (fstat(in.fd, &st) < 0 || st.st_size < (off_t)(sizeof(magic) + 8 + 4) ||
	    in.buf == NULL) {
		snprintf(why, why_len, "too short to be a checkpoint, or cannot be read");
		ret = APS_EPROTO;
	} else {
		in.p = in.buf;
		in.size = (uint64_t)st.st_size;
		in.left = (uint64_t)st.st_size - 4;
		in.bad = !fill(&in, 0); /* the header: get_head takes it from the window */
		ret = parse(&in, (uint64_t)st.st_size, &ck, why, why_len);
	}
	free(in.buf);
	close(in.fd);
	if (ret < 0) {
		aps_ckpt_free(&ck);
		return ret;
	}
	*out = ck;
	return 0;
}

int aps_ckpt_read(const char *path, struct aps_ckpt *out, char *why, size_t why_len)
{
	return read_file(path, out, NULL, why, why_len);
}

/* Whether the file at path, whose header is head, may be read whole for want: 0,
 * or APS_EACCES / APS_ERANGE with why. */
static int refuses(const struct aps_ckpt *head, uint64_t len, const struct aps_ckpt_want *want,
                   const char *path, char *why, size_t why_len)
{
	if (!aps_ckpt_owner_admits(&head->owner, want->token)) {
		snprintf(why, why_len,
		         "job '%.64s': its checkpoint %.200s (step %llu) was written under "
		         "another job token: join with that token, or start it afresh under "
		         "another name",
		         head->job, path, (unsigned long long)head->step);
		return APS_EACCES;
	}
	if (want->max_bytes != 0 && len > want->max_bytes) {
		snprintf(why, why_len,
		         "job '%.64s': its checkpoint %.200s (step %llu) holds %llu bytes, "
		         "and %llu fit max_job_bytes, max_address_bytes and max_total_bytes now",
		         head->job, path, (unsigned long long)head->step, (unsigned long long)len,
		         (unsigned long long)want->max_bytes);
		return APS_ERANGE;
	}
	return 0;
}

int aps_ckpt_check_newest(const char *dir, const char *job, const struct aps_ckpt_want *want,
                          uint64_t *bytes, char *refusal, size_t refusal_len)
{
	char path[APS_CKPT_PATH_MAX], why[256];
	size_t n = 0;
	int err = 0, ret = 0;
	uint64_t *steps = list_steps(dir, job, &n, &err), len = 0;
	struct aps_ckpt head;

	if (steps == NULL && err != 0 && err != ENOENT)
		return APS_ESYS;
	for (size_t i = 0; i < n; i++) {
		memset(&head, 0, sizeof(head));
		if (aps_ckpt_path(dir, job, steps[i], path, sizeof(path)) < 0 ||
		    aps_ckpt_read_head(path, &head, &len, why, sizeof(why)) < 0)
			continue; /* aps_ckpt_load_newest skips it too, and says why */
		ret = refuses(&head, len, want, path, refusal, refusal_len);
		ret = ret < 0 ? ret : 1;
		*bytes = len;
		break;
	}
	free(steps);
	return ret;
}

int aps_ckpt_load_newest(const char *dir, const char *job, const struct aps_ckpt_want *want,
                         struct aps_ckpt *out, char *path, size_t path_len, char *refusal,
                         size_t refusal_len)
{
	char why[256];
	size_t n = 0;
	int err = 0, ret = 0;
	uint64_t *steps = list_steps(dir, job, &n, &err), len = 0;
	struct aps_ckpt head;

	if (steps == NULL && err != 0 && err != ENOENT) {
		aps_log_error("checkpoint", "cannot list dir=%s reason=\"%s\"", dir, strerror(err));
		return APS_ESYS;
	}
	for (size_t i = 0; i < n; i++) {
		if (aps_ckpt_path(dir, job, steps[i], path, path_len) < 0)
			continue;
		memset(&head, 0, sizeof(head));
		if (aps_ckpt_read_head(path, &head, &len, why, sizeof(why)) == 0 &&
		    (ret = refuses(&head, len, want, path, refusal, refusal_len)) < 0)
			break;
		if (want->progress != NULL) /* a file read before this one was skipped */
			atomic_store_explicit(want->progress, 0, memory_order_relaxed);
		if (read_file(path, out, want->progress, why, sizeof(why)) == 0) {
			if (strcmp(out->job, job) == 0) {
				ret = 1;
				break;
			}
			snprintf(why, sizeof(why), "written for job '%.64s'", out->job);
			aps_ckpt_free(out);
		}
		aps_log_warn("checkpoint", "skipped path=%s reason=\"%s\"", path, why);
	}
	free(steps);
	return ret;
}
