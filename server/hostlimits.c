/* Limits from the machine: descriptors, memory and cores (hostlimits.h). */
#include "server/hostlimits.h"

#include <malloc.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <unistd.h>

#define NOFILE_CAP (1u << 20)

uint64_t aps_hostlimits_raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1024;
	if (rl.rlim_cur < rl.rlim_max && rl.rlim_cur < NOFILE_CAP) {
		struct rlimit want = rl;
		want.rlim_cur = rl.rlim_max < NOFILE_CAP ? rl.rlim_max : NOFILE_CAP;
		if (setrlimit(RLIMIT_NOFILE, &want) == 0)
			rl = want;
	}
	return rl.rlim_cur == RLIM_INFINITY ? NOFILE_CAP : (uint64_t)rl.rlim_cur;
}

size_t aps_hostlimits_connections(uint64_t nofile)
{
	if (nofile < APS_HOSTLIMITS_SPARE_FDS + 16)
		return 8;
	return (size_t)((nofile - APS_HOSTLIMITS_SPARE_FDS) / 2);
}

/* cgroup v2's memory.max of this process, or 0 when none is set. */
static uint64_t cgroup_memory(void)
{
	char path[600], line[512];
	unsigned long long max = 0;
	FILE *f = fopen("/proc/self/cgroup", "r");

	if (f == NULL)
		return 0;
	/* cgroup v2: one line "0::/path" */
	if (fgets(line, sizeof(line), f) == NULL || line[0] != '0' || line[1] != ':' ||
	    line[2] != ':') {
		fclose(f);
		return 0;
	}
	fclose(f);
	line[sizeof(line) - 1] = '\0';
	for (char *c = line; *c; c++) {
		if (*c == '\n')
			*c = '\0';
	}
	snprintf(path, sizeof(path), "/sys/fs/cgroup%s/memory.max", line + 3);
	f = fopen(path, "r");
	if (f == NULL)
		return 0;
	if (fscanf(f, "%llu", &max) != 1) /* "max": no limit */
		max = 0;
	fclose(f);
	return (uint64_t)max;
}

uint64_t aps_hostlimits_memory(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
	uint64_t phys = pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page : 1ull << 32;
	uint64_t cg = cgroup_memory();

	return cg != 0 && cg < phys ? cg : phys;
}

uint64_t aps_hostlimits_disk(const char *dir)
{
	struct statvfs st;

	if (statvfs(dir, &st) != 0)
		return 0;
	return (uint64_t)st.f_blocks * (uint64_t)st.f_frsize;
}

unsigned aps_hostlimits_cpus(void)
{
	cpu_set_t set;
	int n;

	if (sched_getaffinity(0, sizeof(set), &set) != 0)
		return 1;
	n = CPU_COUNT(&set);
	return n > 0 ? (unsigned)n : 1;
}

#define MMAP_THRESHOLD (16u << 20)
#define TRIM_THRESHOLD (32u << 20)

void aps_hostlimits_malloc_policy(void)
{
	static const char *const own[] = { "MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_",
		                           "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
		                           "MALLOC_MMAP_MAX_" };
	const char *tunables = getenv("GLIBC_TUNABLES");

	if (tunables != NULL && strstr(tunables, "glibc.malloc.") != NULL)
		return;
	for (size_t i = 0; i < sizeof(own) / sizeof(own[0]); i++) {
		if (getenv(own[i]) != NULL)
			return;
	}
	mallopt(M_ARENA_MAX, 1);
	mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD);
	mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD);
}

uint64_t aps_hostlimits_heap_in_use(void)
{
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
	return 0; /* its malloc is not glibc's: mallinfo2 would say nothing moved */
#else
	struct mallinfo2 mi = mallinfo2();

	return (uint64_t)mi.uordblks + (uint64_t)mi.hblkhd;
#endif
}
