/*
 * Per-thread detail of the last failed public call.
 */
#include "worker/api_error.h"

#include "worker/aps.h"

#include <stdarg.h>
#include <stdio.h>

#define DETAIL_MAX 512

static _Thread_local char last_error[DETAIL_MAX];

int aps_api_fail(int code, const char *fmt, ...)
{
	va_list ap;
	int used = snprintf(last_error, sizeof(last_error), "%s: ", aps_strerror(code));

	va_start(ap, fmt);
	if (used > 0 && (size_t)used < sizeof(last_error))
		vsnprintf(last_error + used, sizeof(last_error) - (size_t)used, fmt, ap);
	va_end(ap);
	return code;
}

int aps_api_ok(void)
{
	last_error[0] = '\0';
	return 0;
}

const char *aps_last_error(void)
{
	return last_error;
}
