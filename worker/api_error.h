/*
 * The detail message behind aps_last_error(): one buffer per thread, written
 * by every public function that fails.
 */
#ifndef APS_WORKER_API_ERROR_H
#define APS_WORKER_API_ERROR_H

/* Records "<strerror(code)>: <detail>" for the calling thread; returns code. */
int aps_api_fail(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Clears the calling thread's message; returns 0. */
int aps_api_ok(void);

#endif
