/*
 * The trace writer: a FILE with a lock (the client traces from two threads),
 * the JSON array opened at the start and closed at the end.
 */
#include "common/trace.h"

#include "common/err.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

struct aps_trace {
	FILE *f;
	pthread_mutex_t lock;
	int pid;
};

uint64_t aps_trace_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

int aps_trace_open(struct aps_trace **out, const char *path, const char *process_name)
{
	struct aps_trace *t = calloc(1, sizeof(*t));

	if (t == NULL)
		return APS_ENOMEM;
	t->f = fopen(path, "w");
	if (t->f == NULL) {
		free(t);
		return APS_ESYS;
	}
	pthread_mutex_init(&t->lock, NULL);
	t->pid = (int)getpid();
	fprintf(t->f,
	        "[{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
	        "\"args\":{\"name\":\"%s\"}}",
	        t->pid, process_name);
	*out = t;
	return 0;
}

void aps_trace_stage(struct aps_trace *t, const char *name, uint64_t start_ns, const char *tensor,
                     uint64_t step, uint32_t chunk)
{
	uint64_t end = aps_trace_now();

	if (t == NULL)
		return;
	pthread_mutex_lock(&t->lock);
	fprintf(t->f,
	        ",\n{\"name\":\"%s\",\"cat\":\"apsd\",\"ph\":\"X\",\"ts\":%.3f,\"dur\":%.3f,"
	        "\"pid\":%d,\"tid\":%ld,\"args\":{\"tensor\":\"%s\",\"step\":%llu,\"chunk\":%u}}",
	        name, (double)start_ns / 1e3, (double)(end - start_ns) / 1e3, t->pid,
	        (long)syscall(SYS_gettid), tensor, (unsigned long long)step, chunk);
	pthread_mutex_unlock(&t->lock);
}

void aps_trace_close(struct aps_trace *t)
{
	if (t == NULL)
		return;
	fputs("\n]\n", t->f);
	fclose(t->f);
	pthread_mutex_destroy(&t->lock);
	free(t);
}
