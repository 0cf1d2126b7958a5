/*
 * The client's options (struct aps_client_opts): their defaults, and the checks
 * aps_client_new makes before anything connects.
 */
#ifndef APS_WORKER_OPTIONS_H
#define APS_WORKER_OPTIONS_H

#include "common/format.h"
#include "worker/aps.h"

#include <stdbool.h>

/*
 * Checks o as a whole (every endpoint of a list): 0 and the uplink format in
 * *fmt and the downlink's, when o names one, in *down; or APS_EINVAL or
 * APS_EFORMAT with the calling thread's message.
 */
int aps__options_check(const struct aps_client_opts *o, struct aps_format *fmt,
                       struct aps_format *down);

/* True when s holds bytes in '!'..'~' only, as apsd's validator takes names and tokens. */
bool aps__visible_ascii(const char *s);

#endif
