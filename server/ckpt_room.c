/*
 * Room for a checkpoint within checkpoint_max_bytes (ckpt_room.h): one listing
 * of the directory; only when the files leave no room, the header of each file
 * (its job and writer), and then removals, the largest writer's oldest file
 * first. The writers' bytes are a max-heap: a stranger's hundred thousand files
 * cost a removal log(writers), not a scan of every writer.
 */
#include "server/ckpt_room.h"

#include "common/err.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A file that may give room. */
struct file {
	char *name; /* in dir */
	char *job;  /* from its header ("" when it did not read) */
	char *writer;
	uint64_t bytes, step;
	struct timespec mtime;
	bool bad; /* its header did not read: no job could resume it */
};

/* One writer's files, oldest first: files[next..end) are still there. */
struct group {
	size_t next, end;
	uint64_t bytes; /* of those still there */
};

struct listing {
	struct file *files;
	size_t n, cap;
	uint64_t used; /* every checkpoint file's bytes, temporary ones included */
};

static bool ends_with(const char *s, const char *tail)
{
	size_t n = strlen(s), t = strlen(tail);

	return n >= t && strcmp(s + n - t, tail) == 0;
}

static void free_listing(struct listing *l)
{
	for (size_t i = 0; i < l->n; i++) {
		free(l->files[i].name);
		free(l->files[i].job);
		free(l->files[i].writer);
	}
	free(l->files);
}

static int add_file(struct listing *l, const char *name, const struct stat *st, bool tmp)
{
	struct file *f;

	if (l->n == l->cap) {
		size_t cap = l->cap ? 2 * l->cap : 64;
		struct file *grown = realloc(l->files, cap * sizeof(*grown));
		if (grown == NULL)
			return APS_ENOMEM;
		l->files = grown;
		l->cap = cap;
	}
	f = &l->files[l->n];
	*f = (struct file){ .name = strdup(name),
		            .bytes = (uint64_t)st->st_size,
		            .mtime = st->st_mtim,
		            .bad = tmp };
	if (f->name == NULL)
		return APS_ENOMEM;
	l->n++;
	return 0;
}

/* Every checkpoint file of dir, in l->files (what they take in l->used). A temporary file is a
 * write's that a killed daemon left (this thread runs the only write): as bad as a file whose
 * header does not read. */
static int list(const char *dir, struct listing *l, char *why, size_t why_len)
{
	struct dirent *e;
	struct stat st;
	DIR *d = opendir(dir);
	int ret = 0;

	if (d == NULL) {
		snprintf(why, why_len, "cannot list %s: %s", dir, strerror(errno));
		return APS_ESYS;
	}
	while (ret == 0 && (e = readdir(d)) != NULL) {
		bool tmp = ends_with(e->d_name, ".ckpt.tmp");
		if ((!tmp && !ends_with(e->d_name, ".ckpt")) ||
		    fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 ||
		    !S_ISREG(st.st_mode))
			continue;
		l->used += (uint64_t)st.st_size;
		ret = add_file(l, e->d_name, &st, tmp);
	}
	closedir(d);
	if (ret < 0)
		snprintf(why, why_len, "out of memory listing %s", dir);
	return ret;
}

static bool stays(const struct aps_ckpt_room *r, const char *job)
{
	if (strcmp(job, r->ck->job) == 0)
		return true; /* its older files are its fallback while it is written */
	for (size_t i = 0; i < r->n_live; i++) {
		if (strcmp(job, r->live[i]) == 0)
			return true;
	}
	return false;
}

/* Reads each file's header; those that stay are dropped from l, the others are
 * what may give room. */
static int read_heads(const struct aps_ckpt_room *r, struct listing *l)
{
	char path[APS_CKPT_PATH_MAX + 300], why[256];
	struct aps_ckpt head;
	uint64_t len;
	size_t kept = 0;
	int ret = 0;

	for (size_t i = 0; i < l->n; i++) {
		struct file f = l->files[i];
		if (ret < 0) {
			free(f.name);
			continue;
		}
		snprintf(path, sizeof(path), "%s/%s", r->dir, f.name);
		memset(&head, 0, sizeof(head));
		/* A header that does not read is a bad file; one that cannot be opened (no
		 * descriptor, no permission) says nothing of it: it stays. */
		int got = f.bad ? 0 : aps_ckpt_read_head(path, &head, &len, why, sizeof(why));
		f.bad = f.bad || got == APS_EPROTO;
		if (got == APS_ESYS || (!f.bad && stays(r, head.job))) {
			free(f.name);
			continue;
		}
		f.job = strdup(f.bad ? "" : head.job);
		f.writer = strdup(f.bad ? "" : head.writer);
		f.step = head.step;
		l->files[kept++] = f;
		if (f.job == NULL || f.writer == NULL)
			ret = APS_ENOMEM;
	}
	l->n = kept;
	return ret;
}

/* Bad files first (as one writer of their own), then by writer, each oldest first. */
static int order(const void *pa, const void *pb)
{
	const struct file *a = pa, *b = pb;
	int c;

	if (a->bad != b->bad)
		return a->bad ? -1 : 1;
	if ((c = strcmp(a->writer, b->writer)) != 0)
		return c;
	if (a->mtime.tv_sec != b->mtime.tv_sec)
		return a->mtime.tv_sec < b->mtime.tv_sec ? -1 : 1;
	if (a->mtime.tv_nsec != b->mtime.tv_nsec)
		return a->mtime.tv_nsec < b->mtime.tv_nsec ? -1 : 1;
	return a->step < b->step ? -1 : a->step > b->step;
}

/* A group that gives before another: bad files, else the one with more bytes. */
static bool before(const struct file *files, const struct group *a, const struct group *b)
{
	bool bad_a = files[a->next].bad, bad_b = files[b->next].bad;

	return bad_a != bad_b ? bad_a : a->bytes > b->bytes;
}

static void sift_down(const struct file *files, struct group *h, size_t n, size_t i)
{
	for (;;) {
		size_t l = 2 * i + 1, r = l + 1, top = i;
		if (l < n && before(files, &h[l], &h[top]))
			top = l;
		if (r < n && before(files, &h[r], &h[top]))
			top = r;
		if (top == i)
			return;
		struct group t = h[i];
		h[i] = h[top];
		h[top] = t;
		i = top;
	}
}

/* The writers' groups of the sorted files, as a heap (*n of them); NULL: no memory. */
static struct group *heap_of(const struct file *files, size_t n_files, size_t *n)
{
	struct group *h = malloc((n_files ? n_files : 1) * sizeof(*h));

	*n = 0;
	for (size_t i = 0; h != NULL && i < n_files; i++) {
		if (*n > 0 && files[i].bad == files[h[*n - 1].next].bad &&
		    strcmp(files[i].writer, files[h[*n - 1].next].writer) == 0) {
			h[*n - 1].end = i + 1;
			h[*n - 1].bytes += files[i].bytes;
			continue;
		}
		h[(*n)++] = (struct group){ .next = i, .end = i + 1, .bytes = files[i].bytes };
	}
	for (size_t i = *n / 2; h != NULL && i-- > 0;)
		sift_down(files, h, *n, i);
	return h;
}

static void note(struct aps_ckpt_room *r, const struct file *f)
{
	if (r->n_evicted < APS_CKPT_ROOM_SHOWN) {
		struct aps_ckpt_evicted *e = &r->shown[r->n_evicted];
		snprintf(e->job, sizeof(e->job), "%s", f->job);
		snprintf(e->writer, sizeof(e->writer), "%s", f->writer);
		e->step = f->step;
		e->bytes = f->bytes;
	}
	r->n_evicted++;
	r->evicted_bytes += f->bytes;
}

static int remove_one(const struct aps_ckpt_room *r, const char *job, const char *path)
{
	if (r->remove != NULL)
		return r->remove(r->remove_ctx, job, path);
	return unlink(path) == 0 || errno == ENOENT ? 0 : APS_ESYS;
}

/* Removes files of l, the heap's top group's oldest first, while used + need is
 * past the bound and what may still go would make room (none for nothing). */
static void evict(struct aps_ckpt_room *r, struct listing *l, uint64_t need)
{
	char path[APS_CKPT_PATH_MAX + 300];
	uint64_t may_go = 0;
	struct group *h;
	size_t n;

	for (size_t i = 0; i < l->n; i++)
		may_go += l->files[i].bytes;
	qsort(l->files, l->n, sizeof(*l->files), order);
	h = heap_of(l->files, l->n, &n);
	while (h != NULL && n > 0 && l->used + need > r->max_bytes &&
	       l->used - (may_go < l->used ? may_go : l->used) + need <= r->max_bytes) {
		const struct file *f = &l->files[h[0].next++];
		snprintf(path, sizeof(path), "%s/%s", r->dir, f->name);
		h[0].bytes -= f->bytes;
		may_go -= f->bytes;
		if (remove_one(r, f->job, path) == 0) {
			l->used -= f->bytes < l->used ? f->bytes : l->used;
			note(r, f);
		}
		if (h[0].next == h[0].end)
			h[0] = h[--n];
		sift_down(l->files, h, n, 0);
	}
	free(h);
}

int aps_ckpt_room_make(struct aps_ckpt_room *r, char *why, size_t why_len)
{
	struct listing l = { 0 };
	uint64_t need = aps_ckpt_size(r->ck);
	int ret;

	r->n_evicted = 0;
	r->evicted_bytes = 0;
	if (r->max_bytes == 0)
		return 0;
	ret = list(r->dir, &l, why, why_len);
	if (ret == 0 && l.used + need > r->max_bytes && !r->keep_all) {
		if ((ret = read_heads(r, &l)) < 0)
			snprintf(why, why_len, "out of memory reading the headers in %s", r->dir);
		if (ret == 0)
			evict(r, &l, need);
	}
	if (ret == 0 && l.used + need > r->max_bytes) {
		snprintf(why, why_len,
		         "checkpoint_max_bytes is %llu: %.200s holds %llu bytes of checkpoints of "
		         "jobs that run (or that could not be removed), this one needs %llu more",
		         (unsigned long long)r->max_bytes, r->dir, (unsigned long long)l.used,
		         (unsigned long long)need);
		ret = APS_ESYS;
	}
	free_listing(&l);
	return ret;
}
