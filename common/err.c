/*
 * Messages and names of the error codes listed once in err.h.
 */
#include "common/err.h"

#include <stddef.h>

const char *aps_strerror(int code)
{
	switch (code) {
	case APS_OK:
		return "success";
#define APS_ERR_TEXT(name, value, text) \
	case APS_##name:                \
		return text;
		APS_ERR_MAP(APS_ERR_TEXT)
#undef APS_ERR_TEXT
	}
	return "unknown error";
}

const char *aps_err_name(int code)
{
	switch (code) {
	case APS_OK:
		return "APS_OK";
#define APS_ERR_NAME(name, value, text) \
	case APS_##name:                \
		return "APS_" #name;
		APS_ERR_MAP(APS_ERR_NAME)
#undef APS_ERR_NAME
	}
	return NULL;
}
