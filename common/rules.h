/*
 * Format rules by tensor name: "glob=format,glob=format" (shell globs,
 * first match wins), e.g. "*.bias=fp32,fc.*=fp16". The daemon's precision
 * policy and the client both read them.
 */
#ifndef APS_COMMON_RULES_H
#define APS_COMMON_RULES_H

#include "common/format.h"

#include <stdbool.h>
#include <stddef.h>

#define APS_RULES_MAX 512

/* Checks the syntax and the formats; returns 0, or with the reason in why
 * APS_EFORMAT (a format unknown) or APS_ECONFIG (anything else). */
int aps_rules_check(const char *rules, char *why, size_t why_len);

/* The format of the first rule whose glob matches name; false when none does. */
bool aps_rules_match(const char *rules, const char *name, struct aps_format *out);

#endif
