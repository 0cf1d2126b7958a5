/*
 * The trace writer: a lock (the client traces from two threads), complete
 * records gathered in a buffer, and a file that is a whole JSON array after
 * every write: each batch of records goes out with the closing "]", which the
 * next batch writes over.
 */
#include "common/trace.h"

#include "common/err.h"

#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define BUF_BYTES   (64 * 1024)
#define RECORD_MAX  1024          /* one event, names escaped and cut */
#define FLUSH_NS    1000000000ull /* a batch waits at most a second (when events come) */
#define NAME_MAX_IN 128           /* characters of a name kept in an event */
#define CLOSING     "\n]\n"

struct aps_trace {
	int fd;
	pthread_mutex_t lock;
	int pid;
	off_t end;        /* where the next batch goes: the closing "]" is past it */
	uint64_t flushed; /* when the last batch was written */
	size_t len;       /* bytes of records in buf */
	char buf[BUF_BYTES + sizeof(CLOSING)];
};

uint64_t aps_trace_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Writes the records gathered and the closing "]" after them, in one write. */
static void flush(struct aps_trace *t)
{
	memcpy(t->buf + t->len, CLOSING, sizeof(CLOSING) - 1);
	if (pwrite(t->fd, t->buf, t->len + sizeof(CLOSING) - 1, t->end) ==
	    (ssize_t)(t->len + sizeof(CLOSING) - 1))
		t->end += (off_t)t->len;
	t->len = 0;
	t->flushed = aps_trace_now();
}

/* name as the inside of a JSON string: quotes, backslashes and control bytes escaped. */
static void escape(char *out, size_t size, const char *name)
{
	size_t o = 0;

	for (size_t i = 0; name != NULL && name[i] != '\0' && i < NAME_MAX_IN && o + 7 < size;
	     i++) {
		unsigned char ch = (unsigned char)name[i];
		if (ch == '"' || ch == '\\')
			o += (size_t)snprintf(out + o, size - o, "\\%c", ch);
		else if (ch < 0x20 || ch == 0x7f)
			o += (size_t)snprintf(out + o, size - o, "\\u%04x", ch);
		else
			out[o++] = (char)ch;
	}
	out[o] = '\0';
}

int aps_trace_open(struct aps_trace **out, const char *path, const char *process_name)
{
	struct aps_trace *t = calloc(1, sizeof(*t));
	char name[NAME_MAX_IN * 6 + 1];

	if (t == NULL)
		return APS_ENOMEM;
	t->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (t->fd < 0) {
		free(t);
		return APS_ESYS;
	}
	pthread_mutex_init(&t->lock, NULL);
	t->pid = (int)getpid();
	escape(name, sizeof(name), process_name);
	t->len = (size_t)snprintf(t->buf, BUF_BYTES,
	                          "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
	                          "\"args\":{\"name\":\"%s\"}}",
	                          t->pid, name);
	flush(t);
	*out = t;
	return 0;
}

void aps_trace_stage(struct aps_trace *t, const char *name, uint64_t start_ns,
                     const struct aps_trace_at *at)
{
	uint64_t end = aps_trace_now();
	char job[NAME_MAX_IN * 6 + 1], tensor[NAME_MAX_IN * 6 + 1], rec[RECORD_MAX];
	int n;

	if (t == NULL)
		return;
	escape(job, sizeof(job), at->job);
	escape(tensor, sizeof(tensor), at->tensor);
	n = snprintf(rec, sizeof(rec),
	             ",\n{\"name\":\"%s\",\"cat\":\"apsd\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
	             "\"pid\":%d,\"tid\":%ld,\"args\":{\"job\":\"%s\",\"tensor\":\"%s\","
	             "\"step\":%llu,\"chunk\":%u}}",
	             name, (double)start_ns / 1e3, (double)(end - start_ns) / 1e3, t->pid,
	             (long)syscall(SYS_gettid), job, tensor, (unsigned long long)at->step,
	             at->chunk);
	if (n < 0 || (size_t)n >= sizeof(rec))
		return; /* cannot happen with names cut to NAME_MAX_IN */
	pthread_mutex_lock(&t->lock);
	if (t->len + (size_t)n > BUF_BYTES)
		flush(t);
	memcpy(t->buf + t->len, rec, (size_t)n);
	t->len += (size_t)n;
	if (end - t->flushed >= FLUSH_NS)
		flush(t);
	pthread_mutex_unlock(&t->lock);
}

void aps_trace_flush_due(struct aps_trace *t)
{
	if (t == NULL)
		return;
	pthread_mutex_lock(&t->lock);
	if (t->len > 0 && aps_trace_now() - t->flushed >= FLUSH_NS)
		flush(t);
	pthread_mutex_unlock(&t->lock);
}

void aps_trace_close(struct aps_trace *t)
{
	if (t == NULL)
		return;
	flush(t);
	close(t->fd);
	pthread_mutex_destroy(&t->lock);
	free(t);
}
